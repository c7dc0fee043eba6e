"""``lower-mrope``: replace ``com.microsoft::MRotaryEmbedding`` with standard ops + ``com.microsoft::RotaryEmbedding``.

onnxruntime-webgpu 1.27 has no MRotaryEmbedding kernel (the builder 0.18 Qwen2.5-VL/Qwen3-VL/Qwen3.5 graphs do not
even load), but it runs RotaryEmbedding. For every MRotaryEmbedding the pass builds, once per distinct
(positions, caches, sections, layout, scale):

* ``axis = [t/h/w axis of column c]`` (a constant from ``mrope_section``/``mrope_layout``, onnxruntime's own
  column assignment, see :func:`rope_passes.analysis.mrope.axis_of_columns`);
* ``pos_tok = Reshape(Transpose(Gather(position_ids, axis, axis=0), [1,2,0]), [-1, half])`` — for token
  ``(b, s)`` and column ``c`` the position of the axis that owns ``c``;
* ``cos_tok = GatherElements(cos_cache, pos_tok, axis=0)`` (same for sin): the per-token ``[B*S, half]`` rows
  MRotaryEmbedding would combine;
* the token index ``Reshape(Range(0, B*S), [B, S])`` as RotaryEmbedding's position_ids, so token (b, s) reads its
  own row;

then ``RotaryEmbedding(x, token_index, cos_tok, sin_tok)`` with the node's ``interleaved`` (on only when it is 1,
as both kernels read it), ``rotary_embedding_dim`` and head count: ``num_heads`` for a 3D input, the input's static
N for a 4D ``[B, N, S, H]`` one (MRotaryEmbedding ignores the attribute there; RotaryEmbedding's WebGPU kernel does
not). A ``scale`` other than 1 (0 included) is folded into scaled copies of the caches.

**Exact**: the same cos/sin values reach the same rotation for any positions (distinct t/h/w included); it is
the builder 0.15.2 formulation of mRoPE, which onnxruntime 1.27 runs on CPU and WebGPU. The token index and the
``Shape`` it needs are shape math on CPU; whether capture works is the output's capture verdict (the corpus's lowered
graphs are capture-ready after ``narrow-int64`` in ``webgpu-graph``: docs/graph-capture.md). For text prompts
``fold-text-mrope`` first removes the mRoPE machinery altogether.

**Refuses**: ``is_packed_batching=1``; caches that are not ``[max_pos, half]`` with ``half`` = sum of the
sections; position_ids that are not int64 ``[3, B, S]``; ``rotary_embedding_dim`` on an input whose head count is not
static (rank unknown, or a dynamic N in 4D). A model without MRotaryEmbedding comes out unchanged.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import MS_DOMAIN, attr, const_tensor, flag, nodes_of, rank_of
from rope_passes.analysis.mrope import axis_of_columns
from rope_passes.passes._rewrite import FreshNames, NodeTape, add_initializer, opset_of, remove_dead
from rope_passes.passes.base import RopePass
from rope_passes.report import MatchFailure, PassReport, place_of


class LowerMRoPEPass(RopePass):
    name = "lower-mrope"
    summary = "replace MRotaryEmbedding by per-token cos/sin gathers + RotaryEmbedding (runs on onnxruntime-webgpu)"

    def apply(self, model: ir.Model, report: PassReport) -> None:
        graph = model.graph
        nodes = nodes_of(graph, "MRotaryEmbedding", MS_DOMAIN)
        if not nodes:
            raise MatchFailure.absent("no com.microsoft::MRotaryEmbedding node")
        shared: dict[tuple, tuple[ir.Value, ir.Value, ir.Value]] = {}
        old: list[ir.Value] = []
        fresh = FreshNames(graph)
        for node in nodes:
            if node.graph is not graph:
                report.not_matched(node.name, "MRotaryEmbedding inside a subgraph is not lowered")
                continue
            try:
                key, half, sections, layout, scale = self._check(node)
            except MatchFailure as exc:
                report.record(exc, node)
                continue
            if key not in shared:
                shared[key] = self._per_token_tables(graph, node, half, sections, layout, scale, fresh)
            token_index, cos_tok, sin_tok = shared[key]
            attrs = {"interleaved": int(flag(node, "interleaved"))}
            heads = self._num_heads(node)
            if heads:
                attrs["num_heads"] = heads
            if attr(node, "rotary_embedding_dim"):
                attrs["rotary_embedding_dim"] = int(attr(node, "rotary_embedding_dim"))
            tape = NodeTape(opset_of(graph))
            out = tape.op("RotaryEmbedding", [node.inputs[0], token_index, cos_tok, sin_tok], attrs,
                          domain=MS_DOMAIN, name=fresh(f"{place_of(node)}/lowered/RotaryEmbedding"),
                          output=fresh(f"{node.outputs[0].name}/lowered"),
                          dtype=node.outputs[0].dtype or node.inputs[0].dtype, shape=node.outputs[0].shape)
            tape.insert_before(graph, node)
            was = node.outputs[0]
            if was.is_graph_output():  # keep the graph output's name
                name = was.name
                was.name = fresh(f"{name}/mrotary")
                was.replace_all_uses_with(out, replace_graph_outputs=True)
                out.name = name
            else:
                was.replace_all_uses_with(out)
            old.extend(node.outputs)
            report.rewritten(
                node.name,
                f"lowered to RotaryEmbedding with per-token cos/sin (sections {sections}, layout {layout})",
                sections=sections,
                layout=layout,
            )
        if old:
            report.note(
                "<model>",
                "the token index is computed from Shape/Range (shape math): whether WebGPU graph capture works is the "
                "output's capture verdict, which optimize --preset webgpu-graph reports after narrow-int64; for "
                "text-only use fold-text-mrope with --text-only removes the mRoPE machinery instead",
            )
            remove_dead(graph, old)
            if MS_DOMAIN not in model.opset_imports:
                model.opset_imports[MS_DOMAIN] = 1

    @staticmethod
    def _num_heads(node: ir.Node) -> int:
        """RotaryEmbedding's ``num_heads`` (0: none). For a 4D ``[B, N, S, H]`` input MRotaryEmbedding takes the head
        count from the input and ignores the attribute, while RotaryEmbedding's WebGPU kernel uses the attribute when
        ``rotary_embedding_dim`` is set: the input's static N, never the attribute."""
        shape = node.inputs[0].shape
        if shape is not None and len(shape) == 4:
            return shape[1] if isinstance(shape[1], int) else 0
        return int(attr(node, "num_heads", 0) or 0)  # 3D (rank proved in _check when it matters)

    @staticmethod
    def _check(node: ir.Node) -> tuple[tuple, int, list[int], int, float]:
        """(sharing key, half, sections, layout, scale); MatchFailure.refuse when the lowering would not be exact."""
        if int(attr(node, "is_packed_batching", 0) or 0):
            raise MatchFailure.refuse("is_packed_batching=1 (packed batches) is not supported")
        shape, rank = node.inputs[0].shape, rank_of(node.inputs[0])
        rotary_dim = int(attr(node, "rotary_embedding_dim", 0) or 0)
        if rotary_dim and (rank is None or (rank == 4 and (shape is None or not isinstance(shape[1], int)))):
            raise MatchFailure.refuse(f"rotary_embedding_dim={rotary_dim} on an input whose head count is not known "
                                      f"(rank {rank}, shape {shape}): RotaryEmbedding needs it as num_heads, "
                                      "MRotaryEmbedding reads it from a 4D input and the attribute from a 3D one")
        pos, cos, sin = node.inputs[1], node.inputs[2], node.inputs[3]
        if pos is None or pos.dtype != ir.DataType.INT64:
            raise MatchFailure.refuse("position_ids is not an int64 tensor")
        if pos.shape is not None and (len(pos.shape) != 3 or pos.shape[0] != 3):
            raise MatchFailure.refuse(f"position_ids has shape {pos.shape}, not [3, batch, seq]")
        if cos is None or sin is None or cos.shape is None or len(cos.shape) != 2 or not isinstance(cos.shape[1], int):
            raise MatchFailure.refuse("cos_cache is not a 2D [max_pos, half] tensor with a static width")
        half = cos.shape[1]
        sections = [int(s) for s in (attr(node, "mrope_section") or [])]
        layout = int(attr(node, "mrope_layout", 0) or 0)
        if len(sections) != 3 or sum(sections) != half:
            raise MatchFailure.refuse(f"mrope_section {sections} does not sum to the cache width {half}")
        axis_of_columns(sections, layout, half)
        scale = float(attr(node, "scale", 1.0))
        if scale != 1.0 and (const_tensor(cos) is None or const_tensor(sin) is None):
            raise MatchFailure.refuse(f"scale={scale} with cos/sin caches that are not constants "
                                      "(cannot pre-scale them)")
        return (id(pos), id(cos), id(sin), tuple(sections), layout, scale), half, sections, layout, scale

    @staticmethod
    def _per_token_tables(graph: ir.Graph, node: ir.Node, half: int, sections: list[int], layout: int,
                          scale: float, fresh: FreshNames) -> tuple[ir.Value, ir.Value, ir.Value]:
        """(token index, per-token cos, per-token sin) for ``node``'s positions, inserted before ``node``."""
        pos, cos, sin = node.inputs[1], node.inputs[2], node.inputs[3]
        base = f"{place_of(node)}/lowered"
        tape = NodeTape(opset_of(graph))

        def op(op_type, inputs, attrs=None, name="", dtype=None, shape=None) -> ir.Value:
            step = fresh(f"{base}/{name or op_type}")
            return tape.op(op_type, inputs, attrs, name=step, output=fresh(f"{step}/output_0"), dtype=dtype,
                           shape=shape)

        def const(name: str, array: np.ndarray) -> ir.Value:
            return add_initializer(graph, fresh(f"{base}/{name}"), array)

        if scale != 1.0:
            cos, sin = (_scaled(graph, cache, scale, fresh) for cache in (cos, sin))
        axis = const("axis_of_column", axis_of_columns(sections, layout, half))
        flat_shape = const("flat_shape", np.array([-1, half], np.int64))
        i64 = ir.DataType.INT64
        per_col = op("Gather", [pos, axis], {"axis": 0}, "pos_per_column", i64)  # [half, B, S]
        per_tok = op("Transpose", [per_col], {"perm": [1, 2, 0]}, "pos_per_token", i64)  # [B, S, half]
        flat = op("Reshape", [per_tok, flat_shape], name="pos_flat", dtype=i64, shape=["tokens", half])
        cos_tok = op("GatherElements", [cos, flat], {"axis": 0}, "cos_per_token", cos.dtype, ["tokens", half])
        sin_tok = op("GatherElements", [sin, flat], {"axis": 0}, "sin_per_token", sin.dtype, ["tokens", half])
        # token index Reshape(Range(0, B*S), [B, S]): token (b, s) reads row b*S + s of the per-token tables
        if (graph.opset_imports.get("", 1)) >= 15:
            bs = op("Shape", [pos], {"start": 1, "end": 3}, "batch_seq", i64, [2])
        else:  # Shape has no start/end before opset 15
            shape = op("Shape", [pos], name="pos_shape", dtype=i64, shape=[3])
            starts = const("one_1d", np.array([1], np.int64))
            ends = const("three_1d", np.array([3], np.int64))
            bs = op("Slice", [shape, starts, ends], name="batch_seq", dtype=i64, shape=[2])
        total = op("ReduceProd", [bs], {"keepdims": 0}, "tokens", i64, [])
        zero = const("zero", np.array(0, np.int64))
        one = const("one", np.array(1, np.int64))
        rng = op("Range", [zero, total, one], name="token_range", dtype=i64, shape=["tokens"])
        token_index = op("Reshape", [rng, bs], name="token_index", dtype=i64, shape=["batch", "seq"])
        tape.insert_before(graph, node)
        return token_index, cos_tok, sin_tok


def _scaled(graph: ir.Graph, cache: ir.Value, scale: float, fresh: FreshNames) -> ir.Value:
    """A copy of constant ``cache`` times ``scale`` (MRotaryEmbedding scales cos/sin in float, then rounds)."""
    tensor = const_tensor(cache)
    assert tensor is not None  # checked by the match
    array = tensor.numpy()
    return add_initializer(graph, fresh(f"{cache.name}_scaled"), (array.astype(np.float32) * scale).astype(array.dtype))
