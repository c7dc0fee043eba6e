"""``narrow-int64``: run int64 position movement that sits on CPU between GPU work on the GPU, in int32.

**Rewrites.** onnxruntime-webgpu 1.27 has no int64 kernels for data movement (``Gather``/``Squeeze``/``Reshape``/
``Transpose``/...), so int64 position math lands on CPU with a Memcpy on each side and a WebGPU session with
``enableGraphCapture=1`` is refused. In the corpus these are mRoPE positions: builder 0.15 Qwen2.5-VL/Qwen3.5 graphs
fed 3D ``position_ids`` (``Gather(position_ids, axis)`` → ``Squeeze``, ``Shape → Range → Reshape`` token index) and
``lower-mrope``'s output (``Transpose``/``Gather``/``Reshape`` of ``position_ids``). Driven by the static placement
prediction with capture on (:func:`rope_passes.analysis.placement.predict_placement`), the pass takes the CPU end of
each predicted Memcpy (and its CPU ancestors through data inputs) and, for a pure movement op whose data inputs are
GPU tensors, graph inputs or constants:

* casts its int64 data inputs to int32 (``Cast`` int64→int32 has a WebGPU kernel under capture; one shared ``Cast``
  per value), runs the op in int32 and casts the result back to int64, so every consumer sees the same type and
  values;
* an int64 ``Shape`` of a tensor also read on the GPU becomes ``Shape(Relu(Cast<float>(x)))``: the same dims, the
  WebGPU ``Shape`` kernel, and ``x`` no longer read on CPU (onnxruntime reads ``Shape(Cast(x))`` as ``Shape(x)``,
  not through ``Relu``; the values never matter, only the dims).

It re-predicts after each change and stops when no Memcpy can be removed this way. In the ``webgpu-graph`` preset it
runs right after ``total-seq-on-gpu``, on the graph the earlier passes left (placement is a property of the whole
graph).

**Exact when** the values fit in int32: only movement ops are narrowed (``MOVEMENT_OPS``), never arithmetic, and
each only when the interval of every data input, from its cone (:mod:`rope_passes.proofs.intervals`, constants read
by value through :mod:`rope_passes.proofs.constants`), lies in int32. The analysis takes a graph input's integer values,
every tensor dimension and every product of distinct dimensions of one tensor to fit int32 (``FITS_INT32``: positions, token indices and lengths do; onnxruntime's GQA
keeps lengths in int32), and the report names the inputs the rewrite relies on in a note (a ``position_ids`` of
2^32 + p would be read as p where the original's Gather failed). Values the graph computes are not the caller's: a
node reading a ``Range`` from a large constant (int64 ``Range`` runs on WebGPU), or any value the graph's arithmetic
may take out of int32, is refused with the node. Measured:
legacy/qwen25_vl/cpu_fp32, webgpu_fp16_graph and legacy/qwen35/cpu_fp32 (3D positions, not folded) go from 11 / 9 / 7
Memcpy to 0, with bit-identical WebGPU outputs.

A model whose GroupQueryAttention is bfloat16 gets one note (:data:`rope_passes.analysis.bf16.BF16_GQA_NOTE`, as
``total-seq-on-gpu``: no bf16 GQA kernel in either WebGPU runtime) and no rewrite.

**Refuses** (left on CPU, named in the report): a node of that form whose data input is not proved to fit int32.
Not matched: a Memcpy whose CPU end is not an int64 movement op with GPU/constant data inputs (narrowing there would
only move the Memcpy), no Memcpy predicted, a model that does not load on onnxruntime-webgpu, or no Memcpy this pass
can remove (the reason says which).
"""

from __future__ import annotations

import onnx_ir as ir

from rope_passes.analysis.bf16 import note_bf16
from rope_passes.analysis.graph import ancestors
from rope_passes.analysis.placement import Placement, predict_placement, value_dtype
from rope_passes.passes._rewrite import NodeTape, opset_of
from rope_passes.passes.base import RopePass
from rope_passes.proofs.intervals import FITS_INT32, Intervals
from rope_passes.report import MatchFailure, PassReport, name_of
from rope_passes.webgpu_kernels import KernelTable

#: ops that only move or select int64 values (no arithmetic): narrowing them to int32 is exact whenever the values fit
#: in int32 (positions and token indices do: onnxruntime's GQA itself keeps lengths in int32)
MOVEMENT_OPS = frozenset({"Gather", "Transpose", "Reshape", "Squeeze", "Unsqueeze", "Slice", "Concat", "Expand",
                          "Tile", "Identity", "Flatten", "Shape"})
