"""The symbols of call-dependent numbers the abstract evaluators track (:mod:`rope_passes.proofs.known`): a call's
dimension (:class:`Dim`, ``positions.shape[k]`` or the mask's), a number nothing is known about (:data:`OPAQUE`), an
affine function of one dimension (:class:`Affine`) and the quotient of one by a positive number (:class:`Quot`), with
the elementwise identities on them (:func:`symbolic`): integer ``Add``/``Sub``/``Mul``/``Neg`` with constants (exact in
wrapping arithmetic, a ring), ``Div`` by a positive constant (of a value whose every possible number is representable
in the op's type, so nothing wrapped: by a divisor of its scale an affine form again, else a :class:`Quot`),
``Max``/``Min`` of a dimension with a number outside its range (:data:`DIM_MAX`), integer casts, and the few
comparisons shape plumbing needs.

A dimension is taken between 0 and :data:`DIM_MAX` (2^31 - 1): the lengths GroupQueryAttention reads are int32, and
a tensor 2^31 long along one axis is none a caller of these graphs sends."""

from __future__ import annotations

import dataclasses
from typing import Union

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import attr


@dataclasses.dataclass(frozen=True)
class Dim:
    """``positions.shape[axis]`` (a call's batch or length)."""

    axis: int

    def __repr__(self) -> str:
        return f"positions.shape[{self.axis}]"


class _Opaque:
    def __repr__(self) -> str:
        return "?"


OPAQUE = _Opaque()  # a call-dependent number nothing more is known about
Ext = Union[int, Dim, _Opaque]  # noqa: UP007 - a runtime alias


@dataclasses.dataclass(frozen=True, repr=False)
class Affine(_Opaque):
    """``scale * dim + offset``: a call dimension through integer ``Add``/``Sub``/``Mul``/``Neg`` with constants.
    Opaque to every rule that does not know it (a subclass of the opaque number); exact in wrapping integer
    arithmetic, a ring, so ``1000 - (1000 - w)`` is ``w`` even where ``1000 - w`` wraps. Only :func:`affine`
    builds one, which gives the dimension itself back (``1 * dim + 0``) and a plain number for ``0 * dim``."""

    dim: Dim
    scale: int
    offset: int

    def __repr__(self) -> str:
        return f"{self.scale} * {self.dim!r} {self.offset:+d}"


@dataclasses.dataclass(frozen=True, repr=False)
class Foreign(_Opaque):
    """Dimension ``axis`` of another graph input than the one the proof is about (``input_ids``' length, say): as
    opaque as any call-dependent number, but a refusal can name where it came from."""

    source: str
    axis: int

    def __repr__(self) -> str:
        return f"dimension {self.axis} of {self.source!r}"


_INT64 = 1 << 64
#: the largest value a call dimension is taken to have (see the module docstring)
DIM_MAX = (1 << 31) - 1
_RANGE = {32: (-(1 << 31), (1 << 31) - 1), 64: (-(1 << 63), (1 << 63) - 1)}


@dataclasses.dataclass(frozen=True, repr=False)
class Quot(_Opaque):
    """``num // k`` for a value ``num`` (a :class:`Dim` or an :class:`Affine` of one) that is never negative and a
    number ``k > 1``: integer ``Div`` rounds it down. Opaque to every rule but equality: the same expression of the
    same call dimension is the same number (two ``Slice`` bounds cut at ``width / 2`` cut at the same column)."""

    num: object
    k: int

    def __repr__(self) -> str:
        return f"({self.num!r}) / {self.k}"


