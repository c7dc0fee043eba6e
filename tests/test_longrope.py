"""`longrope-concat` and `annotate-cache-offset` on the Phi-3 128k LongRoPE corpus graphs.

Reference: the original If-graph on onnxruntime's CPU EP (it matches Hugging Face: checked below against ref_S8 and
ref_S40). The corpus README names `hf/phi3_mini_128k/ref_long.npy` (decode 8→44) but the file is not in the corpus
(the captured-decode test compares against it as soon as it is there); a prefill-40 reference (ref_S40) cannot stand in for decode past 32 either, since in decode the keys of tokens
before the switch stay rotated with the short factors. WebGPU prefills stay at 8 tokens (lavapipe defect) and 44
tokens are reached by decode steps.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from conftest import GENAI

from rope_passes.analysis.caches import switched_head
from rope_passes.analysis.graph import nodes_of
from rope_passes.analysis.placement import predict_placement
from rope_passes.api import optimize
from rope_passes.check import check
from rope_passes.check.compare import TOLERANCES
from rope_passes.check.core import EQUIVALENT, NOT_EQUIVALENT
from rope_passes.check.decode import DecoderSpec, run_decode, token_ids
from rope_passes.io import load_bundle
from rope_passes.passes.longrope_concat import (
    OFFSET_METADATA,
    WEBGPU_ONLY_KEY,
    LongRoPEConcatPass,
)
from rope_passes.pipeline import run_pipeline
from rope_passes.plan import make_plan
from rope_passes.proofs.cache_tables import cache_table
from rope_passes.report import Outcome
from rope_passes.runtime.sessions import create_session

pytestmark = [pytest.mark.corpus]  # every test here: see tests/conftest.py

PHI3 = GENAI / "current/phi3_mini_128k"
HF = GENAI.parent / "genai" / "hf" / "phi3_mini_128k"
ORIGINAL = 32  # original_max_position_embeddings
FP32 = TOLERANCES["fp32"]  # fp32 graphs vs fp32 Hugging Face logits: the checker's fp32 tolerance
DECODE_TOL = 1e-3  # fp32 logits, WebGPU vs CPU kernels over 37 steps (measured WebGPU/CPU gap ~5e-6)


def _webgpu_options(config: dict) -> dict:
    for entry in config["model"]["decoder"]["session_options"]["provider_options"]:
        if "webgpu" in entry:
            return entry["webgpu"]
    return {}


@pytest.fixture(scope="module")
def rewritten(genai_corpus, tmp_path_factory) -> dict[str, Path]:
    out = {}
    for variant in ("cpu_fp32", "webgpu_fp32"):
        dest = tmp_path_factory.mktemp("longrope") / variant
        report = optimize(str(PHI3 / variant), str(dest), preset="webgpu-graph")
        statuses = {p.pass_name: p.status for p in report.passes}
        assert statuses["longrope-concat"] == "rewritten 1", statuses
        out[variant] = dest
    return out


@pytest.mark.parametrize("variant", ["cpu_fp32", "webgpu_fp32"])
def test_if_replaced_by_concatenated_tables(rewritten, variant):
    orig = ir.load(PHI3 / variant / "model.onnx")
    if_node = nodes_of(orig, "If")[0]
    small = if_node.attributes["else_branch"].value.outputs[0].producer().attributes["value"].value.numpy()
    large = if_node.attributes["then_branch"].value.outputs[0].producer().attributes["value"].value.numpy()
    new = ir.load(rewritten[variant] / "model.onnx")
    assert not nodes_of(new, "If") and not nodes_of(new, "Shape")
    # [head; large], the head Where(longest row past 32, large[:32], small[:32]) (a batch's rows switch together, as
    # the If switches them): for rows of one length, [small[:32]; large], bit-identical rows
    cos_value = nodes_of(new, "GroupQueryAttention")[0].inputs[7]
    head = switched_head(cos_value)
    assert head is not None and head.offset == ORIGINAL and head.rows == ORIGINAL + large.shape[0] == 288
    cos = cache_table(cos_value)
    assert cos.shape == (ORIGINAL + large.shape[0], large.shape[1]) == (288, 16)
    np.testing.assert_array_equal(cos, np.concatenate([small[:ORIGINAL], large]))  # bit-identical rows
    np.testing.assert_array_equal(head.head_long.const_value.numpy(), large[:ORIGINAL])
    greater = head.where.inputs[0].producer()
    assert greater.op_type == "Greater" and greater.inputs[1].const_value.numpy() == ORIGINAL - 1  # max(seqlens_k) > 31
    assert greater.inputs[0].producer().op_type == "ReduceMax"
    assert new.metadata_props[OFFSET_METADATA] == "32" and "CPU EP reads wrong rows" in new.metadata_props[
        WEBGPU_ONLY_KEY]
    config = json.loads((rewritten[variant] / "genai_config.json").read_text())
    assert _webgpu_options(config)["multiRotaryCacheConcatOffset"] == "32"  # the builder's _graph spelling
    assert config["model"]["decoder"]["session_options"][WEBGPU_ONLY_KEY] == "1"
    placement = predict_placement(new)
    assert placement.capture_ok and not placement.memcpy and not placement.control_flow


@pytest.mark.webgpu
def test_captured_webgpu_decode_8_to_44_matches_original_on_cpu(rewritten):
    """WebGPU with capture and the offset (from genai_config), prefill 8 then 36 steps: totals 8..44, across 32."""
    report = check(PHI3 / "webgpu_fp32", rewritten["webgpu_fp32"], prefill=8, steps=36, graph_capture=True)
    captured, reference = report.run("rewritten@webgpu+capture"), report.run("original@cpu")
    assert captured.ok and reference.ok, (captured.status, captured.reason)
    # every step from total 8 to 44 at least (a captured check decodes on to total CAPTURE_TOTAL: more steps)
    assert len(captured.steps) == len(reference.steps) == report.steps + 1 and report.prefill + report.steps >= 44
    errors = [float(np.max(np.abs(a["logits"][:, -1] - b["logits"][:, -1])))
              for a, b in zip(captured.steps, reference.steps)]
    totals = [8 + k for k in range(len(errors))]
    before = [e for t, e in zip(totals, errors) if t <= ORIGINAL]
    after = [e for t, e in zip(totals, errors) if t > ORIGINAL]
    assert len(before) == 25 and len(after) == len(errors) - 25 >= 12
    assert max(before) <= DECODE_TOL and max(after) <= DECODE_TOL, errors
    assert report.equivalent
    # Hugging Face's own decode (the corpus README's ref_long.npy, row k = after 8+k tokens) when the corpus has it;
    # until then the original If-graph on CPU above is the reference (it matches HF at 8 and 40 tokens, test below).
    ref_long = HF / "ref_long.npy"
    if ref_long.exists():
        hf = np.load(ref_long)
        assert hf.shape[0] == 37, hf.shape
        hf_errors = [float(np.max(np.abs(a["logits"][0, -1] - row))) for a, row in zip(captured.steps, hf)]
        assert max(hf_errors) <= DECODE_TOL, hf_errors


def _cpu_decode(folder: Path, total: int) -> list[np.ndarray]:
    bundle = load_bundle(folder)
    sess = create_session(str(folder / "model.onnx"), "cpu")
    spec = DecoderSpec.from_session(sess, bundle.genai_config)
    steps = run_decode(sess, spec, token_ids(total), prefill=8, steps=total - 8)
    return [s["logits"][0, -1] for s in steps]


def test_cpu_is_right_up_to_the_offset_and_wrong_after(rewritten):
    """The honest CPU story, pinned: the CPU EP has no offset, so the concatenated table is right up to 32 tokens and
    wrong after; the model says so (metadata and genai_config, test above)."""
    orig = _cpu_decode(PHI3 / "cpu_fp32", 40)
    new = _cpu_decode(rewritten["cpu_fp32"], 40)
    errors = [float(np.max(np.abs(a - b))) for a, b in zip(orig, new)]
    totals = [8 + k for k in range(len(errors))]
    assert max(e for t, e in zip(totals, errors) if t <= ORIGINAL) <= 1e-5
    assert min(e for t, e in zip(totals, errors) if t > ORIGINAL) > 1e-2, errors


def test_original_on_cpu_matches_hugging_face(genai_corpus):
    """The reference is sound: the If-graph on CPU reproduces HF's prefill logits before and after the switch."""
    for total, ref_file in ((8, "ref_S8.npy"), (40, "ref_S40.npy")):
        bundle = load_bundle(PHI3 / "cpu_fp32")
        sess = create_session(str(PHI3 / "cpu_fp32" / "model.onnx"), "cpu")
        spec = DecoderSpec.from_session(sess, bundle.genai_config)
        logits = run_decode(sess, spec, token_ids(total), prefill=total, steps=0)[0]["logits"][0]
        np.testing.assert_allclose(logits, np.load(HF / ref_file), atol=FP32.atol)