#: ops whose output does not carry the input's type (Shape: always int64, already right): no cast back
_OUTPUT_KEEPS_TYPE = frozenset({"Shape"})
#: the kernel a narrowed op needs (Shape reads a float Relu output, see _shape_from_gpu)
_NARROW_TYPE = {"Shape": "FLOAT"}
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
#: placement predictions at most (one per narrowed node, plus the last)
MAX_ROUNDS = 256


class NarrowInt64Pass(RopePass):
    name = "narrow-int64"
    summary = ("move int64 position Gather/Reshape/Transpose/... stuck on CPU between GPU work to the GPU in int32: "
               "no Memcpy")

    def apply(self, model: ir.Model, report: PassReport) -> None:
        if note_bf16(model, report):  # no bf16 GQA kernel: moving int64 plumbing cannot help
            return
        narrowed: list[ir.Node] = []
        done: set[int] = set()  # narrowed, or refused (each refused once)
        target = self.context.runtime
        for _ in range(MAX_ROUNDS):
            # the first round: the pipeline's verdict of this graph where it has one (capture_verdict is this)
            placement = (self.context.take_verdict(model, target.name)
                         or predict_placement(model, graph_capture=True, runtime=target))
            if not placement.loads:
                why = f"the model does not load on {target.label} ({placement.load_error})"
                break
            if not placement.memcpy:
                why = "no Memcpy predicted under graph capture"
                break
            node = _next_node(model.graph, placement, done, target.kernels)
            if isinstance(node, tuple):  # a candidate whose values are not proved to fit int32
                refused, failure = node
                report.record(failure)
                done.add(id(refused))
                continue
            if node is None:
                why = (f"{len(placement.memcpy)} Memcpy predicted, none at an int64 movement op whose data inputs "
                       "are GPU tensors, graph inputs or constants")
                break
            _narrow(model.graph, node)
            done.add(id(node))
            narrowed.append(node)
            report.rewritten(node, f"int64 {node.op_type} moved to the GPU in int32 (no WebGPU "
                             "int64 kernel; Cast int64→int32 before, int32→int64 after)")
        else:
            why = f"stopped after {MAX_ROUNDS} rounds"
        if not narrowed:
            report.not_matched("<model>", why)
        elif (note := _input_note(model.graph, narrowed)) is not None:
            report.note("<model>", note)


def _data_indices(node: ir.Node) -> list[int]:
    if node.op_type == "Concat":
        return list(range(len(node.inputs)))
    return [0]


def _next_node(graph: ir.Graph, placement: Placement, done: set[int],
               kernels: KernelTable) -> ir.Node | tuple[ir.Node, MatchFailure] | None:
    """The first CPU node at a predicted Memcpy that can run in int32 on the GPU (not narrowed before), or None; a
    (node, MatchFailure.refuse) when that node has the form but its values are not proved to fit int32.

    For a MemcpyFromHost: its producer, then that node's CPU ancestors through data inputs (narrowing starts where the
    data is on the GPU); for a MemcpyToHost or a graph input read on both sides: the value's CPU readers.
    """
    by_name = {n.name: n for n in graph if n.name}
    values = {v.name: v for n in graph for v in n.outputs if v.name}
    values.update({v.name: v for v in graph.inputs if v.name})
    candidates: list[ir.Node] = []
    for m in placement.memcpy:
        value = values.get(m.tensor)
        if value is None:
            continue
        if m.kind == "MemcpyFromHost" and value.producer() is not None:
            stack = [value.producer()]
            while stack:
                node = stack.pop(0)
                if name_of(node) not in placement.cpu_nodes or node in candidates:
                    continue
                candidates.append(node)
                stack.extend(node.inputs[i].producer() for i in _data_indices(node)
                             if i < len(node.inputs) and node.inputs[i] is not None
                             and node.inputs[i].producer() is not None)
        else:
            candidates.extend(u for u, _ in value.uses() if name_of(u) in placement.cpu_nodes)
    cpu_outputs = {id(v) for n in graph if name_of(n) in placement.cpu_nodes for v in n.outputs}
    intervals = Intervals(FITS_INT32)
    for c in candidates:
        if id(c) in done or c.name not in by_name or not _narrowable(c, cpu_outputs, kernels):
            continue
        unproved = _outside_int32(c, intervals)
        return c if unproved is None else (c, unproved)
    return None


def _narrowable(node: ir.Node, cpu_outputs: set[int], kernels: KernelTable) -> bool:
    """The form: an int64 movement op with a WebGPU int32 kernel whose data inputs are not computed on CPU."""
    if node.op_type not in MOVEMENT_OPS or node.domain not in ("", "ai.onnx"):
        return False
    if "on" not in (kernels.modes("", node.op_type, _NARROW_TYPE.get(node.op_type, "INT32")) or frozenset()):
        return False
    data = [node.inputs[i] for i in _data_indices(node) if i < len(node.inputs) and node.inputs[i] is not None]
    if not data or any(value_dtype(v) != "INT64" for v in data):
        return False
    return not any(id(v) in cpu_outputs for v in data)


