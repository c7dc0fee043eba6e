"""The contracts every pass carries (issue 25, issue 27): valid where its input was, placement never worse, held in a
plain ``onnx_ir.passes.PassManager`` exactly as in our pipeline; and the opset-aware node builder.

The models are the embedded tiny decoder (default-domain opset 21) and its re-saves at other opsets
(tests/containers.py); loads are judged by onnxruntime's CPU EP here, independently of the contract's stand-in.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from containers import at_opset

from rope_passes.demo import build_tiny_decoder
from rope_passes.io import load_bundle
from rope_passes.passes import PassContext, RopePass
from rope_passes.passes._rewrite import NodeTape, opset_of
from rope_passes.proofs.validity import schema_errors
from rope_passes.report import PassReport
from rope_passes.runtimes.descriptors import WEBGPU_127
from rope_passes.runtimes.probed import probed_runtime


@pytest.fixture
def tiny(tmp_path):
    return build_tiny_decoder(tmp_path / "demo")


def _at_opset(folder, opset):
    proto = onnx.load(folder / "model.onnx", load_external_data=False)
    moved = at_opset(proto, opset)
    assert moved is not None
    onnx.save(moved, folder / "model.onnx")
    ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])  # the input loads
    return folder


class _ReduceSumAsInput(RopePass):
    """Adds ``ReduceSum(past key, axes)`` with the axes as an input whatever the opset (no NodeTape), as a new
    output: valid from opset 13 on, invalid below (float: WebGPU has the kernel, placement is not worse)."""

    name = "test-contract-reducesum"

    def apply(self, model: ir.Model, report: PassReport) -> None:
        past = next(v for v in model.graph.inputs if v.dtype in (ir.DataType.FLOAT, ir.DataType.FLOAT16))
        axes = ir.Value(name="test/axes", const_value=ir.tensor(np.array([1], np.int64)))
        model.graph.register_initializer(axes)
        node = ir.node("ReduceSum", [past, axes], {"keepdims": 0}, name="test/ReduceSum")
        model.graph.append(node)
        model.graph.outputs.append(node.outputs[0])
        node.outputs[0].name = "test_sum"
        node.outputs[0].dtype, node.outputs[0].shape = past.dtype, ir.Shape([None, None, None])
        report.rewritten("test/ReduceSum", "added a ReduceSum output")


class _WrongType(RopePass):
    """Feeds a float value into an int64-only input (Gather's indices): the schema count is right, the load is not."""

    name = "test-contract-wrong-type"

    def apply(self, model: ir.Model, report: PassReport) -> None:
        gather = next(n for n in model.graph if n.op_type == "Gather")
        cast = ir.node("Cast", [gather.inputs[1]], {"to": ir.DataType.FLOAT}, name="test/Cast")
        cast.outputs[0].dtype = ir.DataType.FLOAT
        model.graph.insert_before(gather, cast)
        gather.replace_input_with(1, cast.outputs[0])
        report.rewritten("test/Cast", "cast the ids to float")


@pytest.mark.parametrize("opset, valid", [(12, False), (13, True)])
def test_validity_contract_in_a_plain_pass_manager(tiny, tmp_path, opset, valid):
    """A pass whose node is invalid at the model's opset is rolled back with the schema rule, run by a plain onnx_ir
    PassManager (no pipeline); at an opset where the node is valid it is kept. Independent witness: onnxruntime CPU
    loads the result either way."""
    folder = _at_opset(tiny, opset)
    model = load_bundle(folder).model
    manager = ir.passes.PassManager([_ReduceSumAsInput(PassContext(runtime=probed_runtime(WEBGPU_127)))])
    result = manager(model)
    names = [n.name for n in model.graph]
    assert ("test/ReduceSum" in names) is valid
    report = manager.passes[0].report
    if not valid:
        assert report.status.startswith("refused: refused for this model: its rewrite would not be a valid model")
        assert "ReduceSum" in report.status and "input size 2" in report.status, report.status
        assert report.findings[0].place == "test/ReduceSum"
        assert not result.modified
    _ort_loads(model, tmp_path)


def _ort_loads(model: ir.Model, folder) -> None:
    """The witness: the model saved with its weights and loaded by onnxruntime CPU."""
    ir.save(model, folder / "witness.onnx", external_data="witness.onnx.data")
    ort.InferenceSession(str(folder / "witness.onnx"), providers=["CPUExecutionProvider"])


def test_a_load_failure_is_rolled_back_with_onnxruntime_s_reason(tiny):
    model = load_bundle(tiny).model
    before = ir.serde.serialize_model(model).SerializeToString()
    pass_ = _WrongType(PassContext(runtime=probed_runtime(WEBGPU_127)))
    ir.passes.PassManager([pass_])(model)
    assert pass_.report.status.startswith("refused"), pass_.report.status
    assert "load" in pass_.report.status and "onnxruntime (CPU) no longer loads the model" in pass_.report.status
    assert ir.serde.serialize_model(model).SerializeToString() == before  # exactly the model it received


def test_placement_contract_in_a_plain_pass_manager(tiny):
    """The placement contract, no pipeline: a pass that adds a CPU node before the embedding is rolled back."""
    from test_pipeline_work import _AddsACpuNode

    bundle = load_bundle(tiny)
    pass_ = _AddsACpuNode(PassContext(bundle.genai_config, runtime=probed_runtime(WEBGPU_127)))
    config = json.dumps(bundle.genai_config.data)
    ir.passes.PassManager([pass_])(bundle.model)
    assert "placement worse" in pass_.report.status
    assert "test/Mul" not in [n.name for n in bundle.model.graph]
    assert json.dumps(bundle.genai_config.data) == config


@pytest.mark.parametrize("opset", [11, 12, 13, 17, 18, 21, 23])
def test_node_tape_builds_for_the_model_opset(opset):
    """NodeTape writes ReduceSum/Unsqueeze/ReduceMax in the form valid at the opset, whichever form the caller wrote."""
    graph = ir.Graph([ir.val("x", ir.DataType.FLOAT, [2, 3])], [], nodes=[], opset_imports={"": opset})
    model = ir.Model(graph, ir_version=8)
    x = graph.inputs[0]
    tape = NodeTape(opset_of(model))
    axes = tape.op("Constant", [], {"value": ir.tensor(np.array([1], np.int64))}, name="axes", output="axes")
    summed = tape.op("ReduceSum", [x, axes], {"keepdims": 1}, name="sum", output="sum")
    top = tape.op("ReduceMax", [summed], {"keepdims": 1, "axes": [0]}, name="max", output="max")
    out = tape.op("Unsqueeze", [top, axes], name="unsq", output="unsq")
    tape.append(graph)
    graph.outputs.append(out)
    assert schema_errors(model) == []
    assert ("axes" in [n.name for n in graph]) is (opset >= 13)  # the Constant is dropped where nothing reads it
    sess = ort.InferenceSession(ir.serde.serialize_model(model).SerializeToString(), providers=["CPUExecutionProvider"])
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(sess.run(None, {"x": data})[0],
                                  data.sum(axis=1, keepdims=True).max(axis=0, keepdims=True)[:, None])


def test_node_tape_refuses_an_op_missing_at_the_opset():
    from rope_passes.report import MatchFailure

    tape = NodeTape(12)
    x = ir.val("x", ir.DataType.FLOAT, [2])
    with pytest.raises(MatchFailure) as failure:
        tape.op("Gelu", [x], name="gelu")  # since opset 20
    assert "Gelu does not exist at opset 12" in failure.value.reason


@pytest.mark.parametrize("opset", [11, 12, 14, 18, 21, 23])
def test_presets_at_each_opset_give_valid_equal_outputs(tiny, tmp_path, opset):
    """Every preset on the tiny decoder re-saved at the opset: the output loads on onnxruntime CPU and computes the
    input's logits (fp32: the rewrites here move no arithmetic, so 1e-6 of magnitudes ~1) or the pass refused."""
    from rope_passes.api import optimize

    folder = _at_opset(tiny, opset)
    for preset in ("webgpu", "webgpu-graph"):
        out = tmp_path / f"out-{preset}"
        optimize(folder, out, preset=preset, runtime=WEBGPU_127)
        a = _logits(folder / "model.onnx")
        b = _logits(out / "model.onnx")
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)
        assert schema_errors(load_bundle(out).model) == []


def _logits(path) -> np.ndarray:
    """Prefill of 5 tokens from an empty past on onnxruntime CPU (head size from genai_config where the graph leaves
    it symbolic)."""
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    config = path.parent / "genai_config.json"
    head = json.loads(config.read_text())["model"]["decoder"]["head_size"] if config.is_file() else None
    feeds = {}
    for i in sess.get_inputs():
        if i.name == "input_ids":
            feeds[i.name] = np.array([[3, 1, 4, 1, 5]], np.int64)
        elif i.name == "attention_mask":
            feeds[i.name] = np.ones((1, 5), np.int64)
        elif i.name == "position_ids":
            feeds[i.name] = np.arange(5, dtype=np.int64)[None]
        else:  # empty past [batch, kv_heads, 0, head_size]
            batch, heads, _, size = i.shape
            feeds[i.name] = np.zeros((1, heads, 0, size if isinstance(size, int) else head),
                                     np.float16 if "float16" in i.type else np.float32)
    return sess.run(None, feeds)[0]
