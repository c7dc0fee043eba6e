"""Capture A/B: the replayed steps equal the same steps run uncaptured, on the same runtime, step by step.

A captured run (``rewritten@webgpu+capture``, ``--graph-capture``) feeds a decode through fixed WebGPU buffers:
a static KV buffer bound as past and present, the attention mask at its maximum length, the prefill uncaptured, decode
step 1 captured and the later steps replayed (:mod:`rope_passes.check.capture`, the browser's
:class:`~rope_passes.check.backends.web.WebCaptureDriver`). Compared with ``rewritten@webgpu`` alone, a difference
could come from the static buffers as much as from the replay. Here the same driver runs the same steps on the same
runtime, in the same process, with the same buffers, tokens and session options, every step run eagerly
(``RunBackend.capture(spec, table, captured=False)``: onnxruntime's ``gpu_graph_id=-1`` on every call, as the
captured run's prefill; the browser: a session without capture on the same buffers), so a step where the two differ
is a step whose replay computes something else than the graph does (a replay-only wrong output: onnxruntime #29594,
onnxruntime-genai #2300). It is its own verdict line: ``replay differs from the uncaptured run at step k``.

Tolerance: the check's own (both sides are the rewritten graph on one runtime; an exact replay is bit-identical).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rope_passes.check.compare import Comparison, OutputDiff, compare_steps
from rope_passes.check.evidence import Evidence
from rope_passes.check.spec import RunResult, RunSpec

NAME = "capture-ab"
#: the comparison's reference side: ``<the captured run> uncaptured``
UNCAPTURED = "uncaptured"


def parts(plan: Any, spec: RunSpec, info: Any = None) -> dict[str, Any] | None:
    """The captured run makes the A/B (its steps, uncaptured, after its own); no other run does."""
    return {"steps": spec.steps} if spec.key.capture else None


def run(backend: Any, spec: RunSpec, table: np.ndarray | None, data: Any, session: Any = None,
        dspec: Any = None) -> list[dict[str, np.ndarray]]:
    """The captured run's steps again, on a session of the same model without capture, through the same driver."""
    driver = backend.capture(spec, table, captured=False)
    steps: list[dict[str, np.ndarray]] = []
    result = RunResult(spec.label, "ok")
    try:
        driver.run(results=steps)
    finally:
        backend.close(driver, result)
    return steps


def compare(ev: Evidence) -> list[Comparison]:
    """Each captured run against its own uncaptured steps (counted)."""
    out = []
    for key, captured in ev.by.items():
        if not key.capture:
            continue
        c = Comparison(str(key), f"{key} {UNCAPTURED}", ev.plan.tolerance, True, kind=NAME)
        uncaptured = captured.parts.get(NAME)
        if NAME in captured.part_errors:
            c.status, c.reason = "skipped", f"the uncaptured steps did not run: {captured.part_errors[NAME]}"
        elif not captured.steps or uncaptured is None:
            c.status, c.reason = "skipped", f"{key} did not run ({captured.status})"
        else:
            compare_steps(captured.steps, uncaptured, c)
            if captured.failed_step is not None and captured.failed_step < len(uncaptured):
                c.diffs.append(OutputDiff.failed(captured.failed_step, f"the replay failed at this step: {captured.reason}"))
        out.append(c)
    return out


def failure_line(c: Comparison) -> str | None:
    """``replay differs from the uncaptured run at step k`` (the first failing step), or None."""
    d = c.first_failure if c.kind == NAME and c.counts and c.status == "compared" else None
    if d is None:
        return None
    return (f"replay differs from the uncaptured run at step {d.step}: output {d.output}, max abs {d.max_abs:.3g} "
            f"({c.actual}, {c.tolerance})" + (f"; {d.reason}" if d.reason else ""))


__all__ = ["NAME", "compare", "failure_line", "parts", "run"]
