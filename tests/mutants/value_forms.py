"""More forms of the values ``total-seq-on-gpu`` reads (red team 35 of issue 32): the mask moved and given back
(``Transpose`` round trips, ``Flatten`` + ``Reshape [0, -1]``, ``Expand`` to its own shape, ``Tile`` by ones), the row
sum as the last column of a ``CumSum``, the width through affine arithmetic that gives it back (``w * 1 + 0``,
``Max(w, 0)``, ``1000 - (1000 - w)``) and as the ``ArgMax`` of a concatenation that puts a one after ``w`` zeros.
Each proves by value what the builder's chains compute; next to each rule a lookalike that is NOT the value (a
single ``Transpose`` read the other way, a ``Tile`` by two, an exclusive ``CumSum``, ``Max(w, 1)``,
``1000 - (999 - w)``, an ``ArgMax`` that finds the one at 0), and the width of ``input_ids`` against the mask's (equal
only by the client's contract, never proved by the graph). Used by :func:`mutants.forms.mask_chain` like the forms of
:mod:`mutants.forms` and scheduled once each by tests/test_form_fuzzer.py (every form also passed at opsets 11 and 23,
in the main graph and in a model-local function, where it exists: 109 graphs, run once by hand).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from .forms import I32, I64, Form, Writer, _minus_one, _width


def _row_sums(w: Writer, m: ir.Value) -> ir.Value:
    return w.axes_op("ReduceSum", m, [1], keepdims=0)


def _gather(w: Writer, x: ir.Value, index, axis: int = 0) -> ir.Value:
    return w.op("Gather", x, w.const(index), axis=axis)


def _wide(w: Writer, m: ir.Value) -> ir.Value:
    """The mask's width as the int64 scalar ``Shape(mask)[1]``."""
    return _gather(w, w.op("Shape", m), 1)


def _twice(w: Writer, m: ir.Value) -> ir.Value:
    return w.op("Transpose", w.op("Transpose", m, perm=[1, 0]), perm=[1, 0])


def _flat(w: Writer, m: ir.Value) -> ir.Value:
    return w.op("Reshape", w.op("Flatten", m, axis=1), w.const([0, -1]))


def _width_vector(w: Writer, m: ir.Value) -> ir.Value:
    """``[width]`` (int64, one element): Shape's start/end from 15, a Slice of the shape before."""
    if w.opset >= 15:
        return w.op("Shape", m, start=1, end=2)
    return w.op("Slice", w.op("Shape", m), w.const([1]), w.const([2]), w.const([0]))


def _argmax_concat(w: Writer, m: ir.Value, tail, last: int = 0) -> ir.Value:
    """``ArgMax(Concat(zeros[width], tail))``: where the first (``last``: the last) largest element sits."""
    zeros = w.op("ConstantOfShape", _width_vector(w, m), value=ir.tensor(np.zeros(1, np.int64)))
    joined = w.op("Concat", zeros, w.const(tail), axis=0)
    found = w.op("ArgMax", joined, axis=0, keepdims=0, **({"select_last_index": last} if last else {}))
    return w.op("Cast", found, to=I32)


def _argmax_rows(w: Writer, m: ir.Value) -> ir.Value:
    """``ReduceMax(ArgMax(Concat(mask * 0, ones[batch, 1]), axis=1))``: per row, where the one after the zeros is."""
    batch = w.op("Shape", m, start=0, end=1) if w.opset >= 15 else w.op("Slice", w.op("Shape", m), w.const([0]),
                                                                          w.const([1]), w.const([0]))
    ones = w.op("ConstantOfShape", w.op("Concat", batch, w.const([1]), axis=0), value=ir.tensor(np.ones(1, np.int64)))
    found = w.op("ArgMax", w.op("Concat", w.op("Mul", m, w.const(0)), ones, axis=1), axis=1, keepdims=0)
    return w.op("Cast", w.op("ReduceMax", found, keepdims=0), to=I32)


def _reduce_max(w: Writer, x: ir.Value) -> ir.Value:
    """ReduceMax over axis 1: its axes an attribute below opset 18, an input from 18 on."""
    if w.opset < 18:
        return w.op("ReduceMax", x, axes=[1], keepdims=0)
    return w.op("ReduceMax", x, w.const([1]), keepdims=0)


def _where_above(w: Writer, m: ir.Value, k: int) -> ir.Value:
    """``Where(s > k, s - 1, -1)`` of the row sums ``s``: ``s - 1`` for every ``s >= 0`` when ``k`` is 0 (``s = 0``
    takes -1, which is ``s - 1``), not when ``k`` is 1 (``s = 1`` takes -1, not 0)."""
    s = _row_sums(w, m)
    return w.op("Cast", w.op("Where", w.op("Greater", s, w.const(k)), w.op("Sub", s, w.const(1)), w.const(-1)), to=I32)


