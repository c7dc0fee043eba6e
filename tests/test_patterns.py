"""rope_passes.analysis.patterns: onnxscript patterns read as matched / refused (with check's reason) / not matched."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from rope_passes.analysis.longrope import if_switch, switch_offset
from rope_passes.analysis.patterns import LongRoPESwitchCondition, SeqlensFromMaskSum, TotalSeqFromMaskShape
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


def test_total_seq_matched_with_its_nodes_and_mask():
    model = _total_seq(cast_attrs={"saturate": 1})  # an extra attribute is onnxscript's business: still a match
    found = TotalSeqFromMaskShape().match_value(model, _output(model), "total_sequence_length")
    assert found.ok and not found.refused
    assert found.bindings["mask"] is model.graph.inputs[0]
    assert sorted(n.name for n in found.nodes) == ["cast", "gather", "shape"]


@pytest.mark.parametrize("model,reason", [
    (lambda: _total_seq(index=0), "Gather 'gather' reads dimension 0, not the mask's dimension 1"),
    (lambda: _total_seq(shape_attrs={"start": 1}), "Shape 'shape' has start/end attributes"),
], ids=["dim0", "start"])
def test_total_seq_refused_with_check_reason(model, reason):
    m = model()
    found = TotalSeqFromMaskShape().match_value(m, _output(m), "total_sequence_length")
    assert not found.ok and found.refused and found.reason == reason


def test_not_matched_names_the_producer():
    m = _seqlens()
    found = TotalSeqFromMaskShape().match_value(m, _output(m), "total_sequence_length")
    assert not found.ok and not found.refused
    assert found.reason.startswith("total_sequence_length comes from Cast 'cast', not Cast<int32>(Gather(Shape(mask)")
    found = TotalSeqFromMaskShape().match_value(m, m.graph.inputs[0], "x")
    assert not found.ok and "graph input" in found.reason


def test_seqlens_matched_and_refusals():
    m = _seqlens()
    found = SeqlensFromMaskSum().match_value(m, _output(m), "seqlens_k")
    assert found.ok and sorted(n.name for n in found.nodes) == ["cast", "sub", "sum"]
    kept = _seqlens(keepdims=1)  # mobius: [batch, 1], the same numbers GroupQueryAttention reads by flat index
    found = SeqlensFromMaskSum().match_value(kept, _output(kept), "seqlens_k")
    assert found.ok and not found.refused, found.reason
    for model, reason in ((_seqlens(one=2), "Sub 'sub' subtracts something other than the constant 1"),
                          (_seqlens(keepdims=1, axes=(0,)), "reduces axes [0] with keepdims=1"),
                          (_seqlens(axes=(0,)), "reduces axes [0] with keepdims=0")):
        found = SeqlensFromMaskSum().match_value(model, _output(model), "seqlens_k")
        assert found.refused and reason in found.reason, found.reason


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
    assert TotalSeqFromMaskShape().match_value(model, _output(model), "total").ok
    found = TotalSeqFromMaskShape(("mask",)).match_value(model, _output(model), "total")
    assert found.refused and "'attention_mask' is not the attention mask (the graph input 'mask'" in found.reason
    found = SeqlensFromMaskSum(("input_ids",)).match_value(_seqlens(), _output(_seqlens()), "seqlens_k")
    assert found.refused and "is not the attention mask" in found.reason


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
    assert caught.value.refused and caught.value.target == target and reason in caught.value.reason, caught.value
