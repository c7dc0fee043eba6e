"""The decode (a prefill, then single-token steps: :mod:`rope_passes.check.decode`), compared step by step, output by
output, in these pairs (:func:`pairs`; each against the original on the check's runtime, then on its fallback where
the original ran there):

* ``ep="webgpu"``: ``rewritten@webgpu vs original@webgpu`` (counted), ``rewritten@webgpu vs original@cpu`` (counted,
  but not for int4: its WebGPU and CPU dequantisation differ), ``original@webgpu vs original@cpu`` (the runtime's own
  error, for information); ``ep="cpu"``: ``rewritten@cpu vs original@cpu``;
* ``rewritten@cpu vs original@cpu`` (``ep="webgpu"``): a rewrite right on WebGPU only (a value
  WebGPU tolerates, an input it ignores) differs there; counted, at the CPU EP's tolerance
  (:func:`~rope_passes.check.compare.cpu_tolerance`); a rewritten graph that does not run there is a difference;
* ``rewritten@webgpu+capture vs rewritten@webgpu`` (the captured run), ``rewritten@E vs reference-logits``.

A concatenated LongRoPE table (:class:`rope_passes.analysis.longrope.LongRoPESwitch`, kind ``concat``) is wrong on
the CPU EP past its offset (it has no ``multiRotaryCacheConcatOffset``): comparisons with a CPU run stop there.
Where the runtime is as far from the CPU EP on the original as the rewritten graph is, ``rewritten@webgpu vs
original@cpu`` does not count (:func:`own_error`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from rope_passes.check.compare import (
    TOLERANCES,
    Comparison,
    OutputDiff,
    Tolerance,
    compare_steps,
    cpu_tolerance,
    diff_arrays,
)
from rope_passes.check.evidence import Evidence, concat_offset, ran
from rope_passes.check.spec import ORIGINAL, REWRITTEN, RunKey, RunResult

if TYPE_CHECKING:
    from rope_passes.check.plan import CheckPlan

NAME = "decode"
#: the comparison reference of ``--reference-logits``
REFERENCE_LOGITS = "reference-logits"


class Pair(NamedTuple):
    actual: RunKey
    reference: RunKey
    counts: bool
    tolerance: Tolerance
    why_not: str = ""  # not compared, and why
    offset: int | None = None  # a concatenated LongRoPE offset the CPU side stops at
    must_run: bool = False  # the actual run not running is a difference (else the comparison is skipped)


#: fills a pair's comparison: ``(comparison, actual run, reference run, offset)``
Fill = Callable[[Comparison, RunResult, RunResult, "int | None"], object]


def pairs(ev: Evidence, sweep: bool = False) -> list[Pair]:
    """Every pair of the module docstring; ``sweep``: the sweep's (no captured run; its CPU side stops at the
    original's offset on either EP; the runtime's own error on the check's runtime only; ``rewritten@cpu`` where it
    ran)."""
    int4 = ev.orig.precision == "int4"
    tol, ref_tol = ev.plan.tolerance, TOLERANCES["fp16"] if int4 else ev.plan.tolerance
    why, offset, rew = "int4: compared with its own original on the same EP only" if int4 else "", \
        concat_offset(ev.orig), ev.rewritten_key
    out = []
    for runtime in ev.runtimes:
        web, cpu = RunKey(ORIGINAL, "webgpu", runtime), RunKey(ORIGINAL, "cpu", runtime)
        if ev.ep == "cpu":
            out.append(Pair(rew, cpu, True, tol, offset=offset if sweep else None))
        else:
            out += [Pair(rew, web, True, tol), Pair(rew, cpu, not int4, ref_tol, why, offset)]
            out += [Pair(web, cpu, False, ref_tol, offset=offset)] if not sweep or runtime is None else []
    if ev.plan.graph_capture and not sweep:
        out.append(Pair(ev.captured_key, rew, True, tol))
    ref, rew_cpu = ev.original("cpu"), ev.by.get(RunKey(REWRITTEN, "cpu"))
    if ev.ep == "webgpu" and ref is not None and rew_cpu is not None and not (sweep and not ran(rew_cpu)):
        # the original's CPU run here, else on the fallback: then at the check's tolerance (another runtime's CPU EP)
        out.append(Pair(rew_cpu.key, ref.key, True, tol if ref.key.elsewhere else cpu_tolerance(tol),
                        offset=concat_offset(ev.orig, ev.rew), must_run=True))
    return out


def compare_pair(ev: Evidence, pair: Pair, kind: str = NAME, fill: Fill | None = None,
                 usable: Callable[[RunResult | None], bool] = ran) -> Comparison:
    """One pair's comparison of ``kind``, filled by ``fill(comparison, actual run, reference run, offset)``
    (default: the decode steps) where both runs are ``usable``; skipped (or, ``must_run``, a difference) where not."""
    c = Comparison(str(pair.actual), str(pair.reference), pair.tolerance, pair.counts, kind=kind)
    a, b = ev.by.get(pair.actual), ev.by.get(pair.reference)
    if pair.why_not:
        c.status, c.reason = "skipped", pair.why_not
    elif usable(a) and usable(b):
        assert a is not None and b is not None
        (fill or functools.partial(_steps, ev.plan))(c, a, b, pair.offset)
    elif pair.must_run and a is not None and not ran(a) and ran(b):
        c.diffs.append(OutputDiff.failed(0, f"the original runs on {pair.reference.ep} but the rewritten graph does "
                                            f"not: {a.status}: {a.reason}"))
    else:
        bad = next(r for r in (a, b) if r is None or not ran(r))
        c.status, c.reason = "skipped", f"{bad.label if bad else pair.actual} did not run" + (
            f" ({bad.status})" if bad else "")
    return c


def _steps(plan: CheckPlan, c: Comparison, a: RunResult, b: RunResult, offset: int | None) -> None:
    only = [k for k in range(plan.steps + 1) if plan.prefill + k <= offset] if offset else None
    compare_steps(a.steps, b.steps, c, only)
    if a.failed_step is not None and a.failed_step < len(b.steps) and (only is None or a.failed_step in only):
        c.diffs.append(OutputDiff.failed(a.failed_step, f"{a.label} failed at this step: {a.reason}"))
    notes = [c.reason] if c.reason else []
    if b.failed_step is not None:
        notes.append(f"{b.label} failed at step {b.failed_step}: compared the steps before it")
    if only is not None:
        notes.append(f"steps up to the LongRoPE offset {offset} only (the CPU EP cannot apply it)" if only else
                     "no step before the LongRoPE offset")
        c.status = c.status if only else "skipped"
    c.reason = "; ".join(notes)


def compare(ev: Evidence) -> list[Comparison]:
    out = [compare_pair(ev, p) for p in pairs(ev)]
    if ev.reference_logits is not None:
        out.append(_reference_logits(ev))
    if ev.ep == "webgpu" and (note := own_error(out, ev.rewritten_key)):
        ev.notes.append(note)
    return out


def _reference_logits(ev: Evidence) -> Comparison:
    """The rewritten run's logits against ``--reference-logits`` (fp32: fp32's tolerance, else the reference's)."""
    tol = TOLERANCES["fp32"] if ev.orig.precision == "fp32" else (
        TOLERANCES["fp16"] if ev.orig.precision == "int4" else ev.plan.tolerance)
    c = Comparison(str(ev.rewritten_key), REFERENCE_LOGITS, tol, True)
    r = ev.by[ev.rewritten_key]
    if r.ok:
        compare_reference_logits(r.steps, ev.reference_logits, ev.plan.prefill, c)
    else:
        c.status, c.reason = "skipped", f"{ev.rewritten_key} did not run ({r.status})"
    return c


