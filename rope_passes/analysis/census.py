"""The RoPE census: read-only facts about how a decoder graph does rotary position embeddings.

:func:`census` walks an onnx_ir model (main graph and subgraphs) and reports, as dataclasses (``to_dict()`` gives JSON):

* the attention op (GroupQueryAttention / MultiHeadAttention / Attention / none): count, ``do_rotary``,
  ``rotary_interleaved``, heads, head size, packed QKV, and where ``total_sequence_length`` comes from;
* the rotary ops (``RotaryEmbedding``, ``MRotaryEmbedding``) with their attributes;
* the cos/sin caches (name, shape, dtype, rows against the context length), LongRoPE pairs and concatenations;
* the RoPE flavours found (:data:`FLAVOURS`), manual mRoPE subgraphs with the sections read from their constants,
  cos/sin computed on the fly from an ``inv_freq`` vector (MatMul, or a broadcasting Mul);
* the position inputs (2D ``[B,S]`` / 3D ``[3,B,S]``), whether a 2D input is tiled to three identical axes in-graph;
* the Shape / If / Range / Loop nodes and which attention or rotary inputs each one feeds.

Weights are never read: cache shapes and dtypes come from the tensor metadata (onnx_ir ``ExternalTensor``s are
lazy). The only tensors read are small constants whose *values* are facts (mRoPE section sizes, h/w masks, a
LongRoPE threshold), each at most :data:`SMALL_TENSOR` elements.

:func:`render` prints a census with rich, readable at a glance.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import MS_DOMAIN, ancestors, attr, const_array, const_tensor, iter_nodes
from rope_passes.config import GenaiConfig

#: The RoPE flavours the census can name, in the order it lists them.
FLAVOURS = (
    "fused-gqa",  # GroupQueryAttention do_rotary=1: the rotation happens inside attention, from cos/sin caches
    "rotary-embedding",  # RotaryEmbedding nodes (com.microsoft or ai.onnx)
    "mrotary-embedding",  # com.microsoft::MRotaryEmbedding nodes (multimodal RoPE as one op)
    "manual-mrope",  # mRoPE spelled out as a subgraph (chunked sections, or cache + h/w masks + Where)
    "inv-freq-matmul",  # cos/sin computed per call: positions MatMul (or broadcast Mul) inv_freq, as exporters emit
    "longrope-if",  # an If node choosing between a short and a long cos/sin cache
    "longrope-concat",  # one cache = concat(short, long), read at an offset (multiRotaryCacheConcatOffset)
    "longrope-where",  # Where(cond, long_inv_freq, short_inv_freq) before an inv_freq product (torch exports)
)

#: Constants read for their values (section sizes, masks, thresholds) have at most this many elements.
SMALL_TENSOR = 256

#: Input slot names per (domain, op_type); the op's schema order.
INPUT_SLOTS: dict[tuple[str, str], tuple[str, ...]] = {
    (MS_DOMAIN, "GroupQueryAttention"): (
        "query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
        "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale", "v_scale",
        # builder 0.18 fuses q/k RMSNorm into GQA (attribute qk_norm_epsilon) and passes the weights here:
        "q_norm_weight", "k_norm_weight",
    ),
    (MS_DOMAIN, "MultiHeadAttention"): (
        "query", "key", "value", "bias", "key_padding_mask", "attention_bias", "past_key", "past_value",
        "past_sequence_length", "cache_indirection",
    ),
    (MS_DOMAIN, "Attention"): (
        "input", "weights", "bias", "mask_index", "past", "attention_bias", "past_sequence_length",
    ),
    ("", "Attention"): ("Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen"),
    (MS_DOMAIN, "RotaryEmbedding"): ("input", "position_ids", "cos_cache", "sin_cache"),
    ("", "RotaryEmbedding"): ("X", "cos_cache", "sin_cache", "position_ids"),
    (MS_DOMAIN, "MRotaryEmbedding"): ("input", "position_ids", "cos_cache", "sin_cache"),
}
ATTENTION_OPS = ("GroupQueryAttention", "MultiHeadAttention", "Attention")
ROTARY_OPS = ("RotaryEmbedding", "MRotaryEmbedding")
DYNAMIC_OPS = ("Shape", "If", "Range", "Loop")
#: Ops that pass a value through unchanged for the purpose of tracing a cache or a hidden size.
_PASS_THROUGH = ("Cast", "Identity", "CastLike")


# ------------------------------------------------------------------------------------------------------------
# The census, as data
# ------------------------------------------------------------------------------------------------------------


class _Dict:
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]


@dataclasses.dataclass
class AttentionGroup(_Dict):
    """Attention nodes sharing op type, attributes and input layout (usually one group for all layers)."""

    op_type: str
    domain: str
    count: int
    nodes: list[str]
    num_heads: int | None
    kv_num_heads: int | None
    head_size: int | None
    head_size_source: str | None  # "graph" (query width / num_heads), "genai_config", or None
    do_rotary: int | None
    rotary_interleaved: int | None
    packed_qkv: bool  # key and value inputs empty: query carries Q, K and V
    num_inputs: int
    inputs: dict[str, str]  # slot name -> value name (first node of the group; empty slots left out)
    attributes: dict[str, Any]
    total_sequence_length: str | None = None  # GQA: how input 6 is computed, e.g. "Shape(attention_mask)"
    total_sequence_length_from_shape: bool | None = None


@dataclasses.dataclass
class RotaryGroup(_Dict):
    """RotaryEmbedding / MRotaryEmbedding nodes of one op type."""

    op_type: str
    domain: str
    count: int
    nodes: list[str]
    num_heads: list[int]  # distinct values (q and k nodes differ)
    interleaved: int | None
    rotary_embedding_dim: int | None
    mrope_section: list[int] | None  # MRotaryEmbedding only
    mrope_layout: int | None  # MRotaryEmbedding only: 0 sectioned (Qwen2.5-VL), 1 interleaved (Qwen3.5)
    attributes: dict[str, Any]  # every attribute shared by all nodes of the group
    position_input: str | None  # value feeding the position_ids slot (first node)
    position_source: str | None  # "graph input position_ids [3,B,S]", "Range (synthetic 0..B*S-1)", ...
    cos_input: str | None
    sin_input: str | None


@dataclasses.dataclass
class CosSinCache(_Dict):
    """A constant cos or sin table that a rotation reads."""

    name: str
    role: str  # "cos" or "sin"
    shape: list[int | str]
    dtype: str
    rows: int | None
    columns: int | None
    source: str  # "initializer", "Constant", "If.then_branch", "If.else_branch"
    variant: str | None  # LongRoPE: "short", "long", "concat (short+long)"; else None
    read_by: list[str]  # op types of the nodes reading it (GroupQueryAttention, MRotaryEmbedding, Gather, ...)
    # "= context_length", "< context_length", "> context_length" ("= context_length + offset 32" for a concatenated
    # LongRoPE table), or None when the context length is unknown
    rows_vs_context: str | None


@dataclasses.dataclass
class LongRope(_Dict):
    """LongRoPE: two caches (short for positions below the original context, long beyond)."""

    kind: str  # "if", "concat" or "where"
    original_max_position: int | None  # the switch point: If/Where threshold, or the concat offset
    short_rows: int | None  # None for "where" (no tables: two inv_freq vectors)
    long_rows: int | None
    switch: str | None  # "If(Greater(total_sequence_length, 32))"; None for concat
    switch_node: str | None  # the If or Where node
    concat_offset: int | None  # genai_config provider option multiRotaryCacheConcatOffset


@dataclasses.dataclass
class ManualMRope(_Dict):
    """mRoPE spelled out as a subgraph feeding RotaryEmbedding (or GQA) cos/sin inputs."""

    variant: str  # "chunked" (Split by sections, chunk i from axis i) or "masked" (h/w masks + Where)
    sections: list[int] | None  # [t, h, w] frequency counts, read from the graph's constants
    layout: int | None  # 0 sectioned, 1 interleaved (MRotaryEmbedding's mrope_layout meaning)
    table_source: str  # "inv_freq MatMul (model.inv_freq [16])" or the cache names
    section_nodes: list[str]  # the Split nodes (chunked) or Where nodes (masked) that carry the sections
    section_constants: list[str]  # the constants the sections were read from (split sizes, h/w masks)
    feeds: list[str]  # rotary/attention nodes whose cos input it computes


@dataclasses.dataclass
class InvFreqMatMul(_Dict):
    """cos/sin computed per call: positions MatMul inv_freq, then Cos and Sin."""

    inv_freq: str  # the constant vector's name
    inv_freq_shape: list[int | str]
    matmuls: list[str]
    cos_nodes: int
    sin_nodes: int
    positions_from: list[str]  # graph inputs / Range nodes the positions come from


@dataclasses.dataclass
class PositionInput(_Dict):
    name: str
    shape: list[int | str] | None
    dtype: str | None
    rank: int | None
    layout: str  # "[B,S]", "[3,B,S]" or "other"
    tiled_to_3d: bool  # a 2D input expanded to 3 identical axes in-graph (so the model is provably text-only)
    tile_node: str | None


@dataclasses.dataclass
class DynamicNode(_Dict):
    """A Shape / If / Range / Loop node and what it feeds."""

    op_type: str
    name: str
    inputs: list[str]
    feeds: list[str]  # "<op_type>.<slot>" of the attention/rotary inputs it reaches; "output" for graph outputs


@dataclasses.dataclass
class GraphInput(_Dict):
    name: str
    shape: list[int | str] | None
    dtype: str | None


@dataclasses.dataclass
class RopeCensus(_Dict):
    source: str | None
    ir_version: int | None
    opsets: dict[str, int]
    node_count: int  # nodes of the main graph
    subgraph_node_count: int  # nodes inside If/Loop/Scan bodies
    inputs: list[GraphInput]
    attention_op: str  # the op type of the attention nodes, "mixed" or "none"
    attention: list[AttentionGroup]
    rotary: list[RotaryGroup]
    flavours: list[str]
    caches: list[CosSinCache]
    context_length: int | None
    context_length_source: str | None  # "genai_config model.context_length" / "genai_config search.max_length"
    longrope: LongRope | None
    manual_mrope: list[ManualMRope]
    inv_freq: list[InvFreqMatMul]
    positions: list[PositionInput]
    dynamic_nodes: dict[str, list[DynamicNode]]  # op type -> nodes; every op of DYNAMIC_OPS present as a key
    notes: list[str]

    @property
    def dynamic_counts(self) -> dict[str, int]:
        return {op: len(nodes) for op, nodes in self.dynamic_nodes.items()}

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["dynamic_counts"] = self.dynamic_counts
        return d


# ------------------------------------------------------------------------------------------------------------
# Small helpers
# ------------------------------------------------------------------------------------------------------------


def _slots(node: ir.Node) -> tuple[str, ...]:
    return INPUT_SLOTS.get((_domain(node), node.op_type), ())


def _domain(node: ir.Node) -> str:
    return "" if node.domain in ("", "ai.onnx") else node.domain


def _slot(node: ir.Node, name: str) -> ir.Value | None:
    slots = _slots(node)
    if name not in slots:
        return None
    i = slots.index(name)
    return node.inputs[i] if i < len(node.inputs) else None


def _slot_name(node: ir.Node, index: int) -> str:
    slots = _slots(node)
    return slots[index] if index < len(slots) else f"input{index}"


def _present(value: ir.Value | None) -> bool:
    return value is not None and bool(value.name or value.producer() is not None)


def _shape_list(shape: ir.Shape | None) -> list[int | str] | None:
    if shape is None:
        return None
    return [d if isinstance(d, int) else (d.value if d.value is not None else "?") for d in shape]


def _dtype_name(dtype: ir.DataType | None) -> str | None:
    return None if dtype is None else dtype.name


def _jsonable(value: Any) -> Any:
    if isinstance(value, ir.TensorProtocol):
        return f"<tensor {_shape_list(value.shape)} {_dtype_name(value.dtype)}>"
    if isinstance(value, (ir.Graph, ir.GraphProtocol)):
        return f"<graph {value.name or ''}>"
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, (int, str, bool)) or value is None:
        return value
    return str(value)


def _attributes(node: ir.Node) -> dict[str, Any]:
    return {k: _jsonable(a.value) for k, a in sorted(node.attributes.items())}


def _small_const(value: ir.Value | None) -> np.ndarray | None:
    """The values of a small constant (at most SMALL_TENSOR elements); None for anything else or large."""
    return const_array(value, max_size=SMALL_TENSOR)


_ancestors = ancestors
_const_tensor = const_tensor


def _through(value: ir.Value | None, ops: tuple[str, ...] = _PASS_THROUGH) -> ir.Value | None:
    """Follow ``value`` up through pass-through ops (Cast, Identity)."""
    while value is not None:
        producer = value.producer()
        if producer is None or producer.op_type not in ops or not producer.inputs:
            return value
        value = producer.inputs[0]
    return value


def _graph_inputs_of(nodes: Iterable[ir.Node], model: ir.Model) -> list[str]:
    graph_inputs = {id(v): v.name for v in model.graph.inputs}
    out = []
    for node in nodes:
        for inp in node.inputs:
            if inp is not None and id(inp) in graph_inputs and graph_inputs[id(inp)] not in out:
                out.append(graph_inputs[id(inp)])
    return out


def _ints(array: np.ndarray | None) -> list[int] | None:
    return None if array is None else [int(x) for x in np.asarray(array).reshape(-1)]


# ------------------------------------------------------------------------------------------------------------
# Attention
# ------------------------------------------------------------------------------------------------------------


def _last_dim(value: ir.Value | None, depth: int = 0) -> int | None:
    """The static width of the last axis of ``value``: its shape, else the producing projection's width."""
    if value is None or depth > 10:
        return None
    if value.shape is not None and len(value.shape) and isinstance(value.shape[-1], int):
        return value.shape[-1]
    producer = value.producer()
    if producer is None:
        return None
    op = producer.op_type
    if op == "MatMul" and len(producer.inputs) > 1:
        w = _const_tensor(producer.inputs[1])
        if w is not None and len(w.shape) >= 2 and isinstance(w.shape[-1], int):
            return w.shape[-1]
    if op == "MatMulNBits":
        return attr(producer, "N")
    if op == "Split":
        index = list(producer.outputs).index(value)
        split = _ints(_small_const(producer.inputs[1])) if len(producer.inputs) > 1 else attr(producer, "split")
        if split is not None and index < len(split):
            return int(split[index])
    if op in ("Add", "Sub", "Mul", "Div"):  # broadcasting: the widest known input
        widths = [w for w in (_last_dim(i, depth + 1) for i in producer.inputs) if w is not None]
        return max(widths) if widths else None
    if op in (*_PASS_THROUGH, "SimplifiedLayerNormalization", "LayerNormalization", *ROTARY_OPS):
        return _last_dim(producer.inputs[0], depth + 1)
    return None