def _halves(w: Writer, m: ir.Value, overlap: int = 0) -> ir.Value:
    """The row sums as the sums of two column halves, ``[0, h + overlap)`` and ``[h, width)``, ``h = width / 2``: the
    whole row when ``overlap`` is 0, column ``h`` counted twice when it is 1."""
    width = _width_vector(w, m)
    h = w.op("Div", width, w.const([2]))
    left = w.op("Add", h, w.const([overlap])) if overlap else h
    left_part = w.op("Slice", m, w.const([0]), left, w.const([1]))
    right_part = w.op("Slice", m, h, width, w.const([1]))
    return w.op("Add", _row_sums(w, left_part), _row_sums(w, right_part))


def _concat_width(w: Writer, m: ir.Value, axis: int) -> ir.Value:
    """``Shape(Concat(mask, mask, axis))[1]`` (int64): the width (axis 0), twice the width (axis 1)."""
    return _wide(w, w.op("Concat", m, m, axis=axis))


def _ids_width(w: Writer, m: ir.Value) -> ir.Value:
    ids = next(v for v in m.graph.inputs if v.name == "input_ids")
    return _gather(w, w.op("Shape", ids), 1)


VALUE_TOTAL_FORMS = {f.name: f for f in [
    Form("transpose-roundtrip", lambda w, m: _width(w, w.op("Shape", _twice(w, m)))),
    Form("shape-of-transposed", lambda w, m: w.op("Cast", _gather(w, w.op("Shape", w.op("Transpose", m, perm=[1, 0])),
                                                                  0), to=I32)),
    Form("flatten-reshape", lambda w, m: _width(w, w.op("Shape", _flat(w, m)))),
    Form("expand-own-shape", lambda w, m: _width(w, w.op("Shape", w.op("Expand", m, w.op("Shape", m))))),
    Form("tile-ones", lambda w, m: _width(w, w.op("Shape", w.op("Tile", m, w.const([1, 1]))))),
    Form("affine-max", lambda w, m: w.op("Cast", w.op("Max", w.op("Add", w.op("Mul", _wide(w, m), w.const(1)),
                                                                    w.const(0)), w.const(0)), to=I32), since=12),
    Form("thousand-minus", lambda w, m: w.op("Cast", w.op("Sub", w.const(1000), w.op("Sub", w.const(1000),
                                                                                       _wide(w, m))), to=I32)),
    Form("argmax-concat", lambda w, m: _argmax_concat(w, m, [1])),
    Form("argmax-concat-rows", _argmax_rows),
    # lookalikes
    Form("shape-of-transposed-1", lambda w, m: w.op("Cast", _gather(w, w.op("Shape", w.op(
        "Transpose", m, perm=[1, 0])), 1), to=I32), same=False, why="dimension 1 of the transposed mask: the batch"),
    Form("tile-twice", lambda w, m: _width(w, w.op("Shape", w.op("Tile", m, w.const([1, 2])))), same=False,
         why="the width of the mask tiled twice along its columns: twice the width"),
    Form("max-one", lambda w, m: w.op("Cast", w.op("Max", _wide(w, m), w.const(1)), to=I32), same=False, since=12,
         why="Max(width, 1): 1, not the width, for a mask of width 0"),
    Form("thousand-minus-999", lambda w, m: w.op("Cast", w.op("Sub", w.const(1000), w.op("Sub", w.const(999),
                                                                                           _wide(w, m))), to=I32),
         same=False, why="1000 - (999 - width): the width + 1"),
    Form("argmax-concat-first", lambda w, m: _argmax_concat(w, m, [1, 1], last=1), same=False,
         why="the last of two ones after the zeros: the width + 1"),
    Form("max-input-ids", lambda w, m: w.op("Cast", w.op("Max", _ids_width(w, m), _wide(w, m)), to=I32), same=False,
         since=12,
         why="Max(input_ids' width, the mask's width): the mask's width only where the client sends a mask at least as "
             "wide as the call (a contract, not a fact of the graph)"),
    Form("where-input-ids", lambda w, m: w.op("Cast", w.op("Where", w.op("Greater", _ids_width(w, m), _wide(w, m)),
                                                           _ids_width(w, m), _wide(w, m)), to=I32), same=False,
         why="Where(ids width > mask width, ids width, mask width): the same contract"),
    # red team 37: the width through a cast of the values, Min with a number past every width, Concat
    Form("shape-of-float-cast", lambda w, m: _width(w, w.op("Shape", w.op("Cast", m, to=ir.DataType.FLOAT)))),
    Form("min-huge", lambda w, m: w.op("Cast", w.op("Min", _wide(w, m), w.const(2**40)), to=I32), since=12),
    Form("concat-rows", lambda w, m: w.op("Cast", _concat_width(w, m, 0), to=I32)),
    Form("concat-columns-halved", lambda w, m: w.op("Cast", w.op("Div", _concat_width(w, m, 1), w.const(2)), to=I32)),
    Form("shape-of-float-cast-batch", lambda w, m: w.op("Cast", _gather(w, w.op("Shape", w.op(
        "Cast", m, to=ir.DataType.FLOAT)), 0), to=I32), same=False, why="dimension 0 of the cast mask: the batch"),
    Form("min-five", lambda w, m: w.op("Cast", w.op("Min", _wide(w, m), w.const(5)), to=I32), same=False, since=12,
         why="Min(width, 5): 5, not the width, for a mask wider than 5"),
    Form("concat-columns", lambda w, m: w.op("Cast", _concat_width(w, m, 1), to=I32), same=False,
         why="the width of the mask concatenated with itself along the columns: twice the width"),
    Form("halved", lambda w, m: w.op("Cast", w.op("Div", _wide(w, m), w.const(2)), to=I32), same=False,
         why="the width / 2: not the width for a mask wider than 0"),
]}


