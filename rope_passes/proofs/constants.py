"""The one constant evaluator: the value of a graph value, or "not a constant", never a question about node types.

A value is a constant when its cone (the value, its producer, that node's inputs, transitively) reads no graph input
and no overridable initializer (an initializer that is also a graph input: ``keep_initializers_as_inputs`` exports,
where the caller may feed another value). Such a cone evaluates to one value on every call, whatever ops build it:
an initializer, a ``Constant`` node in any of its forms (``value``, ``value_int``, ``value_ints``, ``value_float``,
``value_floats``, ``value_string(s)``: :func:`rope_passes.analysis.graph.constant_node_value`, the one reader of a
Constant's attribute, which :func:`rope_passes.analysis.graph.const_array` reads too), ``Cast``, ``Gather(Concat(...))``, ``Shape`` of a constant, arithmetic...
Each node is run by onnx's reference evaluator (:func:`rope_passes.proofs.known.evaluate_node`, the evaluator the
cone accounting uses), never by onnxruntime, and never on anything read from disk beyond ``max_size`` elements.

``None`` means "not proved constant": the cone reads a graph input or an overridable initializer, holds a custom op,
control flow or a random op, or a tensor larger than ``max_size`` (weights are not read to answer). Every proof that
needs a number asks :func:`constant` (or :class:`Constants` for many questions about one model), so a number spelled
one way is never trusted while the same number spelled another way is refused.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import constant_node_value

#: elements read at most per tensor (a constant larger than this is "not known": weights are never read)
MAX_SIZE = 1 << 16

_RANDOM = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                     "Bernoulli"})
#: ops whose output can be much larger than their inputs: evaluated only when the output size is known small
_GROWING = frozenset({"ConstantOfShape", "Expand", "Tile", "Range", "Pad", "OneHot", "Resize", "Upsample", "EyeLike"})


def _opset(node: ir.Node, default: int | None) -> int:
    """The default-domain opset ``node`` is written for: its graph's import, else ``default`` (a subgraph, an ``If``
    branch, imports nothing: its model's opset is the caller's to give), else 18."""
    graph = node.graph
    imports = graph.opset_imports if graph is not None else {}
    return int(imports.get("", imports.get("ai.onnx", default if default is not None else 18)))


def _output_size(node: ir.Node, ins: list[np.ndarray | None]) -> int | None:
    """Elements of the output of a growing op, computed from its (constant) inputs; None when not computable."""
    op = node.op_type
    try:
        if op == "ConstantOfShape":
            return int(np.prod(ins[0])) if ins[0] is not None else 1
        if op == "Expand":
            return int(np.prod(np.broadcast_shapes(ins[0].shape, tuple(int(d) for d in ins[1].reshape(-1)))))
        if op == "Tile":
            return int(ins[0].size * np.prod(ins[1]))
        if op == "Range":
            start, limit, delta = (float(np.asarray(a).reshape(-1)[0]) for a in ins[:3])
            return max(int(np.ceil((limit - start) / delta)), 0) if delta else None
    except Exception:  # noqa: BLE001 - malformed inputs: the op is not evaluated
        return None
    return None


class Constants:
    """Answers "what is this value, if it is a constant" for many values of one model (results memoised)."""

    def __init__(self, max_size: int = MAX_SIZE, opset: int | None = None) -> None:
        """``opset``: the model's default-domain opset, for nodes of subgraphs (which import none)."""
        self.max_size = max_size
        self.opset = opset
        self._memo: dict[int, np.ndarray | None] = {}
        self._keep: list[ir.Value] = []  # memo keys stay valid: the values are kept alive

    def __call__(self, value: ir.Value | None) -> np.ndarray | None:
        if value is None:
            return None
        stack: list[tuple[ir.Value, bool]] = [(value, False)]
        while stack:
            v, ready = stack.pop()
            if id(v) in self._memo:
                continue
            leaf = self._leaf(v)
            if leaf is not _PENDING:
                self._set(v, leaf)  # type: ignore[arg-type]
                continue
            node = v.producer()
            assert node is not None
            inputs = [i for i in node.inputs if i is not None]
            if not ready:
                stack.append((v, True))
                stack.extend((i, False) for i in inputs if id(i) not in self._memo)
                continue
            for out, result in zip(node.outputs, self._node(node), strict=True):
                self._set(out, result)
        return self._memo[id(value)]

    def _set(self, v: ir.Value, result: np.ndarray | None) -> None:
        self._memo[id(v)] = result
        self._keep.append(v)

    def _leaf(self, v: ir.Value) -> object:
        """The answer for a value without a producer, or for a node type answered without its inputs."""
        if v.is_graph_input():
            return None  # the caller's (an initializer that is also an input is overridable)
        if v.const_value is not None:
            return v.const_value.numpy() if v.const_value.size <= self.max_size else None
        node = v.producer()
        if node is None:
            return None  # an outer-scope value of a subgraph, or a dangling one: not known here
        if node.domain not in ("", "ai.onnx") or node.op_type in _RANDOM or any(
                a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()):
            return None
        if node.op_type == "Constant":
            return constant_node_value(node, self.max_size, strings=True)
        return _PENDING

    def _node(self, node: ir.Node) -> list[np.ndarray | None]:
        from rope_passes.proofs.known import evaluate_node

        none: list[np.ndarray | None] = [None] * len(node.outputs)
        ins = [None if i is None else self._memo[id(i)] for i in node.inputs]
        if any(a is None for a, v in zip(ins, node.inputs, strict=True) if v is not None):
            return none
        if any(a is not None and a.dtype == object for a in ins):
            return none  # strings: not evaluated
        if node.op_type in _GROWING:
            size = _output_size(node, ins)
            if size is None or size > self.max_size:
                return none
        out = evaluate_node(node, ins, _opset(node, self.opset))
        if out is None or len(out) != len(node.outputs):
            return none
        return [a if a.size <= self.max_size else None for a in out]


_PENDING = object()


def constant(value: ir.Value | None, max_size: int = MAX_SIZE) -> np.ndarray | None:
    """The value of ``value`` if its cone reads no graph input and no overridable initializer; None otherwise (see
    the module docstring)."""
    return Constants(max_size)(value)


def scalar(value: ir.Value | None, max_size: int = MAX_SIZE) -> int | float | bool | None:
    """The one element of a constant with one element, as a Python number; None otherwise."""
    array = constant(value, max_size)
    if array is None or array.size != 1 or array.dtype == object:
        return None
    return array.reshape(-1)[0].item()


#: the most elements a cos/sin table computed from constants is evaluated to (a 128k-position, 128-column table)
TABLE_MAX = 1 << 24


def table(value: ir.Value | None, opset: int | None = None) -> np.ndarray | None:
    """The value of a cos/sin table input: an initializer, or any cone of constants that gives one (an Identity, a
    Cast, a Slice of the table, ``Mul(cos, 1.01)``, ``Add(cos, delta)``, an int8 table through ``DequantizeLinear``,
    an outer bf16 table cast inside an ``If`` branch), up to :data:`TABLE_MAX` elements, each node as onnx's reference
    evaluator runs it at its opset (``opset``: the model's, for a subgraph's nodes); None when it is not a
    constant."""
    if value is None:
        return None
    if value.const_value is not None and not value.is_graph_input():
        return np.asarray(value.const_value.numpy())
    return Constants(TABLE_MAX, opset)(value)


__all__ = ["MAX_SIZE", "TABLE_MAX", "Constants", "constant", "scalar", "table"]
