"""The equivalence checker: it passes what is equal, fails what is not (at the right step), and its inputs are real.

Every test here runs real sessions on onnxruntime-webgpu (lavapipe on CI): they fail, never skip, without an adapter.
Budget (2 cores): ~2 min. Which corpus models run where is listed in docs/checker.md.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx_ir as ir
import pytest
from conftest import GENAI, ONE_SCHEDULE, SWEEP, UNLOADABLE, genai_models

import rope_passes
from rope_passes.analysis.graph import nodes_of
from rope_passes.analysis.longrope import LongRoPESwitch
from rope_passes.check.compare import TOLERANCES
from rope_passes.check.core import COULD_NOT_RUN, EQUIVALENT, NOT_EQUIVALENT, check
from rope_passes.check.decode import DecoderSpec, embedding_table, run_decode, token_ids
from rope_passes.cli import main
from rope_passes.io import load_bundle, save_bundle
from rope_passes.runtime.adapter import adapter_info, max_webgpu_prefill
from rope_passes.runtime.sessions import create_session

LOADABLE = [m for m in genai_models() if m not in UNLOADABLE]
GRAPH_BUILDS = {m for m in LOADABLE if "_graph" in m}
#: builder `_graph` models whose graph onnxruntime 1.27 captures (the others get Memcpy nodes: capture refused)
CAPTURABLE = {"current/llama/webgpu_fp16_graph", "current/phi3_mini_128k/webgpu_fp16_graph"}
#: one folder per family (and one fp16 _graph build) checked against itself with the exhaustive default sweep
EXHAUSTIVE = {"current/llama/cpu_fp32", "current/llama/webgpu_fp16_graph", "current/phi3_mini_128k/webgpu_fp32",
              "current/qwen3/cpu_fp32", "legacy/qwen25_vl/cpu_fp32", "legacy/qwen35/cpu_fp32_text"}

#: checks whose subject is the decode: the step a broken model fails at (its sweep and schedules would only fail
#: too), or the plan, a crashed run, the reference's interpreter or the captured decode of a corpus model against
#: itself (its sweep and schedules are test_self_consistency's). Most of a tiny model's check is in them
DECODE_ONLY = {"sweep": 0, "schedules": [], "calls": False}


def mutate(src: str, dst, edit) -> str:
    """A rewritten copy of corpus model ``src`` in ``dst``, changed by ``edit(model, genai_config)``."""
    bundle = load_bundle(GENAI / src)
    edit(bundle.model, bundle.genai_config)
    save_bundle(bundle, dst)
    return str(dst)


def set_initializer_row(name: str, row: int, delta: float):
    def edit(model: ir.Model, _config) -> None:
        value = model.graph.initializers[name]
        table = value.const_value.numpy().copy()
        table[row] += delta
        value.const_value = ir.tensor(table, name=name)

    return edit


# ---------------------------------------------------------------- self-consistency: check M M


@pytest.mark.corpus
@pytest.mark.webgpu
@pytest.mark.parametrize("name", LOADABLE)
def test_self_consistency(name):
    """check M M: no false alarm; the exhaustive default sweep on one folder per family (EXHAUSTIVE)."""
    capture = name in GRAPH_BUILDS
    report = rope_passes.check(GENAI / name, GENAI / name, graph_capture=capture,
                               sweep=None if name in EXHAUSTIVE else SWEEP)
    assert report.verdict == EQUIVALENT, report.to_json()
    same_ep = report.comparison("rewritten@webgpu", "original@webgpu")
    assert same_ep.status == "compared" and same_ep.diffs
    assert all(d.max_abs == 0.0 for d in same_ep.diffs)  # same graph, same EP: bit-identical
    assert {d.output for d in same_ep.diffs} == set(report.run("original@webgpu").steps[0])
    for run in report.runs:
        if run.label.endswith("webgpu") and run.ok:
            assert run.providers[0] == "WebGpuExecutionProvider"
    if capture:
        captured = report.run("rewritten@webgpu+capture")
        if name in CAPTURABLE:
            assert captured.ok, captured.reason
            assert f"onnxruntime logged {report.steps - 1} replays of the captured graph" in captured.notes
            cmp = report.comparison("rewritten@webgpu+capture", "rewritten@webgpu")
            assert cmp.status == "compared" and all(d.max_abs == 0.0 for d in cmp.diffs)
        else:  # a refused capture is a reported result, with onnxruntime's reason
            assert captured.status == "load-failed"
            assert "cannot use the graph capture feature" in captured.reason
            assert any("graph capture is not available" in n for n in report.notes)


@pytest.mark.corpus
@pytest.mark.webgpu
@pytest.mark.parametrize("name", ["current/qwen25_vl/webgpu_fp16", "current/qwen3/webgpu_fp16"])
def test_unloadable_original_is_reported_not_compared(name):
    report = rope_passes.check(GENAI / name, GENAI / name, isolate=False)
    assert report.verdict == COULD_NOT_RUN and report.exit_code == 2
    assert report.run("original@webgpu").status == "load-failed"
    assert any("--reference-logits" in n for n in report.notes)


@pytest.mark.corpus
@pytest.mark.webgpu
def test_unloadable_original_against_reference_logits():
    """current/qwen25_vl (MRotaryEmbedding, not in 1.27) vs the legacy build's explicit mRoPE, which takes
    inputs_embeds: fed the original's own embedding table, checked against the Hugging Face logits."""
    ref = GENAI / "hf/qwen25_vl/ref_S8.npy"
    report = check(GENAI / "current/qwen25_vl/cpu_fp32", GENAI / "legacy/qwen25_vl/cpu_fp32",
                   steps=0, reference_logits=ref, isolate=False)
    assert report.verdict == EQUIVALENT, report.to_json()
    assert report.run("original@cpu").status == "load-failed"
    assert "MRotaryEmbedding" in report.run("original@cpu").reason
    c = report.comparison("rewritten@webgpu", "reference-logits")
    assert c.status == "compared" and c.tolerance == TOLERANCES["fp32"]
    assert c.diffs[0].max_abs < 1e-4


