"""GroupQueryAttention's two length inputs proved by value from the attention mask, whatever nodes compute them.

``total-seq-on-gpu`` needs two facts about a graph: ``total_sequence_length`` is the width of the attention mask
``M [batch, total]`` (what ``Shape(M)[1]`` gives), and ``seqlens_k`` is each row's sum minus one (``[batch]``, or
``[batch, 1, ...]``: GroupQueryAttention reads it by flat index). This module proves them by evaluating the value's
cone abstractly, one node at a time, in the form that node's own opset gives it (``Squeeze``/``Unsqueeze``/
``ReduceSum``/``Split`` axes as an attribute or an input, ``Shape`` with ``start``/``end``, ``Split`` with
``num_outputs``, ``Slice``, ``Pad``, ``Cast``/``CastLike``/``Identity`` chains, ``Add(x, -1)`` for ``Sub(x, 1)``,
``Where`` on a condition known everywhere (``Equal(x, x)``) or decided by the row sums (``Where(s > 0, s - 1, -1)``:
:class:`~rope_passes.proofs.mask_values.RowTest`), integer ``Add``/``Sub``/``Mul``/``Neg`` of the row sums by
constants in either order and an exact ``Div`` (affine forms ``scale * s + offset``), two column slices cut at one
bound summed back into the row, a ``Cast`` that does not keep the values or a ``Concat`` (a
:class:`~rope_passes.proofs.mask_values.MaskShape`: its ``Shape`` is read, its values carry why they are not the
mask's), ``x * 0`` (a tensor of the mask's shape that no longer
reads its values: the row sums of ``mask * 0 + 1`` are the width), the moves of :mod:`rope_passes.proofs.mask_moves`
(``Transpose``, ``Reshape`` to a shape that keeps the batch and the columns apart, ``Expand``/``Tile`` that copy
nothing, ``CumSum`` and the ``Gather`` of its last column), model-local functions with their own opset import
and attributes, evaluated in place for the analysis by :class:`rope_passes.proofs.mask_walk.Walk`). Every value of
the cone is one of

* :class:`~rope_passes.proofs.mask_values.MaskRows`: the elements of a rank-2 integer graph input, moved (its axes:
  ``"b"`` the batch, ``"t"`` the columns, ``1`` unit axes), with ``extra`` added to every row's sum by ``Pad``
  columns, or their running sums along the columns (``running``: ``CumSum``);
* :class:`~rope_passes.proofs.mask_values.RowSums`: ``sum(row) + offset`` per row (axes ``"b"`` and unit axes);
* :class:`~rope_passes.proofs.known.Known`: shape arithmetic and constants, run by the one evaluator
  (:func:`rope_passes.proofs.known.known_op`; constants by :mod:`rope_passes.proofs.constants`), the mask's
  dimensions as the symbols ``Dim(0)`` (batch) and ``Dim(1)`` (width), integer arithmetic on them as affine forms
  (:mod:`rope_passes.proofs.dims`: ``1000 - (1000 - w)`` is ``w``), another input's dimensions as
  :class:`~rope_passes.proofs.dims.Foreign` (a refusal names them);
* :class:`~rope_passes.proofs.mask_values.Broken`: a node the proof cannot follow, with the reason naming it (kept,
  not raised: only a broken value that reaches the GQA input matters).

Exact for every mask: each step keeps the value it claims (an integer ``Cast`` to int32/int64 keeps a 0/1 mask and
every row sum below 2^31; a ``Cast`` to another type, a ``Slice`` or a ``Pad`` along the batch, a sum over another axis,
``Squeeze`` without axes, arithmetic on the sums other than the above is ``Broken``, naming the node), except the rules
that read the sums' numbers (a comparison, a ``Div``): those hold for row sums between 0 and the width, a mask of 0s
and 1s, what every client sends (:data:`~rope_passes.proofs.mask_values.S_MAX`). A value
of a model-local function's body is proved for one call (:meth:`MaskLengths.scope`), the function at its own opset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

import onnx_ir as ir

from rope_passes.analysis.graph import ancestors
from rope_passes.proofs.constants import Constants
from rope_passes.proofs.known import Dim, Known, known_values
from rope_passes.proofs.mask_values import (
    MASK_INPUT,
    Broken,
    MaskRows,
    RowSums,
    RowTest,
    Val,
    mask_problem,
    opset_in,
    show,
)
from rope_passes.proofs.mask_walk import Walk
from rope_passes.report import MatchFailure


@dataclasses.dataclass
class Proved:
    mask: ir.Value
    nodes: list[ir.Node]  # the main graph's nodes of the cone (removed by the pass where nothing else reads them)
    rank: int | None = None  # the proved value's rank (a graph output keeps its shape)


def _culprit(walk: Walk, val: Val, value: ir.Value) -> ir.Node | ir.Value:
    """The node a refusal's words name as what broke the proof (the IR object, the failure's ``source``)."""
    if isinstance(val, Broken) and val.node is not None:
        return val.node
    if walk.spoiled and walk.spoiled[0].node is not None and not isinstance(val, (RowSums, RowTest)):
        return walk.spoiled[0].node
    return walk.lost or value.producer() or value


class MaskLengths:
    """Proves GQA length inputs of one model from its attention mask (``mask_names``: the names it may have)."""

    def __init__(self, model: ir.Model, mask_names: Collection[str] = (MASK_INPUT,)) -> None:
        self.model = model
        self.names = frozenset(mask_names)
        self.constants = Constants()
        self.functions = {(f.domain, f.name, getattr(f, "overload", "")): f for f in model.functions.values()}
        self.opset = opset_in(model.opset_imports, 18)

    # -- the two facts ------------------------------------------------------------------------------------------
    def scope(self, call: ir.Node, function: ir.Function) -> Walk:
        """A walk of ``function``'s body for the call ``call`` (its parameters bound to the call's arguments, as
        the main graph computes them), at the function's own opset: what :meth:`total`/:meth:`seqlens` read a value
        of the body in."""
        outer = Walk(self, self.opset, {})
        seeds = {id(p): outer.value(a) if a is not None else Broken("an absent function input")
                 for p, a in zip(function.inputs, call.inputs, strict=False)}
        inner = Walk(self, opset_in(function.opset_imports, self.opset), seeds, 1)
        inner.adopt(outer)
        return inner

    def parameter(self, walk: Walk, function: ir.Function, mask: ir.Value) -> ir.Value | None:
        """The parameter of ``function`` that ``walk``'s call binds to ``mask`` itself (its elements, unmoved)."""
        return next((p for p in function.inputs if walk.vals.get(id(p)) == MaskRows(mask, ("b", "t"), Dim(1))), None)

    def total(self, value: ir.Value, scope: Walk | None = None) -> Proved:
        """``value`` is the mask's width; MatchFailure otherwise (refused where its cone reads the shape of a rank-2
        integer input: a length chain the proof could not follow; not matched where it reads none, e.g. the builder's
        ``_graph`` variant's largest row sum, computed on the GPU already)."""
        walk = scope.fresh() if scope is not None else Walk(self, self.opset, {})
        val = walk.value(value)
        if isinstance(val, Known):
            values = known_values(val)
            if values is not None and values.size == 1 and values.reshape(-1)[0] == Dim(1) and walk.mask is not None:
                return Proved(walk.mask, ancestors([value]), values.ndim)
        why = self._why(walk, val, "total_sequence_length", "the mask's width (Shape(mask)[1])", value)
        if walk.read_shape:
            raise MatchFailure.refuse(why, _culprit(walk, val, value))
        raise MatchFailure.absent(why, value)

    def shape(self, value: ir.Value) -> tuple | None:
        """The extents of ``value`` where the walk knows them (ints, ``Dim(1)`` the mask's width, OPAQUE), else None."""
        val = Walk(self, self.opset, {}).value(value)
        return val.shape if isinstance(val, Known) else None

    def seqlens(self, value: ir.Value, scope: Walk | None = None) -> Proved:
        """``value`` is the mask's row sums minus one, the batch on axis 0; MatchFailure otherwise (refused where its
        cone reads a rank-2 integer input's values, not matched where it reads none)."""
        walk = scope.fresh() if scope is not None else Walk(self, self.opset, {})
        val = walk.value(value)
        if isinstance(val, RowSums) and val.axes[:1] == ("b",) and all(a == 1 for a in val.axes[1:]):
            problem = mask_problem(val.source, self.names)
            if problem is None and (val.scale, val.offset, val.cols) == (1, -1, None):
                return Proved(val.source, ancestors([value]), len(val.axes))
            padded = "".join(f"; {n.op_type} {n.name!r} adds columns to each row" for n in walk.widened)
            what = "form"
            why = problem or (f"seqlens_k is {val.words(repr(val.source.name))}, not the row sums - 1 "
                              f"(last changed by {walk.blame_name(value, what)}{padded})")
            raise MatchFailure.refuse(why, walk.blame.get((id(value), what)) or value)
        why = self._why(walk, val, "seqlens_k", "the mask's row sums - 1 ([batch])", value)
        if walk.read_values:
            raise MatchFailure.refuse(why, _culprit(walk, val, value))
        raise MatchFailure.absent(why, value)

    def _why(self, walk: Walk, val: Val, what: str, expected: str, value: ir.Value) -> str:
        if isinstance(val, Broken):
            return f"{what} is not proved to be {expected}: {val.reason}"
        if walk.spoiled and not isinstance(val, (RowSums, RowTest)):
            return f"{what} is not proved to be {expected}: {walk.spoiled[0].reason}"
        lost = walk.lost
        if lost is not None and walk.mixed is not None and what == "total_sequence_length":
            return (f"{what} is not proved to be {expected}: {lost.op_type} {lost.name!r} combines the mask's width with "
                    f"{walk.mixed!r} (not the mask's): that is the width only under a contract between the client's "
                    f"{walk.mixed.source!r} and mask (a mask at least as wide, say), which the graph does not prove")
        others = [v for v in walk.touched if mask_problem(v, self.names)]
        if others:
            return f"{what} is not {expected}: {mask_problem(others[0], self.names)}"
        node = value.producer()
        by = f"{node.op_type} {node.name!r}" if node is not None else repr(value.name)
        moved = (f" (shaped so by {walk.blame_name(value, 'axes')}; GroupQueryAttention reads the batch on axis 0, "
                 "every other axis 1)") if isinstance(val, RowSums) and what == "seqlens_k" else ""
        widened = (f" ({walk.widened[0].op_type} {walk.widened[0].name!r} gives the mask another width)"
                   if walk.widened and what == "total_sequence_length" else "")
        divided = (f" ({walk.divided[0].op_type} {walk.divided[0].name!r} divides by a dimension of the call, which is "
                   "0 for an empty batch: the quotient is not the width for every call)" if walk.divided else "")
        where = (f" (the width goes into {lost.op_type} {lost.name!r} and comes out as a value not proved to be it)"
                 if lost is not None and what == "total_sequence_length" and lost is not node else "")
        return f"{what} is not {expected}: {by} computes {show(val, walk.mask)}{moved}{widened}{divided}{where}"


__all__ = ["MASK_INPUT", "MaskLengths", "Proved", "mask_problem"]
