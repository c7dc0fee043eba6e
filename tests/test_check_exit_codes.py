"""``check``'s exit codes and verdict lines say what happened (issue 19).

0 only when outputs were compared and agree (``equivalent``); 3 when only the rotation tables were, and the verdict
then says so (``equivalent (rotation tables only: the original runs nowhere here)``, in the text and the JSON's
``evidence``: issue 26, so a script tells the two tiers apart); 1 only when a
comparison ran and differs; 2 when a run could not happen, naming it: e.g. a captured run whose output has a
dimension name the checker cannot size (a Cohere-style ``logits`` dim) is 2, not 1.
"""

from __future__ import annotations

import json

import onnx
import pytest
from conftest import GENAI

import rope_passes
from rope_passes.check.core import check
from rope_passes.check.report import COULD_NOT_RUN, EQUIVALENT_TABLES_ONLY
from rope_passes.demo import build_tiny_decoder


@pytest.mark.webgpu
def test_capture_run_that_cannot_size_an_output_dimension_is_exit_2(tmp_path):
    """Before: the captured run raised "cannot size output logits dimension 'query_tokens'" inside the run, the run
    was "run-failed" and the verdict "not equivalent" (exit 1) although every output compared was identical."""
    src = build_tiny_decoder(tmp_path / "demo")
    model = onnx.load(src / "model.onnx")
    for value in (model.graph.input[0], model.graph.output[0]):  # input_ids, logits: a length name as an exporter may write it
        value.type.tensor_type.shape.dim[1].dim_param = "query_tokens"  # a name the checker does not know
    onnx.save(model, src / "model.onnx", save_as_external_data=True, location="model.onnx.data")
    out = tmp_path / "out"
    rope_passes.optimize(src, out, preset="webgpu-graph")
    report = check(src, out, graph_capture=True, steps=2, sweep=0, schedules=[], isolate=False)
    assert report.verdict == COULD_NOT_RUN and report.exit_code == 2, report.to_json()
    assert report.reason.startswith("rewritten@webgpu+capture could not run: ") and "'query_tokens'" in report.reason
    assert report.run("rewritten@webgpu+capture").status == "could-not-run"
    assert all(c.ok for c in report.comparisons if c.counts and c.status == "compared")  # what ran agrees


@pytest.mark.corpus
@pytest.mark.webgpu
def test_tables_only_verdict_says_so(tmp_path):
    """The original (MRotaryEmbedding) loads on no runtime here without the plugin interpreter: only the rotation
    tables are compared. Before, the verdict was a bare "equivalent"."""
    src = GENAI / "current/qwen25_vl/webgpu_fp16"
    out = tmp_path / "out"
    rope_passes.optimize(src, out, preset="webgpu-graph", options={"text_only": True}, weights="copy")
    report = check(src, out, fallback_python=None, isolate=False, sweep=0, schedules=[], steps=1)
    assert report.verdict == EQUIVALENT_TABLES_ONLY and report.exit_code == 3 and report.equivalent  # issue 26
    data = json.loads(report.to_json())
    assert data["verdict"] == "equivalent (rotation tables only: the original runs nowhere here)"
    assert data["evidence"] == "tables-only" and data["exit_code"] == 3


def _evidence(runs, graph_capture=False):
    from pathlib import Path

    from rope_passes.check.compare import TOLERANCES
    from rope_passes.check.evidence import Evidence
    from rope_passes.check.models import ModelInfo
    from rope_passes.check.plan import CheckOptions, CheckPlan

    info = ModelInfo(Path("m"), None, "fp16", {}, None, False)
    plan = CheckPlan(4, 2, (), TOLERANCES["fp16"], None, (), frozenset(), None, graph_capture=graph_capture)
    return Evidence(plan, CheckOptions(), info, info, runs)


def _agreeing(actual, reference):
    from rope_passes.check.compare import TOLERANCES, Comparison, OutputDiff

    return Comparison(actual, reference, TOLERANCES["fp16"], True, [OutputDiff(0, "logits", 0.0, 0.0, True)])


