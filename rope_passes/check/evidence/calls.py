"""The call grid: the call shapes a client can send inside the context, each an independent call after a random
past, on the CPU EP.

The decode, the schedules and the sweep make calls in the order real clients make them; a rewrite wrong for one
shape of call only (a prompt of 21 tokens, a 5-token call ending at total 37, a batch of 12, two identical rows, a
call on genai's shared buffers at past 70) is caught only if some call has that shape. Each shape here is one call:
a random past of ``p`` rows (N(0, 1), fixed seed, the same for both graphs), ids across the vocabulary, the mask all
ones. Families (:func:`_families`; ``E`` the context):

* ``prompt`` every length ``1..E`` at past 0; ``prompt-repeated`` one id repeated; ``prompt-pair`` two identical
  rows (onnxruntime-genai's ``num_return_sequences``); ``batch-<b>``: every batch ``3..`` :data:`BATCH_MAX`, a prompt
  of ``E // b`` tokens and a decode step after ``E // 2``;
* ``call-<k>``: one row, ``k = 2..`` :data:`GRID_MAX` tokens after a past (chunked prefill, chat turns, speculative
  decoding; GroupQueryAttention takes several tokens after a past for batch 1 only); ``crossing``: every such call
  with a threshold among its tokens (powers of two from 16, LongRoPE switches, windows); ``long-call``: every longer
  length once after a past;
* ``decode-pair``, ``decode-4``: a decode step of two identical rows, of four rows, after every past;
  ``left-padded``, ``right-padded``: of two rows, the last one's past padded (every amount as the past grows);
* where a config shares genai's KV buffers: ``shared``, ``shared-pair``, ``shared-twins`` (identical rows),
  ``shared-call``: decode steps, prompts of ``1..GRID_MAX`` and calls of ``2..GRID_MAX`` after a past
  on ``max_length`` buffers whose rows past the sequence are random (an earlier conversation's); each graph in its
  own client's layout (the capture loop's mask where the graph reads its total from the mask's sum, plain tensors
  where its config shares nothing): the same call, only the layout differs.

Of each family every ``s``-th shape (:data:`STRIDES`; from an offset drawn with ``--seed``) where the CPU reference
affords every position (the sweep's rule), else about :data:`SAMPLE` calls in all; the note states the rule and its
bound. Compared: every output (of a call longer than ``GRID_MAX`` the last token's logits: what a generating client
reads), ``present.*``'s new rows, and how far its past rows moved from the past fed. CPU EP runs only (a software
adapter is wrong on multi-token calls past its cap, and a WebGPU call there costs ~30 ms); with a concatenated
LongRoPE table only calls ending by its offset (the CPU EP has no ``multiRotaryCacheConcatOffset``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from rope_passes.check.compare import Comparison, OutputDiff, cpu_tolerance
from rope_passes.check.evidence import Evidence, concat_offset, ran
from rope_passes.check.spec import ORIGINAL, REWRITTEN, RunKey, RunSpec

NAME = "calls"
#: the longest call after a past on one row (a chunked prefill's chunk, a chat turn, speculative decoding's steps)
GRID_MAX = 16
#: the largest batch of the grid
BATCH_MAX = 16
#: calls made where the CPU reference cannot afford every shape
SAMPLE = 256
#: a failing call's diffs kept per comparison (the report names the first; the worst per output is always kept)
KEEP_FAILURES = 32
#: the random pasts of a run are one buffer per input, sliced, when it is at most this large; else drawn per call
BUFFER_BYTES = 256 * 2**20
PLAIN, SHARED, STATIC = "plain", "shared", "static"
PAST_MOVED = "#past"


@dataclasses.dataclass(frozen=True)
class GridCall:
    """``tokens`` new tokens on ``batch`` rows after a random past of ``past`` rows; rows ``identical`` (one row
    copied) or ids ``repeated`` (one id); ``shared``: on genai's shared buffers (each graph in its client's layout)."""

    family: str
    batch: int
    past: int
    tokens: int
    identical: bool = False
    repeated: bool = False
    shared: bool = False
    pad: int = 0  # the last row's past has this many padding columns (mask 0) ...
    side: str = ""  # ... on the "left" (as onnxruntime-genai pads) or the "right" (transformers.js)

    def describe(self) -> str:
        rows = f"{self.batch} identical rows" if self.identical else f"batch {self.batch}"
        ids = ", one id repeated" if self.repeated else ""
        where = " on genai's shared KV buffers (rows past it random)" if self.shared else ""
        padded = f", the last row's past {self.side}-padded by {self.pad}" if self.pad else ""
        return f"{self.family}: {rows}, {self.tokens} token(s) after a random past of {self.past}{ids}{where}{padded}"


#: every how many shapes of a family the grid makes where the CPU reference affords the grid (1: every one)
STRIDES = {"prompt": 1, "prompt-repeated": 4, "prompt-pair": 8, "batch": 1, "call": 8, "crossing": 1,
           "long-call": 4, "decode-pair": 1, "decode-4": 4, "left-padded": 2, "right-padded": 4, "shared": 4,
           "shared-pair": 4, "shared-twins": 4, "shared-call": 8}


def _families(end: int, max_length: int | None, cacheless: bool, thresholds: tuple[int, ...] = ()
              ) -> dict[str, list[GridCall]]:
    """Every family's shapes in order (consecutive shapes are neighbours: the next length, the next past)."""
    fam: dict[str, list[GridCall]] = {
        "prompt": [GridCall("prompt", 1, 0, k) for k in range(1, end + 1)],
        "prompt-repeated": [GridCall("prompt-repeated", 1, 0, k, repeated=True) for k in range(1, end + 1)],
        "prompt-pair": [GridCall("prompt-pair", 2, 0, k, identical=True) for k in range(1, end + 1)],
        "batch": [GridCall(f"batch-{b}", b, 0, max(1, end // b)) for b in range(3, BATCH_MAX + 1)],
    }
    if cacheless:
        return fam
    fam["batch"] += [GridCall(f"batch-{b}", b, end // 2, 1) for b in range(3, BATCH_MAX + 1) if end // 2 + 1 <= end]
    top = min(GRID_MAX, end - 1)
    fam["call"] = [GridCall(f"call-{k}", 1, p, k) for k in range(2, top + 1) for p in range(1, end - k + 1)]
    # every call that crosses a threshold (a power of two from 16: kernels' tiles and buffers; a LongRoPE switch, a
    # window): row b among the call's own tokens
    marks = sorted({t for t in (*(2**n for n in range(4, 32)), *thresholds) if 1 < t < end})
    fam["crossing"] = [GridCall(f"call-{k}", 1, p, k) for b in marks for k in range(2, top + 1)
                       for p in range(max(1, b - k + 1), b) if p + k <= end]
    # calls longer than GRID_MAX after a past (a chat's next turn): each length once, its past spread over the context
    fam["long-call"] = [GridCall(f"call-{k}", 1, 1 + (k * 37) % (end - k), k) for k in range(top + 1, end)]
    fam["decode-pair"] = [GridCall("decode-pair", 2, p, 1, identical=True) for p in range(1, end)]
    # a decode step of a batch whose last row's past is padded (every padding 1..p-1 turns up as p goes on)
    for side in ("left", "right"):
        fam[f"{side}-padded"] = [GridCall(f"{side}-padded", 2, p, 1, pad=1 + (p * 7919) % (p - 1), side=side)
                                 for p in range(2, end)]
    fam["decode-4"] = [GridCall("decode-4", 4, p, 1) for p in range(1, end)]
    if max_length:
        room = min(end, max_length)  # the shared buffers' rows (shared_length)
        for name, b in (("shared", 1), ("shared-pair", 2)):
            fam[name] = [GridCall(name, b, p, 1, shared=True) for p in range(1, room)] + [
                GridCall(name, b, 0, k, shared=True) for k in range(1, min(GRID_MAX, room) + 1)]
        fam["shared-twins"] = [GridCall("shared-twins", 2, p, 1, identical=True, shared=True) for p in range(1, room)]
        fam["shared-call"] = [GridCall("shared-call", 1, p, k, shared=True) for k in range(2, min(GRID_MAX, room) + 1)
                              for p in range(1, room - k + 1)]
    return fam


@functools.lru_cache(maxsize=8)
def plan_calls(end: int | None, max_length: int | None, cacheless: bool, every: bool, seed: int = 0,
               thresholds: tuple[int, ...] = ()) -> tuple[list[GridCall], str]:
    """The calls of the grid and the note that states its rule and bound (module docstring): of each family every
    ``s``-th shape from an offset drawn from ``RandomState(seed)`` (``s``: :data:`STRIDES` where ``every``, the CPU
    reference affording the grid; else that times the factor that brings the grid to :data:`SAMPLE` calls)."""
    if not end or end < 2:
        return [], "call grid: not made (the context is unknown)"
    fam = {n: cs for n, cs in _families(end, shared_length(max_length), cacheless, thresholds).items() if cs}
    full = sum(-(-len(cs) // STRIDES[n]) for n, cs in fam.items())
    factor = 1 if every else max(1, -(-full // SAMPLE))
    rng = np.random.RandomState(seed)
    chosen: list[GridCall] = []
    rules = []
    for n, cs in fam.items():
        stride = STRIDES[n] * factor
        chosen += cs[int(rng.randint(0, min(stride, len(cs)))):: stride]
        rules.append(f"{n} every shape" if stride == 1 else f"{n} every {_nth(stride)}")
    strides = sorted({STRIDES[n] * factor for n in fam} - {1})
    bound = (f"; of a family taken every s-th shape (from an offset drawn with seed {seed}), a rewrite wrong on s "
             "consecutive shapes is caught by every check, one wrong at a single shape with probability 1/s per seed"
             if strides else "")
    why = "" if every else " (the CPU reference does not afford the whole grid)"
    return chosen, (f"call grid: {len(chosen)} calls on the CPU EP{why}, each after a random past: "
                    f"{', '.join(rules)}{bound}")


def _nth(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def grid(plan: Any) -> tuple[list[GridCall], str]:
    """The plan's grid (:func:`plan_calls` of its facts; none where ``plan.grid`` says so) and its note."""
    facts = plan.facts if plan is not None else None
    if facts is None or plan.grid == "none":
        return [], ""
    return plan_calls(facts.context, facts.max_length, plan.cacheless, plan.grid == "every", plan.seed,
                      (*facts.switches, *facts.windows))


def parts(plan: Any, spec: RunSpec, info: Any) -> dict[str, Any] | None:
    """A CPU run's calls (its client's layout: shared buffers, the capture loop's mask); no other run makes them."""
    calls, _ = grid(plan)
    if spec.ep != "cpu" or spec.graph_capture or not calls:
        return None
    loop = info.loop
    length = shared_length(plan.facts.max_length)
    kv = (STATIC if loop.static_mask else SHARED) if loop.share_buffer and length else PLAIN
    # the random pasts depend on the plan alone, so both graphs get the same whatever their layouts
    rows = max([c.past for c in calls] + [length or 0 if any(c.shared for c in calls) else 0])
    return {"calls": [dataclasses.astuple(c) for c in calls], "kv": kv, "seed": plan.seed, "rows": rows,
            "length": length if kv != PLAIN else None}


def shared_length(max_length: int | None) -> int | None:
    """The rows of the shared buffers the grid feeds (genai's ``max_length``, at most ``SHARED_MAX``)."""
    from rope_passes.check.client_schedules import SHARED_MAX

    return min(max_length, SHARED_MAX) if max_length else None


def run(backend: Any, spec: RunSpec, table: np.ndarray | None, data: Any, session: Any = None,
        dspec: Any = None) -> list[dict[str, np.ndarray]]:
    """Every call of the grid on the run's own session, packed (:func:`_pack`): per call, every output but
    ``present.*`` (of a call longer than :data:`GRID_MAX` tokens the last token's row: what a generating client
    reads), ``present.*``'s new rows, and how far its past rows moved from the past fed (``<name>#past``); a call
    that raises, its one-line error."""
    from rope_passes.check.decode import PAST_PREFIX, PRESENT_PREFIX, id_range, past_shape, step_feeds

    calls = [GridCall(*c) for c in data["calls"]]
    if session is None or dspec is None or not dspec.is_decoder:
        return []
    rng = np.random.RandomState(data["seed"] * 7_919 + 17)
    low, high = id_range(dspec.vocab)
    length, rows = data["length"], data["rows"]
    batch = max(c.batch for c in calls)
    pasts: dict[str, np.ndarray] = {}
    if not dspec.cacheless and rows:
        shapes = {n: past_shape(dspec, dspec.input(n), batch, rows) for n in sorted(dspec.past_names)}
        if sum(int(np.prod(s)) for s in shapes.values()) * 4 <= BUFFER_BYTES:
            pasts = {n: rng.standard_normal(s).astype(dspec.input(n).dtype) for n, s in shapes.items()}
    # every call's ids from one draw (the same for every graph: the calls are the plan's), sliced call by call
    pool = rng.randint(low, high, size=sum((1 if c.identical else c.batch) * c.tokens for c in calls))
    at = 0
    made: list[dict[str, np.ndarray] | str] = []
    for k, c in enumerate(calls):
        rows_drawn = 1 if c.identical else c.batch
        ids = pool[at:at + rows_drawn * c.tokens].reshape(rows_drawn, c.tokens).astype(np.int64)
        at += rows_drawn * c.tokens
        if c.repeated:
            ids[:] = ids[:, :1]
        ids = np.repeat(ids, c.batch, axis=0) if c.identical else ids
        n = length if c.shared and length else c.past
        past = None
        if n and not dspec.cacheless:
            past, crng = {}, np.random.RandomState((data["seed"] * 1_000_003 + k) % 2**32)
            for name in sorted(dspec.past_names):
                i = dspec.input(name)
                buf = pasts[name][:c.batch, :, :n] if name in pasts else \
                    crng.standard_normal(past_shape(dspec, i, c.batch, n)).astype(i.dtype)
                past[name] = np.repeat(buf[:1], c.batch, axis=0) if c.identical else np.ascontiguousarray(buf)
        mask, positions = None, None
        if c.shared and data["kv"] == STATIC and length:
            mask = np.zeros((c.batch, length), np.int64)
            mask[:, :c.past + c.tokens] = 1
        if c.pad:  # the last row's padding; its positions count its own tokens, as both clients send them
            mask = np.ones((c.batch, c.past + c.tokens), np.int64)
            mask[-1, slice(0, c.pad) if c.side == "left" else slice(c.past - c.pad, c.past)] = 0
            positions = np.arange(c.past, c.past + c.tokens)[None].repeat(c.batch, axis=0)
            positions[-1] -= c.pad
        try:
            outs = dict(zip(dspec.outputs, session.run(dspec.outputs, step_feeds(dspec, ids, c.past, past, mask=mask,
                                                                                   positions=positions))))
        except Exception as exc:  # noqa: BLE001 - a call that raises is a result
            made.append(" ".join(str(exc).split())[:400] or type(exc).__name__)
            continue
        kept: dict[str, np.ndarray] = {}
        for name, value in outs.items():
            if name.startswith(PRESENT_PREFIX) and value.ndim == 4:
                # a padded row's cache rows are where its kernel puts them (GroupQueryAttention: by its own count,
                # the rest of the row uninitialised): the unpadded rows' cache, every row's logits are compared
                value = value[:-1] if c.pad else value
                kept[name] = value[:, :, c.past:c.past + c.tokens]
                fed = past.get(PAST_PREFIX + name[len(PRESENT_PREFIX):]) if past and c.past else None
                moved = 0.0 if fed is None else float(np.abs(value[:, :, :c.past].astype(np.float64)
                                                              - fed[:len(value), :, :c.past].astype(np.float64)).max())
                kept[name + PAST_MOVED] = np.array([moved])
            else:
                kept[name] = value[:, -1:] if c.tokens > GRID_MAX and value.ndim >= 2 and \
                    value.shape[1] == c.tokens else value
        made.append(kept)
    return [_pack(made)]


def _pack(made: list[dict[str, np.ndarray] | str]) -> dict[str, np.ndarray]:
    """The calls' outputs as a few arrays (thousands of calls travel from the run's process as one): ``values``
    (every kept array raveled, float32, in call then name order), ``offsets`` ``[calls, names + 1]`` (where each
    starts; a call that raised is empty), ``names``, and ``errors`` (per call, ``""`` or why it raised)."""
    names = sorted({n for m in made if isinstance(m, dict) for n in m})
    chunks: list[np.ndarray] = []
    offsets = np.zeros((len(made), len(names) + 1), np.int64)
    at = 0
    for k, m in enumerate(made):
        for j, n in enumerate(names):
            offsets[k, j] = at
            if isinstance(m, dict) and n in m:
                chunk = np.asarray(m[n], np.float32).ravel()
                chunks.append(chunk)
                at += chunk.size
        offsets[k, len(names)] = at
    return {"values": np.concatenate(chunks) if chunks else np.zeros(0, np.float32), "offsets": offsets,
            "names": np.array(names, dtype=str),
            "errors": np.array([m if isinstance(m, str) else "" for m in made], dtype=str)}


def compare(ev: Evidence) -> list[Comparison]:
    """The rewritten graph's CPU run against the original's (here, else on the second runtime), call by call."""
    calls, note = grid(ev.plan)
    if not calls:
        return []
    ev.notes.append(note)
    rew = ev.by.get(RunKey(REWRITTEN, "cpu"))
    ref = ev.original("cpu")
    if rew is None:
        return []
    tolerance = ev.plan.tolerance
    if ref is not None and not ref.key.elsewhere:
        tolerance = cpu_tolerance(tolerance)
    c = Comparison(rew.label, ref.label if ref is not None else str(RunKey(ORIGINAL, "cpu")), tolerance, True,
                   kind=NAME)
    got, want = rew.parts.get(NAME), ref.parts.get(NAME) if ref is not None else None
    if ref is None or not ran(rew) or not got or not want:
        why = rew.part_errors.get(NAME) or (ref is not None and ref.part_errors.get(NAME)) or "a run did not make them"
        c.status, c.reason = "skipped", f"the call grid did not run: {why}"
        return [c]
    offset = concat_offset(ev.orig, ev.rew)
    keep = np.array([offset is None or call.past + call.tokens <= offset for call in calls])
    skipped = _diffs(c, calls, got[0], want[0], keep)
    notes = [f"{int(keep.sum())} calls"]
    if offset is not None:
        notes.append(f"calls ending by the LongRoPE offset {offset} only (the CPU EP has no "
                     "multiRotaryCacheConcatOffset)")
    if skipped:
        notes.append(f"{ref.label} raised on {len(skipped)} call(s), not compared; the first: {skipped[0]}")
    return [c.settle(notes, "no call to compare")]


def _diffs(c: Comparison, calls: list[GridCall], a: dict[str, np.ndarray], b: dict[str, np.ndarray],
           keep: np.ndarray) -> list[str]:
    """Fill ``c`` (every call of ``keep``, every output, element-wise at once): the failing calls' diffs (the first
    :data:`KEEP_FAILURES`) and the worst per output; returns the calls the reference could not make."""
    names = [str(n) for n in b["names"]]
    a_names = [str(n) for n in a["names"]]
    a_err, b_err = [str(e) for e in a["errors"]], [str(e) for e in b["errors"]]
    skipped = [f"{call.describe()}: {b_err[k]}" for k, call in enumerate(calls) if keep[k] and b_err[k]]
    diffs: list[OutputDiff] = []
    segments: list[tuple[int, str, int, int, int, int]] = []  # call, name, a start, a end, b start, b end
    for k in range(len(calls)):
        if k >= len(b_err) or not keep[k] or b_err[k]:
            continue
        if k >= len(a_err) or a_err[k]:
            diffs.append(OutputDiff.failed(k, f"{c.actual} raised: {a_err[k] if k < len(a_err) else 'not run'}"))
            continue
        for j, n in enumerate(names):
            b0, b1 = int(b["offsets"][k, j]), int(b["offsets"][k, j + 1])
            i = a_names.index(n) if n in a_names else -1
            a0, a1 = (int(a["offsets"][k, i]), int(a["offsets"][k, i + 1])) if i >= 0 else (0, 0)
            if b1 == b0:
                continue
            if i < 0:
                diffs.append(OutputDiff.failed(k, "output missing from this run", n))
            elif a1 - a0 != b1 - b0:
                diffs.append(OutputDiff.failed(k, f"{a1 - a0} values, the reference {b1 - b0}", n))
            else:
                segments.append((k, n, a0, a1, b0, b1))
    if segments:
        x, y = a["values"], b["values"]
        if any(s[2] != s[4] for s in segments):  # laid out differently (another output set): gather both alike
            x = np.concatenate([x[s[2]:s[3]] for s in segments])
            y = np.concatenate([y[s[4]:s[5]] for s in segments])
            starts = np.cumsum([0] + [s[3] - s[2] for s in segments[:-1]])
        else:  # the same layout: compared where they lie, every element at once
            starts = np.array([s[2] for s in segments])
        ends = starts + np.array([s[3] - s[2] for s in segments])
        x, y = np.append(x, np.float32(0)), np.append(y, np.float32(0))  # an end may be the last element's
        cuts = np.column_stack([starts, ends]).ravel()  # every other slice (between segments) is dropped
        finite_x, finite_y = np.isfinite(x), np.isfinite(y)
        with np.errstate(invalid="ignore"):
            err = np.where(finite_x & finite_y, np.abs(x - y), np.where(finite_x == finite_y, 0, np.inf))
        scale = np.where(finite_y, np.abs(y), 0)
        bad = (err > c.tolerance.atol + c.tolerance.rtol * scale).view(np.int8)
        seg_abs, seg_scale = np.maximum.reduceat(err, cuts)[::2], np.maximum.reduceat(scale, cuts)[::2]
        seg_bad = np.maximum.reduceat(bad, cuts)[::2]
        for (k, n, *_), m, sc, fail in zip(segments, seg_abs.tolist(), seg_scale.tolist(), seg_bad.tolist()):
            rel = m / sc if sc > 0 else (0.0 if m == 0 else float("inf"))
            diffs.append(OutputDiff(k, n, m, rel, not fail, "" if m != float("inf") else
                                    "non-finite values where the reference has none (or back)"))
    worst: dict[str, OutputDiff] = {}
    failures: list[OutputDiff] = []
    for d in sorted(diffs, key=lambda d: d.step):
        d.schedule = calls[d.step].describe()
        if not d.ok and len(failures) < KEEP_FAILURES:
            failures.append(d)
        cur = worst.get(d.output)
        if cur is None or (cur.ok and not d.ok) or (cur.ok == d.ok and d.max_abs > cur.max_abs):
            worst[d.output] = d
    c.diffs = failures + [d for d in worst.values() if d not in failures]
    return skipped


def failure_line(c: Comparison) -> str | None:
    """``call grid: <the call>: output logits, max abs X (...)`` for the first failing call, or None."""
    d = c.first_failure if c.kind == NAME and c.counts and c.status == "compared" else None
    if d is None:
        return None
    return (f"call grid: {d.schedule}: output {d.output}, max abs {d.max_abs:.3g} ({c.name}, {c.tolerance})"
            + (f"; {d.reason}" if d.reason else ""))


__all__ = ["BATCH_MAX", "GRID_MAX", "NAME", "SAMPLE", "STRIDES", "GridCall", "compare", "failure_line", "grid", "parts",
           "plan_calls", "run", "shared_length"]
