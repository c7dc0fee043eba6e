"""The steps of :class:`rope_passes.proofs.mask_walk.Walk` that compute on the mask's values (its arithmetic, sums,
padding and slices, comparisons of row sums and the ``Where`` they decide, the words of a cast that loses them): each
takes the node, the view and the abstract inputs, and returns the value or raises
:class:`~rope_passes.proofs.mask_values.Unfollowed` saying why the step is not exact for every mask (the module
docstring of :mod:`rope_passes.proofs.mask_lengths` says what each keeps)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import attr
from rope_passes.proofs.dims import Affine, _Opaque, exact_in
from rope_passes.proofs.known import OPAQUE, Dim, Known, known_values
from rope_passes.proofs.mask_values import (
    END,
    S_MAX,
    MaskRows,
    RowSums,
    RowTest,
    Unfollowed,
    Val,
    broken,
    say,
)

#: comparisons of row sums with a constant (:class:`~rope_passes.proofs.mask_values.RowTest`), and the same with the
#: operands swapped
FLIPPED = {"Greater": "Less", "Less": "Greater", "GreaterOrEqual": "LessOrEqual", "LessOrEqual": "GreaterOrEqual",
           "Equal": "Equal"}
_TYPE_RANGE = {ir.DataType.INT8: (-128, 127), ir.DataType.UINT8: (0, 255), ir.DataType.INT16: (-(2**15), 2**15 - 1),
               ir.DataType.UINT16: (0, 2**16 - 1), ir.DataType.UINT32: (0, 2**32 - 1), ir.DataType.BOOL: (0, 1)}


def solve(a: int, b: int, op: str) -> tuple[tuple[int, int], ...]:
    """The ``s`` between 0 and S_MAX where ``a * s + b`` (``a != 0``) compares with 0 by ``op``: closed ranges."""
    if op == "Equal":
        return ((-b // a, -b // a),) if b % a == 0 and 0 <= -b // a <= S_MAX else ()
    if op in ("LessOrEqual", "Less"):  # a*s + b <= 0 is (-a)*s - b >= 0; < 0 is <= -1
        a, b = -a, -b
    b -= op in ("Greater", "Less")  # > 0 is >= 1 over the integers
    lo, hi = (-(b // a), S_MAX) if a > 0 else (0, b // -a)  # a*s + b >= 0
    lo, hi = max(lo, 0), min(hi, S_MAX)
    return ((lo, hi),) if lo <= hi else ()


def _ranges(truth: tuple[tuple[int, int], ...]) -> str:
    return " or ".join(f"{lo}" if lo == hi else f"{lo}..{hi}" for lo, hi in truth) or "no row sum"


def structural(e: object) -> bool:
    """A Slice bound whose every occurrence is the same number in one call: an int, or a symbol built from the call's
    dimensions (not a bare OPAQUE, which stands for any number: two of them need not be equal; an affine form only
    where no type it may be computed in wraps it)."""
    if isinstance(e, Affine):  # the same number in int32 and int64 only where it never wraps
        return exact_in(e, 32)
    return (isinstance(e, (int, np.integer)) and not isinstance(e, (bool, np.bool_))) or (
        isinstance(e, (Dim, _Opaque)) and type(e) is not _Opaque)


def ints(node: ir.Node, ins: list[Val | None], index: int, name: str) -> list[int] | None:
    if len(ins) > index and ins[index] is not None:
        values = known_values(ins[index])
        if values is None or values.dtype == object:
            raise Unfollowed(f"takes its {name} from a value not known before the call")
        return [int(v) for v in values.reshape(-1)]
    value = attr(node, name, None)
    return None if value is None else [int(v) for v in np.asarray(value).reshape(-1)]


def entries(ins: list[Val | None], index: int, what: str) -> list:
    """The elements of input ``index``: ints and the symbols of the call's dimensions (Reshape's shape, ...)."""
    values = known_values(ins[index]) if len(ins) > index and ins[index] is not None else None
    if values is None:
        raise Unfollowed(f"takes its {what} from a value not known before the call")
    return values.reshape(-1).tolist()


def arith(node: ir.Node, x: MaskRows | RowSums, ins: list[Val | None], vals: dict[int, Val],
          uniform: Callable[[MaskRows | RowSums, object], Known]) -> Val:
    """``x`` op a constant (or, for Add, other row sums): ``uniform`` builds a tensor of ``x``'s shape."""
    other = ins[1]
    if isinstance(other, (MaskRows, RowSums)):
        if node.op_type == "Add" and isinstance(x, RowSums) and isinstance(other, RowSums):
            return sum_of(x, other)
        raise Unfollowed(f"{node.op_type.lower()}s two values read from the mask: the proof follows the sum of "
                         "two row sums over columns that together make the whole row")
    values = known_values(other) if isinstance(other, Known) and not other.varies else None
    if values is None or values.dtype == object or values.size != 1 or values.dtype.kind not in "iu":
        name = next((v.name for v in node.inputs if v is not None
                     and not isinstance(vals.get(id(v)), (MaskRows, RowSums))), "?")
        raise Unfollowed(f"combines the mask's values with {name!r}, not an integer constant "
                       "(an initializer that is also a graph input can be overridden by the caller)")
    k = int(values.reshape(-1)[0])
    axes = (1,) * max(0, values.ndim - len(x.axes)) + tuple(x.axes)
    op = node.op_type
    if (op in ("Add", "Sub") and k == 0) or (op in ("Mul", "Div") and k == 1):
        return dataclasses.replace(x, axes=axes)
    if isinstance(x, RowSums) and op in ("Add", "Sub"):
        return dataclasses.replace(x.moved(x.scale, x.offset + (k if op == "Add" else -k)), axes=axes)
    if op == "Mul" and k == 0:
        return uniform(dataclasses.replace(x, axes=axes), np.zeros((), values.dtype))  # no longer the mask's
    if op == "Mul":
        return dataclasses.replace(x.moved(x.scale * k, x.offset * k), axes=axes) if isinstance(x, RowSums) else \
            dataclasses.replace(x, axes=axes, scale=x.scale * k, extra=x.extra * k)
    if isinstance(x, RowSums):
        return dataclasses.replace(divided(x, k), axes=axes)
    if op == "Div":
        raise Unfollowed(f"divides every element of the mask by {k}: integer division rounds the values away")
    raise Unfollowed(f"{'adds' if op == 'Add' else 'subtracts'} {k} {'to' if op == 'Add' else 'from'} every "
                   "element of the mask: every row's sum changes by a multiple of its width")


