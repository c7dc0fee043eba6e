"""The comparisons beyond :func:`.verdict.compare_all` (the decode, sweep, capture and reference-logits ones):

* ``rewritten@cpu vs original@cpu`` (``ep="webgpu"``): the decode and the sweep, so a rewrite that is right on
  WebGPU only (an invalid value WebGPU tolerates, an input WebGPU ignores) is a difference; counted;
* ``schedule: rewritten@E vs <reference>`` per EP ``E`` the rewritten graph ran on: every schedule of that EP
  (:mod:`.schedules`), call by call, on what a caller reads. The reference is the original on the same EP (an exact
  rewrite is bit-identical there, and the EP's own error is not the rewrite's), else the original on the second
  runtime's same EP; the comparison's ``reference`` names which. Never across EPs: where the original has no run on
  WebGPU, the CPU pair still compares both graphs on every schedule.

With a concatenated LongRoPE table on either side (:class:`rope_passes.analysis.longrope.LongRoPESwitch`, kind
``concat``), CPU comparisons stop at the offset: the CPU EP has no ``multiRotaryCacheConcatOffset``.
"""

from __future__ import annotations

import numpy as np

from rope_passes.check.compare import TOLERANCES, Comparison, OutputDiff, compare_steps, cpu_tolerance
from rope_passes.check.models import attention_layout
from rope_passes.check.plan import CheckPlan
from rope_passes.check.runner import RunResult
from rope_passes.check.schedule_runs import AGAIN, ROW, compare_calls, compare_padded_rows, padded_rows_kept
from rope_passes.check.schedules import Schedule, fits
from rope_passes.check.spec import ORIGINAL, REWRITTEN, RunKey
from rope_passes.check.sweep import compare_sweep
from rope_passes.check.verdict import Evidence


def _ran(run: RunResult | None) -> bool:
    return run is not None and (run.ok or bool(run.steps))


def _concat_offset(ev: Evidence) -> int | None:
    offsets = [m.longrope.switch for m in (ev.orig, ev.rew) if m.longrope is not None and m.longrope.kind == "concat"]
    return min(offsets) if offsets else None


def _reference(ev: Evidence, ep: str) -> tuple[RunResult | None, bool]:
    """The original's run the rewritten graph on ``ep`` is compared with (same EP only: another EP's own error is
    not the rewrite's; the CPU runs cover a WebGPU run the original lacks), and whether it is on another EP."""
    by = ev.by
    for key in (RunKey(ORIGINAL, ep), RunKey(ORIGINAL, ep, ev.fallback_runtime)):
        if (key.runtime is None or ev.fallback_runtime) and _ran(by.get(key)):
            return by[key], False
    return None, False


def cpu_comparisons(ev: Evidence) -> list[Comparison]:
    """``rewritten@cpu`` against the original on CPU: the decode and the sweep (``ep="webgpu"`` only)."""
    rew = ev.by.get(RunKey(REWRITTEN, "cpu"))
    if ev.ep != "webgpu" or rew is None:
        return []
    ref, _ = _reference(ev, "cpu")
    if ref is None:
        return []
    offset = _concat_offset(ev)
    tolerance = ev.tolerance if ref.key.elsewhere else cpu_tolerance(ev.tolerance)
    decode = Comparison(rew.label, ref.label, tolerance, True)
    if not _ran(rew):
        decode.diffs.append(OutputDiff(0, "(run)", float("inf"), float("inf"), False,
                                       f"the original runs on CPU but the rewritten graph does not: {rew.status}: "
                                       f"{rew.reason}"))
        return [decode]
    only = [k for k in range(ev.steps + 1) if ev.prefill + k <= offset] if offset else None
    compare_steps(rew.steps, ref.steps, decode, only)
    if rew.failed_step is not None and rew.failed_step < len(ref.steps) and (only is None
                                                                            or rew.failed_step in only):
        decode.diffs.append(OutputDiff(rew.failed_step, "(run)", float("inf"), float("inf"), False,
                                       f"{rew.label} failed at this step: {rew.reason}"))
    if only is not None:
        decode.reason = f"steps up to the LongRoPE offset {offset} only (the CPU EP cannot apply it)"
        if not only:
            decode.status = "skipped"
    out = [decode]
    if ev.positions:
        sweep = Comparison(rew.label, ref.label, tolerance, True, kind="sweep")
        compare_sweep(rew, ref, sweep, (lambda p: p + 1 <= offset) if offset else None)
        out.append(sweep)
    return out


