"""Running the schedules of :mod:`.schedules` on a session and comparing what a caller reads of them.

* :func:`run_schedule`: every output of every call; :func:`run_reference`: a reference run makes each schedule twice
  (:func:`run_twice`, :data:`AGAIN`) and each row of a padded batch alone (:func:`row_alone`, :data:`ROW`);
* :func:`padded_rows_kept`: the rows of a padded batch the reference computes as it computes each alone;
* :func:`compare_calls`: one :class:`~rope_passes.check.compare.OutputDiff` per output per call, on the real tokens
  and the real cache positions; :func:`compare_padded_rows`: the rows of a padded batch it left out, against the
  reference's same batch or that row alone; :func:`differs`: the first difference of one schedule (``check --budget``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rope_passes.check.compare import Comparison, OutputDiff, diff_arrays
from rope_passes.check.decode import PRESENT_PREFIX, DecoderSpec, keep_step, new_tokens, step_feeds
from rope_passes.check.schedules import LEFT, PLAIN, STATIC, Call, Schedule

#: key suffix of a reference run's second pass over a schedule (:func:`run_twice`)
AGAIN = "#again"
#: key infix of a padded batch's row run alone (:func:`run_reference`)
ROW = "#row"




def run_schedule(session: Any, spec: DecoderSpec, schedule: Schedule,
                 results: list[dict[str, np.ndarray]] | None = None) -> list[dict[str, np.ndarray]]:
    """Every output of every call of ``schedule`` (``present.*`` as :func:`.decode.keep_step` keeps it: the new
    rows, and the whole cache on the last call); appended to ``results`` as they come, so the calls before one
    that raises are kept. A ``shared`` / ``static`` schedule feeds ``max_length`` past buffers (the first call's
    zeros, then the previous call's present written into one) and, ``static``, a ``max_length`` mask of ones then
    zeros; its ``present.*`` are read back trimmed to the tokens so far, as a caller reads them. With ``earlier``,
    the buffers first hold an earlier conversation (:func:`earlier_conversation`, run on zeroed buffers, its outputs
    not kept): a second conversation on onnxruntime-genai's buffers starts at past length 0 over its stale rows."""
    results = [] if results is None else results
    past: dict[str, np.ndarray] | None = None
    length = schedule.max_length if schedule.kv != PLAIN and not spec.cacheless else None
    if length is not None and schedule.earlier:
        past = _run_calls(session, spec, earlier_conversation(schedule), length, [], None)
    _run_calls(session, spec, schedule, length, results, past)
    return results


def earlier_conversation(schedule: Schedule) -> Schedule:
    """The conversation a ``schedule.earlier`` leaves in the buffers: ``earlier`` tokens (the schedule's own ids
    backwards, cycled), its prompt as long as the schedule's first call (so it fits where that does), then single
    steps."""
    row = schedule.ids[0][::-1]
    first = min(schedule.call_sizes[0], schedule.earlier)
    ids = tuple(row[k % len(row)] for k in range(schedule.earlier))
    return dataclasses.replace(schedule, name=schedule.name + "#earlier", lengths=(first,), ids=(ids,), padding=LEFT,
                               chunk=None, then=(1,) * (schedule.earlier - first), earlier=0)


def _run_calls(session: Any, spec: DecoderSpec, schedule: Schedule, length: int | None,
               results: list[dict[str, np.ndarray]], past: dict[str, np.ndarray] | None
               ) -> dict[str, np.ndarray] | None:
    """The calls of :func:`run_schedule`; returns the last call's buffers."""
    calls = list(schedule.calls())
    whole = schedule.matrix() if spec.cacheless else None  # no KV cache: every call sends the sequence so far
    for call in calls:
        mask = call.mask
        if whole is not None and call.past:
            end = call.past + call.tokens
            feeds = step_feeds(spec, whole[0][:, :end], 0, None, mask=call.mask, positions=whole[2][:, :end])
            outs = new_tokens(dict(zip(spec.outputs, session.run(spec.outputs, feeds))), call.past, call.tokens)
            results.append(keep_step(outs, call.past, call.index == len(calls) - 1))
            continue
        if length is not None:
            past = past if past is not None else _buffers(spec, call.batch, length)
            if schedule.kv == STATIC:
                mask = np.zeros((call.batch, length), call.mask.dtype)
                mask[:, :call.mask.shape[1]] = call.mask
        feeds = step_feeds(spec, call.ids, call.past, past, mask=mask, positions=call.positions)
        outs = dict(zip(spec.outputs, session.run(spec.outputs, feeds)))
        total = call.past + call.tokens
        fed, past = past, {p: outs[spec.present_name(p)] for p in spec.past_names if spec.present_name(p) in outs}
        if length is not None:
            past = {p: _into(v, length, total, fed.get(p) if fed else None) for p, v in past.items()}
            outs = {n: v[:, :, :total] if n.startswith(PRESENT_PREFIX) and v.ndim == 4 else v for n, v in outs.items()}
        results.append(keep_step(outs, call.past, call.index == len(calls) - 1))
    return past


def _buffers(spec: DecoderSpec, batch: int, length: int) -> dict[str, np.ndarray]:
    """Zeroed ``[batch, kv_heads, length, head]`` past buffers (onnxruntime-genai's shared KV buffers)."""
    empty = step_feeds(spec, np.zeros((batch, 1), np.int64), 0, None)
    return {p: np.zeros((*empty[p].shape[:2], length, empty[p].shape[3]), empty[p].dtype) for p in spec.past_names}


def _into(present: np.ndarray, length: int, total: int, fed: np.ndarray | None) -> np.ndarray:
    """The next call's ``length``-row past buffer, as genai's one shared buffer holds it: the buffer this call was
    fed with the present's rows below ``total`` written in. Rows past the sequence stay what the buffer held (zeros,
    or an earlier conversation's), never what a runtime left in a separate present array (on WebGPU: another
    call's rows), which no client reads."""
    if present.ndim != 4:
        return present
    out = fed.copy() if fed is not None and fed.shape == (*present.shape[:2], length, present.shape[3]) else \
        np.zeros((*present.shape[:2], length, present.shape[3]), present.dtype)
    n = min(length, total, present.shape[2])
    out[:, :, :n] = present[:, :, :n]
    return out


def scrubbed(schedule: Schedule, vocab: int) -> Schedule:
    """The same shapes with other ids: run between two passes of ``schedule`` so memory a kernel leaves
    uninitialised holds other values the second time."""
    return dataclasses.replace(schedule, ids=tuple(tuple((7 * i + 1) % vocab for i in row) for row in schedule.ids))


def run_twice(session: Any, spec: DecoderSpec, schedule: Schedule, vocab: int,
              first: list[dict[str, np.ndarray]], again: list[dict[str, np.ndarray]]) -> None:
    """A reference's run of ``schedule``: once, the scrubbed schedule, once more. An output element that differs
    between the two passes is not a function of the inputs (measured: GroupQueryAttention on the CPU EP leaves a
    left-padded prompt's last rows uninitialised); :func:`compare_calls` leaves such elements out."""
    run_schedule(session, spec, schedule, first)
    with contextlib.suppress(Exception):
        run_schedule(session, spec, scrubbed(schedule, vocab))
    run_schedule(session, spec, schedule, again)


def row_alone(schedule: Schedule, b: int) -> Schedule:
    """Row ``b`` of a batch as a caller would send it alone: no padding, the same calls after its prompt."""
    return dataclasses.replace(schedule, name=f"{schedule.name}{ROW}{b}", lengths=(schedule.lengths[b],),
                               ids=(schedule.ids[b],), padding=LEFT)


def run_reference(session: Any, spec: DecoderSpec, schedule: Schedule, vocab: int | None,
                  results: dict[str, list[dict[str, np.ndarray]]]) -> None:
    """What a run makes of ``schedule``: the schedule (``results[name]``; with a ``vocab``, a reference's, twice:
    :func:`run_twice`, the second pass in ``results[name + AGAIN]``) and, for a padded batch, every row alone
    (``results[name + ROW + b]``; :func:`padded_rows_kept` compares the two). A call that raises ends that part; what
    ran before is kept, the first error is raised after the rest ran."""
    error: Exception | None = None
    try:
        if vocab:
            run_twice(session, spec, schedule, vocab, results.setdefault(schedule.name, []),
                      results.setdefault(schedule.name + AGAIN, []))
        else:
            run_schedule(session, spec, schedule, results.setdefault(schedule.name, []))
    except Exception as exc:  # noqa: BLE001 - reported by the caller once the rows ran
        error = exc
    if schedule.batch > 1 and len(set(schedule.lengths)) > 1:
        for b in range(schedule.batch):
            alone = row_alone(schedule, b)
            with contextlib.suppress(Exception):
                run_schedule(session, spec, alone, results.setdefault(alone.name, []))
    if error is not None:
        raise error


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
                     alone: dict[int, Sequence[dict[str, np.ndarray]]], tolerance: Any) -> np.ndarray | None:
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
                comparison.diffs.append(OutputDiff(call.index, name, float("inf"), float("inf"), False,
                                                   "output missing from this run", schedule=schedule.name))
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
                        reference: Sequence[dict[str, np.ndarray]], alone: dict[int, Sequence[dict[str, np.ndarray]]],
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


