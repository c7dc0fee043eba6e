"""``total-seq-on-gpu``: compute GroupQueryAttention's ``seqlens_k`` and ``total_sequence_length`` on the GPU.

**Rewrites.** onnxruntime-genai's builder (without ``enable_webgpu_graph``) derives GQA's two length inputs from the
attention mask ``M [batch, total]`` (int64) as

* ``seqlens_k = Cast<int32>(Sub(ReduceSum(M, axes=[1], keepdims=0), 1))`` and
* ``total_sequence_length = Cast<int32>(Gather(Shape(M), 1))``.

onnxruntime-webgpu 1.27 has no int64 ``ReduceSum``/``Sub``/``Gather`` kernels and ``Shape`` writes to CPU memory, so
both land on CPU and two Memcpy nodes feed GQA: a WebGPU session with ``enableGraphCapture=1`` is refused. The pass
replaces both chains with what the builder emits for graph capture (its ``_graph`` variants)::

    m32 = Cast<int32>(M);  s = ReduceSum(m32, axes=[1], keepdims=0)
    seqlens_k = Sub(s, 1);  total_sequence_length = ReduceMax(s, keepdims=0)

All int32, all with WebGPU kernels, no ``Shape``: 0 Memcpy. The old nodes are left for ``cleanup``.

**Exact when** (checked where possible, stated where not): ``seqlens_k`` is bit-identical (same sum, int32 is wide
enough for any mask length onnxruntime accepts). ``total_sequence_length`` becomes the largest row sum of ``M``
instead of its width; the two are equal when at least one row of the mask has no padding, which holds for every
mask onnxruntime-genai and Hugging Face build (the longest sequence of a batch is all ones). Under graph capture,
where genai binds the mask at its maximum length with zeros past the current one, the row sum is the *right*
value and the width is not — the reason the builder computes it this way.

**Refuses** (graph unchanged there, reason in the report): a mask that is not a rank-2 integer graph input;
``Shape`` with ``start``/``end``; ``Gather`` of another dimension than 1; a ``ReduceSum`` over other axes or with
``keepdims``; a Sub of something other than 1; the two chains reading different masks. GQA length inputs computed
otherwise are "not matched" with what was found.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import MS_DOMAIN, attr, const_array, nodes_of
from rope_passes.passes.base import RopePass
from rope_passes.report import PassReport

SEQLENS_K, TOTAL_SEQ = 5, 6


class _Refusal(Exception):
    pass


def _single_int(value: ir.Value | None) -> int | None:
    arr = const_array(value)
    if arr is None or arr.size != 1 or arr.dtype.kind not in "iu":
        return None
    return int(arr.reshape(-1)[0])


def _is_cast_to_int32(node: ir.Node | None) -> bool:
    return node is not None and node.op_type == "Cast" and attr(node, "to") == ir.DataType.INT32.value


def _mask_input(value: ir.Value, graph: ir.Graph) -> ir.Value:
    if not value.is_graph_input():
        raise _Refusal(f"{value.name!r} is not a graph input (the attention mask is expected as one)")
    if value.dtype not in (ir.DataType.INT64, ir.DataType.INT32):
        raise _Refusal(f"mask {value.name!r} has dtype {value.dtype}, expected int64/int32")
    if value.shape is not None and len(value.shape) != 2:
        raise _Refusal(f"mask {value.name!r} has rank {len(value.shape)}, expected [batch, total_sequence_length]")
    return value


def match_total_seq(value: ir.Value, graph: ir.Graph) -> tuple[ir.Value, list[ir.Node]]:
    """``Cast<int32>(Gather(Shape(M), 1))`` → (M, the chain's nodes). Raises _Refusal/ValueError."""
    cast = value.producer()
    if not _is_cast_to_int32(cast):
        raise ValueError(f"total_sequence_length comes from {cast.op_type if cast else 'a graph input'}, "
                         "not Cast<int32>(Gather(Shape(mask), 1))")
    gather = cast.inputs[0].producer()
    if gather is None or gather.op_type != "Gather":
        raise ValueError("total_sequence_length's Cast does not read a Gather")
    shape = gather.inputs[0].producer()
    if shape is None or shape.op_type != "Shape":
        raise ValueError("total_sequence_length's Gather does not read a Shape")
    if attr(shape, "start", 0) != 0 or attr(shape, "end") is not None:
        raise _Refusal(f"Shape {shape.name!r} has start/end attributes")
    index = _single_int(gather.inputs[1])
    if attr(gather, "axis", 0) != 0 or index not in (1, -1):
        raise _Refusal(f"Gather {gather.name!r} reads dimension {index}, not the mask's dimension 1")
    mask = _mask_input(shape.inputs[0], graph)
    return mask, [cast, gather, shape]


def match_seqlens_k(value: ir.Value, graph: ir.Graph) -> tuple[ir.Value, list[ir.Node]]:
    """``Cast<int32>(Sub(ReduceSum(M, axes=[1], keepdims=0), 1))`` → (M, nodes). Raises _Refusal/ValueError."""
    cast = value.producer()
    if not _is_cast_to_int32(cast):
        raise ValueError(f"seqlens_k comes from {cast.op_type if cast else 'a graph input'}, "
                         "not Cast<int32>(Sub(ReduceSum(mask), 1))")
    sub = cast.inputs[0].producer()
    if sub is None or sub.op_type != "Sub":
        raise ValueError("seqlens_k's Cast does not read a Sub")
    if _single_int(sub.inputs[1]) != 1:
        raise _Refusal(f"Sub {sub.name!r} subtracts something other than the constant 1")
    reduce = sub.inputs[0].producer()
    if reduce is None or reduce.op_type != "ReduceSum":
        raise ValueError("seqlens_k's Sub does not read a ReduceSum")
    axes = const_array(reduce.inputs[1]) if len(reduce.inputs) > 1 else None
    axes_attr = attr(reduce, "axes")
    axes_list = [int(a) for a in (axes.reshape(-1) if axes is not None else (axes_attr or []))]
    if axes_list not in ([1], [-1]) or attr(reduce, "keepdims", 1) != 0:
        raise _Refusal(f"ReduceSum {reduce.name!r} reduces axes {axes_list} with keepdims="
                       f"{attr(reduce, 'keepdims', 1)}, expected axes [1], keepdims 0")
    mask = _mask_input(reduce.inputs[0], graph)
    return mask, [cast, sub, reduce]


class TotalSeqOnGpuPass(RopePass):
    name = "total-seq-on-gpu"
    summary = "compute GQA seqlens_k/total_sequence_length from the mask on the GPU (int32, no Shape): no Memcpy"

    def apply(self, model: ir.Model, report: PassReport) -> None:
        graph = model.graph
        gqas = nodes_of(graph, "GroupQueryAttention", MS_DOMAIN)
        if not gqas:
            report.not_matched("<model>", "no com.microsoft::GroupQueryAttention node")
            return
        by_pair: dict[tuple[int, int], tuple[ir.Value | None, ir.Value]] = {}
        failed: set[tuple[int, int]] = set()  # one finding per (seqlens_k, total) pair, not per layer
        for gqa in gqas:
            if len(gqa.inputs) <= TOTAL_SEQ or gqa.inputs[SEQLENS_K] is None or gqa.inputs[TOTAL_SEQ] is None:
                report.not_matched(gqa.name or "GroupQueryAttention", "GQA without seqlens_k/total_sequence_length")
                continue
            seqlens, total = gqa.inputs[SEQLENS_K], gqa.inputs[TOTAL_SEQ]
            key = (id(seqlens), id(total))
            if key in failed:  # same length inputs as a GQA already reported
                continue
            if key in by_pair:
                new_seqlens, new_total = by_pair[key]
            else:
                try:
                    mask, _ = match_total_seq(total, graph)
                    try:
                        seq_mask, _ = match_seqlens_k(seqlens, graph)
                    except ValueError:
                        seq_mask = None  # seqlens_k already computed some other way: leave it, fix total only
                    if seq_mask is not None and seq_mask is not mask:
                        raise _Refusal(f"seqlens_k reads mask {seq_mask.name!r} but total_sequence_length reads "
                                       f"{mask.name!r}")
                except _Refusal as exc:
                    report.refused(gqa.name or "GroupQueryAttention", str(exc))
                    failed.add(key)
                    continue
                except ValueError as exc:
                    report.not_matched(gqa.name or "GroupQueryAttention", str(exc))
                    failed.add(key)
                    continue
                new_seqlens, new_total = self._build(graph, mask, seqlens if seq_mask is not None else None, total)
                by_pair[key] = (new_seqlens, new_total)
                report.rewritten(
                    total.name or "total_sequence_length",
                    f"seqlens_k/total_sequence_length from int32 ReduceSum/ReduceMax of {mask.name!r} (no Shape)",
                    mask=mask.name, seqlens_k=new_seqlens.name if new_seqlens is not None else seqlens.name,
                    total_sequence_length=new_total.name,
                    seqlens_k_rewritten=seq_mask is not None,
                )
            if new_seqlens is not None:
                gqa.replace_input_with(SEQLENS_K, new_seqlens)
            gqa.replace_input_with(TOTAL_SEQ, new_total)

    @staticmethod
    def _build(graph: ir.Graph, mask: ir.Value, old_seqlens: ir.Value | None,
               old_total: ir.Value) -> tuple[ir.Value | None, ir.Value]:
        prefix = "/rope_passes/total_seq_on_gpu"
        axes = ir.Value(name=f"{prefix}/axes", const_value=ir.tensor(np.array([1], dtype=np.int64)))
        one = ir.Value(name=f"{prefix}/one", const_value=ir.tensor(np.array([1], dtype=np.int32)))
        for init in (axes, one):
            init.shape = ir.Shape(init.const_value.shape)
            init.dtype = init.const_value.dtype
            graph.register_initializer(init)
        cast = ir.node("Cast", [mask], attributes={"to": ir.DataType.INT32}, name=f"{prefix}/Cast")
        cast.outputs[0].name = f"{prefix}/mask_int32"
        reduce = ir.node("ReduceSum", [cast.outputs[0], axes], attributes={"keepdims": 0}, name=f"{prefix}/ReduceSum")
        reduce.outputs[0].name = f"{prefix}/row_lengths"
        sub = ir.node("Sub", [reduce.outputs[0], one], name=f"{prefix}/Sub")
        sub.outputs[0].name = f"{prefix}/seqlens_k"
        rmax = ir.node("ReduceMax", [reduce.outputs[0]], attributes={"keepdims": 0}, name=f"{prefix}/ReduceMax")
        rmax.outputs[0].name = f"{prefix}/total_sequence_length"
        batch = mask.shape[0] if mask.shape is not None else None
        for value, shape in ((cast.outputs[0], mask.shape), (reduce.outputs[0], ir.Shape([batch])),
                             (sub.outputs[0], ir.Shape([batch])), (rmax.outputs[0], ir.Shape([]))):
            value.dtype = ir.DataType.INT32
            value.shape = shape
        new_nodes = [cast, reduce, sub, rmax]
        # insert right after the mask's first reader so the graph stays topologically sorted
        first_user = next((n for n in graph if any(v is mask for v in n.inputs)), None)
        if first_user is not None:
            graph.insert_before(first_user, new_nodes)
        else:
            graph.extend(new_nodes)
        if old_seqlens is None:  # seqlens_k is computed some other way: keep it, only total moves
            graph.remove(sub, safe=True)
            return None, rmax.outputs[0]
        return sub.outputs[0], rmax.outputs[0]
