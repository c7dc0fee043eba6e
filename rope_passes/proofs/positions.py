"""Positions for ``precompute-cos-sin``: made in the graph (``Range(past, past + length, 1)``), and the calls the
numeric evidence runs (:func:`probes`).

Exporters of models called without ``position_ids`` (optimum's Gemma family, TorchScript) compute them in the graph:
``Range(Cast(Shape(past_key)[2]), Cast(Shape(past_key)[2] + Shape(embeds)[1]), 1) → Unsqueeze(0)``. That Range is the
*position source* of the chain: the cos/sin rows are a per-token function of its values (proved from the Range output
on, by the same cone accounting as for a ``position_ids`` input), and its values are ``start .. limit - 1``.

What the Range makes is proved by value, not by form (:mod:`rope_passes.proofs.intervals` over the one constant
evaluator; every dimension is taken to fit int32: an axis of 2^31 entries is 2 GiB even at one byte): its
``delta`` is the constant 1 however it is written; its ``start`` is never negative for any call (its
interval, every tensor dimension in ``[0, ∞)``, starts at 0 or above: ``past + (-5)`` is refused whether the ``-5`` is
an initializer, a ``Constant`` ``value_int``, a ``Cast`` or a ``Gather(Concat(...))``); and its ``limit`` exceeds the
call's ``past + length`` by at most a constant :attr:`RangeSource.excess` (the limit with every dimension 0), so a
table of ``max_positions + excess`` rows holds every position of the calls with ``past + length <= max_positions``.

The Range output has no type in exporter graphs; :attr:`RangeSource.dtype` / :attr:`RangeSource.shape` say what it
is. Reading the model for a proof never retypes it: the evaluation feeds say the type
(:func:`rope_passes.runtime.evaluate.evaluate_subgraph` types an untyped input from its feed), the cone takes the
shape as an argument, and only a rewrite that reads the Range output gives it a type.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import ancestors, attr
from rope_passes.proofs.constants import Constants
from rope_passes.proofs.intervals import ANY_DIMS, Assumptions, Interval, Intervals
from rope_passes.report import MatchFailure

_INT = (ir.DataType.INT64, ir.DataType.INT32)
#: every dimension 0: what a Range's limit is beyond the call's own sizes
_ZERO_DIMS = Assumptions(dims=Interval(0, 0), inputs_default=Interval(-math.inf, math.inf))


def _dtype(value: ir.Value | None, constants: Constants) -> ir.DataType | None:
    """The element type of an untyped shape-arithmetic value: its declared type, its constant's, Cast's, Shape's."""
    while value is not None:
        if value.dtype is not None:
            return value.dtype
        array = constants(value)
        if array is not None:
            return ir.DataType.from_numpy(array.dtype) if array.dtype != object else None
        producer = value.producer()
        if producer is None:
            return None
        if producer.op_type == "Cast":
            return ir.DataType(attr(producer, "to"))
        if producer.op_type in ("Shape", "Size"):
            return ir.DataType.INT64
        if producer.op_type not in ("Gather", "Add", "Sub", "Mul", "Identity", "Squeeze", "Unsqueeze", "Reshape",
                                    "Concat", "Max", "Min"):
            return None
        value = producer.inputs[0]
    return None


def _reads_values(value: ir.Value) -> bool:
    """True when ``value`` reads a graph input's elements (not only its shape)."""
    if value.is_graph_input():
        return True
    nodes = ancestors([value], stop=("Shape", "Size"))
    return any(v is not None and v.is_graph_input() for n in nodes if n.op_type not in ("Shape", "Size")
               for v in n.inputs)


@dataclasses.dataclass(frozen=True)
class RangeSource:
    """A ``Range`` whose output is a chain's positions, with what is proved of it."""

    node: ir.Node
    dtype: ir.DataType
    start: Interval  # over every call (every dimension in [0, inf))
    excess: int  # limit - (the call's sizes): the limit with every dimension 0

    @property
    def shape(self) -> list[int | str]:
        return [f"{self.node.name or 'range'}_length"]


