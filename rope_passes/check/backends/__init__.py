"""The checker's runtimes as backends of its one run loop (:func:`rope_passes.check.runner.execute_run`).

A runtime's descriptor (:mod:`rope_passes.runtimes`) names its backend module; each module has

* ``WHAT``: how messages name the runtime ("the browser runtime");
* ``missing()``: why the runtime cannot run here (None: it can), with the command that sets it up;
* ``backend(spec)``: the :class:`RunBackend` that runs ``spec`` in this process, or None: ``spec`` is a run of the
  Python runtimes (:mod:`.native`: in a subprocess of the runtime's interpreter, or here; a JS runtime's CPU runs
  are onnxruntime's CPU EP here, the reference every runtime is compared with).

The loop is written once: open a session-like object (``run(names, feeds)``) or a capture driver, then the decode,
the schedules and the sweep. What differs between runtimes is a visible choice of the backend
(:attr:`RunBackend.reference_runs`, :attr:`RunBackend.after_failure`), never a second copy of the loop.

    :mod:`.native`  onnxruntime in Python (rope_passes.runtime.sessions; capture: rope_passes.check.capture)
    :mod:`.web`     onnxruntime-web in headless Chromium (rope_passes.runtime.web)
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any

from rope_passes.runtimes import Runtime, descriptor

if TYPE_CHECKING:
    import numpy as np

    from rope_passes.check.decode import DecoderSpec
    from rope_passes.check.spec import RunResult, RunSpec


class RunBackend:
    """What :func:`~rope_passes.check.runner.execute_run` asks of one runtime for one run (one instance per run)."""

    #: how a failure to start names the runtime ("cannot start <what>: ...")
    what = "onnxruntime"
    #: a reference run (``RunSpec.schedules_twice``) makes each schedule twice and each padded row alone
    #: (:func:`rope_passes.check.schedule_runs.run_reference`); False: each schedule once
    reference_runs = True
    #: the schedules and the sweep still run after a decode that failed (False: a failed run stops there)
    after_failure = True

    def start(self) -> str:
        """Start the runtime (raises when it cannot); returns its label (``RunResult.runtime``)."""
        raise NotImplementedError

    def notes(self) -> list[str]:
        """What the run's result says about where it ran (the adapter), once started."""
        return []

    def open(self, spec: RunSpec) -> Any:
        """A session of ``spec.model`` on ``spec.ep``: ``run(names, feeds)`` as an onnxruntime session's."""
        raise NotImplementedError

    def providers(self, session: Any) -> list[str]:
        return list(session.get_providers())

    def decoder_spec(self, session: Any, spec: RunSpec, table: np.ndarray | None) -> DecoderSpec:
        """What the graph declares (inputs, outputs), to drive it."""
        raise NotImplementedError

    def capture(self, spec: RunSpec, table: np.ndarray | None, captured: bool = True) -> Any:
        """A capture driver (``providers``, ``run(on_step, results)``, ``notes``) for a ``graph_capture`` run;
        ``captured=False``: the same driver (the same fixed buffers, the same calls) on a session without capture,
        every step run eagerly (:mod:`rope_passes.check.evidence.capture_ab`)."""
        raise NotImplementedError

    def close(self, handle: Any, result: RunResult) -> None:
        """After the run (``handle``: the session or capture driver, None when none opened)."""


def backend_module(runtime: Runtime) -> ModuleType:
    """The backend module of ``runtime`` (imported now)."""
    return importlib.import_module(runtime.backend)


def backend_for(runtime: str | None, spec: RunSpec) -> RunBackend | None:
    """The backend that runs ``spec`` in this process on ``runtime`` (None: the runtime installed here, or another
    Python runtime's interpreter, runs it: :mod:`.native`)."""
    found = descriptor(runtime) if runtime else None
    return None if found is None else backend_module(found).backend(spec)


__all__ = ["RunBackend", "backend_for", "backend_module"]
