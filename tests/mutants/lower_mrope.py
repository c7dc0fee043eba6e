"""Mutants attacking ``lower-mrope``: ``MRotaryEmbedding`` read differently than onnxruntime reads it.

The lowering rebuilds MRotaryEmbedding from its attributes (``interleaved``, ``scale``, ``num_heads``,
``rotary_embedding_dim``, ``mrope_section``, ``mrope_layout``) and its input's rank; the reference is the mutant
itself on onnxruntime >= 1.31's CPU kernel (``reference="plugin"``), which defines what those attributes mean, fed
image/video positions (three different axes, ``vision=True``) so that a lowering mixing up the axes shows. The
preset is ``webgpu`` without ``--text-only``: the fold refuses the ``[3, B, S]`` input, the lowering runs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from . import EQUIVALENT, REFUSE, Mutant, Work
from .edit import Chain, nodes_of
from .probes import as_constant_node, as_graph_output, overridable, read_in_if, set_attr

PASS = "lower-mrope"
QWEN25 = "genai/current/qwen25_vl/cpu_fp32"  # sections [4, 6, 6], layout 0, head 32, cache [256, 16]
QWEN35 = "genai/current/qwen35/webgpu_fp32"  # sections [4, 2, 2], layout 1, rotary 16 of head 32, cache [256, 8]
QWEN25_FP16 = "genai/current/qwen25_vl/webgpu_fp16"  # fp16 model, the rotation in float between two Casts


def _rotations(work: Work, which: Callable[[ir.Node], bool] | None = None) -> list[ir.Node]:
    return [n for n in nodes_of(work.graph, "MRotaryEmbedding") if which is None or which(n)]


def _q(node: ir.Node) -> bool:
    return "q_rotary" in node.name


def _layer0_q(node: ir.Node) -> bool:
    return "layers.0/attn/q_rotary" in node.name


def as_built(work: Work) -> list[str]:
    return [n.name for n in _rotations(work)]


def attrs(which=None, **values):
    """Attributes of the rotations ``which`` selects set (None removes one)."""
    def edit(work: Work) -> list[str]:
        for node in _rotations(work, which):
            for name, value in values.items():
                set_attr(node, name, value)
        return as_built(work)
    return edit


def scales_per_layer(work: Work) -> list[str]:
    """Every rotation a different ``scale`` (0.5, 2, 0.25, 1.5): each needs its own scaled copy of the caches."""
    for node, scale in zip(_rotations(work), (0.5, 2.0, 0.25, 1.5), strict=True):
        set_attr(node, "scale", scale)
    return as_built(work)


def scaled_name_taken(work: Work) -> list[str]:
    """``scale`` 0.5, and a value of the graph already named ``cos_cache_scaled`` (the name the lowering derives for
    its scaled copy): the new initializer must not collide with a node output."""
    attrs(scale=0.5)(work)
    node = _rotations(work)[0]
    chain = Chain(work.graph, "name")
    out = chain.op("Identity", node.inputs[0], shape=node.inputs[0].shape)
    chain.insert([node])
    node.replace_input_with(0, out)
    out.name = "cos_cache_scaled"
    return as_built(work)


def four_d(num_heads_attr: int, static_heads: bool = True, rotary_dim: int | None = None):
    """The q rotations rotate a 4D ``[B, N, S, H]`` tensor: Reshape/Transpose around them; ``num_heads`` set to
    ``num_heads_attr`` (MRotaryEmbedding takes N from a 4D input); the input's N declared or not."""
    def edit(work: Work) -> list[str]:
        for node in _rotations(work, _q):
            heads = int(node.attributes["num_heads"].value)
            x, y = node.inputs[0], node.outputs[0]
            head = x.shape[2] // heads
            readers = list(y.uses())
            chain = Chain(work.graph, "four_d")
            x4 = chain.op("Transpose", chain.op("Reshape", x, chain.i64(0, 0, heads, head)), perm=[0, 2, 1, 3],
                          shape=ir.Shape(["batch_size", heads if static_heads else "heads", "sequence_length", head]))
            chain.insert([node])
            node.replace_input_with(0, x4)
            y.shape = x4.shape
            back = Chain(work.graph, "four_d_back")
            y3 = back.op("Reshape", back.op("Transpose", y, perm=[0, 2, 1, 3]), back.i64(0, 0, heads * head),
                         shape=x.shape)
            back.insert([u for u, _ in readers])
            for user, index in readers:
                user.replace_input_with(index, y3)
            set_attr(node, "num_heads", num_heads_attr)
            if rotary_dim is not None:
                set_attr(node, "rotary_embedding_dim", rotary_dim)
        work.graph.sort()
        return [n.name for n in _rotations(work, _q)]
    return edit


