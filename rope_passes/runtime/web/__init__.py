"""The browser WebGPU runtime: onnxruntime-web in headless Chromium (``check --runtime web``; docs/runtimes.md).

Three processes, all started and stopped here:

* a static server on ``127.0.0.1`` (a thread of this process) with the COOP/COEP headers that make the page
  cross-origin isolated. It serves the page (``index.html``, ``rope.mjs`` beside this file), onnxruntime-web's
  ``dist/`` from ``.web-runtime/node_modules`` (``scripts/setup-web-runtime.sh``), the model files the caller
  registers (the ``.onnx`` and its external data, read from where they are: onnxruntime-web fetches the external data
  from the server, nothing is copied into the browser profile), and ``/io/<id>``: the feeds of one call (GET) and its
  outputs (POST), as raw tensors;
* ``node driver.cjs``: playwright-core launching Debian's ``/usr/bin/chromium`` (headless, WebGPU enabled, the flags
  of :data:`CHROMIUM_ARGS`) and evaluating ``window.rope.<fn>(args)`` in the page for each JSON line it reads; the
  page's console comes back as events (:meth:`Browser.console_since`: the probe reads onnxruntime-web's verbose log);
* Chromium, whose WebGPU adapter on a machine without a GPU is its bundled SwiftShader (Vulkan on the CPU).

:class:`WebSession` looks like the part of an onnxruntime ``InferenceSession`` the checker uses (``run(names,
feeds)``), so :mod:`rope_passes.check.decode` and :mod:`rope_passes.check.sweep` drive it unchanged; its inputs and
outputs are read from the model file. :func:`browser` is one browser per process, started on first use and stopped at
exit (or by :func:`shutdown`); a crashed page is reopened on the next call.

    b = browser()                              # WebRuntimeUnavailable when the set-up is missing
    sess = WebSession(b, "model.onnx", "webgpu")
    sess.run(["logits"], feeds)                # numpy in, numpy out
    sess.release()

Bundles (``bundle=``): ``webgpu`` (``ort.webgpu.bundle.min.mjs``, onnxruntime's native WebGPU EP compiled to wasm:
the default) and ``all`` (``ort.all.bundle.min.mjs``, the older JSEP WebGPU backend). One page loads one bundle.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import http.server
import itertools
import json
import os
import queue
import shutil
import socketserver
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rope_passes.errors import RopePassesError

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
#: the npm folder of scripts/setup-web-runtime.sh (package.json + package-lock.json committed)
WEB_RUNTIME_ENV, CHROMIUM_ENV = "ROPE_PASSES_WEB_RUNTIME", "ROPE_PASSES_CHROMIUM"
DEFAULT_CHROMIUM = "/usr/bin/chromium"
#: Chromium's flags: headless WebGPU (``--enable-unsafe-webgpu``: WebGPU on Linux is behind it; Vulkan for Dawn), and
#: no background connections (a closed network refuses them, many at a time) nor first-run work
CHROMIUM_ARGS = ("--enable-unsafe-webgpu", "--enable-features=Vulkan", "--no-sandbox", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage")
BUNDLES = ("webgpu", "all")

#: numpy dtype <-> onnxruntime-web tensor type
_WEB_TYPES: dict[np.dtype, str] = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16", np.dtype(np.int64): "int64",
              np.dtype(np.int32): "int32", np.dtype(np.bool_): "bool", np.dtype(np.uint8): "uint8",
              np.dtype(np.int8): "int8", np.dtype(np.float64): "float64"}
_NP_TYPES: dict[str, np.dtype] = {v: k for k, v in _WEB_TYPES.items()}


class WebRuntimeUnavailable(RopePassesError):
    """The browser runtime is not set up here (no chromium, no node, no .web-runtime/node_modules)."""


class WebError(RuntimeError):
    """A call in the page raised (the message is the browser's, verbatim) or the browser went away."""


def web_runtime_dir() -> Path:
    return Path(os.environ.get(WEB_RUNTIME_ENV) or REPO / ".web-runtime")


def chromium_path() -> str:
    return os.environ.get(CHROMIUM_ENV) or DEFAULT_CHROMIUM


def missing() -> str | None:
    """Why the browser runtime cannot start here (None: it can), with the command that sets it up."""
    setup = "run scripts/setup-web-runtime.sh"
    if shutil.which("node") is None:
        return f"no node (Node.js) on PATH: install Node.js >= 18, then {setup}"
    modules = web_runtime_dir() / "node_modules"
    for package in ("onnxruntime-web", "playwright-core"):
        if not (modules / package / "package.json").is_file():
            return f"{modules / package} is missing: {setup}"
    chromium = chromium_path()
    if not (os.path.isfile(chromium) and os.access(chromium, os.X_OK)):
        return f"no chromium at {chromium}: {setup} (apt-get install chromium), or set ${CHROMIUM_ENV}"
    return None


@functools.cache
def package_version(name: str) -> str:
    path = web_runtime_dir() / "node_modules" / name / "package.json"
    try:
        return str(json.loads(path.read_text())["version"])
    except (OSError, ValueError, KeyError):
        return "?"


# ----------------------------------------------------------------------------------------------------------------
# Tensors over HTTP
# ----------------------------------------------------------------------------------------------------------------


def encode(arrays: Mapping[str, np.ndarray]) -> bytes:
    """uint32 header length, JSON header [{name, dtype, dims, offset, nbytes}], then the data (8-byte aligned)."""
    header, chunks, offset = [], [], 0
    for name, value in arrays.items():
        a = np.ascontiguousarray(value)
        if a.dtype not in _WEB_TYPES:
            raise WebError(f"{name}: {a.dtype} cannot go to onnxruntime-web")
        data = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header.append({"name": name, "dtype": _WEB_TYPES[a.dtype], "dims": list(a.shape), "offset": offset,
                       "nbytes": len(data)})
        pad = -len(data) % 8
        chunks.append(data + b"\0" * pad)
        offset += len(data) + pad
    head = json.dumps(header).encode()
    return len(head).to_bytes(4, "little") + head + b"".join(chunks)


def decode(blob: bytes) -> dict[str, np.ndarray]:
    n = int.from_bytes(blob[:4], "little")
    header = json.loads(blob[4:4 + n])
    base = 4 + n
    out = {}
    for t in header:
        dtype: np.dtype = _NP_TYPES[t["dtype"]]
        start = base + t["offset"]
        out[t["name"]] = np.frombuffer(blob[start:start + t["nbytes"]], dtype=dtype).reshape(t["dims"]).copy()
    return out


# ----------------------------------------------------------------------------------------------------------------
# The server
# ----------------------------------------------------------------------------------------------------------------


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.files: dict[str, Path] = {}  # url path -> file
        self.io_in: dict[str, bytes] = {}
        self.io_out: dict[str, bytes] = {}
        self.lock = threading.Lock()
        self.ort_dist = web_runtime_dir() / "node_modules" / "onnxruntime-web" / "dist"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    _TYPES = {".html": "text/html", ".mjs": "text/javascript", ".js": "text/javascript", ".wasm": "application/wasm",
              ".json": "application/json", ".map": "application/json"}

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def _headers(self, status: int, length: int, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(length))
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.send_header("Cross-Origin-Resource-Policy", "same-origin")
        self.send_header("Cache-Control", "no-store" if self.path.startswith(("/io/", "/files/")) else "max-age=3600")
        self.end_headers()

    def _send_bytes(self, data: bytes, ctype: str = "application/octet-stream") -> None:
        self._headers(200, len(data), ctype)
        self.wfile.write(data)

    def _send_file(self, path: Path) -> None:
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed below
        except OSError:
            self._headers(404, 0, "text/plain")
            return
        with f:
            size = os.fstat(f.fileno()).st_size
            self._headers(200, size, self._TYPES.get(path.suffix, "application/octet-stream"))
            shutil.copyfileobj(f, self.wfile, 1 << 20)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = self.path.split("?", 1)[0]
        if path in ("/", "/index.html"):
            self._send_file(HERE / "index.html")
        elif path == "/rope.mjs":
            self._send_file(HERE / "rope.mjs")
        elif path.startswith("/ort/") and "/" not in path[5:] and not path[5:].startswith("."):
            self._send_file(self.server.ort_dist / path[5:])
        elif path.startswith("/io/"):
            with self.server.lock:
                blob = self.server.io_in.pop(path[4:], None)
            if blob is None:
                self._headers(404, 0, "text/plain")
            else:
                self._send_bytes(blob)
        elif path in self.server.files:
            self._send_file(self.server.files[path])
        else:
            self._headers(404, 0, "text/plain")

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length)
        if not path.startswith("/io/"):
            self._headers(404, 0, "text/plain")
            return
        with self.server.lock:
            self.server.io_out[path[4:]] = data
        self._send_bytes(b"{}", "application/json")


