"""What is installed here: the WebGPU runtime beside rope-passes (package metadata only, no session, nothing
imported) and which Python interpreter runs which runtime.

The two Python runtimes cannot share an environment (both own the ``onnxruntime`` module), so a session on the
runtime that is not installed here runs in a child process of that runtime's interpreter, with this repository on
its ``PYTHONPATH`` (it needs numpy, onnx and onnx_ir there; ``scripts/setup-plugin-runtime.sh`` installs them):

* the runtime installed here (:func:`detect_installed`): this interpreter;
* ``onnxruntime-ep-webgpu``: ``$ROPE_PASSES_PLUGIN_PYTHON``, else ``.venv-plugin/bin/python`` in this repository;
* ``onnxruntime-webgpu``: ``$ROPE_PASSES_WEBGPU_PYTHON``, else ``.venv/bin/python`` in this repository.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

from rope_passes.errors import UsageError
from rope_passes.runtimes.descriptors import DESCRIPTORS, WEBGPU_127, WEBGPU_PLUGIN, python_runtimes, with_tables

#: the runtimes that are a Python installation, in the order they are shown (the JS runtimes have a probed table
#: too but are no Python installation)
RUNTIMES = python_runtimes()
#: the Python distributions that make up each runtime (what :func:`detect_installed` looks for)
DISTRIBUTIONS: dict[str, tuple[str, ...]] = {r.name: r.distributions for r in DESCRIPTORS if r.distributions}
#: the runtime when none is installed beside rope-passes (its own dependency)
DEFAULT_RUNTIME = WEBGPU_127




@dataclasses.dataclass(frozen=True)
class Installed:
    """The WebGPU runtime installed beside rope-passes, by its distributions' metadata."""

    runtime: str
    versions: Mapping[str, str]  # distribution -> version

    @property
    def label(self) -> str:
        return " + ".join(f"{d} {v}" for d, v in self.versions.items())


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def detect_installed() -> Installed | None:
    """Which runtime is installed beside rope-passes, from package metadata (no session, nothing imported):
    ``onnxruntime-webgpu`` if installed, else ``onnxruntime`` + ``onnxruntime-ep-webgpu``, else None.
    (Both own the ``onnxruntime`` module, so they cannot share one environment.)"""
    for runtime in RUNTIMES:
        versions = {d: _version(d) for d in DISTRIBUTIONS[runtime]}
        if all(versions.values()):
            return Installed(runtime, {d: v for d, v in versions.items() if v})
    return None


def default_runtime() -> str:
    """The runtime installed here (:func:`detect_installed`), else :data:`DEFAULT_RUNTIME`."""
    installed = detect_installed()
    return installed.runtime if installed is not None else DEFAULT_RUNTIME


def _name(runtime: str | None) -> str:
    """``runtime`` (default: the one installed here) as a runtime with a probed table; another name is a
    UsageError."""
    name = runtime or default_runtime()
    if name not in with_tables():
        raise UsageError(f"unknown runtime {name!r} (choose from: {', '.join(with_tables())})")
    return name


REPO = Path(__file__).resolve().parents[2]
#: runtime -> (environment variable naming its interpreter, default venv folder in this repository): its descriptor's
PYTHON_ENV = {r.name: (r.python.variable, r.python.venv) for r in DESCRIPTORS if r.python is not None}


def python_for(runtime: str | None = None) -> str | None:
    """The interpreter that runs ``runtime`` (default: the one installed here), or None when there is none."""
    runtime = _name(runtime)
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
    from rope_passes.runtime.sessions import ALLOW_SOFTWARE_ADAPTER

    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    if _name(runtime) == WEBGPU_PLUGIN:
        env.setdefault(ALLOW_SOFTWARE_ADAPTER, "1")
    return env


__all__ = ["DEFAULT_RUNTIME", "DISTRIBUTIONS", "PYTHON_ENV", "REPO", "RUNTIMES", "Installed", "child_env",
           "default_runtime", "detect_installed", "python_for"]
