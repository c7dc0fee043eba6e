"""mobius-onnx 0.1.0 graphs (tests/fixtures/mobius, README there): `total-seq-on-gpu` accepts their seqlens_k form.

mobius computes GroupQueryAttention's seqlens_k as ``Cast<int32>(Sub(ReduceSum(mask, [1]), [1]))`` with ReduceSum's
default ``keepdims=1`` (``[batch, 1]``; onnxruntime-genai's builder: ``keepdims=0``, ``[batch]``). GQA reads the same
``batch`` values either way (flat index), so the rewrite is exact; before, the pass refused it and these graphs
stayed behind two Memcpy (not capture-ready).

* every fixture's original matches its Hugging Face logits (``ref_S8.npy``) on onnxruntime CPU within fp32's
  tolerance (``TOLERANCES``, the checker's), or, for the producer defects of docs/producer-bugs.md, is off by what
  the defect gives (tests/test_conformance.py repairs each and matches);
* the eight keepdims=1 families (Gemma, Gemma 3, GPT-NeoX, GPT-J, Granite, OLMo 2, Phi-2, SmolLM3 with its NoPE layer)
  and three in the builder's form: ``optimize --target webgpu-graph`` rewrites the lengths, the static placement says capture-ready (0 Memcpy);
* the rewritten graph on CPU gives the original's bits for masks with padding (both forms of seqlens_k hold the
  same row lengths), and the checker's runs (original on CPU and WebGPU, rewritten on WebGPU with and without graph
  capture) are equivalent.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from conftest import FIXTURES, SWEEP

from rope_passes.analysis.graph import nodes_of
from rope_passes.analysis.placement import predict_placement
from rope_passes.api import optimize
from rope_passes.check import check
from rope_passes.check.compare import TOLERANCES
from rope_passes.check.decode import DecoderSpec, run_decode, token_ids
from rope_passes.io import load_bundle
from rope_passes.passes.total_seq_on_gpu import TotalSeqOnGpuPass
from rope_passes.report import Outcome
from rope_passes.runtime.sessions import create_session

MOBIUS = FIXTURES / "mobius"
#: families whose seqlens_k is the keepdims=1 form (refused before), and two in the builder's form
KEEPDIMS = ["gemma", "gemma3_text", "gpt_neox", "gptj", "granite", "olmo2", "phi2", "smollm3"]
BUILDER_FORM = ["cohere", "ernie4_5", "llama_yarn"]
FAMILIES = KEEPDIMS + BUILDER_FORM
#: no GroupQueryAttention (eager attention with sinks, MoE routing on int64 masks): not rewritten here; nemotron does
#: not load (GQA attribute onnxruntime rejects, tests/test_conformance.py)
OTHERS = ["gpt_oss"]


def _folder(family: str) -> Path:
    return MOBIUS / family / "webgpu_f32"


@pytest.fixture(scope="module")
def optimized(tmp_path_factory) -> dict[str, tuple[Path, object]]:
    root = tmp_path_factory.mktemp("mobius")
    out = {}
    for family in FAMILIES:
        dest = root / family
        out[family] = (dest, optimize(str(_folder(family)), str(dest), preset="webgpu-graph"))
    return out


def _row_sum_keepdims(model: ir.Model) -> int:
    gqa = nodes_of(model, "GroupQueryAttention")[0]
    reduce = gqa.inputs[5].producer().inputs[0].producer().inputs[0].producer()
    assert reduce.op_type == "ReduceSum"
    keepdims = reduce.attributes.get("keepdims")
    return 1 if keepdims is None else keepdims.value


@pytest.mark.corpus
@pytest.mark.parametrize("family", KEEPDIMS)
def test_fixture_has_the_keepdims_form(family):
    """The fixtures are what the pass met: mobius's ReduceSum keeps the reduced dimension."""
    assert _row_sum_keepdims(ir.load(_folder(family) / "model.onnx")) == 1


#: producer defects (docs/producer-bugs.md): these originals are off their Hugging Face logits by about this much
PRODUCER_DEFECTS = {
    "gemma": (7.9e-4, "embedding scale sqrt(128) rounded to the constant 11.31"),
    "cohere": (7.1e-2, "interleaved RoPE applied half-split (rotary_interleaved=0)"),
    "ernie4_5": (1.49, "interleaved RoPE applied half-split (rotary_interleaved=0)"),
    "gemma3_text": (1.90, "the full-attention layer reads the sliding table; scale ignores query_pre_attn_scalar"),
    "gpt_oss": (4.2e-2, "YaRN table built with truncate=true (the config says false)"),
}


def _prefill_logits(folder: Path) -> np.ndarray:
    sess = create_session(str(folder / "model.onnx"), "cpu")
    spec = DecoderSpec.from_session(sess, load_bundle(folder).genai_config)
    return run_decode(sess, spec, token_ids(8), prefill=8, steps=0)[0]["logits"][0]


@pytest.mark.corpus
@pytest.mark.parametrize("family", FAMILIES + OTHERS)
def test_original_matches_hugging_face(family):
    """Within fp32's tolerance, or (a known producer defect) off by what that defect gives, never by more."""
    folder = _folder(family)
    logits, reference = _prefill_logits(folder), np.load(folder / "ref_S8.npy")
    tol = TOLERANCES["fp32"]
    if family in PRODUCER_DEFECTS:
        bound, why = PRODUCER_DEFECTS[family]
        error = float(np.abs(logits - reference).max())
        assert tol.atol < error <= bound * 1.05, f"{family} ({why}): {error:.3g} off"
        return
    np.testing.assert_allclose(logits, reference, atol=tol.atol, rtol=tol.rtol, err_msg=family)