def caches(transform: Callable[[ir.Graph, ir.Value], object], scale: float | None = None):
    """``transform(graph, cache)`` on both cos_cache and sin_cache (and ``scale`` set on every rotation)."""
    def edit(work: Work) -> list[str]:
        if scale is not None:
            attrs(scale=scale)(work)
        for name in ("cos_cache", "sin_cache"):
            transform(work.graph, work.graph.initializers[name])
        return as_built(work)
    return edit


def _identity_cache(graph: ir.Graph, cache: ir.Value) -> None:
    readers = list(cache.uses())
    chain = Chain(graph, "cache")
    out = chain.op("Identity", cache, shape=cache.shape)
    chain.insert([u for u, _ in readers])
    for user, index in readers:
        user.replace_input_with(index, out)


def rotated_as_output(work: Work) -> list[str]:
    """Layer 0's rotated q is also a graph output, under its own name (and read by GQA)."""
    (node,) = _rotations(work, _layer0_q)
    as_graph_output(work.graph, node.outputs[0])
    return as_built(work)


def rotated_in_if(work: Work) -> list[str]:
    """Layer 0's rotated q is also read inside an If body (an outer-scope reference), summed to a graph output."""
    (node,) = _rotations(work, _layer0_q)
    read_in_if(work.graph, node.outputs[0], "mutant_rotated_q_sum")
    return as_built(work)


def positions_edit(build):
    """The rotations read ``build(chain, position_ids)`` (one shared value)."""
    def edit(work: Work) -> list[str]:
        pos = next(v for v in work.graph.inputs if v.name == "position_ids")
        readers = [(u, i) for u, i in pos.uses() if u.op_type == "MRotaryEmbedding"]
        chain = Chain(work.graph, "positions")
        new = build(chain, pos)
        chain.insert([u for u, _ in readers])
        for user, index in readers:
            user.replace_input_with(index, new)
        work.graph.sort()
        return as_built(work)
    return edit


def opset(version: int):
    """The model's default-domain opset set to ``version`` (every op of the builder's graph exists there): the
    lowering must build ops of that opset (``Shape`` has no start/end before 15)."""
    def edit(work: Work) -> list[str]:
        work.model.opset_imports[""] = version
        work.graph.opset_imports[""] = version
        return as_built(work)
    return edit


def unnamed(scales: tuple[float, ...] | None = None):
    """Every rotation with an empty node name (ONNX allows it; exporters leave many nodes unnamed), optionally each
    with its own ``scale`` (so the lowering builds several sets of tables): names the lowering derives from the node
    name must still be unique."""
    def edit(work: Work) -> list[str]:
        rot = _rotations(work)
        for k, node in enumerate(rot):
            node.name = ""
            if scales is not None:
                set_attr(node, "scale", scales[k])
        return [""]
    return edit


