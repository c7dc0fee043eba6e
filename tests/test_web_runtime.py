"""The browser runtime (``check --runtime web``): onnxruntime-web on WebGPU in headless Chromium (SwiftShader on a
machine without a GPU), set up by scripts/setup-web-runtime.sh. One browser for the whole module (started by the
first test that needs it, stopped at the end): its start and the wasm compile are most of a short check's cost.

These tests fail, never skip, when the browser runtime is not set up.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from conftest import GENAI
from onnx import TensorProto, helper, numpy_helper, save

from rope_passes.check.core import check, interpreter
from rope_passes.check.report import EQUIVALENT, NOT_EQUIVALENT
from rope_passes.cli import main
from rope_passes.errors import UsageError
from rope_passes.io import load_bundle, save_bundle
from rope_passes.runtime import web
from rope_passes.runtimes import WEB
from rope_passes.runtimes.choose import runtime_of

#: a builder folder WebGPU runs in the browser: fp32 (SwiftShader has no shader-f16, so an fp16 graph cannot run)
MODEL = "current/llama/cpu_fp32"
#: a short check: 3 decode steps (1 captured, 2 replays), 2 sweep positions (the table's last two rows), no schedules;
#: the CPU runs in this process (the WebGPU runs are in the browser whatever isolate says)
QUICK = {"steps": 3, "sweep": 2, "schedules": [], "isolate": False}


@pytest.fixture(scope="module")
def browser():
    why = web.missing()
    assert why is None, f"the browser runtime is not set up: {why} (these tests never skip)"
    yield web.browser()
    web.shutdown()


@pytest.fixture(scope="module")
def optimized(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("web") / "opt"
    assert main(["optimize", str(GENAI / MODEL), "-o", str(out), "--target", "webgpu-graph", "--text-only"]) == 0
    return out


def _row_changed(src: Path, dst: Path, row: int) -> Path:
    """A copy of ``src`` with cos row ``row`` off by 0.25."""
    bundle = load_bundle(src)
    value = bundle.model.graph.initializers["cos_cache"]
    table = value.const_value.numpy().copy()
    table[row] += 0.25
    value.const_value = ir.tensor(table, name="cos_cache")
    save_bundle(bundle, dst)
    return dst


def test_web_runtime_is_named_and_refused_without_its_setup(monkeypatch, tmp_path):
    """Each missing piece is named with the command that sets it up, whatever else is there (a fresh clone has no
    .web-runtime/node_modules: the fast test loop runs this without the browser set-up)."""
    import shutil

    from rope_passes.runtime.web import WEB_RUNTIME_ENV

    assert runtime_of("web").name == runtime_of("onnxruntime-web").name == WEB
    monkeypatch.setenv(WEB_RUNTIME_ENV, str(tmp_path / "nothing"))
    if shutil.which("node") is None:
        with pytest.raises(UsageError, match="browser runtime is not set up.*no node"):
            interpreter(WEB)
        return
    with pytest.raises(UsageError, match="browser runtime is not set up.*onnxruntime-web is missing: run "
                                         "scripts/setup-web-runtime.sh"):
        interpreter(WEB)
    for package in ("onnxruntime-web", "playwright-core"):  # the packages there, no chromium
        (tmp_path / "nothing" / "node_modules" / package).mkdir(parents=True)
        (tmp_path / "nothing" / "node_modules" / package / "package.json").write_text("{}")
    monkeypatch.setenv("ROPE_PASSES_CHROMIUM", "/nonexistent/chromium")
    with pytest.raises(UsageError, match="browser runtime is not set up.*no chromium at /nonexistent/chromium"):
        interpreter(WEB)


@pytest.mark.corpus
@pytest.mark.webgpu
def test_check_in_the_browser_is_equivalent_with_capture(browser, optimized):
    report = check(GENAI / MODEL, optimized, runtime="web", graph_capture=True, **QUICK)
    assert report.verdict == EQUIVALENT, report.reason
    runs = {r.label: r for r in report.runs}
    for label in ("original@webgpu", "rewritten@webgpu", "rewritten@webgpu+capture"):
        assert runs[label].ok and runs[label].runtime.startswith("onnxruntime-web 1.30.0"), runs[label].to_dict()
    assert runs["original@cpu"].runtime.startswith("onnxruntime 1."), runs["original@cpu"].runtime
    # the captured run is the decode loop users copy (examples/web_decode_loop.mjs, imported by the page)
    # (a captured check decodes on to total CAPTURE_TOTAL: report.steps, not QUICK's 3)
    assert any(f"steps 2..{report.steps} replayed" in n and n.startswith("examples/web_decode_loop.mjs")
               for n in runs["rewritten@webgpu+capture"].notes)
    by = {c.name: c for c in report.comparisons}
    # fp32: the browser's WebGPU within 1e-4 of onnxruntime's CPU EP (measured: <= 5e-6), every decode step and both
    # sweep positions; the captured run replays the plain one to float rounding (measured: 0)
    for name in ("rewritten@webgpu vs original@cpu", "sweep: rewritten@webgpu vs original@cpu"):
        diffs = by[name].diffs
        assert diffs and all(d.ok for d in diffs) and max(d.max_abs for d in diffs) < 1e-4, name
    assert {d.step for d in by["sweep: rewritten@webgpu vs original@cpu"].diffs} == {254, 255}
    captured = by["rewritten@webgpu+capture vs rewritten@webgpu"].diffs
    assert {d.step for d in captured} == set(range(report.steps + 1)) and max(d.max_abs for d in captured) <= 1e-6


@pytest.mark.corpus
@pytest.mark.webgpu
def test_check_in_the_browser_catches_a_changed_cos_row(browser, optimized, tmp_path):
    # the table's last row: read by the sweep's last position only, so it is the browser's session that must see it
    # (the rotation-table comparison, which would find it without a session, is off)
    bad = _row_changed(optimized, tmp_path / "bad", 255)
    report = check(GENAI / MODEL, bad, runtime="web", tables=False, steps=1, sweep=2, schedules=[], isolate=False)
    assert report.verdict == NOT_EQUIVALENT
    by = {c.name: c for c in report.comparisons}
    plain = by["rewritten@webgpu vs original@webgpu"].diffs
    assert plain and all(d.ok for d in plain)  # the decode (positions 0..8) reads no changed row
    sweep = by["sweep: rewritten@webgpu vs original@webgpu"].diffs
    assert {d.step for d in sweep if not d.ok} == {255}
    assert max(d.max_abs for d in sweep if d.step == 255 and d.output == "logits") > 1e-3


def _add_model(path: Path) -> Path:
    """y = Add(x, w), x and y float32 [4], w = [0, 1, 2, 3]: the capture defect's repro graph (docs/runtimes.md)."""
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "add",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                              [numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    save(model, str(path))
    return path


def _captured_runs(browser, model: Path, own_buffers: bool) -> list[str | list[float]]:
    browser.reload()  # a fresh page: what earlier sessions left in it changes what a stale handle finds
    session = web.WebSession(browser, model, "webgpu", graph_capture=True)
    browser.call("gpuAlloc", {"buffers": [{"key": k, "dtype": "float32", "dims": [4]} for k in ("x", "y")],
                              "allocators": None if own_buffers else browser.allocators()})
    out: list[str | list[float]] = []
    try:
        for k in range(3):  # run 0 captures, runs 1 and 2 replay
            try:
                _, got = browser.exchange("runBound", {"session": session.id, "inputs": {"x": "x"},
                                                       "outputs": {"y": "y"}, "read": ["y"]},
                                          {"x": np.full(4, 10.0 * k, np.float32)})
                out.append(got["y"].tolist())
            except web.WebError as exc:
                out.append(str(exc))
    finally:
        browser.call("gpuFree", {})
        session.release()
    return out


@pytest.mark.webgpu
def test_capture_replays_on_onnxruntimes_own_buffers(browser, tmp_path):
    # the route around the defect that check's captured runs take: every bound buffer is onnxruntime's own
    runs = _captured_runs(browser, _add_model(tmp_path / "add.onnx"), own_buffers=False)
    assert runs == [[0, 1, 2, 3], [10, 11, 12, 13], [20, 21, 22, 23]]


@pytest.mark.webgpu
def test_capture_defect_on_page_buffers_still_there(browser, tmp_path):
    # onnxruntime-web 1.30's native WebGPU bundle releases a page buffer's handle when the run that captured it ends,
    # so the first replay fails (docs/runtimes.md). When this test fails, onnxruntime-web has fixed it: re-probe,
    # update the table and the docs, and the own-buffer route may go.
    runs = _captured_runs(browser, _add_model(tmp_path / "add.onnx"), own_buffers=True)
    assert runs[0] == [0, 1, 2, 3]
    assert runs[1] == runs[2] == ("TypeError: Cannot set properties of undefined "
                                  "(setting 'Symbol(gpuBufferMetadata)')")


@pytest.mark.corpus
@pytest.mark.webgpu
def test_fold_is_left_out_for_the_browser_where_it_is_not_exact(browser, tmp_path):
    """onnxruntime-web 1.30's GroupQueryAttention with do_rotary=1 rotates a left-padded row's tokens at other
    positions than the explicit mRoPE rotation it replaces: the fold made for onnxruntime-webgpu differs in the
    browser on a left-padded batch; ``optimize --runtime onnxruntime-web`` leaves it out
    (:data:`rope_passes.runtimes.probed.INEXACT_PASSES`), and that output is equivalent there."""
    from rope_passes.check.schedules import LEFT, Schedule

    src = GENAI / "legacy/qwen35/cpu_fp32_text"
    batch = Schedule("left-padded", (7, 1, 4), ((5, 9, 17, 30, 41, 2, 7, 11, 13), (3, 8, 19), (4, 6, 8, 10, 12, 14)),
                     LEFT, then=(1, 1))
    options = {"steps": 1, "sweep": 0, "schedules": [batch], "isolate": False, "tables": False}
    for_python, for_browser = tmp_path / "python", tmp_path / "browser"
    assert main(["optimize", str(src), "-o", str(for_python), "--target", "webgpu-graph"]) == 0
    assert main(["optimize", str(src), "-o", str(for_browser), "--target", "webgpu-graph",
                 "--runtime", "onnxruntime-web"]) == 0
    folded = check(src, for_python, runtime="web", **options)
    assert folded.verdict == NOT_EQUIVALENT, folded.reason
    failing = [c for c in folded.comparisons if c.counts and c.status == "compared" and not c.ok]
    assert failing and all(c.kind == "schedule" and c.actual == "rewritten@webgpu" for c in failing)
    kept = check(src, for_browser, runtime="web", **options)
    assert kept.verdict == EQUIVALENT, kept.reason
