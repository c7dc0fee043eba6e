"""Which WebGPU runtime a check runs on (``check --runtime``): names resolved through the runtime descriptors
(:mod:`rope_passes.runtimes`), never spelled here.

* ``onnxruntime-webgpu`` (onnxruntime-webgpu 1.27) or ``onnxruntime-ep-webgpu`` (onnxruntime + the WebGPU plugin
  EP): every run of the check (original and rewritten, CPU and WebGPU) on that runtime. The one installed here runs
  in this interpreter (in-process or in a subprocess of it, as before); the other in subprocesses of its own
  interpreter (:func:`rope_passes.runtimes.installed.python_for`: ``$ROPE_PASSES_PLUGIN_PYTHON`` or
  ``.venv-plugin`` from ``scripts/setup-plugin-runtime.sh``; ``$ROPE_PASSES_WEBGPU_PYTHON`` or ``.venv``);
* ``all``: one check per runtime, one verdict each (:func:`rope_passes.check.core.check_runtimes`); the exit code is the worst of them
  (:func:`worst`: not equivalent, then could not run, then equivalent);
* ``web`` (``onnxruntime-web``): the WebGPU runs in headless Chromium (onnxruntime-web on the browser's WebGPU,
  its backend :mod:`rope_passes.check.backends.web`, one browser per process), the CPU runs (the reference) on
  onnxruntime's CPU EP here; set up by ``scripts/setup-web-runtime.sh``. Not part of ``all``;
* default: the runtime installed here.

A runtime asked for by name that has no interpreter is a usage error before anything runs (never a silent switch to
the other runtime).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rope_passes.errors import UsageError
from rope_passes.runtimes import DESCRIPTORS, WEB, Runtime, check_names, descriptor

if TYPE_CHECKING:
    from rope_passes.check.report import EquivalenceReport

#: ``--runtime all``: every runtime whose descriptor says so (the Python ones), one verdict each
ALL = "all"
#: ``--runtime web``: the browser runtime (:data:`rope_passes.runtimes.WEB`, onnxruntime-web in headless Chromium)
WEB_ALIAS = "web"
#: what ``check --runtime`` accepts: every descriptor's names, then all
CHOICES = (*check_names(), ALL)
#: verdicts from worst to best (the exit code of ``--runtime all`` is the worst one's)
_ORDER = ("not equivalent", "could not run", "equivalent (rotation tables only: the original runs nowhere here)",
          "equivalent")


def runtime_of(name: str) -> Runtime:
    """The descriptor of runtime ``name`` (a name :func:`resolve` returned)."""
    found = descriptor(name)
    if found is None:
        raise UsageError(f"unknown runtime {name!r} (choose from: {', '.join(CHOICES)})")
    return found


def resolve(runtime: str | None) -> str:
    """The runtime's name (``None``: the one installed here); a usage error for an unknown one."""
    if runtime is None:
        from rope_passes.runtimes.installed import default_runtime

        return default_runtime()
    return runtime_of(runtime).name


def runtimes_for(choice: str | None) -> list[str]:
    """The runtimes ``--runtime choice`` checks on, in the order they are shown."""
    return [r.name for r in DESCRIPTORS if r.in_all] if choice == ALL else [resolve(choice)]


def interpreter(runtime: str) -> str | None:
    """The interpreter that runs ``runtime``'s sessions: None for this one (the runtime installed here), else the
    path of the other runtime's. Raises UsageError, saying how to set it up, when there is none (for a runtime that
    is no Python installation, the browser: when its backend says it is not set up; its CPU runs use this
    interpreter)."""
    desc = runtime_of(runtime)
    if desc.python is None:
        from rope_passes.check.backends import backend_module

        why = backend_module(desc).missing()
        if why is not None:
            raise UsageError(f"{backend_module(desc).WHAT} is not set up here: {why}")
        return None
    from rope_passes.runtimes.installed import python_for  # imports onnxruntime: not at CLI start

    python = python_for(desc.name)
    if python is None:
        raise UsageError(f"no Python interpreter with {desc.name} here: run {desc.python.setup} (makes "
                         f"{desc.python.venv}/), or set ${desc.python.variable} to one")
    same = Path(python).absolute() == Path(sys.executable).absolute()
    return None if same else python


def fallback_interpreter(runtime: str) -> str | None:
    """The interpreter of the runtime an original that does not load on ``runtime`` runs on (its descriptor's
    ``fallback``: the plugin EP's, for onnxruntime-webgpu and the browser); None when there is none."""
    from rope_passes.runtimes.installed import python_for

    fallback = runtime_of(runtime).fallback
    return None if fallback is None else python_for(fallback)


def worst(reports: Sequence[EquivalenceReport]) -> str:
    """The worst verdict: not equivalent (found a difference), else could not run, else equivalent."""
    return min((r.verdict for r in reports), key=_ORDER.index)


__all__ = ["ALL", "CHOICES", "WEB", "WEB_ALIAS", "fallback_interpreter", "interpreter", "resolve", "runtime_of",
           "runtimes_for", "worst"]