def test_rewritten_that_runs_only_on_cpu_is_could_not_run():
    """An fp16 graph on an adapter without shader-f16 (the browser's SwiftShader): neither graph runs on WebGPU, both
    run on CPU and agree. Before, the CPU comparison alone made the verdict "equivalent" for WebGPU (exit 0)."""
    from rope_passes.check.spec import LOAD_FAILED, OK, RunResult
    from rope_passes.check.verdict import decide

    why = "no shader-f16 on this adapter"
    runs = [RunResult("original@webgpu", LOAD_FAILED, why), RunResult("original@cpu", OK),
            RunResult("rewritten@webgpu", LOAD_FAILED, why), RunResult("rewritten@cpu", OK)]
    verdict, reason, _ = decide(_evidence(runs), [_agreeing("rewritten@cpu", "original@cpu")])
    assert verdict == COULD_NOT_RUN
    assert reason.startswith("the rewritten graph does not run on webgpu here (load-failed: ") and why in reason


def test_capture_run_failing_as_the_plain_run_does_is_not_a_capture_defect():
    """The plain rewritten run and its captured twin both fail to load (the same reason): that says nothing about
    capture. Before, the verdict was "not equivalent: … does not run under [capture]" (exit 1)."""
    from rope_passes.check.report import NOT_EQUIVALENT
    from rope_passes.check.spec import LOAD_FAILED, OK, RUN_FAILED, RunResult
    from rope_passes.check.verdict import decide

    why = "no shader-f16 on this adapter"
    runs = [RunResult("original@webgpu", LOAD_FAILED, why), RunResult("original@cpu", OK),
            RunResult("rewritten@webgpu", LOAD_FAILED, why), RunResult("rewritten@cpu", OK),
            RunResult("rewritten@webgpu+capture", RUN_FAILED, why)]
    ev = _evidence(runs, graph_capture=True)
    verdict, _, _ = decide(ev, [_agreeing("rewritten@cpu", "original@cpu")])
    assert verdict == COULD_NOT_RUN and not any("under it" in n for n in ev.notes)
    # and when the plain run ran, a failing captured run is still a defect
    runs[0], runs[2] = RunResult("original@webgpu", OK), RunResult("rewritten@webgpu", OK)
    verdict, _, _ = decide(_evidence(runs, graph_capture=True),
                           [_agreeing("rewritten@webgpu", "original@webgpu")])
    assert verdict == NOT_EQUIVALENT


@pytest.mark.webgpu
def test_capture_the_output_config_turns_on_is_checked_without_the_flag(tmp_path):
    """Independent set (issue 20): a rewritten folder whose genai_config.json sets enableGraphCapture=1 for a graph
    onnxruntime cannot capture (onnxruntime-genai then fails to create its session). Before, ``check`` without
    ``--graph-capture`` never made a captured run and said "equivalent" (exit 0)."""
    import shutil

    from rope_passes.check.report import NOT_EQUIVALENT
    from rope_passes.config import GenaiConfig

    src = build_tiny_decoder(tmp_path / "demo")  # capture is blocked on the unrewritten demo graph (Memcpy)
    out = tmp_path / "out"
    shutil.copytree(src, out)
    config = GenaiConfig.load(out)
    data = json.loads((out / "genai_config.json").read_text())
    data["model"]["decoder"]["session_options"]["provider_options"] = [{"webgpu": {"enableGraphCapture": "1"}}]
    (out / "genai_config.json").write_text(json.dumps(data, indent=4))
    assert config is not None
    report = check(src, out, steps=2, sweep=0, schedules=[], isolate=False, tables=False)
    assert report.verdict == NOT_EQUIVALENT and report.exit_code == 1, report.to_json()
    assert any("sets enableGraphCapture=1 but onnxruntime refuses graph capture" in n for n in report.notes)
    assert report.run("rewritten@webgpu+capture").status == "load-failed"
