"""Which Python interpreter runs which WebGPU runtime (:mod:`rope_passes.targets`).

The two runtimes cannot share an environment (both own the ``onnxruntime`` module), so a session on the runtime
that is not installed here runs in a child process of that runtime's interpreter, with this repository on its
``PYTHONPATH`` (it needs numpy, onnx and onnx_ir there; ``scripts/setup-plugin-runtime.sh`` installs them):

* the runtime installed here (:func:`rope_passes.targets.detect_installed`): this interpreter;
* ``onnxruntime-ep-webgpu``: ``$ROPE_PASSES_PLUGIN_PYTHON``, else ``.venv-plugin/bin/python`` in this repository;
* ``onnxruntime-webgpu``: ``$ROPE_PASSES_WEBGPU_PYTHON``, else ``.venv/bin/python`` in this repository.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from rope_passes.runtime.sessions import ALLOW_SOFTWARE_ADAPTER
from rope_passes.runtimes import DESCRIPTORS, WEBGPU_PLUGIN
from rope_passes.targets import default_runtime, detect_installed, get_target

REPO = Path(__file__).resolve().parents[2]
#: runtime -> (environment variable naming its interpreter, default venv folder in this repository): its descriptor's
PYTHON_ENV = {r.name: (r.python.variable, r.python.venv) for r in DESCRIPTORS if r.python is not None}


def python_for(runtime: str | None = None) -> str | None:
    """The interpreter that runs ``runtime`` (default: the one installed here), or None when there is none."""
    runtime = get_target(runtime or default_runtime()).name
    installed = detect_installed()
    if installed is not None and installed.runtime == runtime:
        return sys.executable
    variable, venv = PYTHON_ENV[runtime]
    value = os.environ.get(variable)
    if value is not None:  # "" or "none": no interpreter for it
        return None if value.strip().lower() in ("", "none") else value.strip()
    candidate = REPO / venv / "bin" / "python"
    return str(candidate) if candidate.exists() else None


def child_env(runtime: str | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process on ``runtime``'s interpreter: this repository on ``PYTHONPATH``; for the
    plugin, a software adapter allowed unless the caller's environment says otherwise (a GPU is still preferred)."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    if get_target(runtime or default_runtime()).name == WEBGPU_PLUGIN:
        env.setdefault(ALLOW_SOFTWARE_ADAPTER, "1")
    return env
