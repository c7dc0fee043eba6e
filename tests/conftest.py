"""Shared test fixtures: the read-only corpora beside the checkout (../shared), as CI has them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("ROPE_PASSES_SHARED", REPO.parent / "shared"))
GENAI = SHARED / "corpus" / "genai"
TORCH = SHARED / "corpus" / "torch"
#: graphs generated for this project (committed; tests/fixtures/README.md says how): builder 0.18 families and
#: options beyond the shared corpus, and torch exporters beyond its two
FIXTURES = REPO / "tests" / "fixtures"


def genai_models() -> list[str]:
    """Relative folder names of the genai corpus models, e.g. 'current/llama/cpu_fp32' (19 of them)."""
    if not GENAI.is_dir():
        return []
    return sorted(str(p.parent.relative_to(GENAI)) for p in GENAI.glob("*/*/*/model.onnx"))


#: Graphs onnxruntime-webgpu 1.27 cannot load at all (per the corpus README): no session on any EP.
UNLOADABLE = {
    "current/qwen3/webgpu_fp16": "GQA with 16 inputs (q/k-norm fused) is outside 1.27's [7,14]",
    "current/qwen25_vl/cpu_fp32": "MRotaryEmbedding is not registered in 1.27",
    "current/qwen25_vl/webgpu_fp16": "MRotaryEmbedding is not registered in 1.27",
    "current/qwen25_vl/webgpu_int4_graph": "MRotaryEmbedding is not registered in 1.27",
    "current/qwen35/webgpu_fp16_graph": "MRotaryEmbedding is not registered in 1.27",
    "current/qwen35/webgpu_fp32": "MRotaryEmbedding is not registered in 1.27",
}


@pytest.fixture(scope="session")
def genai_corpus() -> Path:
    if not GENAI.is_dir():
        pytest.fail(f"the shared corpus is missing: {GENAI} (CI clones ../shared beside the checkout)")
    return GENAI