# ---------------------------------------------------------------- inputs are the corpus README's


@pytest.mark.corpus
@pytest.mark.parametrize("name,hf,embeds", [
    ("current/llama/cpu_fp32", "llama", None),
    ("current/qwen3/cpu_fp32", "qwen3", None),
    ("current/phi3_mini_128k/cpu_fp32", "phi3_mini_128k", None),
    ("legacy/qwen25_vl/cpu_fp32", "qwen25_vl", "current/qwen25_vl/cpu_fp32/model.onnx"),
    ("legacy/qwen35/cpu_fp32", "qwen35", "legacy/qwen35/cpu_fp32_text/model.onnx"),
    ("legacy/qwen35/cpu_fp32_text", "qwen35", None),
])
def test_cpu_reference_reproduces_hugging_face(name, hf, embeds):
    ref = np.load(GENAI / "hf" / hf / "ref_S8.npy")  # logits[8, vocab] for a prefill of 8
    report = check(GENAI / name, GENAI / name, ep="cpu", prefill=8, steps=0, reference_logits=ref,
                   embeddings=str(GENAI / embeds) if embeds else None, isolate=False)
    logits = report.run("original@cpu").steps[0]["logits"][0]
    assert logits.shape == ref.shape
    assert np.abs(logits - ref).max() < TOLERANCES["fp32"].atol  # fp32 graphs vs fp32 Hugging Face logits
    assert report.verdict == EQUIVALENT


@pytest.mark.corpus
def test_decode_steps_reproduce_the_prefill():
    """A prefill of 3 + 5 single-token steps gives the logits of a prefill of 8 (KV feed-back and positions)."""
    folder = GENAI / "current/llama/cpu_fp32"
    sess = create_session(folder / "model.onnx", "cpu")
    spec = DecoderSpec.from_session(sess, json.loads((folder / "genai_config.json").read_text()))
    steps = run_decode(sess, spec, token_ids(8), prefill=3, steps=5)
    rows = np.concatenate([steps[0]["logits"][0]] + [s["logits"][0] for s in steps[1:]])
    np.testing.assert_allclose(rows, np.load(GENAI / "hf/llama/ref_S8.npy"), atol=TOLERANCES["fp32"].atol, rtol=0)
    # kept: the prefill's 3 rows, each step's new row, the last call's whole cache (keep_step)
    assert [s["present.0.key"].shape[2] for s in steps] == [3, 1, 1, 1, 1, 8]
    full = run_decode(sess, spec, token_ids(8), prefill=8, steps=0)[0]["present.0.key"]
    kept = np.concatenate([s["present.0.key"] for s in steps[:-1]] + [steps[-1]["present.0.key"][:, :, -1:]], axis=2)
    np.testing.assert_allclose(kept, full, atol=1e-5, rtol=0)  # fp32 keys, the prefill path vs the decode path
    np.testing.assert_array_equal(steps[-1]["present.0.key"][:, :, :7], kept[:, :, :7])  # the past is fed back


