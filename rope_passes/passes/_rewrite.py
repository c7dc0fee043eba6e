"""Shared rewrite helpers of the passes: new initializers, new nodes, and removing what a rewrite left dead.

One way each:

* :func:`add_initializer`: a new initializer (``onnx_ir.val`` holding ``onnx_ir.tensor``), its name made unique;
* :class:`FreshNames`: names for new nodes and values that no node or value of the graph has (onnxruntime rejects
  two nodes with one name, and a value name declared twice; names derived from an empty node name all collide);
* :class:`NodeTape`: new nodes recorded on an ``onnx_ir.tape.Tape`` (onnx_ir's own node recorder), each output
  named and typed at creation, inserted into the graph in one step (before/after a node, or at the end), names the
  graph already has suffixed on insertion. Built for the model's opset (``NodeTape(opset_of(model))``), it writes
  each node in the form valid there: an op whose axes or split sizes moved from an attribute to an input
  (:data:`INPUT_SINCE`: ``ReduceSum``/``Squeeze``/``Unsqueeze``/``Split`` at 13, the other reductions at 18) is
  written with the attribute below that opset and with the input from it on, whichever form the pass wrote; an op
  that does not exist at the model's opset is a refusal (``MatchFailure``) naming the op and the opset;
* :func:`remove_dead`: nodes and initializers that became dead, walking up from what the rewrite replaced only;
* :func:`drop_unused_input`: a graph input nothing reads any more, and its ``genai_config.json`` decoder entry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx.defs
import onnx_ir as ir
from onnx_ir.tape import Tape

import rope_passes.graph_walk as graph_walk
from rope_passes.config import GenaiConfig
from rope_passes.report import MatchFailure, name_of

__all__ = ["INPUT_SINCE", "FreshNames", "NodeTape", "add_initializer", "drop_unused_input", "opset_of", "remove_dead"]

#: default-domain ops whose second operand moved from an attribute to an input: op -> (its name, the opset it moved in)
INPUT_SINCE: dict[str, tuple[str, int]] = {
    "ReduceSum": ("axes", 13), "Squeeze": ("axes", 13), "Unsqueeze": ("axes", 13), "Split": ("split", 13),
    **{op: ("axes", 18) for op in ("ReduceMax", "ReduceMin", "ReduceMean", "ReduceProd", "ReduceL1", "ReduceL2",
                                   "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")},
}


def opset_of(model: ir.Model | ir.Graph) -> int | None:
    """The default-domain (``ai.onnx``) opset of a model (or of its main graph, which holds the imports): what every
    new default-domain node is built for. None for a subgraph (it holds no imports; its nodes are written as given
    and judged by the validity contract) or a model importing no default domain."""
    imports = model.opset_imports
    version = imports.get("", imports.get("ai.onnx"))
    return None if version is None else int(version)


def _ints(value: ir.Value) -> list[int] | None:
    """The integers a 1-D (or scalar) constant value holds: an initializer or a ``Constant`` node's ``value``."""
    tensor = value.const_value
    if tensor is None:
        producer = value.producer()
        if producer is not None and producer.op_type == "Constant" and producer.domain in ("", "ai.onnx"):
            attr = producer.attributes.get("value")
            tensor = attr.value if attr is not None and attr.type == ir.AttributeType.TENSOR else None
            ints = producer.attributes.get("value_ints")
            if ints is not None:
                return [int(i) for i in ints.value]
    if tensor is None:
        return None
    return [int(i) for i in np.asarray(tensor.numpy()).reshape(-1)]


def _names(graph: ir.Graph, skip: Iterable[ir.Node] = ()) -> tuple[set[str], set[str]]:
    """(value names, node names) of ``graph`` and its subgraphs, leaving out the nodes in ``skip``."""
    skipped = {id(n) for n in skip}
    values: set[str] = {v.name for v in graph.inputs if v.name} | set(graph.initializers)
    nodes: set[str] = set()
    for node in graph_walk.nodes(graph):
        if id(node) in skipped:
            continue
        values.update(v.name for v in node.outputs if v.name)
        if node.name:
            nodes.add(node.name)
        for a in node.attributes.values():
            subgraphs = [a.value] if a.type == ir.AttributeType.GRAPH else (
                list(a.value) if a.type == ir.AttributeType.GRAPHS else [])
            for sub in subgraphs:
                values.update(v.name for v in sub.inputs if v.name)
                values.update(sub.initializers)
    return values, nodes


