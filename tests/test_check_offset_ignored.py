"""check says when a configured LongRoPE cache offset is ignored (separate Q/K/V), even when both sides agree.

Builder 0.18 with enable_webgpu_graph=true fuse_qkv=false writes the concatenated [short; long] cache and
multiRotaryCacheConcatOffset, but onnxruntime applies the offset to packed QKV only: comparing such a model with a
copy of itself is "equivalent" (both equally wrong), so the report must say what is wrong with both.
"""

from __future__ import annotations

import shutil

import pytest
from conftest import FIXTURES

from rope_passes.check import check

pytestmark = [pytest.mark.corpus, pytest.mark.webgpu]
#: the warnings are the check plan's (read from both graphs and configs): a short decode, no sweep, no schedules
SHORT = {"prefill": 4, "steps": 2, "sweep": 0, "schedules": [], "isolate": False, "calls": False}


@pytest.mark.parametrize("variant", ["phi3_mini_128k/webgpu_fp32_graph_nofuseqkv", "phi4_mini/webgpu_fp16_graph_nofuseqkv"])
def test_offset_ignored_is_reported_for_input_and_copy(variant, tmp_path):
    src = FIXTURES / "genai" / variant
    copy = tmp_path / "copy"
    shutil.copytree(src, copy)
    report = check(src, copy, **SHORT)
    warnings = [n for n in report.notes if "IS IGNORED" in n.upper() and "multiRotaryCacheConcatOffset" in n]
    assert len(warnings) == 2, report.notes  # the original and the copy
    assert all("separate Q/K/V" in w and "RP206" in w for w in warnings)


def test_packed_model_gets_no_such_warning(tmp_path):
    from conftest import GENAI

    src = GENAI / "current/phi3_mini_128k/webgpu_fp16_graph"  # packed QKV: the offset applies
    copy = tmp_path / "copy"
    shutil.copytree(src, copy)
    report = check(src, copy, **SHORT)
    assert not any("IGNORED" in n for n in report.notes), report.notes