def schedule_comparisons(ev: Evidence, plan: CheckPlan) -> list[Comparison]:
    """One comparison per EP the rewritten graph ran on, over every schedule of that EP (module docstring)."""
    out = []
    eps = ["cpu"] if ev.ep == "cpu" else ["webgpu", "cpu"]
    offset = _concat_offset(ev)
    int4 = ev.orig.precision == "int4"
    for ep in eps:
        rew = ev.by.get(RunKey(REWRITTEN, ep))
        ref, cross = _reference(ev, ep)
        schedules: list[Schedule] = plan.for_ep(ep)
        if rew is None or not schedules:
            continue
        tolerance = ev.tolerance if not (cross and int4) else TOLERANCES["fp16"]
        if ep == "cpu" and ref is not None and not ref.key.elsewhere:
            tolerance = cpu_tolerance(tolerance)
        c = Comparison(rew.label, ref.label if ref is not None else str(RunKey(ORIGINAL, ep)), tolerance,
                       not (cross and int4), kind="schedule")
        if ref is None or not _ran(rew) or not ref.schedules:
            c.status, c.reason = "skipped", ("no run of the original to compare with" if ref is None else
                                             f"{rew.label if not _ran(rew) else ref.label} did not run them")
            out.append(c)
            continue
        cpu_side = ep == "cpu" or cross
        only = (lambda call: call.past + call.tokens <= offset) if offset and cpu_side else None
        undefined: dict[str, int] = {}
        rows_out: list[str] = []
        # padded rows a runtime computes unlike each row alone are left out only where the rewrite changed how
        # attention gets its positions (a fold into GroupQueryAttention), the reference ran on another runtime, or
        # the EP is the CPU one (its GroupQueryAttention reads uninitialised memory after a left-padded prompt: the
        # same graph in two sessions differs by 0.1 there, which the second run's filter does not always see): else
        # both graphs run the same WebGPU kernel on the same padding, and its deterministic values must agree
        same_attention = (ep == "webgpu" and not cross and not ref.key.elsewhere
                          and attention_layout(ev.orig) is not None
                          and attention_layout(ev.orig) == attention_layout(ev.rew))
        # a row the original computes unlike the row alone (padding its kernel misreads) is compared only where both
        # graphs run the same attention kernel path: where the rewrite changed it (rotation moved into
        # GroupQueryAttention, whose CPU kernel rotates a prompt from its first column, padding or not; separate
        # Q/K/V packed, another WebGPU kernel) the row is undefined on both sides
        other_path = attention_layout(ev.orig) != attention_layout(ev.rew)
        for s in schedules:
            if ep == "webgpu" and ref.key.elsewhere and not fits(s, plan.max_call):
                continue  # past the adapter's cap both graphs share its error only on one runtime (plan.same_kernels)
            got, want = rew.schedules.get(s.name, []), ref.schedules.get(s.name, [])
            rows = None if same_attention else padded_rows_kept(
                s, want, {b: ref.schedules.get(f"{s.name}{ROW}{b}", []) for b in range(s.batch)}, c.tolerance)
            if ref.key.elsewhere and rows is not None:  # another runtime: the rows both honour
                own = padded_rows_kept(s, got, {b: rew.schedules.get(f"{s.name}{ROW}{b}", [])
                                                for b in range(s.batch)}, c.tolerance)
                rows = rows & own if own is not None else rows
            if rows is not None and not rows.all():
                rows_out.append(f"{s.name} row(s) {', '.join(str(b) for b in np.flatnonzero(~rows))}")
            n = compare_calls(s, got, want, c, only, ref.schedules.get(s.name + AGAIN), rows)
            if rows is not None and not rows.all() and not ref.key.elsewhere and only is None and not other_path:
                # left out of the comparison above, still read by the caller: as the original computes them in the
                # same batch on the same runtime, or as it computes each row alone
                compare_padded_rows(s, got, want, {b: ref.schedules.get(f"{s.name}{ROW}{b}", [])
                                                   for b in range(s.batch)}, rows, c, decode_only=ep == "cpu")
            if n:
                undefined[s.name] = n
            if s.name in rew.schedule_errors and len(got) < len(want):
                c.diffs.append(OutputDiff(len(got), "(run)", float("inf"), float("inf"), False,
                                          f"{rew.label} raised at this call: {rew.schedule_errors[s.name]}",
                                          schedule=s.name))
        notes = []
        if rows_out:
            who = f"{ref.label} and {rew.label} (another runtime)" if ref.key.elsewhere else ref.label
            notes.append(f"{who} do(es) not compute {'; '.join(rows_out)} as it computes each alone (padding it "
                         "does not honour, e.g. GroupQueryAttention after a left-padded prompt on CPU): compared "
                         "with the original's same batch or each row alone" + (
                             ", the decode steps only (the prompt reads uninitialised memory there)" if ep == "cpu"
                             else "") if not who.endswith("(another runtime)") and only is None and not other_path
                         else ": left out" + (" (the rewrite changed the attention kernel path: rotation inside "
                                              "GroupQueryAttention or packed Q/K/V; undefined on both sides)"
                                              if other_path else ""))
        if undefined:
            notes.append(f"{ref.label} computes different values on a second run of the same calls at "
                         f"{sum(undefined.values())} element(s) of {', '.join(undefined)} (not a function of the "
                         "inputs there, e.g. GroupQueryAttention on CPU after a left-padded prompt): left out")
        if cross:
            notes.append(f"{rew.label} against the original on CPU: the original does not run on {ep}")
        if only is not None:
            notes.append(f"calls up to {offset} tokens only (the CPU EP has no multiRotaryCacheConcatOffset)")
        skipped = sorted(set(s.name for s in schedules) - set(ref.schedules))
        if skipped:
            notes.append(f"{ref.label} did not run {', '.join(skipped)}")
        c.reason = "; ".join(notes)
        if not c.diffs:
            c.status = "skipped"
            c.reason = c.reason or "no call to compare"
        out.append(c)
    return out


__all__ = ["cpu_comparisons", "schedule_comparisons"]
