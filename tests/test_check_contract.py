"""``check`` feeds what the model accepts (issue 26): ids below the embedding table's rows, positions inside its
context; a reference run that fails is "could not run" (exit 2), never skipped into a pass.

The issue's case: an exporter graph of the torch corpus (vocabulary 256). Before, the decode drew ids from a fixed
4..492, both CPU runs raised (``Gather ... idx=327 must be within the inclusive range [-256,255]``), the original
on WebGPU (where an out-of-range Gather reads zeros) became the reference, and the verdict was ``equivalent``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import GENAI, TORCH

import rope_passes
from rope_passes.analysis.genai_contract import embedding_rows
from rope_passes.check.decode import TOKEN_HIGH, TOKEN_LOW, token_ids
from rope_passes.check.models import read_model
from rope_passes.check.plan import vocabulary
from rope_passes.check.report import COULD_NOT_RUN
from rope_passes.check.spec import CRASHED, OK, RUN_FAILED, RunResult
from rope_passes.check.verdict import decide, reference_failure
from rope_passes.runtimes.fit import runtime_fit


def test_token_ids_stay_inside_the_vocabulary():
    ids = token_ids(4000, 0, 256)
    assert ids.min() >= 0 and ids.max() <= 255 and ids.max() >= 250  # across the whole vocabulary
    # a vocabulary the corpus's ids fit keeps them (the genai corpus's Hugging Face references were made with them)
    assert np.array_equal(token_ids(8, 0, 500), token_ids(8, 0))
    big = token_ids(4000, 0, None)
    assert big.min() >= TOKEN_LOW and big.max() < TOKEN_HIGH


def _evidence(runs):
    from pathlib import Path

    from rope_passes.check.compare import TOLERANCES
    from rope_passes.check.evidence import Evidence
    from rope_passes.check.models import ModelInfo
    from rope_passes.check.plan import CheckOptions, CheckPlan

    info = ModelInfo(Path("m"), None, "fp32", {}, None, False)
    plan = CheckPlan(4, 2, (), TOLERANCES["fp32"], None, (), frozenset(), None)
    return Evidence(plan, CheckOptions(), info, info, runs)


def _agreeing(actual, reference):
    from rope_passes.check.compare import TOLERANCES, Comparison, OutputDiff

    return Comparison(actual, reference, TOLERANCES["fp32"], True, [OutputDiff(0, "logits", 0.0, 0.0, True)])


def test_a_failing_reference_run_is_could_not_run():
    """The issue's runs: both CPU runs raised, the WebGPU ones ran and agree. Before: "equivalent" (exit 0)."""
    why = "Gather node. idx=327 must be within the inclusive range [-256,255]"
    runs = [RunResult("original@cpu", RUN_FAILED, why, failed_step=0), RunResult("original@webgpu", OK),
            RunResult("rewritten@webgpu", OK), RunResult("rewritten@cpu", RUN_FAILED, why, failed_step=0)]
    verdict, reason, _ = decide(_evidence(runs), [_agreeing("rewritten@webgpu", "original@webgpu")])
    assert verdict == COULD_NOT_RUN
    assert reason.startswith("the reference run original@cpu failed at step 0 (run-failed)") and "idx=327" in reason
    # a schedule or a sweep position the reference raised on, a crash: the same
    ok = [RunResult("original@cpu", OK, schedule_errors={"long-prompt": "boom"}), RunResult("original@webgpu", OK)]
    assert "raised on schedule long-prompt: boom" in (reference_failure(_evidence(ok)) or "")
    ok = [RunResult("original@cpu", OK, sweep_errors={9: "late", 3: "early"})]
    assert "raised at sweep position 3: early" in (reference_failure(_evidence(ok)) or "")
    assert "(crashed)" in (reference_failure(_evidence([RunResult("original@webgpu", CRASHED, "SIGSEGV")])) or "")
    assert reference_failure(_evidence([RunResult("original@cpu", OK), RunResult("rewritten@cpu", RUN_FAILED)])) \
        is None  # the rewritten graph failing is a difference, not a missing reference


@pytest.mark.corpus
def test_vocabulary_is_the_embedding_tables_rows():
    info = read_model(TORCH / "tf5/dynamo/llama/decode.onnx")
    assert embedding_rows(info.model) == 256 and vocabulary([info]) == 256
    info = read_model(TORCH / "tf4/torchscript/qwen2/decode.onnx")
    assert vocabulary([info]) == 256


