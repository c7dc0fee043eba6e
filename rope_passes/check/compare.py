"""Step-by-step, output-by-output comparison of two decode runs, with tolerances chosen by precision.

An element passes when ``|a - b| <= atol + rtol * |b|`` (``b`` the reference side), like ``numpy.allclose``.
Reported per output and step: ``max_abs = max |a - b|`` and ``max_rel = max_abs / max |b|`` (the error relative to
the reference's scale; an element-wise ratio explodes on the many near-zero logits and says nothing).

Default tolerances (see docs/checker.md for the measurements behind them):

* fp32: atol 1e-4, rtol 1e-4. Measured on the corpus: fp32 WebGPU vs CPU <= 5e-6, CPU vs Hugging Face <= 5e-6; an
  exact rewrite is bit-identical or within float reassociation. A RoPE error (one cos row off by 1e-3) is far above.
* fp16: atol 1e-1, rtol 2e-2. fp16 has an 11-bit significand (eps 9.8e-4); logits of magnitude ~4 carry 4e-3 of
  rounding each, and the error grows along a decode through the fp16 KV cache: the corpus's fp16 WebGPU vs CPU
  logits differ by <= 0.03 after an 8-token prefill and by up to 0.078 after 17 tokens (phi3 webgpu_fp16_graph).
* bf16: atol 2e-1, rtol 4e-2 (8-bit significand, eps 7.8e-3: eight times fp16's).
* int4 (MatMulNBits): compared only against its own original on the same EP, with the fp16 tolerance: the corpus's
  int4 WebGPU vs CPU logits differ by up to 0.14 (different dequantisation order), which says nothing about a rewrite.
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


#: fp16 graphs, rewritten vs original on onnxruntime's CPU EP (same runtime): the CPU kernels accumulate in fp32, so
#: a correct rewrite moves fp16 logits by at most 0.0049 on every corpus folder (folds into GroupQueryAttention,
#: lowered MRotaryEmbedding: docs/checker.md), while a 1 % error inside one layer moves them by 0.03; the end-to-end
#: fp16 tolerance (0.1) is for WebGPU's fp16 kernels, whose own difference between the two graphs reaches 0.03
CPU_SAME_RUNTIME = {"fp16": Tolerance(2e-2, 4e-3, "fp16")}


def cpu_tolerance(tolerance: Tolerance) -> Tolerance:
    """The tolerance of a rewritten-vs-original comparison on the CPU EP of the same runtime: tighter than
    ``tolerance`` for fp16 (:data:`CPU_SAME_RUNTIME`) where ``tolerance`` is the default, else ``tolerance``."""
    tighter = CPU_SAME_RUNTIME.get(tolerance.precision)
    return tighter if tighter is not None and tolerance == TOLERANCES.get(tolerance.precision) else tolerance


def precision_of(model: Any) -> str:
    """fp32 / fp16 / bf16 from the graph's first float output; int4 when it has MatMulNBits (``model``: onnx_ir)."""
    import onnx_ir as ir

    if any(n.op_type == "MatMulNBits" for n in model.graph):
        return "int4"
    for out in model.graph.outputs:
        if out.dtype == ir.DataType.FLOAT16:
            return "fp16"
        if out.dtype == ir.DataType.BFLOAT16:
            return "bf16"
        if out.dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE):
            return "fp32"
    return "fp32"


@dataclasses.dataclass
class OutputDiff:
    step: int
    output: str
    max_abs: float
    max_rel: float
    ok: bool
    reason: str = ""  # shape mismatch, missing output, non-finite values
    schedule: str = ""  # kind "schedule": the schedule's name (``step`` is then its call)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "output": self.output, "max_abs": _num(self.max_abs),
                "max_rel": _num(self.max_rel), "ok": self.ok, "reason": self.reason,
                **({"schedule": self.schedule} if self.schedule else {})}


def _num(x: float) -> float | str:
    return x if np.isfinite(x) else str(x)


def diff_arrays(actual: np.ndarray, reference: np.ndarray, tol: Tolerance, step: int, output: str) -> OutputDiff:
    if actual.shape != reference.shape:
        return OutputDiff(step, output, float("inf"), float("inf"), False,
                          f"shape {list(actual.shape)} != reference {list(reference.shape)}")
    a = np.asarray(actual, dtype=np.float64)
    b = np.asarray(reference, dtype=np.float64)
    if a.size == 0:
        return OutputDiff(step, output, 0.0, 0.0, True)
    nan_a, nan_b = ~np.isfinite(a), ~np.isfinite(b)
    if (nan_a != nan_b).any():
        return OutputDiff(step, output, float("inf"), float("inf"), False,
                          f"{int((nan_a != nan_b).sum())} non-finite values where the reference has none (or back)")
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
                comparison.diffs.append(OutputDiff(step, name, float("inf"), float("inf"), False,
                                                   "output missing from this run"))
                continue
            comparison.diffs.append(diff_arrays(actual[step][name], ref, comparison.tolerance, step, name))
    if len(actual) != len(reference):
        comparison.reason = f"{len(actual)} vs {len(reference)} steps ran; compared {n}"
    return comparison


def compare_reference_logits(
    actual: Sequence[Mapping[str, np.ndarray]],
    reference: np.ndarray,
    prefill: int,
    comparison: Comparison,
    logits: str = "logits",
) -> Comparison:
    """Compare a run's logits with a ``[rows, vocab]`` reference (batch 0).

    Rows are either one per position (``prefill + steps`` rows, row t = logits after token t, like the corpus's
    ``ref_S8.npy``; fewer rows compare a prefix) or one per call (``steps + 1`` rows, the last position of each call,
    like ``ref_long.npy``).
    """
    n_steps = len(actual) - 1
    positions = [actual[0][logits][0]] + [a[logits][0, -1:] for a in actual[1:]]
    per_position = np.concatenate(positions)
    if reference.shape[0] == n_steps + 1 and prefill > 1:
        rows = [(k, np.concatenate([positions[0][-1:]] + positions[1:])[k:k + 1], reference[k:k + 1])
                for k in range(n_steps + 1)]
        comparison.reason = "reference rows are the last position of each call"
    else:
        m = min(reference.shape[0], per_position.shape[0])
        rows = []
        for k in range(n_steps + 1):
            lo, hi = (0, prefill) if k == 0 else (prefill + k - 1, prefill + k)
            hi = min(hi, m)
            if lo < hi:
                rows.append((k, per_position[lo:hi], reference[lo:hi]))
        comparison.reason = f"reference rows are positions 0..{reference.shape[0] - 1}; compared {m} rows"
    for k, a, b in rows:
        comparison.diffs.append(diff_arrays(a.astype(np.float32), b.astype(np.float32), comparison.tolerance, k,
                                            logits))
    if not rows:
        comparison.status = "skipped"
    return comparison