def _outside_int32(node: ir.Node, intervals: Intervals) -> MatchFailure | None:
    """None when every data input's values are proved to fit int32 (their interval from their cone, graph inputs
    taken to fit int32 as documented); else the refusal naming the node. Shape reads dims only: its values never
    matter."""
    if node.op_type == "Shape":
        return None
    for i in _data_indices(node):
        value = node.inputs[i] if i < len(node.inputs) else None
        if value is None:
            continue
        found = intervals(value)
        if not found.fits_int32():
            return MatchFailure.refuse(
                f"int64 {node.op_type} {node.name!r} not narrowed: its input {value.name!r} is not proved to fit int32 "
                f"(its values lie in {found}, from its cone with graph inputs in int32), and the int32 Cast would "
                "wrap them around", node, interval=str(found))
    return None


def _fits_int32(value: ir.Value) -> bool:
    """The interval of ``value`` (from its cone; graph inputs taken to fit int32) lies in int32."""
    return Intervals(FITS_INT32)(value).fits_int32()


def _input_note(graph: ir.Graph, narrowed: list[ir.Node]) -> str | None:
    """What the rewrite assumes of the caller: the graph inputs whose values the narrowed ops move."""
    data = [n.inputs[i] for n in narrowed for i in _data_indices(n) if i < len(n.inputs) and n.inputs[i] is not None]
    inputs = {v.name for v in data if v.is_graph_input()}
    inputs |= {v.name for n in ancestors(data) for v in n.inputs if v is not None and v.is_graph_input()}
    if not inputs:
        return None
    names = ", ".join(repr(name) for name in sorted(inputs))
    return (f"exact while the int64 values of {names} fit in int32 (-2^31 .. 2^31-1; positions and lengths do): "
            "outside that range the int32 Cast wraps them around")


def _shape_from_gpu(graph: ir.Graph, node: ir.Node, base: str) -> None:
    """``Shape(x)`` of an int64 ``x`` → ``Shape(Relu(Cast<float>(x)))``: same dims, the Shape kernel runs on WebGPU
    (its output is in CPU memory anyway) and ``x`` is no longer read on CPU. onnxruntime sees through Cast and Identity
    (``Shape(Cast(x))`` becomes ``Shape(x)`` again), not through Relu; the values never matter, only the dims."""
    value = node.inputs[0]
    tape = NodeTape(opset_of(graph))
    as_float = tape.op("Cast", [value], {"to": ir.DataType.FLOAT}, name=f"{base}/as_float", output=f"{base}/as_float",
                       dtype=ir.DataType.FLOAT, shape=value.shape)
    keep = tape.op("Relu", [as_float], name=f"{base}/keep", output=f"{base}/keep", dtype=ir.DataType.FLOAT,
                   shape=value.shape)
    tape.insert_before(graph, node)
    node.replace_input_with(0, keep)


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
        shared = next((u for u, _ in value.uses() if u.op_type == "Cast" and u.domain in ("", "ai.onnx")
                       and u.attributes.get("to") is not None
                       and u.attributes["to"].value == ir.DataType.INT32.value and u.graph is graph), None)
        if shared is not None:
            node.replace_input_with(i, shared.outputs[0])
            if graph.node(0) is not None and _index(graph, shared) > _index(graph, node):
                graph.remove(shared)
                graph.insert_before(node, shared)
            continue
        tape = NodeTape(opset_of(graph))
        narrow = tape.op("Cast", [value], {"to": ir.DataType.INT32}, name=f"{base}/in{i}", output=f"{base}/in{i}_int32",
                         dtype=ir.DataType.INT32, shape=value.shape)
        tape.insert_before(graph, node)
        node.replace_input_with(i, narrow)
    if node.op_type in _OUTPUT_KEEPS_TYPE:
        return
    for j, out in enumerate(node.outputs):
        users = list(out.uses())
        was_output = out.is_graph_output()
        name, shape = out.name, out.shape
        out.name = f"{base}/out{j}_int32"
        out.dtype = ir.DataType.INT32
        tape = NodeTape(opset_of(graph))
        back = tape.op("Cast", [out], {"to": ir.DataType.INT64}, name=f"{base}/out{j}", output=name,
                       dtype=ir.DataType.INT64, shape=shape)
        tape.insert_after(graph, node)
        for user, index in users:
            user.replace_input_with(index, back)
        if was_output:
            graph.outputs[graph.outputs.index(out)] = back