def compare_reference_logits(actual: Sequence[Mapping[str, np.ndarray]], reference: np.ndarray, prefill: int,
                             comparison: Comparison, logits: str = "logits") -> Comparison:
    """Compare a run's logits with a ``[rows, vocab]`` reference (batch 0): rows are one per position (``prefill +
    steps`` rows, row t = logits after token t, like the corpus's ``ref_S8.npy``; fewer rows compare a prefix) or
    one per call (``steps + 1`` rows, the last position of each call, like ``ref_long.npy``)."""
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
            if lo < min(hi, m):
                rows.append((k, per_position[lo:min(hi, m)], reference[lo:min(hi, m)]))
        comparison.reason = f"reference rows are positions 0..{reference.shape[0] - 1}; compared {m} rows"
    for k, a, b in rows:
        comparison.diffs.append(diff_arrays(a.astype(np.float32), b.astype(np.float32), comparison.tolerance, k,
                                            logits))
    if not rows:
        comparison.status = "skipped"
    return comparison


def own_error(comparisons: list[Comparison], rew_key: RunKey | str, kind: str = NAME) -> str:
    """``rewritten@webgpu vs original@cpu`` is the check that WebGPU computes what the CPU EP does. Where the runtime
    itself is that far from the CPU EP on the *original* (the same step and output of ``original@webgpu vs
    original@cpu``: e.g. the browser's WebGPU on an explicit mRoPE rotation, 5e-4 on fp32 logits), a rewritten graph
    that equals its original on the same runtime (``rewritten@webgpu vs original@webgpu`` passed, counted) and is
    no further from the CPU EP than the original (within the tolerance) adds no error of its own: that comparison is
    then not counted, and says why (returned, for the report's notes; "" when it still counts). Any step (or sweep
    position) the rewritten graph is further off still counts."""
    by = {(c.actual, c.reference, c.kind): c for c in comparisons}
    web, cpu = str(RunKey(ORIGINAL, "webgpu")), str(RunKey(ORIGINAL, "cpu"))
    cross, same, own = by.get((str(rew_key), cpu, kind)), by.get((str(rew_key), web, kind)), by.get((web, cpu, kind))
    if cross is None or same is None or own is None or cross.ok or not cross.counts or not (same.ok and same.counts):
        return ""
    if own.status != "compared":
        return ""
    theirs = {(d.step, d.output): d for d in own.diffs}
    worst_own = worst_rew = 0.0
    for d in cross.diffs:
        if d.ok:
            continue
        o = theirs.get((d.step, d.output))
        if o is None or d.reason or not (d.max_abs <= o.max_abs + cross.tolerance.atol):
            return ""
        worst_own, worst_rew = max(worst_own, o.max_abs), max(worst_rew, d.max_abs)
    cross.counts = False
    why = (f"not counted: the runtime itself is {worst_own:.2g} from the CPU EP on the original at the same "
           f"{'positions' if kind != NAME else 'steps'}, and the rewritten graph, equal to its original on this "
           f"runtime, is {worst_rew:.2g} (no error of its own)")
    cross.reason = (cross.reason + "; " if cross.reason else "") + why
    return f"{cross.name}: {why}"


__all__ = ["NAME", "REFERENCE_LOGITS", "Pair", "compare", "compare_pair", "compare_reference_logits", "own_error",
           "pairs"]