def reduce(node: ir.Node, x: MaskRows, ins: list[Val | None]) -> Val:
    axes = ints(node, ins, 1, "axes")
    if not axes:
        if attr(node, "noop_with_empty_axes", 0):
            return x
        axes = list(range(len(x.axes)))
    summed = {a % len(x.axes) for a in axes}
    kinds = {x.axes[a] for a in summed} - {1}
    if kinds != {"t"}:
        raise Unfollowed(f"sums axes {sorted(summed)} ({', '.join(map(str, sorted(map(str, kinds))))}), "
                       "not the mask's columns alone")
    keep = attr(node, "keepdims", 1)
    out = tuple(1 if i in summed else a for i, a in enumerate(x.axes) if keep or i not in summed)
    return RowSums(x.source, out, 0, cols=x.cols).moved(x.scale, x.extra)


def pad(node: ir.Node, x: MaskRows, ins: list[Val | None]) -> tuple[Val, bool]:
    """The padded view, and whether it adds columns."""
    if x.cols is not None:
        raise Unfollowed("pads a slice of the mask's columns: the proof follows padding of whole rows")
    if str(attr(node, "mode", "constant")) not in ("constant", "b'constant'"):
        raise Unfollowed("pads by copying the mask's values (not mode=constant)")
    pads = ints(node, ins, 1, "pads")
    rank = len(x.axes)
    axes = ints(node, ins, 3, "axes") or list(range(rank))
    fill = known_values(ins[2]) if len(ins) > 2 and ins[2] is not None else np.array(attr(node, "value", 0))
    if pads is None or fill is None or fill.dtype == object or len(pads) != 2 * len(axes):
        raise Unfollowed("pads by amounts or a value not known before the call")
    value = int(np.asarray(fill).reshape(-1)[0])
    added = 0
    for i, a in enumerate(axes):
        before, after = pads[i], pads[i + len(axes)]
        if before < 0 or after < 0:
            raise Unfollowed("crops the mask (negative pads)")
        if before or after:
            if x.axes[a % rank] != "t":
                raise Unfollowed("pads along the batch: rows the caller did not send")
            added += before + after
    return MaskRows(x.source, x.axes, x.width if not added else OPAQUE, x.extra + added * value), bool(added)