def _total_seq_description(value: ir.Value | None, model: ir.Model) -> tuple[str | None, bool | None]:
    if value is None:
        return None, None
    nodes = _ancestors([value])
    shapes = [n for n in nodes if n.op_type == "Shape"]
    if shapes:
        src = shapes[0].inputs[0]
        return f"Shape({src.name if src is not None else '?'})", True
    order = {id(n): i for i, n in enumerate(model.graph)}
    nodes.sort(key=lambda n: order.get(id(n), -1))
    ops = [n.op_type for n in nodes if n.op_type != "Constant"]
    inputs = _graph_inputs_of(nodes, model)
    chain = " → ".join([*inputs[:1], *ops]) if ops else (value.name or "?")
    return chain, False


def _attention_groups(model: ir.Model, genai_config: GenaiConfig) -> list[AttentionGroup]:
    groups: dict[tuple, list[ir.Node]] = {}
    for node in iter_nodes(model):
        if node.op_type not in ATTENTION_OPS or _domain(node) not in ("", MS_DOMAIN):
            continue
        key = (node.op_type, _domain(node), repr(sorted(_attributes(node).items())), len(node.inputs))
        groups.setdefault(key, []).append(node)
    out = []
    for (op_type, domain, _, n_inputs), nodes in groups.items():
        first = nodes[0]
        heads = attr(first, "num_heads", attr(first, "q_num_heads"))
        kv_heads = attr(first, "kv_num_heads", heads if op_type != "GroupQueryAttention" else None)
        key_in = _slot(first, "key") if (domain, op_type) != ("", "Attention") else first.inputs[1]
        value_in = _slot(first, "value") if (domain, op_type) != ("", "Attention") else first.inputs[2]
        packed = (op_type == "Attention" and domain == MS_DOMAIN) or not (_present(key_in) or _present(value_in))
        head_size, head_source = None, None
        if (domain, op_type) == (MS_DOMAIN, "Attention"):  # hidden states in, weights [hidden, 3*hidden]
            weights = _const_tensor(first.inputs[1]) if len(first.inputs) > 1 else None
            width = weights.shape[-1] if weights is not None and isinstance(weights.shape[-1], int) else None
            per_token_heads = 3 * heads if heads else None
        else:
            width = _last_dim(first.inputs[0])
            per_token_heads = (heads + 2 * (kv_heads or heads) if packed else heads) if heads else None
            query_shape = first.inputs[0].shape if first.inputs and first.inputs[0] is not None else None
            if domain == "" and query_shape is not None and len(query_shape) == 4:  # ONNX Attention [B,N,S,H]
                per_token_heads = 1
        if width is not None and per_token_heads and width % per_token_heads == 0:
            head_size, head_source = width // per_token_heads, "graph"
        if head_size is None and genai_config.decoder.get("head_size"):
            head_size, head_source = int(genai_config.decoder["head_size"]), "genai_config"
        inputs = {_slot_name(first, i): v.name for i, v in enumerate(first.inputs) if _present(v)}
        group = AttentionGroup(
            op_type=op_type, domain=domain or "ai.onnx", count=len(nodes), nodes=[n.name or "" for n in nodes],
            num_heads=heads, kv_num_heads=kv_heads, head_size=head_size, head_size_source=head_source,
            do_rotary=attr(first, "do_rotary"), rotary_interleaved=attr(first, "rotary_interleaved"),
            packed_qkv=packed, num_inputs=n_inputs, inputs=inputs, attributes=_attributes(first),
        )
        if op_type == "GroupQueryAttention":
            group.total_sequence_length, group.total_sequence_length_from_shape = _total_seq_description(
                _slot(first, "total_sequence_length"), model)
        out.append(group)
    return out


