"""onnxruntime-genai's own generate loop on ``optimize --target webgpu-graph`` outputs, unedited (issue 19).

It needs ``onnxruntime_genai`` in the test venv: scripts/setup.sh installs ``onnxruntime-genai==0.18.*`` with
``--no-deps`` (onnxruntime-webgpu stays the ``onnxruntime`` module). Each folder's greedy tokens (a 6-token prompt: lavapipe's WebGPU
GroupQueryAttention prefill is wrong past 8 query rows, docs webgpu-on-cpu trap 7; then 40 new tokens, past
phi3's LongRoPE switch at 32) from the rewritten folder as optimize wrote it (genai_config.json's
``enableGraphCapture`` "1": onnxruntime-genai captures the decode; a session it cannot capture fails at creation) are
compared with the original's: on CPU for fp32 builds, on WebGPU without capture for fp16 builds (fp16 WebGPU vs CPU
greedy tokens part after ~13 tokens on the tiny corpus models, the EP's own rounding; and a concatenated LongRoPE
cache is wrong on CPU past its offset, RP204). Measured 2026-11-25 on onnxruntime-webgpu 1.27.0 + onnxruntime-genai
0.18.0, lavapipe: all equal.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _utils import bench_module
from conftest import GENAI

import rope_passes

pytestmark = [pytest.mark.corpus, pytest.mark.webgpu]

#: folder -> how the original runs as the reference ("cpu", or "webgpu0": its WebGPU options, capture off)
CASES = {
    "current/llama/cpu_fp32": "cpu",
    "current/qwen3/cpu_fp32": "cpu",
    "current/phi3_mini_128k/cpu_fp32": "cpu",
    "current/phi3_mini_128k/webgpu_fp32": "cpu",
    "legacy/qwen35/cpu_fp32_text": "cpu",
    "current/llama/webgpu_fp16": "webgpu0",
    "current/llama/webgpu_fp16_graph": "webgpu0",
    "current/phi3_mini_128k/webgpu_fp16_graph": "webgpu0",
}
PROMPT, NEW = 6, 40


def generate(folder: Path, mode: str) -> list[int]:
    """Greedy tokens from onnxruntime-genai's loop (bench/genai_loop.py) in a child process."""
    return bench_module("genai_loop").run_child(folder, mode, [PROMPT], NEW)["runs"][0]["tokens"]


@pytest.mark.parametrize("rel", sorted(CASES))
def test_unedited_output_generates_with_capture_like_the_original(rel, tmp_path):
    text = {"text_only": True} if "qwen" in rel else None
    out = tmp_path / "out"
    report = rope_passes.optimize(GENAI / rel, out, preset="webgpu-graph", options=text, weights="copy")
    assert report.capture is not None and report.capture["state"] == "ready", report.capture
    config = json.loads((out / "genai_config.json").read_text())
    webgpu = {k: v for e in config["model"]["decoder"]["session_options"]["provider_options"]
              for k, v in e.get("webgpu", {}).items()}
    assert webgpu.get("enableGraphCapture") == "1"
    reference = generate(GENAI / rel, CASES[rel])
    assert len(reference) == PROMPT + NEW
    assert generate(out, "config") == reference


def test_capture_on_for_a_graph_that_needs_memcpy_fails_at_session_creation(tmp_path):
    """The judge behind lint RP221: onnxruntime-genai refuses a capture config on a graph with Memcpy."""
    import shutil

    folder = tmp_path / "llama"
    shutil.copytree(GENAI / "current/llama/cpu_fp32", folder)
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["decoder"]["session_options"]["provider_options"] = [
        {"webgpu": {"enableGraphCapture": "1", "validationMode": "disabled"}}]
    (folder / "genai_config.json").write_text(json.dumps(config))
    with pytest.raises(RuntimeError, match="cannot use the graph capture feature"):
        generate(folder, "config")
