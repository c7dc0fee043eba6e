"""The browser: ``node driver.cjs`` (playwright-core launching Chromium, evaluating ``window.rope.<fn>(args)`` in the
page for each JSON line it reads; the page's console comes back as events) and the :mod:`.server` it loads the page
from. :func:`browser` is one per process and bundle, started on first use and stopped at exit."""

from __future__ import annotations

import atexit
import itertools
import json
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rope_passes.runtime.web.codec import WEB_TYPES, WebError, decode, encode
from rope_passes.runtime.web.install import (
    WebRuntimeUnavailable,
    chromium_path,
    missing,
    package_version,
    web_runtime_dir,
)
from rope_passes.runtime.web.server import Server

HERE = Path(__file__).resolve().parent
#: Chromium's flags: headless WebGPU (``--enable-unsafe-webgpu``: WebGPU on Linux is behind it; Vulkan for Dawn), and
#: no background connections (a closed network refuses them, many at a time) nor first-run work
CHROMIUM_ARGS = ("--enable-unsafe-webgpu", "--enable-features=Vulkan", "--no-sandbox", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage")
BUNDLES = ("webgpu", "all")


class Browser:
    """The server, the driver and Chromium; :meth:`call` evaluates ``window.rope.<fn>(args)`` in the page."""

    def __init__(self, bundle: str = "webgpu", timeout: float = 120) -> None:
        why = missing()
        if why is not None:
            raise WebRuntimeUnavailable(f"the browser runtime is not set up: {why}")
        if bundle not in BUNDLES:
            raise ValueError(f"unknown onnxruntime-web bundle {bundle!r} (choose from {', '.join(BUNDLES)})")
        self.bundle = bundle
        self.events: list[dict[str, Any]] = []  # console errors, page errors, crashes (the latest last)
        self._ids = itertools.count(1)
        self._io = itertools.count(1)
        self._files = itertools.count(1)
        self._allocators: dict[str, str] = {}
        self._temp: list[Path] = []
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.server = Server()
        threading.Thread(target=self.server.serve_forever, name="rope-web-server", daemon=True).start()
        config = {"node_modules": str(web_runtime_dir() / "node_modules"), "chromium": chromium_path(),
                  "args": list(CHROMIUM_ARGS), "url": self.server.url + "/",
                  "timeout_ms": int(timeout * 1000)}
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - the driver's stderr, closed in close()
        self.proc = subprocess.Popen(["node", str(HERE / "driver.cjs"), json.dumps(config)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr, text=True, bufsize=1,
                                     start_new_session=True)
        threading.Thread(target=self._read, name="rope-web-driver", daemon=True).start()
        ready = self._wait(None, timeout)
        self.chromium_version = str(ready.get("version", ""))
        self.info = self.call("init", {"bundle": bundle}, timeout=timeout)
        self.adapter: dict[str, Any] = self.call("adapter", {}, timeout=timeout)

    # -- the driver's lines ------------------------------------------------------------------------------------
    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self._lines.put(json.loads(line))
            except ValueError:
                continue
        self._lines.put(None)

    def _wait(self, call_id: int | None, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                msg = self._lines.get(timeout=max(0.01, left))
            except queue.Empty:
                raise WebError(f"no answer from the browser after {timeout:.0f} s") from None
            if msg is None:
                self._stderr.seek(0)
                tail = [ln for ln in self._stderr.read().decode(errors="replace").splitlines() if ln.strip()]
                fatal = next((e["text"] for e in reversed(self.events) if e.get("event") == "fatal"), None)
                raise WebError("the browser driver exited" + (f": {fatal.splitlines()[0]}" if fatal else "")
                               + (f" ({tail[-1][:300]})" if tail and not fatal else ""))
            if "event" in msg:
                if msg["event"] == "ready" and call_id is None:
                    return msg
                self.events.append(msg)
                continue
            if msg.get("id") == call_id:
                if not msg.get("ok"):
                    raise WebError(_clean(msg.get("error", "")))
                return msg.get("value") or {}

    def call(self, fn: str, args: Mapping[str, Any], timeout: float = 600) -> Any:
        if self.proc.poll() is not None or self.proc.stdin is None:
            raise WebError(f"the browser driver is not running (exit status {self.proc.returncode})")
        call_id = next(self._ids)
        try:
            self.proc.stdin.write(json.dumps({"id": call_id, "fn": fn, "args": dict(args)}) + "\n")
            self.proc.stdin.flush()
        except OSError as exc:
            raise WebError(f"the browser driver is gone ({exc})") from None
        return self._wait(call_id, timeout)

    def reload(self) -> None:
        """A fresh page (after a crash, or to drop every session and buffer); loads the bundle again."""
        self.call("__reload", {})
        self.call("init", {"bundle": self.bundle})

    def console_since(self, mark: int) -> list[str]:
        """The page's console lines logged after ``len(self.events) == mark``, up to now (a marker line is logged
        and waited for, so every line logged before this call is in)."""
        token = f"rope-mark {next(self._ids)}"
        self.call("mark", {"text": token})
        deadline = time.monotonic() + 30
        while not any(e.get("text") == token for e in self.events[mark:]) and time.monotonic() < deadline:
            try:  # the marker's console event may come after the call's answer
                msg = self._lines.get(timeout=0.5)
            except queue.Empty:
                continue
            if msg is not None and "event" in msg:
                self.events.append(msg)
        lines = []
        for e in self.events[mark:]:
            if e.get("event") == "console":
                if e.get("text") == token:
                    break
                lines.append(str(e.get("text", "")))
        return lines

    def crashed_since(self, mark: int) -> str | None:
        """The page's crash or error message logged after ``len(self.events) == mark``, if any."""
        for e in self.events[mark:]:
            if e.get("event") in ("crash", "pageerror"):
                return str(e.get("text", ""))
        return None

    # -- data ----------------------------------------------------------------------------------------------------
    def serve(self, path: Path) -> str:
        """A URL path on the server for ``path`` (read from where it is, on each request)."""
        path = Path(path).resolve()
        for url, known in self.server.files.items():
            if known == path:
                return url
        url = f"/files/{next(self._files)}/{path.name}"
        self.server.files[url] = path
        return url

    def exchange(self, fn: str, args: dict[str, Any], feeds: Mapping[str, np.ndarray],
                 timeout: float = 600) -> tuple[Any, dict[str, np.ndarray]]:
        """``window.rope.<fn>({...args, io})`` with ``feeds`` at ``/io/<io>``; returns its value and what it posted."""
        io = str(next(self._io))
        with self.server.lock:
            self.server.io_in[io] = encode(feeds)
        try:
            value = self.call(fn, {**args, "io": io}, timeout=timeout)
        finally:
            with self.server.lock:
                self.server.io_in.pop(io, None)
                posted = self.server.io_out.pop(io, None)
        return value, (decode(posted) if posted is not None else {})

    def allocators(self) -> dict[str, str]:
        """URLs of one-node ``Identity`` models, one per tensor type: the page allocates graph-capture buffers as
        their outputs (onnxruntime's own buffers; see ``gpuAlloc`` in rope.mjs for why)."""
        if not self._allocators:
            from onnx import TensorProto, helper

            folder = Path(tempfile.mkdtemp(prefix="rope-web-alloc-"))
            self._temp.append(folder)
            for dtype, web in WEB_TYPES.items():
                t = helper.np_dtype_to_tensor_dtype(dtype)
                if t == TensorProto.DOUBLE:
                    continue
                graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "alloc",
                                          [helper.make_tensor_value_info("x", t, None)],
                                          [helper.make_tensor_value_info("y", t, None)])
                model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                model.ir_version = 10
                path = folder / f"alloc_{web}.onnx"
                path.write_bytes(model.SerializeToString())
                self._allocators[web] = self.serve(path)
        return dict(self._allocators)

    # -- identity ------------------------------------------------------------------------------------------------
    @property
    def label(self) -> str:
        return (f"onnxruntime-web {package_version('onnxruntime-web')} ({self.bundle} bundle) in Chromium "
                f"{self.chromium_version}")

    @property
    def adapter_summary(self) -> str:
        a = self.adapter
        if not a.get("webgpu"):
            return f"no WebGPU adapter: {a.get('reason', '?')}"
        name = " ".join(x for x in (a.get("vendor"), a.get("architecture"), a.get("description")) if x)
        f16 = "shader-f16" if "shader-f16" in a.get("features", []) else "no shader-f16"
        return f"{name or 'unnamed adapter'}{' (fallback adapter)' if a.get('isFallbackAdapter') else ''}, {f16}"

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                if self.proc.stdin is not None:
                    self.proc.stdin.write(json.dumps({"id": 0, "fn": "__close", "args": {}}) + "\n")
                    self.proc.stdin.flush()
                self.proc.wait(timeout=15)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.server.shutdown()
        self.server.server_close()
        self._stderr.close()
        for folder in self._temp:
            shutil.rmtree(folder, ignore_errors=True)


def _clean(message: str) -> str:
    """The page's error without playwright's wrapping (``page.evaluate: `` and its call log)."""
    text = message.split("\nCall log:")[0]
    for prefix in ("page.evaluate: ", "Error: "):
        if text.startswith(prefix):
            text = text[len(prefix):]
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("at ")]
    return " ".join(" ".join(lines).split())[:800]


_BROWSERS: dict[str, Browser] = {}
_LOCK = threading.Lock()


def browser(bundle: str = "webgpu") -> Browser:
    """This process's browser with ``bundle`` loaded, started on first use (stopped at exit or by
    :func:`shutdown`); a browser whose driver died is replaced."""
    with _LOCK:
        b = _BROWSERS.get(bundle)
        if b is None or b.proc.poll() is not None:
            if b is not None:
                b.close()
            b = _BROWSERS[bundle] = Browser(bundle)
        return b


def shutdown() -> None:
    """Stop every browser this process started."""
    with _LOCK:
        for b in _BROWSERS.values():
            b.close()
        _BROWSERS.clear()


atexit.register(shutdown)


__all__ = ["BUNDLES", "CHROMIUM_ARGS", "Browser", "browser", "shutdown"]
