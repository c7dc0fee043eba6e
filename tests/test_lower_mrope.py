"""``lower-mrope``: MRotaryEmbedding → per-token cos/sin gathers + RotaryEmbedding, exact for any t/h/w positions.

Reference: :func:`oracles.mrope_reference` (NumPy, float64 math) with *distinct* t/h/w positions.
Tolerances: fp32 1e-5 (observed ~2.4e-7: one float32 rounding of x*cos ± y*sin); fp16 2e-3 (outputs are |y| < 4,
fp16 spacing there is 2e-3, one rounding).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from _utils import run, serialize
from conftest import GENAI
from mrope_graphs import mrotary_graph
from oracles import mrope_reference

from rope_passes.analysis.graph import attr, nodes_of
from rope_passes.check.decode import DecoderSpec, run_decode, step_feeds, token_ids
from rope_passes.io import load_bundle, save_bundle
from rope_passes.passes import LowerMRoPEPass, PassContext
from rope_passes.report import Outcome
from rope_passes.runtime.sessions import create_session

#: t, h, w all different (an image-like patch grid after 2 text tokens), B=2 with a second, shifted row.
S = 7


def distinct_positions(batch: int = 2) -> np.ndarray:
    t = np.array([0, 1, 2, 2, 2, 2, 6])
    h = np.array([0, 1, 2, 2, 3, 3, 6])
    w = np.array([0, 1, 2, 3, 2, 3, 6])
    pos = np.stack([t, h, w])[:, None, :]
    return np.concatenate([pos + 5 * i for i in range(batch)], axis=1).astype(np.int64)


def reference(x, pos, cos, sin, *, sections, layout, heads, interleaved, rotary_dim, scale, rank4):
    c, s = cos.astype(np.float32) * scale, sin.astype(np.float32) * scale
    if rank4:  # [B, H, S, D] -> [B, S, H*D] and back
        b, h, sq, d = x.shape
        x3 = x.transpose(0, 2, 1, 3).reshape(b, sq, h * d)
        y3 = mrope_reference(x3, pos, c, s, sections=sections, layout=layout, num_heads=heads,
                             interleaved=interleaved, rotary_dim=rotary_dim)
        return y3.reshape(b, sq, h, d).transpose(0, 2, 1, 3)
    return mrope_reference(x, pos, c, s, sections=sections, layout=layout, num_heads=heads,
                           interleaved=interleaved, rotary_dim=rotary_dim)


CASES = {
    # sections, layout, head, rotary_dim, pairing interleaved, scale, rank4, dtype
    "qwen25vl-like [16,24,24] sectioned head 128": ([16, 24, 24], 0, 128, None, False, None, False, "float32"),
    "qwen3vl-like [24,20,20] interleaved layout": ([24, 20, 20], 1, 128, None, False, None, False, "float32"),
    "partial rotary [4,2,2] interleaved layout, head 32": ([4, 2, 2], 1, 32, 16, False, None, False, "float32"),
    "interleaved pairs + scale 0.5, [2,3,3]": ([2, 3, 3], 0, 16, None, True, 0.5, False, "float32"),
    "4D input [B,H,S,D], [8,4,4] interleaved layout": ([8, 4, 4], 1, 32, None, False, None, True, "float32"),
    "fp16 [6,5,5] interleaved layout": ([6, 5, 5], 1, 32, None, False, None, False, "float16"),
}


@pytest.mark.parametrize("case", CASES)
def test_lowered_matches_numpy_mrope_for_distinct_positions_on_cpu(case):
    sections, layout, head, rotary_dim, interleaved, scale, rank4, dtype = CASES[case]
    heads = 2
    model, cos, sin = mrotary_graph(sections=sections, layout=layout, head=head, heads=heads, rotary_dim=rotary_dim,
                                    interleaved=interleaved, scale=scale, rank4=rank4, dtype=dtype)
    result = LowerMRoPEPass()(model)
    assert result.report.status == "rewritten 1"
    assert not nodes_of(model, "MRotaryEmbedding") and len(nodes_of(model, "RotaryEmbedding")) == 1
    pos = distinct_positions()
    rng = np.random.RandomState(1)
    shape = (2, heads, S, head) if rank4 else (2, S, heads * head)
    x = rng.randn(*shape).astype(np.float16 if dtype == "float16" else np.float32)
    (y,) = run(model, {"x": x, "position_ids": pos}, "cpu")
    want = reference(x, pos, cos, sin, sections=sections, layout=layout, heads=heads, interleaved=interleaved,
                     rotary_dim=rotary_dim, scale=scale or 1.0, rank4=rank4)
    tol = 2e-3 if dtype == "float16" else 1e-5
    np.testing.assert_allclose(y.astype(np.float32), want.astype(np.float32), rtol=0, atol=tol)
    # the distinct axes matter: plain 1D RoPE with the t positions is far from the answer
    plain = reference(x, np.repeat(pos[:1], 3, axis=0), cos, sin, sections=sections, layout=layout, heads=heads,
                      interleaved=interleaved, rotary_dim=rotary_dim, scale=scale or 1.0, rank4=rank4)
    assert np.abs(plain.astype(np.float32) - want.astype(np.float32)).max() > 0.05


@pytest.mark.webgpu
def test_lowered_matches_numpy_mrope_on_webgpu():
    sections, layout, head = [16, 24, 24], 0, 128
    model, cos, sin = mrotary_graph(sections=sections, layout=layout, head=head, heads=2)
    LowerMRoPEPass()(model)
    pos = distinct_positions()
    x = np.random.RandomState(2).randn(2, S, 2 * head).astype(np.float32)
    (y,) = run(model, {"x": x, "position_ids": pos}, "webgpu")
    want = reference(x, pos, cos, sin, sections=sections, layout=layout, heads=2, interleaved=False,
                     rotary_dim=None, scale=1.0, rank4=False)
    np.testing.assert_allclose(y, want, rtol=0, atol=1e-5)


ODD_ATTRIBUTES = {
    # what the attribute is set to on the node, and what onnxruntime's MRotaryEmbedding makes of it
    "scale 0 (cos/sin times 0, not 1)": ({"scale": 0.0}, {"scale": 0.0}),
    "interleaved=2 (rotate-half: only 1 is on)": ({"interleaved": 2}, {"interleaved": False}),
    "4D input, num_heads=4 but 2 heads in x": ({"num_heads": 4}, {}),
}


@pytest.mark.webgpu
@pytest.mark.parametrize("ep", ["cpu", "webgpu"])
@pytest.mark.parametrize("case", ODD_ATTRIBUTES)
def test_attributes_read_as_onnxruntime_reads_them(case, ep):
    """Attribute values at the edge of their meaning (found by an adversarial review): scale 0 was read as 1,
    interleaved=2 as interleaved pairs (fold), and a 4D input's num_heads attribute was copied to RotaryEmbedding,
    whose WebGPU kernel uses it with a rotary_embedding_dim (MRotaryEmbedding takes the head count from a 4D
    input): each was 2.6-4.7 off. Rotary dim 16 of head 32 in every case."""
    attrs, meaning = ODD_ATTRIBUTES[case]
    rank4 = "num_heads" in attrs
    sections, head, heads = [4, 2, 2], 32, 2
    model, cos, sin = mrotary_graph(sections=sections, layout=1, head=head, heads=heads, rank4=rank4, rotary_dim=16)
    (node,) = nodes_of(model, "MRotaryEmbedding")
    for name, value in attrs.items():
        node.attributes[name] = ir.AttrFloat32(name, value) if isinstance(value, float) else ir.AttrInt64(name, value)
    assert LowerMRoPEPass()(model).report.status == "rewritten 1"
    pos = distinct_positions()
    shape = (2, heads, S, head) if rank4 else (2, S, heads * head)
    x = np.random.RandomState(3).randn(*shape).astype(np.float32)
    (y,) = run(model, {"x": x, "position_ids": pos}, ep)
    want = reference(x, pos, cos, sin, sections=sections, layout=1, heads=heads,
                     interleaved=meaning.get("interleaved", False), rotary_dim=16, scale=meaning.get("scale", 1.0),
                     rank4=rank4)
    np.testing.assert_allclose(y, want, rtol=0, atol=1e-5)  # fp32 rotation: a few ulps of |x| ~ 4


def test_model_without_mrotary_is_untouched():
    model, _, _ = mrotary_graph(sections=[2, 3, 3], layout=0, head=16)
    LowerMRoPEPass()(model)
    before = serialize(model)
    result = LowerMRoPEPass()(model)
    assert not result.modified and serialize(model) == before
    assert result.report.status == "not matched: no com.microsoft::MRotaryEmbedding node"


def test_refuses_packed_batching_with_reason():
    model, _, _ = mrotary_graph(sections=[2, 3, 3], layout=0, head=16)
    node = nodes_of(model, "MRotaryEmbedding")[0]
    node.attributes["is_packed_batching"] = ir.AttrInt64("is_packed_batching", 1)
    before = serialize(model)
    result = LowerMRoPEPass()(model)
    assert result.report.findings[0].outcome is Outcome.REFUSED
    assert "is_packed_batching" in result.report.status and serialize(model) == before


# ------------------------------------------------------------------------------------------------------------
# Corpus: the builder 0.18 graphs that onnxruntime-webgpu 1.27 cannot load
# ------------------------------------------------------------------------------------------------------------

CURRENT = ["current/qwen25_vl/cpu_fp32", "current/qwen25_vl/webgpu_fp16", "current/qwen25_vl/webgpu_int4_graph",
           "current/qwen35/webgpu_fp32", "current/qwen35/webgpu_fp16_graph"]


def _expose_rotations(model: ir.Model) -> list[dict]:
    """Make each lowered rotation's input and output graph outputs; returns what the reference needs."""
    info = []
    for node in nodes_of(model, "MRotaryEmbedding"):
        info.append({
            "x": node.inputs[0], "y": node.outputs[0], "heads": attr(node, "num_heads"),
            "sections": list(attr(node, "mrope_section")), "layout": attr(node, "mrope_layout"),
            "rotary_dim": attr(node, "rotary_embedding_dim") or None, "interleaved": bool(attr(node, "interleaved")),
            "cos": node.inputs[2].const_value.numpy(), "sin": node.inputs[3].const_value.numpy(),
        })
    return info


