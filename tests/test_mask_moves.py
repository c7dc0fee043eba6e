"""The abstract-domain rules red team 35 added (issue 32), rule by rule on their edge cases: the moves of a mask view
(:mod:`rope_passes.proofs.mask_moves`) and the affine arithmetic / ArgMax of call dimensions
(:mod:`rope_passes.proofs.dims`, :func:`rope_passes.proofs.known.arg_of_parts`). Each exact rule next to the
lookalike it must refuse; the graphs that use them are tests/test_form_fuzzer.py's ``value-*`` cases."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

import rope_passes.proofs.mask_moves as moves
from rope_passes.proofs.dims import OPAQUE, Affine, Dim, Foreign, _scalar, symbolic
from rope_passes.proofs.known import Known, arg_of_parts
from rope_passes.proofs.mask_values import MaskRows, RowSums, Unfollowed

W, B = Dim(1), Dim(0)
MASK = ir.Value(name="attention_mask", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape(["b", "t"]))
ROWS = MaskRows(MASK, ("b", "t"), W)


def test_reshape_keeps_the_batch_and_the_columns_apart():
    assert moves.reshape(("b", "t"), (B, W), [0, -1], False) == ("b", "t")
    assert moves.reshape(("b", "t"), (B, W), [B, 1, W], False) == ("b", 1, "t")
    assert moves.reshape(("b", 1), (B, 1), [-1], False) == ("b",)
    assert moves.reshape(("b", "t"), (B, W), [0, 0, -1], False) == ("b", "t", 1)
    assert moves.reshape(("b", "t"), (B, W), [-1, 0], False) == ("b", "t")
    for entries in ([W, B], [-1], [0, -1, -1], [2, -1], [0, 0]):  # transposed extents, merged, a constant, ...
        with pytest.raises(Unfollowed):
            moves.reshape(("b", "t"), (B, W), entries, entries == [0, 0])  # allowzero: 0 is an extent of 0


def test_expand_and_tile_copy_nothing_or_are_refused():
    assert moves.expand(("b", "t"), (B, W), [B, W]) == ("b", "t")
    assert moves.expand(("b", "t"), (B, W), [1, 1, 1]) == (1, "b", "t")
    for entries in ([2, 1], [W, B], [1, OPAQUE], [3, 1, 1]):
        with pytest.raises(Unfollowed):
            moves.expand(("b", "t"), (B, W), entries)
    moves.tile([1, 1])
    with pytest.raises(Unfollowed):
        moves.tile([1, 2])


def test_the_row_sum_is_the_end_column_of_a_running_sum():
    forward, reverse = moves.cumsum(ROWS, -1, False, False), moves.cumsum(ROWS, 1, False, True)
    assert moves.gather(forward, np.array(-1), 1) == RowSums(MASK, ("b",), 0)
    assert moves.gather(forward, np.array([-1]), -1) == RowSums(MASK, ("b", 1), 0)
    assert moves.gather(forward, np.array(Affine(W, 1, -1), dtype=object), 1) == RowSums(MASK, ("b",), 0)
    assert moves.gather(reverse, np.array(0), 1) == RowSums(MASK, ("b",), 0)
    for x, index in ((forward, 0), (forward, -2), (reverse, -1), (ROWS, -1), (forward, [-1, -1])):
        with pytest.raises(Unfollowed):
            moves.gather(x, np.array(index), 1)
    for axis, exclusive in ((0, False), (1, True)):  # along the batch; exclusive (the last leaves out the last)
        with pytest.raises(Unfollowed):
            moves.cumsum(ROWS, axis, exclusive, False)
    with pytest.raises(Unfollowed):
        moves.cumsum(forward, 1, False, False)
    assert moves.transpose(("b", "t"), None) == ("t", "b")


def _cast(to: ir.DataType, source: ir.DataType, x: object) -> object:
    value = ir.Value(name="x", type=ir.TensorType(source))
    node = ir.node("Cast", [value], attributes={"to": to})
    return symbolic(node, [np.array([x], dtype=object)])[0][0]


def test_affine_arithmetic_gives_the_width_back_and_nothing_else():
    inner = _scalar("Sub", (1000, W))
    assert isinstance(inner, Affine) and _scalar("Sub", (1000, inner)) == W
    assert _scalar("Sub", (1000, _scalar("Sub", (999, W)))) == Affine(W, 1, 1)
    assert _scalar("Add", (_scalar("Mul", (W, 1)), 0)) == W and _scalar("Max", (W, 0)) == W
    assert _scalar("Sub", (_scalar("Mul", (W, 1 << 62)), _scalar("Mul", (W, (1 << 62) - 1)))) == W  # wraps: a ring
    assert _scalar("Mul", (W, 0)) == 0 and _scalar("Min", (W, -2)) == -2
    for value in (_scalar("Max", (W, 1)), _scalar("Mul", (W, W)), _scalar("Add", (W, B)), _scalar("Add", (W, 0.5)),
                  _scalar("Max", (W, Foreign("input_ids", 1))), _scalar("Add", (_scalar("Mul", (W, 0)), 1 << 40))):
        assert value is OPAQUE or (isinstance(value, Affine) and value != W), value
    # a cast keeps an affine form only where it keeps int64's ring: to int32, or int64 -> int64 (not a widening)
    plus = Affine(W, 1, 1)
    assert _cast(ir.DataType.INT32, ir.DataType.INT64, plus) == plus
    assert _cast(ir.DataType.INT64, ir.DataType.INT64, plus) == plus
    assert _cast(ir.DataType.INT64, ir.DataType.INT32, plus) is OPAQUE
    assert _cast(ir.DataType.FLOAT, ir.DataType.INT64, W) is OPAQUE


def _part(extent: object, value: int) -> Known:
    return Known((extent,), (1,), np.array([value]), False)


@pytest.mark.parametrize("parts,last,expected", [
    ([(W, 0), (1, 1)], False, W),  # zeros[w] then a one: the width, also for w = 0
    ([(W, 0), (2, 1)], True, Affine(W, 1, 1)),  # the last of two ones
    ([(3, 0), (W, 5), (1, 1)], False, None),  # the 5s may be empty: the index moves with w
    ([(W, 1), (1, 1)], False, None),  # ones before the one: 0 when w > 0, w when w = 0
    ([(W, 0), (OPAQUE, 0), (1, 1)], False, None),  # an extent nothing is known of
    ([(2, 3), (W, 0), (1, 1)], False, 0),  # the first part is the largest
])
def test_argmax_of_a_concatenation_of_uniform_parts(parts, last, expected):
    found = arg_of_parts([_part(e, v) for e, v in parts], 0, False, last, False)
    assert (found is None) if expected is None else (found is not None and found.values.reshape(-1)[0] == expected)
