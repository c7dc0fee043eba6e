"""The RoPE census as data: the records :func:`rope_passes.analysis.census.census` returns (``to_dict()`` is JSON).

The field order of each record is the key order of ``rope-passes inspect --json``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import onnx_ir as ir

from rope_passes.report import name_of

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

DYNAMIC_OPS = ("Shape", "If", "Range", "Loop")


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
# Graph facts as JSON values
# ------------------------------------------------------------------------------------------------------------


def shape_list(shape: ir.ShapeProtocol | None) -> list[int | str] | None:
    if shape is None:
        return None
    return [d if isinstance(d, int) else (d.value if d.value is not None else "?") for d in shape]


def dtype_name(dtype: ir.DataType | None) -> str | None:
    return None if dtype is None else dtype.name


def jsonable(value: Any) -> Any:
    if isinstance(value, (int, str, bool)) or value is None:  # first: the Protocol checks below cost ~0.1 ms each
        return value
    if isinstance(value, ir.TensorProtocol):
        return f"<tensor {shape_list(value.shape)} {dtype_name(value.dtype)}>"
    if isinstance(value, (ir.Graph, ir.GraphProtocol)):
        return f"<graph {name_of(value)}>"
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float):
        return round(value, 6)
    return str(value)


def attributes(node: ir.Node) -> dict[str, Any]:
    return {k: jsonable(a.value) for k, a in sorted(node.attributes.items())}