# ------------------------------------------------------------------------------------------------------------
# Rotary ops and what feeds them
# ------------------------------------------------------------------------------------------------------------


def _rope_sinks(model: ir.Model) -> Iterator[tuple[ir.Node, str, ir.Value]]:
    """(node, 'cos'|'sin'|'position_ids', value) for every cos/sin/position input of attention and rotary ops."""
    for node in iter_nodes(model):
        if node.op_type not in (*ATTENTION_OPS, *ROTARY_OPS):
            continue
        for slot, role in (("cos_cache", "cos"), ("sin_cache", "sin"), ("position_ids", "position_ids")):
            value = _slot(node, slot)
            if _present(value):
                yield node, role, value


def _position_source(value: ir.Value | None, model: ir.Model) -> str | None:
    if value is None:
        return None
    inputs = {id(v): v for v in model.graph.inputs}
    base = _through(value)
    if id(base) in inputs:
        return f"graph input {base.name} {_layout(base.shape)}"
    nodes = _ancestors([value], stop={"Shape"})
    ops = {n.op_type for n in nodes}
    srcs = _graph_inputs_of(nodes, model)
    if "Range" in ops:
        shapes = sorted({n.inputs[0].name for n in nodes if n.op_type == "Shape" and n.inputs[0] is not None})
        via = f" from Shape({', '.join(shapes)})" if shapes else ""
        return f"Range: synthetic positions 0..B*S-1{via}"
    if srcs:
        return f"computed from {', '.join(srcs)}"
    return "computed"


