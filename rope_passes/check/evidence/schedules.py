"""The schedules (:mod:`rope_passes.check.schedules`: the calls real clients make), compared call by call on what a
caller reads: ``schedule: rewritten@E vs <reference>`` per EP ``E`` the rewritten graph ran on, every schedule of
that EP. The reference is the original on the same EP (an exact rewrite is bit-identical there, and the EP's own
error is not the rewrite's), else the original on the second runtime's same EP; the comparison's ``reference``
names which. Never across EPs: where the original has no run on WebGPU, the CPU pair still compares both graphs on
every schedule. With a concatenated LongRoPE table on either side, CPU comparisons stop at the offset.

* :func:`compare_calls`: one :class:`~rope_passes.check.compare.OutputDiff` per output per call, on the real tokens
  and the real cache positions, less the elements a reference computes differently on its second pass;
* :func:`padded_rows_kept`: the rows of a padded batch the reference computes as it computes each alone;
  :func:`compare_padded_rows`: the others, against the reference's same batch or that row alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rope_passes.check.compare import Comparison, OutputDiff, cpu_tolerance, diff_arrays
from rope_passes.check.decode import PRESENT_PREFIX
from rope_passes.check.evidence import Evidence, concat_offset, ran
from rope_passes.check.models import attention_layout
from rope_passes.check.schedule_runs import AGAIN, ROW, row_alone
from rope_passes.check.schedules import Call, Schedule, fits
from rope_passes.check.spec import ORIGINAL, REWRITTEN, RunKey, RunResult

NAME = "schedule"


def compare(ev: Evidence) -> list[Comparison]:
    """One comparison per EP the rewritten graph ran on, over every schedule of that EP (module docstring)."""
    out = []
    for ep in ["cpu"] if ev.ep == "cpu" else ["webgpu", "cpu"]:
        rew, schedules = ev.by.get(RunKey(REWRITTEN, ep)), ev.plan.for_ep(ep)
        if rew is not None and schedules:
            out.append(_compare(ev, ep, rew, schedules))
    return out


def _compare(ev: Evidence, ep: str, rew: RunResult, schedules: list[Schedule]) -> Comparison:
    ref = ev.original(ep)
    tolerance = ev.plan.tolerance
    if ep == "cpu" and ref is not None and not ref.key.elsewhere:
        tolerance = cpu_tolerance(tolerance)
    c = Comparison(rew.label, ref.label if ref is not None else str(RunKey(ORIGINAL, ep)), tolerance, True, kind=NAME)
    if ref is None or not ran(rew) or not ref.schedules:
        c.status, c.reason = "skipped", ("no run of the original to compare with" if ref is None else
                                         f"{rew.label if not ran(rew) else ref.label} did not run them")
        return c
    offset = concat_offset(ev.orig, ev.rew)
    only = (lambda call: call.past + call.tokens <= offset) if offset and ep == "cpu" else None
    elsewhere, layout = ref.key.elsewhere, attention_layout(ev.orig)
    # a padded row a runtime computes unlike the row alone is compared where both graphs run the same WebGPU kernel
    # on the same padding (its deterministic values must agree); else it is told by the reference's row alone
    # (another runtime: the rows both honour): on the CPU EP GroupQueryAttention reads uninitialised memory after a
    # left-padded prompt (the same graph in two sessions differs by 0.1 there, which the second pass does not always
    # see)
    same_attention = ep == "webgpu" and not elsewhere and layout is not None and layout == attention_layout(ev.rew)
    # rows told so are compared with the original's same batch or the row alone only where both graphs run the same
    # attention kernel path: where the rewrite changed it (rotation moved into GroupQueryAttention, whose CPU kernel
    # rotates a prompt from its first column, padding or not; separate Q/K/V packed, another WebGPU kernel) the row is
    # undefined on both sides
    other_path = layout != attention_layout(ev.rew)
    kept = not elsewhere and only is None and not other_path
    undefined: dict[str, int] = {}
    rows_out: list[str] = []
    for s in schedules:
        if ep == "webgpu" and elsewhere and not fits(s, ev.plan.max_call):
            continue  # past the adapter's cap both graphs share its error only on one runtime (plan.same_kernels)
        got, want = rew.schedules.get(s.name, []), ref.schedules.get(s.name, [])
        alone = {b: ref.schedules.get(f"{s.name}{ROW}{b}", []) for b in range(s.batch)}
        rows = None if same_attention else padded_rows_kept(s, want, alone, c.tolerance)
        if elsewhere and rows is not None:
            own = padded_rows_kept(s, got, {b: rew.schedules.get(f"{s.name}{ROW}{b}", []) for b in range(s.batch)},
                                   c.tolerance)
            rows = rows & own if own is not None else rows
        if rows is not None and not rows.all():
            rows_out.append(f"{s.name} row(s) {', '.join(str(b) for b in np.flatnonzero(~rows))}")
        if n := compare_calls(s, got, want, c, only, ref.schedules.get(s.name + AGAIN), rows):
            undefined[s.name] = n
        if rows is not None and not rows.all() and kept:  # still read by the caller
            compare_padded_rows(s, got, want, alone, rows, c, decode_only=ep == "cpu")
        if s.name in rew.schedule_errors and len(got) < len(want):
            c.diffs.append(OutputDiff.failed(len(got), f"{rew.label} raised at this call: {rew.schedule_errors[s.name]}",
                                             schedule=s.name))
    notes = []
    if rows_out:
        who = f"{ref.label} and {rew.label} (another runtime)" if elsewhere else ref.label
        notes.append(f"{who} do(es) not compute {'; '.join(rows_out)} as it computes each alone (padding it does not "
                     "honour, e.g. GroupQueryAttention after a left-padded prompt on CPU): " + (
                         "compared with the original's same batch or each row alone" + (
                             ", the decode steps only (the prompt reads uninitialised memory there)" if ep == "cpu"
                             else "") if kept else "left out" + (
                             " (the rewrite changed the attention kernel path: rotation inside GroupQueryAttention or "
                             "packed Q/K/V; undefined on both sides)" if other_path else "")))
    if undefined:
        notes.append(f"{ref.label} computes different values on a second run of the same calls at "
                     f"{sum(undefined.values())} element(s) of {', '.join(undefined)} (not a function of the "
                     "inputs there, e.g. GroupQueryAttention on CPU after a left-padded prompt): left out")
    if only is not None:
        notes.append(f"calls up to {offset} tokens only (the CPU EP has no multiRotaryCacheConcatOffset)")
    skipped = sorted(set(s.name for s in schedules) - set(ref.schedules))
    if skipped:
        notes.append(f"{ref.label} did not run {', '.join(skipped)}")
    return c.settle(notes, "no call to compare")


def _row_outputs(calls: Sequence[dict[str, np.ndarray]], schedule: Schedule, b: int | None) -> dict[str, np.ndarray]:
    """Per output of shape ``[B, S, ...]`` (not ``present.*``): row ``b``'s real tokens over all calls, in order
    (``b`` None: the single row of a schedule sent alone)."""
    out: dict[str, list[np.ndarray]] = {}
    for call, outs in zip(schedule.calls(), calls):
        for name, v in outs.items():
            if name.startswith(PRESENT_PREFIX) or v.ndim < 2 or v.shape[1] != call.tokens:
                continue
            out.setdefault(name, []).append(v[0] if b is None else v[b][call.real[b, call.past:]])
    return {n: np.concatenate(parts) for n, parts in out.items()}


def padded_rows_kept(schedule: Schedule, reference: Sequence[dict[str, np.ndarray]],
                     alone: Mapping[int, Sequence[dict[str, np.ndarray]]], tolerance: Any) -> np.ndarray | None:
    """Which rows of a padded batch the reference computes as it computes each row alone (within ``tolerance``,
    on every ``[B, S, ...]`` output): the rows where padding means what a caller means by it. None: not a padded
    batch, or nothing to tell it by. Measured: GroupQueryAttention treats a left-padded prompt as right-padded on
    onnxruntime's CPU EP (a left-padded row's logits 3.5-4.5 off its own run), so there only the unpadded rows are
    defined; what a rewrite computes for the others is not compared."""
    if schedule.batch == 1 or len(set(schedule.lengths)) == 1:
        return None
    keep = np.ones(schedule.batch, bool)
    for b in range(schedule.batch):
        calls = alone.get(b)
        if not calls or len(calls) < len(reference):
            return None
        want, got = _row_outputs(calls, row_alone(schedule, b), None), _row_outputs(reference, schedule, b)
        if not want or set(want) != set(got):
            return None
        keep[b] = all(w.shape == got[n].shape and diff_arrays(got[n], w, tolerance, 0, n).ok
                      for n, w in want.items())
    return keep


def _read(value: np.ndarray, call: Call, name: str) -> np.ndarray:
    """The part of one output a caller reads: real tokens' rows, real cache positions."""
    b, s = call.batch, call.tokens
    if name.startswith(PRESENT_PREFIX) and value.ndim == 4 and value.shape[0] == b:
        if value.shape[2] > call.past + s:  # a buffer's rows past the sequence (another call's): no one reads them
            value = value[:, :, :call.past + s]
        t = value.shape[2]
        real = call.real if t == call.past + s else (call.real[:, call.past:] if t == s else None)
        if real is not None:
            return np.moveaxis(value, 2, 1)[real]
        return value
    if value.ndim >= 2 and value.shape[0] == b and value.shape[1] == s:
        return value[call.real[:, call.past:]]
    if value.ndim >= 2 and value.shape[0] == b and value.shape[1] == 1:  # last-token outputs
        return value[call.real[:, -1:]]
    return value