def span(x: object) -> tuple[int, int] | None:
    """The integers ``x`` (a number, a dimension, an affine form or a quotient of one) takes over every call, each
    dimension between 0 and :data:`DIM_MAX`; None for anything else."""
    if isinstance(x, Quot):
        inner = span(x.num)
        return None if inner is None else (inner[0] // x.k, inner[1] // x.k)
    form = _linear(x)
    if form is None:
        return None
    dim, a, b = form
    if dim is None:
        return b, b
    return min(b, a * DIM_MAX + b), max(b, a * DIM_MAX + b)


def exact_in(x: object, bits: int) -> bool:
    """``x``'s symbolic form is its number in a ``bits``-wide integer op: every number it takes is representable there
    (an affine form is exact in wrapping arithmetic only modulo 2^bits: one that may exceed the type wrapped)."""
    found = span(x)
    lo, hi = _RANGE[bits]
    return found is not None and lo <= found[0] and found[1] <= hi


def affine(dim: Dim, scale: int, offset: int) -> object:
    """``scale * dim + offset`` in int64's wrapping arithmetic, normalised (the dimension, a number, an Affine)."""
    scale, offset = (scale + _INT64 // 2) % _INT64 - _INT64 // 2, (offset + _INT64 // 2) % _INT64 - _INT64 // 2
    if scale == 0:  # a number: the same in int32 and int64 only within int32's range (else not known)
        return offset if -(1 << 31) <= offset < 1 << 31 else OPAQUE
    return dim if (scale, offset) == (1, 0) else Affine(dim, scale, offset)


def _linear(x: object) -> tuple[Dim | None, int, int] | None:
    """``x`` as (dimension, scale, offset), None for anything but an integer, a Dim or an Affine."""
    if isinstance(x, Dim):
        return x, 1, 0
    if isinstance(x, Affine):
        return x.dim, x.scale, x.offset
    if isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)):
        return None, 0, int(x)
    return None


def _affine_op(op: str, xs: tuple) -> object:
    """Add/Sub/Mul/Neg of integers and affine forms of one dimension (OPAQUE for anything else: a product of two
    dimensions, two different dimensions, a float)."""
    forms = [_linear(x) for x in xs]
    if any(f is None for f in forms):
        return OPAQUE
    dims = {f[0] for f in forms if f is not None and f[0] is not None}
    if len(dims) != 1:
        return OPAQUE
    dim = dims.pop()
    (_, a, b), (_, c, d) = forms[0], forms[1] if len(forms) > 1 else (None, 0, 0)
    if op == "Neg":
        return affine(dim, -a, -b)
    if op in ("Add", "Sub"):
        sign = 1 if op == "Add" else -1
        return affine(dim, a + sign * c, b + sign * d)
    if a and c:  # Mul of two forms of the dimension: not affine
        return OPAQUE
    return affine(dim, a * d + c * b, b * d)


def symbolic(node: ir.Node, arrays: list[np.ndarray | None]) -> list[np.ndarray]:
    """An elementwise op on arrays holding call dimensions: the few identities shape plumbing needs, OPAQUE else."""
    op = node.op_type
    present = [a for a in arrays if a is not None]
    if op in ("Cast", "CastLike"):  # to an integer type: a dimension stays itself (below 2^31), an Affine too where
        # the cast keeps int64's arithmetic modulo a power of two (to int32, or int64 to int64), not a widening
        source = node.inputs[0].dtype if node.inputs and node.inputs[0] is not None else None
        if op == "Cast":
            to = attr(node, "to", None)
            target = ir.DataType(to) if to is not None else None
        else:
            target = ir.DataType.from_numpy(present[1].dtype) if len(present) > 1 and present[1].dtype != object \
                else node.inputs[1].dtype if len(node.inputs) > 1 and node.inputs[1] is not None else None
        keep = target in (ir.DataType.INT64, ir.DataType.INT32)
        ring = target == ir.DataType.INT32 or (target == ir.DataType.INT64 and source == ir.DataType.INT64)

        def cast(x: object) -> object:
            if isinstance(x, Affine):
                return x if ring else OPAQUE
            return x if keep or not isinstance(x, (Dim, _Opaque)) else OPAQUE
        return [np.vectorize(cast, otypes=[object])(present[0])]
    bits = _bits(node, present)
    fn = np.vectorize(lambda *xs: _scalar(op, xs, bits), otypes=[object])
    return [fn(*present)]


def _bits(node: ir.Node, arrays: list[np.ndarray]) -> int:
    """The width of ``node``'s integer type: a numeric operand's (ONNX gives both operands one type), else a typed
    input's or output's; 32 where none tells (the narrower: a form exact there is exact in int64 too)."""
    for a in arrays:
        if a.dtype != object and a.dtype.kind in "iu":
            return 64 if a.dtype.itemsize == 8 else 32
    for v in [*node.inputs, *node.outputs]:
        if v is not None and v.dtype in (ir.DataType.INT64, ir.DataType.UINT64):
            return 64
    return 32


def affine_sum(a: object, b: object) -> object:
    """``a + b`` for ints and affine forms of one dimension (OPAQUE otherwise)."""
    return _affine_op("Add", (a, b)) if not (isinstance(a, int) and isinstance(b, int)) else a + b