def _rotary_groups(model: ir.Model) -> list[RotaryGroup]:
    by_op: dict[tuple[str, str], list[ir.Node]] = {}
    for node in iter_nodes(model):
        if node.op_type in ROTARY_OPS:
            by_op.setdefault((node.op_type, _domain(node)), []).append(node)
    out = []
    for (op_type, domain), nodes in by_op.items():
        first = nodes[0]
        attrs = [_attributes(n) for n in nodes]
        shared = {k: v for k, v in attrs[0].items() if all(a.get(k) == v for a in attrs[1:])}
        section = attr(first, "mrope_section")
        pos = _slot(first, "position_ids")
        cos, sin = _slot(first, "cos_cache"), _slot(first, "sin_cache")
        out.append(RotaryGroup(
            op_type=op_type, domain=domain or "ai.onnx", count=len(nodes), nodes=[n.name or "" for n in nodes],
            num_heads=sorted({a["num_heads"] for a in attrs if "num_heads" in a}),
            interleaved=attr(first, "interleaved"), rotary_embedding_dim=attr(first, "rotary_embedding_dim"),
            mrope_section=list(section) if section is not None else None, mrope_layout=attr(first, "mrope_layout"),
            attributes={k: v for k, v in shared.items() if k != "num_heads"},
            position_input=pos.name if _present(pos) else None,
            position_source=_position_source(pos, model) if _present(pos) else None,
            cos_input=cos.name if _present(cos) else None, sin_input=sin.name if _present(sin) else None,
        ))
    return out


# ------------------------------------------------------------------------------------------------------------
# Caches and LongRoPE
# ------------------------------------------------------------------------------------------------------------


def _table_like(tensor: ir.TensorProtocol | None) -> bool:
    return tensor is not None and len(tensor.shape) == 2 and tensor.dtype.is_floating_point()


#: A cache found in the graph: (value, role "cos"/"sin", source, tensor metadata, the If node choosing it or None).
_RawCache = tuple[ir.Value, str, str, ir.TensorProtocol, "ir.Node | None"]


def _caches(model: ir.Model) -> tuple[list[_RawCache], list[ir.Node]]:
    """Constant 2D float tables reached from cos/sin inputs, and the If nodes choosing between tables."""
    found: dict[int, _RawCache] = {}
    if_nodes: dict[int, ir.Node] = {}

    def add(value: ir.Value, role: str, source: str, if_node: ir.Node | None = None) -> None:
        tensor = _const_tensor(value)
        if _table_like(tensor) and id(value) not in found:
            found[id(value)] = (value, role, source, tensor, if_node)

    for _node, role, value in _rope_sinks(model):
        if role == "position_ids":
            continue
        candidates = [value]
        for anc in _ancestors([value]):
            candidates.extend(v for v in anc.inputs if v is not None)
            if anc.op_type == "If":
                if_nodes[id(anc)] = anc
                on_path = _on_path(value)
                index = next((i for i, o in enumerate(anc.outputs) if id(o) in on_path), None)
                for branch in ("then_branch", "else_branch"):
                    g = attr(anc, branch)
                    if g is None:
                        continue
                    outs = list(g.outputs) if index is None else [g.outputs[index]]
                    for out in outs:
                        add(out, role, f"If.{branch}", anc)
        for cand in candidates:
            src = "initializer" if cand.const_value is not None else "Constant"
            add(cand, role, src)
    return list(found.values()), list(if_nodes.values())


def _on_path(value: ir.Value) -> set[int]:
    """ids of ``value`` and of every value its ancestors read: the values ``value`` is computed from."""
    out = {id(value)}
    for node in _ancestors([value]):
        out.update(id(v) for v in node.inputs if v is not None)
    return out


def _cache_records(
    model: ir.Model, context_length: int | None, offset: int | None,
) -> tuple[list[CosSinCache], LongRope | None]:
    """The cos/sin caches as records, and the LongRoPE pair they form (If branches, or a concatenated table)."""
    raw, if_nodes = _caches(model)
    longrope: LongRope | None = None
    variants: dict[int, str] = {}
    if if_nodes:
        node = if_nodes[0]
        rows = {src: t.shape[0] for _, _, src, t, n in raw if n is node and isinstance(t.shape[0], int)}
        then_rows, else_rows = rows.get("If.then_branch"), rows.get("If.else_branch")
        if then_rows is not None and else_rows is not None and then_rows != else_rows:
            long_src = "If.then_branch" if then_rows > else_rows else "If.else_branch"
            for v, _, src, _, n in raw:
                if n is node:
                    variants[id(v)] = "long" if src == long_src else "short"
            threshold, switch = _if_switch(node, model)
            longrope = LongRope(
                kind="if", original_max_position=threshold if threshold is not None else min(then_rows, else_rows),
                short_rows=min(then_rows, else_rows), long_rows=max(then_rows, else_rows), switch=switch,
                switch_node=node.name, concat_offset=offset,
            )
    if longrope is None and offset is not None:
        rows = sorted({t.shape[0] for _, _, src, t, n in raw if n is None and isinstance(t.shape[0], int)})
        # the concatenated table is short (offset rows) + long (context_length rows)
        if len(rows) == 1 and rows[0] > offset and (context_length is None or rows[0] - offset == context_length):
            longrope = LongRope(kind="concat", original_max_position=offset, short_rows=offset,
                                long_rows=rows[0] - offset, switch=None, switch_node=None, concat_offset=offset)
            for v, *_ in raw:
                variants[id(v)] = "concat (short+long)"
    records = []
    for value, role, source, tensor, _ in raw:
        rows = tensor.shape[0] if isinstance(tensor.shape[0], int) else None
        cols = tensor.shape[1] if isinstance(tensor.shape[1], int) else None
        variant = variants.get(id(value))
        effective = rows
        if variant == "concat (short+long)" and rows is not None and offset is not None:
            effective = rows - offset  # the long part is what covers the context
        versus = None
        if context_length is not None and effective is not None:
            versus = ("=" if effective == context_length else "<" if effective < context_length else ">")
            versus += " context_length" if effective == rows else f" context_length + offset {offset}"
        read_by = sorted({u.op_type for u, _ in value.uses()} | ({"If"} if source.startswith("If.") else set()))
        records.append(CosSinCache(
            name=value.name or "", role=role, shape=_shape_list(tensor.shape) or [],
            dtype=_dtype_name(tensor.dtype) or "?", rows=rows, columns=cols, source=source, variant=variant,
            read_by=read_by, rows_vs_context=versus,
        ))
    records.sort(key=lambda c: (c.variant or "", c.role, c.name))
    return records, longrope


