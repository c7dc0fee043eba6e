"""Small in-memory graph edits for building mutants (onnx_ir), independent of the package's own rewrite helpers.

A :class:`Chain` builds a few new nodes (named under one prefix, constants as initializers) and splices them in
front of the readers of a value: ``splice(value, f)`` hands ``f`` a builder and the value, and every reader that
read ``value`` before the call reads ``f``'s result afterwards. Readers are captured *before* the new nodes exist, so
the new chain itself keeps reading the original value.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

import numpy as np
import onnx_ir as ir

_COUNTER = itertools.count()


class Chain:
    """New nodes under ``prefix``, inserted together before the first reader they are spliced in for."""

    def __init__(self, graph: ir.Graph, prefix: str) -> None:
        self.graph = graph
        self.prefix = f"/mutant/{prefix}"
        self.nodes: list[ir.Node] = []

    def _name(self, what: str) -> str:
        return f"{self.prefix}/{what}_{next(_COUNTER)}"

    def const(self, array, dtype=None) -> ir.Value:
        arr = np.asarray(array, dtype=dtype)
        name = self._name("const")
        value = ir.Value(name=name, shape=ir.Shape(arr.shape), type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)),
                         const_value=ir.tensor(arr, name=name))
        self.graph.register_initializer(value)
        return value

    def op(self, op_type: str, *inputs: ir.Value | None, dtype: ir.DataType | None = None,
           shape: ir.Shape | None = None, **attributes) -> ir.Value:
        node = ir.node(op_type, list(inputs), attributes=attributes or None, name=self._name(op_type))
        out = node.outputs[0]
        out.name = f"{node.name}/output_0"
        data = inputs[1:] if op_type == "Where" else inputs  # Where's first input is the condition
        first = next((i for i in data if i is not None), None)
        dtype = dtype if dtype is not None else (first.dtype if first is not None else None)
        if dtype is not None:  # assigning None would leave a tensor type without an element type
            out.dtype = dtype
        if shape is not None:
            out.shape = shape
        self.nodes.append(node)
        return out

    # -- common int64 pieces ---------------------------------------------------------------------------------
    def i64(self, *values: int) -> ir.Value:
        return self.const(np.array(values, dtype=np.int64))

    def scalar(self, value, dtype=np.int64) -> ir.Value:
        return self.const(np.array(value, dtype=dtype))

    def dim(self, value: ir.Value, axis: int) -> ir.Value:
        """``Shape(value)[axis]`` as a 1-element int64 tensor."""
        shape = self.op("Shape", value, dtype=ir.DataType.INT64)
        return self.op("Gather", shape, self.i64(axis), dtype=ir.DataType.INT64, axis=0)

    def insert(self, readers: Iterable[ir.Node]) -> None:
        """Put the new nodes before the earliest of ``readers`` (or at the end of the graph)."""
        if not self.nodes:
            return
        readers = [r for r in readers if r.graph is self.graph]
        order = {id(n): k for k, n in enumerate(self.graph)}
        first = min(readers, key=lambda r: order.get(id(r), 1 << 30), default=None)
        if first is not None:
            self.graph.insert_before(first, self.nodes)
        else:
            self.graph.extend(self.nodes)
        self.nodes = []


def readers_of(value: ir.Value, keep: Callable[[ir.Node], bool] | None = None) -> list[tuple[ir.Node, int]]:
    return [(u, i) for u, i in value.uses() if keep is None or keep(u)]


def splice(graph: ir.Graph, value: ir.Value, build: Callable[[Chain, ir.Value], ir.Value], prefix: str,
           keep: Callable[[ir.Node], bool] | None = None) -> list[ir.Node]:
    """Readers of ``value`` (those ``keep`` accepts) read ``build(chain, value)`` instead; returns those readers."""
    readers = readers_of(value, keep)
    if not readers:
        raise AssertionError(f"mutant edit: {value.name!r} has no reader to splice in front of")
    chain = Chain(graph, prefix)
    new = build(chain, value)
    chain.insert([u for u, _ in readers])
    for user, index in readers:
        user.replace_input_with(index, new)
    graph.sort()
    return [u for u, _ in readers]


def node_named(graph: ir.Graph, name: str) -> ir.Node:
    found = [n for n in graph if n.name == name]
    if len(found) != 1:
        raise AssertionError(f"mutant edit: {len(found)} nodes named {name!r}")
    return found[0]


def nodes_of(graph: ir.Graph, op_type: str) -> list[ir.Node]:
    return [n for n in graph if n.op_type == op_type]


def graph_input(graph: ir.Graph, name: str) -> ir.Value:
    for value in graph.inputs:
        if value.name == name:
            return value
    raise AssertionError(f"mutant edit: no graph input {name!r}")


def gqa_of(node: ir.Node) -> ir.Node:
    """The GroupQueryAttention a rotation's output reaches (through Cast/Reshape/Transpose/Concat adapters)."""
    frontier = [node]
    seen = set()
    while frontier:
        n = frontier.pop()
        for out in n.outputs:
            for user, _ in out.uses():
                if user.op_type == "GroupQueryAttention":
                    return user
                if id(user) not in seen and user.op_type in ("Cast", "Reshape", "Transpose", "Concat"):
                    seen.add(id(user))
                    frontier.append(user)
    raise AssertionError(f"mutant edit: {node.name!r} does not reach a GroupQueryAttention")


def replace_initializer(graph: ir.Graph, name: str, array: np.ndarray) -> None:
    value = graph.initializers[name]
    value.const_value = ir.tensor(np.ascontiguousarray(array), name=name)
    value.shape = ir.Shape(array.shape)