@pytest.mark.corpus
@pytest.mark.webgpu
def test_the_issues_exporter_graph_runs_every_reference_run(tmp_path):
    """``optimize --target exporter`` then ``check`` on the issue's graph: every run ran, every schedule and sweep
    position of the original too, and the verdict is a full one (exit 0, JSON evidence "full")."""
    src = TORCH / "tf5/dynamo/llama/decode.onnx"
    out = tmp_path / "out.onnx"
    rope_passes.optimize(src, out, preset="exporter", options={"max_positions": 256})
    report = rope_passes.check(src, out, steps=2, sweep=8)
    assert report.exit_code == 0, report.reason or report.to_json()[:2000]
    for run in report.runs:
        assert run.ok and not run.schedule_errors and not run.sweep_errors, (run.label, run.reason)
    # concise by default: the verdict, the worst difference with its call, what was not run (issue 26)
    from rich.console import Console

    from rope_passes.cli.check_cmd import render

    console = Console(record=True, width=120)
    render(report, console, verbose=False)
    lines = console.export_text().splitlines()
    assert len(lines) <= 14, lines
    worst = " ".join(lines[next(i for i, line in enumerate(lines) if line.startswith("worst difference: ")):][:2])
    assert " at " in worst and "atol" in worst.split("(", 1)[-1], worst  # the console wraps a long schedule's name
    assert lines[-1].startswith("onnxruntime-webgpu: equivalent (exit 0)")
    assert json.loads(report.to_json())["evidence"] == "full"


@pytest.mark.corpus
def test_an_output_built_for_another_runtime_names_the_optimize_command(tmp_path):
    """``optimize --target webgpu-graph`` concatenates Phi-3's LongRoPE cache and sets multiRotaryCacheConcatOffset,
    which onnxruntime-web does not read (probed): ``check --runtime web`` says which command fits, in one line.
    An offset the original sets itself (the builder's concat model) is not the rewrite's: no line."""
    src = GENAI / "current/phi3_mini_128k/webgpu_fp32"
    out = tmp_path / "out"
    rope_passes.optimize(src, out, preset="webgpu-graph", weights="copy")
    orig, rew = read_model(src), read_model(out)
    line = runtime_fit(src, orig, rew, "onnxruntime-web")
    assert line is not None and "\n" not in line
    assert line.startswith("the rewritten model is built for onnxruntime-webgpu (multiRotaryCacheConcatOffset=32")
    assert line.endswith(f"rope-passes optimize {src} -o webgpu_fp32-onnxruntime-web --runtime onnxruntime-web")
    assert runtime_fit(src, orig, rew, "onnxruntime-webgpu") is None
    builder = GENAI / "current/phi3_mini_128k/webgpu_fp16_graph"
    assert runtime_fit(builder, read_model(builder), read_model(builder), "onnxruntime-web") is None


