"""Running the schedules of :mod:`.schedules` on a session: :func:`run_schedule`, every output of every call;
:func:`run_reference`, a reference run makes each schedule twice (:func:`run_twice`, :data:`AGAIN`) and each row of a
padded batch alone (:func:`row_alone`, :data:`ROW`). What a caller reads of them is compared in
:mod:`rope_passes.check.evidence.schedules`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import numpy as np

from rope_passes.check.decode import PRESENT_PREFIX, DecoderSpec, keep_step, new_tokens, step_feeds
from rope_passes.check.schedules import LEFT, PLAIN, STATIC, Schedule

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
    backwards, cycled), a prompt as long as the schedule's first call, then one call of the rest (a chat's next
    turn). What it leaves need not be right (past a software adapter's cap it is not): a graph reads none of it."""
    row = schedule.ids[0][::-1]
    first = min(schedule.call_sizes[0], schedule.earlier)
    ids = tuple(row[k % len(row)] for k in range(schedule.earlier))
    rest = schedule.earlier - first
    return dataclasses.replace(schedule, name=schedule.name + "#earlier", lengths=(first,), ids=(ids,), padding=LEFT,
                               chunk=None, then=(rest,) if rest else (), earlier=0)


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
    left-padded prompt's last rows uninitialised); the comparison leaves such elements out."""
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
    (``results[name + ROW + b]``; the comparison tells padded rows by them). A call that raises ends that part; what
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


__all__ = ["AGAIN", "ROW", "earlier_conversation", "row_alone", "run_reference", "run_schedule", "run_twice",
           "scrubbed"]
