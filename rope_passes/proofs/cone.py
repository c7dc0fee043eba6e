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

import rope_passes.graph_walk as graph_walk
from rope_passes.analysis.graph import attr, const_tensor
from rope_passes.proofs.constants import constant
from rope_passes.proofs.known import (
    NARY,
    OPAQUE,
    SMALL,
    UNARY,
    UNKNOWN_VARYING,
    Dim,
    Ext,
    Known,
    combine,
    const,
    known_op,
    known_values,
)
from rope_passes.report import MatchFailure, name_of


@dataclasses.dataclass(frozen=True)
class Label:
    axis: int


@dataclasses.dataclass(frozen=True)
class Token:
    axes: tuple[Label | Ext, ...]


Val = Union[Token, Known]  # noqa: UP007

_RANDOM = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}


def refuse(node: ir.Node, why: str) -> MatchFailure:
    src = ", ".join(name_of(v) or "?" for v in node.inputs if v is not None)
    return MatchFailure.refuse(f"{node.op_type} {node.name!r} ({src}) {why}", node)


class Cone:
    """The abstract values of the cone of ``end``; :meth:`prove` refuses unless ``end`` is ``positions.shape + [D]``
    Token-valued (each row a function of its own position)."""

    def __init__(self, positions: ir.Value, opset: int, shape_inputs: Sequence[ir.Value] = (),
                 assume: dict[int, Val] | None = None, shape: Sequence[int | str] | None = None) -> None:
        """``shape``: the positions' shape when the value declares none (a Range source's ``[S]``): the model is
        read, never retyped."""
        self.positions = positions
        self.opset = opset
        pshape = list(shape if shape is not None else positions.shape)
        self.ext = tuple(d if isinstance(d, int) else Dim(k) for k, d in enumerate(pshape))
        self.vals: dict[int, Val] = {id(positions): Token(tuple(Label(k) for k in range(len(self.ext))))}
        names = {str(d): Dim(k) for k, d in enumerate(pshape) if not isinstance(d, int) and str(d)}
        for v in shape_inputs:  # read only through Shape/Size: their declared dims, as far as a caller keeps them
            # only the batch (axis 0) is the positions' dim of the same name: every input of a call has one batch.
            # Other names prove nothing: exporters declare the mask's past + seq as "seq", as the positions' length
            dims = tuple(d if isinstance(d, int) else names.get(str(d), OPAQUE) if axis == 0 else OPAQUE
                         for axis, d in enumerate(v.shape or ()))
            self.vals[id(v)] = Known(dims if v.shape is not None else None, None, None, True)
        self.vals.update(assume or {})  # values taken as given (LongRoPE's per-call branch: one constant at a time)

    # -- walking --------------------------------------------------------------------------------------------------
    def prove(self, end: ir.Value, trig: ir.Node, unit_axes: bool = False) -> int:
        """The end's feature width D; MatchFailure.refuse naming the node that breaks the proof. ``unit_axes``: the
        end may have static extent-1 axes besides (kept in :attr:`unit_axes`)."""
        val = self.value(end)
        labels = tuple(Label(k) for k in range(len(self.ext)))
        self.unit_axes: list[int] = []
        axes = val.axes if isinstance(val, Token) else ()
        if unit_axes:
            self.unit_axes = [i for i, a in enumerate(axes[:-1]) if isinstance(a, int) and a == 1]
            axes = tuple(a for i, a in enumerate(axes) if i not in self.unit_axes)
        if not (isinstance(val, Token) and axes[:-1] == labels and isinstance(axes[-1], int)):
            raise MatchFailure.refuse(f"the chain's end {end.name!r} is {val} in the cone accounting, not one row per "
                                      "position (positions.shape + [D])", trig)
        return axes[-1]

    def value(self, root: ir.Value) -> Val:
        return graph_walk.post_order(root, self.vals, self._leaf, self._node)

    def _leaf(self, v: ir.Value) -> Val:
        tensor = const_tensor(v)
        if tensor is None:
            raise MatchFailure.refuse(f"{v.name!r} in the cos/sin cone is neither the positions nor a constant",
                                      v)
        return const(tensor)

    def _node(self, node: ir.Node) -> list[Val]:
        if node.domain not in ("", "ai.onnx"):
            raise refuse(node, "is a custom op: nothing says a row depends on its own position only")
        if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()):
            raise refuse(node, "is control flow: nothing says a row depends on its own position only")
        if node.op_type in _RANDOM:
            raise refuse(node, "draws random numbers: different on every call")
        if node.op_type == "Constant":  # any form (value, value_int, value_floats, ...): the one evaluator reads it
            array = constant(node.outputs[0], SMALL)
            tensor = const_tensor(node.outputs[0]) if array is None else None  # a large table: its shape
            return [Known.of(array) if array is not None else const(tensor) if tensor is not None else
                    UNKNOWN_VARYING]
        ins = [None if v is None else self.vals[id(v)] for v in node.inputs]
        if any(isinstance(a, Token) for a in ins):
            out = self._token_op(node, ins)
            for o in out:
                if isinstance(o, Token) and sorted(a.axis for a in o.axes if isinstance(a, Label)) != list(
                        range(len(self.ext))):
                    raise refuse(node, "moves a position axis: its rows mix the tokens of the call")
            return out
        return known_op(node, ins, self.opset)  # type: ignore[arg-type]

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
        if op in UNARY or op in NARY:
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
            return [self._expand(node, x, known_values(ins[1]))]
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
        return combine([e for e, _, _ in entries])

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
            idx = known_values(ins[1])
            if idx is None or idx.dtype == object or isinstance(x.axes[axis], Label):
                raise refuse(node, "gathers along a position axis (or by indices not known): a row reads another "
                                   "token")
            return [Token(x.axes[:axis] + tuple(int(d) for d in idx.shape) + x.axes[axis + 1:])]
        if op == "Split":
            axis = attr(node, "axis", 0) % rank
            if isinstance(x.axes[axis], Label):
                raise refuse(node, "splits along a position axis: a row reads another token")
            sizes = known_values(ins[1]) if len(ins) > 1 and ins[1] is not None else attr(node, "split", None)
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
                out.append(combine([a, e]))
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


def _ints(node: ir.Node, ins: list[Val | None], index: int, name: str, required: bool = False) -> list[int]:
    """An axes/starts/shape operand (input ``index`` or attribute ``name``) as ints; refuse when not known."""
    if len(ins) > index and ins[index] is not None:
        values = known_values(ins[index])
        if values is None or values.dtype == object:
            raise refuse(node, f"takes its {name} from a value not known before the call")
        return [int(x) for x in values.reshape(-1)]
    value = attr(node, name, None)
    if value is None and required:
        raise refuse(node, f"has no {name}: it may act on a position axis")
    return [int(x) for x in value] if value is not None else []


__all__ = ["OPAQUE", "Cone", "Dim", "Known", "Label", "Token"]
