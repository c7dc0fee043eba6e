"""The second WebGPU runtime: onnxruntime >= 1.24 with the ``onnxruntime-ep-webgpu`` plugin EP, in its own venv.

It loads what onnxruntime-webgpu 1.27 refuses (``com.microsoft::MRotaryEmbedding``, 16-input GroupQueryAttention),
so the checker runs an original that does not load here on it instead: the run's worker
(``python -m rope_passes.check.runner``) is started with that venv's interpreter and this repository on its
``PYTHONPATH`` (it needs numpy, onnx and onnxruntime there, nothing installed from this project). The venv comes from
``scripts/setup-plugin-runtime.sh`` (default ``.venv-plugin`` in the repository root).

:func:`plugin_session` is how the worker opens a WebGPU session there. It cannot go through
:func:`rope_passes.runtime.sessions.create_session`: a plugin EP is only selected through
``SessionOptions.add_provider_for_devices``, and onnxruntime ignores that (with a warning) when ``providers=`` is
passed, as ``create_session`` does; by provider name the session silently comes up CPU-only. The same refusal of a
silent CPU fallback is asserted here.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: interpreter of the second runtime; "none" (or empty) turns the fallback off
PYTHON_ENV = "ROPE_PASSES_PLUGIN_PYTHON"
ALLOW_SOFTWARE_ENV = "ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER"
WEBGPU = "WebGpuExecutionProvider"


def default_python() -> str | None:
    """The second runtime's interpreter: ``$ROPE_PASSES_PLUGIN_PYTHON``, else ``.venv-plugin/bin/python`` in the
    repository this package runs from, when it exists; None when there is none (or the variable says ``none``)."""
    value = os.environ.get(PYTHON_ENV)
    if value is not None:
        return None if value.strip().lower() in ("", "none") else value
    candidate = Path(__file__).resolve().parents[2] / ".venv-plugin" / "bin" / "python"
    return str(candidate) if candidate.exists() else None


def is_plugin_runtime() -> bool:
    """True in an interpreter whose onnxruntime has no built-in WebGPU but has the plugin package."""
    import onnxruntime as ort

    return WEBGPU not in ort.get_available_providers() and importlib.util.find_spec("onnxruntime_ep_webgpu") is not None


def runtime_name() -> str:
    import onnxruntime as ort

    name = f"onnxruntime {ort.__version__}"
    if is_plugin_runtime():
        from importlib.metadata import version

        name += f" + onnxruntime-ep-webgpu {version('onnxruntime-ep-webgpu')}"
    return name


_DEVICE: list[Any] = []


def _device() -> Any:
    import onnxruntime as ort

    if not _DEVICE:
        import onnxruntime_ep_webgpu

        ort.register_execution_provider_library("webgpu", onnxruntime_ep_webgpu.get_library_path())
        devices = [d for d in ort.get_ep_devices() if d.ep_name == WEBGPU]
        if not devices:
            raise RuntimeError(f"the onnxruntime-ep-webgpu plugin lists no WebGPU device (no GPU and "
                               f"{ALLOW_SOFTWARE_ENV} unset, or no Vulkan driver)")
        _DEVICE.append(devices[0])
    return _DEVICE[0]


def plugin_session(model: str | bytes, webgpu_options: Mapping[str, str] | None = None, *,
                   graph_capture: bool = False, log_severity: int = 3) -> Any:
    """A WebGPU session on the plugin EP that really runs there (raises otherwise)."""
    import onnxruntime as ort

    from rope_passes.runtime.sessions import WebGPUUnavailableError, session_options

    options = {k: str(v) for k, v in (webgpu_options or {}).items()}
    if graph_capture:
        options["enableGraphCapture"] = "1"
    so = session_options("webgpu", webgpu_options=options, log_severity=log_severity)
    so.add_provider_for_devices([_device()], options)
    sess = ort.InferenceSession(str(model) if not isinstance(model, bytes) else model, so)
    if sess.get_providers()[0] != WEBGPU:
        raise WebGPUUnavailableError("the plugin WebGPU session fell back to CPU")
    return sess
