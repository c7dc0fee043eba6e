"""Positions for ``precompute-cos-sin``: made in the graph (``Range(past, past + length, 1)``), and the calls the
numeric evidence runs (:func:`probes`).

Exporters of models called without ``position_ids`` (optimum's Gemma family, TorchScript) compute them in the graph:
``Range(Cast(Shape(past_key)[2]), Cast(Shape(past_key)[2] + Shape(embeds)[1]), 1) → Unsqueeze(0)``. That Range is the
*position source* of the chain: the cos/sin rows are a per-token function of its values (proved from the Range output
on, by the same cone accounting as for a ``position_ids`` input), and its values are ``start .. limit - 1``.

What the Range makes is proved by value, not by form, for every call the report admits (``past >= 0``,
``length >= 1``, ``past + length <= max_positions``; every other dimension is taken to fit int32: an axis of 2^31
entries is 2 GiB even at one byte): its ``delta`` is the constant 1 however it is written; its ``start`` is never
negative for any call (:mod:`rope_passes.proofs.intervals` over the one constant evaluator, every tensor dimension in
``[0, ∞)``: ``past + (-5)`` is refused whether the ``-5`` is an initializer, a ``Constant`` ``value_int``, a ``Cast``
or a ``Gather(Concat(...))``); and its start and limit, computed exactly as sums of dimensions and constants
(:class:`Linear`; a static dimension of a graph input is its value), are ``past + c`` and ``past + c + length`` with
``c >= 0`` a constant, ``past`` axis 2 of a ``[batch, heads, past, head_dim]`` graph input named ``past…`` (the KV
cache) and ``length`` axis 1 of ``input_ids`` / ``inputs_embeds`` (through ``Gather(embedding, input_ids)`` and
same-shape ops). Then every position is in ``[0, max_positions + c)``: a table of
``max_positions + c`` rows (:attr:`RangeSource.excess` = c) holds every position of every admitted call.
:meth:`RangeSource.overflow` checks, once ``max_positions`` is known, that no integer result on the way leaves its
type for those calls. Any other Range (``2·past``, ``past·S``, ``past + S``, ``Shape(attention_mask)[1]``,
``Max(past, S)``, a length that is not the call's tokens) is refused, naming it.

The Range output has no type in exporter graphs; :attr:`RangeSource.dtype` / :attr:`RangeSource.shape` say what it
is. Reading the model for a proof never retypes it: the evaluation feeds say the type
(:func:`rope_passes.runtime.evaluate.evaluate_subgraph` types an untyped input from its feed), the cone takes the
shape as an argument, and only a rewrite that reads the Range output gives it a type.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import ancestors, attr
from rope_passes.proofs.constants import Constants
from rope_passes.proofs.intervals import ANY_DIMS, INT32, Interval, Intervals
from rope_passes.report import MatchFailure, name_of

_INT = (ir.DataType.INT64, ir.DataType.INT32)
_TYPE_RANGE = {ir.DataType.INT64: (-(2**63), 2**63 - 1), ir.DataType.INT32: (-(2**31), 2**31 - 1)}


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


# -- the Range's start and limit as exact sums of the call's dimensions ------------------------------------------
#: a graph input whose axis 2 (of ``[batch, heads, past, head_dim]``) is the call's past: the KV cache fed back
PAST_PREFIX = "past"
#: graph inputs whose axis 1 is the call's length (its tokens)
LENGTH_INPUTS = ("input_ids", "inputs_embeds")
_UNARY_SAME_SHAPE = frozenset({"Cast", "Identity", "Neg", "Abs", "Relu", "Sqrt", "Reciprocal", "Sigmoid", "Tanh",
                               "Exp", "Log", "Erf", "Softplus", "Gelu"})
_ONE_ELEMENT = frozenset({"Identity", "Squeeze", "Unsqueeze", "Reshape", "Flatten", "Expand", "Tile"})

Dim = tuple[int, int]  # (id of the tensor, axis)


@dataclasses.dataclass(frozen=True)
class Linear:
    """Every element of a value is ``const + Σ coeff · dim`` on every call (dims: tensor dimensions)."""

    terms: tuple[tuple[Dim, int], ...]  # sorted, coefficients non-zero
    const: int

    @staticmethod
    def of(terms: dict[Dim, int], const: int) -> Linear:
        return Linear(tuple(sorted((d, c) for d, c in terms.items() if c)), int(const))

    def __add__(self, other: Linear) -> Linear:
        terms = dict(self.terms)
        for d, c in other.terms:
            terms[d] = terms.get(d, 0) + c
        return Linear.of(terms, self.const + other.const)

    def scale(self, k: int) -> Linear:
        return Linear.of({d: c * k for d, c in self.terms}, self.const * k)

    def bounds(self, box: dict[Dim, tuple[int, int]], default: tuple[int, int]) -> tuple[int, int]:
        lo = hi = self.const
        for d, c in self.terms:
            a, b = box.get(d, default)
            lo, hi = lo + min(c * a, c * b), hi + max(c * a, c * b)
        return lo, hi


class _Linearize:
    """``Linear`` forms of shape arithmetic: constants, ``Shape(x)[i]`` (a static dimension of a graph input is its
    value), ``Add`` / ``Sub`` / ``Neg`` / ``Mul`` by a constant, ``Cast`` to an integer type and one-element data
    movement. Anything else (``Max``, ``Where``, a product of dimensions, a value read from a tensor) is None."""

    def __init__(self, constants: Constants) -> None:
        self.constants = constants
        self.dims: dict[Dim, tuple[ir.Value, int]] = {}
        #: (form, element type, node) of every arithmetic result: each must fit its type on every admitted call
        self.results: list[tuple[Linear, ir.DataType | None, ir.Node]] = []

    def dim(self, tensor: ir.Value, axis: int) -> Linear:
        """Axis ``axis`` of ``tensor``, followed back through same-shape ops to the graph input it comes from."""
        while True:
            shape = tensor.shape
            if axis < 0 and shape is not None:
                axis += len(shape)
            array = self.constants(tensor)
            if array is not None and 0 <= axis < array.ndim:
                return Linear((), int(array.shape[axis]))
            node = tensor.producer()
            if tensor.is_graph_input() or node is None or node.domain not in ("", "ai.onnx") or axis < 0:
                static = shape[axis] if shape is not None and 0 <= axis < len(shape) else None
                if tensor.is_graph_input() and isinstance(static, int):
                    return Linear((), static)  # a static dimension of an input: onnxruntime checks it
                self.dims[(id(tensor), axis)] = (tensor, axis)
                return Linear((((id(tensor), axis), 1),), 0)
            ins = [i for i in node.inputs if i is not None]
            if node.op_type in _UNARY_SAME_SHAPE and ins:
                tensor = ins[0]
                continue
            if node.op_type in ("Add", "Sub", "Mul", "Div") and len(ins) == 2:
                other = [self.constants(i) for i in ins]
                if other[1] is not None and other[1].ndim == 0:
                    tensor = ins[0]
                    continue
                if other[0] is not None and other[0].ndim == 0:
                    tensor = ins[1]
                    continue
            if (node.op_type == "Gather" and len(ins) == 2 and int(attr(node, "axis", 0) or 0) == 0
                    and ins[1].is_graph_input() and ins[1].shape is not None):  # its rank checked by onnxruntime
                rank = len(ins[1].shape)
                if axis < rank:  # Gather(table, ids): its leading axes are the ids'
                    tensor = ins[1]
                    continue
            self.dims[(id(tensor), axis)] = (tensor, axis)
            return Linear((((id(tensor), axis), 1),), 0)

    def __call__(self, value: ir.Value | None) -> Linear | None:
        if value is None:
            return None
        array = self.constants(value)
        if array is not None:
            if array.size != 1 or array.dtype.kind not in "iu":
                return None
            return Linear((), int(array.reshape(-1)[0]))
        node = value.producer()
        if node is None or node.domain not in ("", "ai.onnx"):
            return None
        op, ins = node.op_type, list(node.inputs)
        if op == "Gather" and len(ins) == 2 and ins[0] is not None and int(attr(node, "axis", 0) or 0) == 0:
            shape, index = ins[0].producer(), self.constants(ins[1])
            if (shape is None or shape.op_type != "Shape" or index is None or index.size != 1
                    or index.dtype.kind not in "iu"):
                return None
            start = int(attr(shape, "start", 0) or 0)
            i = int(index.reshape(-1)[0])
            if start < 0 or i < 0:
                return None
            return self.dim(shape.inputs[0], start + i)
        if op in _ONE_ELEMENT and ins and ins[0] is not None:
            return self(ins[0])  # every element of a one-element value moved: the same form
        if op == "Cast" and ins:
            found = self(ins[0])
            src = _dtype(ins[0], self.constants)
            if found is None or src is None or not src.is_integer():
                return None
            self.results.append((found, ir.DataType(attr(node, "to")), node))
            return found
        result: Linear | None = None
        if op == "Neg" and len(ins) == 1:
            a = self(ins[0])
            result = a.scale(-1) if a is not None else None
        elif op in ("Add", "Sub", "Mul") and len(ins) == 2:
            a, b = self(ins[0]), self(ins[1])
            if a is None or b is None:
                return None
            if op == "Add":
                result = a + b
            elif op == "Sub":
                result = a + b.scale(-1)
            elif not a.terms or not b.terms:
                result = b.scale(a.const) if not a.terms else a.scale(b.const)
        if result is not None:
            self.results.append((result, _dtype(value, self.constants), node))
        return result

    def describe(self, form: Linear) -> str:
        parts = []
        for name, c in sorted((f"Shape({name_of(self.dims[d][0]) or '?'})[{self.dims[d][1]}]", c) for d, c in form.terms):
            parts.append(name if c == 1 else f"-{name}" if c == -1 else f"{c}·{name}")
        if form.const or not parts:
            parts.append(str(form.const))
        return " + ".join(parts).replace("+ -", "- ")


@dataclasses.dataclass(frozen=True)
class RangeSource:
    """A ``Range`` whose output is a chain's positions, with what is proved of it: its values are exactly
    ``past + excess .. past + excess + length - 1`` on every call."""

    node: ir.Node
    dtype: ir.DataType
    start: Interval  # over every call (every dimension in [0, inf))
    excess: int  # the constant c of start = past + c (limit = past + c + length)
    past: str  # the dimension that is the call's past, as Shape(<input>)[axis]
    length: str  # the dimension that is the call's length
    #: (form, element type, op) of every integer result computing start and limit: each must fit its type
    results: tuple[tuple[Linear, ir.DataType | None, str], ...] = ()
    dims: tuple[Dim, Dim] = ((0, 0), (0, 0))  # (past, length)

    @property
    def shape(self) -> list[int | str]:
        return [f"{name_of(self.node) or 'range'}_length"]

    def overflow(self, max_positions: int) -> MatchFailure | None:
        """MatchFailure.refuse naming the Range when an integer result leaves its type for a call with
        ``past + length <= max_positions`` (onnxruntime wraps it around: the linear form would not be its value).
        Other dimensions are taken to fit int32, as everywhere."""
        box = {self.dims[0]: (0, max_positions), self.dims[1]: (0, max_positions)}
        for form, dtype, op in self.results:
            lo, hi = form.bounds(box, (0, INT32[1]))
            low, high = _TYPE_RANGE.get(dtype, _TYPE_RANGE[ir.DataType.INT32]) if dtype is not None else \
                _TYPE_RANGE[ir.DataType.INT32]
            if lo < low or hi > high:
                return MatchFailure.refuse(
                    f"Range {self.node.name!r} makes the positions, and {op} computing its start or limit reaches "
                    f"[{lo}, {hi}] for a call with past + length <= {max_positions}, outside "
                    f"{dtype.name.lower() if dtype is not None else 'int32'} "
                    "(onnxruntime wraps it around)", self.node)
        return None


def _is_past(tensor: ir.Value, axis: int) -> bool:
    """Axis 2 of a ``[batch, heads, past, head_dim]`` graph input named ``past…`` (the KV cache fed back)."""
    return (tensor.is_graph_input() and name_of(tensor).lower().startswith(PAST_PREFIX) and axis == 2
            and tensor.shape is not None and len(tensor.shape) == 4)


def _is_length(tensor: ir.Value, axis: int) -> bool:
    """Axis 1 of ``input_ids`` / ``inputs_embeds`` (the call's tokens)."""
    return tensor.is_graph_input() and tensor.name in LENGTH_INPUTS and axis == 1


def range_source(product: ir.Node) -> RangeSource | None:
    """The one ``Range(start, limit, 1)`` whose output reaches ``product`` by value (not through Shape); None when
    there is none (or more than one, or it is not an integer Range). MatchFailure.refuse naming the Range when its
    values are not proved never negative, or not proved to be ``past + c .. past + c + length - 1`` (``c >= 0`` a
    constant, ``past`` the KV cache's length, ``length`` the call's tokens), the one form whose every position is
    below ``max_positions + c`` on every call with ``past + length <= max_positions``."""
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
    where = f"Range {node.name!r} ({', '.join(name_of(v) or '?' for v in node.inputs if v is not None)})"
    target = node
    low = Intervals(ANY_DIMS, constants)(start)
    if not low.lo >= 0:
        raise MatchFailure.refuse(f"{where} makes the positions, and its start is not proved never negative (its "
                                  f"interval over every call is {low}): a negative position would read the table "
                                  "from its end", target)
    linear = _Linearize(constants)
    first, last = linear(start), linear(limit)
    form = ("the pass proves the table holds every position only for Range(past + c, past + c + length, 1): c >= 0 "
            "a constant, past = Shape(past…)[2] (a [batch, heads, past, head_dim] KV cache input), length = "
            f"Shape({' | '.join(LENGTH_INPUTS)})[1]")
    if first is None or last is None:
        which = "start" if first is None else "limit"
        raise MatchFailure.refuse(f"{where} makes the positions, and its {which} is not a sum of the call's "
                                  f"dimensions and constants (it takes a Max, Where, a product of dimensions or a "
                                  f"value): its positions are not bounded by past + length; {form}", target)
    rest = last + first.scale(-1)
    pasts = [d for d, c in first.terms]
    if not (len(first.terms) == 1 and first.terms[0][1] == 1 and _is_past(*linear.dims[pasts[0]])
            and rest.const == 0 and len(rest.terms) == 1 and rest.terms[0][1] == 1
            and _is_length(*linear.dims[rest.terms[0][0]]) and first.const >= 0):
        raise MatchFailure.refuse(f"{where} makes the positions {linear.describe(first)} .. "
                                  f"{linear.describe(last)} - 1: a call with past + length <= max_positions can "
                                  f"read past the table; {form}", target)
    (past, _), (length, _) = first.terms[0], rest.terms[0]
    results = tuple((f, t, f"{n.op_type} {n.name!r}") for f, t, n in linear.results)
    return RangeSource(node, dtype, low, first.const, linear.describe(Linear(((past, 1),), 0)),
                       linear.describe(Linear(((length, 1),), 0)), results, (past, length))


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


__all__ = ["LENGTH_INPUTS", "PAST_PREFIX", "Linear", "RangeSource", "probes", "range_source"]