@pytest.mark.webgpu
def test_rewritten_webgpu_prefill_matches_hugging_face(rewritten):
    bundle = load_bundle(rewritten["webgpu_fp32"])
    # the output's options less enableGraphCapture (optimize turns it on): a plain run, and a captured session needs
    # IOBinding (../shared/docs/webgpu-on-cpu.md trap 4); the captured decode is the test above
    options = {k: str(v) for k, v in _webgpu_options(bundle.genai_config.data).items() if k != "enableGraphCapture"}
    sess = create_session(str(rewritten["webgpu_fp32"] / "model.onnx"), "webgpu", webgpu_options=options)
    spec = DecoderSpec.from_session(sess, bundle.genai_config)
    logits = run_decode(sess, spec, token_ids(8), prefill=8, steps=0)[0]["logits"][0]
    np.testing.assert_allclose(logits, np.load(HF / "ref_S8.npy"), atol=FP32.atol)


# --- refusals -------------------------------------------------------------------------------------------------------


def test_refuses_qkv_it_cannot_pack(genai_corpus):
    model = ir.load(PHI3 / "cpu_fp32" / "model.onnx")
    gqa = nodes_of(model, "GroupQueryAttention")[0]
    gqa.replace_input_with(1, gqa.inputs[0])  # a key but no value: not GQA's separate-Q/K/V layout either
    result = LongRoPEConcatPass()(model)
    report = result.report
    assert report.count(Outcome.REFUSED) == 1 and "only one of key/value is given" in report.findings[0].reason
    assert nodes_of(result.model, "If") and gqa.inputs[0].producer().op_type != "Concat"  # untouched


