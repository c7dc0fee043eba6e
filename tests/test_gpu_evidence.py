"""bench/gpu.sh, the GPU evidence script of issue 31, at its tiny plan on the CPU adapter (what CI can run).

It must run green where a GPU is not (lavapipe here), write its tables in the format docs/performance.md shows,
and give the same greedy tokens from the original (capture off) and the rewritten folder (capture on) in
onnxruntime-genai's loop. Timings are not asserted (bench/, not tests). Budget (2 cores): ~60 s.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys

import pytest
from _utils import bench_module
from conftest import GENAI, REPO


@pytest.mark.corpus
@pytest.mark.webgpu
def test_gpu_script_runs_at_tiny_size_and_writes_its_tables(tmp_path):
    ev = bench_module("gpu_evidence")
    out = tmp_path / "out"
    env = dict(os.environ, ROPE_PASSES_WEBGPU_PYTHON=sys.executable, ROPE_PASSES_CORPUS=str(GENAI),
               ROPE_PASSES_GPU_WORK=str(tmp_path / "work"))
    done = subprocess.run([str(REPO / "bench" / "gpu.sh"), "--tiny", "--out", str(out)], capture_output=True,
                          text=True, timeout=600, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert {p.name for p in out.iterdir()} >= {"gpu-evidence.md", "gpu-evidence.json", "gpu-evidence.csv", "gpu.log"}
    result = json.loads((out / "gpu-evidence.json").read_text())
    plan = ev.PLANS["tiny"]
    assert result["plan"] == "tiny" and not result["skipped"] and result["copy_gb_s"] > 0
    loops = [r for r in result["genai"] if r.get("context")]
    assert {(r["model"], r["context"]) for r in loops} >= {(m, c) for m in plan.models for c in plan.contexts}
    assert all(r["same_tokens"] is True and r["rewritten"]["decode_tok_s"] > 0 for r in loops), loops
    real = [r for r in loops if "real weights" in r["model"]]
    assert {r["model"].split()[2] for r in real} == set(ev.REAL_TOKENS)  # "tiny corpus <rel> (real weights)"
    phi3 = [r for r in real if "phi3" in r["model"]]  # its tiny build switches to the long factors at 32
    assert phi3 and all(r["context"] < 32 < r["context"] + r["new"] for r in phi3), phi3
    assert [r["graph"] for r in result["cost"]][0] == "original" and len(result["cost"]) >= 3
    assert {r["model"] for r in result["floor"]} == set(plan.models)
    assert all(r["weight_bytes"] > 0 and r["floor_ms"] > 0 for r in result["floor"])
    md = (out / "gpu-evidence.md").read_text()
    assert md == ev.render(result)
    for header in (ev.GENAI_HEADER, ev.COST_HEADER, ev.FLOOR_HEADER):
        assert header in md.splitlines()
    with open(out / "gpu-evidence.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and list(rows[0]) == ev.CSV_FIELDS and len(rows) == 2 * len(loops)


def test_performance_doc_shows_the_scripts_tables():
    """docs/performance.md's GPU-evidence tables are the script's own output: the block between the markers is
    ``gpu_evidence.py --render`` of the JSON committed beside the doc, and has the script's headers."""
    ev = bench_module("gpu_evidence")
    doc = (REPO / "docs" / "performance.md").read_text()
    block = re.search(r"<!-- gpu-evidence: (\S+) -->\n```\n(.*?)```\n<!-- /gpu-evidence -->", doc, re.S)
    assert block, "docs/performance.md has no gpu-evidence block"
    source = REPO / "docs" / block.group(1)
    assert block.group(2) == ev.render(json.loads(source.read_text()))
    for header in (ev.GENAI_HEADER, ev.COST_HEADER, ev.FLOOR_HEADER):
        assert header in block.group(2).splitlines()


def test_the_gpu_plan_is_runnable_as_written():
    """The real plan (only a GPU session runs it): its models exist, in fp16 and int4, with their fp16 twins; the
    rewrite cost is measured on models it builds; Phi-3 crosses its LongRoPE switch while decoding at one prompt."""
    ev, rs = bench_module("gpu_evidence"), bench_module("realsize")
    gpu = ev.PLANS["gpu"]
    assert set(gpu.models) <= set(rs.MODELS) and set(gpu.per_pass) <= set(gpu.models) and not gpu.tiny
    assert {rs.MODELS[m].int4 for m in gpu.models} == {True, False}
    assert all(rs.FP16_OF[m] in gpu.models for m in gpu.models if rs.MODELS[m].int4)
    switch = rs.CONFIGS["phi3-mini-128k"].original_context
    assert any(c < switch < c + gpu.new for c in gpu.contexts), (switch, gpu.contexts)
    assert max(gpu.contexts) + gpu.new <= min(rs.CONFIGS[rs.MODELS[m].config].context for m in gpu.models)