def test_client_schedules_come_from_the_graph_facts():
    """Thresholds, the genai loop and caller positions come from the facts read off the graph (no model list); a
    schedule prints as one line that parses back, layout included; each graph runs the layout it takes."""
    from rope_passes.analysis.genai_contract import GenaiLoop
    from rope_passes.check.client_schedules import client_schedules, for_graph
    from rope_passes.check.schedule_runs import earlier_conversation
    from rope_passes.check.schedules import PLAIN, SHARED, STATIC, GraphFacts, parse

    facts = GraphFacts(vocab=300, switches=(32,), windows=(16,), context=256, max_length=256, static_mask=True,
                       takes_positions=True, ends=(200, 256))
    by = {s.name: s for s in client_schedules(facts)}
    assert {"genai-shared-buffers", "genai-capture-steps", "positions-ahead", "switch-32-steps", "window-16-steps",
            "end-200-steps", "end-256-steps", "end-256-straddle"} <= set(by)
    straddle = by["near-32-calls-4+2"]  # calls of 4 ending at 26, 30, 34, 38: past 30, 4 tokens across the switch
    assert straddle.lengths == (22,) and straddle.then == (4,) * 4
    totals = np.cumsum([0, *by["switch-32-steps"].call_sizes])[1:]
    assert {31, 32, 33} <= set(totals.tolist())
    end = by["end-256-steps"]
    assert np.cumsum(end.call_sizes).tolist()[-9:] == list(range(248, 257))  # totals 248..256, none past
    assert max(max(r) for s in by.values() for r in s.ids) < 300
    ahead = list(by["positions-ahead"].calls())
    assert ahead[0].positions.tolist() == [[5, 6, 7, 8]] and ahead[1].past == 4
    for s in by.values():
        assert parse(s.text(), s.name) == s, s.text()
    capture = by["genai-capture-steps"]
    assert for_graph(capture, GenaiLoop(True, 256, True)).kv == STATIC
    assert for_graph(capture, GenaiLoop(True, 256, False)).kv == SHARED  # total from the mask's shape
    assert for_graph(capture, GenaiLoop()).kv == PLAIN and for_graph(capture, GenaiLoop()).max_length is None
    batch = by["switch-32-batch"]  # rows on both sides of the switch: the batch's total decides
    assert batch.lengths == (2, 34) and batch.padding == "left"
    assert by["batch-rows"].batch >= 4 and len(set(by["batch-rows"].lengths)) == 1
    turns = by["second-turn"].call_sizes
    assert any(n > 8 for n in turns[1:]) and turns[0] < 8  # user messages past the prefill cap, after a past
    # nothing in the graph: only what every caller does (batched prompts, chat turns)
    assert {s.name for s in client_schedules(GraphFacts(vocab=300))} == {
        "batch-rows", "second-turn", "left-padded-4", "right-padded-4", "left-padded-4b", "right-padded-4b",
        "batch-5", "batch-6", "batch-7"}
    for side in ("left", "right"):  # every padding 1..6 of prompts up to 7 tokens, on each side, in a batch of four
        padded = [s for s in by.values() if s.padding == side and s.batch == 4 and len(set(s.lengths)) == 4]
        assert {max(s.lengths) - n for s in padded for n in s.lengths} >= set(range(7)), side
    # a new conversation on genai's buffers after one that filled them (max_length 256): stale rows at 5..255
    second = by["genai-second-conversation"]
    assert second.earlier == 256 and earlier_conversation(second).call_sizes == [5, 251]
    # every batch size 1..8; decode steps after a right-padded prompt; the capture loop to total 64
    assert {1, 2, 3, 4, 5, 6, 7, 8} <= {s.batch for s in client_schedules(facts)} | {1, 2, 3}
    assert by["right-padded-4"].then == (1, 1)
    assert sum(capture.call_sizes) == 64 and set(capture.call_sizes[1:]) == {1}
    # calls of k tokens end at every total near each threshold: 24..40 at the switch 32, 248..256 at the end
    for t, ends, top in ((32, range(24, 41), 8), (256, range(248, 257), 4)):
        for k in range(2, top + 1):  # every call size up to the prefill cap (8), at the context's end to 4
            got = {int(e) for name, s in by.items() if name.startswith(f"near-{t}-calls-{k}+")
                   for e in np.cumsum(s.call_sizes)[1:]}
            assert set(ends) <= got <= set(range(ends[0], 257)), (t, k, sorted(got))


@pytest.mark.corpus
def test_the_capture_loops_mask_goes_to_graphs_whose_total_is_the_mask_sum(tmp_path):
    """The builder's _graph model computes the total as the mask's sum: its client (genai's capture loop) sends a
    max_length mask of ones then zeros. A plain build (total from Shape) and total-seq-on-gpu's output (the width,
    on the GPU: right under capture only) get genai's shared buffers with a growing mask instead."""
    graph = read_model(GENAI / "current/llama/webgpu_fp16_graph").loop
    assert graph.share_buffer and graph.max_length == 256 and graph.static_mask
    plain = read_model(GENAI / "current/llama/cpu_fp32").loop
    assert plain.share_buffer and not plain.static_mask
    out = tmp_path / "out"
    rope_passes.optimize(GENAI / "current/llama/cpu_fp32", out, preset="webgpu-graph", weights="copy")
    assert not read_model(out).loop.static_mask
    assert read_model(TORCH / "tf5/dynamo/llama/decode.onnx").loop.share_buffer is False  # no genai_config


@pytest.mark.corpus
def test_a_graph_without_kv_cache_gets_the_whole_sequence_each_call():
    """An exporter's prefill graph (no past_key_values) takes no call after a past: its client re-sends the whole
    sequence (use_cache=False). Before, every decode step, schedule call after a past and sweep position raised in
    the reference (Reshape: the mask longer than the ids) and the verdict was 'could not run' (issue 26's rule)."""
    src = TORCH / "tf5/dynamo/llama/prefill.onnx"
    report = rope_passes.check(src, src, ep="cpu", sweep=4, isolate=False)
    assert report.exit_code == 0, report.reason
    for run in report.runs:
        assert run.ok and not run.schedule_errors and not run.sweep_errors, (run.label, run.reason)
    decode = report.run("original@cpu").steps
    assert [s["logits"].shape[1] for s in decode] == [8, 1, 1, 1, 1]  # the new tokens' rows, as a cached run's
