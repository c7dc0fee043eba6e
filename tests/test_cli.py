"""The CLI: bad input gives one line and a non-zero exit, never a traceback; optimize writes what it reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rope_passes.demo import build_tiny_decoder


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rope_passes", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_decoder(tmp_path_factory.mktemp("cli") / "tiny")


def bad_input(kind: str, tiny: Path, tmp: Path) -> tuple[list[str], str]:
    out = str(tmp / "out")
    if kind == "not_onnx":
        p = tmp / "notes.onnx"
        p.write_text("just text\n")
        return ["optimize", str(p), "-o", out], "not a readable ONNX model"
    if kind == "truncated":
        p = tmp / "cut.onnx"
        p.write_bytes((tiny / "model.onnx").read_bytes()[:500])
        return ["optimize", str(p), "-o", out], "not a readable ONNX model"
    if kind == "missing_data":
        d = tmp / "nodata"
        d.mkdir()
        (d / "model.onnx").write_bytes((tiny / "model.onnx").read_bytes())
        return ["optimize", str(d), "-o", out], "external data file 'model.onnx.data' is missing"
    if kind == "dir_without_model":
        d = tmp / "empty"
        d.mkdir()
        return ["optimize", str(d), "-o", out], "no .onnx model in this folder"
    if kind == "unwritable_output":
        ro = tmp / "readonly"
        ro.mkdir()
        ro.chmod(0o500)
        return ["optimize", str(tiny), "-o", str(ro / "sub")], "cannot create output folder"
    if kind == "output_is_a_file":
        f = tmp / "afile"
        f.write_text("x")
        return ["optimize", str(tiny), "-o", str(f / "m.onnx")], "cannot create output folder"
    if kind == "unknown_pass":
        return ["optimize", str(tiny), "-o", out, "--passes", "no-such-pass"], "unknown pass 'no-such-pass'"
    if kind == "no_output":
        return ["optimize", str(tiny)], "no output path given"
    if kind == "inspect_missing":
        return ["inspect", str(tmp / "missing.onnx")], "no such file or directory"
    if kind == "output_inside_input":
        return ["optimize", str(tiny), "-o", str(tiny / "sub")], "is inside the input folder"
    if kind == "empty_pass_list":
        return ["optimize", str(tiny), "-o", out, "--passes", "cleanup,,cleanup"], "none empty"
    if kind == "negative_max_positions":
        return ["optimize", str(tiny), "-o", out, "--max-positions", "-5"], "--max-positions must be a positive"
    if kind.startswith("check_"):
        args, expect = bad_input(kind[len("check_"):], tiny, tmp)
        return ["check", str(tiny), args[1], "--ep", "cpu", "--steps", "1"], expect
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["not_onnx", "truncated", "missing_data", "dir_without_model", "unwritable_output",
                                  "output_is_a_file", "unknown_pass", "no_output", "inspect_missing",
                                  "output_inside_input", "empty_pass_list", "negative_max_positions",
                                  "check_not_onnx", "check_truncated", "check_missing_data",
                                  "check_dir_without_model"])
def test_bad_input_one_line_error(kind, tiny, tmp_path):
    if kind == "unwritable_output" and os.geteuid() == 0:
        # root ignores directory permissions; a path under /proc is unwritable for everyone
        args, expect = ["optimize", str(tiny), "-o", "/proc/rope-passes-out"], "cannot create output folder"
    else:
        args, expect = bad_input(kind, tiny, tmp_path)
    before = sorted(p.name for p in tiny.iterdir())
    result = cli(*args)
    assert sorted(p.name for p in tiny.iterdir()) == before, "the input folder was touched"
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("Warning:")]
    assert len(lines) == 1 and lines[0].startswith("rope-passes: error: "), result.stderr
    assert expect in lines[0], lines[0]
    assert "Traceback" not in result.stderr + result.stdout


def test_optimize_dry_run_writes_nothing_and_reports(tiny, tmp_path):
    result = cli("optimize", str(tiny), "-o", str(tmp_path / "o"), "--dry-run", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["dry_run"] is True and not (tmp_path / "o").exists()
    assert [p["pass"] for p in report["passes"]][-1] == "cleanup"


def test_optimize_report_file_and_output(tiny, tmp_path):
    result = cli("optimize", str(tiny), "-o", str(tmp_path / "o"), "--report", str(tmp_path / "r.json"))
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["output"] == str(tmp_path / "o" / "model.onnx")
    assert (tmp_path / "o" / "tokenizer_config.json").is_file()
    for entry in report["passes"]:
        assert entry["status"], entry  # every pass says what it did or why not


@pytest.mark.corpus
def test_exporter_preset_with_max_positions(tmp_path):
    from conftest import TORCH

    src = TORCH / "tf5/dynamo/llama/decode.onnx"
    refused = cli("optimize", str(src), "-o", str(tmp_path / "a.onnx"), "--target", "exporter", "--json")
    assert refused.returncode == 0, refused.stderr
    first = json.loads(refused.stdout)["passes"][0]
    assert first["pass"] == "precompute-cos-sin" and first["rewritten"] == 0
    assert "max_positions" in first["status"], first["status"]
    done = cli("optimize", str(src), "-o", str(tmp_path / "b.onnx"), "--target", "exporter", "--max-positions", "256",
               "--json")
    assert done.returncode == 0, done.stderr
    first = json.loads(done.stdout)["passes"][0]
    assert first["rewritten"] >= 1 and first["nodes_removed"] > first["nodes_added"], first


def test_optimize_and_lint_a_tree_of_models(tiny, tmp_path):
    """A folder of model folders: each goes to the same relative path, one line each, a tally; a broken model is
    reported and the others still written (exit 2); lint walks the same tree."""
    import shutil

    tree = tmp_path / "tree"
    shutil.copytree(tiny, tree / "a")
    shutil.copytree(tiny, tree / "deep" / "b")
    (tree / "bad").mkdir()
    (tree / "bad" / "model.onnx").write_text("not a model\n")
    result = cli("optimize", str(tree), "-o", str(tmp_path / "out"), "--report", str(tmp_path / "r.json"))
    assert result.returncode == 2, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("[") or " models: " in ln]
    assert lines[0].startswith("[1/3] a: ") and lines[1].startswith("[2/3] bad: error: ")
    assert "not a readable ONNX model" in lines[1] and lines[2].startswith("[3/3] deep/b: ")
    assert lines[3] == "3 models: 0 rewritten, 2 unchanged, 1 failed"
    for rel in ("a", "deep/b"):
        assert (tmp_path / "out" / rel / "model.onnx").read_bytes() == (tiny / "model.onnx").read_bytes()
    assert not (tmp_path / "out" / "bad").exists()
    reports = json.loads((tmp_path / "r.json").read_text())
    assert [("error" in r) for r in reports] == [False, True, False]
    # output inside the input tree: refused before anything is written
    inside = cli("optimize", str(tree), "-o", str(tree / "out"))
    assert inside.returncode == 2 and "inside the input tree" in inside.stderr and not (tree / "out").exists()
    shutil.rmtree(tree / "bad")
    lint = cli("lint", str(tree), "--format", "json")
    assert lint.returncode in (0, 1), lint.stderr
    assert sorted(json.loads(lint.stdout)) == sorted([str(tree / "a"), str(tree / "deep" / "b")])


@pytest.mark.corpus
def test_optimize_explain_lists_every_attempt(tmp_path):
    """--explain prints each pass's status and every finding under it: here the two GQA layers of a 3D-position
    graph are each refused with the reason, and the passes with nothing to do say what they looked for."""
    from conftest import GENAI

    result = cli("optimize", str(GENAI / "legacy/qwen35/cpu_fp32"), "--dry-run", "--target", "webgpu-graph",
                 "--explain")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    start = lines.index(next(x for x in lines if x.startswith("fold-text-mrope: refused")))
    explained = lines[start:]
    refusals = [x for x in explained if x.startswith("  refused /model/layers.")]
    assert len(refusals) == 2 and all("--text-only" in x for x in refusals), explained
    for name in ("lower-mrope", "longrope-concat", "annotate-cache-offset", "total-seq-on-gpu", "cleanup"):
        assert any(x.startswith(f"{name}: ") for x in explained), name
    assert "  not matched <model>: no com.microsoft::MRotaryEmbedding node" in explained
    rewritten = [x for x in explained if x.startswith("  rewritten ")]
    assert len(rewritten) == 16 and any("from int32 sums of 'attention_mask'" in x for x in rewritten)