def _bound(op: str, a: object, b: object, bits: int) -> object:
    """``Max``/``Min`` of a dimension (or an affine form of one that is exact in the op's type) and itself or an
    integer outside its range: ``Max(d, c)`` is ``d`` for ``c <= 0`` and ``c`` for ``c >= DIM_MAX``, ``Min`` the other
    way round (``Min(width, 2^40)`` is the width); a number inside the range depends on the call (OPAQUE)."""
    if a == b and isinstance(a, (Dim, Affine)):
        return a
    sym, other = (a, b) if isinstance(a, (Dim, Affine)) else (b, a)
    if not isinstance(sym, (Dim, Affine)) or not exact_in(sym, bits) or _linear(other) is None \
            or isinstance(other, (Dim, Affine)):
        return OPAQUE
    lo, hi = span(sym)  # type: ignore[misc]
    c = int(other)  # type: ignore[call-overload]
    if c <= lo:
        return sym if op == "Max" else c
    if c >= hi:
        return c if op == "Max" else sym
    return OPAQUE


def _divide(x: object, k: object, bits: int) -> object:
    """``x / k`` (integer ``Div``, rounding toward zero) for an exact form ``x`` of one dimension and a number
    ``k > 0``: ``(a * d + b) / k`` is ``(a / k) * d + b // k`` where ``k`` divides ``a`` and the dividend never changes
    sign (``(2 * w) / 2`` is ``w``); otherwise, for a dividend never negative, the quotient :class:`Quot`."""
    divisor = _linear(k)
    if not isinstance(x, (Dim, Affine)) or divisor is None or divisor[0] is not None or divisor[2] <= 0 \
            or not exact_in(x, bits):
        return OPAQUE
    k = divisor[2]
    if k == 1:
        return x
    dim, a, b = _linear(x)  # type: ignore[misc]
    lo, hi = span(x)  # type: ignore[misc]
    if a % k == 0 and (lo >= 0 or hi <= 0):
        return affine(dim, a // k, b // k if lo >= 0 else -((-b) // k))  # type: ignore[arg-type]
    return Quot(x, k) if lo >= 0 else OPAQUE


def _scalar(op: str, xs: tuple, bits: int = 32) -> object:
    syms = [x for x in xs if isinstance(x, (Dim, _Opaque))]
    if not syms:
        numbers = [np.asarray(x) for x in xs]
        try:
            if op in ("Add", "Sub", "Mul", "Neg") and all(n.dtype.kind in "iu" for n in numbers):
                a, b = int(numbers[0]), int(numbers[-1])
                out = {"Add": a + b, "Sub": a - b, "Mul": a * b, "Neg": -a}[op]
                return out if -(1 << 31) <= out < 1 << 31 else OPAQUE  # beyond int32: where it wraps is not known
            return np.asarray({
                "Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
                "Equal": lambda a, b: bool(a == b), "Greater": lambda a, b: bool(a > b),
                "Less": lambda a, b: bool(a < b), "Where": lambda c, a, b: a if c else b, "Identity": lambda a: a,
                "Neg": lambda a: -a, "Not": lambda a: not a, "Max": max, "Min": min, "Abs": abs,
            }[op](*numbers)).item() if op != "Where" else (numbers[1] if numbers[0] else numbers[2]).item()
        except (KeyError, TypeError):
            return OPAQUE
    a, b = (xs + (None,))[:2]
    if op in ("Add", "Sub", "Mul") and len(xs) == 2 or op == "Neg":
        return _affine_op(op, xs)
    if op in ("Max", "Min") and len(xs) == 2:
        return _bound(op, a, b, bits)
    if op == "Where":
        return (xs[1] if xs[0] else xs[2]) if isinstance(xs[0], (bool, np.bool_)) else OPAQUE
    if op in ("Identity", "Abs") and isinstance(a, Dim):
        return a
    if op == "Div" and len(xs) == 2:
        return _divide(a, b, bits)
    if op == "Equal":
        other = b if isinstance(a, Dim) else a
        if isinstance(other, Dim):
            return True if other == (a if isinstance(b, Dim) else b) else OPAQUE
        if not isinstance(other, _Opaque) and other is not None and float(other) < 0:
            return False  # a dimension is never negative (the Where(shape == -1) idiom of TorchScript exports)
    return OPAQUE



__all__ = ["DIM_MAX", "OPAQUE", "Affine", "Dim", "Ext", "Foreign", "Quot", "affine", "affine_sum", "exact_in", "span",
           "symbolic"]