def _longrope_where(model: ir.Model) -> LongRope | None:
    """Where(cond, long_inv_freq, short_inv_freq) feeding a Cos: LongRoPE chosen per call on the frequencies."""
    for cos in iter_nodes(model):
        if cos.op_type != "Cos":
            continue
        for node in _ancestors(cos.inputs):
            if node.op_type != "Where" or len(node.inputs) != 3:
                continue
            a, b = (_const_tensor(v) for v in node.inputs[1:])
            if a is None or b is None or a.shape != b.shape or not a.dtype.is_floating_point() or not _is_vector(
                    a.shape):
                continue
            threshold, switch = _if_switch(node, model)
            return LongRope(kind="where", original_max_position=threshold, short_rows=None, long_rows=None,
                            switch=switch, switch_node=node.name, concat_offset=None)
    return None


def _if_switch(node: ir.Node, model: ir.Model) -> tuple[int | None, str | None]:
    """(threshold, "If(Greater(lhs, 32))") for an If or Where whose condition compares with a constant."""
    cond = node.inputs[0] if node.inputs else None
    producer = cond.producer() if cond is not None else None
    if producer is None or len(producer.inputs) != 2:
        return None, f"{node.op_type}({cond.name if cond is not None else '?'})"
    a, b = producer.inputs
    threshold = _ints(_small_const(b))
    lhs = a.name or "?"
    desc, from_shape = _total_seq_description(a, model)
    if from_shape or (desc and "attention_mask" in desc):
        lhs = "total_sequence_length"
    elif desc:
        lhs = desc
    rhs = str(threshold[0]) if threshold and len(threshold) == 1 else (b.name or "?")
    switch = f"{node.op_type}({producer.op_type}({lhs}, {rhs}))"
    return (threshold[0] if threshold and len(threshold) == 1 else None), switch


# ------------------------------------------------------------------------------------------------------------
# Manual mRoPE and inv_freq MatMuls
# ------------------------------------------------------------------------------------------------------------


def _gather_axis(value: ir.Value) -> int | None:
    """The position axis (0=t, 1=h, 2=w) a gathered table row comes from: Gather(positions, const k)."""
    for node in _ancestors([value]):
        if node.op_type == "Gather" and len(node.inputs) == 2 and _const_tensor(node.inputs[0]) is None:
            index = _ints(_small_const(node.inputs[1]))
            if index is not None and len(index) == 1 and attr(node, "axis", 0) == 0:
                data = node.inputs[0]
                if data is not None and (data.shape is None or len(data.shape) == 3):
                    return index[0]
    return None


def _sections_from_masks(masks: dict[int, np.ndarray]) -> tuple[list[int] | None, int | None]:
    """[t, h, w] sections and layout from the h (axis 1) and w (axis 2) column masks."""
    if set(masks) != {1, 2}:
        return None, None
    half = masks[1].size
    cols = {axis: np.flatnonzero(m).tolist() for axis, m in masks.items()}
    counts = {axis: len(c) for axis, c in cols.items()}
    interleaved = all(cols[a] == list(range(a, 3 * counts[a], 3))[: counts[a]] for a in (1, 2))
    if interleaved:
        return [half - counts[1] - counts[2], counts[1], counts[2]], 1
    t = half - counts[1] - counts[2]
    if cols[1] == list(range(t, t + counts[1])) and cols[2] == list(range(t + counts[1], half)):
        return [t, counts[1], counts[2]], 0
    return None, None


def _chunked_sections(node: ir.Node) -> list[int] | None:
    """[t, h, w] when ``node`` splits a per-axis cos/sin table by mRoPE sections: output ``i`` gathered at position
    axis ``i % 3`` (3 outputs, or 6 when the table is rotate-half's doubled ``[f, f]``, as torch exporters emit)."""
    if node.op_type != "Split" or len(node.outputs) not in (3, 6):
        return None
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        sizes = _ints(_small_const(node.inputs[1]))
    else:
        sizes = _ints(np.array(attr(node, "split"))) if attr(node, "split") is not None else None
    if sizes is None or len(sizes) != len(node.outputs) or (len(sizes) == 6 and sizes[:3] != sizes[3:]):
        return None
    for i, out in enumerate(node.outputs):
        gathers = [u for u, _ in out.uses() if u.op_type == "Gather" and len(u.inputs) > 1]
        if not gathers or _ints(_small_const(gathers[0].inputs[1])) != [i % 3]:
            return None
    return sizes[:3]