def test_not_matched_without_if(genai_corpus):
    report = LongRoPEConcatPass()(ir.load(GENAI / "current/llama/cpu_fp32/model.onnx")).report
    assert report.status.startswith("not matched: no If switching")


# --- annotate-cache-offset ------------------------------------------------------------------------------------------


def _graph_bundle(config_edit=None):
    bundle = load_bundle(PHI3 / "webgpu_fp16_graph")
    if config_edit is not None:
        config_edit(_webgpu_options(bundle.genai_config.data))
    return bundle


@pytest.mark.parametrize("edit,expected_before", [(lambda o: o.pop("multiRotaryCacheConcatOffset"), None),
                                                  (lambda o: o.update(multiRotaryCacheConcatOffset="16"), "16")],
                         ids=["missing", "wrong"])
def test_annotate_writes_missing_or_wrong_offset(genai_corpus, edit, expected_before):
    bundle = _graph_bundle(edit)
    assert _webgpu_options(bundle.genai_config.data).get("multiRotaryCacheConcatOffset") == expected_before
    report = run_pipeline(bundle, make_plan(passes=["annotate-cache-offset"])).passes[0]
    assert report.count(Outcome.REWRITTEN) == 1, report.status
    assert _webgpu_options(bundle.genai_config.data)["multiRotaryCacheConcatOffset"] == "32"
    assert bundle.model.metadata_props[OFFSET_METADATA] == "32"
    finding = report.findings[0]
    assert finding.details["short_fit_error"] < 2e-3 and finding.details["long_fit_error"] < 2e-3


