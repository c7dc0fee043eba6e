"""unfuse-gqa-qk-norm: GQA's fused q/k RMSNorm moved out, as the builder writes it with fuse_qk_norm_gqa=false.

Reference: the builder's own unfused build of the same checkpoint (``current/qwen3/webgpu_fp16_noqknormfuse``) —
an independent graph; the rewrite must give its logits bit for bit (same ops, same weights), on CPU and WebGPU,
and stay within fp16 tolerance of Hugging Face (the corpus measures ≤ 0.03 for fp16 builds).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from conftest import GENAI

from rope_passes.check.decode import DecoderSpec, run_decode, token_ids
from rope_passes.io import load_bundle, save_bundle
from rope_passes.passes import PassContext
from rope_passes.passes.unfuse_gqa_qk_norm import UnfuseGQAQKNormPass
from rope_passes.report import Outcome
from rope_passes.runtime.sessions import create_session

pytestmark = [pytest.mark.corpus]  # every test here: see tests/conftest.py

FUSED = "current/qwen3/webgpu_fp16"
BUILDER_UNFUSED = "current/qwen3/webgpu_fp16_noqknormfuse"
FP16_HF_TOL = 0.03  # fp16 builds vs the fp32 Hugging Face reference, measured on this corpus (README)


def _unfuse(bundle) -> object:
    return UnfuseGQAQKNormPass(PassContext(bundle.genai_config))(bundle.model)


def _gqas(model: ir.Model) -> list[ir.Node]:
    return [n for n in model.graph if n.op_type == "GroupQueryAttention"]


def _pack_qkv(model: ir.Model) -> None:
    """Feed each GQA the packed projection the builder splits (inputs 1/2 empty): the packed-QKV form."""
    for gqa in _gqas(model):
        split = gqa.inputs[0].producer()
        assert split is not None and split.op_type == "Split"
        gqa.replace_input_with(0, split.inputs[0])
        gqa.replace_input_with(1, None)
        gqa.replace_input_with(2, None)


def _logits(path, ep: str, genai_config) -> list[np.ndarray]:
    sess = create_session(path, ep)
    spec = DecoderSpec.from_session(sess, genai_config)
    return [s["logits"] for s in run_decode(sess, spec, token_ids(12), prefill=8, steps=4)]


@pytest.mark.webgpu
@pytest.mark.parametrize("packed", [False, True], ids=["separate-qkv", "packed-qkv"])
def test_unfused_corpus_model_equals_the_builders_unfused_build(packed, tmp_path):
    bundle = load_bundle(GENAI / FUSED)
    if packed:
        _pack_qkv(bundle.model)
    result = _unfuse(bundle)
    assert result.report.status == "rewritten 2"
    for gqa in _gqas(bundle.model):
        assert len(gqa.inputs) <= 14 and "qk_norm_epsilon" not in gqa.attributes
        assert (gqa.inputs[1] is None) == packed
    norms = [n for n in bundle.model.graph if n.op_type == "SimplifiedLayerNormalization" and "norm" in n.name]
    assert {n.attributes["stash_type"].value for n in norms} == {1} and len(norms) >= 4
    save_bundle(bundle, tmp_path / "out")
    ref = np.load(GENAI / "hf/qwen3/ref_S8.npy")
    for ep in ("cpu", "webgpu"):
        ours = _logits(tmp_path / "out/model.onnx", ep, bundle.genai_config)
        builder = _logits(GENAI / BUILDER_UNFUSED / "model.onnx", ep, bundle.genai_config)
        assert np.abs(ours[0][0].astype(np.float32) - ref).max() < FP16_HF_TOL
        for step, (a, b) in enumerate(zip(ours, builder)):
            if packed:  # packed QKV runs GQA's packed path: same math, other kernel order; fp16 rounding only
                np.testing.assert_allclose(a.astype(np.float32), b, atol=2e-3, rtol=0, err_msg=f"{ep} step {step}")
            else:
                assert np.array_equal(a, b), f"{ep} step {step}: not bit-identical to the builder's unfused build"


def test_no_fused_norm_is_not_matched():
    bundle = load_bundle(GENAI / BUILDER_UNFUSED)
    result = _unfuse(bundle)
    assert not result.modified and result.report.status.startswith("not matched: no GroupQueryAttention with fused")


@pytest.mark.parametrize("breakage,reason", [
    ("weight-not-constant", "is not a constant 1-D tensor"),
    ("packed-width", "not (num_heads + 2 × kv_num_heads) × head_size"),
])
def test_refusals_leave_the_gqa_fused(breakage, reason):
    bundle = load_bundle(GENAI / FUSED)
    graph = bundle.model.graph
    gqa = _gqas(bundle.model)[0]
    if breakage == "weight-not-constant":
        weight = gqa.inputs[14]
        fake = ir.Value(name="q_norm_runtime", shape=weight.shape, type=weight.type)
        graph.inputs.append(fake)
        gqa.replace_input_with(14, fake)
    else:
        _pack_qkv(bundle.model)
        gqa.inputs[0].shape = ir.Shape([1, 1, 100])
    before = len(gqa.inputs)
    result = _unfuse(bundle)
    refused = [f for f in result.report.findings if f.outcome is Outcome.REFUSED]
    assert len(refused) == 1 and reason in refused[0].reason and refused[0].place == gqa.name
    assert len(gqa.inputs) == before and "qk_norm_epsilon" in gqa.attributes


# --- per runtime: the webgpu preset runs the pass for onnxruntime-webgpu 1.27 only ----------------------------------


@pytest.mark.webgpu
def test_preset_unfuses_for_127_only(tmp_path):
    """1.27 (GQA 7..14 inputs): the preset unfuses and the output loads and matches; onnxruntime 1.31 + the WebGPU
    plugin EP loads the fused form, so the preset leaves it fused and the report says why (its session runs on the
    plugin interpreter, tests/runtime_worker.py)."""
    from runtime_worker import run_worker

    from rope_passes.api import optimize
    from rope_passes.runtimes.descriptors import WEBGPU_127, WEBGPU_PLUGIN

    ref = np.load(GENAI / "hf/qwen3/ref_S8.npy")
    old = optimize(str(GENAI / FUSED), str(tmp_path / "old"), runtime=WEBGPU_127)
    assert old.passes[0].pass_name == "unfuse-gqa-qk-norm" and old.passes[0].status == "rewritten 2"
    assert old.skipped == {} and all(len(g.inputs) <= 14 for g in _gqas(ir.load(tmp_path / "old/model.onnx")))
    logits = _logits(tmp_path / "old/model.onnx", "webgpu", old_config := load_bundle(tmp_path / "old").genai_config)
    assert old_config is not None and np.abs(logits[0][0].astype(np.float32) - ref).max() < FP16_HF_TOL

    new = optimize(str(GENAI / FUSED), str(tmp_path / "new"), runtime=WEBGPU_PLUGIN)
    assert "unfuse-gqa-qk-norm" not in [p.pass_name for p in new.passes]
    assert "loads GroupQueryAttention with 7..16 inputs (fused q/k-norm left fused" in new.skipped["unfuse-gqa-qk-norm"]
    assert all(len(g.inputs) == 16 for g in _gqas(ir.load(tmp_path / "new/model.onnx")))
    result, prefill, _ = run_worker(WEBGPU_PLUGIN, tmp_path / "new/model.onnx", tmp_path / "work")
    assert result["error"] is None and result["providers"][0] == "WebGpuExecutionProvider", result
    assert np.abs(prefill - ref).max() < FP16_HF_TOL