def bounds(node: ir.Node, ins: list[Val | None], index: int, name: str) -> list | None:
    """A Slice's starts/ends: ints, or symbols of the call's dimensions (``width / 2``)."""
    if len(ins) > index and ins[index] is not None:
        return entries(ins, index, name)
    return ints(node, ins, index, name)


def slice(node: ir.Node, x: MaskRows, ins: list[Val | None]) -> Val:
    """Every row whole (``0:end`` on every axis), or one run of columns of the mask itself: ``cols``, its bounds
    as given (two Slices cut at the same bound cut at the same column, whatever it is)."""
    starts, ends = bounds(node, ins, 1, "starts"), bounds(node, ins, 2, "ends")
    if starts is None or ends is None:
        raise Unfollowed("slices by bounds not known before the call")
    axes = ints(node, ins, 3, "axes") or list(range(len(starts)))
    steps = ints(node, ins, 4, "steps") or [1] * len(starts)
    cols = None
    for s, e, st, a in zip(starts, ends, steps, axes, strict=True):
        kind = x.axes[a % len(x.axes)]
        own = kind == "t" and x.width == Dim(1)
        end = END if (isinstance(e, (int, np.integer)) and e >= 2**31 - 1) or (own and e == Dim(1)) else e
        if isinstance(s, (int, np.integer)) and s == 0 and st == 1 and end == END:
            continue
        if kind == "t" and own and st == 1 and not x.running and not x.extra and x.cols is None \
                and structural(s) and (end == END or structural(end)):
            cols = (0 if isinstance(s, (int, np.integer)) and s == 0 else s, end)
            continue
        if kind != "t" or not own or st != 1:
            raise Unfollowed(f"slices the mask ({say(s)}:{say(e)}:{st} on axes {axes}): some of each row is "
                             "dropped")
        raise Unfollowed(f"slices the mask's columns from {say(s)} to {say(e)}: a row's part the proof follows only "
                         "as one of two slices cut at the same bound, [0, m) and [m, the end), summed back into "
                         "the row (a bound of a number set per call is not known to be another's)")
    return x if cols is None else dataclasses.replace(x, cols=cols, width=OPAQUE)


def subtracted_from(x: Val, k: Val) -> Val:
    """``k - x``: ``-scale * s + (k - offset)`` of row sums ``x``."""
    values = known_values(k) if isinstance(k, Known) and not k.varies else None
    if not isinstance(x, (MaskRows, RowSums)) or values is None or values.dtype == object or values.size != 1 \
            or values.dtype.kind not in "iu":
        raise Unfollowed("subtracts the mask's values from a value that is not an integer constant")
    c = int(values.reshape(-1)[0])
    if isinstance(x, MaskRows):
        raise Unfollowed(f"subtracts every element of the mask from {c}: every row's sum changes by a multiple of "
                         "its width")
    axes = (1,) * max(0, values.ndim - len(x.axes)) + tuple(x.axes)
    return dataclasses.replace(x.moved(-x.scale, c - x.offset), axes=axes)


