"""The RoPE census: read-only facts about how a decoder graph does rotary position embeddings.

:func:`census` walks an onnx_ir model (main graph and subgraphs) and reports, as dataclasses (``to_dict()`` gives JSON;
the records are defined in :mod:`rope_passes.analysis.schema` and importable from here):

* the attention op (GroupQueryAttention / MultiHeadAttention / Attention / none): count, ``do_rotary``,
  ``rotary_interleaved``, heads, head size, packed QKV, and where ``total_sequence_length`` comes from
  (:mod:`.attention`);
* the rotary ops (``RotaryEmbedding``, ``MRotaryEmbedding``) with their attributes (:mod:`.attention`);
* the cos/sin caches (name, shape, dtype, rows against the context length) (:mod:`.caches`), and LongRoPE: an If
  between two caches, a concatenated cache, or a Where between two inv_freq vectors (:mod:`.longrope`);
* the RoPE flavours found (:data:`FLAVOURS`), manual mRoPE subgraphs with the sections read from their constants
  (:mod:`.manual_mrope`), cos/sin computed on the fly from an ``inv_freq`` vector (:mod:`.inv_freq`);
* the position inputs (2D ``[B,S]`` / 3D ``[3,B,S]``), whether a 2D input is tiled to three identical axes in-graph
  (:mod:`.positions`);
* the Shape / If / Range / Loop nodes and which attention or rotary inputs each one feeds (here).

Weights are never read: cache shapes and dtypes come from the tensor metadata (onnx_ir ``ExternalTensor``s are
lazy). The only tensors read are small constants whose *values* are facts (mRoPE section sizes, h/w masks, a
LongRoPE threshold), each at most :data:`SMALL_TENSOR` elements.

``rope-passes inspect`` prints it (:func:`rope_passes.cli.inspect_cmd.render`).
"""

from __future__ import annotations

import onnx_ir as ir

from rope_passes.analysis.attention import attention_groups, rotary_groups
from rope_passes.analysis.caches import cache_records, find_caches
from rope_passes.analysis.graph import MS_DOMAIN, SMALL_TENSOR, iter_nodes, op_domain
from rope_passes.analysis.inv_freq import inv_freq_matmuls
from rope_passes.analysis.longrope import find_longrope
from rope_passes.analysis.manual_mrope import manual_mrope
from rope_passes.analysis.ops import ATTENTION_OPS, INPUT_SLOTS, ROTARY_OPS, slot_name
from rope_passes.analysis.positions import position_inputs
from rope_passes.analysis.schema import (
    DYNAMIC_OPS,
    FLAVOURS,
    AttentionGroup,
    CosSinCache,
    DynamicNode,
    GraphInput,
    InvFreqMatMul,
    LongRope,
    ManualMRope,
    PositionInput,
    RopeCensus,
    RotaryGroup,
    dtype_name,
    shape_list,
)
from rope_passes.config import GenaiConfig
from rope_passes.report import name_of

__all__ = [
    "DYNAMIC_OPS", "FLAVOURS", "SMALL_TENSOR", "AttentionGroup", "CosSinCache", "DynamicNode", "GraphInput",
    "InvFreqMatMul", "LongRope", "ManualMRope", "PositionInput", "RopeCensus", "RotaryGroup", "census",
]


# ------------------------------------------------------------------------------------------------------------
# Dynamic nodes
# ------------------------------------------------------------------------------------------------------------


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
                label = f"{user.op_type}.{slot_name(user, index)}"
                if label not in found:
                    found.append(label)
                continue
            stack.extend(user.outputs)
    return sorted(found)


def _dynamic_nodes(model: ir.Model) -> dict[str, list[DynamicNode]]:
    out: dict[str, list[DynamicNode]] = {op: [] for op in DYNAMIC_OPS}
    for node in iter_nodes(model):
        if node.op_type in DYNAMIC_OPS and op_domain(node) == "":
            out[node.op_type].append(DynamicNode(
                op_type=node.op_type, name=name_of(node), inputs=[i.name if i is not None else "" for i in
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
    attention = attention_groups(model, genai_config)
    rotary = rotary_groups(model)
    found_caches = find_caches(model)
    found = find_longrope(model, context_length=context_length, concat_offset=offset, caches=found_caches)
    caches = cache_records(found_caches[0], context_length) if found is None else cache_records(
        found_caches[0], context_length, found.variant, found.original if found.kind == "concat" else None)
    longrope = None if found is None else LongRope(
        kind=found.kind, original_max_position=found.original, short_rows=found.short_rows,
        long_rows=found.long_rows, switch=found.switch, switch_node=found.switch_node,
        concat_offset=offset if found.kind != "where" else None)
    inv = inv_freq_matmuls(model)
    manual = manual_mrope(model, inv)
    positions = position_inputs(model, genai_config)
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
        inputs=[GraphInput(name_of(v), shape_list(v.shape), dtype_name(v.dtype)) for v in model.graph.inputs],
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