def test_annotate_refuses_a_table_that_is_not_two_rope_tables(genai_corpus):
    bundle = _graph_bundle(lambda o: o.pop("multiRotaryCacheConcatOffset"))
    cos = bundle.model.graph.initializers["cos_cache"]
    table = cos.const_value.numpy().copy()
    table[40] = table[200]  # one row out of place
    cos.const_value = ir.tensor(table, name="cos_cache")
    report = run_pipeline(bundle, make_plan(passes=["annotate-cache-offset"])).passes[0]
    assert report.count(Outcome.REFUSED) == 1 and "do not fit a short+long RoPE pair" in report.findings[0].reason
    assert "multiRotaryCacheConcatOffset" not in _webgpu_options(bundle.genai_config.data)


def test_annotate_leaves_plain_rope_alone(genai_corpus):
    bundle = load_bundle(GENAI / "current/llama/webgpu_fp16")
    before = copy.deepcopy(bundle.genai_config.data)
    report = run_pipeline(bundle, make_plan(passes=["annotate-cache-offset"])).passes[0]
    assert not report.modified and "not a concatenated cache" in report.status
    assert bundle.genai_config.data == before


def _unpack_qkv(model: ir.Model) -> None:
    """Feed every GQA separate q/k/v (Split of the packed projection), as some exporters do."""
    for gqa in nodes_of(model, "GroupQueryAttention"):
        packed = gqa.inputs[0]
        head = packed.shape[2] // (int(gqa.attributes["num_heads"].value) + 2 * int(gqa.attributes["kv_num_heads"].value))
        sizes = [int(gqa.attributes["num_heads"].value) * head] + [int(gqa.attributes["kv_num_heads"].value) * head] * 2
        split_sizes = ir.Value(name=f"{gqa.name}/split_sizes", const_value=ir.tensor(np.array(sizes, np.int64)))
        model.graph.register_initializer(split_sizes)
        split = ir.node("Split", [packed, split_sizes], attributes={"axis": 2}, num_outputs=3, name=f"{gqa.name}/Split")
        for out, size, part in zip(split.outputs, sizes, "qkv"):
            out.name, out.dtype = f"{gqa.name}/{part}", packed.dtype
            out.shape = ir.Shape([packed.shape[0], packed.shape[1], size])
        model.graph.insert_before(gqa, split)
        for i in range(3):
            gqa.replace_input_with(i, split.outputs[i])


@pytest.mark.webgpu
def test_separate_qkv_packed_then_captured_decode_matches(genai_corpus, tmp_path):
    """A LongRoPE graph whose GQAs take separate q/k/v: the pass packs them (the offset only acts on packed QKV),
    and the captured WebGPU decode across the switch matches the unpacked If-graph on CPU."""
    bundle = load_bundle(PHI3 / "cpu_fp32")
    _unpack_qkv(bundle.model)
    from rope_passes.io import save_bundle

    save_bundle(bundle, tmp_path / "unpacked")
    report = optimize(str(tmp_path / "unpacked"), str(tmp_path / "out"), preset="webgpu-graph")
    longrope = next(p for p in report.passes if p.pass_name == "longrope-concat")
    assert longrope.status == "rewritten 1", longrope.status
    assert any("packed separate query/key/value" in f.reason and "2 GroupQueryAttention" in f.reason
               for f in longrope.findings)
    new = ir.load(tmp_path / "out" / "model.onnx")
    for gqa in nodes_of(new, "GroupQueryAttention"):
        assert gqa.inputs[0].producer().op_type == "Concat" and gqa.inputs[1] is None and gqa.inputs[2] is None
    result = check(tmp_path / "unpacked", tmp_path / "out", prefill=8, steps=4, graph_capture=True)
    assert result.equivalent, result.to_json()[:2000]
    assert result.prefill + result.steps > ORIGINAL  # the checker crossed the switch
    vs_cpu = result.comparison("rewritten@webgpu", "original@cpu")
    assert vs_cpu.ok and max(d.max_abs for d in vs_cpu.diffs if d.output == "logits") <= DECODE_TOL
    assert len({d.step for d in vs_cpu.diffs}) == result.steps + 1  # every step, both sides of the switch
    assert result.comparison("rewritten@webgpu+capture", "rewritten@webgpu").ok


