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
]}


__all__ = ["I64", "VALUE_SEQLENS_FORMS", "VALUE_TOTAL_FORMS"]
