"""LongRoPE's switch point, proved (:func:`switch_offset`): the ``If``/``Where`` condition evaluated exactly over every
total length, as a function of the total GroupQueryAttention reads (its ``total_sequence_length`` through
Cast/Identity, or any value the caller proves to be that total by value: a model-local function's output, another
copy of the length chain). Read by ``longrope-concat`` before it rewrites a switch; re-exported by
:mod:`rope_passes.analysis.longrope`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import SMALL_TENSOR, ancestors, attr, const_array
from rope_passes.report import MatchFailure, name_of

if TYPE_CHECKING:
    from rope_passes.analysis.longrope import LongRoPE

_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Greater": np.greater, "Less": np.less,
    "GreaterOrEqual": np.greater_equal, "LessOrEqual": np.less_equal, "Equal": np.equal, "And": np.logical_and,
    "Or": np.logical_or, "Xor": np.logical_xor}
_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Identity": lambda x: x, "Neg": np.negative, "Abs": np.abs, "Not": np.logical_not, "Floor": np.floor,
    "Ceil": np.ceil}
#: the ops a switch condition may be computed with: elementwise, evaluated exactly in NumPy
CONDITION_OPS = frozenset({*_BINARY, *_UNARY, "Cast", "Div", "Max", "Min", "Where"})


def total_length_values(gqas: list[ir.Node]) -> list[ir.Value]:
    """The values that *are* the total sequence length of ``gqas``: their ``total_sequence_length`` input and what
    it is Cast/Identity of. Raises ``MatchFailure.refuse`` when the GQAs read different totals (or none)."""
    chains = []
    for gqa in gqas:
        value = gqa.inputs[6] if len(gqa.inputs) > 6 else None
        if value is None:
            raise MatchFailure.refuse(f"{gqa.name!r} has no total_sequence_length input", gqa)
        chain = [value]
        while (p := chain[-1].producer()) is not None and p.op_type in ("Cast", "Identity") and p.inputs:
            chain.append(p.inputs[0])
        chains.append(chain)
    if not chains:
        raise MatchFailure.refuse("no GroupQueryAttention reads the switch: no total length to prove it against")
    if len({id(c[-1]) for c in chains}) != 1:
        names = sorted({name_of(c[-1]) or "?" for c in chains})
        raise MatchFailure.refuse(f"the GroupQueryAttention nodes read different total lengths {names}",
                                  gqas[0])
    return list({id(v): v for c in chains for v in c}.values())


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ONNX integer Div: truncated toward zero (C semantics), not NumPy's floor."""
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q).astype(np.result_type(a, b))


def _apply(node: ir.Node, args: list[np.ndarray]) -> np.ndarray:
    op = node.op_type
    if op == "Cast":
        return args[0].astype(ir.DataType(attr(node, "to")).numpy())
    if op in _UNARY:
        return _UNARY[op](args[0])
    if op in _BINARY:
        return _BINARY[op](args[0], args[1])
    if op == "Div":
        a, b = args
        if a.dtype.kind in "iu" and b.dtype.kind in "iu":
            if np.any(b == 0):
                raise MatchFailure.refuse(f"Div {node.name!r} divides by zero for some total length", node)
            return _int_div(a, b)
        return np.divide(a, b)
    if op in ("Max", "Min"):
        out = args[0]
        for a in args[1:]:
            out = (np.maximum if op == "Max" else np.minimum)(out, a)
        return out
    return np.where(args[0], args[1], args[2])  # Where