def _manual_mrope(model: ir.Model, inv: list[InvFreqMatMul]) -> list[ManualMRope]:
    found: dict[tuple, ManualMRope] = {}
    # chunked: Split(per-axis table, sections), chunk i from position axis i, concatenated back (anywhere in the
    # graph: torch exports rotate with Mul/Add, not a rotary op)
    chunked: dict[int, ManualMRope] = {}
    for node in iter_nodes(model):
        sections = _chunked_sections(node)
        if sections is None:
            continue
        nodes = _ancestors(node.inputs[:1])
        if not any(n.op_type in ("Cos", "Sin") for n in nodes) and not any(
                _table_like(_const_tensor(v)) for n in nodes for v in n.inputs if v is not None):
            continue  # not a cos/sin table
        table = _table_source(nodes, inv)
        rec = found.setdefault(("chunked", tuple(sections), table),
                               ManualMRope("chunked", sections, 0, table, [], [], []))
        rec.section_nodes.append(node.name or "")
        if len(node.inputs) > 1 and node.inputs[1] is not None and node.inputs[1].name not in rec.section_constants:
            rec.section_constants.append(node.inputs[1].name or "")
        chunked[id(node)] = rec
    for node, role, value in _rope_sinks(model):
        if role != "cos" or node.op_type == "MRotaryEmbedding":
            continue
        nodes = _ancestors([value])
        feeding = {id(rec): rec for n in nodes if (rec := chunked.get(id(n))) is not None}
        for rec in feeding.values():
            rec.feeds.append(node.name or "")
        if feeding:
            continue
        # masked: Where(mask_h, from axis 1, Where(mask_w, from axis 2, from axis 0)) over cache rows
        wheres = [n for n in nodes if n.op_type == "Where" and _small_const(n.inputs[0]) is not None
                  and _const_tensor(n.inputs[0]) is not None and _const_tensor(n.inputs[0]).dtype == ir.DataType.BOOL]
        if wheres:
            masks, mask_names = {}, []
            for w in wheres:
                axis = _gather_axis(w.inputs[1])
                if axis in (1, 2):
                    masks[axis] = np.asarray(_small_const(w.inputs[0])).reshape(-1)
                    if w.inputs[0].name not in mask_names:
                        mask_names.append(w.inputs[0].name or "")
            sections, layout = _sections_from_masks(masks)
            table = _table_source(nodes, inv)
            key = ("masked", tuple(sections or ()), table)
            rec = found.setdefault(key, ManualMRope("masked", sections, layout, table, [], [], []))
            rec.section_nodes.extend(w.name or "" for w in wheres if w.name not in rec.section_nodes)
            rec.section_constants.extend(n for n in mask_names if n not in rec.section_constants)
            rec.feeds.append(node.name or "")
    return list(found.values())


def _table_source(nodes: list[ir.Node], inv: list[InvFreqMatMul]) -> str:
    products = {n.name: n.op_type for n in nodes if n.op_type in ("MatMul", "Einsum", "Mul")}
    for record in inv:
        hit = next((name for name in record.matmuls if name in products), None)
        if hit is not None:
            return f"inv_freq {products[hit]} ({record.inv_freq} {record.inv_freq_shape})"
    tables = []
    for n in nodes:
        for v in n.inputs:
            t = _const_tensor(v) if v is not None else None
            if _table_like(t) and v.name not in tables:
                tables.append(v.name)
    return "caches " + ", ".join(tables) if tables else "computed"


def _is_vector(shape: ir.Shape) -> bool:
    """One axis longer than 1, the others 1: ``[16]``, or ``[1, 16, 1]`` (torch exporters fold
    ``inv_freq[None, :, None]`` into a constant)."""
    dims = [d for d in shape if d != 1]
    return len(dims) == 1 and isinstance(dims[0], int)


def inv_freq_product(trig: ir.Node, model: ir.Model) -> tuple[ir.Node, ir.Value] | None:
    """``(product, inv_freq)`` when the Cos/Sin node ``trig`` reads positions times an ``inv_freq`` vector.

    ``product`` is the MatMul/Einsum, or the broadcasting Mul (transformers 5 dynamo exports) with a graph input
    behind one side, among ``trig``'s ancestors; ``inv_freq`` the constant float vector (``[N]`` or ``[1,N,1]``)
    behind one of its sides. None when ``trig`` is not computed that way (e.g. it reads a constant table).
    """
    for mm in _ancestors(trig.inputs):
        if mm.op_type not in ("MatMul", "Einsum", "Mul") or len(mm.inputs) != 2:
            continue
        if mm.op_type == "Mul" and not any(  # outer product by broadcasting (transformers 5 dynamo exports)
                _graph_inputs_of(_ancestors([side]), model) for side in mm.inputs):
            continue
        for side in mm.inputs:
            for anc_value in [side, *[i for a in _ancestors([side]) for i in a.inputs]]:
                t = _const_tensor(anc_value) if anc_value is not None else None
                if t is not None and t.dtype.is_floating_point() and _is_vector(t.shape):
                    return mm, anc_value
    return None


def longrope_where(model: ir.Model) -> LongRope | None:
    """The ``Where(cond, long_inv_freq, short_inv_freq)`` LongRoPE switch feeding a Cos (torch exports), if any."""
    return _longrope_where(model)


def _inv_freq_matmuls(model: ir.Model) -> list[InvFreqMatMul]:
    records: dict[str, InvFreqMatMul] = {}
    trig = [n for n in iter_nodes(model) if n.op_type in ("Cos", "Sin") and _domain(n) == ""]
    for node in trig:
        found = inv_freq_product(node, model)
        if found is not None:
            mm, vector = found
            rec = records.setdefault(vector.name or "", InvFreqMatMul(
                inv_freq=vector.name or "", inv_freq_shape=_shape_list(_const_tensor(vector).shape) or [],
                matmuls=[], cos_nodes=0, sin_nodes=0, positions_from=[]))
            if mm.name not in rec.matmuls:
                rec.matmuls.append(mm.name or "")
                nodes = _ancestors(mm.inputs)
                for src in _graph_inputs_of(nodes, model) + [n.name for n in nodes if n.op_type == "Range"]:
                    if src not in rec.positions_from:
                        rec.positions_from.append(src)
            if node.op_type == "Cos":
                rec.cos_nodes += 1
            else:
                rec.sin_nodes += 1
    return list(records.values())


# ------------------------------------------------------------------------------------------------------------
# Positions and dynamic nodes
# ------------------------------------------------------------------------------------------------------------


def _layout(shape: ir.Shape | None) -> str:
    if shape is None:
        return "other"
    if len(shape) == 2:
        return "[B,S]"
    if len(shape) == 3 and shape[0] == 3:
        return "[3,B,S]"
    return "other"


