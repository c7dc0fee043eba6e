"""Output fit for where it goes (issue 17): what the CLI prints is what a terminal, a log, CI or a user needs.

* ``check`` draws progress only on a terminal; a pipe or a log gets it only with ``--progress``;
* ``lint --format github``: one annotation per finding, naming the node, at the ``.onnx`` file (not the folder);
* ``lint --fix`` leaves ``genai_config.json`` byte-identical when nothing in it changes;
* a Git LFS pointer in place of a model or its weights is named as one (one line, exit 2);
* ``optimize``'s table does not cut the reason a pass gives.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rope_passes.cli import main
from rope_passes.demo import build_tiny_decoder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_decoder(tmp_path_factory.mktemp("fit") / "tiny")


# ---------------------------------------------------------------- check: progress


def _progress_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("[") and " s] " in ln]


def test_check_prints_no_progress_into_a_pipe(tiny, capsys):
    """stderr captured (not a terminal): the verdict on stdout, no progress lines on stderr."""
    args = ["check", str(tiny), str(tiny), "--ep", "cpu", "--in-process", "--steps", "1", "--no-sweep"]
    assert main(args) in (0, 1)  # it ran (the verdict is other tests' business)
    captured = capsys.readouterr()
    assert "equivalent (exit " in captured.out
    assert _progress_lines(captured.err) == [], captured.err


def test_check_progress_flag_prints_lines_into_a_pipe(tiny, capsys):
    args = ["check", str(tiny), str(tiny), "--ep", "cpu", "--in-process", "--steps", "1", "--no-sweep", "--progress"]
    assert main(args) in (0, 1)
    lines = _progress_lines(capsys.readouterr().err)
    assert any(ln.endswith("original@cpu: started") for ln in lines), lines
    assert any(ln.endswith("rewritten@cpu: 2/2") for ln in lines), lines


# ---------------------------------------------------------------- lint --format github


def test_lint_github_annotations_name_the_node_and_the_onnx_file(tiny, capsys):
    """The tiny decoder has RP201 at both layers' GroupQueryAttention: two annotations GitHub tells apart, each on
    the folder's model.onnx (GitHub annotates files, not folders)."""
    assert main(["lint", "--format", "github", "--select", "RP201", str(tiny)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and len(set(lines)) == 2, lines
    for layer, line in enumerate(lines):
        head, _, message = line.partition("::")[2].partition("::")
        assert head == f"warning file={tiny / 'model.onnx'},title=RP201 total-seq-from-shape", line
        assert message.startswith(f"/model/layers.{layer}/attn/GroupQueryAttention: "), line


def test_lint_sarif_locations_are_the_onnx_file(tiny, capsys):
    import json

    assert main(["lint", "--format", "sarif", "--select", "RP201", str(tiny)]) == 1
    results = json.loads(capsys.readouterr().out)["runs"][0]["results"]
    assert [r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in results] == [
        str(tiny / "model.onnx")] * 2
    assert [r["locations"][0]["logicalLocations"][0]["name"] for r in results] == [
        f"/model/layers.{k}/attn/GroupQueryAttention" for k in (0, 1)]


def test_github_properties_are_escaped():
    from rope_passes.lint.core import Diagnostic, Severity
    from rope_passes.lint.formats import as_github

    line = as_github({"a,b:c.onnx": [Diagnostic("RP999", Severity.ERROR, "50% done\nnext", "n,1")]})
    assert line == "::error file=a%2Cb%3Ac.onnx,title=RP999::n,1: 50%25 done%0Anext"


# ---------------------------------------------------------------- lint --fix: genai_config.json


def test_lint_fix_leaves_an_unchanged_genai_config_byte_identical(tiny, tmp_path, capsys):
    """total-seq-on-gpu and narrow-int64 rewrite the graph, not the config: the user's own formatting (2-space
    indent, no final newline) stays, byte for byte."""
    import json
    import shutil

    work = tmp_path / "m"
    shutil.copytree(tiny, work)
    config = work / "genai_config.json"
    config.write_text(json.dumps(json.loads(config.read_text()), indent=2))
    before, graph_before = config.read_bytes(), (work / "model.onnx").read_bytes()
    assert main(["lint", "--fix", str(work)]) in (0, 1), capsys.readouterr()  # 1: what no fix removes
    assert (work / "model.onnx").read_bytes() != graph_before  # the fix did rewrite the model
    assert config.read_bytes() == before


def test_optimize_to_a_folder_carries_an_unchanged_genai_config_as_it_is(tiny, tmp_path):
    import json
    import shutil

    from rope_passes.api import optimize

    work = tmp_path / "m"
    shutil.copytree(tiny, work)
    config = work / "genai_config.json"
    config.write_text(json.dumps(json.loads(config.read_text()), indent=2))
    report = optimize(str(work), str(tmp_path / "out"), passes=["total-seq-on-gpu", "cleanup"])
    assert report.modified
    assert (tmp_path / "out" / "genai_config.json").read_bytes() == config.read_bytes()


# ---------------------------------------------------------------- Git LFS pointers

LFS_POINTER = ("version https://git-lfs.github.com/spec/v1\n"
               "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
               "size 12345678\n")


@pytest.mark.parametrize("replaced", ["model.onnx.data", "model.onnx"])
@pytest.mark.parametrize("command", [["inspect"], ["lint"], ["optimize", "--dry-run"]])
def test_a_git_lfs_pointer_is_named_as_one(tiny, tmp_path, capsys, replaced, command):
    import shutil

    work = tmp_path / "clone"
    shutil.copytree(tiny, work)
    (work / replaced).write_text(LFS_POINTER)
    assert main([command[0], str(work), *command[1:]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rope-passes: error: "), err
    assert f"{work / replaced}: " in err and "looks like a Git LFS pointer" in err and "run `git lfs pull`" in err
    assert "12,345,678 bytes" in err


def test_a_small_data_file_that_is_no_pointer_is_still_truncated(tiny, tmp_path, capsys):
    import shutil

    work = tmp_path / "cut"
    shutil.copytree(tiny, work)
    (work / "model.onnx.data").write_bytes(b"version 1\n")
    assert main(["inspect", str(work)]) == 2
    err = capsys.readouterr().err
    assert "is truncated" in err and "LFS" not in err, err


# ---------------------------------------------------------------- optimize: the table keeps the reason


def test_optimize_table_keeps_the_whole_reason():
    from rich.console import Console

    from rope_passes.cli.optimize_cmd import render
    from rope_passes.plan import make_plan
    from rope_passes.report import PassReport, PipelineReport

    reason = ("no GroupQueryAttention reads total_sequence_length from Shape(attention_mask) here: the builder's "
              "graph variant computes it from the mask on the GPU already, so there is nothing to move [1, 3]")
    p = PassReport("total-seq-on-gpu")
    p.not_matched("<model>", reason)
    console = Console(width=100, record=True, file=open(__import__("os").devnull, "w"))  # noqa: SIM115
    render(PipelineReport("in.onnx", None, "webgpu-graph", passes=[p]), console, make_plan("webgpu-graph"))
    text = console.export_text()
    status = " ".join(cells[-2].strip() for line in text.splitlines() if len(cells := line.split("│")) > 2)
    assert f"not matched: {reason}" in " ".join(status.split()), text