def _swap_branches(model):
    node = nodes_of(model, "If")[0]
    then, other = node.attributes["then_branch"], node.attributes["else_branch"]
    node.attributes["then_branch"] = ir.AttrGraph("then_branch", other.value)
    node.attributes["else_branch"] = ir.AttrGraph("else_branch", then.value)


def _threshold_from_input(model):
    greater = nodes_of(model, "Greater")[0]
    greater.replace_input_with(1, greater.inputs[0])


@pytest.mark.parametrize("edit,reason", [
    (_swap_branches, "long table (its else-branch: the then-branch is the shorter) is not taken exactly where "
                     "'total > offset'"),
    (_threshold_from_input, "threshold is not a constant"),
], ids=["swapped-branches", "threshold"])
def test_longrope_refusals(genai_corpus, edit, reason):
    model = ir.load(PHI3 / "cpu_fp32" / "model.onnx")
    edit(model)
    report = LongRoPEConcatPass()(model).report
    assert report.count(Outcome.REFUSED) == 1 and reason in report.findings[0].reason, report.findings


# --- a switch too far to decode to: the check steps at its two sides instead ---------------------------------------


@pytest.mark.webgpu
@pytest.mark.parametrize("ep", ["webgpu", "cpu"])
def test_far_switch_is_checked_by_steps_at_its_sides(rewritten, monkeypatch, ep, tmp_path):
    """Real-size Phi-3-128k switches after 4096 tokens; here the corpus graph's 32 stands in, with the crossing limit
    lowered below the 36 steps a crossing decode needs. The check then runs single steps after a random past at
    positions 30..33 (total 31..34: short, short, long, long) with no other sweep. Independent reference: the If
    graph on the CPU EP. On WebGPU the concatenated output (offset 32) is right at all four; on the CPU EP, which has
    no offset, it reads short row 32 past the switch: wrong from position 32, exactly where the If takes the long
    table."""
    from rope_passes.check import plan  # rope_passes.check is the function: patch the module object

    monkeypatch.setattr(plan, "MAX_CROSSING_STEPS", 8)
    # the output's genai_config turns capture on, whose captured decode runs to CAPTURE_TOTAL (64): past a real-size
    # switch (4096) it crosses nothing either; here it would cross 32, so the stand-in keeps capture off
    far = tmp_path / "capture-off"
    shutil.copytree(rewritten["cpu_fp32"], far)
    config = json.loads((far / "genai_config.json").read_text())
    for options in config["model"]["decoder"]["session_options"].get("provider_options", []):
        options.get("webgpu", {}).pop("enableGraphCapture", None)
    (far / "genai_config.json").write_text(json.dumps(config))
    report = check(PHI3 / "cpu_fp32", far, ep=ep, sweep=0, tables=False)
    assert report.sweep_positions == [30, 31, 32, 33], report.sweep_positions
    assert report.prefill + report.steps < ORIGINAL  # no decode crossing
    assert any("single steps after a random past" in n for n in report.notes), report.notes
    if ep == "webgpu":
        assert report.verdict == EQUIVALENT, (report.reason, report.first_differences())
    else:
        assert report.verdict == NOT_EQUIVALENT
        comparison, diff = report.first_sweep_failure
        assert diff.step == ORIGINAL and report.first_failure is None, (comparison.name, diff)
