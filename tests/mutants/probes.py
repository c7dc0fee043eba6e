"""Edits that make a value *observable* in ways a pass may forget: as an extra graph output, read inside an ``If``
body (an outer-scope reference), read by a second consumer; and a few attribute/constant-form helpers shared by the
attack modules (:mod:`.lower_mrope`, :mod:`.unfuse`, :mod:`.cleanup`, :mod:`.adversarial`).
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx_ir as ir

from .edit import Chain, graph_input

_COUNT = itertools.count()


def set_attr(node: ir.Node, name: str, value) -> None:
    """Set attribute ``name`` (int, float, list of ints, or None to remove it)."""
    if value is None:
        node.attributes.pop(name, None)
    elif isinstance(value, bool | int):
        node.attributes[name] = ir.AttrInt64(name, int(value))
    elif isinstance(value, float):
        node.attributes[name] = ir.AttrFloat32(name, value)
    else:
        node.attributes[name] = ir.AttrInt64s(name, [int(v) for v in value])


def as_graph_output(graph: ir.Graph, value: ir.Value, name: str | None = None) -> None:
    """``value`` becomes an extra graph output (through an Identity named ``name`` when given: a graph output value
    keeps its own name otherwise)."""
    if name is not None:
        chain = Chain(graph, "probe")
        out = chain.op("Identity", value, shape=value.shape)
        chain.insert([])
        out.name = name
        value = out
    graph.outputs.append(value)


def _true_condition(graph: ir.Graph, chain: Chain) -> ir.Value:
    """``Shape(attention_mask)[0] > 0``: true on every call, computed (not a constant a runtime could fold away)."""
    ids = graph_input(graph, "attention_mask")
    batch = chain.op("Gather", chain.op("Shape", ids, dtype=ir.DataType.INT64), chain.scalar(0),
                     dtype=ir.DataType.INT64, axis=0)
    return chain.op("Greater", batch, chain.scalar(0), dtype=ir.DataType.BOOL, shape=ir.Shape([]))


def read_in_if(graph: ir.Graph, value: ir.Value, output: str, cond: ir.Value | None = None,
               add_output: bool = True) -> ir.Node:
    """A graph output ``output`` = ``If(true, then: ReduceSum(value), else: -ReduceSum(value))``: ``value`` read only
    inside the If's bodies (outer-scope references). ``cond``: the condition (default: computed from the mask, true);
    ``add_output=False``: the If is only added (a body's caller wires it). Returns the If node."""
    k = next(_COUNT)
    chain = Chain(graph, "subgraph")
    cond = cond if cond is not None else _true_condition(graph, chain)

    def branch(tag: str, negate: bool) -> ir.Graph:
        total = ir.node("ReduceSum", [value], attributes={"keepdims": 0}, name=f"/mutant/if{k}/{tag}/ReduceSum")
        total.outputs[0].name = f"/mutant/if{k}/{tag}/sum"
        total.outputs[0].dtype = value.dtype
        nodes = [total]
        out = total.outputs[0]
        if negate:
            neg = ir.node("Neg", [out], name=f"/mutant/if{k}/{tag}/Neg")
            neg.outputs[0].name = f"/mutant/if{k}/{tag}/neg"
            neg.outputs[0].dtype = value.dtype
            nodes.append(neg)
            out = neg.outputs[0]
        out.shape = ir.Shape([])
        return ir.Graph([], [out], nodes=nodes, name=f"mutant_if{k}_{tag}")

    node = ir.node("If", [cond], attributes={"then_branch": ir.AttrGraph("then_branch", branch("then", False)),
                                             "else_branch": ir.AttrGraph("else_branch", branch("else", True))},
                   name=f"/mutant/if{k}/If")
    node.outputs[0].name = output
    node.outputs[0].dtype = value.dtype
    node.outputs[0].shape = ir.Shape([])
    chain.nodes.append(node)
    chain.insert([])
    graph.sort()
    if add_output:
        graph.outputs.append(node.outputs[0])
    return node


def overridable(graph: ir.Graph, value: ir.Value) -> ir.Value:
    """Initializer ``value`` also declared a graph input (``keep_initializers_as_inputs``): its default stays, a caller
    may feed another."""
    if value not in graph.inputs:
        graph.inputs.append(value)
    return value


def as_constant_node(graph: ir.Graph, value: ir.Value, form: str = "value") -> ir.Value:
    """The readers of initializer ``value`` read a ``Constant`` node instead (``form``: ``value`` tensor, or
    ``value_int`` / ``value_ints`` / ``value_float`` / ``value_floats`` for small int/float constants)."""
    array = value.const_value.numpy()
    if form == "value":
        attrs = {"value": ir.tensor(np.array(array), name=f"{value.name}/constant")}
    elif form in ("value_int", "value_float"):
        attrs = {form: array.item()}
    else:
        attrs = {form: [x.item() for x in array.reshape(-1)]}
    node = ir.node("Constant", [], attributes=attrs, name=f"/mutant/constant/{next(_COUNT)}")
    out = node.outputs[0]
    out.name = f"{node.name}/output_0"
    out.dtype = ir.DataType.from_numpy(array.dtype) if form == "value" else (
        ir.DataType.INT64 if "int" in form else ir.DataType.FLOAT)
    out.shape = ir.Shape(array.shape if form in ("value", "value_ints", "value_floats") or array.ndim else [])
    readers = list(value.uses())
    chain = Chain(graph, "constant")
    chain.nodes.append(node)
    chain.insert([u for u, _ in readers])
    for user, index in readers:
        user.replace_input_with(index, out)
    return out


def gqa_copy_in_if(graph: ir.Graph, gqa: ir.Node, output: str) -> ir.Node:
    """A copy of ``gqa`` inside both bodies of an ``If`` (condition true), reading every input from the outer graph
    (outer-scope references), its attention output a new graph output ``output``. Returns the If node."""
    k = next(_COUNT)
    chain = Chain(graph, "gqa_in_if")
    cond = _true_condition(graph, chain)

    def branch(tag: str) -> ir.Graph:
        attrs = {name: ir.Attr(name, a.type, a.value) for name, a in gqa.attributes.items()}
        copy = ir.node(gqa.op_type, list(gqa.inputs), attributes=attrs, domain=gqa.domain,
                       num_outputs=len(gqa.outputs), name=f"/mutant/gqa_if{k}/{tag}/GroupQueryAttention")
        for j, (new, old) in enumerate(zip(copy.outputs, gqa.outputs, strict=True)):
            new.name, new.dtype, new.shape = f"/mutant/gqa_if{k}/{tag}/output_{j}", old.dtype, old.shape
        return ir.Graph([], [copy.outputs[0]], nodes=[copy], name=f"mutant_gqa_if{k}_{tag}")

    node = ir.node("If", [cond], attributes={"then_branch": ir.AttrGraph("then_branch", branch("then")),
                                             "else_branch": ir.AttrGraph("else_branch", branch("else"))},
                   name=f"/mutant/gqa_if{k}/If")
    node.outputs[0].name = output
    node.outputs[0].dtype = gqa.outputs[0].dtype
    node.outputs[0].shape = gqa.outputs[0].shape
    chain.nodes.append(node)
    chain.insert([])
    graph.sort()
    graph.outputs.append(node.outputs[0])
    return node
