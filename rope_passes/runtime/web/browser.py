"""The browser: ``node driver.cjs`` (playwright-core launching Chromium, evaluating ``window.rope.<fn>(args)`` in the
page for each JSON line it reads; the page's console comes back as events) and the :mod:`.server` it loads the page
from. :func:`browser` is one per process, host and bundle, started on first use and stopped at exit.

Hosts (:data:`.install.HOSTS`): ``chromium`` (the page in headless Chromium, the browser itself), and two where
``node node_driver.mjs`` evaluates the page's functions in Node, on the same server: ``dawn`` (onnxruntime-web's
bundle on the ``webgpu`` npm package, Dawn for Node: the browser's wasm and kernels, not the browser) and
``onnxruntime-node`` (onnxruntime-node's own WebGPU EP)."""

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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rope_passes.runtime.web.codec import WEB_TYPES, WebError, decode, encode
from rope_passes.runtime.web.install import (
    CHROMIUM,
    DAWN,
    HOSTS,
    ORT_NODE,
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
    """The server, the driver and its host (Chromium, or Node itself); :meth:`call` evaluates
    ``window.rope.<fn>(args)`` in the page."""

    def __init__(self, bundle: str = "webgpu", timeout: float = 120, host: str = CHROMIUM) -> None:
        if host not in HOSTS:
            raise ValueError(f"unknown host {host!r} (choose from {', '.join(HOSTS)})")
        why = missing(host)
        if why is not None:
            what = "the browser runtime" if host == CHROMIUM else f"the {host} host"
            raise WebRuntimeUnavailable(f"{what} is not set up: {why}")
        if bundle not in BUNDLES:
            raise ValueError(f"unknown onnxruntime-web bundle {bundle!r} (choose from {', '.join(BUNDLES)})")
        self.bundle, self.host = bundle, host
        self.events: list[dict[str, Any]] = []  # console errors, page errors, crashes (the latest last)
        self._ids = itertools.count(1)
        self._io = itertools.count(1)
        self._files = itertools.count(1)
        self._allocators: dict[str, str] = {}
        self._temp: list[Path] = []
        self.server = Server()
        threading.Thread(target=self.server.serve_forever, name="rope-web-server", daemon=True).start()
        self._config = {"node_modules": str(web_runtime_dir() / "node_modules"), "chromium": chromium_path(),
                        "args": list(CHROMIUM_ARGS), "url": self.server.url + "/",
                        "timeout_ms": int(timeout * 1000), "host": host}
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - the drivers' stderr, closed in close()
        self._start(timeout)
        self.adapter: dict[str, Any] = self.call("adapter", {}, timeout=timeout)

    def _start(self, timeout: float) -> None:
        """Start the driver (and its page) and load the bundle."""
        driver = HERE / ("driver.cjs" if self.host == CHROMIUM else "node_driver.mjs")
        self.proc = subprocess.Popen(["node", str(driver), json.dumps(self._config)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr, text=True, bufsize=1,
                                     start_new_session=True)
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc, self._lines), name="rope-web-driver",
                         daemon=True).start()
        ready = self._wait(None, timeout)
        self.chromium_version = str(ready.get("version", ""))  # Node's version on the Node hosts
        self.info = self.call("init", {"bundle": self.bundle}, timeout=timeout)

    # -- the driver's lines ------------------------------------------------------------------------------------
    @staticmethod
    def _read(proc: subprocess.Popen, lines: queue.Queue) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                lines.put(json.loads(line))
            except ValueError:
                continue
        lines.put(None)

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
        """A fresh page (after a crash, or to drop every session and buffer); loads the bundle again. On the Node
        hosts the process is the page: a new one is started."""
        if self.host == CHROMIUM and self.proc.poll() is None:
            self.call("__reload", {})
            self.call("init", {"bundle": self.bundle})
            return
        self._stop()
        self._start(120)

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

    def stderr_mark(self) -> int:
        """Where the driver's stderr ends now: onnxruntime-node's native log goes there, not to the console."""
        self._stderr.seek(0, 2)
        return self._stderr.tell()

    def stderr_since(self, mark: int) -> list[str]:
        """The driver's stderr lines written after :meth:`stderr_mark` gave ``mark``."""
        self._stderr.seek(mark)
        return self._stderr.read().decode(errors="replace").splitlines()

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
        return self._register(self.server.files, path, lambda n: f"/files/{n}/{path.name}")

    def serve_folder(self, folder: Path) -> str:
        """A URL path (ending in ``/``) on the server for the files of ``folder`` (a genai folder: the decode loop
        reads ``genai_config.json``, the model and its data beside it)."""
        return self._register(self.server.folders, Path(folder).resolve(), lambda n: f"/folders/{n}/")

    def _register(self, served: dict[str, Path], path: Path, url_for: Callable[[int], str]) -> str:
        """``path``'s URL in ``served``, made with ``url_for`` the first time."""
        url = next((u for u, known in served.items() if known == path), None)
        if url is None:
            url = url_for(next(self._files))
            served[url] = path
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
        if self.host == ORT_NODE:
            return f"onnxruntime-node {package_version('onnxruntime-node')} (Node.js {self.chromium_version})"
        if self.host == DAWN:
            adapter = str(self.adapter.get("description") or "no adapter").split(":")[0]
            return (f"onnxruntime-web {package_version('onnxruntime-web')} wasm ({self.bundle} bundle) on Dawn for "
                    f"Node (webgpu {package_version('webgpu')}, Node.js {self.chromium_version}) / {adapter}")
        return (f"onnxruntime-web {package_version('onnxruntime-web')} ({self.bundle} bundle) in Chromium "
                f"{self.chromium_version}")

    @property
    def has_f16(self) -> bool:
        """Whether the adapter has ``shader-f16`` (an fp16 graph's WebGPU kernels need it)."""
        return "shader-f16" in self.adapter.get("features", [])

    @property
    def adapter_summary(self) -> str:
        a = self.adapter
        if not a.get("webgpu"):
            return f"no WebGPU adapter: {a.get('reason', '?')}"
        name = " ".join(x for x in (a.get("vendor"), a.get("architecture"), a.get("description")) if x)
        f16 = "shader-f16" if "shader-f16" in a.get("features", []) else "no shader-f16"
        return f"{name or 'unnamed adapter'}{' (fallback adapter)' if a.get('isFallbackAdapter') else ''}, {f16}"

    def close(self) -> None:
        self._stop()
        self.server.shutdown()
        self.server.server_close()
        self._stderr.close()
        for folder in self._temp:
            shutil.rmtree(folder, ignore_errors=True)

    def _stop(self) -> None:
        if self.proc.poll() is None:
            try:
                if self.proc.stdin is not None:
                    self.proc.stdin.write(json.dumps({"id": 0, "fn": "__close", "args": {}}) + "\n")
                    self.proc.stdin.flush()
                # Chromium closes its browser in a few seconds; a Node host exits at once, but Dawn for Node's device
                # threads can hold the exit (measured: 15 s): killed after 3
                self.proc.wait(timeout=15 if self.host == CHROMIUM else 3)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def _clean(message: str) -> str:
    """The page's error without playwright's wrapping (``page.evaluate: `` and its call log)."""
    text = message.split("\nCall log:")[0]
    for prefix in ("page.evaluate: ", "Error: "):
        if text.startswith(prefix):
            text = text[len(prefix):]
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("at ")]
    return " ".join(" ".join(lines).split())[:800]


_BROWSERS: dict[tuple[str, str], Browser] = {}
_LOCK = threading.Lock()


def browser(bundle: str = "webgpu", host: str = CHROMIUM) -> Browser:
    """This process's browser on ``host`` with ``bundle`` loaded, started on first use (stopped at exit or by
    :func:`shutdown`); a browser whose driver died is replaced."""
    with _LOCK:
        b = _BROWSERS.get((host, bundle))
        if b is None or b.proc.poll() is not None:
            if b is not None:
                b.close()
            b = _BROWSERS[(host, bundle)] = Browser(bundle, host=host)
        return b


def shutdown() -> None:
    """Stop every browser this process started."""
    with _LOCK:
        for b in _BROWSERS.values():
            b.close()
        _BROWSERS.clear()


atexit.register(shutdown)


__all__ = ["BUNDLES", "CHROMIUM_ARGS", "Browser", "browser", "shutdown"]
