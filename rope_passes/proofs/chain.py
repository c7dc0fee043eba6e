"""A per-call cos/sin chain as ``precompute-cos-sin`` and the RP4xx lint rules read it: positions × an inv_freq
vector → Cos | Sin → its *end* (followed down through single-consumer Cast / Identity / Neg and Mul / Div / Add /
Sub by a scalar constant: the attention scaling, yarn's factor).

:func:`find_chain` finds the chain (not yet proved per-token: :class:`rope_passes.proofs.cone.Cone` does that) and its
position source: a ``position_ids`` graph input, or a ``Range`` made in the graph
(:func:`rope_passes.proofs.positions.range_source`). It reads the model and never changes it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import ancestors
from rope_passes.analysis.inv_freq import inv_freq_product
from rope_passes.analysis.longrope import LongRoPE
from rope_passes.proofs.constants import constant
from rope_passes.proofs.positions import RangeSource, range_source
from rope_passes.report import MatchFailure

#: Ops followed down from Cos/Sin into the chain's end: unary, or binary with a scalar constant.
_UNARY = ("Cast", "Identity", "Neg")
_SCALAR_BINARY = ("Mul", "Div", "Add", "Sub")


@dataclasses.dataclass
class Chain:
    """One per-call cos or sin computation: Cos/Sin node, the value consumers read, its inputs."""

    trig: ir.Node
    end: ir.Value  # replaced by the Gather
    positions: ir.Value  # the position graph input, or the Range output
    product: ir.Node  # the positions × inv_freq MatMul/Mul
    inv_freq: ir.Value
    nodes: list[ir.Node]  # the chain's nodes (ancestors of ``end``)
    #: other graph inputs the chain reads only the shape of (the batch from Shape(past_key_values.0.value))
    shape_inputs: list[ir.Value] = dataclasses.field(default_factory=list)
    #: positions made in the graph: the Range whose output is ``positions`` (None: a graph input)
    source: RangeSource | None = None
    #: axes of ``end`` of extent 1 besides the positions' (a Range source's ``Unsqueeze(0)``)
    unit_axes: list[int] = dataclasses.field(default_factory=list)
    #: LongRoPE chosen per call in the graph (analysis.longrope's ``where`` form): tables only with a config
    per_call: LongRoPE | None = None
    #: LongRoPE rebuilt from config.json: (short table, long table, original_max_position_embeddings)
    switch: tuple[np.ndarray, np.ndarray, int] | None = None
    #: the switch was added by a repair (LongRoPE frozen at export), not read from the graph
    repaired: str | None = None

    @property
    def role(self) -> str:
        return self.trig.op_type.lower()

    @property
    def positions_dtype(self) -> ir.DataType:
        if self.source is not None:
            return self.source.dtype
        assert self.positions.dtype is not None
        return self.positions.dtype

    @property
    def positions_shape(self) -> list:
        """The positions' shape (a Range source's ``[S]``, without retyping the model)."""
        if self.source is not None:
            return self.source.shape
        assert self.positions.shape is not None
        return list(self.positions.shape)


def _is_scalar_const(value: ir.Value | None) -> bool:
    array = constant(value)
    return array is not None and array.size == 1


def chain_end(value: ir.Value) -> ir.Value:
    """Follow ``value`` down through single-consumer unary ops and binary ops with a scalar constant."""
    while not value.is_graph_output():
        uses = list(value.uses())
        if len(uses) != 1:
            return value
        user, index = uses[0]
        if user.domain not in ("", "ai.onnx") or len(user.outputs) != 1:
            return value
        if user.op_type in _UNARY:
            pass
        elif user.op_type in _SCALAR_BINARY and len(user.inputs) == 2:
            if not _is_scalar_const(user.inputs[1 - index]):
                return value
        else:
            return value
        value = user.outputs[0]
    return value


def _graph_inputs(nodes: list[ir.Node], end: ir.Value) -> list[ir.Value]:
    found: dict[int, ir.Value] = {}
    for v in [end, *(i for n in nodes for i in n.inputs)]:
        if v is not None and v.is_graph_input():
            found[id(v)] = v
    return list(found.values())


def find_chain(model: ir.Model, trig: ir.Node) -> Chain:
    """The per-call chain ending at ``trig`` (not yet proved per-token); MatchFailure.absent if it is not this form,
    .refuse if its positions are made by a Range not proved in bounds."""
    found = inv_freq_product(trig, model)
    if found is None:
        raise MatchFailure.absent(f"{trig.op_type} does not read positions × an inv_freq vector", trig)
    product, inv_freq = found
    end = chain_end(trig.outputs[0])
    if end.is_graph_output():
        raise MatchFailure.absent(f"the chain's end {end.name!r} is a graph output", trig)
    nodes = ancestors([end])
    inputs = _graph_inputs(nodes, end)
    in_chain = {id(n) for n in nodes}
    shape_only = [v for v in inputs if all(u.op_type in ("Shape", "Size") for u, _ in v.uses() if id(u) in in_chain)]
    read = [v for v in inputs if all(v is not s for s in shape_only)]
    by_value = {id(i) for n in ancestors(product.inputs, stop=("Shape", "Size")) if n.op_type not in ("Shape",
                "Size") for i in n.inputs if i is not None}
    if len(read) != 1 or id(read[0]) not in by_value:
        source = range_source(product)
        if source is not None:
            return _range_chain(trig, end, product, inv_freq, source)
        names = ", ".join(sorted(repr(v.name) for v in inputs)) or "none"
        if len(read) != 1:
            raise MatchFailure.absent(f"{trig.op_type} depends on {len(inputs)} graph inputs ({names}), not on one "
                                      "position input", trig)
        raise MatchFailure.absent(f"{trig.op_type} reads no position input: its positions are made in the graph "
                                  f"from the shapes of {names}, not by a Range this pass knows", trig)
    (positions,) = read
    shape = positions.shape
    if positions.dtype not in (ir.DataType.INT64, ir.DataType.INT32) or shape is None or not (
            len(shape) == 2 or (len(shape) == 3 and shape[0] == 3)):
        raise MatchFailure.absent(f"position input {positions.name!r} is {positions.dtype} {shape}, not an "
                                  "integer [batch, seq] or [3, batch, seq] tensor", trig)
    return Chain(trig, end, positions, product, inv_freq, nodes, shape_inputs=shape_only)


def _range_chain(trig: ir.Node, end: ir.Value, product: ir.Node, inv_freq: ir.Value, source: RangeSource) -> Chain:
    """The chain from a Range position source (positions made in the graph) to ``end``."""
    positions = source.node.outputs[0]
    nodes: dict[int, ir.Node] = {}
    stack = [end.producer()]
    while stack:
        node = stack.pop()
        if node is None or id(node) in nodes:
            continue
        nodes[id(node)] = node
        stack.extend(i.producer() for i in node.inputs if i is not None and i is not positions)
    inputs = _graph_inputs(list(nodes.values()), end)
    shape_only = [v for v in inputs if all(u.op_type in ("Shape", "Size") for u, _ in v.uses() if id(u) in nodes)]
    if len(shape_only) != len(inputs):
        names = ", ".join(sorted(repr(v.name) for v in inputs if all(v is not s for s in shape_only)))
        raise MatchFailure.absent(f"{trig.op_type} reads {names} besides its positions ({source.node.op_type} "
                                  f"{source.node.name!r})", trig)
    return Chain(trig, end, positions, product, inv_freq, list(nodes.values()), shape_inputs=shape_only,
                 source=source)


__all__ = ["Chain", "chain_end", "find_chain"]
