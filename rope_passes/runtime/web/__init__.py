"""The browser WebGPU runtime: onnxruntime-web in headless Chromium (``check --runtime web``; docs/runtimes.md).

Three processes, all started and stopped here:

* a static server on ``127.0.0.1`` (:mod:`.server`) (a thread of this process) with the COOP/COEP headers that make the page
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

Modules: :mod:`.install` (where the set-up put things, :func:`missing`), :mod:`.codec` (tensors over HTTP),
:mod:`.server`, :mod:`.browser` (the driver and Chromium), :mod:`.session` (:class:`WebSession`).
"""

from rope_passes.runtime.web.browser import BUNDLES, CHROMIUM_ARGS, Browser, browser, shutdown
from rope_passes.runtime.web.codec import WEB_TYPES, WebError, decode, encode
from rope_passes.runtime.web.install import (
    CHROMIUM_ENV,
    WEB_RUNTIME_ENV,
    WebRuntimeUnavailable,
    chromium_path,
    missing,
    package_version,
    web_runtime_dir,
)
from rope_passes.runtime.web.session import WebSession, external_data

__all__ = ["BUNDLES", "CHROMIUM_ARGS", "CHROMIUM_ENV", "WEB_RUNTIME_ENV", "WEB_TYPES", "Browser", "WebError",
           "WebRuntimeUnavailable", "WebSession", "browser", "chromium_path", "decode", "encode", "external_data",
           "missing", "package_version", "shutdown", "web_runtime_dir"]
