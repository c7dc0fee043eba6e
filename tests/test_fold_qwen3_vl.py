"""``fold-text-mrope`` on builder 0.18 Qwen3-VL graphs (issue 11, generality): the rotation sits between layout ops
and casts the old adapter matching did not know.

Qwen3-VL (``tests/fixtures/genai/qwen3_vl``): ``q_proj → Reshape [0, -1, head] → (fp16: Cast to float) →
SimplifiedLayerNormalization → Reshape [0, -1, heads*head] → MRotaryEmbedding (float, interleaved sections
[6, 5, 5]) → (fp16: Cast to float16) → GroupQueryAttention``. The Reshape before the rotation is not undone after it
(GQA reads its output's layout anyway: the layout probe proves it), and in fp16 the Cast after the rotation is
re-applied to the unrotated value: GQA then rotates float16 q/k in float16 where the graph rotated float and rounded
after. That is not bit-exact; the bound (the pass docstring) is 4 float16 ulps of the largest element of the head row,
checked here on GQA's ``present`` keys (the rotated k it stores) against the original on CPU.

References: the Hugging Face logits ``ref_S8.npy`` (prefill of 8 on WebGPU: fp32 1e-4, measured 2.4e-6; fp16 0.05,
measured 0.021, while the original itself, lowered by ``lower-mrope`` since 1.27 has no MRotaryEmbedding kernel, is
0.024 from HF on WebGPU: fp16 WebGPU arithmetic, not the fold, sets that), and the lowered original on CPU for 8
decode steps (fp32: CPU bit-identical, WebGPU 1e-4; fp16: CPU 2e-2, WebGPU 0.05).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from _utils import serialize
from conftest import FIXTURES as FIXTURE_ROOT
from mrope_graphs import attention_graph, run_attention

import rope_passes
from rope_passes.analysis.graph import MS_DOMAIN, attr, nodes_of
from rope_passes.check.decode import DecoderSpec, run_decode, token_ids
from rope_passes.check.runner import run_isolated
from rope_passes.check.spec import RunSpec
from rope_passes.config import GenaiConfig
from rope_passes.io import load_bundle, save_bundle
from rope_passes.passes import FoldTextMRoPEPass, LowerMRoPEPass, PassContext
from rope_passes.report import Outcome
from rope_passes.runtime.sessions import create_session, session_options

FIXTURES = FIXTURE_ROOT / "genai" / "qwen3_vl"
VARIANTS = ["cpu_fp32", "webgpu_fp32", "webgpu_fp16", "webgpu_fp32_graph", "webgpu_fp16_graph"]
STEPS = 8
#: the rounding bound of a float rotation cast to float16 vs GQA's float16 rotation, in float16 ulps of the row max
ULPS = 4


def _ulps(got: np.ndarray, want: np.ndarray) -> float:
    """Largest |got - want| in float16 ulps of the largest |want| of its last-axis row."""
    got, want = got.astype(np.float32), want.astype(np.float32)
    row_max = np.maximum(np.abs(want).max(axis=-1, keepdims=True), np.float32(2.0 ** -14))
    ulp = 2.0 ** (np.floor(np.log2(row_max)) - 10)
    return float((np.abs(got - want) / ulp).max())


def _lowered_bytes(model: ir.Model) -> bytes:
    LowerMRoPEPass()(model)
    return serialize(model)


# ------------------------------------------------------------------------------------------------------------
# Small graphs: the same form, built in code
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_qk_norm_form_folds_and_computes_the_original(dtype):
    kw = dict(form="mrotary", sections=[24, 20, 20], layout=1, head=128, positions="3d", dtype=dtype, qk_norm=True)
    folded = attention_graph(**kw)
    result = FoldTextMRoPEPass(text_only=True)(folded)
    assert result.report.status == "rewritten 1", result.report.status
    (gqa,) = nodes_of(folded, "GroupQueryAttention", MS_DOMAIN)
    assert attr(gqa, "do_rotary") == 1 and not nodes_of(folded, "MRotaryEmbedding", MS_DOMAIN)
    (rewritten,) = [f for f in result.report.findings if f.outcome is Outcome.REWRITTEN]
    readers = [gqa.inputs[0].producer(), gqa.inputs[1].producer()]
    if dtype == "float16":  # the Cast after the rotation now sits on the unrotated value
        assert [n.op_type for n in readers] == ["Cast", "Cast"] and "float16 rounding" in rewritten.details["rounding"]
        assert all(n.inputs[0].producer().op_type == "Reshape" for n in readers)
    else:  # GQA reads the norm's Reshape directly
        assert [n.op_type for n in readers] == ["Reshape", "Reshape"] and "rounding" not in rewritten.details
    ref = run_attention(_lowered_bytes(attention_graph(**kw)), "cpu", positions="3d", present=True, batch=2)
    got = run_attention(serialize(folded), "cpu", positions="3d", present=True, batch=2)
    for step, ((r, rk), (g, gk)) in enumerate(zip(ref, got, strict=True)):
        if dtype == "float16":
            assert _ulps(gk, rk) <= ULPS, f"call {step}: present_key {_ulps(gk, rk)} ulps"
            np.testing.assert_allclose(g, r, rtol=0, atol=2e-2, err_msg=f"call {step}")
        else:
            np.testing.assert_allclose(gk, rk, rtol=0, atol=1e-5, err_msg=f"call {step}")
            np.testing.assert_allclose(g, r, rtol=0, atol=1e-5, err_msg=f"call {step}")


def _wrap_q_rotation(model: ir.Model, before: list[tuple[str, dict]], after: list[tuple[str, dict]]) -> ir.Node:
    """Insert ops (op_type, attributes; a Reshape/Transpose takes its constant from the attributes' ``shape``) before
    and after the q rotation; returns the last node inserted after it."""
    graph = model.graph
    rot = next(n for n in nodes_of(model, "MRotaryEmbedding", MS_DOMAIN) if attr(n, "num_heads") == 2)

    def chain(value: ir.Value, ops: list[tuple[str, dict]], tag: str) -> tuple[list[ir.Node], ir.Value]:
        nodes = []
        for i, (op, attrs) in enumerate(ops):
            inputs = [value]
            attrs = dict(attrs)
            if "shape" in attrs:
                const = ir.Value(name=f"{tag}_shape_{i}", type=ir.TensorType(ir.DataType.INT64))
                const.const_value = ir.tensor(np.array(attrs.pop("shape"), np.int64), name=const.name)
                graph.register_initializer(const)
                inputs.append(const)
            node = ir.node(op, inputs, attrs, name=f"{tag}_{op}_{i}")
            node.outputs[0].name = f"{tag}_{op}_{i}_out"
            node.outputs[0].dtype = ir.DataType(attrs["to"]) if op == "Cast" else value.dtype
            nodes.append(node)
            value = node.outputs[0]
        return nodes, value

    pre_nodes, pre = chain(rot.inputs[0], before, "pre")
    graph.insert_before(rot, pre_nodes) if pre_nodes else None
    rot.replace_input_with(0, pre)
    out = rot.outputs[0]
    uses = list(out.uses())
    post_nodes, post = chain(out, after, "post")
    graph.insert_after(rot, post_nodes)
    for user, index in uses:
        user.replace_input_with(index, post)
    return post_nodes[-1]


def test_a_rotation_in_float16_for_a_float_gqa_is_refused_naming_the_cast():
    """Cast to float16 → rotate → Cast back to float: GQA would rotate the unrounded float value, so the two differ
    by the float16 rounding the graph applied; refused, the Cast named."""
    model = attention_graph(form="mrotary", sections=[16, 24, 24], positions="3d")
    cast = _wrap_q_rotation(model, [("Cast", {"to": ir.DataType.FLOAT16})], [("Cast", {"to": ir.DataType.FLOAT})])
    rot = cast.inputs[0].producer()
    rot.outputs[0].dtype = ir.DataType.FLOAT16
    before = serialize(model)
    result = FoldTextMRoPEPass(text_only=True)(model)
    assert serialize(model) == before
    (finding,) = result.report.findings
    assert finding.outcome is Outcome.REFUSED and f"Cast {cast.name!r}" in finding.reason, finding.reason
    assert finding.details["node"] == cast.name


def test_a_layout_not_restored_after_the_rotation_is_refused_naming_an_op():
    """Reshape to heads, swap the last two axes, Reshape back: the rotated elements are not where GQA reads them."""
    model = attention_graph(form="mrotary", sections=[16, 24, 24], positions="3d")
    last = _wrap_q_rotation(model, [], [("Reshape", {"shape": [0, 0, 2, 128]}), ("Transpose", {"perm": [0, 1, 3, 2]}),
                                         ("Reshape", {"shape": [0, 0, -1]})])
    before = serialize(model)
    result = FoldTextMRoPEPass(text_only=True)(model)
    assert serialize(model) == before
    (finding,) = result.report.findings
    assert finding.outcome is Outcome.REFUSED and "do not put each head's rotated elements back" in finding.reason
    assert finding.details["node"] == last.name and "'post_Transpose_1'" in finding.reason


def test_a_layout_restored_by_other_ops_folds():
    """Reshape to [B, S, heads, head] then Reshape back after the rotation: restored, so GQA reads the rotation's
    input (the Reshapes are dropped with it)."""
    kw = dict(form="mrotary", sections=[16, 24, 24], positions="3d")
    model = attention_graph(**kw)
    _wrap_q_rotation(model, [], [("Reshape", {"shape": [0, 0, 2, 128]}), ("Reshape", {"shape": [0, 0, 256]})])
    reference = _lowered_bytes(attention_graph(**kw))
    result = FoldTextMRoPEPass(text_only=True)(model)
    assert result.report.status == "rewritten 1", result.report.status
    for r, g in zip(run_attention(reference, "cpu", positions="3d"), run_attention(serialize(model), "cpu",
                                                                                       positions="3d"), strict=True):
        np.testing.assert_allclose(g, r, rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------------------------------
# The builder 0.18 Qwen3-VL fixtures
# ------------------------------------------------------------------------------------------------------------
def _fold(variant: str, text_only: bool):
    bundle = load_bundle(FIXTURES / variant)
    result = FoldTextMRoPEPass(PassContext(bundle.genai_config), text_only=text_only)(bundle.model)
    return bundle, result


@pytest.mark.corpus
@pytest.mark.parametrize("variant", VARIANTS)
def test_qwen3_vl_folds_only_with_text_only(variant):
    bundle, result = _fold(variant, text_only=False)
    assert not result.modified and result.report.count(Outcome.REFUSED) == 2
    assert "--text-only" in result.report.status
    bundle, result = _fold(variant, text_only=True)
    assert result.report.status == "rewritten 2", result.report.status
    model = bundle.model
    assert not nodes_of(model, "MRotaryEmbedding", MS_DOMAIN) and not nodes_of(model, "RotaryEmbedding", MS_DOMAIN)
    fp16 = "fp16" in variant
    for gqa in nodes_of(model, "GroupQueryAttention", MS_DOMAIN):
        assert attr(gqa, "do_rotary") == 1 and attr(gqa, "rotary_interleaved") == 0
        cos = gqa.inputs[7].const_value.numpy()
        assert cos.shape == (256, 16) and cos.dtype == (np.float16 if fp16 else np.float32)
    rounding = [f.details.get("rounding") for f in result.report.findings if f.outcome is Outcome.REWRITTEN]
    assert all(rounding) if fp16 else not any(rounding)
    assert "position_ids" not in [i.name for i in model.graph.inputs]
    assert isinstance(bundle.genai_config, GenaiConfig) and "position_ids" not in bundle.genai_config.decoder_inputs


@pytest.mark.corpus
@pytest.mark.webgpu
@pytest.mark.parametrize("variant", VARIANTS)
def test_qwen3_vl_prefill_on_webgpu_matches_hf_and_decode_the_original(variant, tmp_path):
    bundle, _ = _fold(variant, text_only=True)
    path = save_bundle(bundle, tmp_path / "folded")
    lowered = load_bundle(FIXTURES / variant)
    LowerMRoPEPass()(lowered.model)
    ref_path = save_bundle(lowered, tmp_path / "lowered")
    tokens = token_ids(8 + STEPS)
    runs = {}
    for label, p, config, ep in (("webgpu", path, bundle.genai_config, "webgpu"), ("cpu", path, bundle.genai_config,
                                 "cpu"), ("original", ref_path, lowered.genai_config, "cpu")):
        sess = create_session(p, ep)
        runs[label] = run_decode(sess, DecoderSpec.from_session(sess, config), tokens, prefill=8, steps=STEPS)
    fp16 = "fp16" in variant
    err_hf = float(np.abs(runs["webgpu"][0]["logits"][0] - np.load(FIXTURES / variant / "ref_S8.npy")).max())
    assert err_hf < (0.05 if fp16 else 1e-4), err_hf
    webgpu_tol, cpu_tol = (0.05, 2e-2) if fp16 else (1e-4, 0.0)
    for step in range(STEPS + 1):
        want = runs["original"][step]
        np.testing.assert_allclose(runs["webgpu"][step]["logits"], want["logits"].astype(np.float32), rtol=0,
                                   atol=webgpu_tol, err_msg=f"WebGPU step {step}")
        np.testing.assert_allclose(runs["cpu"][step]["logits"], want["logits"].astype(np.float32), rtol=0,
                                   atol=cpu_tol, err_msg=f"CPU step {step}")
        if fp16:  # layer 0's rotated keys: the same inputs, so only the rotation's rounding differs
            ulps = _ulps(runs["cpu"][step]["present.0.key"], want["present.0.key"])
            assert ulps <= ULPS, f"step {step}: present.0.key {ulps} ulps"


@pytest.mark.corpus
@pytest.mark.webgpu
@pytest.mark.parametrize("variant", VARIANTS)
def test_qwen3_vl_is_capture_ready_under_webgpu_graph(variant, tmp_path):
    out = tmp_path / "out"
    report = rope_passes.optimize(str(FIXTURES / variant), str(out), preset="webgpu-graph",
                                  options={"text_only": True})
    (fold,) = [p for p in report.passes if p.pass_name == "fold-text-mrope"]
    assert fold.status == "rewritten 2", fold.status
    so = session_options("webgpu", graph_capture=True)
    so.optimized_model_filepath = str(tmp_path / "placed.onnx")
    create_session(out / "model.onnx", "webgpu", so=so)  # raises when capture is impossible
    placed = onnx.load(str(tmp_path / "placed.onnx"), load_external_data=False)
    assert not [n.op_type for n in placed.graph.node if n.op_type.startswith("Memcpy")]
    bundle = load_bundle(out)
    sess = create_session(out / "model.onnx", "webgpu")
    plain = run_decode(sess, DecoderSpec.from_session(sess, bundle.genai_config), token_ids(8 + STEPS), prefill=8,
                       steps=STEPS)
    spec = RunSpec("folded@webgpu+capture", str(out / "model.onnx"), "webgpu", 8, STEPS,
                   genai_config=bundle.genai_config.data, graph_capture=True, max_length=8 + STEPS)
    captured = run_isolated(spec)  # a subprocess: capture failures may segfault
    assert captured.ok, captured.reason
    for step, (c, p) in enumerate(zip(captured.steps, plain, strict=True)):
        np.testing.assert_array_equal(c["logits"], p["logits"], err_msg=f"captured step {step}")
