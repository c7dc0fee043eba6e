"""Schedules: the calls a caller makes, as data. What ``check`` runs besides its decode and sweep.

A :class:`Schedule` is a batch of token rows and the calls that feed them:

* ``lengths``: each row's prompt length (the batch is ``len(lengths)``); shorter rows are padded to the longest with
  ``pad`` ids, on the ``left`` (as onnxruntime-genai pads a batch: attention mask 0 there, position ids 0 there and
  ``0, 1, 2, ...`` over each row's real tokens) or on the ``right`` (as transformers.js pads: a later call's mask
  has the padding's zeros in the middle, each row's positions count its own tokens);
* the prompt goes in calls of at most ``chunk`` tokens (None: one call; chunked prefill = multi-token calls after a
  past), then ``then``: one call per entry with that many new tokens on every row (1: a decode step; more: a
  multi-token call after a past: chat turns, speculative decoding). Every call after the first continues from the
  previous call's ``present.*``, the mask grows by the call's tokens (ones) and every row's positions go on from its
  own count;
* ``ids``: every row's real token ids, prompt first.

:meth:`Schedule.calls` spells it out call by call (:class:`Call`); :meth:`Schedule.text` is one line that
:func:`parse` reads back (``check --schedule``), so a failure names a schedule that reruns as is.
:func:`default_schedules` is the set every ``check`` runs (docs/checker.md; the clients' in :mod:`.client_schedules`);
:func:`random_schedule` draws one for ``check --budget``, :func:`shrink` makes a differing one smaller.

Only what a caller reads is compared (:func:`.evidence.schedules.compare_calls`): the real tokens' rows and the real
cache rows of ``present.*`` below the tokens so far; padding and rows past the sequence are read by no one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from rope_passes.errors import UsageError

LEFT, RIGHT = "left", "right"
#: a schedule's KV layout (:mod:`.client_schedules`): growing tensors, genai's shared max_length buffers with a
#: growing mask, the same with a max_length mask of ones then zeros (its capture loop's)
PLAIN, SHARED, STATIC = "plain", "shared", "static"
#: the longest prompt a default schedule sends in one call to pass a switch or window (longer: the sweep stands in)
LONG_PROMPT_MAX = 512
#: a one-token prompt then single steps to this many positions (to the context's end where the sweep takes every
#: position, :attr:`GraphFacts.decode_to`): every position below it is read by a decode step after a real past
DENSE_DECODE = 64
EVERY_ID_MAX, EVERY_ID_ROWS = 4096, 256  # vocabularies up to MAX get ``every-id`` (each id once, in ROWS rows)


@dataclasses.dataclass(frozen=True)
class Call:
    """One call of a schedule: ``tokens`` new tokens on each of ``batch`` rows after ``past`` cached ones."""

    index: int
    past: int
    ids: np.ndarray  # [B, S] int64 (pad ids at padding)
    mask: np.ndarray  # [B, past + S] int64
    positions: np.ndarray  # [B, S] int64
    real: np.ndarray  # [B, past + S] bool: the real tokens (the mask as bools)

    @property
    def batch(self) -> int:
        return int(self.ids.shape[0])

    @property
    def tokens(self) -> int:
        return int(self.ids.shape[1])

    @property
    def lengths(self) -> list[int]:
        """Real tokens of each row in this call."""
        return [int(n) for n in self.real[:, self.past:].sum(axis=1)]

    def to_dict(self) -> dict[str, Any]:
        return {"call": self.index, "batch": self.batch, "past": self.past, "tokens": self.tokens,
                "lengths": self.lengths, "ids": self.ids.tolist(), "positions": self.positions.tolist()}


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A batch of rows and the calls that feed them (see the module docstring)."""

    name: str
    lengths: tuple[int, ...]
    ids: tuple[tuple[int, ...], ...]  # per row: its prompt, then one id per continuation token
    padding: str = LEFT
    chunk: int | None = None  # prompt tokens per call (None: the whole prompt in one call)
    then: tuple[int, ...] = ()  # new tokens of each call after the prompt
    pad: int = 0
    kv: str = PLAIN  # PLAIN | SHARED | STATIC: the buffers' layout (batch 1)
    max_length: int | None = None  # SHARED / STATIC: the buffers' length
    ahead: int = 0  # the positions run this far ahead of the cache (a caller that sends position_ids)
    earlier: int = 0  # SHARED / STATIC: the buffers still hold this many rows of an earlier conversation (genai)

    def __post_init__(self) -> None:
        if not self.lengths or min(self.lengths) < 1:
            raise UsageError(f"schedule {self.name}: every row needs a prompt of at least one token")
        if self.padding not in (LEFT, RIGHT):
            raise UsageError(f"schedule {self.name}: padding is left or right, not {self.padding!r}")
        if self.chunk is not None and self.chunk < 1 or any(n < 1 for n in self.then):
            raise UsageError(f"schedule {self.name}: every call takes at least one token")
        more = sum(self.then)
        if len(self.ids) != len(self.lengths) or any(len(r) != n + more for r, n in zip(self.ids, self.lengths)):
            raise UsageError(f"schedule {self.name}: each row needs its prompt's ids and {more} more")
        if self.kv not in (PLAIN, SHARED, STATIC) or (self.kv != PLAIN and (
                self.batch != 1 or not self.max_length or self.width + sum(self.then) > self.max_length)):
            raise UsageError(f"schedule {self.name}: kv {self.kv} takes one row of at most max_length tokens")
        if self.earlier and (self.kv == PLAIN or self.earlier > (self.max_length or 0)):
            raise UsageError(f"schedule {self.name}: an earlier conversation needs shared buffers it fits in")

    @property
    def batch(self) -> int:
        return len(self.lengths)

    @property
    def width(self) -> int:
        """Columns of the padded prompt."""
        return max(self.lengths)

    @property
    def call_sizes(self) -> list[int]:
        w, c = self.width, self.chunk or self.width
        return [min(c, w - s) for s in range(0, w, c)] + list(self.then)

    @property
    def longest_call(self) -> int:
        return max(self.call_sizes)

    @property
    def size(self) -> tuple[int, int, int]:
        """What :func:`shrink` makes smaller: (rows, tokens fed, calls)."""
        return self.batch, self.batch * sum(self.call_sizes), len(self.call_sizes)

    def matrix(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids ``[B, T]``, real ``[B, T]`` bool, positions ``[B, T]``) over all ``T`` columns of all calls."""
        w, more = self.width, sum(self.then)
        ids = np.full((self.batch, w + more), self.pad, np.int64)
        real = np.zeros((self.batch, w + more), bool)
        for b, (n, row) in enumerate(zip(self.lengths, self.ids)):
            start = w - n if self.padding == LEFT else 0
            ids[b, start:start + n] = row[:n]
            real[b, start:start + n] = True
            ids[b, w:] = row[n:]
            real[b, w:] = True
        positions = np.where(real, np.cumsum(real, axis=1) - 1 + self.ahead, 0).astype(np.int64)  # genai: 0 at pad
        return ids, real, positions

    def calls(self) -> Iterator[Call]:
        ids, real, positions = self.matrix()
        start = 0
        for k, n in enumerate(self.call_sizes):
            end = start + n
            yield Call(k, start, ids[:, start:end], real[:, :end].astype(np.int64), positions[:, start:end],
                       real[:, :end])
            start = end

    def text(self) -> str:
        """One line :func:`parse` reads back: ``left rows 7,1,4 chunk 8 then 1+3 pad 0 ids 5.9.1/.../...``."""
        parts = [self.padding, "rows", ",".join(map(str, self.lengths))]
        if self.chunk is not None and self.chunk < self.width:
            parts += ["chunk", str(self.chunk)]
        if self.then:
            parts += ["then", "+".join(f"{n}*{k}" if k > 1 else str(n)
                                       for n, k in ((n, len(list(g))) for n, g in itertools.groupby(self.then)))]
        if self.kv != PLAIN:
            parts += ["kv", self.kv, str(self.max_length)] + (["earlier", str(self.earlier)] if self.earlier else [])
        if self.ahead:
            parts += ["ahead", str(self.ahead)]
        parts += ["pad", str(self.pad), "ids", "/".join(".".join(map(str, r)) for r in self.ids)]
        return " ".join(parts)

    def summary(self) -> str:
        """In words, without the ids."""
        each = (f"rows of {', '.join(map(str, self.lengths))}" if len(set(self.lengths)) > 1 or self.batch < 4
                else f"{self.batch} rows of {self.lengths[0]}")
        rows = (f"batch {self.batch}, {each} prompt tokens"
                + (f" {self.padding}-padded to {self.width}" if len(set(self.lengths)) > 1 else ""))
        starts = np.cumsum([0, *self.call_sizes])
        calls = [f"{n}" + (f" after {p}" if p else "") for n, p in zip(self.call_sizes, starts)]
        how = (f"; {self.kv} KV buffers of {self.max_length}" if self.kv != PLAIN else "") + (
            f" still holding {self.earlier} rows of an earlier conversation" if self.earlier else "") + (
            f"; positions {self.ahead} ahead of the cache" if self.ahead else "")
        if len(calls) > 6:
            calls = calls[:3] + [f"... ({len(calls) - 5} more)"] + calls[-2:]
        return f"{self.name}: {rows}; calls of {', '.join(calls)} tokens{how}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "summary": self.summary(), "text": self.text(), "batch": self.batch,
                "lengths": list(self.lengths), "padding": self.padding, "pad": self.pad,
                "ids": [list(r) for r in self.ids], "calls": [c.to_dict() for c in self.calls()]}

    def spec(self) -> dict[str, Any]:
        """What a run needs (JSON): :func:`from_spec` makes it back."""
        return {"name": self.name, "lengths": list(self.lengths), "ids": [list(r) for r in self.ids],
                "padding": self.padding, "chunk": self.chunk, "then": list(self.then), "pad": self.pad,
                "kv": self.kv, "max_length": self.max_length, "ahead": self.ahead, "earlier": self.earlier}


def from_spec(data: dict[str, Any]) -> Schedule:
    return Schedule(data["name"], tuple(data["lengths"]), tuple(tuple(r) for r in data["ids"]), data["padding"],
                    data["chunk"], tuple(data["then"]), data["pad"], data.get("kv", PLAIN), data.get("max_length"),
                    data.get("ahead", 0), data.get("earlier", 0))


_TEXT = re.compile(r"\s*(?P<padding>left|right)\s+rows\s+(?P<rows>\d+(?:,\d+)*)(?:\s+chunk\s+(?P<chunk>\d+))?"
                   r"(?:\s+then\s+(?P<then>\d+(?:\*\d+)?(?:\+\d+(?:\*\d+)?)*))?"
                   r"(?:\s+kv\s+(?P<kv>shared|static)\s+(?P<max>\d+)(?:\s+earlier\s+(?P<earlier>\d+))?)?"
                   r"(?:\s+ahead\s+(?P<ahead>\d+))?(?:\s+pad\s+(?P<pad>\d+))?\s+ids\s+(?P<ids>[\d./]+)\s*")


def _calls(text: str | None) -> tuple[int, ...]:
    """``1*3+4`` -> ``(1, 1, 1, 4)`` (a run of equal calls as ``n*count``)."""
    out: list[int] = []
    for part in (text or "").split("+") if text else ():
        n, _, k = part.partition("*")
        out += [int(n)] * int(k or 1)
    return tuple(out)


def parse(text: str, name: str = "given") -> Schedule:
    """The schedule :meth:`Schedule.text` printed (``check --schedule TEXT``)."""
    m = _TEXT.fullmatch(text)
    if m is None:
        raise UsageError(f"--schedule: cannot read {text!r} (e.g. 'left rows 3,1 then 1+2 pad 0 ids "
                         "5.7.9.1.2.3/4.1.2.3')")
    ids = tuple(tuple(int(t) for t in row.split(".") if t) for row in m["ids"].split("/"))
    return Schedule(name, tuple(int(n) for n in m["rows"].split(",")), ids, m["padding"],
                    int(m["chunk"]) if m["chunk"] else None,
                    _calls(m["then"]), int(m["pad"] or 0),
                    m["kv"] or PLAIN, int(m["max"]) if m["max"] else None, int(m["ahead"] or 0), int(m["earlier"] or 0))


# ----------------------------------------------------------------------------------------------------------------
# Which schedules: the default set, random ones, shrinking
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GraphFacts:
    """What the schedules are built from, read from both graphs (:func:`rope_passes.check.core.graph_facts`)."""

    vocab: int  # ids 0..vocab-1 are valid for both graphs
    pad: int = 0  # genai_config's pad_token_id
    switches: tuple[int, ...] = ()  # LongRoPE switches (totals above one read another table)
    windows: tuple[int, ...] = ()  # fixed windows (GroupQueryAttention local_window_size)
    max_call: int | None = None  # the longest call WebGPU computes correctly here (software adapter: 8)
    context: int | None = None  # context_length: no schedule runs past it
    #: why a right-padded batch is not a call these graphs take on WebGPU, or None when it is: a GroupQueryAttention
    #: that rotates inside (do_rotary=1) derives each row's positions from seqlens_k as left padding lays them out
    #: (``seqlens_k + 1 - S + s`` on WebGPU), which is how onnxruntime-genai pads; the CPU EP still runs it
    #: (:func:`runs_on`)
    no_right_padding: str | None = None
    max_length: int | None = None  # onnxruntime-genai's shared KV buffers' length (analysis.genai_contract.GenaiLoop), or None
    static_mask: bool = False  # a graph takes the capture loop's max_length mask of ones then zeros
    takes_positions: bool = False  # a graph rotates by the position_ids its caller sends (analysis.genai_contract)
    ends: tuple[int, ...] = ()  # the context's end and a table's last row before it (no total past the context)
    same_kernels: bool = False  # same attention kernels: batch 1 runs every call on WebGPU (.models.attention_layout)
    decode_to: int = DENSE_DECODE  # long-decode's last total

    def long_prompt(self) -> tuple[int, str]:
        """A prompt length longer than every window and past every switch, and why (capped at LONG_PROMPT_MAX and
        the context)."""
        need = [(3 * (self.max_call or 8) + 1, f"3 calls of the {self.max_call or 8}-token prefill cap, plus one")]
        need += [(w + 2, f"local window {w}") for w in self.windows]
        need += [(c + 4, f"LongRoPE switch {c}") for c in self.switches]
        cap = min(LONG_PROMPT_MAX, (self.context or LONG_PROMPT_MAX + 8) - 8)
        fits = [(n, why) for n, why in need if n <= cap]
        return max(fits) if fits else (min(cap, need[0][0]), need[0][1])


def _edge_ids(vocab: int) -> list[int]:
    """The lowest and the highest ids (special tokens sit at the low ones)."""
    return sorted({0, 1, 2, 3, vocab - 1, vocab - 2, vocab - 3} & set(range(vocab)))


def _draw(rng: np.random.RandomState, vocab: int, n: int) -> tuple[int, ...]:
    """``n`` ids across the whole vocabulary, a fifth of them at its two ends."""
    ids = rng.randint(0, vocab, size=n)
    edges = np.array(_edge_ids(vocab))
    at_edges = rng.random_sample(n) < 0.2
    ids[at_edges] = edges[rng.randint(0, len(edges), size=int(at_edges.sum()))]
    return tuple(int(i) for i in ids)


def default_schedules(facts: GraphFacts, seed: int = 0) -> list[Schedule]:
    """The schedules every ``check`` runs (module docstring); a WebGPU run takes those whose calls fit
    ``facts.max_call`` (:func:`fits`), a CPU run all of them (the chunked long prompt: a chunked prefill, calls of
    8 tokens after a past, is a CPU schedule on a software adapter)."""
    rng = np.random.RandomState(seed)
    v, pad = facts.vocab, facts.pad
    short = min(7, facts.max_call or 7)
    edges = _edge_ids(v)
    out = [
        Schedule("vocabulary-edges", (len(edges) + 1,), (tuple(edges) + _draw(rng, v, 3),), then=(1, 1), pad=pad,
                 chunk=facts.max_call if facts.max_call is not None and facts.max_call <= len(edges) else None),
        Schedule("one-token-prompt", (1,), ((v - 1,) + _draw(rng, v, 6),), then=(1, 3, 2), pad=pad),
        Schedule("left-padded-batch", (short, 1, max(1, short - 3)),
                 tuple(_draw(rng, v, n + 2) for n in (short, 1, max(1, short - 3))), LEFT, then=(1, 1), pad=pad),
    ]
    out.append(Schedule("right-padded-batch", (short, max(1, short - 2)),  # not on WebGPU everywhere: runs_on
                        tuple(_draw(rng, v, n) for n in (short, max(1, short - 2))), RIGHT, pad=pad))
    out.append(Schedule("two-rows", (short, short), tuple(_draw(rng, v, short + 2) for _ in range(2)), LEFT,
                        then=(1, 1), pad=pad))
    steps = facts.decode_to - 1
    if facts.context is not None:
        steps = max(1, min(steps, facts.context - 1))
    out.append(Schedule("long-decode", (1,), (_draw(rng, v, 1 + steps),), then=(1,) * steps, pad=pad))
    if v <= EVERY_ID_MAX:
        out.append(every_id(v, pad))
    n, _ = facts.long_prompt()
    ids = (_draw(rng, v, n + 3),)
    out.append(Schedule("long-prompt", (n,), ids, then=(1, 2), pad=pad))
    out.append(Schedule("long-prompt-chunked", (n,), ids, chunk=min(facts.max_call or 8, 8), then=(1, 2), pad=pad))
    if facts.context is not None:
        out = [s for s in out if s.width + sum(s.then) <= facts.context]
    return out


def every_id(vocab: int, pad: int = 0) -> Schedule:
    """Every token id (at least once): ``min(vocab, EVERY_ID_ROWS)`` rows of a one-token prompt, then single-token calls, row
    ``b`` reading ids ``b, b + rows, b + 2 rows, ...`` (single tokens: a WebGPU schedule on any adapter)."""
    rows = min(vocab, EVERY_ID_ROWS)
    calls = -(-vocab // rows)
    ids = tuple(tuple((b + k * rows) % vocab for k in range(calls)) for b in range(rows))
    return Schedule("every-id", (1,) * rows, ids, LEFT, then=(1,) * (calls - 1), pad=pad)


def runs_on(schedule: Schedule, ep: str, facts: GraphFacts | None) -> bool:
    """Whether a run on ``ep`` makes ``schedule``: on WebGPU, calls that fit its cap (:func:`fits`), and no
    right-padded batch of rows of different lengths where a GroupQueryAttention rotates inside
    (``facts.no_right_padding``: WebGPU places such a row's tokens as left padding lays them out). The CPU EP makes
    every schedule: its GroupQueryAttention reads a right-padded prompt as it is laid out (each row as it computes
    it alone), so a rewrite that moves positions of right-padded rows is a difference there."""
    if ep != "webgpu":
        return True
    if facts is not None and facts.no_right_padding is not None and schedule.padding == RIGHT \
            and len(set(schedule.lengths)) > 1:
        return False
    return fits(schedule, None if facts is None or (facts.same_kernels and schedule.batch == 1) else facts.max_call)


def fits(schedule: Schedule, max_call: int | None) -> bool:
    """Whether WebGPU computes every call of ``schedule`` correctly on an adapter whose GroupQueryAttention is right
    up to ``max_call`` tokens (None: any): single-token calls anywhere, a call of several tokens only while its past
    and its tokens together are at most ``max_call``. Measured on lavapipe (onnxruntime-webgpu 1.27,
    ``current/llama/cpu_fp32``, a 24-token prompt in chunks of 2, 4, 7 or 8): every chunk equals the CPU EP's while
    the total is at most 8, every later one is 0.12-0.44 off."""
    if max_call is None:
        return True
    start = 0
    for n in schedule.call_sizes:
        if n > 1 and start + n > max_call:
            return False
        start += n
    return True


def random_schedule(rng: np.random.RandomState, facts: GraphFacts, name: str = "random") -> Schedule:
    """A schedule drawn for ``check --budget``: batch 1..4, left or right padding, prompts from 1 token to past the
    long prompt, up to four calls after it, ids across the vocabulary; with batch 1 the prompt chunked or not and
    calls of several tokens after it (GroupQueryAttention refuses those for a batch: onnxruntime-genai sends them
    for batch 1 only)."""
    batch = 1 if rng.random_sample() < 0.4 else int(rng.randint(2, 5))
    long_n, _ = facts.long_prompt()
    kind = rng.random_sample()
    top = 8 if kind < 0.5 else (32 if kind < 0.8 else max(long_n, 9))
    lengths = tuple(int(rng.randint(1, top + 1)) for _ in range(batch))
    right = rng.random_sample() < 0.25
    padding = RIGHT if batch > 1 and right and facts.no_right_padding is None else LEFT
    then: tuple[int, ...] = ()
    if padding == LEFT or len(set(lengths)) == 1:  # GroupQueryAttention: several tokens after a past, batch 1 only
        then = tuple(1 if batch > 1 or rng.random_sample() < 0.6 else int(rng.randint(2, 7))
                     for _ in range(int(rng.randint(0, 5))))
    chunk = None
    if batch == 1 and rng.random_sample() < 0.5:
        chunk = int(rng.randint(1, (facts.max_call or 8) + 1))
    if facts.context is not None:  # stay inside the table
        room = facts.context - max(lengths)
        while then and sum(then) > room:
            then = then[:-1]
    ids = tuple(_draw(rng, facts.vocab, n + sum(then)) for n in lengths)
    return Schedule(name, lengths, ids, padding, chunk, then, facts.pad)


def _replace(s: Schedule, **kw: Any) -> Schedule | None:
    with contextlib.suppress(UsageError):
        return dataclasses.replace(s, **kw)
    return None


def _smaller(s: Schedule) -> Iterator[Schedule]:
    """Candidates one step smaller than ``s``, the biggest cuts first."""
    more = sum(s.then)
    if s.batch > 1:
        for b in range(s.batch):  # one row alone, then the batch without one row
            yield from filter(None, [_replace(s, lengths=(s.lengths[b],), ids=(s.ids[b],))])
        for b in range(s.batch):
            keep = [i for i in range(s.batch) if i != b]
            yield from filter(None, [_replace(s, lengths=tuple(s.lengths[i] for i in keep),
                                              ids=tuple(s.ids[i] for i in keep))])
    if s.then:  # fewer calls after the prompt, then fewer tokens in one
        for k in range(len(s.then)):
            cut = sum(s.then[:k])
            yield from filter(None, [_replace(s, then=s.then[:k] + s.then[k + 1:],
                                              ids=tuple(r[:n + cut] + r[n + cut + s.then[k]:]
                                                        for r, n in zip(s.ids, s.lengths)))])
        for k, m in enumerate(s.then):
            if m > 1:
                cut = sum(s.then[:k + 1]) - 1
                yield from filter(None, [_replace(s, then=s.then[:k] + (m - 1,) + s.then[k + 1:],
                                                  ids=tuple(r[:n + cut] + r[n + cut + 1:]
                                                            for r, n in zip(s.ids, s.lengths)))])
    if s.then and s.padding == LEFT:  # the same tokens, all in the prompt: fewer calls
        yield from filter(None, [_replace(s, lengths=tuple(n + more for n in s.lengths), then=())])
    for b, n in enumerate(s.lengths):  # shorter prompts: halves, then one token off either end
        if n == 1:
            continue
        h = n // 2
        for lo, hi in ((0, h), (h, n), (1, n), (0, n - 1)):
            lengths = s.lengths[:b] + (hi - lo,) + s.lengths[b + 1:]
            row = s.ids[b][lo:hi] + s.ids[b][n:n + more]
            yield from filter(None, [_replace(s, lengths=lengths, ids=s.ids[:b] + (row,) + s.ids[b + 1:])])
    if s.chunk is not None and s.chunk < s.width:
        yield from filter(None, [_replace(s, chunk=None)])


def shrink(schedule: Schedule, differs: Callable[[Schedule], bool], max_tries: int = 400
           ) -> tuple[Schedule, int]:
    """The smallest schedule reached from ``schedule`` by cuts (:func:`_smaller`) that ``differs`` still holds for
    (greedy: the first smaller candidate that differs is taken, until none does); and the number of tries."""
    tries = 0
    current = schedule
    progress = True
    while progress and tries < max_tries:
        progress = False
        for cand in _smaller(current):
            if cand.size >= current.size and cand.chunk == current.chunk:
                continue
            tries += 1
            if differs(cand):
                current, progress = dataclasses.replace(cand, name=schedule.name + "-shrunk"), True
                break
            if tries >= max_tries:
                break
    return current, tries


__all__ = ["LEFT", "LONG_PROMPT_MAX", "RIGHT", "Call", "GraphFacts", "Schedule", "default_schedules", "every_id", "fits",
           "from_spec", "parse", "random_schedule", "runs_on", "shrink"]