@pytest.mark.corpus
@pytest.mark.parametrize("family", FAMILIES)
def test_rewritten_capture_ready(optimized, family):
    dest, report = optimized[family]
    total_seq = next(p for p in report.passes if p.pass_name == "total-seq-on-gpu")
    assert total_seq.count(Outcome.REWRITTEN) == 1 and total_seq.count(Outcome.REFUSED) == 0, total_seq.status
    assert total_seq.findings[0].details["seqlens_k_rewritten"] is True
    model = ir.load(dest / "model.onnx")
    assert not nodes_of(model, "Shape") and not nodes_of(model, "If")
    placement = predict_placement(dest / "model.onnx")
    assert placement.capture_ok and placement.memcpy == [], placement


def _feeds(sess, mask: np.ndarray, call: int, past: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(4, 492, size=(mask.shape[0], call)).astype(np.int64),
             "attention_mask": mask.astype(np.int64)}
    for i in sess.get_inputs():
        if i.name.startswith("past_key_values"):
            feeds[i.name] = rng.standard_normal((mask.shape[0], i.shape[1], past, i.shape[3]), np.float32)
    return feeds


@pytest.mark.corpus
@pytest.mark.parametrize("family", KEEPDIMS)
@pytest.mark.parametrize("mask,call,past", [
    ([[1, 1, 1, 1, 1, 0, 0, 0]], 8, 0),
    ([[0, 0, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1, 1, 1]], 1, 8),
    ([[1] * 9, [0, 0, 0] + [1] * 6], 1, 8),
], ids=["right-padded-prefill", "left-padded-decode", "one-row-full"])
def test_rewritten_gives_the_original_bits_on_cpu(optimized, family, mask, call, past):
    """Where GroupQueryAttention defines its outputs (queries and cache rows before each row's length), the
    rewritten graph's outputs are the original's bits: seqlens_k [batch] holds what [batch, 1] held."""
    dest, _ = optimized[family]
    mask = np.array(mask)
    runs = []
    for path in (_folder(family) / "model.onnx", dest / "model.onnx"):
        sess = create_session(str(path), "cpu")
        runs.append(dict(zip([o.name for o in sess.get_outputs()], sess.run(None, _feeds(sess, mask, call, past)))))
    for name, expected in runs[0].items():
        got = runs[1][name]
        assert got.shape == expected.shape, name
        for row, length in enumerate(mask.sum(axis=1)):
            defined = (slice(None), slice(0, length)) if name.startswith("present") else \
                (slice(0, call if call == 1 else length),)
            np.testing.assert_array_equal(got[row][defined], expected[row][defined], err_msg=f"{name} row {row}")


@pytest.mark.corpus
@pytest.mark.webgpu
@pytest.mark.parametrize("family", KEEPDIMS)
def test_captured_decode_matches_original(optimized, family):
    """The checker's runs: original on CPU and WebGPU, rewritten on WebGPU without and with graph capture."""
    dest, _ = optimized[family]
    report = check(_folder(family), dest, prefill=8, steps=4, graph_capture=True, sweep=SWEEP)
    captured = report.run("rewritten@webgpu+capture")
    assert captured is not None and captured.ok, (captured.status, captured.reason) if captured else None
    assert report.equivalent, report.to_json()[:2000]


# --- the proof's edges, on one fixture edited in memory ------------------------------------------------------------


def _seqlens_sub(model: ir.Model) -> ir.Node:
    return nodes_of(model, "GroupQueryAttention")[0].inputs[5].producer().inputs[0].producer()


@pytest.mark.corpus
def test_refuses_a_constant_that_moves_the_batch():
    """Sub by a [1, 1, 1] one: seqlens_k becomes [1, batch, 1], the batch off dimension 0 (GQA would read
    dims[0] = 1): refused, naming the Sub."""
    model = ir.load(_folder("smollm3") / "model.onnx")
    sub = _seqlens_sub(model)
    one = ir.Value(name="one_rank3", const_value=ir.tensor(np.ones((1, 1, 1), dtype=np.int64)))
    model.graph.register_initializer(one)
    sub.replace_input_with(1, one)
    report = TotalSeqOnGpuPass()(model).report
    assert report.count(Outcome.REFUSED) == 1, report.status
    reason = report.findings[0].reason
    assert "shaped (1, 'b', 1) (shaped so by Sub" in reason and sub.name in reason, reason


@pytest.mark.corpus
def test_refuses_keepdims_over_another_axis():
    model = ir.load(_folder("smollm3") / "model.onnx")
    reduce = _seqlens_sub(model).inputs[0].producer()
    zero = ir.Value(name="axes_zero", const_value=ir.tensor(np.array([0], dtype=np.int64)))
    model.graph.register_initializer(zero)
    reduce.replace_input_with(1, zero)
    report = TotalSeqOnGpuPass()(model).report
    assert report.count(Outcome.REFUSED) == 1 and "sums axes [0] (b), not the mask's columns" in report.findings[0].reason
