"""rope_passes.analysis.patterns: onnxscript patterns read as matched / refused (with check's reason) / not matched."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from rope_passes.analysis.longrope import if_switch
from rope_passes.analysis.longrope_switch import switch_offset
from rope_passes.analysis.patterns import LongRoPESwitchCondition
from rope_passes.proofs.mask_lengths import MaskLengths
from rope_passes.report import MatchFailure


def _model(nodes, inits, output: str, mask_dtype=TensorProto.INT64) -> ir.Model:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("attention_mask", mask_dtype, ["batch", "total"])],
        [helper.make_tensor_value_info(output, TensorProto.INT32, None)], initializer=inits)
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def _total_seq(index=1, shape_attrs=None, cast_attrs=None) -> ir.Model:
    nodes = [helper.make_node("Shape", ["attention_mask"], ["shape"], name="shape", **(shape_attrs or {})),
             helper.make_node("Gather", ["shape", "idx"], ["width"], name="gather", axis=0),
             helper.make_node("Cast", ["width"], ["total"], name="cast", to=TensorProto.INT32, **(cast_attrs or {}))]
    return _model(nodes, [helper.make_tensor("idx", TensorProto.INT64, [], [index])], "total")


def _seqlens(one=1, keepdims=0, axes=(1,)) -> ir.Model:
    nodes = [helper.make_node("ReduceSum", ["attention_mask", "axes"], ["rows"], name="sum", keepdims=keepdims),
             helper.make_node("Sub", ["rows", "one"], ["m1"], name="sub"),
             helper.make_node("Cast", ["m1"], ["seqlens"], name="cast", to=TensorProto.INT32)]
    inits = [helper.make_tensor("axes", TensorProto.INT64, [len(axes)], list(axes)),
             helper.make_tensor("one", TensorProto.INT64, [], [one])]
    return _model(nodes, inits, "seqlens")


def _output(model: ir.Model) -> ir.Value:
    return model.graph.outputs[0]


def _total(model: ir.Model, names=("attention_mask",)):
    return MaskLengths(model, names).total(_output(model))


def _seqs(model: ir.Model, names=("attention_mask",)):
    return MaskLengths(model, names).seqlens(_output(model))


def test_total_seq_proved_with_its_nodes_and_mask():
    model = _total_seq(cast_attrs={"saturate": 1})  # an extra attribute changes no value
    found = _total(model)
    assert found.mask is model.graph.inputs[0]
    assert sorted(n.name for n in found.nodes) == ["cast", "gather", "shape"]


@pytest.mark.parametrize("model,reason", [
    (lambda: _total_seq(index=0), "Cast 'cast' computes [dimension 0 of 'attention_mask']"),
    (lambda: _total_seq(shape_attrs={"start": 1}), "total_sequence_length is not the mask's width"),
], ids=["dim0", "start"])
def test_total_seq_refused_with_the_node(model, reason):
    with pytest.raises(MatchFailure) as failure:
        _total(model())
    assert failure.value.refused and reason in failure.value.reason, failure.value.reason


def test_not_matched_names_the_producer():
    m = _seqlens()
    with pytest.raises(MatchFailure) as failure:  # row sums, no shape read: not a length chain, naming what it is
        _total(m)
    assert not failure.value.refused and "Cast 'cast' computes row sums of" in failure.value.reason
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.INT32), shape=ir.Shape([]))
    ir.Graph([x], [x], nodes=[])
    with pytest.raises(MatchFailure) as failure:  # a graph input: the caller's number, nothing of the mask
        MaskLengths(m).total(x)
    assert not failure.value.refused and "'x'" in failure.value.reason


def test_seqlens_proved_and_refusals():
    found = _seqs(_seqlens())
    assert sorted(n.name for n in found.nodes) == ["cast", "sub", "sum"]
    _seqs(_seqlens(keepdims=1))  # mobius: [batch, 1], the same numbers GroupQueryAttention reads by flat index
    for model, reason in ((_seqlens(one=2), "row sums of 'attention_mask' -2, not the row sums - 1 (last changed by "
                                            "Sub 'sub')"),
                          (_seqlens(keepdims=1, axes=(0,)), "ReduceSum 'sum' sums axes [0] (b)"),
                          (_seqlens(axes=(0,)), "ReduceSum 'sum' sums axes [0] (b)")):
        with pytest.raises(MatchFailure) as failure:
            _seqs(model)
        assert failure.value.refused and reason in failure.value.reason, failure.value.reason


def test_longrope_switch_threshold_must_be_constant():
    def model(threshold_init: bool) -> ir.Model:
        graph = helper.make_graph(
            [helper.make_node("Greater", ["total", "original"], ["cond"], name="gt")], "g",
            [helper.make_tensor_value_info("total", TensorProto.INT64, [])]
            + ([] if threshold_init else [helper.make_tensor_value_info("original", TensorProto.INT64, [])]),
            [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
            initializer=[helper.make_tensor("original", TensorProto.INT64, [], [4096])] if threshold_init else [])
        return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))

    good = model(True)
    found = LongRoPESwitchCondition().match_value(good, good.graph.outputs[0], "cond")
    assert found.ok and int(found.bindings["original"].const_value.numpy()) == 4096
    bad = model(False)
    found = LongRoPESwitchCondition().match_value(bad, bad.graph.outputs[0], "cond")
    assert found.refused and found.reason == "Greater's threshold is not a constant"
    onnx.checker.check_model(ir.to_proto(good))


def test_mask_must_be_the_attention_mask_input():
    """A rank-2 integer graph input is not enough: the mask is the input genai_config names (default
    ``attention_mask``); ``input_ids`` has the same look."""
    model = _total_seq()
    _total(model)
    with pytest.raises(MatchFailure) as failure:
        _total(model, ("mask",))
    assert failure.value.refused and "'attention_mask' is not the attention mask (the graph input 'mask'" in \
        failure.value.reason
    with pytest.raises(MatchFailure) as failure:
        _seqs(_seqlens(), ("input_ids",))
    assert failure.value.refused and "is not the attention mask" in failure.value.reason


# --- the LongRoPE switch, proved as a function of the total length --------------------------------------------------


def _switch_model(condition) -> tuple[ir.Model, list[ir.Node]]:
    """``If(condition(total, ids_len))`` over two constant tables (8 short rows, 64 long), read by a GQA whose
    total_sequence_length is ``Cast<int32>(Gather(Shape(attention_mask), 1))``; ``total`` is the Gather's int64."""
    nodes = [helper.make_node("Shape", ["attention_mask"], ["shape"], name="shape"),
             helper.make_node("Gather", ["shape", "one"], ["total"], name="gather", axis=0),
             helper.make_node("Cast", ["total"], ["total32"], name="cast", to=TensorProto.INT32),
             helper.make_node("Shape", ["input_ids"], ["ids_shape"], name="ids_shape"),
             helper.make_node("Gather", ["ids_shape", "one"], ["ids_len"], name="ids_len", axis=0),
             *condition,
             helper.make_node("If", ["cond"], ["cos"], name="if",
                              then_branch=_branch("long", 64), else_branch=_branch("short", 8)),
             helper.make_node("GroupQueryAttention", ["q", "", "", "", "", "", "total32", "cos", "cos"], ["out"],
                              name="gqa", domain="com.microsoft", num_heads=1, kv_num_heads=1, do_rotary=1)]
    inits = [helper.make_tensor(n, TensorProto.INT64, [], [v]) for n, v in
             (("one", 1), ("c8", 8), ("c4", 4), ("c2", 2), ("c16", 16), ("c20", 20))]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["b", "t"]),
                     helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"]),
                     helper.make_tensor_value_info("q", TensorProto.FLOAT, ["b", "s", 32])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], initializer=inits)
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                                  helper.make_opsetid("com.microsoft", 1)]))
    return model, [n for n in model.graph if n.op_type == "GroupQueryAttention"]


