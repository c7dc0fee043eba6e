"""Pass infrastructure: onnx_ir pass protocol, reports, explicit preset order, cleanup."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from rope_passes.errors import UsageError
from rope_passes.passes import ALL_PASSES, CleanupPass
from rope_passes.plan import PRESETS, make_plan, pass_order
from rope_passes.report import Outcome


def model_with_dead_code() -> ir.Model:
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "w"], ["y"], "live"),
            helper.make_node("Mul", ["x", "dead_w"], ["d1"], "dead1"),
            helper.make_node("Cos", ["d1"], ["d2"], "dead2"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        [numpy_helper.from_array(np.ones(3, np.float32), "w"), numpy_helper.from_array(np.ones(3, np.float32), "dead_w")],
    )
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_cleanup_removes_dead_nodes_and_initializers_and_reports_it():
    model = model_with_dead_code()
    result = CleanupPass()(model)
    assert isinstance(result, ir.passes.PassResult) and result.model is model and result.modified
    assert [n.name for n in model.graph] == ["live"]
    assert list(model.graph.initializers) == ["w"]
    r = result.report
    assert (r.nodes_removed, r.nodes_added, r.initializers_removed) == (2, 0, 1)
    assert r.status == "rewritten 1" and r.findings[0].outcome is Outcome.REWRITTEN


def test_cleanup_keeps_a_loop_s_empty_condition_input():
    """Red team round 2 (L01): a "for" Loop(M, "") — its optional condition given as empty. onnx_ir's
    RemoveUnusedNodesPass drops trailing empty inputs, and Loop(M) does not load on onnxruntime ("input size 1 not in
    range [min=2"): every output of a graph with such a loop was unloadable. Cleanup keeps kept nodes' inputs."""
    import onnxruntime as ort

    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]), helper.make_node("Cast", ["i"], ["s"], to=TensorProto.FLOAT)],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", ""], ["y"], "loop", body=body),  # a scan of the iteration count, no state
         helper.make_node("Cos", ["M"], ["dead"], "dead")], "g",
        [helper.make_tensor_value_info("M", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])])
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))
    result = CleanupPass()(model)
    assert result.report.nodes_removed == 1
    loop = next(n for n in model.graph if n.op_type == "Loop")
    assert len(loop.inputs) == 2 and loop.inputs[1] is None
    proto = ir.to_proto(model)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    out = sess.run(None, {"M": np.array(3, np.int64)})[0]
    assert out.tolist() == [0.0, 1.0, 2.0]


def test_cleanup_on_clean_graph_says_why_nothing_changed():
    model = model_with_dead_code()
    CleanupPass()(model)
    result = CleanupPass()(model)
    assert not result.modified
    assert result.report.status == "not matched: no dead nodes or initializers"


def test_passes_work_in_an_onnx_ir_pass_manager():
    model = model_with_dead_code()
    manager = ir.passes.PassManager([CleanupPass()])
    assert manager(model).modified and len(model.graph) == 1


def test_presets_are_explicit_registered_and_end_with_cleanup():
    for target, names in PRESETS.items():
        assert all(n in ALL_PASSES for n in names), target
        assert names[-1] == "cleanup", f"{target}: cleanup must run last to drop what earlier passes left dead"
        assert len(set(names)) == len(names)
        assert [n for n in pass_order() if n in names] == names, f"{target}: not in the registry's order"
    # lint --fix picks passes by need and runs them in the registry's order: webgpu-graph's, then the exporter's
    assert pass_order() == (*PRESETS["webgpu-graph"][:-1], "precompute-cos-sin", "name-batch-dim", "cleanup")


def test_a_plan_is_resolved_once_and_frozen():
    """make_plan resolves the runtime, the preset's passes for it and each pass's typed options; the plan cannot be
    changed afterwards, and RunPlan.only keeps them without resolving again (lint --fix)."""
    import dataclasses

    from rope_passes.passes.fold_text_mrope import FoldTextMRoPEOptions
    from rope_passes.runtimes.descriptors import WEBGPU_PLUGIN
    from rope_passes.runtimes.probed import probed_runtime

    plan = make_plan("webgpu-graph", options={"text_only": True}, runtime=WEBGPU_PLUGIN)
    assert plan.runtime is probed_runtime(WEBGPU_PLUGIN) and plan.runtime_given and plan.preset == "webgpu-graph"
    assert plan.passes == ("fold-text-mrope", "longrope-concat", "annotate-cache-offset", "total-seq-on-gpu",
                           "narrow-int64", "cleanup")
    assert set(plan.skipped) == {"unfuse-gqa-qk-norm", "lower-mrope"}
    assert plan.options["fold-text-mrope"] == FoldTextMRoPEOptions(text_only=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.preset = "exporter"  # type: ignore[misc]
    fixing = plan.only({"cleanup", "fold-text-mrope", "precompute-cos-sin"})
    assert fixing.passes == ("fold-text-mrope", "cleanup") and fixing.runtime is plan.runtime
    assert fixing.options["fold-text-mrope"].text_only and fixing.preset is None and not fixing.skipped
    with pytest.raises(UsageError, match="max_positions must be a positive integer"):
        make_plan("exporter", options={"max_positions": 0})
    with pytest.raises(UsageError, match="option 'hf_config' is not taken by any pass of this run"):
        make_plan("webgpu", hf_config="config.json")  # --hf-config is the exporter's (and lint's)
    assert make_plan("exporter", hf_config="c.json").options["precompute-cos-sin"].hf_config == "c.json"


def test_narrow_int64_runs_right_after_total_seq_on_gpu():
    """narrow-int64 reads the placement of the graph total-seq-on-gpu leaves (once one pass, in this order)."""
    names = PRESETS["webgpu-graph"]
    assert names[names.index("total-seq-on-gpu") + 1] == "narrow-int64"
    assert "narrow-int64" not in PRESETS["webgpu"]


def test_unknown_target_and_pass_are_usage_errors():
    with pytest.raises(UsageError, match="unknown preset 'gpu'"):
        make_plan("gpu")
    with pytest.raises(UsageError, match="unknown pass 'nope'"):
        make_plan(passes=["cleanup", "nope"])


def test_docs_list_presets_in_code_order():
    from conftest import REPO

    doc = (REPO / "docs" / "passes" / "README.md").read_text()
    for target, names in PRESETS.items():
        assert f"| `{target}` | {' → '.join(names)} |" in doc, target
    for name in ALL_PASSES:
        assert (REPO / "docs" / "passes" / f"{name}.md").is_file(), f"docs/passes/{name}.md missing"


def test_a_failure_carries_the_ir_object_and_its_place_is_spelled_once():
    """MatchFailure / PassReport / lint take the node or value itself (as onnxscript's MatchResult.fail does);
    report.place_of spells its place once: its name, else a node's op type, a value's "<value>", the model's "<model>"."""
    from rope_passes.report import MatchFailure, PassReport, place_of

    gqa = ir.node("GroupQueryAttention", [], domain="com.microsoft")  # unnamed
    switch = ir.node("If", [], name="/model/rotary_emb/If")
    failure = MatchFailure.refuse("no offset", gqa)
    assert failure.source is gqa and failure.place == "GroupQueryAttention"
    assert MatchFailure.absent("by name", "x").source is None
    report = PassReport("p")
    report.record(failure)
    report.record(MatchFailure.refuse("elsewhere"), switch)
    report.not_matched(ir.Value(name=""), "a value")
    report.note(None, "the model")
    assert [f.place for f in report.findings] == ["GroupQueryAttention", "/model/rotary_emb/If", "<value>", "<model>"]
    assert place_of("/already/spelled") == "/already/spelled"