@pytest.mark.corpus
@pytest.mark.webgpu
@pytest.mark.parametrize("name", CURRENT)
def test_corpus_lowered_loads_on_webgpu_and_rotates_like_mrope(name, genai_corpus, tmp_path):
    bundle = load_bundle(genai_corpus / name)
    info = _expose_rotations(bundle.model)
    result = LowerMRoPEPass(PassContext(bundle.genai_config))(bundle.model)
    assert result.report.status == "rewritten 4"
    assert not nodes_of(bundle.model, "MRotaryEmbedding")
    graph = bundle.model.graph
    for item in info:  # expose each rotation's input and (lowered) output
        rope = next(n for n in nodes_of(bundle.model, "RotaryEmbedding") if n.inputs[0] is item["x"])
        item["y"] = rope.outputs[0]
        graph.outputs.extend([item["x"], item["y"]])
    path = save_bundle(bundle, tmp_path / "out")
    sess = create_session(path, "webgpu")
    spec = DecoderSpec.from_session(sess, bundle.genai_config)
    # distinct t/h/w positions for a prefill of 7 tokens, batch 1
    pos = distinct_positions(batch=1)
    feeds = step_feeds(spec, token_ids(S), 0)
    feeds["position_ids"] = pos
    outs = dict(zip(spec.outputs, sess.run(spec.outputs, feeds)))
    for item in info:
        x = outs[item["x"].name].astype(np.float32)
        want = mrope_reference(x, pos, item["cos"], item["sin"], sections=item["sections"], layout=item["layout"],
                               num_heads=item["heads"], interleaved=item["interleaved"], rotary_dim=item["rotary_dim"])
        np.testing.assert_allclose(outs[item["y"].name], want, rtol=0, atol=1e-5)
    # and text prompts still give the Hugging Face logits
    ref = np.load(GENAI / "hf" / name.split("/")[1] / "ref_S8.npy")
    logits = run_decode(sess, spec, token_ids(8), prefill=8, steps=0)[0]["logits"][0]
    err = float(np.abs(logits - ref).max())
    if "int4" not in name:
        assert err < (1e-4 if "fp32" in name else 0.1), err
        return
    # int4: the 4-bit weights themselves move the logits ~1.2 from the fp32 checkpoint; what the lowering must
    # keep is the graph's own answer: WebGPU vs CPU of the same graph within 0.15 (the corpus README measures
    # int4 WebGPU-vs-CPU differences up to 0.14 from MatMulNBits alone).
    cpu = create_session(path, "cpu")
    cpu_logits = run_decode(cpu, spec, token_ids(8), prefill=8, steps=0)[0]["logits"][0]
    assert np.abs(logits - cpu_logits).max() < 0.15
    assert abs(err - float(np.abs(cpu_logits - ref).max())) < 0.15, err


def test_lowering_works_below_opset_15():
    """Shape has no start/end before opset 15: the lowering slices the shape instead."""
    sections, layout, head = [2, 3, 3], 1, 16
    model, cos, sin = mrotary_graph(sections=sections, layout=layout, head=head, heads=2)
    model.graph.opset_imports[""] = 14
    LowerMRoPEPass()(model)
    assert any(n.op_type == "Slice" for n in model.graph)
    pos = distinct_positions()
    x = np.random.RandomState(4).randn(2, S, 2 * head).astype(np.float32)
    (y,) = run(model, {"x": x, "position_ids": pos}, "cpu")
    want = reference(x, pos, cos, sin, sections=sections, layout=layout, heads=2, interleaved=False,
                     rotary_dim=None, scale=1.0, rank4=False)
    np.testing.assert_allclose(y, want, rtol=0, atol=1e-5)
