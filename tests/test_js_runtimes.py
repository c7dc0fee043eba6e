"""The JavaScript runtimes beside the browser (docs/runtimes.md, "onnxruntime-node" and "fp16 on the browser's code
path"): ``check --runtime onnxruntime-node`` (onnxruntime-node's own WebGPU EP) and ``check --runtime web`` on a float16
graph, which runs onnxruntime-web's bundle on Dawn for Node (the ``webgpu`` npm package, lavapipe here: it has
``shader-f16``) when Chromium's adapter lacks it. Both are backends of the checker's one run loop, named by their
runtime descriptors (rope_passes/runtimes/descriptors.py).

The corpus tests pick one small model each: the browser's kernels on lavapipe take about a minute for the first
prompt step of an fp16 graph (shader compilation), and each further schedule seconds, so these run the decode and two
sweep positions, no caller schedules.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from conftest import GENAI
from onnx import TensorProto, helper

from rope_passes.check.backends.web import computes_in_fp16, host_for
from rope_passes.check.core import check, interpreter
from rope_passes.check.report import EQUIVALENT, NOT_EQUIVALENT
from rope_passes.cli import RUNTIMES, TABLE_RUNTIMES, main
from rope_passes.errors import UsageError
from rope_passes.io import load_bundle, save_bundle
from rope_passes.runtime import web
from rope_passes.runtimes import DESCRIPTORS, WEB, descriptor
from rope_passes.runtimes.choose import CHOICES, runtime_of

REPO = Path(__file__).resolve().parents[1]
NODE = "onnxruntime-node"
#: the short check of these tests: 2 decode steps, the table's last two rows, no caller schedules; CPU runs here
QUICK = {"steps": 2, "sweep": 2, "schedules": [], "isolate": False, "calls": False}


def _row_changed(src: Path, dst: Path, row: int) -> Path:
    """A copy of ``src`` with cos row ``row`` off by 0.25 (read only by the sweep's last position)."""
    bundle = load_bundle(src)
    value = bundle.model.graph.initializers["cos_cache"]
    table = value.const_value.numpy().copy()
    table[row] += np.asarray(0.25, table.dtype)
    value.const_value = ir.tensor(table, name="cos_cache")
    save_bundle(bundle, dst)
    return dst


def _caught_on_webgpu(report) -> None:
    """The changed row (255) is found by the runtime's own session: its sweep differs from the original's on the
    same runtime at position 255 only (the decode reads no changed row)."""
    assert report.verdict == NOT_EQUIVALENT, report.reason
    by = {c.name: c for c in report.comparisons}
    plain = by["rewritten@webgpu vs original@webgpu"].diffs
    assert plain and all(d.ok for d in plain)
    sweep = by["sweep: rewritten@webgpu vs original@webgpu"].diffs
    assert {d.step for d in sweep if not d.ok} == {255}
    assert max(d.max_abs for d in sweep if d.step == 255 and d.output == "logits") > 1e-3


# ---------------------------------------------------------------------------------------------- no runtime needed


def test_every_runtime_is_one_descriptor_read_by_the_cli_and_the_checker():
    names = [r.name for r in DESCRIPTORS]
    assert len(names) == len(set(names)) and {WEB, NODE} <= set(names)
    assert set(CHOICES) == {n for r in DESCRIPTORS for n in (r.name, *r.aliases)} | {"all"}
    assert tuple(RUNTIMES) == tuple(r.name for r in DESCRIPTORS if r.python is not None)
    assert set(TABLE_RUNTIMES) == {r.name for r in DESCRIPTORS if r.table}
    for r in DESCRIPTORS:
        module = importlib.import_module(r.backend)  # every backend module has the three names the checker reads
        assert isinstance(module.WHAT, str) and callable(module.missing) and callable(module.backend), r.backend
        assert runtime_of(r.name).name == r.name and all(runtime_of(a).name == r.name for a in r.aliases)
        assert (REPO / "rope_passes" / "runtime_tables" / f"{r.name}.json").is_file() == r.table, r.name
    assert descriptor("web") is descriptor(WEB) and descriptor("nothing") is None


def test_onnxruntime_node_is_refused_without_its_setup(monkeypatch, tmp_path):
    """Its missing piece is named with the command that sets it up: the package, then its native binary (an install
    script that did not run, or a package without its Linux binary)."""
    import shutil

    monkeypatch.setenv(web.WEB_RUNTIME_ENV, str(tmp_path / "nothing"))
    if shutil.which("node") is None:
        with pytest.raises(UsageError, match="onnxruntime-node runtime is not set up here.*no node"):
            interpreter(NODE)
        return
    with pytest.raises(UsageError, match="onnxruntime-node runtime is not set up here.*onnxruntime-node is missing: "
                                         "run scripts/setup-web-runtime.sh"):
        interpreter(NODE)
    package = tmp_path / "nothing" / "node_modules" / "onnxruntime-node"
    package.mkdir(parents=True)
    (package / "package.json").write_text("{}")
    with pytest.raises(UsageError, match="onnxruntime_binding.node is missing: run scripts/setup-web-runtime.sh"):
        interpreter(NODE)


def _add(path: Path, dtype: int) -> str:
    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", dtype, [4])],
                              [helper.make_tensor_value_info("y", dtype, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    path.write_bytes(model.SerializeToString())
    return str(path)


class _Chromium:
    def __init__(self, f16: bool) -> None:
        self.has_f16 = f16


def test_a_float16_graph_goes_to_dawn_only_where_chromium_lacks_shader_f16(tmp_path):
    from rope_passes.check.spec import RunSpec

    fp16, fp32 = _add(tmp_path / "h.onnx", TensorProto.FLOAT16), _add(tmp_path / "f.onnx", TensorProto.FLOAT)
    assert computes_in_fp16(fp16) and not computes_in_fp16(fp32)
    spec = RunSpec("rewritten@webgpu", fp16, "webgpu", 1, 0)
    assert host_for(spec, _Chromium(f16=False)) == "dawn"
    assert host_for(spec, _Chromium(f16=True)) is None  # a GPU adapter with the feature: the browser itself
    assert host_for(RunSpec("rewritten@webgpu", fp32, "webgpu", 1, 0), _Chromium(f16=False)) is None


def test_the_js_runtime_table_of_the_docs_is_the_probes():
    p = subprocess.run([sys.executable, str(REPO / "tools" / "js_runtime_table.py"), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


# ------------------------------------------------------------------------------------------ on the runtimes


@pytest.fixture(scope="module")
def hosts():
    for host in ("dawn", "onnxruntime-node"):
        why = web.missing(host)
        assert why is None, f"the {host} host is not set up: {why} (these tests never skip)"
    yield
    web.shutdown()


def _optimized(tmp_path: Path, model: str, *extra: str) -> Path:
    out = tmp_path / "opt"
    assert main(["optimize", str(GENAI / model), "-o", str(out), "--target", "webgpu-graph", *extra]) == 0
    return out


@pytest.mark.corpus
@pytest.mark.webgpu
@pytest.mark.parametrize("model", ["current/llama/cpu_fp32", "current/llama/webgpu_fp16"])
def test_check_on_onnxruntime_node_is_equivalent_and_catches_a_changed_cos_row(hosts, tmp_path, model):
    optimized = _optimized(tmp_path, model)
    report = check(GENAI / model, optimized, runtime=NODE, **QUICK)
    assert report.verdict == EQUIVALENT, report.reason
    runs = {r.label: r for r in report.runs}
    for label in ("original@webgpu", "rewritten@webgpu"):
        assert runs[label].ok and runs[label].runtime.startswith("onnxruntime-node 1.30.0"), runs[label].to_dict()
    assert runs["original@cpu"].runtime.startswith("onnxruntime 1."), runs["original@cpu"].runtime
    by = {c.name: c for c in report.comparisons}
    # fp32: onnxruntime-node's WebGPU within 1e-4 of onnxruntime's CPU EP; fp16: within the checker's fp16 tolerance
    diffs = by["sweep: rewritten@webgpu vs original@cpu"].diffs
    assert {d.step for d in diffs} == {254, 255} and all(d.ok for d in diffs)
    if "fp32" in model:
        assert max(d.max_abs for d in by["rewritten@webgpu vs original@cpu"].diffs) < 1e-4
    bad = _row_changed(optimized, tmp_path / "bad", 255)
    report = check(GENAI / model, bad, runtime=NODE, tables=False, **QUICK)
    _caught_on_webgpu(report)


@pytest.mark.corpus
@pytest.mark.webgpu
def test_check_web_judges_a_float16_graph_with_the_browsers_kernels_on_dawn(hosts, tmp_path):
    model = "current/llama/webgpu_fp16"
    optimized = _optimized(tmp_path, model, "--runtime", "onnxruntime-web")
    report = check(GENAI / model, optimized, runtime="web", **QUICK)
    assert report.verdict == EQUIVALENT, report.reason
    runs = {r.label: r for r in report.runs}
    for label in ("original@webgpu", "rewritten@webgpu"):
        run = runs[label]
        assert run.ok and "wasm (webgpu bundle) on Dawn for Node" in run.runtime, run.to_dict()
        assert any("the browser's kernels, not the browser" in n for n in run.notes), run.notes
        assert any("shader-f16" in n and "no shader-f16" not in n.split("WebGPU adapter:")[-1] for n in run.notes)
    assert "on Dawn for Node" in report.runtime_label
    bad = _row_changed(optimized, tmp_path / "bad", 255)
    report = check(GENAI / model, bad, runtime="web", tables=False, **QUICK)
    _caught_on_webgpu(report)