def _unique(name: str, taken: set[str]) -> str:
    candidate, n = name, 1
    while candidate in taken:
        candidate = f"{name}_{n}"
        n += 1
    taken.add(candidate)
    return candidate


def add_initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    """A new initializer named ``name`` (``_1``, ``_2``… appended when a value of the graph, an initializer or a
    node's output, already has it: a name declared twice makes the model invalid) holding ``array``."""
    name = _unique(name, _names(graph)[0])
    value = ir.val(name, const_value=ir.tensor(array, name=name))
    graph.register_initializer(value)
    return value


class FreshNames:
    """``fresh(name)``: ``name``, else ``name_1``, ``name_2``… — unique among every node name and value name of the
    graph and its subgraphs, and among the names this object handed out before."""

    def __init__(self, graph: ir.Graph):
        values, nodes = _names(graph)
        self.taken = values | nodes

    def __call__(self, name: str) -> str:
        return _unique(name, self.taken)


class NodeTape:
    """New nodes for one place of a graph, recorded on an ``onnx_ir.tape.Tape`` and inserted together.

    ``op`` names the node and its output and sets the output's dtype/shape (what onnxruntime's shape inference and
    the placement prediction read), in the form valid at ``opset`` (the model's default-domain opset: see the module
    doc; None: as written); ``insert_before``/``insert_after``/``append`` put the recorded nodes into the graph in
    recording order.
    """

    def __init__(self, opset: int | None = None) -> None:
        self.tape = Tape()
        self.opset = opset
        self._dropped: set[int] = set()  # recorded Constant nodes a conversion left unread

    @property
    def nodes(self) -> Sequence[ir.Node]:
        return [n for n in self.tape.nodes if id(n) not in self._dropped]

    def op(
        self,
        op_type: str,
        inputs: Sequence[ir.Value | None],
        attributes: Mapping[str, Any] | None = None,
        *,
        name: str,
        output: str | None = None,
        dtype: ir.DataType | None = None,
        shape: ir.Shape | Sequence[int | str | ir.SymbolicDim | None] | None = None,
        domain: str = "",
    ) -> ir.Value:
        """Record node ``name``; returns its output (named ``output``, typed ``dtype``/``shape`` when given)."""
        if domain in ("", "ai.onnx") and self.opset is not None:
            inputs, attributes = self._for_opset(op_type, list(inputs), dict(attributes or {}), name)
        value = self.tape.op(op_type, inputs, attributes, domain=domain, name=name)
        if output is not None:
            value.name = output
        if dtype is not None:
            value.dtype = dtype
        if shape is not None:
            value.shape = shape if isinstance(shape, ir.Shape) else ir.Shape(shape)
        return value

    def _for_opset(self, op_type: str, inputs: list[ir.Value | None], attributes: dict[str, Any],
                   name: str) -> tuple[list[ir.Value | None], dict[str, Any]]:
        """``inputs``/``attributes`` in the form of ``op_type`` at this tape's opset; MatchFailure where the op does
        not exist there, or where an operand that must become an attribute is not a constant."""
        assert self.opset is not None
        try:
            onnx.defs.get_schema(op_type, self.opset, "")
        except onnx.defs.SchemaError:
            raise MatchFailure.refuse(f"{op_type} does not exist at opset {self.opset}, the model's default-domain "
                                      "opset: the rewrite would need it", name) from None
        moved = INPUT_SINCE.get(op_type)
        if moved is None:
            return inputs, attributes
        key, since = moved
        if self.opset < since and len(inputs) > 1 and inputs[1] is not None:
            operand = inputs[1]
            ints = _ints(operand)
            if ints is None:
                raise MatchFailure.refuse(f"{op_type} at opset {self.opset} takes {key} as an attribute, and "
                                          f"{operand.name!r} is not a constant", name)
            producer = operand.producer()
            if producer is not None and producer in self.tape.nodes and len(operand.uses()) == 0:
                self._dropped.add(id(producer))  # recorded for this op only: not inserted
            return [inputs[0], *inputs[2:]], {**attributes, key: ints}
        if self.opset >= since and key in attributes:
            ints = [int(i) for i in attributes.pop(key)]
            const = self.tape.op("Constant", [], {"value": ir.tensor(np.array(ints, dtype=np.int64))},
                                 name=f"{name}/{key}")
            const.name = f"{name}/{key}"
            const.dtype, const.shape = ir.DataType.INT64, ir.Shape([len(ints)])
            return [inputs[0] if inputs else None, const, *inputs[1:]], attributes
        return inputs, attributes

    def _unique_names(self, graph: ir.Graph) -> None:
        """Rename the recorded nodes and outputs whose names the graph already has (``_1``, ``_2``… appended):
        onnxruntime rejects two nodes with one name, and a value name declared twice makes the model invalid."""
        values, nodes = _names(graph, skip=self.tape.nodes)
        for node in self.nodes:
            if node.name:
                node.name = _unique(node.name, nodes)
            for out in node.outputs:
                if out.name:
                    out.name = _unique(out.name, values)

    def insert_before(self, graph: ir.Graph, node: ir.Node) -> None:
        self._unique_names(graph)
        graph.insert_before(node, self.nodes)

    def insert_after(self, graph: ir.Graph, node: ir.Node) -> None:
        self._unique_names(graph)
        graph.insert_after(node, self.nodes)

    def append(self, graph: ir.Graph) -> None:
        self._unique_names(graph)
        graph.extend(self.nodes)