@pytest.mark.corpus
def test_token_ids_are_the_corpus_ones():
    np.testing.assert_array_equal(token_ids(5), np.random.RandomState(0).randint(4, 492, size=(1, 5)))
    assert embedding_table(GENAI / "current/qwen25_vl/cpu_fp32/model.onnx").shape == (500, 128)


# ---------------------------------------------------------------- mutations: it can fail, at the right step


@pytest.mark.corpus
@pytest.mark.webgpu
def test_perturbed_cos_row_fails_at_the_prefill(tmp_path):
    bad = mutate("current/llama/cpu_fp32", tmp_path / "m", set_initializer_row("cos_cache", 3, 1e-2))
    report = check(GENAI / "current/llama/cpu_fp32", bad, **DECODE_ONLY)
    assert report.verdict == NOT_EQUIVALENT and report.exit_code == 1
    cmp, diff = report.first_failure
    assert diff.step == 0 and cmp.name == "rewritten@webgpu vs original@webgpu"


@pytest.mark.corpus
@pytest.mark.webgpu
def test_flipped_rotary_interleaved_fails(tmp_path):
    def flip(model, _config):
        for node in nodes_of(model, "GroupQueryAttention"):
            node.attributes["rotary_interleaved"] = ir.AttrInt64("rotary_interleaved", 1)

    bad = mutate("current/llama/cpu_fp32", tmp_path / "m", flip)
    report = check(GENAI / "current/llama/cpu_fp32", bad, isolate=False, **DECODE_ONLY)
    assert report.verdict == NOT_EQUIVALENT
    assert report.first_failure[1].step == 0


@pytest.mark.corpus
@pytest.mark.webgpu
def test_decode_only_error_fails_at_its_step(tmp_path):
    """cos_cache row 9 is used only by the second decode step (prefill = positions 0..7, step 1 = position 8)."""
    bad = mutate("current/llama/cpu_fp32", tmp_path / "m", set_initializer_row("cos_cache", 9, 1e-2))
    report = check(GENAI / "current/llama/cpu_fp32", bad, prefill=8, steps=4, isolate=False, **DECODE_ONLY)
    assert report.verdict == NOT_EQUIVALENT
    cmp, diff = report.first_failure
    assert diff.step == 2, diff
    same_ep = report.comparison("rewritten@webgpu", "original@webgpu")
    assert all(d.ok for d in same_ep.diffs if d.step < 2)
    assert not all(d.ok for d in same_ep.diffs if d.step == 2 and d.output == "logits")


@pytest.mark.corpus
@pytest.mark.webgpu
def test_stale_buffer_under_capture_fails_at_the_first_replay(monkeypatch):
    """The capture comparison can fail: the attention-mask buffer not advanced after the captured step (the classic
    capture bug: a replay reads whatever its fixed buffers hold) must show at step 2, the first replay, and only in
    the captured run. (The checked conversation is the second on the buffers: an earlier one, EARLIER_MORE tokens
    longer, every call uncaptured, fills the mask first.)"""
    from rope_passes.check import capture

    real_fill = capture.WebGPUBuffers.fill
    mask_fills, starts = [], []

    def stale_mask_fill(buffer, array):
        if array.ndim == 2 and array.shape[1] > 8 and array.dtype == np.int64:  # the [1, max_len] attention mask
            if int(array.sum()) == 8:  # a prefill: a conversation starts
                starts.append(len(mask_fills))
            mask_fills.append(int(array.sum()))
            if len(starts) == 2 and len(mask_fills) - starts[1] > 2:  # prefill, captured step 1: filled; then stale
                return
        real_fill(buffer, array)

    monkeypatch.setattr(capture.WebGPUBuffers, "fill", staticmethod(stale_mask_fill))
    model = GENAI / "current/llama/webgpu_fp16_graph"
    report = check(model, model, prefill=8, steps=4, graph_capture=True, isolate=False, **DECODE_ONLY)
    from rope_passes.check.client_schedules import EARLIER_MORE

    earlier_total = report.prefill + report.steps + EARLIER_MORE  # a captured check decodes to CAPTURE_TOTAL
    assert mask_fills[:starts[1]] == list(range(8, earlier_total + 1))
    assert mask_fills[starts[1]:starts[1] + 3] == [8, 9, 10]
    assert report.verdict == NOT_EQUIVALENT
    cmp, diff = report.first_failure
    assert cmp.name == "rewritten@webgpu+capture vs rewritten@webgpu" and diff.step == 2, (cmp.name, diff)
    plain = report.comparison("rewritten@webgpu", "original@webgpu")
    assert plain.ok


