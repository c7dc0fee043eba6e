"""``unfuse-gqa-qk-norm``: move GroupQueryAttention's fused q/k RMSNorm back out as SimplifiedLayerNormalization.

onnxruntime-genai's builder (0.18, Qwen3 and other q/k-norm families) fuses the per-head RMSNorm of q and k into
``com.microsoft::GroupQueryAttention``: inputs 14/15 carry the q-norm and k-norm weights ``[head_size]`` and the
attribute ``qk_norm_epsilon`` the epsilon. onnxruntime-webgpu 1.27 accepts GroupQueryAttention with 7..14 inputs
only, so such a model does not load there at all; onnxruntime ≥ 1.31 with the WebGPU plugin EP runs it natively
(the runtime targets say which runtime needs this pass; the ``webgpu*`` presets include it only for 1.27).

**Rewrites.** For every GroupQueryAttention with a q-norm or k-norm weight (input 14 / 15): q (and k) are
normalised before the attention exactly as the builder writes them with ``fuse_qk_norm_gqa=false``::

    Reshape(x, [0, -1, head_size]) → SimplifiedLayerNormalization(·, weight, epsilon, axis=-1, stash_type=1)
        → Reshape(·, [0, -1, heads * head_size])

For packed QKV (key/value inputs empty) the packed input is split into q/k/v first (``Split`` on the hidden axis,
sizes ``[H·d, KV·d, KV·d]``) and concatenated back after the norms, so GQA stays packed (the LongRoPE cache offset
acts on packed QKV only). Inputs 14/15 and ``qk_norm_epsilon`` are removed; trailing empty inputs are trimmed.

**Exact when** the fused kernel is RMSNorm over each head's ``head_size`` values with that weight and epsilon,
applied before the rotation — onnxruntime's contract for inputs 14/15, and what the builder's unfused form computes.
The unfused graph is the builder's own ``fuse_qk_norm_gqa=false`` graph node for node: on the shared corpus's Qwen3
build it gives the same bits as the builder's unfused build of the same checkpoint (``tests``).

**Refuses** (GQA left fused, reason in the report): one norm weight without the other, or norm weights with
``do_rotary`` != 1 (onnxruntime rejects both: the input loads nowhere, and the unfused graph would compute what no
runtime defines); a norm weight that is not a constant 1-D ``[head_size]``
tensor; q/k widths that are not ``heads × head_size`` (unknown static width); ``head_size`` unknown;
packed QKV whose width is not ``(H + 2·KV) × head_size``.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import MS_DOMAIN, attr, flag, nodes_of
from rope_passes.passes._rewrite import FreshNames
from rope_passes.passes.base import RopePass
from rope_passes.report import MatchFailure, PassReport, place_of

Q_NORM_INPUT, K_NORM_INPUT = 14, 15


def _present(node: ir.Node, index: int) -> ir.Value | None:
    value = node.inputs[index] if len(node.inputs) > index else None
    return value if value is not None and value.name else None


def _width(value: ir.Value) -> int | None:
    shape = value.shape
    return shape[-1] if shape is not None and len(shape) >= 1 and isinstance(shape[-1], int) else None


def _norm_weight(gqa: ir.Node, index: int) -> tuple[ir.Value, int] | None:
    """(weight, head_size) of input ``index``, None when absent; MatchFailure.refuse when not a constant vector."""
    weight = _present(gqa, index)
    if weight is None:
        return None
    tensor = weight.const_value
    if tensor is None or len(tensor.shape) != 1 or not isinstance(tensor.shape[0], int):
        raise MatchFailure.refuse(f"norm weight {weight.name!r} (input {index}) is not a constant 1-D tensor",
                                  gqa)
    return weight, int(tensor.shape[0])


class _Builder:
    """Nodes for one GQA, created with onnx_ir's tape and inserted before it; node names derived from the GQA's
    (made unique in the graph: two GQAs under one name prefix, or unnamed, would otherwise derive the same ones)."""

    def __init__(self, gqa: ir.Node, fresh: FreshNames):
        self.gqa = gqa
        # the element type of q/k/v: GQA's T (query, key, past_key/past_value, cos/sin caches), from whichever of
        # them carries one (a graph saved without value_info leaves intermediate values untyped)
        self.dtype = next((v.dtype for v in (_present(gqa, i) for i in (0, 1, 2, 3, 4, 7, 8)) if v is not None
                           and v.dtype is not None), None)
        self.tape = ir.tape.Tape()
        self.base = place_of(gqa).rsplit("/", 1)[0]
        self.fresh = fresh

    def name(self, suffix: str) -> str:
        return self.fresh(f"{self.base}/{suffix}")

    def const(self, name: str, values: list[int]) -> ir.Value:
        return self.tape.op("Constant", [], {"value": ir.tensor(np.array(values, dtype=np.int64), name=name)},
                            name=self.name(f"{name}/Constant"))

    def rms_norm(self, x: ir.Value, weight: ir.Value, heads: int, head_size: int, eps: float, tag: str) -> ir.Value:
        per_head = self.tape.op("Reshape", [x, self.const(f"{tag}/shape_heads", [0, -1, head_size])],
                                name=self.name(f"{tag}/Reshape_1"))
        normed = self.tape.op("SimplifiedLayerNormalization", [per_head, weight],
                              {"epsilon": eps, "axis": -1, "stash_type": 1},
                              name=self.name(f"{tag}/SimplifiedLayerNormalization"))
        out = self.tape.op("Reshape", [normed, self.const(f"{tag}/shape_hidden", [0, -1, heads * head_size])],
                           name=self.name(f"{tag}/Reshape_2"))
        for v, dims in ((per_head, None), (normed, None), (out, heads * head_size)):
            self._type(v, x.dtype)
            if dims is not None and x.shape is not None and len(x.shape) == 3:
                v.shape = ir.Shape([x.shape[0], x.shape[1], dims])
        return out

    def split3(self, packed: ir.Value, sizes: list[int]) -> list[ir.Value]:
        outs = self.tape.op_multi_out("Split", [packed, self.const("qkv_split/sizes", sizes)], {"axis": -1},
                                      num_outputs=3, name=self.name("qkv_split/Split"))
        for v, width in zip(outs, sizes):
            self._type(v, packed.dtype)
            if packed.shape is not None and len(packed.shape) == 3:
                v.shape = ir.Shape([packed.shape[0], packed.shape[1], width])
        return list(outs)

    def concat(self, parts: list[ir.Value], like: ir.Value) -> ir.Value:
        out = self.tape.op("Concat", parts, {"axis": -1}, name=self.name("qkv_concat/Concat"))
        self._type(out, like.dtype)
        out.shape = like.shape
        return out

    def _type(self, value: ir.Value, dtype: ir.DataType | None) -> None:
        """Give ``value`` ``dtype`` (else the GQA's T); a dtype of None is left unset (onnx_ir cannot save it)."""
        dtype = dtype if dtype is not None else self.dtype
        if dtype is not None:
            value.dtype = dtype

    def insert(self, graph: ir.Graph) -> None:
        graph.insert_before(self.gqa, self.tape.nodes)


class UnfuseGQAQKNormPass(RopePass):
    name = "unfuse-gqa-qk-norm"
    summary = ("move GQA's fused q/k RMSNorm (inputs 14/15, qk_norm_epsilon) out as SimplifiedLayerNormalization "
               "per head: GQA with ≤ 14 inputs, loadable by onnxruntime-webgpu 1.27")

    def apply(self, model: ir.Model, report: PassReport) -> None:
        gqas = [n for n in nodes_of(model.graph, "GroupQueryAttention", MS_DOMAIN) if len(n.inputs) > Q_NORM_INPUT]
        fused = [n for n in gqas if _present(n, Q_NORM_INPUT) or _present(n, K_NORM_INPUT)]
        if not fused:
            report.not_matched("<model>", "no GroupQueryAttention with fused q/k-norm weights (inputs 14/15)")
            return
        fresh = FreshNames(model.graph)
        for gqa in fused:
            if gqa.graph is not model.graph:
                report.not_matched(gqa, "inside a subgraph: not unfused")
                continue
            try:
                self._unfuse(model.graph, gqa, fresh)
            except MatchFailure as failure:
                report.record(failure, gqa.name or None)
                continue
            report.rewritten(gqa,
                             "fused q/k RMSNorm moved out as SimplifiedLayerNormalization per head "
                             f"(GQA now has {len(gqa.inputs)} inputs)")

    def _unfuse(self, graph: ir.Graph, gqa: ir.Node, fresh: FreshNames) -> None:
        heads, kv_heads = int(attr(gqa, "num_heads", 0) or 0), int(attr(gqa, "kv_num_heads", 0) or 0)
        eps = float(attr(gqa, "qk_norm_epsilon", 1e-6))
        q_norm, k_norm = _norm_weight(gqa, Q_NORM_INPUT), _norm_weight(gqa, K_NORM_INPUT)
        # onnxruntime (the plugin's WebGPU kernel, the only one that runs inputs 14/15) rejects a GQA with one norm
        # weight or with do_rotary != 1: the input runs nowhere, and unfusing would make a model out of it that
        # computes something no runtime defines (the norm after an external rotation)
        if q_norm is None or k_norm is None:
            raise MatchFailure.refuse(f"only the {'q' if k_norm is None else 'k'}-norm weight is set: onnxruntime "
                                      "requires both q_norm_weight and k_norm_weight (the input loads nowhere)", gqa)
        if not flag(gqa, "do_rotary"):
            raise MatchFailure.refuse("q/k-norm weights with do_rotary != 1: onnxruntime requires do_rotary=1 for "
                                      "them (the input loads nowhere)", gqa)
        head_size = q_norm[1]
        if q_norm[1] != k_norm[1]:
            raise MatchFailure.refuse(f"q-norm and k-norm weights differ in length ({q_norm[1]} vs {k_norm[1]})",
                                      gqa)
        if not heads or not kv_heads:
            raise MatchFailure.refuse("num_heads / kv_num_heads missing", gqa)
        query = gqa.inputs[0]
        if query is None:
            raise MatchFailure.absent("GroupQueryAttention without a query input", gqa)
        build = _Builder(gqa, fresh)
        packed = _present(gqa, 1) is None
        if packed:
            width = _width(query)
            if width != (heads + 2 * kv_heads) * head_size:
                raise MatchFailure.refuse(f"packed QKV {query.name!r} has width {width}, not (num_heads + 2 × "
                                          f"kv_num_heads) × head_size = {(heads + 2 * kv_heads) * head_size}", gqa)
            q, k, v = build.split3(query, [heads * head_size, kv_heads * head_size, kv_heads * head_size])
        else:
            q, k = query, gqa.inputs[1]
            assert k is not None
            for value, n in ((q, heads), (k, kv_heads)):
                width = _width(value)
                if width is not None and width != n * head_size:
                    raise MatchFailure.refuse(f"{value.name!r} has width {width}, not {n} heads × {head_size}",
                                              gqa)
        if q_norm:
            q = build.rms_norm(q, q_norm[0], heads, head_size, eps, "q_norm")
        if k_norm:
            k = build.rms_norm(k, k_norm[0], kv_heads, head_size, eps, "k_norm")
        if packed:
            q = build.concat([q, k, v], query)
        build.insert(graph)
        gqa.replace_input_with(0, q)
        if not packed:
            gqa.replace_input_with(1, k)
        for index in (Q_NORM_INPUT, K_NORM_INPUT):
            if len(gqa.inputs) > index:
                gqa.replace_input_with(index, None)
        last = max((i for i, v in enumerate(gqa.inputs) if v is not None and v.name), default=0)
        gqa.resize_inputs(last + 1)
        gqa.attributes.pop("qk_norm_epsilon", None)