def _tile_to_3d(value: ir.Value) -> ir.Node | None:
    """The node expanding a 2D position input to 3 identical axes: Unsqueeze(0) → Tile([3,1,1]) / Expand([3,..])
    or Concat([p, p, p], axis=0) of the unsqueezed input."""
    for user, _ in value.uses():
        if user.op_type != "Unsqueeze":
            continue
        axes = _ints(_small_const(user.inputs[1])) if len(user.inputs) > 1 else _ints(
            np.array(attr(user, "axes")) if attr(user, "axes") is not None else None)
        if axes != [0]:
            continue
        unsq = user.outputs[0]
        for nxt, _ in unsq.uses():
            if nxt.op_type == "Tile" and _ints(_small_const(nxt.inputs[1])) == [3, 1, 1]:
                return nxt
            if nxt.op_type == "Expand":
                shape = _ints(_small_const(nxt.inputs[1]))
                if shape is not None and len(shape) == 3 and shape[0] == 3:
                    return nxt
            if nxt.op_type == "Concat" and attr(nxt, "axis") == 0 and len(nxt.inputs) == 3 and all(
                    i is unsq for i in nxt.inputs):
                return nxt
    return None


def _positions(model: ir.Model, genai_config: GenaiConfig) -> list[PositionInput]:
    wanted = genai_config.decoder_inputs.get("position_ids")
    out = []
    for value in model.graph.inputs:
        if value.name != wanted and "position" not in (value.name or ""):
            continue
        tile = _tile_to_3d(value) if value.shape is not None and len(value.shape) == 2 else None
        out.append(PositionInput(
            name=value.name or "", shape=_shape_list(value.shape), dtype=_dtype_name(value.dtype),
            rank=len(value.shape) if value.shape is not None else None, layout=_layout(value.shape),
            tiled_to_3d=tile is not None, tile_node=tile.name if tile is not None else None,
        ))
    return out


def _feeds(node: ir.Node, model: ir.Model) -> list[str]:
    """Attention/rotary input slots (and graph outputs) reachable from ``node``'s outputs, not through them."""
    graph_outputs = {id(v) for v in model.graph.outputs}
    found: list[str] = []
    seen: set[int] = set()
    stack = list(node.outputs)
    while stack:
        value = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if id(value) in graph_outputs and "output" not in found:
            found.append("output")
        for user, index in value.uses():
            if user.op_type in (*ATTENTION_OPS, *ROTARY_OPS):
                label = f"{user.op_type}.{_slot_name(user, index)}"
                if label not in found:
                    found.append(label)
                continue
            stack.extend(user.outputs)
    return sorted(found)


def _dynamic_nodes(model: ir.Model) -> dict[str, list[DynamicNode]]:
    out: dict[str, list[DynamicNode]] = {op: [] for op in DYNAMIC_OPS}
    for node in iter_nodes(model):
        if node.op_type in DYNAMIC_OPS and _domain(node) == "":
            out[node.op_type].append(DynamicNode(
                op_type=node.op_type, name=node.name or "", inputs=[i.name if i is not None else "" for i in
                                                                   node.inputs],
                feeds=_feeds(node, model)))
    return out


# ------------------------------------------------------------------------------------------------------------
# The census
# ------------------------------------------------------------------------------------------------------------


def _opsets(model: ir.Model) -> dict[str, int]:
    return {("ai.onnx" if k == "" else k): v for k, v in sorted(model.opset_imports.items())}


def census(model: ir.Model, genai_config: GenaiConfig | None = None, *, source: str | None = None) -> RopeCensus:
    """The RoPE census of ``model`` (``genai_config``: the genai_config.json beside it, if any)."""
    genai_config = genai_config if genai_config is not None else GenaiConfig()
    context_length, context_source = genai_config.context_length_with_source
    offset = genai_config.concat_offset
    attention = _attention_groups(model, genai_config)
    rotary = _rotary_groups(model)
    caches, longrope = _cache_records(model, context_length, offset)
    if longrope is None:
        longrope = _longrope_where(model)
    inv = _inv_freq_matmuls(model)
    manual = _manual_mrope(model, inv)
    positions = _positions(model, genai_config)
    notes: list[str] = []

    flavours = []
    if any(g.op_type == "GroupQueryAttention" and g.do_rotary == 1 for g in attention):
        flavours.append("fused-gqa")
    if any(g.op_type == "RotaryEmbedding" for g in rotary):
        flavours.append("rotary-embedding")
    if any(g.op_type == "MRotaryEmbedding" for g in rotary):
        flavours.append("mrotary-embedding")
    if manual:
        flavours.append("manual-mrope")
    if inv:
        flavours.append("inv-freq-matmul")
    if longrope is not None:
        flavours.append(f"longrope-{longrope.kind}")

    kinds = sorted({g.op_type for g in attention})
    attention_op = kinds[0] if len(kinds) == 1 else ("none" if not kinds else "mixed")

    # Facts worth a line of their own.
    for g in attention:
        declared = INPUT_SLOTS.get((MS_DOMAIN if g.domain == MS_DOMAIN else "", g.op_type), ())
        if g.op_type == "GroupQueryAttention" and g.num_inputs > 14:
            notes.append(f"GroupQueryAttention has {g.num_inputs} inputs (the contrib schema declares 14; "
                         f"inputs 14/15 carry q/k-norm weights)")
        elif declared and g.num_inputs > len(declared):
            notes.append(f"{g.op_type} has {g.num_inputs} inputs, more than the {len(declared)} known")
        if g.op_type == "GroupQueryAttention" and g.do_rotary == 1 and not any(
                c.read_by and "GroupQueryAttention" in c.read_by or c.source.startswith("If.") for c in caches):
            notes.append("GroupQueryAttention do_rotary=1 but no constant cos/sin cache feeds it")
    for c in caches:
        if c.rows_vs_context == "< context_length" and c.variant != "short":
            notes.append(f"{c.name}: {c.rows} rows < context_length {context_length}: later positions read past it")
    if offset is not None and (longrope is None or longrope.kind != "concat"):
        notes.append(f"genai_config sets multiRotaryCacheConcatOffset={offset} but no single concatenated cache "
                     f"longer than the offset was found")
    if longrope is None and offset is None and context_length is not None:
        for c in caches:
            if c.rows_vs_context == "> context_length" and c.source in ("initializer", "Constant"):
                notes.append(f"{c.name}: {c.rows} rows > context_length {context_length} and no "
                             f"multiRotaryCacheConcatOffset (a concatenated LongRoPE cache would be read from row 0)")
                break
    for p in positions:
        if p.tiled_to_3d:
            notes.append(f"{p.name} is 2D and tiled to 3 identical axes in-graph ({p.tile_node}): text-only mRoPE")
        if p.layout == "[3,B,S]":
            notes.append(f"{p.name} is a 3D input: its three axes may differ (image/video prompts); nothing in "
                         f"the graph proves them equal")

    return RopeCensus(
        source=source,
        ir_version=model.ir_version,
        opsets=_opsets(model),
        node_count=len(model.graph),
        subgraph_node_count=sum(1 for _ in iter_nodes(model)) - len(model.graph),
        inputs=[GraphInput(v.name or "", _shape_list(v.shape), _dtype_name(v.dtype)) for v in model.graph.inputs],
        attention_op=attention_op,
        attention=attention,
        rotary=rotary,
        flavours=flavours,
        caches=caches,
        context_length=context_length,
        context_length_source=context_source,
        longrope=longrope,
        manual_mrope=manual,
        inv_freq=inv,
        positions=positions,
        dynamic_nodes=_dynamic_nodes(model),
        notes=notes,
    )