def differs(schedule: Schedule, runs: Sequence[tuple[Any, DecoderSpec, Any, DecoderSpec]], tolerance: Any,
            vocab: int) -> OutputDiff | None:
    """The first output that differs on ``schedule`` between the two sessions of one of ``runs`` ((actual session,
    spec, reference session, spec) per EP; the reference run twice, :func:`run_twice`); a call that raises on the
    actual side only is a difference."""
    for sa, da, sb, db in runs:
        made: dict[str, list[dict[str, np.ndarray]]] = {}
        with contextlib.suppress(Exception):  # the reference cannot run it all: compare the calls before
            run_reference(sb, db, schedule, vocab, made)
        ref, again = made.get(schedule.name, []), made.get(schedule.name + AGAIN, [])
        rows = padded_rows_kept(schedule, ref, {b: made.get(f"{schedule.name}{ROW}{b}", [])
                                                for b in range(schedule.batch)}, tolerance)
        got: list[dict[str, np.ndarray]] = []
        try:
            run_schedule(sa, da, schedule, got)
        except Exception as exc:  # noqa: BLE001 - a call that raises only on the actual side is a difference
            if len(got) < len(ref):
                return OutputDiff(len(got), "(run)", float("inf"), float("inf"), False,
                                  " ".join(str(exc).split())[:300], schedule=schedule.name)
        c = Comparison("actual", "reference", tolerance, True, kind="schedule")
        compare_calls(schedule, got, ref, c, again=again, rows=rows)
        if c.first_failure is not None:
            return c.first_failure
    return None


__all__ = ["AGAIN", "ROW", "compare_calls", "compare_padded_rows", "differs", "earlier_conversation", "padded_rows_kept", "row_alone", "run_reference", "run_schedule",
           "run_twice", "scrubbed"]
