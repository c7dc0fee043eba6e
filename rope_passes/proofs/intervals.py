"""Integer ranges: an interval ``[lo, hi]`` that holds every element of an integer value on every call the
assumptions allow.

The analysis walks a value's cone. A constant cone (:mod:`rope_passes.proofs.constants`) is its exact
``[min, max]``; a graph input is what the :class:`Assumptions` say (the documented contract with the caller: by
default an integer input fits int32, as positions and lengths do); ``Shape`` / ``Size`` are ``[0, dims]``
(:attr:`Assumptions.dims`), and a product of distinct dimensions of one tensor (``batch * seq``: part of its element
count) is at most :attr:`Assumptions.elements`; the rest follows the ops: data movement (``Gather``, ``Reshape``, ``Concat``, ``Slice``,
``Expand``...) keeps its data's interval (the hull of its inputs), ``Add`` / ``Sub`` / ``Mul`` / ``Neg`` / ``Abs`` /
``Max`` / ``Min`` / ``Div`` / ``Mod`` are interval arithmetic (``ReduceProd`` of a run of one tensor's
``Shape`` entries - ``Shape(x, start, end)`` or ``Slice(Shape(x))`` by constants - is such a product too), ``Range(start, limit, delta)`` with a constant
``delta`` lies between ``start`` and ``limit``, ``Where`` is the hull of its branches, a ``Cast`` to an integer type
keeps the interval when it fits that type, comparisons are ``[0, 1]``. Anything else (reductions that sum, control
flow, custom ops, a float computation cast to an integer) is :data:`UNBOUNDED`: nothing is known, and a proof that
needs a bound refuses.

Arithmetic is exact on Python integers; a result that leaves the value's type
wraps around in onnxruntime, so it is :data:`UNBOUNDED` too — a value that leaves int32 and comes back is bounded
only where the graph's own arithmetic keeps it bounded. Untyped values (exporters leave shape arithmetic untyped)
take their type from their op (Cast's ``to``, Shape's int64, input 0's); one whose type cannot be told is held to
int32.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import attr
from rope_passes.proofs.constants import Constants

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
_TYPE_RANGE = {ir.DataType.INT32: INT32, ir.DataType.INT64: INT64, ir.DataType.INT16: (-(2**15), 2**15 - 1),
               ir.DataType.INT8: (-128, 127), ir.DataType.UINT8: (0, 255), ir.DataType.UINT16: (0, 2**16 - 1),
               ir.DataType.UINT32: (0, 2**32 - 1), ir.DataType.BOOL: (0, 1)}


@dataclasses.dataclass(frozen=True)
class Interval:
    lo: float  # an int, or -inf
    hi: float  # an int, or +inf

    def within(self, lo: int, hi: int) -> bool:
        return lo <= self.lo and self.hi <= hi

    def fits_int32(self) -> bool:
        return self.within(*INT32)

    def __str__(self) -> str:
        def show(x: float) -> str:
            return str(x) if math.isinf(x) else f"{int(x)}"
        return f"[{show(self.lo)}, {show(self.hi)}]"


UNBOUNDED = Interval(-math.inf, math.inf)


def _hull(*items: Interval) -> Interval:
    return Interval(min(i.lo for i in items), max(i.hi for i in items))


def _corners(a: Interval, b: Interval, fn: Callable[[float, float], float]) -> Interval:
    if any(math.isinf(x) for x in (a.lo, a.hi, b.lo, b.hi)):
        return UNBOUNDED
    values = [fn(x, y) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
    return Interval(min(values), max(values))


def _trunc_div(x: float, y: float) -> int:
    q = abs(int(x)) // abs(int(y))
    return q if (x >= 0) == (y > 0) else -q


@dataclasses.dataclass(frozen=True)
class Assumptions:
    """What the analysis takes as given about a call (the documented contract; say it in the report)."""

    #: every tensor dimension (what Shape / Size give, a Range's length)
    dims: Interval = Interval(0, INT32[1])
    #: a product of distinct dimensions of one tensor (its element count, or part of it: ``batch * seq``) is at most
    #: this: a tensor of 2^31 elements is 4 GiB even in fp16, past what a WebGPU storage binding holds
    elements: int = INT32[1]
    #: an integer graph input's elements, by input name, else :attr:`inputs_default`
    inputs: tuple[tuple[str, Interval], ...] = ()
    inputs_default: Interval = Interval(*INT32)

    def of_input(self, value: ir.Value) -> Interval:
        named = dict(self.inputs)
        if value.name in named:
            return named[value.name]
        if value.dtype is not None and not value.dtype.is_integer() and value.dtype != ir.DataType.BOOL:
            return UNBOUNDED
        if value.dtype == ir.DataType.BOOL:
            return Interval(0, 1)
        return self.inputs_default


#: the assumption narrow-int64 documents: integer inputs and dimensions fit int32
FITS_INT32 = Assumptions()
#: a proof over every call the graph accepts: any dimension (up to int32: an axis of 2^31 entries is 2 GiB even at
#: one byte per entry), no input value known
ANY_DIMS = Assumptions(inputs_default=UNBOUNDED)

_KEEP = frozenset({"Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose", "Expand", "Tile", "Slice",
                   "Gather", "GatherElements", "GatherND", "Split", "ReduceMax", "ReduceMin", "Compress", "DepthToSpace",
                   "SpaceToDepth"})
_BOOL = frozenset({"Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "And", "Or", "Xor", "Not", "IsNaN",
                   "IsInf"})


class Intervals:
    """The interval of every integer value asked about, under one set of :class:`Assumptions` (memoised)."""

    def __init__(self, assumptions: Assumptions = FITS_INT32, constants: Constants | None = None) -> None:
        self.assume = assumptions
        self.constants = constants if constants is not None else Constants()
        self._memo: dict[int, Interval] = {}
        #: values that are a product of distinct dimensions of one tensor: (id of the tensor, its axes)
        self._dims_of: dict[int, tuple[int, frozenset[int]]] = {}
        self._dtypes: dict[int, ir.DataType | None] = {}
        self._keep: list[ir.Value] = []

    def __call__(self, value: ir.Value | None) -> Interval:
        if value is None:
            return UNBOUNDED
        stack: list[tuple[ir.Value, bool]] = [(value, False)]
        while stack:
            v, ready = stack.pop()
            if id(v) in self._memo:
                continue
            array = self.constants(v)
            node = v.producer()
            if array is not None or node is None or node.domain not in ("", "ai.onnx"):
                self._set(v, self._leaf(v, array))
                continue
            if not ready:
                stack.append((v, True))
                stack.extend((i, False) for i in node.inputs if i is not None and id(i) not in self._memo)
                continue
            for out in node.outputs:
                self._dtypes[id(out)] = self._infer_dtype(node, out)
                found = self._node(node, out)
                product = self._product_of_dims(node)
                if product is not None:
                    self._dims_of[id(out)] = product
                    found = Interval(max(found.lo, 0), min(found.hi, self.assume.elements))
                self._set(out, self._type_clip(self._dtypes[id(out)], found))
        return self._memo[id(value)]

    def _dtype(self, v: ir.Value | None) -> ir.DataType | None:
        if v is None:
            return None
        if v.dtype is not None:
            return v.dtype
        if id(v) in self._dtypes:
            return self._dtypes[id(v)]
        array = self.constants(v)
        if array is not None and array.dtype != object:
            return ir.DataType.from_numpy(array.dtype)
        return None

    def _infer_dtype(self, node: ir.Node, out: ir.Value) -> ir.DataType | None:
        """The element type of an output the graph does not declare (exporters leave shape arithmetic untyped)."""
        if out.dtype is not None:
            return out.dtype
        array = self.constants(out)
        if array is not None and array.dtype != object:
            return ir.DataType.from_numpy(array.dtype)
        op = node.op_type
        if op == "Cast":
            return ir.DataType(attr(node, "to"))
        if op in ("Shape", "Size"):
            return ir.DataType.INT64
        if op in _BOOL:
            return ir.DataType.BOOL
        if op == "Where" and len(node.inputs) == 3:
            return self._dtype(node.inputs[1])
        if op in _KEEP or op in ("Concat", "Max", "Min", "Sum", "Neg", "Abs", "Relu", "Add", "Sub", "Mul", "Div",
                                 "Mod", "Range"):
            return self._dtype(node.inputs[0]) if node.inputs else None
        return None

    def _set(self, v: ir.Value, interval: Interval) -> None:
        self._memo[id(v)] = interval
        self._keep.append(v)

    def _leaf(self, v: ir.Value, array: np.ndarray | None) -> Interval:
        if array is not None:
            if array.dtype == object or array.size == 0 or not (np.issubdtype(array.dtype, np.integer)
                                                                 or array.dtype == np.bool_):
                return UNBOUNDED if array.size else Interval(0, 0)
            return Interval(int(array.min()), int(array.max()))
        if v.is_graph_input():
            return self.assume.of_input(v)
        return UNBOUNDED

    @staticmethod
    def _type_clip(dtype: ir.DataType | None, interval: Interval) -> Interval:
        """A result outside its type wraps around in onnxruntime: nothing is known then. A value of unknown type is
        held to int32 (the narrowest integer type positions come in: never more than proved)."""
        bounds = _TYPE_RANGE.get(dtype, INT64) if dtype is not None else INT32
        return interval if interval.within(*bounds) else UNBOUNDED

    def _product_of_dims(self, node: ir.Node) -> tuple[int, frozenset[int]] | None:
        """(tensor, axes) when ``node``'s output is the product of distinct dimensions of one tensor: ``Gather`` of
        one constant entry of its ``Shape``, ``Size``, such values moved or cast, and their products."""
        op = node.op_type
        ins = [i for i in node.inputs if i is not None]
        if op == "Size" and ins:
            return id(ins[0]), frozenset({-1})  # every axis
        if op == "Gather" and len(ins) == 2 and int(attr(node, "axis", 0) or 0) == 0:
            shape = ins[0].producer()
            index = self.constants(ins[1])
            if (shape is None or shape.op_type != "Shape" or shape.domain not in ("", "ai.onnx") or index is None
                    or index.size != 1 or index.dtype.kind != "i" or int(index.reshape(-1)[0]) < 0
                    or attr(shape, "start", 0) not in (0, None) or attr(shape, "end", None) is not None):
                return None
            return id(shape.inputs[0]), frozenset({int(index.reshape(-1)[0])})
        if op == "ReduceProd" and len(ins) == 1 and not attr(node, "axes", None):
            # the product of a run of a Shape's entries: Shape(x, start, end), or a Slice of Shape(x) by constants
            return self._shape_run(ins[0])
        if op in ("Identity", "Squeeze", "Unsqueeze", "Reshape", "Flatten") and ins:
            return self._dims_of.get(id(ins[0]))
        if op == "Cast" and ins and ir.DataType(attr(node, "to")) in (ir.DataType.INT64, ir.DataType.INT32):
            return self._dims_of.get(id(ins[0]))
        if op == "Mul" and len(ins) == 2:
            a, b = self._dims_of.get(id(ins[0])), self._dims_of.get(id(ins[1]))
            if a is not None and b is not None and a[0] == b[0] and not (a[1] & b[1]) and -1 not in a[1] | b[1]:
                return a[0], a[1] | b[1]
        return None

    def _shape_run(self, value: ir.Value) -> tuple[int, frozenset[int]] | None:
        """(tensor, axes) when ``value`` is a run of distinct entries of one tensor's shape: ``Shape(x)`` with or
        without start/end, or ``Slice(Shape(x), start, end)`` by constants (step 1, axis 0); the axes are concrete
        when x's rank is known, else the every-axis marker."""
        node = value.producer()
        if node is None or node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type == "Slice":
            ins = list(node.inputs)
            if len(ins) < 3 or any(i is None for i in ins[:3]):
                return None
            for index, want in ((3, 0), (4, 1)):  # axes [0], steps [1] (absent: the same)
                if len(ins) > index and ins[index] is not None:
                    given = self.constants(ins[index])
                    if given is None or given.size != 1 or int(given.reshape(-1)[0]) != want:
                        return None
            starts, ends = self.constants(ins[1]), self.constants(ins[2])
            if starts is None or ends is None or starts.size != 1 or ends.size != 1:
                return None
            if not self._whole_shape(ins[0]):
                return None
            shape = ins[0].producer()
            run = self._axes(shape, int(starts.reshape(-1)[0]), int(ends.reshape(-1)[0]))
            return None if run is None else (id(shape.inputs[0]), run)
        if node.op_type != "Shape" or not node.inputs or node.inputs[0] is None:
            return None
        start = int(attr(node, "start", 0) or 0)
        end = attr(node, "end", None)
        run = self._axes(node, start, None if end is None else int(end))
        return None if run is None else (id(node.inputs[0]), run)

    @staticmethod
    def _whole_shape(value: ir.Value) -> bool:
        node = value.producer()
        return (node is not None and node.op_type == "Shape" and attr(node, "start", 0) in (0, None)
                and attr(node, "end", None) is None)

    @staticmethod
    def _axes(shape_node: ir.Node | None, start: int, end: int | None) -> frozenset[int] | None:
        """The axes ``start:end`` of the tensor ``shape_node`` reads (Python slice rules, as Shape and Slice
        clamp), or the every-axis marker when its rank is unknown."""
        if shape_node is None or not shape_node.inputs or shape_node.inputs[0] is None:
            return None
        x_shape = shape_node.inputs[0].shape
        if x_shape is None:
            return frozenset({-1})
        return frozenset(range(len(x_shape))[start:end])

    def _node(self, node: ir.Node, out: ir.Value) -> Interval:
        op = node.op_type
        ins = [self._memo[id(i)] if i is not None else None for i in node.inputs]
        first = ins[0] if ins else None
        if op in ("Shape", "Size"):
            return self.assume.dims
        if op in _BOOL:
            return Interval(0, 1)
        if op == "Cast":
            to = ir.DataType(attr(node, "to"))
            src = self._dtype(node.inputs[0])
            if src is not None and src.is_floating_point():
                return UNBOUNDED  # a float computation: not tracked
            bounds = _TYPE_RANGE.get(to)
            return first if first is not None and bounds is not None and first.within(*bounds) else UNBOUNDED
        if op in _KEEP and first is not None:
            return first
        if op == "Concat" or op == "Max" or op == "Min" or op == "Sum":
            present = [i for i in ins if i is not None]
            if not present:
                return UNBOUNDED
            if op == "Concat":
                return _hull(*present)
            if op == "Max":
                return Interval(max(i.lo for i in present), max(i.hi for i in present))
            if op == "Min":
                return Interval(min(i.lo for i in present), min(i.hi for i in present))
            return Interval(sum(i.lo for i in present), sum(i.hi for i in present))
        if op == "Where" and len(ins) == 3 and ins[1] is not None and ins[2] is not None:
            return _hull(ins[1], ins[2])
        if op == "Neg" and first is not None:
            return Interval(-first.hi, -first.lo)
        if op == "Abs" and first is not None:
            if first.lo >= 0:
                return first
            return Interval(0 if first.hi >= 0 else -first.hi, max(-first.lo, first.hi))
        if op == "Relu" and first is not None:
            return Interval(max(first.lo, 0), max(first.hi, 0))
        if op == "ConstantOfShape":
            value = attr(node, "value", None)
            if value is None:
                return Interval(0, 0)
            array = value.numpy()
            return self._leaf(out, array)
        if len(ins) == 2 and ins[0] is not None and ins[1] is not None:
            a, b = ins
            if op == "Add":
                return Interval(a.lo + b.lo, a.hi + b.hi)
            if op == "Sub":
                return Interval(a.lo - b.hi, a.hi - b.lo)
            if op == "Mul":
                return _corners(a, b, lambda x, y: x * y)
            if op == "Div" and (b.lo > 0 or b.hi < 0):  # integer Div truncates toward zero
                return _corners(a, b, _trunc_div)
            if op == "Mod" and b.lo > 0 and not math.isinf(b.hi):  # fmod=0: the sign of the divisor
                return Interval(0, b.hi - 1)
        if op == "Range" and len(ins) == 3 and all(i is not None for i in ins):
            start, limit, delta = ins
            if delta.lo > 0:
                return Interval(start.lo, limit.hi - 1) if start.lo <= limit.hi - 1 else Interval(start.lo, start.lo)
            if delta.hi < 0:
                return Interval(limit.lo + 1, start.hi)
        return UNBOUNDED


def interval(value: ir.Value, assumptions: Assumptions = FITS_INT32) -> Interval:
    return Intervals(assumptions)(value)


__all__ = ["ANY_DIMS", "FITS_INT32", "INT32", "INT64", "UNBOUNDED", "Assumptions", "Interval", "Intervals", "interval"]
