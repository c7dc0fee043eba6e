"""The session-wide LongRoPE offset, proved: which GroupQueryAttention nodes read ``multiRotaryCacheConcatOffset``, and
whether the tables they read are ``[short; long]`` pairs split at one row.

``multiRotaryCacheConcatOffset`` is one value for the whole session. onnxruntime's WebGPU EP holds it as a provider
option (``WebGpuExecutionProviderConfig``) and every GroupQueryAttention of the session reads it
(``context.MultiRotaryCacheConcatOffset()``) on its packed-QKV rotary paths (``SplitPackedQKVWithRotaryEmbedding``
and the flash-attention split/rotary/copy-KV program): row ``(total > offset ? offset : 0) + position`` of *its own*
cos/sin cache. The separate-Q/K/V rotary path (``FusedQKRotaryEmbedding``) and ``do_rotary=0`` never read it.

* :func:`offset_consumers`: those nodes, in every graph of the model (subgraphs run in the same session);
* :func:`fit_frequencies` / :func:`fit_pair`: is a table two RoPE tables split at a row (or one plain RoPE table)?
* :func:`session_concat`: one offset proved for every consumer of a graph that carries concatenated tables, or a
  ``MatchFailure`` naming the consumer that breaks it; :func:`no_layer_honours` reads its failure as "plain RoPE
  everywhere: a configured offset is stale" (``annotate-cache-offset`` and lint RP208/RP209 read it);
  ``longrope-concat`` proves its ``If`` switches with :func:`rope_passes.analysis.longrope_switch.switch_offset` and the
  session with :func:`offset_consumers`;
* :func:`packable`: can a GQA's separate Q/K/V be packed exactly (the offset acts on packed QKV only)?

Reading a model here never changes it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

import rope_passes.graph_walk as graph_walk
from rope_passes.analysis.graph import MS_DOMAIN, attr, flag, nodes_of
from rope_passes.analysis.longrope import ConcatCache, separate_qkv
from rope_passes.config import CONCAT_OFFSET_OPTION
from rope_passes.proofs.cache_tables import cache_table
from rope_passes.proofs.mask_lengths import MaskLengths
from rope_passes.report import MatchFailure, Place, name_of, place_of

# ------------------------------------------------------------------------------------------------------------
# The length the offset switches on
# ------------------------------------------------------------------------------------------------------------


def switch_reads_row_lengths(model: ir.Model, gqas: list[ir.Node], mask_names: frozenset[str] | set[str]) -> ir.Value:
    """Refuse unless, for every unpadded row, the total an ``If`` switch reads is the length WebGPU's offset switches on.

    The ``If`` switches on the ``total_sequence_length`` its GroupQueryAttention nodes read (what
    :func:`rope_passes.analysis.longrope_switch.switch_offset` proves the condition a function of). onnxruntime's WebGPU
    kernels switch each row on its own ``seqlens_k[b] + 1`` (``split_packed_qkv_with_rotary_embedding.wgsl``:
    ``total_seqlen = seqlens[b] + 1``). The two are one number for every row of ones exactly when the total is the
    attention mask's width and ``seqlens_k`` its row sums - 1, both proved by value
    (:class:`rope_passes.proofs.mask_lengths.MaskLengths`). A total of width + 1, or row sums - 2, switches the
    ``If`` one token away from the offset: refused, naming the GroupQueryAttention input that is not proved.
    Returns the mask (the graph input every proved length reads).
    """
    lengths = MaskLengths(model, mask_names)
    mask = None
    for gqa in gqas:
        total = gqa.inputs[6] if len(gqa.inputs) > 6 else None
        seqlens = gqa.inputs[5] if len(gqa.inputs) > 5 else None
        why = "the If switches on total_sequence_length, onnxruntime's WebGPU offset on each row's seqlens_k + 1"
        if total is None or seqlens is None:
            raise MatchFailure.refuse(f"{why}; {consumer_name(gqa)} lacks one of them", gqa)
        try:
            width, rows = lengths.total(total), lengths.seqlens(seqlens)
        except MatchFailure as failure:
            raise MatchFailure.refuse(f"{why}, and they are not proved equal: {failure.reason}",
                                      failure.source if failure.source is not None else gqa) from None
        if width.mask is not rows.mask or (mask is not None and mask is not rows.mask):
            other = rows.mask if width.mask is not rows.mask else mask
            raise MatchFailure.refuse(f"{why}, and {consumer_name(gqa)} reads them from two masks "
                                      f"({width.mask.name!r}, {other.name!r})", gqa)
        mask = rows.mask
    if mask is None:
        raise MatchFailure.refuse("no GroupQueryAttention reads the switch", gqas[0] if gqas else "<model>")
    return mask


def width_test(model: ir.Model, mask_names: frozenset[str] | set[str]) -> Callable[[ir.Value], bool]:
    """Whether a value is the attention mask's width, by value (:meth:`MaskLengths.total`: through any node forms and
    model-local functions): the leaves an ``If`` condition may read as the total
    (:func:`rope_passes.analysis.longrope_switch.switch_offset`'s ``is_total``), sound together with
    :func:`switch_reads_row_lengths`, which proves every GroupQueryAttention's total is that width."""
    lengths = MaskLengths(model, mask_names)

    def is_width(value: ir.Value) -> bool:
        try:
            lengths.total(value)
        except MatchFailure:
            return False
        return True

    return is_width


def selects_whole_tables(model: ir.Model, where: ir.Node, rank: int) -> None:
    """Refuse unless the ``Where`` ``where`` picks one of two tables of ``rank`` whole: its condition is one element
    of rank at most ``rank`` (proved by the walk of :class:`MaskLengths`, whatever computes it), so the output is
    exactly the table it picks, as an ``If`` returns one branch's."""
    cond = where.inputs[0]
    shape = MaskLengths(model).shape(cond) if cond is not None else None
    if shape is None or len(shape) > rank or any(d != 1 for d in shape):
        raise MatchFailure.refuse(f"the condition {name_of(cond)!r} of Where {where.name!r} is not proved one element (shape "
                                  f"{'unknown' if shape is None else list(shape)}): it may select rows or broadcast "
                                  "the tables, not pick one whole table", where)


# ------------------------------------------------------------------------------------------------------------
# Packing separate Q/K/V (the offset acts on packed QKV only)
# ------------------------------------------------------------------------------------------------------------


def packable(gqa: ir.Node, target: Place = None) -> None:
    """Refuse (``MatchFailure``, target ``target`` or the GQA) when a GQA with separate Q/K/V cannot be packed
    exactly into one ``Concat(q, k, v, axis=-1)`` input (GroupQueryAttention splits a packed query back into
    ``num_heads``, ``kv_num_heads``, ``kv_num_heads`` heads of one head size)."""
    if not separate_qkv(gqa):
        return
    place = target if target is not None else gqa
    q, k, v = (gqa.inputs[i] if len(gqa.inputs) > i else None for i in range(3))
    if q is None or k is None or v is None:
        raise MatchFailure.refuse(f"{gqa.name}: only one of key/value is given; cannot pack Q/K/V", place)
    for value in (q, k, v):
        if value.shape is not None and len(value.shape) != 3:
            raise MatchFailure.refuse(f"{gqa.name}: {value.name!r} has rank {len(value.shape)}, expected [batch, "
                                      "seq, hidden] to pack Q/K/V", place)
    if len({value.dtype for value in (q, k, v)}) != 1:
        raise MatchFailure.refuse(f"{gqa.name}: query/key/value dtypes differ; cannot pack Q/K/V", place)
    widths = [value.shape[2] if value.shape is not None else None for value in (q, k, v)]
    heads = (attr(gqa, "num_heads"), attr(gqa, "kv_num_heads"), attr(gqa, "kv_num_heads"))
    known = all(isinstance(w, int) for w in widths) and all(isinstance(h, int) and h > 0 for h in heads)
    if known and (widths[1] != widths[2] or widths[0] * heads[1] != widths[1] * heads[0]):
        raise MatchFailure.refuse(f"{gqa.name}: query/key/value widths {widths} are not num_heads/kv_num_heads "
                                  f"{heads[0]}/{heads[1]} heads of one head size; cannot pack Q/K/V", place)


# ------------------------------------------------------------------------------------------------------------
# Is a table two RoPE tables? The fit of each half
# ------------------------------------------------------------------------------------------------------------

#: worst row error of a fitted table: float16 rounds values ~1.3 (LongRoPE scaling) to 1e-3 steps; float32 to ~1e-7
ROW_TOLERANCE = {ir.DataType.FLOAT16: 2e-3, ir.DataType.FLOAT: 1e-4}
#: builders compute the angle ``p * w`` in float32 (``torch.outer(t, inv_freq)``): the product and ``w`` itself are
#: rounded, so a row's angle is off by up to ``|p * w| * 2**-23`` (4e-3 rad at position 131072); allowed twice that
ANGLE_REL = 2.0**-22
#: rows per step of the fit: two passes over ~3 MB pieces instead of a dozen table-sized temporaries (a 131072-row
#: table's float64 temporaries are 50 MB each, paid in page faults on every call)
FIT_CHUNK = 8192


@dataclasses.dataclass(frozen=True)
class Fit:
    """Per-column angular frequencies of one half and how well every row fits them."""

    w: np.ndarray
    error: float  # worst |scale * cos(p * w) - row| over rows and columns
    excess: float  # worst error / allowed error (<= 1: every row fits)
    row: int  # the row (within the half) of the worst excess


def fit_frequencies(cos: np.ndarray, sin: np.ndarray, rows: range, tolerance: float) -> Fit:
    """Per-column angular frequency of a cos/sin table over ``rows`` (first row = position 0), and the worst error
    of ``scale * cos(p * w)`` / ``scale * sin(p * w)`` against the table (scale = row 0, the attention scaling),
    allowed ``tolerance`` (the dtype's rounding) plus the float32 rounding of the angle ``p * w`` (ANGLE_REL).

    ``w`` is the least-squares slope through 0 of the unwrapped phase ``atan2(sin, cos)``; unwrapping adds the
    multiple of 2π that brings each step within (-π, π], exact for RoPE, whose per-row step ``w`` is at most 1."""
    n = len(rows)
    if n == 0:
        return Fit(w=np.zeros(cos.shape[1]), error=0.0, excess=0.0, row=0)
    scale = cos[rows.start].astype(np.float64)
    # three [FIT_CHUNK, columns] buffers, reused by every step of both passes (ufuncs with out=): the arithmetic is
    # the plain formulas' in the same order (the same bits), without a fresh temporary per step (page faults)
    a, b, c = (np.empty((min(FIT_CHUNK, n), cos.shape[1])) for _ in range(3))
    two_pi = 2 * np.pi
    # pass 1: sum(p * phase) over the unwrapped phase, carried from piece to piece
    moment = np.zeros(cos.shape[1])
    last = None
    for lo in range(0, n, FIT_CHUNK):
        hi = min(lo + FIT_CHUNK, n)
        k = hi - lo
        sin64, cos64, phase = a[:k], b[:k], c[:k]
        np.copyto(sin64, sin[rows.start + lo : rows.start + hi])
        np.copyto(cos64, cos[rows.start + lo : rows.start + hi])
        np.arctan2(sin64, cos64, out=phase)  # phase = atan2(sin, cos)
        prev = phase[0].copy() if last is None else last
        step, turns = sin64, cos64  # step = diff(phase, prepend=prev)
        np.subtract(phase[:1], prev[None, :], out=step[:1])
        np.subtract(phase[1:], phase[:-1], out=step[1:])
        np.divide(step, two_pi, out=turns)  # step -= 2π * round(step / 2π)
        np.rint(turns, out=turns)
        np.multiply(two_pi, turns, out=turns)
        np.subtract(step, turns, out=step)
        np.cumsum(step, axis=0, out=turns)  # phase = prev + cumsum(step)
        np.add(prev[None, :], turns, out=phase)
        last = phase[-1].copy()
        moment += np.arange(lo, hi, dtype=np.float64) @ phase
    w = moment / max(float((n - 1) * n * (2 * n - 1) / 6), 1.0)  # sum of p*p over 0..n-1
    # pass 2: every row against scale * cos/sin(p * w)
    error = excess = 0.0
    row = 0
    abs_scale = np.abs(scale)
    for lo in range(0, n, FIT_CHUNK):
        hi = min(lo + FIT_CHUNK, n)
        k = hi - lo
        angle, allowed, off = a[:k], b[:k], c[:k]
        np.multiply(np.arange(lo, hi, dtype=np.float64)[:, None], w, out=angle)  # angle = p * w
        np.abs(angle, out=allowed)  # allowed = tolerance + |scale| * |angle| * ANGLE_REL
        np.multiply(abs_scale, allowed, out=allowed)
        np.multiply(allowed, ANGLE_REL, out=allowed)
        np.add(tolerance, allowed, out=allowed)
        np.sin(angle, out=off)  # |scale * sin(angle) - sin row|
        np.multiply(scale, off, out=off)
        np.subtract(off, sin[rows.start + lo : rows.start + hi], out=off)
        np.abs(off, out=off)
        np.cos(angle, out=angle)  # |scale * cos(angle) - cos row|
        np.multiply(scale, angle, out=angle)
        np.subtract(angle, cos[rows.start + lo : rows.start + hi], out=angle)
        np.abs(angle, out=angle)
        err = np.maximum(angle, off, out=angle)
        ratio = np.divide(err, allowed, out=off)
        at = int(np.argmax(ratio))
        error = max(error, float(err.max()))
        if ratio.flat[at] > excess:
            excess, row = float(ratio.flat[at]), lo + at // ratio.shape[1]
    return Fit(w=w, error=error, excess=excess, row=row)


@dataclasses.dataclass(frozen=True)
class PairFit:
    """A concatenated table proved to be a ``[short; long]`` RoPE pair split at ``offset``."""

    short_error: float
    long_error: float


def fit_pair(found: ConcatCache) -> PairFit:
    """Prove the rows of ``found`` are two RoPE tables split at ``found.offset``, with different factors:
    ``MatchFailure.refuse`` (target: the cos table) otherwise. The refusal carries ``details["plain"]`` when the
    whole table is one RoPE table from row 0 (plain RoPE: row ``offset + p`` is position ``offset + p``, so reading
    it at an offset is wrong); halves that restart at position 0 with the same factors are not plain (they need the
    offset as much as a LongRoPE pair does)."""
    target = found.cos
    cos_t, sin_t = cache_table(found.cos), cache_table(found.sin)
    if cos_t is None or sin_t is None:
        raise MatchFailure.refuse("cos/sin are not constant tables: which rows a layer reads is not known", target)
    tolerance = ROW_TOLERANCE.get(ir.DataType.from_numpy(cos_t.dtype), 2e-3)
    short = fit_frequencies(cos_t, sin_t, range(found.offset), tolerance)
    long = fit_frequencies(cos_t, sin_t, range(found.offset, found.rows), tolerance)

    def plain() -> bool:
        return fit_frequencies(cos_t, sin_t, range(found.rows), tolerance).excess <= 1.0

    for half, fit, first in (("short", short, 0), ("long", long, found.offset)):
        if fit.excess > 1.0:
            if plain():
                raise MatchFailure.refuse(f"the {found.rows} rows are one RoPE table from row 0 (plain RoPE), not "
                                          f"two tables split at {found.offset}", target, plain=True)
            raise MatchFailure.refuse(f"rows do not fit a short+long RoPE pair: {half} half, row "
                                      f"{first + fit.row} is off by {fit.excess:.1f}x the allowed error "
                                      f"({tolerance:g} + float32 angle rounding)", target)
    if np.allclose(short.w, long.w, rtol=1e-3, atol=0):
        raise MatchFailure.refuse("short and long halves use the same factors: not LongRoPE", target)
    return PairFit(short.error, long.error)


# ------------------------------------------------------------------------------------------------------------
# The session: every GroupQueryAttention the offset acts on
# ------------------------------------------------------------------------------------------------------------


def rotary_gqas(model: ir.Model) -> list[ir.Node]:
    """Every GroupQueryAttention (all graphs) with ``do_rotary=1`` and a cos_cache input: the ones that read a table."""
    return [n for n in nodes_of(model, "GroupQueryAttention", MS_DOMAIN)
            if flag(n, "do_rotary") and len(n.inputs) > 8 and n.inputs[7] is not None]


def hidden_attention(model: ir.Model) -> str | None:
    """The name of a model-local function that holds a GroupQueryAttention (in its body or a subgraph of it), or
    None: onnxruntime inlines functions, so such a node is a consumer of the session's offset that the graph walk
    does not see."""
    for function in model.functions.values():
        for node in graph_walk.nodes(function):  # type: ignore[arg-type]  # a Function iterates its nodes
            if node.op_type == "GroupQueryAttention" and node.domain == MS_DOMAIN:
                return f"{function.domain}::{function.name}"
    return None


def offset_consumers(model: ir.Model) -> list[ir.Node]:
    """The GroupQueryAttention nodes onnxruntime's WebGPU EP applies ``multiRotaryCacheConcatOffset`` to: do_rotary=1
    with packed QKV (key and value inputs empty) and a cos_cache, in every graph of the model. Each reads row
    ``(total > offset ? offset : 0) + position`` of its own cos/sin cache once the offset is set."""
    return [g for g in rotary_gqas(model) if not separate_qkv(g)]


def consumer_name(gqa: ir.Node) -> str:
    return place_of(gqa)


@dataclasses.dataclass
class SessionConcat:
    """One offset proved for every GroupQueryAttention of the session that reads it."""

    offset: int
    tables: list[ConcatCache]  # each distinct [short; long] pair read, all split at ``offset``
    fits: list[PairFit]  # the fit of each (empty when not fitted)
    consumers: list[ir.Node]  # every GQA the offset acts on once ``to_pack`` is packed

    @property
    def to_pack(self) -> list[ir.Node]:
        """Readers with separate Q/K/V: they ignore the offset until packed."""
        return [g for t in self.tables for g in t.ignoring_offset]


def _pair_cache(model: ir.Model, gqas: list[ir.Node], *, context_length: int | None,
                offset: int | None) -> ConcatCache:
    """The cos/sin pair ``gqas`` all read, as a concatenated ``[short; long]`` cache (structure only: the rows are
    ``offset + context_length``; ``offset`` defaults to the rows past the context). ``MatchFailure.absent`` when it
    is not one (``refuse`` when neither length is known)."""
    gqa = gqas[0]
    cos, sin = gqa.inputs[7], gqa.inputs[8]
    name = (cos.name if cos is not None else None) or "cos_cache"
    fed = [v.name for v in (cos, sin) if v is not None and v.is_graph_input()]
    if fed:  # the caller may feed a concatenation: whether an offset is honoured is the caller's to say
        raise MatchFailure.absent(f"{fed[0]!r} is a graph input: the caller chooses the table", name, caller_table=True)
    cos_t = cache_table(cos)
    if cos_t is None or cos_t.ndim != 2 or cos_t.shape[0] < 2:
        producer = cos.producer() if cos is not None else None
        if cos_t is None and producer is not None and producer.op_type in ("If", "Where"):
            # a LongRoPE switch's output: each branch is a table read from row 0 (what longrope-concat replaces)
            raise MatchFailure.absent(f"cos_cache {name!r} is the output of {producer.op_type} "
                                      f"{name_of(producer)!r}, not one constant table", name)
        # not knowing the table proves nothing about it: a refusal keeps a configured offset as it is
        raise MatchFailure.refuse(f"cos_cache {name!r} is not a constant table the proof can read", name)
    rows = cos_t.shape[0]
    original = offset if offset is not None else rows - (context_length or 0)
    if offset is None and (context_length is None or original <= 1):
        # genai_config's context_length cannot split the table (none, or past the table: mobius-onnx writes 4096
        # over a [128; 512] cache): a second table starts where a row past 0 is position 0 again (sin 0 everywhere)
        restart = _restart_row(sin)
        if restart is not None:
            original, context_length = restart, rows - restart
    if context_length is None and offset is None:
        raise MatchFailure.refuse("no context_length in genai_config.json to split the cache by", name)
    if offset is not None and context_length is not None and rows != offset + context_length and rows > offset > 1:
        # genai_config's numbers do not add up to the table (a context_length past the table, an
        # original_max_position_embeddings edited): the rows decide (fit_pair), never the metadata
        context_length = rows - offset
    if rows <= original or original <= 1 or (context_length is not None and rows != original + context_length):
        split = "original" if offset is None else str(offset)
        raise MatchFailure.absent(f"cos_cache {name!r} has {rows} rows, not {split} + context {context_length} "
                                  "(not a concatenated cache)", name)
    sin_t = cache_table(sin)
    if sin is None or sin_t is None or sin_t.shape != cos_t.shape:
        raise MatchFailure.refuse(f"sin_cache of {consumer_name(gqa)!r} is not a constant table shaped like "
                                  "cos_cache", name)
    return ConcatCache(gqa, cos, sin, rows, original, context_length, list(gqas))


def _restart_row(sin: ir.Value | None) -> int | None:
    """The one row past row 0 of a constant sin table that is zero in every column (a table that starts again at
    position 0: the long half of a [short; long] concatenation), or None (none, or several). The fit then proves
    the halves (:func:`fit_pair`)."""
    value = cache_table(sin)
    if value is None or value.ndim != 2:
        return None
    table = np.abs(value.astype(np.float32))
    zero = np.flatnonzero(table.max(axis=1) == 0)
    zero = zero[zero > 1]
    return int(zero[0]) if len(zero) == 1 else None


def session_concat(model: ir.Model, *, context_length: int | None, offset: int | None = None,
                   fit: bool = True) -> SessionConcat:
    """Prove one ``multiRotaryCacheConcatOffset`` for the whole session, or fail naming the node that breaks it.

    Every distinct cos/sin pair read by a GroupQueryAttention with do_rotary=1 is read as a concatenated cache
    (:func:`_pair_cache`, then :func:`fit_pair` with ``fit``). Then:

    * no pair is concatenated: ``MatchFailure.absent`` (plain RoPE; nothing to write), or the refusal of a table
      with the rows of a concatenation that is one RoPE table from row 0 (``details["plain"]``: plain RoPE too);
    * a pair looks concatenated but its rows are not two RoPE tables: ``refuse`` (target: the table);
    * an offset consumer (:func:`offset_consumers`) reads a pair that is not concatenated: ``refuse`` naming it
      (the offset would make it read row ``offset + position`` of a plain table past ``offset`` tokens);
    * the concatenated pairs split at different rows: ``refuse`` naming a reader of the second split.

    GQAs with separate Q/K/V reading a plain table are not consumers (WebGPU reads row ``position`` there); those
    reading a concatenated table are (:attr:`SessionConcat.to_pack`: they must be packed to read it at the offset).
    """
    hidden = hidden_attention(model)
    if hidden is not None:
        raise MatchFailure.refuse(
            f"model-local function {hidden!r} holds a GroupQueryAttention: onnxruntime inlines it and WebGPU applies "
            f"{CONCAT_OFFSET_OPTION} to it too, and what it reads is not proved here", hidden, breaks_session=True)
    by_pair: dict[tuple[int, int], list[ir.Node]] = {}
    for gqa in rotary_gqas(model):
        sin = gqa.inputs[8] if len(gqa.inputs) > 8 else None
        by_pair.setdefault((id(gqa.inputs[7]), id(sin)), []).append(gqa)
    if not by_pair:
        raise MatchFailure.absent("no GroupQueryAttention with do_rotary=1 and a cos_cache")
    concat: list[ConcatCache] = []
    fits: list[PairFit] = []
    plain: list[tuple[list[ir.Node], MatchFailure]] = []
    for gqas in by_pair.values():
        try:
            found = _pair_cache(model, gqas, context_length=context_length, offset=offset)
            if fit:
                fits.append(fit_pair(found))
            concat.append(found)
        except MatchFailure as not_concat:
            if not_concat.refused and not not_concat.details.get("plain"):
                raise
            plain.append((gqas, not_concat))
    if not concat:  # a caller-fed table first: it says "unknown", not "plain"
        raise next((f for _, f in plain if f.details.get("caller_table")), plain[0][1])
    first = concat[0]
    for gqas, why in plain:
        for gqa in gqas:
            if not separate_qkv(gqa):
                raise MatchFailure.refuse(
                    f"{consumer_name(gqa)!r} reads a cos/sin cache that is not a concatenated [short; long] table "
                    f"({why.reason}), while {consumer_name(first.gqa)!r} reads {first.cos.name!r} split at "
                    f"{first.offset}: {CONCAT_OFFSET_OPTION} is one value for the whole session and WebGPU applies it "
                    "to every packed-QKV GroupQueryAttention with do_rotary=1, so this one would read row "
                    f"{first.offset} + position past {first.offset} tokens", consumer_name(gqa), breaks_session=True)
    for other in concat[1:]:
        if other.offset != first.offset:
            raise MatchFailure.refuse(
                f"{consumer_name(other.gqa)!r} reads {other.cos.name!r} split at {other.offset}, "
                f"{consumer_name(first.gqa)!r} reads {first.cos.name!r} split at {first.offset}: one "
                f"{CONCAT_OFFSET_OPTION} for the session cannot serve both", consumer_name(other.gqa),
                breaks_session=True)
    consumers = [g for found in concat for g in found.readers]
    return SessionConcat(first.offset, concat, fits, consumers)


def no_layer_honours(failure: MatchFailure) -> bool:
    """Whether :func:`session_concat`'s ``failure`` means no GroupQueryAttention reads a concatenated cache (plain
    tables, If outputs, no rotary GQA), so that a configured offset can only be wrong: absent (but not for a table the
    caller feeds), or a table with a concatenation's rows that is one RoPE table from row 0."""
    if failure.details.get("caller_table"):
        return False
    return not failure.refused or bool(failure.details.get("plain"))