def remove_dead(graph: ir.Graph, start: Iterable[ir.Value | None]) -> tuple[int, int]:
    """Remove nodes and initializers that became dead, walking up from ``start`` only.

    Dead code elsewhere in the graph is left alone, so a pass changes only what it rewrote.
    Returns (nodes removed, initializers removed). The dead nodes are found first, then removed in one
    ``graph.remove`` (each call reads every graph output: one per node was most of a large fold's rewrite).
    """
    work = [v for v in start if v is not None]
    dead: dict[int, ir.Node] = {}  # in the order found

    def unused(value: ir.Value) -> bool:  # no reader but the dead
        return all(id(user) in dead for user, _ in value.uses())

    initializers: dict[int, ir.Value] = {}
    while work:
        value = work.pop()
        if not unused(value) or value.is_graph_output() or value.is_graph_input():
            continue
        if value.is_initializer():
            initializers[id(value)] = value
            continue
        node = value.producer()
        if node is None or node.graph is not graph or id(node) in dead:
            continue
        if any(not unused(out) or out.is_graph_output() for out in node.outputs):
            continue
        dead[id(node)] = node
        work.extend(i for i in node.inputs if i is not None)
    if dead:
        graph.remove(list(dead.values()), safe=True)  # checks again that nothing else reads them
    inits_removed = 0
    for value in initializers.values():
        if not value.uses() and graph.initializers.get(value.name) is value:
            del graph.initializers[value.name]
            inits_removed += 1
    return len(dead), inits_removed


def drop_unused_input(graph: ir.Graph, value: ir.Value, genai_config: GenaiConfig) -> tuple[list[str], list[str]]:
    """Remove graph input ``value`` when nothing reads it, and its genai_config decoder input entry.

    Returns (graph changes, genai_config changes).
    """
    if value.uses() or not value.is_graph_input() or value.is_graph_output():
        return [], []
    graph.inputs.remove(value)
    return [f"removed graph input {value.name!r}"], genai_config.drop_decoder_input(name_of(value))


def inline_functions(model: ir.Model, functions: list[ir.Function]) -> None:
    """Every call of ``functions`` replaced by the function's body, in place (onnx_ir's inliner; the functions go
    once no call is left). The caller checks the opset imports agree (the inliner refuses a mismatch)."""
    from onnx_ir.passes.common import InlinePass

    ids = {f.identifier() for f in functions}
    InlinePass(criteria=lambda f: f.identifier() in ids)(model)
