"""Which WebGPU runtime a check runs on (``check --runtime``; :mod:`rope_passes.targets`).

* ``onnxruntime-webgpu`` (onnxruntime-webgpu 1.27) or ``onnxruntime-ep-webgpu`` (onnxruntime + the WebGPU plugin
  EP): every run of the check (original and rewritten, CPU and WebGPU) on that runtime. The one installed here runs
  in this interpreter (in-process or in a subprocess of it, as before); the other in subprocesses of its own
  interpreter (:func:`rope_passes.runtime.interpreters.python_for`: ``$ROPE_PASSES_PLUGIN_PYTHON`` or
  ``.venv-plugin`` from ``scripts/setup-plugin-runtime.sh``; ``$ROPE_PASSES_WEBGPU_PYTHON`` or ``.venv``);
* ``all``: one check per runtime, one verdict each (:func:`rope_passes.check.core.check_runtimes`); the exit code is the worst of them
  (:func:`worst`: not equivalent, then could not run, then equivalent);
* ``web`` (``onnxruntime-web``): the WebGPU runs in headless Chromium (onnxruntime-web on the browser's WebGPU,
  :mod:`rope_passes.check.web`, one browser per process), the CPU runs (the reference) on onnxruntime's CPU EP
  here; set up by ``scripts/setup-web-runtime.sh``. Not part of ``all``;
* default: the runtime installed here.

A runtime asked for by name that has no interpreter is a usage error before anything runs (never a silent switch to
the other runtime).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rope_passes.errors import UsageError
from rope_passes.targets import RUNTIMES, WEB, WEBGPU_PLUGIN, default_runtime, get_target

if TYPE_CHECKING:
    from rope_passes.check.report import EquivalenceReport
    from rope_passes.check.runner import RunResult, RunSpec

#: ``--runtime all``: every runtime, one verdict each
ALL = "all"
#: ``--runtime web``: the browser runtime (:data:`rope_passes.targets.WEB`, onnxruntime-web in headless Chromium)
WEB_ALIAS = "web"
#: what ``check --runtime`` accepts
CHOICES = (*RUNTIMES, WEB_ALIAS, WEB, ALL)
#: verdicts from worst to best (the exit code of ``--runtime all`` is the worst one's)
_ORDER = ("not equivalent", "could not run", "equivalent (rotation tables only: the original runs nowhere here)",
          "equivalent")


def resolve(runtime: str | None) -> str:
    """The runtime's name (``None``: the one installed here); a usage error for an unknown one."""
    if runtime in (WEB, WEB_ALIAS):
        return WEB
    return get_target(runtime or default_runtime()).name


def runtimes_for(choice: str | None) -> list[str]:
    """The runtimes ``--runtime choice`` checks on, in the order they are shown."""
    return list(RUNTIMES) if choice == ALL else [resolve(choice)]


def interpreter(runtime: str) -> str | None:
    """The interpreter that runs ``runtime``'s sessions: None for this one (the runtime installed here), else the
    path of the other runtime's. Raises UsageError, saying how to set it up, when there is none (for ``web``: when
    the browser runtime is not set up; its CPU runs use this interpreter)."""
    if runtime == WEB:
        from rope_passes.runtime.web import missing

        why = missing()
        if why is not None:
            raise UsageError(f"the browser runtime is not set up here: {why}")
        return None
    from rope_passes.runtime.interpreters import PYTHON_ENV, python_for  # imports onnxruntime: not at CLI start

    python = python_for(runtime)
    if python is None:
        variable, venv = PYTHON_ENV[runtime]
        setup = "scripts/setup-plugin-runtime.sh" if runtime == WEBGPU_PLUGIN else "scripts/setup.sh"
        raise UsageError(f"no Python interpreter with {runtime} here: run {setup} (makes {venv}/), or set "
                         f"${variable} to one")
    same = Path(python).absolute() == Path(sys.executable).absolute()
    return None if same else python


def fallback_interpreter(runtime: str) -> str | None:
    """The second runtime for an original that does not load on ``runtime``: the plugin EP's interpreter when the
    check runs on onnxruntime-webgpu (None when it has none, or when the check already runs on the plugin)."""
    from rope_passes.runtime.interpreters import python_for

    return None if runtime == WEBGPU_PLUGIN else python_for(WEBGPU_PLUGIN)


def execute_elsewhere(spec: RunSpec, runtime: str | None, on_step: Callable[[int], None] | None = None,
                      on_sweep: Callable[[int], None] | None = None,
                      on_schedule: Callable[[int], None] | None = None) -> RunResult | None:
    """The hook of runtimes that are no Python interpreter: the run's result when ``runtime`` runs ``spec`` itself
    (``web``: a WebGPU run, in this process's browser), else None (run it as usual)."""
    if runtime != WEB or spec.ep != "webgpu":
        return None
    from rope_passes.check.web import execute_web_run

    return execute_web_run(spec, on_step, on_sweep=on_sweep, on_schedule=on_schedule)


def worst(reports: Sequence[EquivalenceReport]) -> str:
    """The worst verdict: not equivalent (found a difference), else could not run, else equivalent."""
    return min((r.verdict for r in reports), key=_ORDER.index)


__all__ = ["ALL", "CHOICES", "WEB", "WEB_ALIAS", "execute_elsewhere", "fallback_interpreter", "interpreter", "resolve",
           "runtimes_for", "worst"]