def condition_of_total(condition: ir.Value, totals: list[ir.Value], totals_range: np.ndarray,
                       is_total: Callable[[ir.Value], bool] | None = None) -> np.ndarray | None:
    """``condition`` evaluated for every total length in ``totals_range`` (a bool vector), or None when it does not
    depend on the total. Its cone may read only ``totals`` (and the values ``is_total`` proves to be the total,
    whatever computes them: a model-local function's output, another copy of the chain) and small constants, through
    :data:`CONDITION_OPS`: anything else raises ``MatchFailure.refuse`` naming the node that reads it."""
    total_ids = {id(v) for v in totals}
    values: dict[int, np.ndarray] = {}
    depends = False

    def visit(value: ir.Value, reader: ir.Node) -> np.ndarray:
        nonlocal depends
        if id(value) in values:
            return values[id(value)]
        const = None if id(value) in total_ids else const_array(value, max_size=SMALL_TENSOR)
        if id(value) in total_ids or (const is None and is_total is not None and is_total(value)):
            depends = True
            out = totals_range.astype(value.dtype.numpy() if value.dtype is not None else np.int64)
        elif const is not None:
            out = np.asarray(const)
        else:
            producer = value.producer()
            where = f"{reader.op_type} {reader.name!r}"
            if producer is None:
                kind = "graph input" if value.is_graph_input() else "value"
                raise MatchFailure.refuse(f"the LongRoPE condition reads {kind} {value.name!r} (in {where}), not "
                                          "only the total sequence length", reader.name or reader.op_type)
            if producer.op_type not in CONDITION_OPS or producer.domain not in ("", "ai.onnx"):
                reads = sorted({name_of(v) or "?" for n in [producer, *ancestors(producer.inputs)] for v in n.inputs
                                if v is not None and v.is_graph_input()})
                source = f" (reading graph input {', '.join(map(repr, reads))})" if reads else ""
                raise MatchFailure.refuse(f"the LongRoPE condition is computed through {producer.op_type} "
                                          f"{producer.name!r}{source}: not an elementwise function of the total "
                                          "sequence length", producer.name or producer.op_type)
            args = [visit(v, producer) if v is not None else None for v in producer.inputs]
            if any(a is None for a in args):
                raise MatchFailure.refuse(f"{producer.op_type} {producer.name!r} has an empty input",
                                          producer.name or producer.op_type)
            with np.errstate(all="ignore"):
                out = _apply(producer, args)
        values[id(value)] = out
        return out

    switch = condition.producer()
    root = switch if switch is not None else next(iter(condition.uses()))[0]
    result = visit(condition, root)
    if not depends:
        return None
    return np.broadcast_to(result, totals_range.shape).astype(bool)


def switch_offset(model: ir.Model, switch: LongRoPE, gqas: list[ir.Node], max_total: int,
                  is_total: Callable[[ir.Value], bool] | None = None) -> int:
    """The offset ``o`` for which the If ``switch`` takes its long side (its then-branch, or its else-branch where
    ``switch.negated``: ``If(Not(total > o))`` with the short table first) exactly when ``total > o``, for every total
    length 1..``max_total`` (``total`` = the total_sequence_length ``gqas`` read, through Cast/Identity, or a value
    ``is_total`` proves to be it): the condition is evaluated exactly over all of them. ``MatchFailure.refuse``
    (naming the node) when the condition reads anything else, is not elementwise, or is not of that form for any
    ``o`` in 1..max_total-1. ``is_total`` is the caller's proof that a value is the one total every GQA of the
    session reads (by value: then the GQAs may read it through different chains).
    """
    node = switch.node
    target = node
    cond = node.inputs[0] if node.inputs else None
    if cond is None:
        raise MatchFailure.refuse("If has no condition input", target)
    match = switch.condition.match if switch.condition is not None else None
    if match is not None and match.refused:  # Greater(x, y) whose threshold is not a constant
        raise MatchFailure.refuse(match.reason, target)
    totals = np.arange(1, max_total + 1, dtype=np.int64)
    try:
        chain = total_length_values(gqas)
    except MatchFailure:
        if is_total is None:
            raise
        chain = []  # different chains: the values is_total proves are the total
    taken = condition_of_total(cond, chain, totals, is_total)
    where = cond.producer() if cond.producer() is not None else node
    if taken is None:
        raise MatchFailure.refuse("the If condition does not depend on the total sequence length", where)
    if switch.negated:  # the long table is the else-branch: it is taken where the condition is false
        taken = ~taken
    long = "the If's long table (its else-branch: the then-branch is the shorter)"
    if not taken.any() or taken.all():
        which = "never" if not taken.any() else "always"
        what = f"{long} is {which} taken" if switch.negated else f"the If condition is {which} true"
        raise MatchFailure.refuse(f"{what} for totals 1..{max_total}: not a switch at an offset", where)
    offset = int(totals[int(np.argmax(taken))]) - 1
    wrong = np.nonzero(taken != (totals > offset))[0]  # totals past the first true one where it is false again
    if wrong.size:
        first, then, by = offset + 1, int(totals[wrong[0]]), f"{where.op_type} {name_of(where)!r}"
        raise MatchFailure.refuse(
            f"{long} is not taken exactly where 'total > offset' for any offset ({by}): taken at total {first}, not at "
            f"total {then}" if switch.negated else f"the If condition ({by}) is not 'total > offset' for any offset: "
            f"true at total {first}, false at total {then}", where)
    return offset

__all__ = ["CONDITION_OPS", "condition_of_total", "switch_offset", "total_length_values"]