def compare_calls(schedule: Schedule, actual: Sequence[dict[str, np.ndarray]],
                  reference: Sequence[dict[str, np.ndarray]], comparison: Comparison,
                  only: Callable[[Call], bool] | None = None,
                  again: Sequence[dict[str, np.ndarray]] | None = None, rows: np.ndarray | None = None) -> int:
    """Append one :class:`OutputDiff` per output per call both runs made (``step`` = the call, ``schedule`` = its
    name), each on what a caller reads of it; ``only``: the calls to compare (default all). ``again``: the
    reference's second pass (:func:`run_twice`): elements where the two passes differ are left out. Returns how
    many were left out so. ``rows``: the rows of a padded batch to compare (:func:`padded_rows_kept`)."""
    undefined = 0
    for call in schedule.calls():
        if rows is not None:
            call = dataclasses.replace(call, real=call.real & rows[:, None])
        if call.index >= len(actual) or call.index >= len(reference):
            break
        if only is not None and not only(call):
            continue
        a, b = actual[call.index], reference[call.index]
        for name, ref in b.items():
            if name not in a:
                comparison.diffs.append(OutputDiff.failed(call.index, "output missing from this run", name,
                                                          schedule.name))
                continue
            if a[name].shape != ref.shape:
                d = diff_arrays(a[name], ref, comparison.tolerance, call.index, name)
            else:
                got, want = _read(a[name], call, name), _read(ref, call, name)
                second = again[call.index].get(name) if again is not None and call.index < len(again) else None
                if second is not None and second.shape == ref.shape:
                    w2 = _read(second, call, name)
                    stable = (want == w2) | (np.isnan(want.astype(np.float32)) & np.isnan(w2.astype(np.float32)))
                    if not stable.all():
                        undefined += int((~stable).sum())
                        got, want = got[stable], want[stable]
                d = diff_arrays(got, want, comparison.tolerance, call.index, name)
            d.schedule = schedule.name
            comparison.diffs.append(d)
    return undefined


