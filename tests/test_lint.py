"""Lint: each rule fires where the corpus README says the problem is, and nowhere else; formats are valid; --fix."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import GENAI, genai_models

from rope_passes.lint import RULES, lint_bundle
from rope_passes.lint.formats import FORMATS

# The rule codes each corpus model must raise (from the corpus README's "how it fails today" column).
EXPECTED = {
    "current/llama/cpu_fp32": {"RP201", "RP205"},
    "current/llama/webgpu_fp16": {"RP201", "RP205"},
    "current/llama/webgpu_fp16_graph": set(),
    "current/phi3_mini_128k/cpu_fp32": {"RP201", "RP202", "RP205"},
    "current/phi3_mini_128k/webgpu_fp32": {"RP201", "RP202", "RP205"},
    "current/phi3_mini_128k/webgpu_fp16_graph": {"RP204"},
    "current/qwen25_vl/cpu_fp32": {"RP101", "RP103", "RP201"},
    "current/qwen25_vl/webgpu_fp16": {"RP101", "RP103", "RP201"},
    "current/qwen25_vl/webgpu_int4_graph": {"RP101", "RP103"},
    "current/qwen3/cpu_fp32": {"RP201", "RP205"},
    "current/qwen3/webgpu_fp16": {"RP002", "RP201"},
    "current/qwen3/webgpu_fp16_noqknormfuse": {"RP201", "RP205"},
    "current/qwen35/webgpu_fp16_graph": {"RP101", "RP103"},
    "current/qwen35/webgpu_fp32": {"RP101", "RP103", "RP201"},
    "legacy/qwen25_vl/cpu_fp32": {"RP103", "RP201", "RP205"},
    # the builder's *_graph configs turn capture on for graphs that need Memcpy: onnxruntime-genai fails (RP221)
    "legacy/qwen25_vl/webgpu_fp16_graph": {"RP103", "RP205", "RP221"},
    "legacy/qwen35/cpu_fp32": {"RP103", "RP201", "RP205"},
    "legacy/qwen35/cpu_fp32_text": {"RP102", "RP201", "RP205"},
    "legacy/qwen35/webgpu_fp16_graph_text": {"RP102", "RP205", "RP221"},
}


@pytest.mark.corpus
def test_expected_table_covers_the_corpus():
    assert sorted(EXPECTED) == genai_models()


@pytest.mark.corpus
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_rules_on_corpus(name):
    codes = {d.code for d in lint_bundle(GENAI / name)}
    assert codes == EXPECTED[name]


def test_every_rule_has_code_message_explanation():
    assert len(RULES) >= 10
    for code, r in RULES.items():
        assert code.startswith("RP") and len(code) == 5 and r.name and r.summary and len(r.explanation) > 60


@pytest.mark.corpus
def test_ir_version_rule_fires_and_fixes(tmp_path):
    import onnx

    src = GENAI / "current/llama/webgpu_fp16_graph"
    work = tmp_path / "m"
    shutil.copytree(src, work)
    proto = onnx.load(work / "model.onnx", load_external_data=False)
    proto.ir_version = 14
    onnx.save_model(proto, work / "model.onnx")
    assert {d.code for d in lint_bundle(work)} == {"RP001"}
    result = subprocess.run([sys.executable, "-m", "rope_passes", "lint", str(work), "--fix"], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert onnx.load(work / "model.onnx", load_external_data=False).ir_version == 13
    assert "0 problems" in result.stdout


@pytest.mark.corpus
def test_formats_are_machine_readable():
    results = {"m.onnx": lint_bundle(GENAI / "current/phi3_mini_128k/cpu_fp32")}
    data = json.loads(FORMATS["json"](results))
    assert sorted(d["code"] for d in data["m.onnx"]) == ["RP201", "RP201", "RP202", "RP205"]
    sarif = json.loads(FORMATS["sarif"](results))
    run = sarif["runs"][0]
    assert sarif["version"] == "2.1.0" and run["tool"]["driver"]["name"] == "rope-passes"
    assert [r["ruleId"] for r in run["results"]] == ["RP201", "RP201", "RP202", "RP205"]
    ids = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert all(ids[r["ruleIndex"]] == r["ruleId"] for r in run["results"])
    github = FORMATS["github"](results).splitlines()
    assert len(github) == 4 and all(line.startswith("::warning file=m.onnx,title=RP20") for line in github)


@pytest.mark.corpus
def test_cli_exit_codes():
    clean = subprocess.run([sys.executable, "-m", "rope_passes", "lint", str(GENAI / "current/llama/webgpu_fp16_graph")],
                           capture_output=True, text=True)
    assert clean.returncode == 0 and "0 problems" in clean.stdout
    dirty = subprocess.run([sys.executable, "-m", "rope_passes", "lint", "--format", "github",
                            str(GENAI / "current/llama/cpu_fp32")], capture_output=True, text=True)
    assert dirty.returncode == 1 and dirty.stdout.count("RP201") == 2 and dirty.stdout.count("RP205") == 1
    notes_only = subprocess.run([sys.executable, "-m", "rope_passes", "lint",
                                 str(GENAI / "current/phi3_mini_128k/webgpu_fp16_graph")], capture_output=True, text=True)
    assert notes_only.returncode == 0, "notes alone must not fail a pre-commit hook"


def test_docs_list_every_rule():
    from conftest import REPO

    doc = (REPO / "docs" / "lint.md").read_text()
    missing = [code for code in RULES if f"### {code} {RULES[code].name}" not in doc]
    assert not missing, f"docs/lint.md lacks {missing}"


@pytest.mark.corpus
@pytest.mark.webgpu
@pytest.mark.parametrize("name", ["legacy/qwen35/cpu_fp32_text", "current/phi3_mini_128k/webgpu_fp32"])
def test_fix_makes_the_model_lint_clean_and_capture_ready(name, tmp_path):
    from rope_passes.runtime.placement_probe import probe_placement

    work = tmp_path / "m"
    shutil.copytree(GENAI / name, work)
    result = subprocess.run([sys.executable, "-m", "rope_passes", "lint", str(work), "--fix"], capture_output=True,
                            text=True)
    left = {d.code for d in lint_bundle(work)}
    # notes only: the LongRoPE fix is WebGPU-only (RP204); capture-ready but the config still off (RP222: a config
    # matter, `optimize --target webgpu-graph` turns it on, --fix runs passes only)
    assert left <= {"RP204", "RP222"}, (left, result.stdout, result.stderr)
    assert result.returncode == 0, result.stdout + result.stderr
    probe = probe_placement(work / "model.onnx", graph_capture=True)  # onnxruntime's own verdict
    assert probe.capture_ok and not probe.memcpy, probe.summary()


@pytest.mark.corpus
def test_pre_commit_hook_runs_as_pre_commit_calls_it():
    """The hook in .pre-commit-hooks.yaml, called the way pre-commit calls it (entry + args + the staged files its
    `files` pattern selects): a model, its data file and its genai_config.json are all selected, each model is
    linted once (as first named), a problem fails the commit."""
    import re
    import shlex

    from conftest import REPO

    hook = dict(line.strip().removeprefix("- ").split(": ", 1) for line in (REPO / ".pre-commit-hooks.yaml").read_text()
                .splitlines() if line.strip() and not line.startswith("#"))
    assert hook["id"] == "rope-passes-lint" and hook["language"] == "python"
    clean, dirty = (GENAI / "current/llama/webgpu_fp16_graph/model.onnx", GENAI / "current/llama/cpu_fp32/model.onnx")
    staged = [clean, clean.with_name("model.onnx.data"), clean.with_name("genai_config.json"), dirty]
    selected = [str(p) for p in staged if re.search(hook["files"], str(p))]
    assert selected == [str(p) for p in staged]
    entry = shlex.split(hook["entry"])
    assert entry[0] == "rope-passes"  # the console script pyproject.toml installs
    exe = Path(sys.executable).with_name("rope-passes")
    result = subprocess.run([str(exe), *entry[1:], "--format", "github", *selected], capture_output=True, text=True)
    assert result.returncode == 1, result.stdout + result.stderr
    flagged = {line.split("file=", 1)[1].split(",", 1)[0] for line in result.stdout.splitlines()}
    assert flagged == {str(dirty)}, result.stdout
    assert result.stdout.count("RP201") == 2 and result.stdout.count("RP205") == 1
