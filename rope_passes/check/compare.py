"""Output-by-output comparison of two runs' calls, with tolerances chosen by precision (:data:`TOLERANCES`; the
measurements behind them: docs/checker.md, "Tolerances").

An element passes when ``|a - b| <= atol + rtol * |b|`` (``b`` the reference side), like ``numpy.allclose``.
Reported per output and step: ``max_abs = max |a - b|`` and ``max_rel = max_abs / max |b|`` (the error relative to
the reference's scale; an element-wise ratio explodes on the many near-zero logits and says nothing).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    precision: str  # fp32 | fp16 | bf16 | int4

    def __str__(self) -> str:
        return f"{self.precision}: atol {self.atol:g}, rtol {self.rtol:g}"


TOLERANCES = {
    "fp32": Tolerance(1e-4, 1e-4, "fp32"),
    "fp16": Tolerance(1e-1, 2e-2, "fp16"),
    "bf16": Tolerance(2e-1, 4e-2, "bf16"),
    "int4": Tolerance(1e-1, 2e-2, "int4"),
}


#: fp16 graphs, rewritten vs original on onnxruntime's CPU EP (same runtime): its kernels accumulate in fp32, so a
#: correct rewrite moves fp16 logits by at most 0.0049 there, a 1 % error inside one layer by 0.03 (docs/checker.md)
CPU_SAME_RUNTIME = {"fp16": Tolerance(2e-2, 4e-3, "fp16")}


def cpu_tolerance(tolerance: Tolerance) -> Tolerance:
    """The tolerance of a rewritten-vs-original comparison on the CPU EP of the same runtime: tighter than
    ``tolerance`` for fp16 (:data:`CPU_SAME_RUNTIME`) where ``tolerance`` is the default, else ``tolerance``."""
    tighter = CPU_SAME_RUNTIME.get(tolerance.precision)
    return tighter if tighter is not None and tolerance == TOLERANCES.get(tolerance.precision) else tolerance


@dataclasses.dataclass
class OutputDiff:
    step: int
    output: str
    max_abs: float
    max_rel: float
    ok: bool
    reason: str = ""  # shape mismatch, missing output, non-finite values
    schedule: str = ""  # kind "schedule": the schedule's name (``step`` is then its call)

    @classmethod
    def failed(cls, step: int, reason: str, output: str = "(run)", schedule: str = "") -> OutputDiff:
        """A failure without numbers: a call that raised (output ``(run)``), a missing output, a shape mismatch."""
        return cls(step, output, float("inf"), float("inf"), False, reason, schedule)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "output": self.output, "max_abs": _num(self.max_abs),
                "max_rel": _num(self.max_rel), "ok": self.ok, "reason": self.reason,
                **({"schedule": self.schedule} if self.schedule else {})}


def _num(x: float) -> float | str:
    return x if np.isfinite(x) else str(x)


def diff_arrays(actual: np.ndarray, reference: np.ndarray, tol: Tolerance, step: int, output: str) -> OutputDiff:
    if actual.shape != reference.shape:
        return OutputDiff.failed(step, f"shape {list(actual.shape)} != reference {list(reference.shape)}", output)
    a = np.asarray(actual, dtype=np.float64)
    b = np.asarray(reference, dtype=np.float64)
    if a.size == 0:
        return OutputDiff(step, output, 0.0, 0.0, True)
    nan_a, nan_b = ~np.isfinite(a), ~np.isfinite(b)
    if (nan_a != nan_b).any():
        return OutputDiff.failed(step, f"{int((nan_a != nan_b).sum())} non-finite values where the reference has none "
                                 "(or back)", output)
    finite = ~nan_a
    err = np.abs(a - b)[finite]
    ref = np.abs(b)[finite]
    if err.size == 0:
        return OutputDiff(step, output, 0.0, 0.0, True)
    max_abs = float(err.max())
    scale = float(ref.max())
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    ok = bool((err <= tol.atol + tol.rtol * ref).all())
    return OutputDiff(step, output, max_abs, max_rel, ok)


@dataclasses.dataclass
class Comparison:
    """``actual`` against ``reference``, every output of every compared step."""

    actual: str
    reference: str
    tolerance: Tolerance
    counts: bool  # part of the verdict (else shown for information, e.g. the EP's own error)
    diffs: list[OutputDiff] = dataclasses.field(default_factory=list)
    status: str = "compared"  # compared | skipped
    reason: str = ""  # why skipped, or which steps were left out and why
    kind: str = "decode"  # decode (OutputDiff.step = decode step) | sweep (= position) | schedule (= call)

    @property
    def name(self) -> str:
        return f"{self.actual} vs {self.reference}" if self.kind == "decode" else \
            f"{self.kind}: {self.actual} vs {self.reference}"

    @property
    def ok(self) -> bool:
        return self.status == "compared" and all(d.ok for d in self.diffs)

    @property
    def first_failure(self) -> OutputDiff | None:
        return next((d for d in self.diffs if not d.ok), None)

    def settle(self, notes: list[str], nothing: str) -> Comparison:
        """Its reason from ``notes``; skipped where nothing was compared (``nothing``: why, when no note says)."""
        self.reason = "; ".join(notes)
        if not self.diffs:
            self.status, self.reason = "skipped", self.reason or nothing
        return self

    def worst(self) -> dict[str, OutputDiff]:
        """Per output, the step with the largest error (failures first)."""
        out: dict[str, OutputDiff] = {}
        for d in self.diffs:
            cur = out.get(d.output)
            if cur is None or (cur.ok and not d.ok) or (cur.ok == d.ok and d.max_abs > cur.max_abs):
                out[d.output] = d
        return out

    def to_dict(self) -> dict[str, Any]:
        first = self.first_failure
        return {
            "actual": self.actual, "reference": self.reference, "kind": self.kind, "counts": self.counts,
            "status": self.status,
            "reason": self.reason, "ok": self.ok,
            "tolerance": {"atol": self.tolerance.atol, "rtol": self.tolerance.rtol,
                          "precision": self.tolerance.precision},
            "first_failure": first.to_dict() if first else None,
            "per_output": {k: v.to_dict() for k, v in self.worst().items()},
            **({"positions_compared" if self.kind == "sweep" else "steps_compared": sorted({d.step for d in self.diffs})}
               if self.kind != "schedule" else {"schedules_compared": sorted({d.schedule for d in self.diffs})}),
        }


def compare_steps(
    actual: Sequence[Mapping[str, np.ndarray]],
    reference: Sequence[Mapping[str, np.ndarray]],
    comparison: Comparison,
    steps: Sequence[int] | None = None,
) -> Comparison:
    """Fill ``comparison`` with every output of every step in ``steps`` (default: all steps both runs have)."""
    n = min(len(actual), len(reference))
    for step in steps if steps is not None else range(n):
        if step >= n:
            continue
        for name, ref in reference[step].items():
            if name not in actual[step]:
                comparison.diffs.append(OutputDiff.failed(step, "output missing from this run", name))
                continue
            comparison.diffs.append(diff_arrays(actual[step][name], ref, comparison.tolerance, step, name))
    if len(actual) != len(reference):
        comparison.reason = f"{len(actual)} vs {len(reference)} steps ran; compared {n}"
    return comparison
