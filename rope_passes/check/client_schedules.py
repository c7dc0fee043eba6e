"""The schedules every ``check`` runs besides :func:`.schedules.default_schedules` (issue 26): what the model's
real client sends, and calls at every threshold the graph has.

* **the genai loop** (a genai folder whose config says ``past_present_share_buffer``, :class:`rope_passes.analysis.
  genai_contract.GenaiLoop`): a prompt and decode steps on shared ``max_length`` past/present buffers (at most
  :data:`SHARED_MAX` rows) with a growing mask of ones (how onnxruntime-genai runs every builder model), and the same
  with a ``max_length`` mask of ones then zeros (its capture loop) for a graph that reads its total length from the
  mask's sum; and a **second conversation** on the same buffers (``genai-second-conversation``,
  ``genai-capture-second-conversation``): genai keeps its buffers across generators of one model, so a new prompt
  starts at past length 0 over the rows an earlier conversation left, one that filled them (``max_length`` tokens,
  the context at most: the most a client leaves). Each graph runs a schedule in the layout its own config and graph
  take (:func:`for_graph`); only what a caller reads is compared (the real tokens, ``present.*`` to the tokens so far);
* **batched prompts and chat turns** (every model): ``batch-rows``, :data:`BATCH_ROWS` equal prompts; ``batch-5`` ..
  ``batch-7`` (every batch size 1..8 is sent); ``left-padded-4[b]`` / ``right-padded-4[b]``: on each side, every
  padding ``1..w-1`` of prompts up to ``w = 7`` tokens (the prefill cap at most), three padded rows and a ``w`` row per
  batch of four, padded as onnxruntime-genai (left) and transformers.js (right) pad, then decode steps (after a
  right-padded prompt the mask keeps its zeros in the middle: both clients append a 1 per step); ``second-turn``,
  user messages of :data:`SECOND_TURNS` tokens after a past, a decode step between them;
* **positions ahead of the cache** (a graph that rotates by the ``position_ids`` its caller sends: exporter, optimum,
  transformers.js layouts): a prompt and calls after it whose positions start :data:`AHEAD` past the cache's length;
* **thresholds** (:func:`boundary_schedules`), read from the graph: each LongRoPE switch and sliding window ``t``
  (totals above ``t`` read otherwise) gets single steps at totals ``t-1, t, t+1`` and a left-padded batch of a row
  below and a row above it (lengths 2 and ``t+2``: the batch's total decides, not a row's); a LongRoPE switch also
  a left-padded batch decoding across it in calls WebGPU computes (``switch-<t>-ragged-decode``: rows of ``w -``
  :data:`RAGGED` and ``w`` tokens, ``w`` the prefill cap, then single steps until the short row is past ``t``: the
  batch's total is past ``t`` while that row's own length is not, where a per-row switch and the batch's differ); the context's end and a
  table's last row ``t`` get single steps at totals ``t-8..t`` and a call of the last 8 positions; and at each, calls
  of every size ``k = 2..`` :data:`NEAR` (the software adapter's prefill cap at most; the context's end:
  ``..`` :data:`END_CALLS`) after a past end at every total from ``t -`` :data:`NEAR` to ``t +`` :data:`NEAR` (the
  context's end: to ``t``) (``near-<t>-calls-<k>+<r>``: a prompt, then calls of ``k``, one schedule per start
  residue ``r``: ``k`` schedules per size). A threshold past :data:`BOUNDARY_MAX` tokens is
  left to the sweep's single steps after a random past (a note says so).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rope_passes.analysis.genai_contract import GenaiLoop
from rope_passes.check.schedules import LEFT, PLAIN, RIGHT, SHARED, STATIC, GraphFacts, Schedule, _draw

#: how far ahead of the cache the positions of ``positions-ahead`` start
AHEAD = 5
#: rows of ``batch-rows`` (equal prompts, no padding)
BATCH_ROWS = 8
#: the captured run's earlier conversation is this many tokens longer than the checked one (its rows past it stay)
EARLIER_MORE = 4
#: the user messages of ``second-turn``: multi-token calls after a past, past the software adapter's prefill cap (a
#: CPU EP schedule there) and well beyond it
SECOND_TURNS = (12, 30)
#: ``genai-capture-steps`` decodes to this total (the capture loop's static mask at every total below it, as
#: ``long-decode`` reaches every position below it with a growing mask; the sweep's single steps go on to the context)
CAPTURE_TOTAL = 64
#: batch sizes no other schedule has (with them every batch of 1..BATCH_ROWS rows is sent at least once)
OTHER_BATCHES = (5, 6, 7)
#: the short row of ``switch-<t>-ragged-decode`` is this many tokens shorter: the batch's total is past ``t`` for that
#: many steps before the row's own length is
RAGGED = 4
#: calls of 2..NEAR tokens (the software adapter's prefill cap; a smaller cap bounds them) end at every total within
#: NEAR of each threshold (:func:`boundary_schedules`)
NEAR = 8
#: at the context's end calls of 2..END_CALLS tokens (each of those schedules sends a prompt of nearly the context:
#: 0.17 s on lavapipe for 245 tokens, times the four WebGPU passes; the last 8 positions in one call: end-<t>-straddle)
END_CALLS = 4
#: the largest threshold the boundary schedules reach by a prompt (longer: the sweep stands in)
BOUNDARY_MAX = 1024
#: the most rows a genai schedule's shared buffers get (a real model's max_length of 131072 would be GBs per call at
#: real size; a graph reads the buffer's length, not its rows, so any length past the tokens shows the layout)
SHARED_MAX = 2048


def client_schedules(facts: GraphFacts, seed: int = 1) -> list[Schedule]:
    """The genai loop's schedules, batched prompts, chat turns and ``positions-ahead`` (module docstring), inside the
    context."""
    rng = np.random.RandomState(seed)
    v, pad, out = facts.vocab, facts.pad, []
    n = min(5, facts.max_call or 5)
    length = min(facts.max_length, SHARED_MAX) if facts.max_length is not None else None
    # genai keeps its buffers across generators: an earlier conversation can have filled them (to max_length, the
    # context at most), and a new one starts at past length 0 over every row it left
    earlier = min(length, facts.context or length) if length is not None else 0
    if length is not None and length >= n + 4:
        out.append(Schedule("genai-shared-buffers", (n,), (_draw(rng, v, n + 3),), then=(1, 1, 1), pad=pad,
                            kv=SHARED, max_length=length))
        if earlier > n + 4:
            out.append(Schedule("genai-second-conversation", (n,), (_draw(rng, v, n + 3),), then=(1, 1, 1), pad=pad,
                                kv=SHARED, max_length=length, earlier=earlier))
        if facts.static_mask:
            # the capture loop's replays: single steps to total CAPTURE_TOTAL (where the buffers hold it), each compared
            steps = max(4, min(length, CAPTURE_TOTAL) - n)
            out.append(Schedule("genai-capture-steps", (n,), (_draw(rng, v, n + steps),), then=(1,) * steps,
                                pad=pad, kv=STATIC, max_length=length))
            if earlier > n + 4:
                out.append(Schedule("genai-capture-second-conversation", (n,), (_draw(rng, v, n + 4),),
                                    then=(1, 1, 1, 1), pad=pad, kv=STATIC, max_length=length, earlier=earlier))
    if facts.takes_positions:
        out.append(Schedule("positions-ahead", (4,), (_draw(rng, v, 7),), then=(1, 2), pad=pad, ahead=AHEAD))
    # a server's batched prompts: BATCH_ROWS equal rows, no padding (a batch of at least 3, 4, ... rows)
    out.append(Schedule("batch-rows", (n,) * BATCH_ROWS, tuple(_draw(rng, v, n + 2) for _ in range(BATCH_ROWS)),
                        then=(1, 1), pad=pad))
    # every batch size 1..BATCH_ROWS at least once: the sizes no other schedule has, short equal prompts and a step
    for size in OTHER_BATCHES:
        out.append(Schedule(f"batch-{size}", (3,) * size, tuple(_draw(rng, v, 4) for _ in range(size)), then=(1,),
                            pad=pad))
    # batches of four rows of four lengths, padded as genai (left) and transformers.js (right) pad, then decode
    # steps (after a right-padded prompt the mask keeps its zeros in the middle: both clients append a 1 per step):
    # on each side every padding 1..w-1 a batch of prompts up to w tokens can have, three per batch beside a w row
    w = min(7, facts.max_call or 7)
    groups = -(-(w - 1) // 3)
    for side, then in ((LEFT, (1, 1, 1)), (RIGHT, (1, 1))):
        for g in range(groups):
            rows = (w, *(w - p for p in range(1 + g, w, groups)))
            out.append(Schedule(f"{side}-padded-4" + "bcd"[g - 1:g], rows,
                                tuple(_draw(rng, v, k + sum(then)) for k in rows), side, then=then, pad=pad))
    # a chat's later turns: user messages of SECOND_TURNS tokens after a past (onnxruntime-genai's append_tokens)
    turns = tuple(x for k in SECOND_TURNS for x in (1, k))
    out.append(Schedule("second-turn", (n,), (_draw(rng, v, n + sum(turns) + 1),), then=(*turns, 1), pad=pad))
    out += boundary_schedules(facts, rng)
    if facts.context is not None:
        out = [s for s in out if s.width + sum(s.then) + s.ahead <= facts.context]
    return out


def boundary_schedules(facts: GraphFacts, rng: np.random.RandomState | None = None) -> list[Schedule]:
    """Calls at every threshold of the graph (module docstring): ``switch-<t>-*``, ``window-<t>-*``, ``end-<t>-*``."""
    rng = rng if rng is not None else np.random.RandomState(2)
    v, pad, out = facts.vocab, facts.pad, []
    room = facts.context

    def add(name: str, prompt: int, then: tuple[int, ...]) -> None:
        if prompt < 1 or (room is not None and prompt + sum(then) > room):
            return
        out.append(Schedule(name, (prompt,), (_draw(rng, v, prompt + sum(then)),), then=then, pad=pad))

    crossings = [("switch", t) for t in facts.switches] + [("window", t) for t in facts.windows]
    for kind, t in sorted(set(crossings), key=lambda c: c[1]):
        if t > BOUNDARY_MAX:
            continue
        add(f"{kind}-{t}-steps", t - 2, (1, 1, 1))  # totals t-1, t, t+1 (calls that straddle it: near-t-calls-*)
        # a batch whose rows sit on both sides of it: the batch's total decides, not one row's length
        if room is None or t + 3 <= room:
            rows = (2, t + 2)
            out.append(Schedule(f"{kind}-{t}-batch", rows, tuple(_draw(rng, v, n + 1) for n in rows), then=(1,),
                                pad=pad))
        # a left-padded batch decoding across it, in calls WebGPU computes (a prompt within the call cap, then
        # single steps): the batch's total passes t RAGGED tokens before the short row's own length does
        w = min(facts.max_call or NEAR, NEAR, t)
        p = min(RAGGED, w - 1)
        steps = t + p + 1 - w
        if kind == "switch" and p >= 1 and steps >= 1 and (room is None or t + p + 1 <= room):
            rows = (w - p, w)
            out.append(Schedule(f"{kind}-{t}-ragged-decode", rows, tuple(_draw(rng, v, n + steps) for n in rows),
                                then=(1,) * steps, pad=pad))
    for t in sorted(set(facts.ends)):
        if t > BOUNDARY_MAX or t < 2:
            continue
        k = min(8, t - 1)
        add(f"end-{t}-steps", t - k, (1,) * k)  # totals t-k .. t
        add(f"end-{t}-straddle", t - k, (k,))  # the last k positions in one call
    # calls of k tokens (a chunked prefill's chunks, speculative decoding's k-token steps) ending at every total
    # from t - NEAR to t + NEAR (the context's end: to t) of every threshold: one schedule per k and start residue
    cap = min(NEAR, facts.max_call or NEAR)
    near = [(k, t, t + (0 if k_ == "end" else NEAR)) for k_, t in
            [*crossings, *(("end", t) for t in facts.ends)] if t <= BOUNDARY_MAX
            for k in range(2, (min(cap, END_CALLS) if k_ == "end" else cap) + 1)]
    for k, t, hi in sorted(set(near)):
        lo = t - NEAR
        for r in range(k):
            ends = range(lo + r, hi + 1, k)
            if len(ends):
                add(f"near-{t}-calls-{k}+{r}", ends[0] - k, (k,) * len(ends))
    return out


def unreached(facts: GraphFacts) -> list[int]:
    """The thresholds :func:`boundary_schedules` leaves to the sweep."""
    return sorted({t for t in (*facts.switches, *facts.windows, *facts.ends) if t > BOUNDARY_MAX})


def for_graph(schedule: Schedule, loop: GenaiLoop) -> Schedule:
    """``schedule`` in the layout a graph's own client uses: a ``static`` mask only where the graph reads its total
    from the mask's sum, shared buffers only where its config shares them; else plain calls of the same tokens."""
    kv = schedule.kv
    if kv == STATIC and not loop.static_mask:
        kv = SHARED
    if kv == SHARED and not loop.share_buffer:
        kv = PLAIN
    if kv == schedule.kv:
        return schedule
    return dataclasses.replace(schedule, kv=kv, max_length=schedule.max_length if kv != PLAIN else None,
                               earlier=schedule.earlier if kv != PLAIN else 0)


__all__ = ["AHEAD", "BATCH_ROWS", "CAPTURE_TOTAL", "END_CALLS", "NEAR", "OTHER_BATCHES", "RAGGED", "EARLIER_MORE", "BOUNDARY_MAX", "SECOND_TURNS", "SHARED_MAX", "boundary_schedules", "client_schedules", "for_graph", "unreached"]
