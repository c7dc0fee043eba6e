"""The static server of the browser runtime: a thread of this process on ``127.0.0.1`` with the COOP/COEP headers that
make the page cross-origin isolated. It serves the page (``index.html``, ``rope.mjs`` beside this file),
onnxruntime-web's ``dist/``, the model files a caller registers (read from where they are) and ``/io/<id>``: the
feeds of one call (GET) and its outputs (POST), as raw tensors (:mod:`.codec`)."""

from __future__ import annotations

import http.server
import os
import shutil
import socketserver
import threading
from pathlib import Path
from typing import Any

from rope_passes.runtime.web.install import web_runtime_dir

HERE = Path(__file__).resolve().parent


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.files: dict[str, Path] = {}  # url path -> file
        self.folders: dict[str, Path] = {}  # url prefix (ending in /) -> folder: its files, not its subfolders
        self.io_in: dict[str, bytes] = {}
        self.io_out: dict[str, bytes] = {}
        self.lock = threading.Lock()
        self.ort_dist = web_runtime_dir() / "node_modules" / "onnxruntime-web" / "dist"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(http.server.BaseHTTPRequestHandler):
    server: Server
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

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's name; a file's headers (the decode loop asks)
        path = self.path.split("?", 1)[0]
        file = self.server.files.get(path) or self._in_folder(path)
        if file is None or not file.is_file():
            self._headers(404, 0, "text/plain")
        else:
            self._headers(200, file.stat().st_size, self._TYPES.get(file.suffix, "application/octet-stream"))

    def _in_folder(self, path: str) -> Path | None:
        prefix, _, name = path.rpartition("/")
        folder = self.server.folders.get(prefix + "/")
        return folder / name if folder is not None and name and not name.startswith(".") else None

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = self.path.split("?", 1)[0]
        if path in ("/", "/index.html"):
            self._send_file(HERE / "index.html")
        elif path in ("/rope.mjs", "/web_decode_loop.mjs"):  # the page, and the decode loop it imports
            self._send_file(HERE / path[1:])
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
        elif (file := self._in_folder(path)) is not None:
            self._send_file(file)
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


__all__ = ["Handler", "Server"]