# ------------------------------------------------------------------------------------------------------------
# Rendering
# ------------------------------------------------------------------------------------------------------------


def _fmt_shape(shape: list | None) -> str:
    return "?" if shape is None else "[" + ",".join(str(d) for d in shape) + "]"


def _inputs_line(inputs: list[GraphInput]) -> str:
    past = [i for i in inputs if i.name.startswith(("past_key_values", "past_"))]
    rest = [f"{i.name}{_fmt_shape(i.shape)}" for i in inputs if i not in past]
    if past:
        rest.append(f"past ×{len(past)}")
    return ", ".join(rest)


def render(c: RopeCensus, console) -> None:
    """Print the census as one compact table (rich ``Console``)."""
    from rich.markup import escape
    from rich.table import Table

    opsets = " ".join(f"{k} {v}" for k, v in c.opsets.items())
    sub = f" (+{c.subgraph_node_count} in subgraphs)" if c.subgraph_node_count else ""
    title = f"{c.source or 'model'}  ·  ir {c.ir_version}  ·  opsets {opsets}  ·  {c.node_count} nodes{sub}"
    table = Table(title=title, title_justify="left", show_header=False, box=None, padding=(0, 1))
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column(overflow="fold")
    add_row = table.add_row
    table.add_row = lambda key, value: add_row(key, escape(value))  # type: ignore[method-assign]

    table.add_row("rope", ", ".join(c.flavours) or "none found")
    if not c.attention:
        table.add_row("attention", "none")
    for g in c.attention:
        bits = [f"{g.op_type} ×{g.count}", f"heads {g.num_heads}/{g.kv_num_heads}",
                f"head_size {g.head_size}" + (" (genai_config)" if g.head_size_source == "genai_config" else "")]
        if g.do_rotary is not None:
            bits.append(f"do_rotary={g.do_rotary}")
        if g.rotary_interleaved is not None:
            bits.append(f"rotary_interleaved={g.rotary_interleaved}")
        bits.append("packed QKV" if g.packed_qkv else "separate Q/K/V")
        bits.append(f"{g.num_inputs} inputs")
        table.add_row("attention", ", ".join(bits))
        if g.total_sequence_length:
            table.add_row("  total_seq", g.total_sequence_length)
    for r in c.rotary:
        bits = [f"{r.op_type} ×{r.count}", f"interleaved={r.interleaved}",
                f"rotary_dim={r.rotary_embedding_dim}", f"num_heads {r.num_heads}"]
        if r.mrope_section is not None:
            bits.append(f"mrope_section {r.mrope_section}")
        if r.mrope_layout is not None:
            bits.append(f"mrope_layout={r.mrope_layout} ({'interleaved' if r.mrope_layout == 1 else 'sectioned'})")
        table.add_row("rotary", ", ".join(bits))
        if r.position_source:
            table.add_row("  positions", r.position_source)
    for m in c.manual_mrope:
        layout = {0: "sectioned", 1: "interleaved"}.get(m.layout, "?")
        table.add_row("manual mRoPE", f"{m.variant}, sections {m.sections}, layout {m.layout} ({layout}), "
                                      f"from {m.table_source}, feeds {len(m.feeds)} nodes")
    for f in c.inv_freq:
        table.add_row("inv_freq", f"{f.inv_freq}{_fmt_shape(f.inv_freq_shape)} → {len(f.matmuls)} MatMul → "
                                  f"Cos ×{f.cos_nodes} / Sin ×{f.sin_nodes}; positions from "
                                  f"{', '.join(f.positions_from) or '?'}")
    ctx = f"context_length {c.context_length}" if c.context_length is not None else "context_length unknown"
    if not c.caches:
        table.add_row("caches", f"none ({ctx})")
    for k in c.caches:
        extra = f" {k.variant}" if k.variant else ""
        versus = f", {k.rows_vs_context}" if k.rows_vs_context else ""
        table.add_row("cache", f"{k.role}{extra}: {k.name} {_fmt_shape(k.shape)} {k.dtype} "
                               f"({k.source}, read by {', '.join(k.read_by) or '-'}{versus})")
    if c.caches:
        table.add_row("  context", ctx + (f" from {c.context_length_source}" if c.context_length_source else ""))
    if c.longrope is not None:
        lr = c.longrope
        how = f"offset {lr.concat_offset} (genai_config)" if lr.kind == "concat" else lr.switch
        rows = f"short {lr.short_rows} rows, long {lr.long_rows} rows, " if lr.short_rows is not None else ""
        table.add_row("LongRoPE", f"{lr.kind}: {rows}original {lr.original_max_position}; {how}")
    if not c.positions:
        table.add_row("positions", "no position input")
    for p in c.positions:
        tiled = f", tiled to 3 axes in-graph ({p.tile_node})" if p.tiled_to_3d else ""
        table.add_row("positions", f"{p.name} {_fmt_shape(p.shape)} {p.layout}{tiled}")
    counts = ", ".join(f"{op} {n}" for op, n in c.dynamic_counts.items())
    table.add_row("dynamic", counts)
    for op, nodes in c.dynamic_nodes.items():
        # one row per distinct target set, so a 40-layer graph stays as short as a 2-layer one
        by_feeds: dict[tuple[str, ...], list[DynamicNode]] = {}
        for n in nodes:
            by_feeds.setdefault(tuple(n.feeds), []).append(n)
        for feeds, group in by_feeds.items():
            first = group[0]
            more = f" and {len(group) - 1} more" if len(group) > 1 else ""
            table.add_row(f"  {op} ×{len(group)}", f"→ {', '.join(feeds) or '-'}: "
                                                  f"{first.name}({', '.join(i for i in first.inputs if i)}){more}")
    table.add_row("inputs", _inputs_line(c.inputs))
    for note in c.notes:
        table.add_row("note", note)
    console.print(table)