def range_source(product: ir.Node) -> RangeSource | None:
    """The one ``Range(start, limit, 1)`` whose output reaches ``product`` by value (not through Shape); None when
    there is none (or more than one, or it is not an integer Range). MatchFailure.refuse naming the Range when its
    values are not proved never negative, or its limit is not the call's sizes plus a constant."""
    found = [n for n in ancestors(product.inputs, stop=("Shape", "Size", "Range")) if n.op_type == "Range"
             and n.domain in ("", "ai.onnx")]
    if len(found) != 1:
        return None
    (node,) = found
    start, limit, delta = node.inputs
    constants = Constants()
    step = constants(delta)
    dtype = _dtype(start, constants)
    if step is None or step.size != 1 or step.dtype == object or dtype not in _INT:
        return None
    if int(step.reshape(-1)[0]) != 1:
        return None
    if _reads_values(start) or _reads_values(limit):
        return None  # its start or limit is read from a tensor's values: those values are the positions, not this
    where = f"Range {node.name!r} ({', '.join(v.name or '?' for v in node.inputs if v is not None)})"
    low = Intervals(ANY_DIMS, constants)(start)
    if not low.lo >= 0:
        raise MatchFailure.refuse(f"{where} makes the positions, and its start is not proved never negative (its "
                                  f"interval over every call is {low}): a negative position would read the table "
                                  "from its end", node.name or "<model>")
    excess = Intervals(_ZERO_DIMS, constants)(limit)
    if math.isinf(excess.hi) or math.isinf(Intervals(ANY_DIMS, constants)(limit).lo):
        raise MatchFailure.refuse(f"{where} makes the positions, and its limit is not the call's sizes plus a "
                                  "constant (it reads a value, not only shapes): the largest position is not bounded "
                                  "by the call", node.name or "<model>")
    return RangeSource(node, dtype, low, max(int(excess.hi), 0))


def probes(rows: int, three: bool, switches: tuple[int, ...] = ()) -> list[tuple[str, np.ndarray]]:
    """Calls differing in what callers vary: the table (0..rows-1), permuted, batch 1..3, one and two tokens at the
    smallest and largest positions, windows across every power of two and every ``switches`` position, and random
    calls; for ``[3, B, S]`` positions also with the three axes differing."""
    rng = np.random.RandomState(0)
    last = rows - 1
    edges = sorted({b for b in [*(1 << k for k in range(1, 40) if (1 << k) < rows), *switches] if 0 < b < rows})
    out = [("positions 0..max_positions-1", np.arange(rows)[None, :]),
           ("permuted positions", rng.permutation(rows)[None, :]),
           ("a batch of 2 full-length calls", np.stack([np.arange(rows)[::-1], rng.permutation(rows)])),
           ("one token at position 0", np.array([[0]])),
           (f"one token at position {last}", np.array([[last]])),
           ("one token, batch 3", np.array([[min(5, last)], [last], [0]])),
           ("two tokens at the end", np.array([[max(last - 1, 0), last]])),
           ("two tokens, batch 2", np.array([[0, min(1, last)], [last, min(3, last)]])),
           ("positions of another batch and length", rng.randint(0, rows, size=(2, 3))),
           ("positions of batch 3, length 5", rng.randint(0, rows, size=(3, 5)))]
    for b in edges:
        window = np.clip(np.arange(b - 2, b + 2), 0, last)
        out += [(f"4 tokens across {b}", window[None, :]), (f"one token at {b - 1}", np.array([[b - 1]])),
                (f"one token at {b}", np.array([[b]])), (f"offset calls across {b}", np.stack([window, window[::-1]]))]
    if not three:
        return out
    shifted = [(f"{label}, axes differing", np.stack([p, (p + 7) % rows, p[:, ::-1]])) for label, p in out[1:]]
    return [(label, np.stack([p, p, p])) for label, p in out] + shifted


__all__ = ["RangeSource", "probes", "range_source"]