def _branch(name: str, rows: int):
    table = helper.make_tensor(f"{name}_table", TensorProto.FLOAT, [rows, 8], [0.0] * rows * 8)
    return helper.make_graph([helper.make_node("Constant", [], [f"{name}_out"], value=table)], name, [],
                             [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [rows, 8])])


def _offset(*condition) -> int:
    model, gqas = _switch_model(condition)
    switch = if_switch(model, next(n for n in model.graph if n.op_type == "If"))
    return switch_offset(model, switch, gqas, max_total=64)


@pytest.mark.parametrize("condition,offset", [
    ([helper.make_node("Greater", ["total", "c8"], ["cond"], name="gt")], 8),
    ([helper.make_node("Greater", ["total32", "c8"], ["cond"], name="gt")], 8),  # GQA's own int32 value
    ([helper.make_node("Identity", ["total"], ["t"]), helper.make_node("Greater", ["t", "c8"], ["cond"], name="gt")],
     8),
    ([helper.make_node("Add", ["total", "c4"], ["t"]), helper.make_node("Greater", ["t", "c8"], ["cond"])], 4),
    ([helper.make_node("Mul", ["total", "c2"], ["t"]), helper.make_node("Greater", ["t", "c16"], ["cond"])], 8),
    ([helper.make_node("GreaterOrEqual", ["total", "c8"], ["cond"])], 7),
    ([helper.make_node("Less", ["c8", "total"], ["cond"])], 8),
    ([helper.make_node("Div", ["total", "c2"], ["t"]), helper.make_node("Greater", ["t", "c4"], ["cond"])], 9),
], ids=["greater", "int32-total", "identity", "plus4", "times2", "greater-equal", "less-swapped", "div2"])
def test_switch_offset_is_where_the_condition_flips(condition, offset):
    assert _offset(*condition) == offset


@pytest.mark.parametrize("condition,target,reason", [
    ([helper.make_node("Greater", ["ids_len", "c8"], ["cond"], name="gt")], "ids_len",
     "computed through Gather 'ids_len' (reading graph input 'input_ids')"),
    ([helper.make_node("Max", ["total", "ids_len"], ["t"], name="max"),
      helper.make_node("Greater", ["t", "c8"], ["cond"], name="gt")], "ids_len", "reading graph input 'input_ids'"),
    ([helper.make_node("Less", ["total", "c8"], ["cond"], name="lt")], "lt",
     "not 'total > offset' for any offset: true at total 1, false at total 8"),
    ([helper.make_node("Equal", ["total", "c20"], ["cond"], name="eq")], "eq", "true at total 20, false at total 21"),
    ([helper.make_node("Greater", ["total", "total"], ["cond"], name="gt")], "if", "threshold is not a constant"),
    ([helper.make_node("Greater", ["c20", "c8"], ["cond"], name="gt")], "gt", "does not depend on the total"),
    ([helper.make_node("Greater", ["total", "c20"], ["t"], name="gt"),
      helper.make_node("Not", ["t"], ["u"], name="not"), helper.make_node("Not", ["u"], ["cond"], name="not2")],
     None, None),
], ids=["call-length", "max-with-call-length", "less", "equal", "threshold-total", "constant", "not-not"])
def test_switch_offset_refusals_name_the_node(condition, target, reason):
    if target is None:  # Not(Not(total > 20)) is total > 20: proved, not refused
        assert _offset(*condition) == 20
        return
    with pytest.raises(MatchFailure) as caught:
        _offset(*condition)
    assert caught.value.refused and caught.value.place == target and reason in caught.value.reason, caught.value