def mutants() -> list[Mutant]:
    def m(name, cls, expect, edit, why, base=QWEN25, short="qwen25"):
        return Mutant(f"lower-{short}-{name}", cls, PASS, base, expect, edit, why, target="webgpu",
                      reference="plugin", vision=True, fp16=base == QWEN25_FP16)

    return [
        m("as-built", "harmless", EQUIVALENT, as_built, "the builder's graph, image positions: the lowering's baseline"),
        m("as-built", "harmless", EQUIVALENT, as_built, "partial rotary, interleaved section layout", QWEN35, "qwen35"),
        m("as-built", "dtype-shape", EQUIVALENT, as_built, "fp16 model: the rotation runs in float between Casts",
          QWEN25_FP16, "qwen25fp16"),
        m("interleaved-2", "attribute", EQUIVALENT, attrs(interleaved=2),
          "interleaved=2: onnxruntime's kernels test == 1, so rotate-half"),
        m("interleaved-1", "attribute", EQUIVALENT, attrs(interleaved=1), "adjacent pairs"),
        m("interleaved-1", "attribute", EQUIVALENT, attrs(interleaved=1),
          "adjacent pairs with partial rotary", QWEN35, "qwen35"),
        m("scale-half", "attribute", EQUIVALENT, attrs(scale=0.5), "scale 0.5 on the caches"),
        m("scale-zero", "attribute", EQUIVALENT, attrs(scale=0.0), "scale 0.0: as onnxruntime reads it"),
        m("layer1-interleaved", "attribute", EQUIVALENT, attrs(lambda n: "layers.1/" in n.name, interleaved=1),
          "layer 1 rotates adjacent pairs, layer 0 rotate-half: shared per-token tables, two pairings"),
        m("scale-per-layer", "naming", EQUIVALENT, scales_per_layer,
          "four rotations, four scales of the same caches: four scaled copies, each its own name"),
        m("scaled-name-taken", "naming", EQUIVALENT, scaled_name_taken,
          "scale 0.5 and a node output already named 'cos_cache_scaled'"),
        m("unnamed", "naming", EQUIVALENT, unnamed(), "the rotations have empty node names"),
        m("unnamed-scales", "naming", EQUIVALENT, unnamed((0.5, 2.0, 0.25, 1.5)),
          "the rotations have empty node names and four scales: four sets of tables"),
        m("num-heads-2-rotary-32", "attribute", EQUIVALENT, attrs(_q, num_heads=2, rotary_embedding_dim=32),
          "q read as 2 heads of 64 with the first 32 of each rotated: another rotation, still expressible"),
        m("sections-6-6-4", "attribute", EQUIVALENT, attrs(mrope_section=[6, 6, 4]), "other sections, same sum"),
        m("layout-1", "attribute", EQUIVALENT, attrs(mrope_layout=1), "the interleaved section layout on [4, 6, 6]"),
        m("layout-0", "attribute", EQUIVALENT, attrs(mrope_layout=0), "sectioned layout on [4, 2, 2]", QWEN35, "qwen35"),
        m("sections-sum-wrong", "attribute", REFUSE, attrs(mrope_section=[4, 6, 4]),
          "sections summing to 14 for a 16-column cache"),
        m("packed-batching", "attribute", REFUSE, attrs(is_packed_batching=1), "is_packed_batching=1"),
        m("opset-14", "dtype-shape", EQUIVALENT, opset(14), "default-domain opset 14: Shape without start/end"),
        m("four-d", "dtype-shape", EQUIVALENT, four_d(7),
          "q rotated as [B, 4, S, 32] with num_heads=7 (ignored for 4D by MRotaryEmbedding)"),
        m("four-d-dynamic-heads-rotary", "dtype-shape", EQUIVALENT, four_d(4, static_heads=False, rotary_dim=32),
          "4D q whose head count is not declared, with rotary_embedding_dim: RotaryEmbedding needs num_heads"),
        m("caches-overridable", "constant-form", EQUIVALENT, caches(overridable),
          "cos/sin caches that are graph inputs too (scale 1: the lowering gathers whatever is fed)"),
        m("caches-overridable-scaled", "constant-form", EQUIVALENT, caches(overridable, scale=0.5),
          "caches a caller may override, scale 0.5: a pre-scaled copy would freeze the default"),
        m("caches-constant-node-scaled", "constant-form", EQUIVALENT, caches(as_constant_node, scale=0.5),
          "caches as Constant nodes, scale 0.5"),
        m("caches-identity-scaled", "constant-form", EQUIVALENT, caches(_identity_cache, scale=0.5),
          "caches through Identity, scale 0.5"),
        m("rotated-is-output", "graph-output", EQUIVALENT, rotated_as_output,
          "layer 0's rotated q is also a graph output"),
        m("rotated-read-in-if", "subgraph", EQUIVALENT, rotated_in_if,
          "layer 0's rotated q is also read inside an If body"),
        m("positions-plus-one-axis", "harmless", EQUIVALENT, positions_edit(
            lambda c, p: c.op("Add", p, c.const(np.array([[[0]], [[1]], [[2]]], np.int64)), shape=p.shape)),
          "positions + [0, 1, 2] per axis: the lowering reads whatever positions reach it"),
    ]
