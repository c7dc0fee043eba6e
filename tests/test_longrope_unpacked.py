"""A concatenated LongRoPE cache with separate Q/K/V, and LongRoPE in a ragged (left-padded) batch.

* The builder's ``enable_webgpu_graph=true fuse_qkv=false`` Phi-3 / Phi-4 graphs (tests/fixtures/genai) carry the
  ``[short; long]`` cache and ``multiRotaryCacheConcatOffset`` but feed GroupQueryAttention separate Q/K/V, a path on
  which WebGPU ignores the offset: decode is wrong from token ``original + 1`` (by ~3). lint says so (RP206, error);
  ``optimize --target webgpu-graph`` (``annotate-cache-offset``) packs Q/K/V and the WebGPU decode then matches
  Hugging Face's ``ref_long.npy`` past the switch. WebGPU prefills stay at 8 tokens (lavapipe defect: query rows >= 8
  of one prefill are wrong there) and 44 tokens are reached by decode steps, with and without graph capture.
* A batch of 2 where row 1 is 4 tokens shorter (left-padded): the original ``If`` graph switches the whole batch on
  its total length (the mask width), as transformers does (``max(position_ids) + 1`` over the batch); WebGPU's
  concatenated cache switches per row on that row's own length. They differ exactly while the short row is at most
  ``original`` long and the batch is past it (docs/passes/longrope-concat.md, "Batches").
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from conftest import FIXTURES, GENAI

from rope_passes.analysis.graph import nodes_of
from rope_passes.api import optimize
from rope_passes.check.capture import CaptureDriver
from rope_passes.check.decode import DecoderSpec, run_decode, step_feeds, token_ids
from rope_passes.check.spec import RunSpec
from rope_passes.io import load_bundle, save_bundle
from rope_passes.lint import lint_bundle
from rope_passes.pipeline import run_pipeline
from rope_passes.plan import make_plan
from rope_passes.report import Outcome
from rope_passes.runtime.sessions import create_session

ORIGINAL = 32  # original_max_position_embeddings of the tiny checkpoints
BUILDS = ["phi3_mini_128k/webgpu_fp32_graph_nofuseqkv", "phi3_mini_128k/webgpu_fp16_graph_nofuseqkv",
          "phi4_mini/webgpu_fp32_graph_nofuseqkv", "phi4_mini/webgpu_fp16_graph_nofuseqkv"]
#: worst |logit - HF| over the decode 8 -> 44. fp32: the WebGPU/CPU kernel gap (measured ~8e-6). fp16: the build's own
#: rounding: the unmodified fp16 builds are 0.075 (Phi-3) / 0.029 (Phi-4) off HF *before* the switch, where they are
#: right; measured after the fix: at most 0.041 / 0.028 past it. The defect being fixed is ~3 (> 30x either bound).
TOL = {"fp32": 1e-3, "fp16": 0.1}


def _tol(build: str) -> float:
    return TOL["fp16" if "fp16" in build else "fp32"]


@pytest.fixture(scope="module")
def optimized(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for build in BUILDS:
        dest = tmp_path_factory.mktemp("unpacked") / build.replace("/", "_")
        report = optimize(str(FIXTURES / "genai" / build), str(dest), preset="webgpu-graph")
        statuses = {p.pass_name: p.status for p in report.passes}
        assert statuses["annotate-cache-offset"].startswith("rewritten"), statuses
        out[build] = dest
    return out


def _decode(folder: Path, ep: str, steps: int = 36) -> np.ndarray:
    """Last-position logits of a prefill of 8 then ``steps`` single-token steps; the WebGPU session gets the offset
    from genai_config as the session config entry (rows: after 8 + k tokens)."""
    bundle = load_bundle(folder)
    options = {"multiRotaryCacheConcatOffset": str(bundle.genai_config.concat_offset)} if ep == "webgpu" else None
    sess = create_session(str(folder / "model.onnx"), ep, webgpu_options=options)
    spec = DecoderSpec.from_session(sess, bundle.genai_config)
    out = run_decode(sess, spec, token_ids(8 + steps), prefill=8, steps=steps)
    return np.stack([s["logits"][0, -1].astype(np.float64) for s in out])


def _errors(logits: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """Worst error at totals <= original (rows 0..24) and past it (rows 25..36)."""
    err = np.abs(logits - ref[: len(logits)]).max(axis=-1)
    return float(err[: ORIGINAL - 7].max()), float(err[ORIGINAL - 7:].max())


# --- lint and the rewrite ------------------------------------------------------------------------------------------


@pytest.mark.corpus
@pytest.mark.parametrize("build", BUILDS)
def test_lint_flags_the_ignored_offset_and_optimize_clears_it(build, optimized):
    found = [d for d in lint_bundle(FIXTURES / "genai" / build) if d.code == "RP206"]
    assert len(found) == 2 and {str(d.severity) for d in found} == {"error"}, found
    assert all(d.fix == "annotate-cache-offset" and "separate query/key/value" in d.message
               and "multiRotaryCacheConcatOffset=32" in d.message for d in found)
    assert not [d for d in lint_bundle(optimized[build]) if d.code == "RP206"]


@pytest.mark.corpus
@pytest.mark.parametrize("build", BUILDS)
def test_optimize_packs_qkv_and_keeps_the_offset(build, optimized):
    model = ir.load(optimized[build] / "model.onnx")
    gqas = nodes_of(model, "GroupQueryAttention")
    assert len(gqas) == 2
    for gqa in gqas:
        concat = gqa.inputs[0].producer()
        assert concat.op_type == "Concat" and gqa.inputs[1] is None and gqa.inputs[2] is None
        assert [v.name.split("/")[4] for v in concat.inputs] == ["q_proj", "k_proj", "v_proj"]
    config = json.loads((optimized[build] / "genai_config.json").read_text())
    webgpu = next(e["webgpu"] for e in config["model"]["decoder"]["session_options"]["provider_options"]
                  if "webgpu" in e)
    assert webgpu["multiRotaryCacheConcatOffset"] == "32" and webgpu["enableGraphCapture"] == "1"


@pytest.mark.corpus
def test_packing_is_exact_on_cpu(optimized):
    """Packing only changes how GQA receives Q/K/V: the CPU outputs agree to rounding (the CPU EP has no offset, so
    both are wrong past 32 alike: compared up to 32 tokens)."""
    for build in BUILDS[:1] + BUILDS[2:3]:
        before = _decode(FIXTURES / "genai" / build, "cpu", steps=24)
        after = _decode(optimized[build], "cpu", steps=24)
        assert np.abs(before - after).max() <= 1e-5


@pytest.mark.corpus
def test_refuses_qkv_it_cannot_pack(tmp_path):
    bundle = load_bundle(FIXTURES / "genai" / BUILDS[0])
    gqa = nodes_of(bundle.model, "GroupQueryAttention")[0]
    gqa.replace_input_with(1, None)  # a value but no key
    report = run_pipeline(bundle, make_plan(passes=["annotate-cache-offset"])).passes[0]
    assert report.count(Outcome.REFUSED) == 1 and "only one of key/value is given" in report.findings[0].reason
    assert not report.modified and gqa.inputs[0].producer().op_type == "MatMul"
    save_bundle(bundle, tmp_path / "m")
    assert [d.target for d in lint_bundle(tmp_path / "m") if d.code == "RP206"] == [gqa.name,
                                                                                     "/model/layers.1/attn/"
                                                                                     "GroupQueryAttention"]


# --- WebGPU decode against Hugging Face -----------------------------------------------------------------------------


@pytest.mark.corpus
@pytest.mark.webgpu
@pytest.mark.parametrize("build", BUILDS)
def test_webgpu_decode_matches_hugging_face_past_the_switch(build, optimized):
    """Prefill 8 then 36 steps (totals 8..44 across 32) on WebGPU with the offset from genai_config: the build as is
    is right up to 32 tokens and ~3 off after; the optimized output is right on both sides."""
    ref = np.load(FIXTURES / "genai" / build / "ref_long.npy")
    assert ref.shape[0] == 37
    tol = _tol(build)
    before_ok, before_bad = _errors(_decode(FIXTURES / "genai" / build, "webgpu"), ref)
    assert before_ok <= tol and before_bad > 1.0, (before_ok, before_bad)  # the defect: offset ignored
    fixed = _decode(optimized[build], "webgpu")
    up_to, past = _errors(fixed, ref)
    assert up_to <= tol and past <= tol, (up_to, past)


@pytest.mark.corpus
@pytest.mark.webgpu
@pytest.mark.parametrize("build", [BUILDS[0], BUILDS[3]])
def test_captured_webgpu_decode_matches_hugging_face(build, optimized):
    """The same under graph capture (the builder's genai_config asks for it): static KV, mask at its maximum length,
    the first decode step captured and the others replayed (rope_passes.check.capture)."""
    bundle = load_bundle(optimized[build])
    spec = RunSpec("optimized@webgpu+capture", str(optimized[build] / "model.onnx"), "webgpu", 8, 36,
                   genai_config=bundle.genai_config.data, graph_capture=True, max_length=44,
                   webgpu_options={"multiRotaryCacheConcatOffset": str(bundle.genai_config.concat_offset)})
    steps = CaptureDriver(spec).run()
    logits = np.stack([s["logits"][0, -1].astype(np.float64) for s in steps])
    up_to, past = _errors(logits, np.load(FIXTURES / "genai" / build / "ref_long.npy"))
    assert up_to <= _tol(build) and past <= _tol(build), (up_to, past)


# --- LongRoPE in a ragged batch -------------------------------------------------------------------------------------

PHI3_IF = GENAI / "current/phi3_mini_128k/webgpu_fp32"
PAD, END = 4, 44  # row 1 is PAD tokens shorter than row 0; totals 9..44


def _ragged_decode(folder: Path, ep: str) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """Batch of 2: row 0 the corpus tokens, row 1 another sequence PAD tokens shorter (its mask row starts with PAD
    zeros). Each row's prefill runs alone (8 and 8 - PAD tokens: GroupQueryAttention's CPU prompt assumes right
    padding, WebGPU's left), the caches are stacked, then single-token steps with batch 2 to END tokens.

    Returns per total: the last logits ``[2, vocab]`` and the new token's layer-0 key ``[2, kv_heads, head]``. The
    layer-0 key is the rotation alone (embedding -> norm -> k_proj -> RoPE, no attention): which table row rotated
    it. CPU writes a shorter row's new entry after its own tokens (slot length - 1), WebGPU at the tensor's end
    (slot total - 1): each is read where its runtime put it.
    """
    bundle = load_bundle(folder)
    offset = bundle.genai_config.concat_offset
    options = {"multiRotaryCacheConcatOffset": str(offset)} if ep == "webgpu" and offset else None
    sess = create_session(str(folder / "model.onnx"), ep, webgpu_options=options)
    spec = DecoderSpec.from_session(sess, bundle.genai_config)
    rows = [token_ids(END), token_ids(END, seed=1)]
    caches = []
    for row, n in ((0, 8), (1, 8 - PAD)):
        outs = dict(zip(spec.outputs, sess.run(spec.outputs, step_feeds(spec, rows[row][:, :n], 0, None))))
        caches.append({p: outs[spec.present_name(p)] for p in spec.past_names})
    past = {}
    for p in spec.past_names:
        short = caches[1][p]
        gap = np.zeros((1, short.shape[1], PAD, short.shape[3]), short.dtype)
        past[p] = np.concatenate([caches[0][p], np.concatenate([gap, short] if ep == "webgpu" else [short, gap],
                                                               axis=2)])
    logits, keys = {}, {}
    for total in range(9, END + 1):
        ids = np.array([[rows[0][0, total - 1]], [rows[1][0, total - 1 - PAD]]], np.int64)
        mask = np.ones((2, total), np.int64)
        mask[1, :PAD] = 0
        outs = dict(zip(spec.outputs, sess.run(spec.outputs, {"input_ids": ids, "attention_mask": mask, **past})))
        past = {p: outs[spec.present_name(p)] for p in spec.past_names}
        key = outs["present.0.key"]
        slot1 = total - 1 if ep == "webgpu" else total - 1 - PAD
        logits[total] = outs["logits"][:, -1]
        keys[total] = np.stack([key[0, :, total - 1], key[1, :, slot1]])
    return logits, keys


@pytest.mark.corpus
@pytest.mark.webgpu
def test_ragged_batch_reads_the_batch_switch_as_the_if_does(tmp_path):
    """The original If graph on CPU (= transformers: one factor set per call, from the batch's largest position)
    against longrope-concat's output on WebGPU, whose concatenation's head is switched on the batch's longest row
    (WebGPU's offset alone switches each row on its own length: the short row read the short table at totals 33..36,
    off by > 1 in its key, before the head switch); and the If graph against the output, both on WebGPU."""
    out = tmp_path / "concat"
    report = optimize(str(PHI3_IF), str(out), preset="webgpu-graph")
    assert next(p for p in report.passes if p.pass_name == "longrope-concat").status.startswith("rewritten")
    if_logits, if_keys = _ragged_decode(PHI3_IF, "cpu")
    concat_logits, concat_keys = _ragged_decode(out, "webgpu")
    # The unpadded row (its length is the batch total): the same either way, every step (fp32; the WebGPU/CPU kernel
    # gap is ~1e-5 in logits).
    assert max(float(np.abs(if_logits[t][0] - concat_logits[t][0]).max()) for t in if_logits) <= 1e-4
    # The short row's rotation (its new layer-0 key: embedding, norm, k_proj, RoPE; no attention) at every total,
    # 33..36 included, where the row is 29..32 long and the batch past 32: the long table's row, as the If reads it.
    key_diff = {t: float(np.abs(if_keys[t][1] - concat_keys[t][1]).max()) for t in if_keys}
    assert max(key_diff.values()) <= 1e-5, key_diff
    assert max(float(np.abs(if_keys[t][0] - concat_keys[t][0]).max()) for t in if_keys) <= 1e-5
    # The If graph on WebGPU (its If on the same kernels, no offset) and the output on WebGPU: the same numbers for
    # both rows at every total (the short row's logits on WebGPU are not its CPU logits, with either graph: the
    # docs' "Batches"; the two graphs agree there all the same).
    wg_logits, wg_keys = _ragged_decode(PHI3_IF, "webgpu")
    assert max(float(np.abs(wg_logits[t] - concat_logits[t]).max()) for t in wg_logits) <= 1e-5
    assert max(float(np.abs(wg_keys[t] - concat_keys[t]).max()) for t in wg_keys) <= 1e-5
    # The If graph's batch switch is visible on CPU: row 1 alone (batch 1, its own length) agrees with its batch-2
    # self until the batch passes 32 while the row has not.
    sess = create_session(str(PHI3_IF / "model.onnx"), "cpu")
    spec = DecoderSpec.from_session(sess, load_bundle(PHI3_IF).genai_config)
    alone = run_decode(sess, spec, token_ids(END, seed=1), prefill=8 - PAD, steps=END - 8)
    alone_diff = {t: float(np.abs(alone[t - 8]["logits"][0, -1] - if_logits[t][1]).max()) for t in if_logits}
    assert max(alone_diff[t] for t in range(9, ORIGINAL + 1)) <= 1e-4
    assert min(alone_diff[t] for t in range(ORIGINAL + 1, ORIGINAL + PAD + 1)) > 1.0, alone_diff
