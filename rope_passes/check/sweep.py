"""The position sweep: single decode steps at positions spread over the whole table, not just the first few.

The decode (:mod:`.decode`) reaches ``prefill + steps`` positions; a table row past them is never read there. Each
sweep step is one token at position ``p`` after a *random* past of ``p`` tokens: ``past_key_values.*`` of shape
``[B, kv_heads, p, head]`` drawn from a fixed-seed N(0, 1) (the same for both graphs: drawn in sorted input-name
order from a seed of ``p``), the attention mask ``p + 1`` ones, position ``p``. The new token's query and key are
rotated with row ``p`` (the row the graph picks for total ``p + 1``), so a wrong row shows in ``logits`` and in the
new key of ``present.*``. A graph without a KV cache gets the whole sequence instead (``p + 1`` random ids).

Positions: by default (:func:`default_positions`) **every** position ``0..end-1`` where the CPU reference can afford
it (``end`` times the weights' bytes at most :data:`SWEEP_BYTES`: tiny and small models, seconds), else the sampled
rule below with its bound. ``--sweep N`` (:func:`sweep_positions`): every table switch (LongRoPE: total ``C`` reads
the short table, ``C + 1`` the long one) with its neighbours, the table's last two rows, and log-spaced positions in
between, ``n`` in all.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

import numpy as np

from rope_passes.check.decode import DecoderSpec, InputSpec, id_range, past_shape, step_feeds

#: sweep positions of ``--sweep`` without a number's default rule when the model is too large for every position
DEFAULT_SWEEP = 32
#: every position is swept when ``end * weight bytes`` is at most this: a single-token call reads every weight once,
#: so this is about the bytes the CPU reference reads per run (measured: ``current/llama/cpu_fp32``, 1.7 MB, 256
#: positions: +3 s over 32 positions for the four runs of a check on 2 cores); it also bounds the logits a run keeps
#: (a position's logits are smaller than the weights divided by the hidden size)
SWEEP_BYTES = 8 * 2**30
#: never more positions than this per run (each position's random past grows with it, and its outputs travel back
#: from the run's subprocess)
SWEEP_MAX = 1024


def default_positions(end: int, switches: Iterable[int], weight_bytes: int, seed: int = 0) -> tuple[list[int], str]:
    """The default sweep and the note that states its rule: every position ``0..end-1`` when the CPU reference can
    afford it (``end * weight_bytes <= SWEEP_BYTES`` and ``end <= SWEEP_MAX``); else ``n`` positions (what the
    budget affords, at least :data:`DEFAULT_SWEEP`): :func:`sweep_positions` (switches, their neighbours, the end,
    log-spaced) for half, and one position drawn from ``RandomState(seed)`` in each of ``k`` equal strata of
    ``width`` positions for the other half. Bound: a rewrite wrong on ``width`` or more consecutive positions is
    caught by every check (each such run holds a whole stratum); one wrong at a single other position is caught
    with probability ``1/width`` per seed."""
    if end < 1:
        return [], ""
    afford = SWEEP_BYTES // max(1, weight_bytes)
    if end <= min(afford, SWEEP_MAX):
        return list(range(end)), f"position sweep: every position 0..{end - 1} (single-token calls after a random past)"
    n = max(DEFAULT_SWEEP, min(afford, SWEEP_MAX))
    chosen = set(sweep_positions(end, switches, n // 2))
    k = n - n // 2
    width = -(-end // k)
    rng = np.random.RandomState(seed)
    for lo in range(0, end, width):
        chosen.add(int(rng.randint(lo, min(end, lo + width))))
    why = (f"{end} x {weight_bytes / 2**20:.0f} MB of weights is over {SWEEP_BYTES // 2**30} GB"
           if end <= SWEEP_MAX else f"more than {SWEEP_MAX} positions")
    return sorted(chosen), (
        f"position sweep: {len(chosen)} of the {end} positions, not all ({why}): the switches, their neighbours, the "
        f"end and log-spaced positions, and one position drawn (seed {seed}) from each of {-(-end // width)} strata "
        f"of {width}: a rewrite wrong on {width} or more consecutive positions is caught by every check, one wrong at "
        f"a single other position with probability 1/{width} per seed")


def sweep_positions(limit: int, switches: Iterable[int] = (), n: int = DEFAULT_SWEEP) -> list[int]:
    """``n`` positions in ``1..limit-1`` (position ``p`` = a total of ``p + 1`` tokens), sorted: for each switch
    ``C`` positions ``C-1`` and ``C`` (the last row before it and the first after), the last row, then ``C-2``,
    ``C+1`` and ``limit-2``, then log-spaced positions filling up to ``n`` (earlier ones win when ``n`` is small)."""
    if n <= 0 or limit < 2:
        return []
    cs = sorted(set(switches))
    priority = [p for c in cs for p in (c - 1, c)] + [limit - 1] + [p for c in cs for p in (c - 2, c + 1)]
    chosen: list[int] = []
    for p in priority + [limit - 2]:
        if 0 < p < limit and p not in chosen and len(chosen) < n:
            chosen.append(p)
    k = n - len(chosen)
    while k > 0:  # enough log-spaced candidates that, merged with the boundaries, n distinct positions result
        spread = np.unique(np.round(np.geomspace(1, limit - 1, k)).astype(int)).tolist()
        extra = [p for p in spread if p not in chosen]
        if len(extra) >= n - len(chosen) or k >= limit:
            chosen += extra[: n - len(chosen)]
            break
        k += 1
    return sorted(chosen)


def sweep_feeds(spec: DecoderSpec, position: int, seed: int = 0) -> dict[str, np.ndarray]:
    """One token at ``position`` after a random past of ``position`` tokens (the same for every graph)."""
    rng = np.random.RandomState(seed * 100_003 + position)
    token = rng.randint(*id_range(spec.vocab), size=(1, 1)).astype(np.int64)
    if spec.cacheless:  # no KV cache: the whole sequence, random ids, its last token at ``position``
        return step_feeds(spec, rng.randint(*id_range(spec.vocab), size=(1, position + 1)).astype(np.int64), 0, None)
    past = None
    if position:
        past = {}
        for name in sorted(spec.past_names):
            i = cast(InputSpec, spec.input(name))  # a past name is an input
            past[name] = rng.standard_normal(past_shape(spec, i, 1, position)).astype(i.dtype)
    return step_feeds(spec, token, position, past)


def run_sweep(session: Any, spec: DecoderSpec, positions: Sequence[int], seed: int = 0,
              results: dict[int, dict[str, np.ndarray]] | None = None, errors: dict[int, str] | None = None,
              on_step: Callable[[int], None] | None = None) -> dict[int, dict[str, np.ndarray]]:
    """Every output of one call per position; a call that raises is recorded in ``errors`` and the sweep goes on."""
    results = {} if results is None else results
    errors = {} if errors is None else errors
    for k, p in enumerate(positions):
        try:
            outs = session.run(spec.outputs, sweep_feeds(spec, p, seed))
            results[p] = dict(zip(spec.outputs, outs))
        except Exception as exc:  # noqa: BLE001 - a failing position is a result
            errors[p] = " ".join(str(exc).split())[:400] or type(exc).__name__
        if on_step is not None:
            on_step(k)
    return results


def spans(values: Sequence[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``"1..3, 7"``."""
    out = []
    for _, run in itertools.groupby(enumerate(sorted(values)), lambda kv: kv[1] - kv[0]):
        first, *rest = [v for _, v in run]
        out.append(f"{first}..{rest[-1]}" if rest else f"{first}")
    return ", ".join(out)


__all__ = ["DEFAULT_SWEEP", "SWEEP_BYTES", "SWEEP_MAX", "default_positions", "run_sweep", "spans",
           "sweep_feeds", "sweep_positions"]
