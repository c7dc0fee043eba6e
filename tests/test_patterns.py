"""rope_passes.analysis.patterns: onnxscript patterns read as matched / refused (with check's reason) / not matched."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from rope_passes.analysis.patterns import LongRoPESwitchCondition, SeqlensFromMaskSum, TotalSeqFromMaskShape


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
    for model, reason in ((_seqlens(one=2), "Sub 'sub' subtracts something other than the constant 1"),
                          (_seqlens(keepdims=1), "reduces axes [1] with keepdims=1"),
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