@pytest.mark.corpus
@pytest.mark.webgpu
def test_wrong_longrope_offset_fails_past_it(tmp_path):
    """phi3 concatenated cache, offset 32 -> 16: identical up to 16 tokens, wrong from token 17 = decode step 9."""

    def offset16(_model, config):
        config.data["model"]["decoder"]["session_options"]["provider_options"][0]["webgpu"][
            "multiRotaryCacheConcatOffset"] = "16"

    src = "current/phi3_mini_128k/webgpu_fp16_graph"
    bad = mutate(src, tmp_path / "m", offset16)
    report = check(GENAI / src, bad, isolate=False, **DECODE_ONLY)
    assert report.prefill + report.steps >= 36  # decoded past the original's switch point (32)
    assert report.original.webgpu_options["multiRotaryCacheConcatOffset"] == "32"
    assert report.verdict == NOT_EQUIVALENT
    assert report.first_failure[1].step == 9
    same_ep = report.comparison("rewritten@webgpu", "original@webgpu")
    assert all(d.max_abs == 0.0 for d in same_ep.diffs if d.step < 9)


def set_switch(value: int):
    def edit(model, _config):
        greater = nodes_of(model, "Greater")[0]
        greater.inputs[1].producer().attributes["value"] = ir.AttrTensor("value", ir.tensor(np.int64(value)))

    return edit


@pytest.mark.corpus
@pytest.mark.webgpu
def test_wrong_longrope_switch_fails_past_it(tmp_path):
    """phi3 fp32 If(Greater(total, 32)) between two tables: switching after 30 tokens instead is wrong from 31
    tokens on (decode step 23 after a prefill of 8)."""
    src = "current/phi3_mini_128k/webgpu_fp32"
    bad = mutate(src, tmp_path / "m", set_switch(30))
    report = check(GENAI / src, bad, isolate=False, **DECODE_ONLY)
    assert report.original.longrope == LongRoPESwitch("if", 32)
    assert report.verdict == NOT_EQUIVALENT
    assert report.first_failure[1].step == 31 - report.prefill


@pytest.mark.corpus
@pytest.mark.webgpu
def test_run_that_fails_mid_decode_is_a_failure_at_that_step(tmp_path):
    """Switching at 34: the 32-row short table is too small at 33 tokens; GQA raises there (step 25)."""
    src = "current/phi3_mini_128k/webgpu_fp32"
    bad = mutate(src, tmp_path / "m", set_switch(34))
    report = check(GENAI / src, bad, isolate=False, **DECODE_ONLY)
    run = report.run("rewritten@webgpu")
    assert run.status == "run-failed" and run.failed_step == 25 and len(run.steps) == 25
    assert "cos_cache dimension 0 shall not be less than total_sequence_length" in run.reason
    assert report.verdict == NOT_EQUIVALENT
    cmp, diff = report.first_failure
    assert diff.step == 25 and diff.output == "(run)"


# ---------------------------------------------------------------- runtime defects and isolation


@pytest.mark.corpus
@pytest.mark.webgpu
def test_software_adapter_caps_the_webgpu_prefill():
    info = adapter_info()
    report = check(GENAI / "current/llama/cpu_fp32", GENAI / "current/llama/cpu_fp32", prefill=12, steps=1,
                   isolate=False, **DECODE_ONLY)
    if info.software:
        assert max_webgpu_prefill(info) == 8
        assert (report.prefill, report.steps) == (8, 5)
        assert any("software WebGPU adapter" in n for n in report.notes)
    else:
        assert (report.prefill, report.steps) == (12, 1)


def test_software_adapter_can_be_forced_off(monkeypatch):
    monkeypatch.setenv("ROPE_PASSES_SOFTWARE_ADAPTER", "0")
    adapter_info.cache_clear()
    try:
        assert max_webgpu_prefill() is None
    finally:
        adapter_info.cache_clear()


@pytest.mark.corpus
@pytest.mark.webgpu
def test_segfault_in_a_run_is_reported(monkeypatch):
    monkeypatch.setenv("ROPE_PASSES_CHECK_WORKER_FAULT", "original@webgpu")
    report = check(GENAI / "current/llama/cpu_fp32", GENAI / "current/llama/cpu_fp32", steps=1, **DECODE_ONLY)
    run = report.run("original@webgpu")
    assert run.status == "crashed" and "SIGSEGV" in run.reason
    # the other runs still ran and were compared; a reference that crashed is no pass (issue 26): could not run
    assert report.comparison("rewritten@webgpu", "original@cpu").status == "compared"
    assert report.verdict == COULD_NOT_RUN and report.exit_code == 2
    assert report.reason.startswith("the reference run original@webgpu failed (crashed)")