def divided(x: RowSums, k: int) -> RowSums:
    """``x / k``, integer Div (toward zero): an affine form again where ``k`` divides the scale and the dividend
    never changes sign (and nothing wrapped before: ``exact``)."""
    words = x.words("the mask")
    if not x.exact:
        raise Unfollowed(f"divides {words} by {k}: that form leaves int32 for some row sum, so a step on the "
                         "way may have wrapped and the numbers divided are not the form's")
    lo, hi = x.span()
    if k > 0 and x.scale % k == 0 and (lo >= 0 or hi <= 0):
        return x.moved(x.scale // k, x.offset // k if lo >= 0 else -((-x.offset) // k))
    if k > 0 and x.scale % k == 0:
        zero = next(s for s in (0, 1) if x.scale * s + x.offset != 0)
        value = x.scale * zero + x.offset
        raise Unfollowed(f"divides {words} by {k}: integer division rounds toward zero, and that value is "
                         f"negative for some rows, positive for others (a row summing to {zero} gives {value}, "
                         f"{value} / {k} is {int(value / k)}, not {value // k}): no form of the row sums")
    raise Unfollowed(f"divides {words} by {k}: {k} does not divide {x.scale}, so the quotient rounds and is no "
                     "form of the row sums")


def sum_of(x: RowSums, y: RowSums) -> RowSums:
    """``x + y``: sums of the same columns add their scales; the sums of columns ``[0, m)`` and ``[m, end)``
    (the same bound ``m``: after clamping both cut at one column) are the whole row's."""
    if x.axes != y.axes:
        raise Unfollowed(f"adds row sums shaped {x.axes} and {y.axes}: it broadcasts them against each other")
    offset = x.offset + y.offset
    if x.cols == y.cols:
        if x.scale + y.scale == 0:
            raise Unfollowed("adds row sums that cancel: the proof follows no constant made of the mask")
        return x.moved(x.scale + y.scale, offset, y.exact)
    whole = False
    if x.cols is not None and y.cols is not None and x.scale == y.scale:
        first, second = (x.cols, y.cols) if x.cols[0] == 0 else (y.cols, x.cols)
        whole = first[0] == 0 and second[1] == END and first[1] == second[0]
    if not whole:
        parts = " and ".join(f"[{say(c[0])}, {say(c[1])})" if c else "[0, the end)" for c in (x.cols, y.cols))
        raise Unfollowed(f"adds the sums of columns {parts}{'' if x.scale == y.scale else ' scaled differently'}: "
                         "not each column of the row once (the proof follows [0, m) + [m, the end))")
    return dataclasses.replace(x.moved(x.scale, offset, y.exact), cols=None)


def scalar_int(v: Val | None) -> np.ndarray | None:
    values = known_values(v) if isinstance(v, Known) and not v.varies else None
    if values is None or values.dtype == object or values.size != 1 or values.dtype.kind not in "iu":
        return None
    return values


def compare(node: ir.Node, ins: list[Val | None]) -> Val:
    """A comparison of exact row sums with an integer constant: the row sums where it holds (``RowTest``)."""
    op = node.op_type
    x, k, flipped = (ins[0], ins[1], False) if isinstance(ins[0], RowSums) else (ins[1], ins[0], True)
    if not isinstance(x, RowSums):
        raise Unfollowed("compares the mask's elements: the proof follows comparisons of row sums")
    values = scalar_int(k)
    if values is None:
        raise Unfollowed(f"compares {x.words('the mask')} with a value that is not an integer constant")
    c = int(values.reshape(-1)[0])
    if not x.exact:
        raise Unfollowed(f"compares {x.words('the mask')} with {c}: that form leaves int32 for some row sum, so a "
                         "step on the way may have wrapped and the numbers compared are not the form's")
    truth = solve(x.scale, x.offset - c, FLIPPED[op] if flipped else op)
    axes = (1,) * max(0, values.ndim - len(x.axes)) + tuple(x.axes)
    return RowTest(x.source, axes, x.cols, truth)


def tested(node: ir.Node, ins: list[Val | None]) -> Val:
    """``Not``/``Identity``/a bool ``Cast`` of a comparison of row sums, or a ``Where`` that it decides."""
    op = node.op_type
    test = ins[0]
    if isinstance(test, RowTest) and op == "Not":
        return test.negated()
    if isinstance(test, RowTest) and (op == "Identity" or (op == "Cast" and attr(node, "to") == ir.DataType.BOOL)):
        return test
    if isinstance(test, RowTest) and op == "Where" and len(ins) == 3:
        try:
            return where(test, ins[1], ins[2])
        except Unfollowed as e:
            return broken(node, str(e))
    return broken(node, "uses a comparison of the row sums in a way the proof does not follow")


def where(test: RowTest, a: Val | None, b: Val | None) -> Val:
    """``Where(test, a, b)``: one form ``g`` of the row sums where every branch is ``g`` on the rows that take it:
    a branch of the same form, or a constant that ``g`` equals for every row sum the test sends to it (``Where(s >
    0, s - 1, -1)`` is ``s - 1`` for every ``s >= 0``)."""
    forms = [v for v in (a, b) if isinstance(v, RowSums)]
    if not forms or any(not isinstance(v, (RowSums, Known)) for v in (a, b)):
        raise Unfollowed("chooses between values that are not row sums or constants")
    g = forms[0]
    if any((f.source, f.axes, f.scale, f.offset, f.cols) != (g.source, g.axes, g.scale, g.offset, g.cols)
           for f in forms):
        raise Unfollowed(f"chooses between {forms[0].words('the mask')} and {forms[1].words('the mask')}: the "
                         "proof follows a choice between one form and constants")
    if test.source is not g.source or test.axes != g.axes:
        raise Unfollowed(f"compares row sums shaped {test.axes} and chooses row sums shaped {g.axes}")
    for branch, truth in ((a, test.truth), (b, test.negated().truth)):
        if isinstance(branch, RowSums):
            continue
        values = scalar_int(branch)
        if values is None or values.ndim > len(g.axes):
            raise Unfollowed("chooses a value that is not one integer constant")
        c = int(values.reshape(-1)[0])
        if test.cols != g.cols:
            raise Unfollowed("compares the sums of other columns than it chooses")
        for lo, hi in truth:
            s = lo if g.scale * lo + g.offset != c else lo + 1 if hi > lo else None
            if s is not None:
                raise Unfollowed(f"takes {c} for a row summing to {s} (the rows summing to {_ranges(truth)} "
                                 f"take it), where {g.words('the mask')} is {g.scale * s + g.offset}")
    return dataclasses.replace(g, exact=all(f.exact for f in forms))


def cast_words(x: MaskRows | RowSums, dtype: ir.DataType | None, like: str = "to ") -> str:
    """What a cast of the mask's values to a type that does not keep them does (raised for row sums)."""
    what = "the mask's values" if x.scale == 1 else f"{x.scale} times the mask's values"
    name = dtype.name if dtype is not None else "a value of unknown type"
    if isinstance(x, RowSums) or dtype is None or dtype not in _TYPE_RANGE:
        change = "values it cannot hold exactly (or rounds) change the sums" + (
            " (a float32 sum is inexact past 2^24)" if dtype == ir.DataType.FLOAT else "")
    else:
        lo, hi = _TYPE_RANGE[dtype]
        big = x.scale if not lo <= x.scale <= hi else 300 * x.scale
        held = (big - lo) % (hi - lo + 1) + lo if dtype != ir.DataType.BOOL else 1
        change = f"it holds {lo}..{hi}, {big} becomes {held}: the sums change"
    if isinstance(x, RowSums):
        raise Unfollowed(f"casts {x.words('the mask')} {like}{name}: {change}")
    return f"casts {what} {like}{name}: {change}"


__all__ = ["FLIPPED", "arith", "bounds", "cast_words", "compare", "entries", "ints", "pad", "reduce", "slice",
           "solve", "structural", "subtracted_from", "tested"]