def compare_padded_rows(schedule: Schedule, actual: Sequence[dict[str, np.ndarray]],
                        reference: Sequence[dict[str, np.ndarray]], alone: Mapping[int, Sequence[dict[str, np.ndarray]]],
                        rows: np.ndarray, comparison: Comparison, decode_only: bool = False) -> None:
    """The rows of a padded batch :func:`padded_rows_kept` left out of :func:`compare_calls` (the reference does not
    compute them as it computes each alone) are still what a caller reads: per call, each such row's real tokens of
    every ``[B, S, ...]`` output against the reference's same row of the same batch, and against the reference's run
    of that row alone; one :class:`OutputDiff` per row and output, the nearer of the two (a rewrite must compute the
    row as the original does in that batch, or as a caller means it). ``decode_only``: the calls after the prompt only
    (the CPU EP's GroupQueryAttention reads uninitialised memory in a left-padded prompt, not a function of the
    inputs, measured 0.1 apart between two sessions of one graph; its decode steps are deterministic)."""
    for b in np.flatnonzero(~rows):
        solo = alone.get(int(b), [])
        for call in schedule.calls():
            i = call.index
            if i >= len(actual) or i >= len(reference) or (decode_only and call.past == 0):
                continue
            real = call.real[b, call.past:]
            for name, ref in reference[i].items():
                got = actual[i].get(name)
                if name.startswith(PRESENT_PREFIX) or got is None or got.shape != ref.shape or ref.ndim < 2 \
                        or ref.shape[1] != call.tokens:
                    continue
                d = diff_arrays(got[b][real], ref[b][real], comparison.tolerance, i, name)
                own = solo[i].get(name) if i < len(solo) else None
                if not d.ok and own is not None and own.shape[1] == int(real.sum()):
                    d2 = diff_arrays(got[b][real], own[0], comparison.tolerance, i, name)
                    if d2.ok or d2.max_abs < d.max_abs:
                        d = d2
                if not d.ok:
                    d.reason = (f"row {b} of the padded batch: neither as the reference computes it in this batch "
                                "nor as it computes that row alone")
                d.schedule = schedule.name
                comparison.diffs.append(d)


__all__ = ["NAME", "compare", "compare_calls", "compare_padded_rows", "padded_rows_kept"]
