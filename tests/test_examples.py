"""The examples run as documented."""

from __future__ import annotations

import subprocess
import sys

import onnx
from conftest import GENAI, REPO


def test_onnx_ir_pass_manager_example(tmp_path):
    out = tmp_path / "m.onnx"
    result = subprocess.run([sys.executable, str(REPO / "examples/onnx_ir_pass_manager.py"),
                             str(GENAI / "legacy/qwen35/cpu_fp32_text/model.onnx"), str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "fold-text-mrope: rewritten 2" in result.stdout
    model = onnx.load(out, load_external_data=False)
    assert model.ir_version <= 13
    gqa = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == 2 and all(a.i == 1 for n in gqa for a in n.attribute if a.name == "do_rotary")


def test_optimize_and_check_example_on_tiny_model():
    result = subprocess.run([sys.executable, str(REPO / "examples/optimize_and_check.py")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("equivalent")
