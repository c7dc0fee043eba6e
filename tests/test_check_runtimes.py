"""``check --runtime onnxruntime-webgpu|onnxruntime-ep-webgpu|all``: every run on the chosen WebGPU runtime, in its own
interpreter; ``all``: one verdict per runtime, exit the worst.

The plugin runtime's interpreter is ``.venv-plugin`` (scripts/setup-plugin-runtime.sh) or
``$ROPE_PASSES_PLUGIN_PYTHON``: the tests that need it fail, never skip, without it.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx_ir as ir
import pytest
from conftest import GENAI, ONE_SCHEDULE

from rope_passes.check.core import check_runtimes, interpreter
from rope_passes.check.report import COULD_NOT_RUN, EQUIVALENT, NOT_EQUIVALENT, worst
from rope_passes.cli import main
from rope_passes.io import load_bundle, save_bundle
from rope_passes.runtimes.choose import fallback_interpreter, runtimes_for
from rope_passes.runtimes.descriptors import WEBGPU_127, WEBGPU_PLUGIN
from rope_passes.runtimes.installed import RUNTIMES, default_runtime, python_for

MODEL = "current/llama/webgpu_fp16_graph"
#: a short check: 2 decode steps, 4 sweep positions
QUICK = ["--steps", "2", "--sweep", "4"]


def _need_plugin() -> None:
    assert python_for(WEBGPU_PLUGIN) is not None, (
        "no interpreter for onnxruntime-ep-webgpu: run scripts/setup-plugin-runtime.sh (makes .venv-plugin) or set "
        "$ROPE_PASSES_PLUGIN_PYTHON (these tests never skip)")


def _optimized(src: Path, dst: Path) -> Path:
    assert main(["optimize", str(src), "-o", str(dst), "--target", "webgpu-graph"]) == 0
    return dst


def _perturbed(src: Path, dst: Path) -> Path:
    """A copy of ``src`` with one cos row off by 0.25 (the rotation at position 3)."""
    bundle = load_bundle(src)
    value = bundle.model.graph.initializers["cos_cache"]
    table = value.const_value.numpy().copy()
    table[3] += 0.25
    value.const_value = ir.tensor(table, name="cos_cache")
    save_bundle(bundle, dst)
    return dst


@pytest.mark.corpus
@pytest.mark.webgpu
def test_runtime_all_gives_a_verdict_per_runtime(tmp_path, capsys):
    _need_plugin()
    original = GENAI / MODEL
    rewritten = _optimized(original, tmp_path / "opt")
    capsys.readouterr()
    assert main(["check", str(original), str(rewritten), "--runtime", "all", *QUICK]) == 0
    out = capsys.readouterr().out
    assert "onnxruntime-webgpu: equivalent (exit 0)" in out
    assert "onnxruntime-ep-webgpu: equivalent (exit 0)" in out
    assert "== onnxruntime 1.27.0 (onnxruntime-webgpu) ==" in out
    assert "== onnxruntime 1.31.1 + onnxruntime-ep-webgpu 0.4.0 (onnxruntime-ep-webgpu) ==" in out
    assert out.rstrip().endswith("exit 0 (the worst)")

    bad = _perturbed(rewritten, tmp_path / "bad")
    assert main(["check", str(original), str(bad), "--runtime", "all", *QUICK, "--schedule", ONE_SCHEDULE, "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert (data["verdict"], data["exit_code"]) == (NOT_EQUIVALENT, 1)
    assert [r["runtime"] for r in data["reports"]] == list(RUNTIMES)
    for report in data["reports"]:
        assert report["verdict"] == NOT_EQUIVALENT and report["exit_code"] == 1
        assert report["first_failure"]["step"] == 0
    # every run of a report ran on its runtime
    assert {r["runtime"] for r in data["reports"][0]["runs"]} == {"onnxruntime 1.27.0"}
    assert {r["runtime"] for r in data["reports"][1]["runs"]} == {"onnxruntime 1.31.1 + onnxruntime-ep-webgpu 0.4.0"}


@pytest.mark.corpus
@pytest.mark.webgpu
def test_one_runtime_runs_everything_there(tmp_path):
    """The API: ``check_runtimes`` / ``check(runtime=...)`` on a graph optimize really rewrites."""
    _need_plugin()
    original = GENAI / "current/llama/webgpu_fp16"
    rewritten = _optimized(original, tmp_path / "opt")
    (report,) = check_runtimes(original, rewritten, WEBGPU_PLUGIN, steps=2, sweep=0)
    assert report.verdict == EQUIVALENT and report.runtime == WEBGPU_PLUGIN
    assert report.runtime_label == "onnxruntime 1.31.1 + onnxruntime-ep-webgpu 0.4.0"
    webgpu = report.run("rewritten@webgpu")
    assert webgpu.providers[0] == "WebGpuExecutionProvider"
    assert not any(r.label.endswith(":plugin") for r in report.runs)  # no fallback to the runtime it runs on
    assert "onnxruntime-ep-webgpu" in report.reference
    assert report.to_dict()["runtime"] == WEBGPU_PLUGIN


def test_runtime_without_interpreter_is_refused_before_anything_runs(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("ROPE_PASSES_PLUGIN_PYTHON", "none")
    missing = [str(tmp_path / "no-such-original"), str(tmp_path / "no-such-rewritten")]
    for choice in (WEBGPU_PLUGIN, "all"):
        assert main(["check", *missing, "--runtime", choice]) == 2
        err = capsys.readouterr().err
        assert "no Python interpreter with onnxruntime-ep-webgpu here" in err
        assert "scripts/setup-plugin-runtime.sh" in err and "no such file" not in err
    assert fallback_interpreter(WEBGPU_127) is None  # and no fallback to it either


def test_runtime_choices():
    assert runtimes_for("all") == list(RUNTIMES)
    assert runtimes_for(WEBGPU_PLUGIN) == [WEBGPU_PLUGIN]
    assert runtimes_for(None) == [default_runtime()]  # the one installed here
    assert interpreter(default_runtime()) is None  # runs in this process
    assert fallback_interpreter(WEBGPU_PLUGIN) is None


@pytest.mark.parametrize(("verdicts", "expected"), [
    ((EQUIVALENT, EQUIVALENT), EQUIVALENT),
    ((EQUIVALENT, COULD_NOT_RUN), COULD_NOT_RUN),
    ((COULD_NOT_RUN, NOT_EQUIVALENT), NOT_EQUIVALENT),
    ((NOT_EQUIVALENT, EQUIVALENT), NOT_EQUIVALENT),
])
def test_worst_verdict(verdicts, expected):
    class _Report:
        def __init__(self, verdict: str) -> None:
            self.verdict = verdict

    assert worst([_Report(v) for v in verdicts]) == expected  # type: ignore[arg-type]
