"""The real-size bench, CI-sized: every piece runs and says what it should (bench/realsize.py, bench/run_all).

``realsize.smoke()`` builds every model at 2 layers (real widths, sparse zero weights, a 256-row context); optimize
in each ``--weights`` mode, lint and inspect run on them (in this process: no interpreter start per command) and
the outputs load with the sizes each mode promises; ``bench/run_all --quick`` (1 layer) prints every row of its
table, the dense model's too.
Budget (2 cores): < 60 s.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from _utils import realsize
from conftest import GENAI, REPO

from rope_passes.cli import main
from rope_passes.io import load_model

pytestmark = pytest.mark.corpus  # bench/realsize.py scales the corpus's tiny builder graphs




@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> dict[str, Path]:
    return realsize().smoke(tmp_path_factory.mktemp("realsize"), layers=2, context=256)


def _tensor_bytes(model_path: Path) -> int:
    m = onnx.load(str(model_path), load_external_data=False)
    return sum(int(next(e.value for e in t.external_data if e.key == "length")) for t in m.graph.initializer
               if t.data_location == onnx.TensorProto.EXTERNAL)


def test_every_model_builds_at_real_width(smoke):
    rs = realsize()
    assert set(smoke) == set(rs.MODELS)
    for name, folder in smoke.items():
        cfg = rs.CONFIGS[rs.MODELS[name].config]
        gc = json.loads((folder / "genai_config.json").read_text())["model"]
        assert gc["decoder"]["num_hidden_layers"] == 2 and gc["decoder"]["hidden_size"] == cfg.hidden, name
        data = folder / "model.onnx.data"
        assert data.stat().st_size == _tensor_bytes(folder / "model.onnx")  # every tensor at its real byte size
        assert rs.disk_usage(folder) < 64e6 < data.stat().st_size  # sparse: real widths, (almost) no blocks
        per_layer = 2 * cfg.hidden * (cfg.q_size + 2 * cfg.kv_size) + 2 * cfg.q_size * cfg.hidden  # fp16 q,k,v,o
        if rs.MODELS[name].int4:  # 4 bits a weight and an fp16 scale per 32 of them: 4.5 / 16 of fp16
            per_layer = per_layer * 9 // 32
        assert data.stat().st_size > 2 * per_layer, name


def test_the_3b_config_is_qwen25_vl_3b():
    cfg = realsize().CONFIGS["qwen25vl-3b"]
    assert (cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.head, cfg.inter, cfg.vocab, cfg.context) == (
        2048, 36, 16, 2, 128, 11008, 151936, 128000)


@pytest.mark.parametrize("mode", ["reflink", "copy", "link"])
def test_optimize_each_weights_mode_keeps_the_data(smoke, tmp_path, mode):
    src = smoke["qwen25vl-7b-legacy"]
    out = tmp_path / mode
    assert main(["optimize", str(src), "-o", str(out), "--target", "webgpu-graph", "--text-only", "--weights", mode,
                 "--json"]) == 0
    load_model(out / "model.onnx")  # loads, every external reference in range
    assert (out / "model.onnx").stat().st_size < 1e6  # the graph only
    a, b = (src / "model.onnx.data").stat(), (out / "model.onnx.data").stat()
    assert b.st_size == a.st_size
    if mode == "link":
        assert (b.st_ino, b.st_nlink) == (a.st_ino, 2)
        # while the link lives, onnx_ir refuses to read either name's tensors ("multiple hard links"): drop it so
        # the module's other tests can read the source
        shutil.rmtree(out)
    else:
        assert b.st_ino != a.st_ino
        assert b.st_blocks * 512 < 64e6  # a sparse input stays sparse (cp, copy_file_range skip the holes)


def test_optimize_rewrite_writes_one_data_file(tmp_path):
    """--weights rewrite re-serializes every tensor (dense): on a small config, not the real width."""
    rs = realsize()
    small = dataclasses.replace(rs.CONFIGS["qwen25vl-7b"], hidden=256, heads=2, kv_heads=1, inter=512, vocab=1000,
                                context=512)
    src = rs.build("qwen25vl-7b-legacy", tmp_path / "src", layers=2, config=small, corpus=GENAI)
    out = tmp_path / "rewrite"
    assert main(["optimize", str(src), "-o", str(out), "--target", "webgpu-graph", "--text-only", "--weights",
                 "rewrite", "--json"]) == 0
    load_model(out / "model.onnx")
    assert not (out / "model.onnx.rope.data").exists()
    assert (out / "model.onnx.data").stat().st_size >= _tensor_bytes(out / "model.onnx") > 0


def test_lint_and_inspect_run_on_every_model(smoke, capsys):
    for name, folder in smoke.items():
        assert main(["lint", str(folder)]) in (0, 1), name  # 1 = findings
        assert main(["inspect", str(folder)]) == 0, name
    capsys.readouterr()


def test_run_all_prints_every_row(tmp_path):
    env = dict(os.environ, ROPE_PASSES_CORPUS=str(GENAI))
    done = subprocess.run([sys.executable, str(REPO / "bench" / "run_all"), "--quick", "--quick-layers", "1",
                           "--only", "qwen25vl-3b-legacy", "--no-slope", "--no-decode", "--dense-limit", "0",
                           "--startup-repeat", "1",
                           "--work", str(tmp_path / "work"), "--json", str(tmp_path / "out.json")],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "out.json").read_text())
    status = {r["command"]: r["status"] for r in result["rows"] if r["model"] == "qwen25vl-3b-legacy"}
    assert set(status) == {"cp", "floor", "opt-webgpu", "opt-reflink", "opt-copy", "opt-link", "opt-rewrite", "lint",
                           "inspect", "onnxscript-nosave", "onnxscript"}
    assert status["opt-rewrite"] == status["onnxscript"] == "skip(budget)"  # dense rows past --dense-limit
    assert all(s == "ok" for c, s in status.items() if c not in ("opt-rewrite", "onnxscript")), status
    assert "targets (issue 14" in done.stdout and "opt-link" in done.stdout
    startup = {r["command"]: r["status"] for r in result["rows"] if r["model"] == "startup"}
    assert startup == {"startup-floor": "ok", "startup-rope": "ok"} and "opt-link past start-up" in done.stdout
    cli = {r["command"]: r for r in result["rows"] if r["model"] == "cli-startup"}  # CPU seconds of start-up
    assert {c: r["status"] for c, r in cli.items()} == dict.fromkeys(
        ["python", "import-sympy", "import-onnx_ir", "help", "usage-error", "lint-small", "inspect-small"], "ok")
    assert cli["lint-small"]["cpu_s"] > cli["help"]["cpu_s"] >= 0  # read from /usr/bin/time, not left at 0
    assert "start-up targets (issue 17" in done.stdout and "floor: import onnx_ir" in done.stdout
    dense = {r["command"]: r["status"] for r in result["rows"] if r["model"] == "qwen25vl-3b-legacy(dense)"}
    assert dense == dict.fromkeys(["cp", "floor", "opt-reflink", "opt-copy", "opt-link", "opt-rewrite"], "ok")
    assert result["models"]["qwen25vl-3b-legacy(dense)"]["disk_bytes"] >= result["models"][
        "qwen25vl-3b-legacy(dense)"]["apparent_bytes"]  # every block allocated
