"""``check``'s exit codes and verdict lines say what happened (issue 19).

0 only when outputs were compared and agree (``equivalent``), or the rotation tables were, and the verdict then says
so (``equivalent (rotation tables only: the original runs nowhere here)``, in the text and the JSON); 1 only when a
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
    rope_passes.optimize(src, out, target="webgpu-graph")
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
    rope_passes.optimize(src, out, target="webgpu-graph", options={"text_only": True}, weights="copy")
    report = check(src, out, fallback_python=None, isolate=False, sweep=0, schedules=[], steps=1)
    assert report.verdict == EQUIVALENT_TABLES_ONLY and report.exit_code == 0 and report.equivalent
    assert json.loads(report.to_json())["verdict"] == "equivalent (rotation tables only: the original runs nowhere here)"
