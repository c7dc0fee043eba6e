"""The abstract-domain rules red team 35 added (issue 32), rule by rule on their edge cases: the moves of a mask view
(:mod:`rope_passes.proofs.mask_moves`) and the affine arithmetic / ArgMax of call dimensions
(:mod:`rope_passes.proofs.dims`, :func:`rope_passes.proofs.known.arg_of_parts`). Each exact rule next to the
lookalike it must refuse; the graphs that use them are tests/test_form_fuzzer.py's ``value-*`` cases."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

import rope_passes.proofs.mask_moves as moves
from rope_passes.proofs.dims import DIM_MAX, OPAQUE, Affine, Dim, Foreign, Quot, _scalar, symbolic
from rope_passes.proofs.known import Known, arg_of_parts
from rope_passes.proofs.mask_steps import solve as _solve
from rope_passes.proofs.mask_values import S_MAX, MaskRows, RowSums, RowTest, Unfollowed

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


# -- red team 37: the row sums' affine forms, comparisons that decide a Where, two halves, Div / Min of a width -----
def test_division_and_bounds_of_a_dimension():
    assert _scalar("Div", (Affine(W, 2, 0), 2), 64) == W  # (2w) / 2 in int64: exact
    assert _scalar("Div", (Affine(W, 2, 0), 2), 32) is OPAQUE  # 2w may have wrapped in int32
    assert _scalar("Div", (Affine(W, 2, 1), 2), 64) == W  # (2w + 1) / 2 rounds down to w: never negative
    assert _scalar("Div", (W, 2), 64) == Quot(W, 2) == _scalar("Div", (W, 2), 32)  # the same number twice
    assert _scalar("Div", (Affine(W, 1, -1), 2), 64) is OPAQUE  # -1 / 2 rounds toward 0: not a floor
    assert _scalar("Min", (W, 1 << 40), 64) == W and _scalar("Min", (W, DIM_MAX), 64) == W
    assert _scalar("Max", (W, 1 << 40), 64) == 1 << 40
    for value in (_scalar("Min", (W, 5), 64), _scalar("Min", (W, DIM_MAX - 1), 64), _scalar("Div", (W, 0), 64),
                  _scalar("Max", (Affine(W, 1 << 40, 0), 0), 64)):
        assert value is OPAQUE, value


def test_row_sum_comparisons_are_the_row_sums_where_they_hold():
    assert _solve(1, 0, "Greater") == ((1, S_MAX),)  # s > 0
    assert _solve(1, -1, "Greater") == ((2, S_MAX),)  # s - 1 > 0
    assert _solve(-1, 1, "GreaterOrEqual") == ((0, 1),)  # 1 - s >= 0
    assert _solve(2, -4, "Equal") == ((2, 2),) and _solve(2, -3, "Equal") == ()
    assert _solve(1, 0, "Less") == ()  # no row sum is negative
    test = RowTest(MASK, ("b",), None, _solve(1, 0, "Greater"))
    assert test.negated().truth == ((0, 0),) and test.negated().negated() == test


def _prove(form: str, kind: str, opset: int = 18):
    """MaskLengths on a graph holding only ``form`` (:mod:`mutants.value_forms`) of the attention mask."""
    from mutants.forms import Writer
    from mutants.value_forms import VALUE_SEQLENS_FORMS, VALUE_TOTAL_FORMS

    from rope_passes.proofs.mask_lengths import MaskLengths

    mask = ir.Value(name="attention_mask", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape(["b", "t"]))
    w = Writer(opset, "/lengths")
    out = (VALUE_SEQLENS_FORMS if kind == "seqlens" else VALUE_TOTAL_FORMS)[form].build(w, mask)
    model = ir.Model(ir.Graph([mask], [out], nodes=w.nodes, opset_imports={"": opset}), ir_version=10)
    lengths = MaskLengths(model)
    return lengths.seqlens(out) if kind == "seqlens" else lengths.total(out)


@pytest.mark.parametrize("form,kind", [("neg-one-minus", "seqlens"), ("where-positive", "seqlens"),
                                       ("halves", "seqlens"), ("shape-of-float-cast", "total"),
                                       ("min-huge", "total"), ("concat-rows", "total"),
                                       ("concat-columns-halved", "total")])
def test_red_team_37_forms_are_proved(form: str, kind: str):
    assert _prove(form, kind).mask.name == "attention_mask"


@pytest.mark.parametrize("form,kind,said,node", [
    ("neg-zero-minus", "seqlens", "seqlens_k is the row sums of 'attention_mask' +0, not the row sums - 1 (last "
     "changed by Neg '/lengths/Neg_", "Neg"),
    ("where-above-one", "seqlens", "takes -1 for a row summing to 1 (the rows summing to 0..1 take it), where the row "
     "sums of the mask -1 is 0", "Where"),
    ("halves-overlap", "seqlens", "slices the mask's columns from 0 to a number set per call", "Slice"),
    ("uint8-times-257", "seqlens", "casts 257 times the mask's values to UINT8: it holds 0..255, 257 becomes 1: the "
     "sums change", "Cast"),
    ("min-five", "total", "(the width goes into Min '/lengths/Min_", "Min"),
    ("concat-columns", "total", "computes [2 * dimension 1 of 'attention_mask' +0]", "Cast"),
    ("halved", "total", "computes [(dimension 1 of 'attention_mask') / 2] (the width goes into Div", "Div"),
    ("shape-of-float-cast-batch", "total", "computes [dimension 0 of 'attention_mask']", "Cast"),
])
def test_red_team_37_traps_are_refused_naming_the_node(form: str, kind: str, said: str, node: str):
    """The refusal says what the graph computes and names the node that breaks the proof, carried as the IR object
    (the failure's source): a uint8 wrap names its Cast, not a division the graph does not hold."""
    from rope_passes.report import MatchFailure

    with pytest.raises(MatchFailure) as caught:
        _prove(form, kind)
    failure = caught.value
    assert failure.refused and said in failure.reason, failure.reason
    assert isinstance(failure.source, ir.Node) and failure.source.op_type == node, failure.source
    assert f"'{failure.source.name}'" in failure.reason
    assert "/ 257" not in failure.reason and "division" not in failure.reason