# ----------------------------------------------------------------------------------------------------------------
# The browser
# ----------------------------------------------------------------------------------------------------------------


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
        self.server = _Server()
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
            for dtype, web in _WEB_TYPES.items():
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


# ----------------------------------------------------------------------------------------------------------------
# Sessions
# ----------------------------------------------------------------------------------------------------------------


def external_data(model: str | Path) -> list[str]:
    """The external data files a model file names (relative to its folder), without reading any weights."""
    import onnx

    proto = onnx.load(str(model), load_external_data=False)
    found: list[str] = []

    def visit(tensors: Any) -> None:
        for t in tensors:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                loc = next((e.value for e in t.external_data if e.key == "location"), None)
                if loc and loc not in found:
                    found.append(loc)

    def walk(graph: Any) -> None:
        visit(graph.initializer)
        for node in graph.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    visit([attr.t])
                visit(attr.tensors)
                if attr.HasField("g"):
                    walk(attr.g)
                for g in attr.graphs:
                    walk(g)

    walk(proto.graph)
    return found


@dataclasses.dataclass
class WebSession:
    """One onnxruntime-web session in the page, with the ``run(names, feeds)`` of an onnxruntime session."""

    browser: Browser
    model: str | Path
    ep: str = "webgpu"  # "webgpu" | "wasm" (onnxruntime-web's CPU)
    webgpu_options: Mapping[str, str] = dataclasses.field(default_factory=dict)
    graph_capture: bool = False
    outputs_on_gpu: bool = False  # preferredOutputLocation 'gpu-buffer' (always under graph capture)
    timeout: float = 600

    def __post_init__(self) -> None:
        path = Path(self.model)
        data = [{"path": loc, "url": self.browser.serve(path.parent / loc)} for loc in external_data(path)]
        value = self.browser.call("create", {
            "url": self.browser.serve(path), "externalData": data, "ep": self.ep, "capture": self.graph_capture,
            "webgpuOptions": dict(self.webgpu_options), "outputsOnGpu": self.graph_capture or self.outputs_on_gpu}, timeout=self.timeout)
        self.id: int = value["id"]
        self.input_names: list[str] = value["inputs"]
        self.output_names: list[str] = value["outputs"]

    def get_providers(self) -> list[str]:
        return ["WebGpuExecutionProvider (onnxruntime-web)" if self.ep == "webgpu" else "wasm (onnxruntime-web)"]

    def run(self, names: Sequence[str] | None, feeds: Mapping[str, np.ndarray],
            run_options: Mapping[str, Any] | None = None) -> list[np.ndarray]:
        names = list(names or self.output_names)
        _, outs = self.browser.exchange("run", {"session": self.id, "names": names,
                                                "runOptions": dict(run_options or {})}, feeds, self.timeout)
        return [outs[n] for n in names]

    def release(self) -> None:
        self.browser.call("release", {"session": self.id})


__all__ = ["BUNDLES", "CHROMIUM_ARGS", "Browser", "WebError", "WebRuntimeUnavailable", "WebSession", "browser",
           "chromium_path", "decode", "encode", "external_data", "missing", "package_version", "shutdown",
           "web_runtime_dir"]
