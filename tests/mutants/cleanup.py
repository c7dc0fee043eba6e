"""Mutants attacking ``cleanup``: values that look dead from the main graph's node list and are not.

``cleanup`` removes nodes whose outputs nobody reads and initializers nobody reads. Each mutant adds real dead code
(so the pass rewrites) next to something it must keep: a value read only inside an ``If`` / ``Loop`` body (an
outer-scope reference), an initializer read only there, an unused initializer that is also a graph input (a caller
may feed it), a graph output that is an initializer or a graph input, a multi-output node with one output unused.
Base: ``current/llama/cpu_fp32`` with the ``webgpu`` preset (the other passes find nothing there). Reference: the
mutant itself on onnxruntime CPU; every graph output of the mutant must survive.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from . import EQUIVALENT, Mutant, Work
from .edit import Chain, graph_input
from .probes import read_in_if

PASS = "cleanup"
LLAMA = "genai/current/llama/cpu_fp32"
PLACES = ["<model>"]  # cleanup reports the whole model


def _dead_code(graph: ir.Graph) -> None:
    """Nodes nobody reads: Neg(Cast(input_ids)), and an initializer only they read."""
    chain = Chain(graph, "dead")
    ids = chain.op("Cast", graph_input(graph, "input_ids"), dtype=ir.DataType.FLOAT, to=ir.DataType.FLOAT)
    chain.op("Add", chain.op("Neg", ids), chain.const(np.full((1,), 7.0, np.float32)))
    chain.insert([])


def _mask_float(graph: ir.Graph) -> ir.Value:
    """A new main-graph value: Cast<float>(attention_mask) * 3 (read by nothing in the main graph)."""
    chain = Chain(graph, "kept")
    mask = chain.op("Cast", graph_input(graph, "attention_mask"), dtype=ir.DataType.FLOAT, to=ir.DataType.FLOAT)
    out = chain.op("Mul", mask, chain.scalar(3.0, np.float32))
    chain.insert([])
    return out


def only_dead(work: Work) -> list[str]:
    _dead_code(work.graph)
    return PLACES


def value_read_in_if(work: Work) -> list[str]:
    """A main-graph node's output read only inside an If body (summed to a graph output)."""
    _dead_code(work.graph)
    read_in_if(work.graph, _mask_float(work.graph), "mutant_if_sum")
    return PLACES


def initializer_read_in_if(work: Work) -> list[str]:
    """An initializer of the main graph read only inside an If body."""
    _dead_code(work.graph)
    weights = Chain(work.graph, "kept").const(np.arange(6, dtype=np.float32).reshape(2, 3))
    read_in_if(work.graph, weights, "mutant_if_weights_sum")
    return PLACES


