"""Exact cone accounting for ``precompute-cos-sin``: the proof that every row of a cos/sin chain end is a function of
its own token's position alone, by an allow-list of per-token ops over the cone from the position input to the end.

Every value of the cone is abstracted as one of

* :class:`Token` (reads the positions' values): each axis is a *position axis* (:class:`Label` ``k``: the position
  input's axis ``k``, same extent) or a *feature axis* with an extent (an int, :class:`Dim` ``k`` =
  ``positions.shape[k]``, or :data:`OPAQUE`); element ``i`` depends only on the position at ``i``'s position-axis
  coordinates and on ``i``'s feature coordinates, by a function that is the same on every call. Every position
  axis appears exactly once;
* :class:`Known` (does not read the positions' values): per-axis extents, the static *pattern* of its data (1 =
  uniform along that axis, whatever its extent: ``Expand`` / ``ConstantOfShape`` outputs), the elements when small
  (numbers, or symbols :class:`Dim` / :data:`OPAQUE` for values computed from ``Shape`` / ``Size`` of the
  positions), and ``varies``: the values may differ from call to call.

A Token op is allowed only when it keeps the invariant (elementwise ops whose other operands are Known, unvarying
and uniform along the position axes; Cast; Unsqueeze / Squeeze / Transpose / Reshape / Concat / Slice / Split /
Expand that move feature axes only; Gather of a Known table by the positions, or of feature columns; MatMul / Einsum
contracting static feature axes only). Anything else reading a Token (Reduce*, GlobalMaxPool, Slice or Gather along
a position axis, a sum over tokens, a value computed from the call's shape mixed into the arithmetic, control flow,
custom ops, random ops) is a :class:`~rope_passes.report.MatchFailure` *refuse* naming the node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Union

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import attr, const_array, const_tensor
from rope_passes.report import MatchFailure

SMALL = 4096  # elements kept as values


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


@dataclasses.dataclass(frozen=True)
class Label:
    axis: int


@dataclasses.dataclass(frozen=True)
class Token:
    axes: tuple[Label | Ext, ...]


@dataclasses.dataclass(frozen=True)
class Known:
    shape: tuple[Ext, ...] | None  # None: not known
    pattern: tuple[int, ...] | None = None  # static extents of the data (1 = uniform along that axis)
    values: np.ndarray | None = None  # shaped like ``pattern``; object dtype when it holds symbols
    varies: bool = False

    @classmethod
    def of(cls, array: np.ndarray) -> Known:
        sym = array.dtype == object and any(isinstance(x, (Dim, _Opaque)) for x in array.flat)
        if array.dtype == object and not sym:  # numbers only after all: back to a numeric array
            array = np.array(array.tolist()).reshape(array.shape)
        return cls(tuple(int(d) for d in array.shape), tuple(array.shape), array, sym)


UNKNOWN_VARYING = Known(None, None, None, True)
Val = Union[Token, Known]  # noqa: UP007

_UNARY = {"Cast", "Identity", "Neg", "Abs", "Cos", "Sin", "Tan", "Exp", "Log", "Sqrt", "Reciprocal", "Floor", "Ceil",
          "Round", "Sign", "Not", "Relu", "Sigmoid", "Tanh", "Erf", "IsNaN", "IsInf", "Atan", "Asin", "Acos", "Sinh",
          "Cosh", "Softplus"}
_NARY = {"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Equal", "Greater", "GreaterOrEqual", "Less",
         "LessOrEqual", "And", "Or", "Xor", "Where", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "Sum",
         "Mean", "CastLike"}
_MOVES = {"Identity", "Unsqueeze", "Squeeze", "Reshape", "Slice", "Transpose", "Expand", "Gather", "Concat", "Flatten",
          "Tile", "Split"}
_RANDOM = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}


def refuse(node: ir.Node, why: str) -> MatchFailure:
    src = ", ".join(v.name or "?" for v in node.inputs if v is not None)
    return MatchFailure.refuse(f"{node.op_type} {node.name!r} ({src}) {why}", node.name or "<model>")


class Cone:
    """The abstract values of the cone of ``end``; :meth:`prove` refuses unless ``end`` is ``positions.shape + [D]``
    Token-valued (each row a function of its own position)."""

    def __init__(self, positions: ir.Value, opset: int) -> None:
        self.positions = positions
        self.opset = opset
        self.ext = tuple(d if isinstance(d, int) else Dim(k) for k, d in enumerate(positions.shape))
        self.vals: dict[int, Val] = {id(positions): Token(tuple(Label(k) for k in range(len(self.ext))))}

    # -- walking --------------------------------------------------------------------------------------------------
    def prove(self, end: ir.Value, trig: ir.Node) -> int:
        """The end's feature width D; MatchFailure.refuse naming the node that breaks the proof."""
        val = self.value(end)
        labels = tuple(Label(k) for k in range(len(self.ext)))
        if not (isinstance(val, Token) and val.axes[:-1] == labels and isinstance(val.axes[-1], int)):
            raise MatchFailure.refuse(f"the chain's end {end.name!r} is {val} in the cone accounting, not one row per "
                                      "position (positions.shape + [D])", trig.name)
        return val.axes[-1]

    def value(self, root: ir.Value) -> Val:
        stack: list[tuple[ir.Value, bool]] = [(root, False)]
        while stack:
            v, ready = stack.pop()
            if id(v) in self.vals:
                continue
            node = v.producer()
            if node is None:
                self.vals[id(v)] = self._leaf(v)
                continue
            if not ready:
                stack.append((v, True))
                stack.extend((i, False) for i in node.inputs if i is not None and id(i) not in self.vals)
                continue
            outs = self._node(node)
            for o, a in zip(node.outputs, outs, strict=True):
                self.vals[id(o)] = a
        return self.vals[id(root)]

    def _leaf(self, v: ir.Value) -> Val:
        tensor = const_tensor(v)
        if tensor is None:
            raise MatchFailure.refuse(f"{v.name!r} in the cos/sin cone is neither the positions nor a constant",
                                      v.name or "<model>")
        return _const(tensor)

    def _node(self, node: ir.Node) -> list[Val]:
        if node.domain not in ("", "ai.onnx"):
            raise refuse(node, "is a custom op: nothing says a row depends on its own position only")
        if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()):
            raise refuse(node, "is control flow: nothing says a row depends on its own position only")
        if node.op_type in _RANDOM:
            raise refuse(node, "draws random numbers: different on every call")
        if node.op_type == "Constant":
            tensor = const_tensor(node.outputs[0])
            array = const_array(node.outputs[0], SMALL) if tensor is None else None
            return [_const(tensor) if tensor is not None else Known.of(array) if array is not None else
                    UNKNOWN_VARYING]
        ins = [None if v is None else self.vals[id(v)] for v in node.inputs]
        if any(isinstance(a, Token) for a in ins):
            out = self._token_op(node, ins)
            for o in out:
                if isinstance(o, Token) and sorted(a.axis for a in o.axes if isinstance(a, Label)) != list(
                        range(len(self.ext))):
                    raise refuse(node, "moves a position axis: its rows mix the tokens of the call")
            return out
        return _known_op(node, ins, self.opset)  # type: ignore[arg-type]

    # -- ops reading the positions ----------------------------------------------------------------------------------
    def _token_op(self, node: ir.Node, ins: list[Val | None]) -> list[Val]:
        op = node.op_type
        x = ins[0]
        if op == "Shape":
            axes = x.axes if isinstance(x, Token) else ()
            exts = [self.ext[a.axis] if isinstance(a, Label) else a for a in axes]
            start, end = attr(node, "start", 0), attr(node, "end", None)
            return [Known.of(np.array(exts[start:end], dtype=object))]
        if op == "Size":
            return [Known(() , (), np.array(OPAQUE, dtype=object), True)]
        if op in _UNARY or op in _NARY:
            data = ins[:1] if op == "CastLike" else ins
            return [Token(self._broadcast(node, [a for a in data if a is not None]))]
        if op == "Concat":
            return [self._concat(node, ins)]
        if op in ("MatMul", "Einsum"):
            return [self._contract(node, ins)]
        if not isinstance(x, Token):
            if op == "Gather" and isinstance(ins[1], Token):
                return [self._gather_table(node, x, ins[1])]  # type: ignore[arg-type]
            raise refuse(node, "reads the positions through a shape or index input: a row depends on the call")
        rest = ins[1:]
        if op in ("Unsqueeze", "Squeeze", "Reshape", "Slice", "Expand", "Gather", "Split", "Tile") and any(
                isinstance(a, Token) or (isinstance(a, Known) and a.varies) for a in rest if a is not None):
            raise refuse(node, "takes its axes/indices/shape from the positions or from the call's shape: a row "
                               "depends on the call")
        if op == "Transpose":
            perm = attr(node, "perm", None) or list(range(len(x.axes)))[::-1]
            return [Token(tuple(x.axes[p] for p in perm))]
        if op == "Unsqueeze":
            axes = _ints(node, ins, 1, "axes")
            out: list = list(x.axes)
            rank = len(out) + len(axes)
            for a in sorted(a % rank for a in axes):
                out.insert(a, 1)
            return [Token(tuple(out))]
        if op == "Squeeze":
            axes = _ints(node, ins, 1, "axes", required=True)
            drop = {a % len(x.axes) for a in axes}
            if any(x.axes[a] != 1 for a in drop):
                raise refuse(node, "squeezes a position axis or an axis not known to be 1")
            return [Token(tuple(a for i, a in enumerate(x.axes) if i not in drop))]
        if op in ("Slice", "Split", "Gather"):
            return self._select(node, x, ins)
        if op == "Expand":
            return [self._expand(node, x, _known_values(ins[1]))]
        if op == "Reshape":
            return [self._reshape(node, x, _ints(node, ins, 1, "shape", required=True))]
        raise refuse(node, "reads across the positions of the call (not a per-token op), so a row depends on more "
                           "than its own position")

    def _broadcast(self, node: ir.Node, vals: Sequence[Val]) -> tuple:
        rank = max(len(v.axes) if isinstance(v, Token) else len(v.shape or ()) for v in vals)
        for v in vals:
            if isinstance(v, Known) and (v.varies or v.shape is None):
                raise refuse(node, "mixes a value computed from the call's shape (batch, length) or not known into "
                                   "the positions' arithmetic, so a row depends on the call, not only on its position")
        out = []
        for i in range(rank):
            entries = []
            for v in vals:
                axes = v.axes if isinstance(v, Token) else v.shape
                pattern = None if isinstance(v, Token) else v.pattern
                j = i - (rank - len(axes))
                if j >= 0:
                    entries.append((axes[j], pattern[j] if pattern is not None else None, isinstance(v, Token)))
            out.append(self._axis(node, entries))
        return tuple(out)

    def _axis(self, node: ir.Node, entries: list) -> Label | Ext:
        labels = {e for e, _, tok in entries if tok and isinstance(e, Label)}
        if len(labels) > 1 or (labels and any(tok and not isinstance(e, Label) for e, _, tok in entries)):
            raise refuse(node, "aligns different position axes: its rows mix the tokens of the call")
        if labels:
            (label,) = labels
            for e, pat, tok in entries:
                if not tok and not (e == 1 or (e == self.ext[label.axis] and pat == 1)):
                    raise refuse(node, f"broadcasts a constant of extent {e} along position axis {label.axis}: a row "
                                       "would depend on its index in the call")
            return label
        return _combine([e for e, _, _ in entries])

    def _concat(self, node: ir.Node, ins: list[Val | None]) -> Token:
        vals = [v for v in ins if v is not None]
        rank = max(len(v.axes) if isinstance(v, Token) else len(v.shape or ()) for v in vals)
        axis = attr(node, "axis", 0) % rank
        if any(isinstance(v, Known) and (v.varies or v.shape is None or len(v.shape) != rank) for v in vals):
            raise refuse(node, "concatenates a value of unknown shape, or computed from the call's shape, with the "
                               "positions")
        per_axis = [self._axis(node, [(v.axes[i], None, True) if isinstance(v, Token) else (v.shape[i], v.pattern[i]
                    if v.pattern else None, False) for v in vals]) if i != axis else None for i in range(rank)]
        cut = [v.axes[axis] if isinstance(v, Token) else v.shape[axis] for v in vals]
        if any(isinstance(c, Label) for c in cut):
            raise refuse(node, "concatenates along a position axis: the rows of the call are reordered or mixed")
        per_axis[axis] = sum(cut) if all(isinstance(c, int) for c in cut) else OPAQUE
        return Token(tuple(per_axis))

    def _select(self, node: ir.Node, x: Token, ins: list[Val | None]) -> list[Val]:
        rank = len(x.axes)
        op = node.op_type
        if op == "Gather":
            axis = attr(node, "axis", 0) % rank
            idx = _known_values(ins[1])
            if idx is None or idx.dtype == object or isinstance(x.axes[axis], Label):
                raise refuse(node, "gathers along a position axis (or by indices not known): a row reads another "
                                   "token")
            return [Token(x.axes[:axis] + tuple(int(d) for d in idx.shape) + x.axes[axis + 1:])]
        if op == "Split":
            axis = attr(node, "axis", 0) % rank
            if isinstance(x.axes[axis], Label):
                raise refuse(node, "splits along a position axis: a row reads another token")
            sizes = _known_values(ins[1]) if len(ins) > 1 and ins[1] is not None else attr(node, "split", None)
            n = len(node.outputs)
            widths = [int(s) for s in np.asarray(sizes).reshape(-1)] if sizes is not None else (
                [x.axes[axis] // n] * n if isinstance(x.axes[axis], int) and x.axes[axis] % n == 0 else [OPAQUE] * n)
            return [Token(x.axes[:axis] + (w,) + x.axes[axis + 1:]) for w in widths]
        starts, ends = _ints(node, ins, 1, "starts", required=True), _ints(node, ins, 2, "ends", required=True)
        axes = _ints(node, ins, 3, "axes") or list(range(len(starts)))
        steps = _ints(node, ins, 4, "steps") or [1] * len(starts)
        out = list(x.axes)
        for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
            a %= rank
            if isinstance(out[a], Label):
                raise refuse(node, f"slices position axis {out[a].axis}: a row reads another token of the call")
            out[a] = len(range(*slice(s, e, st).indices(out[a]))) if isinstance(out[a], int) else OPAQUE
        return [Token(tuple(out))]

    def _gather_table(self, node: ir.Node, table: Known, idx: Token) -> Token:
        if table.varies or table.shape is None:
            raise refuse(node, "gathers from a table computed from the call's shape")
        axis = attr(node, "axis", 0) % len(table.shape)
        return Token(table.shape[:axis] + idx.axes + table.shape[axis + 1:])

    def _expand(self, node: ir.Node, x: Token, shape: np.ndarray | None) -> Token:
        if shape is None or shape.ndim != 1:
            raise refuse(node, "expands the positions to a shape not known")
        entries = list(shape.tolist())
        rank = max(len(entries), len(x.axes))
        axes = (1,) * (rank - len(x.axes)) + x.axes
        entries = [1] * (rank - len(entries)) + entries
        out = []
        for a, e in zip(axes, entries, strict=True):
            if isinstance(a, Label):
                if not (e == 1 or e == self.ext[a.axis]):
                    raise refuse(node, f"expands position axis {a.axis} to {e}: rows would repeat a token")
                out.append(a)
            else:
                out.append(_combine([a, e]))
        return Token(tuple(out))

    def _reshape(self, node: ir.Node, x: Token, shape: list[int]) -> Token:
        """Position axes copied in place (0 entries); the feature groups between them regrouped to equal sizes."""
        label_at = [i for i, a in enumerate(x.axes) if isinstance(a, Label)]
        if attr(node, "allowzero", 0) or [i for i, e in enumerate(shape) if e == 0][:len(label_at)] != label_at:
            raise refuse(node, "reshapes the positions without keeping each position axis in place")
        out: list = list(shape)
        bounds = [-1, *label_at, None]
        for lo, hi in zip(bounds, bounds[1:], strict=False):
            before = x.axes[lo + 1:hi]
            group = list(range(lo + 1, len(shape) if hi is None else hi))
            if not all(isinstance(a, int) for a in before) or any(shape[g] == 0 for g in group):
                raise refuse(node, "reshapes feature axes whose sizes are not known")
            free = [g for g in group if shape[g] == -1]
            known = int(np.prod([shape[g] for g in group if shape[g] != -1]))
            total = int(np.prod(before))
            if len(free) > 1 or (free and (known == 0 or total % known)) or (not free and known != total):
                raise refuse(node, "reshapes feature axes into sizes that cannot be proved equal")
            for g in free:
                out[g] = total // known
        for i in label_at:
            out[i] = x.axes[i]
        return Token(tuple(out))

    def _contract(self, node: ir.Node, ins: list[Val | None]) -> Token:
        vals = [v for v in ins if v is not None]
        if node.op_type == "MatMul":
            a_rank, b_rank = (len(v.axes) if isinstance(v, Token) else len(v.shape or ()) for v in vals)
            if a_rank < 2 or b_rank < 2:
                raise refuse(node, "is a vector product over the positions")
            equation = _matmul_equation(a_rank, b_rank)
        else:
            equation = str(attr(node, "equation", "")).replace(" ", "")
        lhs, _, rhs = equation.partition("->")
        terms = lhs.split(",")
        if "." in equation or not _ or len(terms) != len(vals):
            raise refuse(node, "has an equation not understood (ellipsis or implicit output)")
        letters: dict[str, list] = {}
        for term, v in zip(terms, vals, strict=True):
            if isinstance(v, Known) and (v.varies or v.shape is None):
                raise refuse(node, "multiplies the positions with a value computed from the call's shape")
            axes = v.axes if isinstance(v, Token) else v.shape
            pattern = None if isinstance(v, Token) else v.pattern
            if len(term) != len(axes):
                raise refuse(node, "has an equation not matching its operands")
            for j, letter in enumerate(term):
                letters.setdefault(letter, []).append(
                    (axes[j], pattern[j] if pattern is not None else None, isinstance(v, Token)))
        for letter, entries in letters.items():
            if letter not in rhs:
                exts = {e for e, _, _ in entries}
                if any(isinstance(e, Label) or not isinstance(e, int) for e in exts) or len(exts - {1}) > 1:
                    raise refuse(node, "sums over the tokens of the call (a contraction over a position axis or an "
                                       "extent set per call), so a row depends on the other positions")
        return Token(tuple(self._axis(node, letters[c]) for c in rhs))


def _matmul_equation(a: int, b: int) -> str:
    batch = "abcdefgh"[: max(a, b) - 2]
    return f"{batch[len(batch) - (a - 2):]}ij,{batch[len(batch) - (b - 2):]}jk->{batch}ik"


def _combine(exts: Sequence) -> Ext:
    """The broadcast extent of feature axes (ints, Dim, OPAQUE)."""
    ints = {e for e in exts if isinstance(e, int)} - {1}
    syms = {e for e in exts if not isinstance(e, int)}
    if len(ints) > 1:
        raise MatchFailure.refuse(f"feature extents {sorted(ints)} do not broadcast")
    if ints:
        return ints.pop()
    if len(syms) == 1:
        return syms.pop()
    return OPAQUE if syms else 1


def _const(tensor: ir.TensorProtocol) -> Known:
    shape = tuple(int(d) for d in tensor.shape)
    values = tensor.numpy() if tensor.size <= SMALL else None
    return Known(shape, shape, values, False)


def _known_values(v: Val | None) -> np.ndarray | None:
    if not isinstance(v, Known) or v.values is None or v.shape is None or v.pattern != v.shape:
        return None
    return v.values


def _ints(node: ir.Node, ins: list[Val | None], index: int, name: str, required: bool = False) -> list[int]:
    """An axes/starts/shape operand (input ``index`` or attribute ``name``) as ints; refuse when not known."""
    if len(ins) > index and ins[index] is not None:
        values = _known_values(ins[index])
        if values is None or values.dtype == object:
            raise refuse(node, f"takes its {name} from a value not known before the call")
        return [int(x) for x in values.reshape(-1)]
    value = attr(node, name, None)
    if value is None and required:
        raise refuse(node, f"has no {name}: it may act on a position axis")
    return [int(x) for x in value] if value is not None else []


# -- values not reading the positions ---------------------------------------------------------------------------------
def _known_op(node: ir.Node, ins: list[Known | None], opset: int) -> list[Val]:
    op = node.op_type
    n_out = len(node.outputs)
    if op == "ConstantOfShape" or (op == "Expand" and ins[0] is not None):
        shape = _known_values(ins[-1])
        if shape is None or shape.ndim != 1:
            return [UNKNOWN_VARYING]
        entries = shape.tolist()
        if op == "ConstantOfShape":
            fill = attr(node, "value", None)
            data = fill.numpy().reshape(()) if fill is not None else np.float32(0)
            base = Known((), (), np.asarray(data), False)
        else:
            base = ins[0]
        if base.shape is None:
            return [UNKNOWN_VARYING]
        rank = max(len(entries), len(base.shape))
        b_shape = (1,) * (rank - len(base.shape)) + base.shape
        pattern = (1,) * (rank - len(base.shape)) + (base.pattern if base.pattern is not None else base.shape)
        entries = [1] * (rank - len(entries)) + entries
        out_shape = tuple(_combine([b, e]) if not isinstance(e, _Opaque) or b == 1 else b
                          for b, e in zip(b_shape, entries, strict=True))
        values = None if base.values is None else base.values.reshape(pattern)
        if values is not None and all(isinstance(e, int) for e in out_shape) and int(np.prod(out_shape)) <= SMALL:
            return [Known.of(np.broadcast_to(values, out_shape).copy()) if not base.varies else
                    Known(out_shape, out_shape, np.broadcast_to(values, out_shape).copy(), True)]
        return [Known(out_shape, tuple(int(p) for p in pattern), values, base.varies)]
    if any(a is None or a.shape is None for a in ins if a is not None) or not ins:
        return [UNKNOWN_VARYING] * n_out
    present = [a for a in ins if a is not None]
    varies = any(a.varies for a in present)
    if op in _UNARY or op in _NARY:
        shape = tuple(_combine(col) for col in _columns([a.shape for a in present]))  # type: ignore[misc]
        patterns = [a.pattern for a in present]
        if any(p is None for p in patterns) or any(a.values is None for a in present):
            return [Known(shape, None, None, varies)]
        out = _evaluate(node, [a.values for a in ins] if op != "CastLike" else [ins[0].values, ins[1].values], opset)
        if out is None:
            return [Known(shape, None, None, True)]
        value = Known.of(out[0])
        return [Known(shape, value.pattern, value.values, varies and value.varies)]
    if op in _MOVES and all(a.pattern == a.shape for a in present):
        return _move(node, ins, opset, varies)
    if op in ("Shape", "Size"):
        a = present[0]
        if op == "Size":
            return [Known.of(np.array(int(np.prod(a.shape)) if all(isinstance(d, int) for d in a.shape) else OPAQUE,
                                      dtype=object))]
        start, end = attr(node, "start", 0), attr(node, "end", None)
        return [Known.of(np.array(list(a.shape)[start:end], dtype=object))]
    if not varies and all(a.values is not None and a.values.dtype != object for a in present):
        out = _evaluate(node, [None if a is None else a.values for a in ins], opset)
        if out is not None:
            return [Known.of(v) for v in out]
    return [UNKNOWN_VARYING] * n_out


def _columns(shapes: list[tuple]) -> list[list]:
    rank = max(len(s) for s in shapes)
    return [[s[i - (rank - len(s))] for s in shapes if i - (rank - len(s)) >= 0] for i in range(rank)]


def _move(node: ir.Node, ins: list[Known | None], opset: int, varies: bool) -> list[Val]:
    """A data-movement op on known values (symbols included): run on element indices, then take the elements."""
    data_inputs = range(len(ins)) if node.op_type == "Concat" else [0]
    feeds: list[np.ndarray | None] = []
    pool: list = []
    for i, a in enumerate(ins):
        if a is None or a.values is None:
            if i in data_inputs and a is not None and a.pattern is not None and int(np.prod(a.pattern)) <= 1 << 20:
                feeds.append(np.arange(len(pool), len(pool) + int(np.prod(a.pattern))).reshape(a.pattern))
                pool.extend([None] * int(np.prod(a.pattern)))
                continue
            if a is None:
                feeds.append(None)
                continue
            return [UNKNOWN_VARYING] * len(node.outputs)
        if i in data_inputs:
            feeds.append(np.arange(len(pool), len(pool) + a.values.size, dtype=np.int64).reshape(a.values.shape))
            pool.extend(a.values.reshape(-1).tolist())
        elif a.values.dtype == object:
            return [UNKNOWN_VARYING] * len(node.outputs)
        else:
            feeds.append(a.values)
    out = _evaluate(node, feeds, opset)
    if out is None:
        return [UNKNOWN_VARYING] * len(node.outputs)
    results: list[Val] = []
    dtype = next((a.values.dtype for i, a in enumerate(ins) if i in data_inputs and a is not None
                  and a.values is not None), object)
    for idx in out:
        elems = [pool[int(i)] for i in idx.reshape(-1)]
        if any(e is None for e in elems):
            results.append(Known(tuple(int(d) for d in idx.shape), tuple(int(d) for d in idx.shape), None, varies))
            continue
        sym = any(isinstance(e, (Dim, _Opaque)) for e in elems)
        arr = np.array(elems, dtype=object if sym else dtype).reshape(idx.shape)
        results.append(Known.of(arr))
    return results


def _evaluate(node: ir.Node, arrays: list[np.ndarray | None], opset: int) -> list[np.ndarray] | None:
    """One node on known values: onnx's reference evaluator on numbers, :func:`_symbolic` on object arrays."""
    if any(a is not None and a.dtype == object for a in arrays):
        return _symbolic(node, arrays)
    from onnx.reference import ReferenceEvaluator

    proto = ir.serde.serialize_node(node)
    names = [f"x{i}" if a is not None else "" for i, a in enumerate(arrays)]
    del proto.input[:]
    proto.input.extend(names)
    outs = [f"y{i}" for i in range(len(proto.output))]
    del proto.output[:]
    proto.output.extend(outs)
    try:
        ref = ReferenceEvaluator(proto, opsets={"": opset})
        return [np.asarray(r) for r in ref.run(None, {n: a for n, a in zip(names, arrays, strict=True) if n})]
    except Exception:  # noqa: BLE001 - an op the evaluator cannot run is simply not known
        return None


def _symbolic(node: ir.Node, arrays: list[np.ndarray | None]) -> list[np.ndarray] | None:
    """Elementwise ops on arrays holding call dimensions: the few identities shape plumbing needs, OPAQUE else."""
    op = node.op_type
    present = [a for a in arrays if a is not None]
    if op not in _UNARY and op not in _NARY:
        return None
    if op == "Cast":
        to = attr(node, "to", None)
        keep = to in (ir.DataType.INT64, ir.DataType.INT32, int(ir.DataType.INT64), int(ir.DataType.INT32))
        return [np.vectorize(lambda x: x if keep or not isinstance(x, (Dim, _Opaque)) else OPAQUE,
                             otypes=[object])(present[0])]
    if op == "CastLike":
        present = present[:1]
    fn = np.vectorize(lambda *xs: _scalar(op, xs), otypes=[object])
    return [fn(*present)]


def _scalar(op: str, xs: tuple) -> object:
    syms = [x for x in xs if isinstance(x, (Dim, _Opaque))]
    if not syms:
        numbers = [np.asarray(x) for x in xs]
        try:
            return np.asarray({
                "Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
                "Equal": lambda a, b: bool(a == b), "Greater": lambda a, b: bool(a > b),
                "Less": lambda a, b: bool(a < b), "Where": lambda c, a, b: a if c else b, "Identity": lambda a: a,
                "Neg": lambda a: -a, "Not": lambda a: not a, "Max": max, "Min": min, "Abs": abs,
            }[op](*numbers)).item() if op != "Where" else (numbers[1] if numbers[0] else numbers[2]).item()
        except (KeyError, TypeError):
            return OPAQUE
    a, b = (xs + (None,))[:2]
    if op == "Where":
        return (xs[1] if xs[0] else xs[2]) if isinstance(xs[0], (bool, np.bool_)) else OPAQUE
    if op in ("Identity", "Abs") and isinstance(a, Dim):
        return a
    if op in ("Add", "Sub") and b == 0 and isinstance(a, Dim):
        return a
    if op == "Add" and a == 0 and isinstance(b, Dim):
        return b
    if op in ("Mul", "Div") and b == 1 and isinstance(a, Dim):
        return a
    if op == "Mul" and a == 1 and isinstance(b, Dim):
        return b
    if op == "Equal":
        other = b if isinstance(a, Dim) else a
        if isinstance(other, Dim):
            return True if other == (a if isinstance(b, Dim) else b) else OPAQUE
        if not isinstance(other, _Opaque) and other is not None and float(other) < 0:
            return False  # a dimension is never negative (the Where(shape == -1) idiom of TorchScript exports)
    return OPAQUE


__all__ = ["OPAQUE", "Cone", "Dim", "Known", "Label", "Token"]
