"""The examples run as documented."""

from __future__ import annotations

import hashlib
import subprocess
import sys

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


@pytest.mark.webgpu
def test_optimize_and_check_example_on_tiny_model():
    result = subprocess.run([sys.executable, str(REPO / "examples/optimize_and_check.py")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("equivalent")