def value_read_in_loop(work: Work) -> list[str]:
    """A main-graph node's output read only inside a Loop body (two iterations, one scan output each)."""
    _dead_code(work.graph)
    graph = work.graph
    kept = _mask_float(graph)
    chain = Chain(graph, "loop")
    trip = chain.scalar(2)
    go = chain.const(np.array(True))
    i = ir.Value(name="/mutant/loop/body/i", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([]))
    cond_in = ir.Value(name="/mutant/loop/body/cond_in", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    keep = ir.node("Identity", [cond_in], name="/mutant/loop/body/Identity")
    keep.outputs[0].name, keep.outputs[0].dtype = "/mutant/loop/body/cond_out", ir.DataType.BOOL
    keep.outputs[0].shape = ir.Shape([])
    total = ir.node("ReduceSum", [kept], attributes={"keepdims": 0}, name="/mutant/loop/body/ReduceSum")
    total.outputs[0].name, total.outputs[0].dtype = "/mutant/loop/body/sum", ir.DataType.FLOAT
    total.outputs[0].shape = ir.Shape([])
    body = ir.Graph([i, cond_in], [keep.outputs[0], total.outputs[0]], nodes=[keep, total], name="mutant_loop_body")
    loop = ir.node("Loop", [trip, go], attributes={"body": ir.AttrGraph("body", body)}, name="/mutant/loop/Loop")
    loop.outputs[0].name, loop.outputs[0].dtype = "mutant_loop_sums", ir.DataType.FLOAT
    loop.outputs[0].shape = ir.Shape([2])
    chain.nodes.append(loop)
    chain.insert([])
    graph.outputs.append(loop.outputs[0])
    return PLACES


def unused_overridable_initializer(work: Work) -> list[str]:
    """An initializer nobody reads that is also a graph input: a caller may feed it; removing the initializer would
    leave a required input without a default."""
    _dead_code(work.graph)
    value = Chain(work.graph, "kept").const(np.array([1.5, 2.5], np.float32))
    value.name = "mutant_unused_overridable"
    work.graph.initializers.pop(value.name, None)
    for name, init in list(work.graph.initializers.items()):
        if init is value:
            del work.graph.initializers[name]
    work.graph.register_initializer(value)
    work.graph.inputs.append(value)
    return PLACES


def initializer_is_output(work: Work) -> list[str]:
    """A graph output that is an initializer (no producer), read by nothing else."""
    _dead_code(work.graph)
    value = Chain(work.graph, "kept").const(np.array([4.0, 5.0], np.float32))
    work.graph.outputs.append(value)
    return PLACES


def input_is_output(work: Work) -> list[str]:
    """A graph input that is also a graph output (a pass-through)."""
    _dead_code(work.graph)
    work.graph.outputs.append(graph_input(work.graph, "attention_mask"))
    return PLACES


def split_one_output_used(work: Work) -> list[str]:
    """A Split whose first output is a graph output and second is read by nobody: the node must stay."""
    _dead_code(work.graph)
    graph = work.graph
    chain = Chain(graph, "kept")
    mask = chain.op("Cast", graph_input(graph, "attention_mask"), dtype=ir.DataType.FLOAT, to=ir.DataType.FLOAT)
    split = ir.node("Split", [mask], attributes={"axis": 0, "num_outputs": 2}, num_outputs=2,
                    name="/mutant/kept/Split")
    for k, out in enumerate(split.outputs):
        out.name, out.dtype = f"/mutant/kept/split_{k}", ir.DataType.FLOAT
    chain.nodes.append(split)
    chain.insert([])
    split.outputs[0].name = "mutant_split_first"
    graph.outputs.append(split.outputs[0])
    return PLACES


def value_read_in_nested_if(work: Work) -> list[str]:
    """A main-graph node's output read only two levels down: inside an If body that sits inside an If body."""
    _dead_code(work.graph)
    kept = _mask_float(work.graph)
    outer = read_in_if(work.graph, kept, "mutant_nested_sum")
    body = outer.attributes["then_branch"].value
    inner_total = body.outputs[0]
    inner = read_in_if(body, kept, "/mutant/nested/inner_sum", cond=outer.inputs[0], add_output=False)
    add = ir.node("Add", [inner_total, inner.outputs[0]], name="/mutant/nested/Add")
    both = add.outputs[0]
    both.name, both.dtype, both.shape = "/mutant/nested/both", ir.DataType.FLOAT, ir.Shape([])
    body.append(add)
    body.outputs[0] = both
    return PLACES


def dead_inside_if(work: Work) -> list[str]:
    """Dead code inside an If body (and in the main graph): removable in both, the If's output kept."""
    _dead_code(work.graph)
    node = read_in_if(work.graph, _mask_float(work.graph), "mutant_if_sum")
    body = node.attributes["then_branch"].value
    inner = body.outputs[0]
    dead = ir.node("Neg", [inner], name="/mutant/if_dead/Neg")
    dead.outputs[0].name, dead.outputs[0].dtype = "/mutant/if_dead/neg", ir.DataType.FLOAT
    body.append(dead)
    return PLACES


def mutants() -> list[Mutant]:
    def m(name, cls, edit, why):
        return Mutant(f"cleanup-llama-{name}", cls, PASS, LLAMA, EQUIVALENT, edit, why, target="webgpu",
                      reference="ort", calls=((0, 8, 1), (5, 1, 2), (37, 1, 2)))

    return [
        m("dead-chain", "harmless", only_dead, "dead nodes and a dead initializer: removed, outputs unchanged"),
        m("value-read-in-if", "subgraph", value_read_in_if, "a node's output read only inside an If body"),
        m("initializer-read-in-if", "subgraph", initializer_read_in_if, "an initializer read only inside an If body"),
        m("value-read-in-loop", "subgraph", value_read_in_loop, "a node's output read only inside a Loop body"),
        m("value-read-in-nested-if", "subgraph", value_read_in_nested_if,
          "a node's output read only inside an If body inside an If body"),
        m("dead-inside-if", "subgraph", dead_inside_if, "dead code inside an If body"),
        m("unused-overridable-initializer", "constant-form", unused_overridable_initializer,
          "an unused initializer that is also a graph input"),
        m("initializer-is-output", "graph-output", initializer_is_output, "a graph output that is an initializer"),
        m("input-is-output", "graph-output", input_is_output,
          "a graph input that is also a graph output"),
        m("split-one-output-used", "graph-output", split_one_output_used,
          "a two-output node, one output a graph output, the other unread"),
    ]