VALUE_SEQLENS_FORMS = {f.name: f for f in [
    Form("transpose-roundtrip", lambda w, m: _minus_one(w, _row_sums(w, _twice(w, m)))),
    Form("transposed-sum", lambda w, m: _minus_one(w, w.axes_op("ReduceSum", w.op("Transpose", m, perm=[1, 0]), [0],
                                                                keepdims=0))),
    Form("flatten-reshape", lambda w, m: _minus_one(w, _row_sums(w, _flat(w, m)))),
    Form("expand-own-shape", lambda w, m: _minus_one(w, _row_sums(w, w.op("Expand", m, w.op("Shape", m))))),
    Form("tile-ones", lambda w, m: _minus_one(w, _row_sums(w, w.op("Tile", m, w.const([1, 1]))))),
    Form("cumsum-last", lambda w, m: _minus_one(w, _gather(w, w.op("CumSum", m, w.const(1)), -1, axis=1))),
    Form("cumsum-reverse-first", lambda w, m: _minus_one(w, _gather(w, w.op("CumSum", m, w.const(-1), reverse=1), 0,
                                                                    axis=1))),
    # lookalikes
    Form("transpose-reshape", lambda w, m: _minus_one(w, _row_sums(w, w.op("Reshape", w.op("Transpose", m, perm=[1, 0]),
                                                                          w.op("Shape", m)))), same=False,
         why="the transposed mask's elements reshaped to the mask's shape (not transposed back): rows mixed"),
    Form("reshape-transposed-shape", lambda w, m: _minus_one(w, w.axes_op("ReduceSum", w.op(
        "Reshape", m, w.op("Shape", w.op("Transpose", m, perm=[1, 0]))), [0], keepdims=0)), same=False,
         why="the mask's elements reshaped to [width, batch] (not transposed) and summed over axis 0: rows mixed"),
    Form("flatten-0", lambda w, m: _minus_one(w, _row_sums(w, w.op("Flatten", m, axis=0))), same=False,
         why="the mask flattened to one row: the sum of every row (the row sum for a batch of 1 only)"),
    Form("expand-batch-2", lambda w, m: _minus_one(w, _row_sums(w, w.op("Expand", m, w.const([2, 1])))), same=False,
         why="the mask expanded to 2 rows: a batch of 1 gets its row twice (and a batch of 3 fails)"),
    Form("cumsum-exclusive-last", lambda w, m: w.op("Cast", _gather(w, w.op("CumSum", m, w.const(1), exclusive=1), -1,
                                                                    axis=1), to=I32), same=False,
         why="the last column of an exclusive CumSum: the row's sum without its last element (sum - 1 only where the "
             "row ends in a 1: not for a right-padded row)"),
    Form("cumsum-second-last", lambda w, m: w.op("Cast", _gather(w, w.op("CumSum", m, w.const(1)), -2, axis=1),
                                                 to=I32), same=False,
         why="the last column but one of the CumSum: the row's sum without its last element"),
    Form("cumsum-max", lambda w, m: _minus_one(w, _reduce_max(w, w.op("CumSum", m, w.const(1)))), same=False,
         why="the largest running sum: the row's sum only for a mask without negative values"),
    # red team 37: sum - 1 through Neg/Sub, a Where whose condition the row sums decide, the sum of two halves
    Form("neg-one-minus", lambda w, m: w.op("Cast", w.op("Neg", w.op("Sub", w.const(1), _row_sums(w, m))), to=I32)),
    Form("where-positive", lambda w, m: _where_above(w, m, 0)),
    Form("halves", lambda w, m: _minus_one(w, _halves(w, m))),
    Form("neg-zero-minus", lambda w, m: w.op("Cast", w.op("Neg", w.op("Sub", w.const(0), _row_sums(w, m))), to=I32),
         same=False, why="-(0 - s): s, not s - 1"),
    Form("where-above-one", lambda w, m: _where_above(w, m, 1), same=False,
         why="Where(s > 1, s - 1, -1): -1, not 0, for a row summing to 1"),
    Form("halves-overlap", lambda w, m: _minus_one(w, _halves(w, m, overlap=1)), same=False,
         why="the sums of columns [0, h + 1) and [h, width): column h counted twice"),
    Form("uint8-times-257", lambda w, m: _minus_one(w, _row_sums(w, w.op("Cast", w.op("Cast", w.op(
        "Mul", m, w.const(257)), to=ir.DataType.UINT8), to=I64))), same=False,
         why="257 * mask through uint8: 257 * v wraps to v mod 256, a mask value of 300 counts 44"),
]}


__all__ = ["I64", "VALUE_SEQLENS_FORMS", "VALUE_TOTAL_FORMS"]
