"""The cos/sin rows every position reads, taken from a graph: the rotation-level view ``check`` compares
(:mod:`rope_passes.analysis.table_diff`).

A *site* is one rotation: the q or the k input of one attention node. What it reads is a function of the token's
position ``p`` and of the total sequence length ``T`` (LongRoPE switches tables on ``T``): per *regime* (a range of
``T``), position ``p`` reads row ``offset + p`` of a ``[rows, rotary_dim/2]`` cos and sin table. Positions are text
positions (contiguous; the three mRoPE axes equal), which is what a decoder is fed. Forms read:

* GroupQueryAttention ``do_rotary=1``: ``cos_cache``/``sin_cache`` (inputs 7/8) as constants, an
  ``If(Greater(T, C))`` between constants (regimes ``T <= C`` and ``T > C``), or a concatenated ``[short; long]``
  table read at ``multiRotaryCacheConcatOffset`` (WebGPU with packed QKV only: row = ``(T > offset ? offset : 0) +
  p``; the CPU EP and separate Q/K/V inputs ignore the option, and the rows are read as they are);
* GroupQueryAttention ``do_rotary=0`` whose q/k come from a rotary op (through Cast/Reshape/Transpose):
  ``MRotaryEmbedding`` with equal axes (every column reads row ``p`` of its caches, times ``scale``),
  ``RotaryEmbedding`` reading constant caches at the graph's positions (row ``p``), or per-token tables
  (``RotaryEmbedding(x, token_index, cos[tokens], sin[tokens])``: the builder's spelled-out mRoPE, ``lower-mrope``'s
  output), evaluated on onnxruntime CPU for positions ``0..max-1`` on all three axes;
* anything else with a ``position_ids`` input (rotations spelled out as Mul/Add, exporter graphs): the *position
  cone*: every float value computed from ``position_ids`` and constants alone that the rest of the graph reads,
  evaluated for positions ``0..max-1`` (once per regime of a LongRoPE ``Where`` switch), one row per position.

A graph none of these reads gives :class:`GraphTables` with ``unavailable`` set (the comparison is then skipped).

A site's layer is :func:`rope_passes.analysis.layers.layer_of` (its name, else its position among the attention
nodes); the position input is :func:`rope_passes.analysis.positions.position_input` under genai_config's name. What
evaluates (a constant cone, a subgraph on onnxruntime CPU) is handed in as :class:`Evaluators`: analysis opens no
session (``check`` passes :func:`rope_passes.proofs.constants.table` and
:func:`rope_passes.runtime.evaluate.evaluate_subgraph`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.caches import SwitchedHead, switched_head
from rope_passes.analysis.graph import (
    MS_DOMAIN,
    ancestors,
    attr,
    const_array,
    const_tensor,
    flag,
    iter_nodes,
    table_like,
    through,
)
from rope_passes.analysis.layers import layer_of
from rope_passes.analysis.longrope import find_longrope, if_switch
from rope_passes.analysis.ops import ROTARY_OPS, present
from rope_passes.analysis.positions import position_input, position_source
from rope_passes.config import GenaiConfig
from rope_passes.report import MatchFailure

#: ops walked through from an attention q/k input up to the rotary op that produced it
_ADAPTERS = ("Cast", "Reshape", "Transpose", "Identity", "Squeeze", "Unsqueeze")


@dataclasses.dataclass
class Regime:
    """Totals ``first..last`` (``last`` None: up to the table's end) read position ``p`` at row ``offset + p``."""

    first: int
    last: int | None
    cos: np.ndarray  # [rows, width] in the table's own dtype
    sin: np.ndarray
    offset: int
    cos_at: str  # which tensor, e.g. "'cos_cache' (GroupQueryAttention input 7)"
    sin_at: str

    def at(self, table: str) -> str:
        return self.cos_at if table == "cos" else self.sin_at

    @property
    def covers(self) -> int:
        """The largest total this table can serve (rows past the offset)."""
        return self.cos.shape[0] - self.offset


@dataclasses.dataclass
class SiteRows:
    """The rows one rotation reads: the q or k input of one attention node (the rotation sites of
    :mod:`rope_passes.analysis.rotation_sites`, seen from the attention node), or one table of the position cone."""

    key: str  # "layer 0 q", or "position table 0" for the position cone
    source: ir.Node | ir.Value  # the node that rotates (the cone: the value evaluated)
    form: str
    regimes: list[Regime]
    interleaved: bool | None = None  # pairing (None: unknown, the position cone)
    dtype: str = "float32"  # the table's precision

    @property
    def width(self) -> int:
        return int(self.regimes[0].cos.shape[1])

    @property
    def covers(self) -> int:
        return self.regimes[-1].covers if self.regimes[-1].last is None else self.regimes[-1].last

    def regime(self, total: int) -> Regime:
        return next(r for r in self.regimes if r.first <= total and (r.last is None or total <= r.last))


@dataclasses.dataclass
class GraphTables:
    """Every rotation site of one graph, or why none could be read."""

    sites: list[SiteRows] = dataclasses.field(default_factory=list)
    unavailable: str = ""
    semantics: list[str] = dataclasses.field(default_factory=list)  # how rows were resolved, one line each
    kind: str = "rotations"  # "rotations" (attention sites) or "position cone"

    @property
    def switches(self) -> list[int]:
        """Totals after which some site changes table (LongRoPE)."""
        return sorted({r.first - 1 for s in self.sites for r in s.regimes if r.first > 1})

    @property
    def covers(self) -> int | None:
        return min((s.covers for s in self.sites), default=None)


RunSubgraph = Callable[[ir.Model, list, list, list], list]
#: a table input's value, or None when it is not a constant
ReadTable = Callable[[Any], "np.ndarray | None"]


@dataclasses.dataclass(frozen=True)
class Evaluators:
    """What reads values for the tables: ``table(value)`` a table input's value, stored or computed from constants
    (``Mul(cos, 1.01)``, ``Add(cos, delta)``), or None (:func:`rope_passes.proofs.constants.table`, so such a table is
    compared as a stored one); ``subgraph(model, inputs, outputs, feeds)`` runs a cone
    (:func:`rope_passes.runtime.evaluate.evaluate_subgraph`)."""

    table: ReadTable
    subgraph: RunSubgraph


def _dtype_name(array: np.ndarray) -> str:
    return str(array.dtype)


# ------------------------------------------------------------------------------------------------ GroupQueryAttention


def _gqa_regimes(model: ir.Model, node: ir.Node, offset: int | None, ep: str, notes: list[str],
                 ev: Evaluators) -> list[Regime]:
    cos_v, sin_v = node.inputs[7], node.inputs[8]
    cos, sin = ev.table(cos_v), ev.table(sin_v)
    where = (f"{cos_v.name!r} (GroupQueryAttention input 7)", f"{sin_v.name!r} (GroupQueryAttention input 8)")
    if cos is not None and sin is not None:
        packed = not present(node.inputs[1]) and not present(node.inputs[2])
        if offset and ep == "webgpu" and packed:
            line = (f"multiRotaryCacheConcatOffset={offset}: row = (total > {offset} ? {offset} : 0) + position "
                    "(WebGPU, packed QKV)")
            if line not in notes:
                notes.append(line)
            return [Regime(1, offset, cos, sin, 0, *where), Regime(offset + 1, None, cos, sin, offset, *where)]
        if offset:
            why = "the CPU EP has no such option" if ep != "webgpu" else "onnxruntime applies it to packed QKV only"
            line = f"multiRotaryCacheConcatOffset={offset} is ignored here ({why}): row = position"
            if line not in notes:
                notes.append(line)
        return [Regime(1, None, cos, sin, 0, *where)]
    switched = switched_head(cos_v), switched_head(sin_v)
    if switched[0] is not None and switched[1] is not None:
        return _switched_regimes(node, switched[0], switched[1], offset, ep, notes, ev)
    source = through(cos_v, ("Identity",))
    producer = source.producer() if source is not None else None
    if producer is None or producer.op_type != "If":
        what = "a graph input" if producer is None else f"{producer.op_type} {producer.name!r}"
        raise MatchFailure.absent(f"{node.name!r}: cos_cache comes from {what}, not a constant or a LongRoPE If")
    switch = if_switch(model, producer)
    if switch.threshold is None:
        raise MatchFailure.absent(f"If {producer.name!r}: its condition is not Greater(total, constant)")
    tables = {}
    # then_tables is the side read past the threshold (the If's else-branch where the condition is Not(total > c))
    above, below = ("else", "then") if switch.negated else ("then", "else")
    for branch, outs in ((above, switch.then_tables), (below, switch.else_tables)):
        picked, names = [], []
        for v in (cos_v, sin_v):
            index = next((i for i, o in enumerate(producer.outputs) if o is through(v, ("Identity",))), len(outs))
            picked.append(ev.table(outs[index]) if index < len(outs) else None)
            names.append(f"{outs[index].name!r} ({branch} branch of If {producer.name!r})" if index < len(outs)
                         else "?")
        if picked[0] is None or picked[1] is None:
            raise MatchFailure.absent(f"If {producer.name!r}: the {branch} branch does not return constant tables")
        tables[branch] = (picked, names)
    c = switch.threshold
    line = f"{switch.switch}: totals <= {c} read the {below} branch, longer ones the {above} branch"
    if line not in notes:
        notes.append(line)
    (e_cos, e_sin), e_where = tables[below]
    (t_cos, t_sin), t_where = tables[above]
    return [Regime(1, c, e_cos, e_sin, 0, *e_where), Regime(c + 1, None, t_cos, t_sin, 0, *t_where)]


def _switched_regimes(node: ir.Node, cos: SwitchedHead, sin: SwitchedHead, offset: int | None, ep: str,
                      notes: list[str], ev: Evaluators) -> list[Regime]:
    """``longrope-concat``'s batch switch (:class:`~rope_passes.analysis.caches.SwitchedHead`) read by a call of one
    row: its head is the short table's up to total ``o`` and the long table's after it; WebGPU with the offset (packed
    QKV) reads ``long`` past ``o``, a runtime without it row ``p`` of ``[long head; long]``."""
    tables = {name: [ev.table(v) for v in (c, s)] for name, c, s in (
        ("long_head", cos.head_long, sin.head_long), ("short_head", cos.head_short, sin.head_short),
        ("long", cos.long, sin.long))}
    if any(t is None for pair in tables.values() for t in pair) or cos.offset != sin.offset:
        raise MatchFailure.absent(f"{node.name!r}: the batch switch's tables are not constants of one split")
    o = cos.offset
    short = [np.concatenate([h, rest]) for h, rest in zip(tables["short_head"], tables["long"])]
    long = [np.concatenate([h, rest]) for h, rest in zip(tables["long_head"], tables["long"])]
    where = (f"{cos.concat.outputs[0].name!r} (GroupQueryAttention input 7, head switched at {o})",
             f"{sin.concat.outputs[0].name!r} (GroupQueryAttention input 8, head switched at {o})")
    packed = not present(node.inputs[1]) and not present(node.inputs[2])
    if offset and ep == "webgpu" and packed:
        line = (f"multiRotaryCacheConcatOffset={offset}: row = (total > {offset} ? {offset} : 0) + position of a "
                f"head switched at {o} (WebGPU, packed QKV)")
        if line not in notes:
            notes.append(line)
        return [Regime(1, o, short[0], short[1], 0, *where), Regime(o + 1, None, long[0], long[1], offset, *where)]
    return [Regime(1, o, short[0], short[1], 0, *where), Regime(o + 1, None, long[0], long[1], 0, *where)]


# ------------------------------------------------------------------------------------------------ rotary ops


def _rotary_above(value: ir.Value) -> ir.Node | None:
    v = value
    while v is not None:
        producer = v.producer()
        if producer is None:
            return None
        if producer.op_type in ROTARY_OPS and producer.domain == MS_DOMAIN:
            return producer
        if producer.op_type not in _ADAPTERS or not producer.inputs:
            return None
        v = producer.inputs[0]
    return None


def _is_token_index(value: ir.Value | None) -> bool:
    """``Reshape(Range(0, n, 1), [B, S])`` (through Casts): token (b, s) reads row ``b*S + s`` of per-token tables."""
    node = through(value, ("Cast",)).producer() if value is not None else None
    if node is None or node.op_type != "Reshape":
        return False
    rng = through(node.inputs[0], ("Cast",)).producer()
    if rng is None or rng.op_type != "Range":
        return False
    start, delta = const_array(rng.inputs[0]), const_array(rng.inputs[2])
    return start is not None and delta is not None and int(start) == 0 and int(delta) == 1


def _per_token(model: ir.Model, rot: ir.Node, max_positions: int | None,
               evaluate: RunSubgraph) -> tuple[np.ndarray, np.ndarray]:
    """``RotaryEmbedding(x, token_index, cos[tokens], sin[tokens])``: the per-token tables for positions
    ``0..n-1`` on all three axes, evaluated (``n``: the rows of the tables they gather from, else
    ``max_positions``)."""
    if not _is_token_index(rot.inputs[1]):
        raise MatchFailure.absent(f"{rot.name!r}: position_ids is neither a graph input nor the token index")
    cos_v, sin_v = rot.inputs[2], rot.inputs[3]
    cut = position_source([cos_v, sin_v]).three_axis
    rows = [t.shape[0] for n in ancestors([cos_v, sin_v]) if n.op_type == "Gather"
            and table_like(t := const_tensor(n.inputs[0])) and isinstance(t.shape[0], int)]
    count = min(rows) if rows else max_positions
    if not count:
        raise MatchFailure.absent(f"{rot.name!r}: per-token tables computed from inv_freq, and no context_length")
    positions = np.tile(np.arange(count, dtype=cut.dtype.numpy())[None, None], (3, 1, 1))
    cos, sin = evaluate(model, [cut], [cos_v, sin_v], [positions])
    cos, sin = np.asarray(cos).reshape(count, -1), np.asarray(sin).reshape(count, -1)
    return cos.astype(np.float32), sin.astype(np.float32)


def _rotary_regimes(model: ir.Model, rot: ir.Node, max_positions: int | None, ev: Evaluators,
                    memo: dict) -> tuple[list[Regime], str]:
    cos_v, sin_v = rot.inputs[2], rot.inputs[3]
    key = (id(cos_v), id(sin_v), rot.op_type)
    if key in memo:
        return memo[key]
    cos, sin = ev.table(cos_v), ev.table(sin_v)
    where = (f"{cos_v.name!r} ({rot.op_type} input 2)", f"{sin_v.name!r} ({rot.op_type} input 3)")
    if rot.op_type == "MRotaryEmbedding":
        if cos is None or sin is None:
            raise MatchFailure.absent(f"{rot.name!r}: cos_cache/sin_cache are not constants")
        position_source([rot.inputs[1]])  # the positions are the graph's (equal axes when fed text positions)
        scale = float(attr(rot, "scale", 1.0))
        if scale != 1.0:
            cos = (cos.astype(np.float32) * np.float32(scale)).astype(cos.dtype)
            sin = (sin.astype(np.float32) * np.float32(scale)).astype(sin.dtype)
        form = f"MRotaryEmbedding (sections {list(attr(rot, 'mrope_section') or [])}, equal axes: row = position)"
        out = ([Regime(1, None, cos, sin, 0, *where)], form)
    elif cos is not None and sin is not None:
        pos = through(rot.inputs[1])
        if pos is None or not pos.is_graph_input():
            raise MatchFailure.absent(f"{rot.name!r}: reads its constant caches at computed positions")
        out = ([Regime(1, None, cos, sin, 0, *where)], "RotaryEmbedding (row = position)")
    else:
        cos, sin = _per_token(model, rot, max_positions, ev.subgraph)
        dtype = cos_v.dtype.numpy() if cos_v.dtype is not None else np.float32
        span = f"evaluated for positions 0..{cos.shape[0] - 1}"
        out = ([Regime(1, None, cos.astype(dtype), sin.astype(dtype), 0,
                       f"{cos_v.name!r} ({rot.op_type} input 2, {span})",
                       f"{sin_v.name!r} ({rot.op_type} input 3, {span})")],
               "RotaryEmbedding with per-token tables (evaluated, equal axes)")
    memo[key] = out
    return out


def _rotation_sites(model: ir.Model, config: GenaiConfig, ep: str, max_positions: int | None,
                    ev: Evaluators, notes: list[str]) -> list[SiteRows]:
    gqas = [n for n in iter_nodes(model) if n.op_type == "GroupQueryAttention" and n.domain == MS_DOMAIN]
    if not gqas:
        raise MatchFailure.absent("no GroupQueryAttention")
    sites: list[SiteRows] = []
    memo: dict = {}
    for index, node in enumerate(gqas):
        layer = layer_of(node, index)
        if flag(node, "do_rotary"):
            regimes = _gqa_regimes(model, node, config.concat_offset, ep, notes, ev)
            interleaved = flag(node, "rotary_interleaved")
            dtype = _dtype_name(regimes[0].cos)
            for which in ("q", "k"):
                sites.append(SiteRows(f"layer {layer} {which}", node, "GroupQueryAttention do_rotary=1",
                                      regimes, interleaved, dtype))
            continue
        for which, index in (("q", 0), ("k", 1)):
            value = node.inputs[index] if index < len(node.inputs) else None
            rot = _rotary_above(value) if present(value) else None
            if rot is None:
                raise MatchFailure.absent(f"{node.name!r} input {index} ({which}) is not rotated by a rotary op")
            regimes, form = _rotary_regimes(model, rot, max_positions, ev, memo)
            sites.append(SiteRows(f"layer {layer} {which}", rot, form, regimes,
                                  flag(rot, "interleaved"), _dtype_name(regimes[0].cos)))
    return sites


# ------------------------------------------------------------------------------------------------ the position cone


def _cone_frontier(model: ir.Model, pos: ir.Value) -> tuple[list[ir.Value], int | None]:
    """Float values computed from ``pos`` and constants alone that other nodes read; the rows of the smallest
    constant table gathered on the way (None: none)."""
    derived, consts = {id(pos)}, set[int]()
    cone: list[ir.Node] = []
    for node in model.graph:
        if any(a.type == ir.AttributeType.GRAPH for a in node.attributes.values()):
            continue
        ins = [v for v in node.inputs if v is not None]
        if all(v.const_value is not None or id(v) in consts for v in ins):
            consts.update(id(o) for o in node.outputs)
            continue
        if all(id(v) in derived or v.const_value is not None or id(v) in consts for v in ins):
            derived.update(id(o) for o in node.outputs)
            cone.append(node)
    in_cone = {id(n) for n in cone}
    outputs = {id(v) for v in model.graph.outputs}
    frontier, rows = [], []
    for node in cone:
        if node.op_type == "Gather" and node.inputs[0] is not None and node.inputs[0].shape is not None \
                and id(node.inputs[0]) not in derived and isinstance(node.inputs[0].shape[0], int):
            rows.append(node.inputs[0].shape[0])
        for out in node.outputs:
            if out.dtype is not None and not out.dtype.is_floating_point():
                continue
            if id(out) in outputs or any(id(user) not in in_cone for user, _ in out.uses()):
                frontier.append(out)
    return frontier, (min(rows) if rows else None)


def _per_position(array: np.ndarray, n: int, name: str) -> np.ndarray:
    axes = [i for i, d in enumerate(array.shape) if d == n]
    if not axes or any(d != 1 for i, d in enumerate(array.shape) if i < axes[0]):
        raise MatchFailure.absent(f"{name!r} has shape {list(array.shape)}: no leading position axis of {n}")
    return np.moveaxis(array, axes[0], 0).reshape(n, -1)


def _cone_sites(model: ir.Model, config: GenaiConfig, limit: int | None, evaluate: RunSubgraph,
                notes: list[str]) -> tuple[list[SiteRows], int | None]:
    pos = position_input(model, config.decoder_inputs.get("position_ids", "position_ids"))
    if pos is None:
        raise MatchFailure.absent("no rotation op and no position_ids input to evaluate a position cone from")
    frontier, rows = _cone_frontier(model, pos)
    if not frontier:
        raise MatchFailure.absent(f"nothing float is computed from {pos.name!r} alone")
    covers = rows
    end = limit or rows or 256
    found = find_longrope(model)
    switch = found.threshold if found is not None and found.kind == "where" else None
    spans = [(1, switch), (switch + 1, None)] if switch and switch < end else [(1, None)]
    if switch:
        notes.append(f"{found.switch}: positions evaluated per regime (totals <= {switch} and above)")
    rank = len(pos.shape) if pos.shape is not None else 2
    dtype = pos.dtype.numpy()
    per_span: list[list[np.ndarray]] = []
    for _first, last in spans:
        n = last if last is not None else end
        p = np.arange(n, dtype=dtype)[None]
        feed = np.tile(p[None], (3, 1, 1)) if rank == 3 else p
        try:
            values = evaluate(model, [pos], frontier, [feed])
        except Exception as exc:  # noqa: BLE001 - onnxruntime's reason is the result
            raise MatchFailure.absent(f"the position cone does not evaluate for {n} positions "
                                      f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})") from None
        keep = [i for i, v in enumerate(values) if np.asarray(v).dtype.kind == "f"]  # untyped values: now known
        frontier, values = [frontier[i] for i in keep], [values[i] for i in keep]
        per_span.append([_per_position(np.asarray(v), n, f.name) for v, f in zip(values, frontier, strict=True)])
    sites: list[SiteRows] = []
    seen: list[bytes] = []
    for i, value in enumerate(frontier):
        digest = b"".join(span[i].tobytes() for span in per_span)
        if digest in seen:
            continue
        seen.append(digest)
        at = f"{value.name!r} evaluated from {pos.name!r}"
        regimes = [Regime(first, last, span[i], span[i], 0, at, at)
                   for (first, last), span in zip(spans, per_span, strict=True)]
        sites.append(SiteRows(f"position table {len(sites)}", value, "position cone", regimes, None,
                          _dtype_name(per_span[0][i])))
    return sites, covers if covers is not None else end


def graph_tables(model: ir.Model, config: GenaiConfig, evaluators: Evaluators, *, ep: str = "webgpu",
                 max_positions: int | None = None) -> GraphTables:
    """The rows each rotation of ``model`` reads per position (see the module docstring).

    ``ep`` decides the concatenated-cache semantics (the offset exists on WebGPU only); ``max_positions`` is how
    many positions to evaluate computed tables for (default: genai_config's context_length, else the rows of the
    tables the graph gathers from, else 256); ``evaluators`` read constant tables and run subgraphs.
    """
    limit = max_positions or config.context_length
    out = GraphTables()
    try:
        out.sites = _rotation_sites(model, config, ep, limit, evaluators, out.semantics)
        return out
    except MatchFailure as exc:
        why = exc.reason
    out.semantics.clear()
    try:
        out.sites, _ = _cone_sites(model, config, limit, evaluators.subgraph, out.semantics)
        out.kind = "position cone"
        out.semantics.insert(0, f"rotation sites not read ({why}): compared the position cone")
    except MatchFailure as exc:
        out.unavailable = f"{why}; {exc.reason}"
    return out


__all__ = ["Evaluators", "GraphTables", "Regime", "SiteRows", "graph_tables"]