# ---------------------------------------------------------------- CLI


@pytest.mark.corpus
@pytest.mark.webgpu
def test_cli_json_and_exit_codes(tmp_path, capsys):
    model = str(GENAI / "current/llama/cpu_fp32")
    # the model against itself: its sweep and schedules are test_self_consistency's; here the CLI's JSON
    assert main(["check", model, model, "--steps", "2", "--in-process", "--no-sweep", "--schedule", ONE_SCHEDULE,
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "equivalent" and data["schedule"]["steps"] == 2
    tol = data["comparisons"][0]["tolerance"]
    assert (tol["atol"], tol["rtol"], tol["precision"]) == (1e-4, 1e-4, "fp32")
    bad = mutate("current/llama/cpu_fp32", tmp_path / "m", set_initializer_row("cos_cache", 2, 1e-2))
    assert main(["check", model, bad, "--steps", "1", "--in-process", "--no-sweep", "--schedule", ONE_SCHEDULE]) == 1
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines at its width
    assert "not equivalent" in out and "first failure: step 0" in out and "atol 0.0001" in out
    assert main(["check", model, str(tmp_path / "missing")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["check", model, model, "--dim", "oops"]) == 2


@pytest.mark.corpus
def test_cli_entry_point_runs():
    model = str(GENAI / "current/llama/cpu_fp32")
    proc = subprocess.run([sys.executable, "-m", "rope_passes", "check", model, model, "--ep", "cpu", "--steps", "1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "equivalent (exit 0)" in proc.stdout


@pytest.mark.webgpu
def test_non_decoder_graph_gets_random_inputs_sized_by_dim(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    path = tmp_path / "square.onnx"
    onnx.save(model, path)
    report = check(path, path, dims={"n": 3}, isolate=False)
    assert report.verdict == EQUIVALENT
    assert report.run("original@cpu").steps[0]["y"].shape == (3, 4)
    unsized = check(path, path, isolate=False)
    assert unsized.verdict == COULD_NOT_RUN
    assert "--dim n=VALUE" in unsized.run("original@cpu").reason


@pytest.mark.corpus
@pytest.mark.webgpu
def test_original_under_another_python(tmp_path):
    """--reference-python: the original's runs use that interpreter (here the same one, to exercise the path)."""
    model = GENAI / "current/llama/cpu_fp32"
    report = check(model, model, steps=1, isolate=False, reference_python=sys.executable, **DECODE_ONLY)
    assert report.verdict == EQUIVALENT
    assert report.run("original@cpu").runtime.startswith("onnxruntime ")
    assert any(n.startswith(f"the original ran under {sys.executable}") for n in report.notes)
    missing = check(model, model, steps=1, isolate=False, reference_python=str(tmp_path / "nopython"), **DECODE_ONLY)
    assert missing.verdict == COULD_NOT_RUN and "cannot start" in missing.run("original@cpu").reason


@pytest.mark.corpus
def test_bad_reference_logits_is_a_usage_error(tmp_path):
    np.save(tmp_path / "ints.npy", np.zeros((8, 500), np.int64))
    model = GENAI / "current/llama/cpu_fp32"
    with pytest.raises(rope_passes.UsageError, match="float \\[rows, vocab\\]"):
        check(model, model, reference_logits=tmp_path / "ints.npy")
    with pytest.raises(rope_passes.UsageError, match="cannot read reference logits"):
        check(model, model, reference_logits=tmp_path / "missing.npy")


@pytest.mark.corpus
@pytest.mark.webgpu
def test_tolerance_follows_the_original_precision():
    from rope_passes.analysis.graph import precision_of
    from rope_passes.io import load_model

    assert precision_of(load_model(GENAI / "current/llama/cpu_fp32/model.onnx")) == "fp32"
    assert precision_of(load_model(GENAI / "current/llama/webgpu_fp16/model.onnx")) == "fp16"
    assert precision_of(load_model(GENAI / "current/qwen25_vl/webgpu_int4_graph/model.onnx")) == "int4"
    # int4 is never compared across EPs: that comparison is skipped, with the reason
    report = check(GENAI / "current/qwen25_vl/webgpu_int4_graph", GENAI / "current/qwen25_vl/webgpu_int4_graph",
                   isolate=False)
    cross = report.comparison("rewritten@webgpu", "original@cpu")
    assert cross.status == "skipped" and "int4" in cross.reason and not cross.counts
