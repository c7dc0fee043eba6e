"""The examples run as documented."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from conftest import GENAI, REPO


def _digests(folder) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.corpus
@pytest.mark.parametrize("model,text_only", [("legacy/qwen35/cpu_fp32_text", False),
                                              ("current/phi3_mini_128k/webgpu_fp32", False),
                                              ("current/qwen25_vl/webgpu_fp16", True)])
def test_onnx_ir_pass_manager_example_gives_optimize_bytes(model, text_only, tmp_path):
    """The webgpu-graph passes in a plain onnx_ir PassManager, with the genai config: optimize's bytes exactly."""
    flag = ["--text-only"] if text_only else []
    mine, theirs = tmp_path / "manager", tmp_path / "optimize"
    result = subprocess.run([sys.executable, str(REPO / "examples/onnx_ir_pass_manager.py"), str(GENAI / model),
                             str(mine), *flag], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "rewritten" in result.stdout or "updated" in result.stdout, result.stdout
    cli = subprocess.run([sys.executable, "-m", "rope_passes", "optimize", str(GENAI / model), "-o", str(theirs),
                          "--target", "webgpu-graph", *flag], capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr
    assert _digests(mine) == _digests(theirs)
    model_proto = onnx.load(mine / "model.onnx", load_external_data=False)
    assert model_proto.ir_version <= 13


def fresh_tmpdir(tmp_path) -> dict[str, str]:
    """An environment whose temp dir is a new empty folder: what a run leaves there is what it left behind."""
    (tmp_path / "tmpdir").mkdir()
    return {**os.environ, "TMPDIR": str(tmp_path / "tmpdir")}


def left_behind(env: dict[str, str]) -> list[str]:
    return sorted(p.name for p in Path(env["TMPDIR"]).iterdir())


@pytest.mark.webgpu
def test_optimize_and_check_example_on_tiny_model(tmp_path):
    env = fresh_tmpdir(tmp_path)
    result = subprocess.run([sys.executable, str(REPO / "examples/optimize_and_check.py")],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("equivalent")
    assert left_behind(env) == []  # the tiny model's folder (rope-example-*) is removed


@pytest.mark.webgpu
def test_demo_runs_and_leaves_nothing_behind(tmp_path):
    """``rope-passes demo`` (what scripts/demo.sh runs): the main job on the tiny decoder, exit 0 (equivalent), and
    its temporary folder removed afterwards."""
    env = fresh_tmpdir(tmp_path)
    result = subprocess.run([sys.executable, "-m", "rope_passes", "demo", "--steps", "2"],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert left_behind(env) == []  # the demo folder (rope-passes-demo-*) is removed
    assert "equivalent (exit 0)" in result.stdout and "removed now" in result.stdout
