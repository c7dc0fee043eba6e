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

**Rule 2: int64 position movement.** Other Shape→Memcpy paths in the corpus are mRoPE position math (builder 0.15
Qwen2.5-VL/Qwen3.5 graphs fed 3D ``position_ids``, and ``lower-mrope``'s output): ``Gather``/``Squeeze``/
``Reshape``/``Transpose`` of int64 positions, which have no WebGPU int64 kernel, between GPU work. Driven by the
static placement prediction (capture on), :func:`narrow_int64_movement` casts such a node's int64 data inputs to int32
(``Cast`` int64→int32 has a WebGPU kernel under capture), runs it in int32 and casts the result back to int64, and
re-predicts until no Memcpy can be removed this way; an int64 ``Shape`` of a tensor also read on the GPU becomes
``Shape(Relu(Cast<float>(x)))`` (same dims; onnxruntime reads ``Shape(Cast(x))`` as ``Shape(x)``, not through Relu).
Only pure data movement is narrowed (no arithmetic): exact whenever the values fit in int32 (positions do).
Measured: the three legacy 3D-position graphs go from 7–11 Memcpy to 0, with bit-identical WebGPU outputs.

**Refuses** (graph unchanged there, reason in the report): a mask that is not a rank-2 integer graph input;
``Shape`` with ``start``/``end``; ``Gather`` of another dimension than 1; a ``ReduceSum`` over other axes or with
``keepdims``; a Sub of something other than 1; the two chains reading different masks. GQA length inputs computed
otherwise are "not matched" with what was found.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import MS_DOMAIN, nodes_of
from rope_passes.analysis.patterns import SeqlensFromMaskSum, TotalSeqFromMaskShape
from rope_passes.analysis.placement import (
    WEBGPU_KERNELS,
    predict_placement,
    value_dtype,
)
from rope_passes.passes.base import RopePass
from rope_passes.report import PassReport

SEQLENS_K, TOTAL_SEQ = 5, 6


class _Refusal(Exception):
    pass


_TOTAL_SEQ = TotalSeqFromMaskShape()
_SEQLENS_K = SeqlensFromMaskSum()


def _match(pattern, model: ir.Model, value: ir.Value, what: str) -> tuple[ir.Value, list[ir.Node]]:
    """(mask, the chain's nodes); raises _Refusal (structure there, unsound) or ValueError (structure absent)."""
    found = pattern.match_value(model, value, what)
    if found.refused:
        raise _Refusal(found.reason)
    if not found.ok:
        raise ValueError(found.reason)
    return found.bindings["mask"], found.nodes


def match_total_seq(model: ir.Model, value: ir.Value) -> tuple[ir.Value, list[ir.Node]]:
    """``Cast<int32>(Gather(Shape(M), 1))`` → (M, the chain's nodes). Raises _Refusal/ValueError."""
    return _match(_TOTAL_SEQ, model, value, "total_sequence_length")


def match_seqlens_k(model: ir.Model, value: ir.Value) -> tuple[ir.Value, list[ir.Node]]:
    """``Cast<int32>(Sub(ReduceSum(M, axes=[1], keepdims=0), 1))`` → (M, nodes). Raises _Refusal/ValueError."""
    return _match(_SEQLENS_K, model, value, "seqlens_k")


class TotalSeqOnGpuPass(RopePass):
    name = "total-seq-on-gpu"
    summary = ("compute GQA seqlens_k/total_sequence_length from the mask on the GPU (int32, no Shape) and move int64 "
               "position movement to the GPU in int32: no Memcpy")

    def apply(self, model: ir.Model, report: PassReport) -> None:
        graph = model.graph
        gqas = nodes_of(graph, "GroupQueryAttention", MS_DOMAIN)
        if not gqas:
            report.not_matched("<model>", "no com.microsoft::GroupQueryAttention node")
        by_pair: dict[tuple[int, int], tuple[ir.Value | None, ir.Value]] = {}
        failed: set[tuple[int, int]] = set()  # one finding per (seqlens_k, total) pair, not per layer
        stale: list[ir.Node] = []
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
                    mask, old_nodes = match_total_seq(model, total)
                    try:
                        seq_mask, seq_nodes = match_seqlens_k(model, seqlens)
                        old_nodes = old_nodes + seq_nodes
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
                stale.extend(old_nodes)
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
        # the old chains, where nothing else reads them (a dead Shape chain still gets placed, with its Memcpy)
        for node in stale:
            if node.graph is graph and not any(o.uses() or o.is_graph_output() for o in node.outputs):
                graph.remove(node, safe=True)
        narrow_int64_movement(model, report)

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


# ----------------------------------------------------------------------------------------------------------------
# Rule 2: int64 index movement that lands on CPU only for want of int64 kernels
# ----------------------------------------------------------------------------------------------------------------

#: ops that only move or select int64 values (no arithmetic): narrowing them to int32 is exact whenever the values fit
#: in int32 (positions and token indices do: onnxruntime's GQA itself keeps lengths in int32)
MOVEMENT_OPS = frozenset({"Gather", "Transpose", "Reshape", "Squeeze", "Unsqueeze", "Slice", "Concat", "Expand",
                          "Tile", "Identity", "Flatten", "Shape"})
#: ops whose output does not carry the input's type (Shape: always int64, already right): no cast back
_OUTPUT_KEEPS_TYPE = frozenset({"Shape"})
#: the kernel a narrowed op needs (Shape reads a float Relu output, see _shape_from_gpu)
_NARROW_TYPE = {"Shape": "FLOAT"}


def _data_indices(node: ir.Node) -> list[int]:
    if node.op_type == "Concat":
        return list(range(len(node.inputs)))
    return [0]


def narrow_int64_movement(model: ir.Model, report: PassReport, max_rounds: int = 256) -> int:
    """Move int64 data movement that sits on CPU between GPU work (a Memcpy on each side) to the GPU in int32.

    Driven by the static placement prediction with capture on: for a Memcpy whose CPU end is a movement op over int64
    (``Gather``/``Reshape``/``Transpose``/``Squeeze``/...; no WebGPU int64 kernel, an int32 one exists), its int64
    data inputs are cast to int32 (``Cast`` int64→int32 has a WebGPU kernel under capture), the op runs in int32 and
    its output is cast back to int64, so every consumer sees the same type and values. Only nodes whose data inputs
    are GPU tensors, graph inputs or constants are narrowed (a CPU data input would just move the Memcpy); the
    prediction is re-run after each change until no Memcpy can be removed this way. Returns the nodes narrowed.
    """
    graph = model.graph
    narrowed = 0
    refused: set[int] = set()
    for _ in range(max_rounds):
        placement = predict_placement(model, graph_capture=True)
        if not placement.memcpy or not placement.loads:
            break
        by_name = {n.name: n for n in graph if n.name}
        values = {v.name: v for n in graph for v in n.outputs if v.name}
        values.update({v.name: v for v in graph.inputs if v.name})
        candidates: list[ir.Node] = []
        for m in placement.memcpy:
            value = values.get(m.tensor)
            if value is None:
                continue
            if m.kind == "MemcpyFromHost" and value.producer() is not None:
                # the producer, then its CPU ancestors through data inputs (narrowing starts where data is on GPU)
                stack = [value.producer()]
                while stack:
                    node = stack.pop(0)
                    if (node.name or "") not in placement.cpu_nodes or node in candidates:
                        continue
                    candidates.append(node)
                    stack.extend(node.inputs[i].producer() for i in _data_indices(node)
                                 if i < len(node.inputs) and node.inputs[i] is not None
                                 and node.inputs[i].producer() is not None)
            else:  # ToHost, or a graph input read on both sides: the CPU readers
                candidates.extend(u for u, _ in value.uses() if (u.name or "") in placement.cpu_nodes)
        cpu_outputs = {id(v) for n in graph if (n.name or "") in placement.cpu_nodes for v in n.outputs}
        node = next((c for c in candidates if id(c) not in refused and c.name in by_name
                     and _narrowable(c, cpu_outputs, WEBGPU_KERNELS, value_dtype)), None)
        if node is None:
            break
        _narrow(graph, node)
        refused.add(id(node))
        narrowed += 1
        report.rewritten(node.name or node.op_type, f"int64 {node.op_type} moved to the GPU in int32 (no WebGPU "
                         "int64 kernel; Cast int64→int32 before, int32→int64 after)")
    return narrowed


def _narrowable(node: ir.Node, cpu_outputs: set[int], kernels, value_dtype) -> bool:
    if node.op_type not in MOVEMENT_OPS or node.domain not in ("", "ai.onnx"):
        return False
    if "on" not in kernels.get(("", node.op_type, _NARROW_TYPE.get(node.op_type, "INT32")), frozenset()):
        return False
    data = [node.inputs[i] for i in _data_indices(node) if i < len(node.inputs) and node.inputs[i] is not None]
    if not data or any(value_dtype(v) != "INT64" for v in data):
        return False
    return not any(id(v) in cpu_outputs for v in data)


def _shape_from_gpu(graph: ir.Graph, node: ir.Node, base: str) -> None:
    """``Shape(x)`` of an int64 ``x`` → ``Shape(Relu(Cast<float>(x)))``: same dims, the Shape kernel runs on WebGPU
    (its output is in CPU memory anyway) and ``x`` is no longer read on CPU. onnxruntime sees through Cast and Identity
    (``Shape(Cast(x))`` becomes ``Shape(x)`` again), not through Relu; the values never matter, only the dims."""
    value = node.inputs[0]
    cast = ir.node("Cast", [value], attributes={"to": ir.DataType.FLOAT}, name=f"{base}/as_float")
    cast.outputs[0].name = f"{base}/as_float"
    relu = ir.node("Relu", [cast.outputs[0]], name=f"{base}/keep")
    relu.outputs[0].name = f"{base}/keep"
    for v in (cast.outputs[0], relu.outputs[0]):
        v.dtype, v.shape = ir.DataType.FLOAT, value.shape
    graph.insert_before(node, [cast, relu])
    node.replace_input_with(0, relu.outputs[0])


def _index(graph: ir.Graph, node: ir.Node) -> int:
    return next(k for k, n in enumerate(graph) if n is node)


def _narrow(graph: ir.Graph, node: ir.Node) -> None:
    base = f"/rope_passes/int32/{node.name or node.op_type}"
    if node.op_type == "Shape":
        _shape_from_gpu(graph, node, base)
        return
    for i in _data_indices(node):
        value = node.inputs[i]
        if value is None:
            continue
        # one shared Cast per value: onnxruntime drops a Cast read only by Shape (Shape(Cast(x)) -> Shape(x), which
        # puts the int64 Shape back on CPU); shared with the other narrowed readers it stays
        shared = next((u for u, _ in value.uses() if u.op_type == "Cast" and u.attributes.get("to") is not None
                       and u.attributes["to"].value == ir.DataType.INT32.value and u.graph is graph), None)
        if shared is not None:
            node.replace_input_with(i, shared.outputs[0])
            if graph.node(0) is not None and _index(graph, shared) > _index(graph, node):
                graph.remove(shared)
                graph.insert_before(node, shared)
            continue
        cast = ir.node("Cast", [value], attributes={"to": ir.DataType.INT32}, name=f"{base}/in{i}")
        cast.outputs[0].name = f"{base}/in{i}_int32"
        cast.outputs[0].dtype, cast.outputs[0].shape = ir.DataType.INT32, value.shape
        graph.insert_before(node, cast)
        node.replace_input_with(i, cast.outputs[0])
    if node.op_type in _OUTPUT_KEEPS_TYPE:
        return
    for j, out in enumerate(node.outputs):
        users = list(out.uses())
        was_output = out.is_graph_output()
        name, shape = out.name, out.shape
        out.name = f"{base}/out{j}_int32"
        out.dtype = ir.DataType.INT32
        back = ir.node("Cast", [out], attributes={"to": ir.DataType.INT64}, name=f"{base}/out{j}")
        back.outputs[0].name, back.outputs[0].dtype, back.outputs[0].shape = name, ir.DataType.INT64, shape
        graph.insert_after(node, back)
        for user, index in users:
            user.replace_input_with(index, back.outputs[0])
        if was_output:
            graph.outputs[graph.outputs.index(out)] = back.outputs[0]
