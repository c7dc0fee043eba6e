"""What the summary says about files is what the bytes say (issue 32), and an output folder is replaced only by a new
output of the same input, told by content.

* ``optimize`` (folder output, file output, ``--in-place``, a folder of model folders) and ``lint --fix``: the
  ``files:`` line and the report's ``files`` name exactly the files of the output whose bytes differ from the
  input's, compared here file by file (the tiny demo model; corpus: legacy Qwen2.5-VL with ``--text-only``, whose
  genai_config.json the fold changes while the capture step has nothing to set);
* an existing output folder holding another model's output (same file names) is refused with one line and left as
  it was; an earlier output of the same input is replaced; so is one copied byte for byte; an output of the input
  before it was edited is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import GENAI

from rope_passes.cli import main
from rope_passes.demo import build_tiny_decoder


def cli(*args: str) -> subprocess.CompletedProcess:
    """``rope-passes ARGS`` in this process (a child's start-up would be most of each call), its output captured."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return subprocess.CompletedProcess(["rope-passes", *args], code, out.getvalue(), err.getvalue())


def digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def by_bytes(before: dict[str, str], after: dict[str, str]) -> dict[str, str]:
    """Each file of ``after`` against ``before``: changed, same or new; files of ``before`` gone: removed."""
    states = {n: "new" if n not in before else "same" if before[n] == h else "changed" for n, h in after.items()}
    return {**states, **{n: "removed" for n in before if n not in after}}


def files_line(stdout: str) -> str:
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip().startswith("files: ")]
    assert len(lines) == 1, stdout
    return lines[0].removeprefix("files: ")


def named(line: str, state: str) -> list[str]:
    """The files the ``files:`` line gives ``state`` (changed: "X, Y differ from the input"; new: "X is new")."""
    tail = {"changed": r" differs? from the input", "new": r" (?:is|are) new", "removed": " removed"}[state]
    for part in line.split("; "):
        m = re.fullmatch(rf"(.+?){tail}", part)
        if m:
            return sorted(m.group(1).split(", "))
    return []


def assert_told(line: str, report_files: dict[str, str], truth: dict[str, str]) -> None:
    """The report's states are the bytes' (every file), and the line names exactly the changed and new ones."""
    assert report_files == {n: s for n, s in truth.items() if n in report_files}, (report_files, truth)
    for state in ("changed", "new", "removed"):
        assert named(line, state) == sorted(n for n, s in truth.items() if s == state), (state, line, truth)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_decoder(tmp_path_factory.mktemp("files") / "tiny")


def test_folder_output_says_which_files_differ(tiny, tmp_path):
    out, report = tmp_path / "out", tmp_path / "r.json"
    done = cli("optimize", str(tiny), "-o", str(out), "--target", "webgpu-graph", "--report", str(report))
    assert done.returncode == 0, done.stderr
    truth = by_bytes(digest(tiny), digest(out))
    files = json.loads(report.read_text())["files"]
    assert set(files) == set(truth) - {n for n, s in truth.items() if s == "removed"}
    assert_told(files_line(done.stdout), files, truth)
    assert truth["model.onnx"] == "changed" and truth["genai_config.json"] == "changed"  # capture turned on
    assert truth["model.onnx.data"] == "same" and truth["tokenizer_config.json"] == "same"


def test_in_place_says_what_it_wrote(tiny, tmp_path):
    work = shutil.copytree(tiny, tmp_path / "w")
    before = digest(work)
    done = cli("optimize", str(work), "--in-place", "--target", "webgpu-graph")
    assert done.returncode == 0, done.stderr
    truth = by_bytes(before, digest(work))
    line = files_line(done.stdout)
    assert_told(line, {}, truth)
    assert named(line, "changed") == ["genai_config.json", "model.onnx"]  # what README's --in-place line says
    # again: nothing to do, nothing written, and it says so
    again = cli("optimize", str(work), "--in-place", "--target", "webgpu-graph")
    assert again.returncode == 0 and digest(work) == digest(work), again.stderr
    assert by_bytes(before, digest(work)) == truth
    assert files_line(again.stdout).startswith("nothing written"), again.stdout


def test_file_output_and_a_tree_say_which_files_differ(tiny, tmp_path):
    out = tmp_path / "single" / "m.onnx"
    done = cli("optimize", str(tiny / "model.onnx"), "-o", str(out), "--target", "webgpu-graph")
    assert done.returncode == 0, done.stderr
    line = files_line(done.stdout)
    # the data file renamed after the model: the input's bytes; genai_config.json beside it: capture turned on
    assert named(line, "changed") == ["genai_config.json", "m.onnx"] and "m.onnx.data" in line, line
    assert (tiny / "model.onnx.data").read_bytes() == (out.parent / "m.onnx.data").read_bytes()

    tree = tmp_path / "tree"
    shutil.copytree(tiny, tree / "a")
    shutil.copytree(tiny, tree / "b")
    done = cli("optimize", str(tree), "-o", str(tmp_path / "tree-out"), "--target", "webgpu-graph")
    assert done.returncode == 0, done.stderr
    truth = by_bytes(digest(tree / "a"), digest(tmp_path / "tree-out" / "a"))
    changed = ", ".join(n for n in ("model.onnx", "genai_config.json") if truth[n] == "changed")
    assert f"a: rewritten ({changed} not the input's bytes)" in done.stderr, done.stderr


def test_lint_fix_says_which_files_it_rewrote(tiny, tmp_path):
    work = shutil.copytree(tiny, tmp_path / "w")
    before = digest(work)
    done = cli("lint", "--fix", str(work))
    truth = by_bytes(before, digest(work))
    line = [ln for ln in done.stderr.splitlines() if ": files: " in ln]
    assert len(line) == 1, done.stderr
    assert_told(line[0].split(": files: ", 1)[1], {}, truth)
    assert truth["model.onnx"] == "changed", truth


@pytest.mark.corpus
@pytest.mark.parametrize("name", ["legacy/qwen25_vl/webgpu_fp16_graph", "legacy/qwen25_vl/cpu_fp32"])
def test_text_only_fold_says_genai_config_changed(name, tmp_path):
    """The fold drops position_ids from genai_config.json's inputs; capture was already on (webgpu_fp16_graph):
    the summary used to say 'genai_config.json unchanged'."""
    out, report = tmp_path / "out", tmp_path / "r.json"
    done = cli("optimize", str(GENAI / name), "-o", str(out), "--target", "webgpu-graph", "--text-only",
               "--report", str(report))
    assert done.returncode == 0, done.stderr
    truth = by_bytes(digest(GENAI / name), digest(out))
    assert truth["genai_config.json"] == "changed" and truth["model.onnx"] == "changed", truth
    assert_told(files_line(done.stdout), json.loads(report.read_text())["files"], truth)
    assert "genai_config.json unchanged" not in done.stdout


# ---------------------------------------------------------------------------------------------------------------
# the output folder rule: an earlier output of the same input, by content
# ---------------------------------------------------------------------------------------------------------------


def one_line_error(done: subprocess.CompletedProcess, expect: str) -> None:
    lines = [ln for ln in done.stderr.splitlines() if ln.strip() and not ln.startswith("Warning:")]
    assert done.returncode == 2 and len(lines) == 1 and expect in lines[0], done.stderr


def test_another_model_s_output_is_never_replaced(tiny, tmp_path):
    other = build_tiny_decoder(tmp_path / "other", {"seed": 8})  # same file names, other weights and graph
    out = tmp_path / "out"
    assert cli("optimize", str(other), "-o", str(out), "--target", "webgpu-graph").returncode == 0
    kept = digest(out)
    for preset in ("webgpu-graph", "webgpu"):
        done = cli("optimize", str(tiny), "-o", str(out), "--target", preset)
        one_line_error(done, "does not hold an earlier output of this input")
        assert digest(out) == kept
    # the same input's output is replaced, whatever the options
    assert cli("optimize", str(other), "-o", str(out), "--target", "webgpu").returncode == 0
    assert digest(out) != kept


def test_a_verbatim_copy_is_the_same_input_s_output(tiny, tmp_path):
    out = tmp_path / "out"
    done = cli("optimize", str(tiny), "-o", str(out), "--passes", "cleanup")
    assert done.returncode == 0 and "unchanged (input copied byte for byte)" in done.stdout, done.stdout
    assert digest(out) == digest(tiny)
    assert cli("optimize", str(tiny), "-o", str(out), "--target", "webgpu-graph").returncode == 0  # ours: replaced
    other = build_tiny_decoder(tmp_path / "other", {"seed": 9})
    one_line_error(cli("optimize", str(other), "-o", str(out), "--passes", "cleanup"), "earlier output")


def test_the_output_of_the_input_before_an_edit_is_not_replaced(tiny, tmp_path):
    work = shutil.copytree(tiny, tmp_path / "w")
    out = tmp_path / "out"
    assert cli("optimize", str(work), "-o", str(out), "--target", "webgpu-graph").returncode == 0
    config = json.loads((work / "genai_config.json").read_text())
    config["search"]["max_length"] = 64
    (work / "genai_config.json").write_text(json.dumps(config, indent=4))
    one_line_error(cli("optimize", str(work), "-o", str(out), "--target", "webgpu-graph"), "earlier output")


# ---------------------------------------------------------------------------------------------------------------
# refusals and findings report the real shapes
# ---------------------------------------------------------------------------------------------------------------


def test_a_table_s_width_is_its_tensor_s_not_a_stale_declaration(tiny, tmp_path):
    """A value_info declaring [128, 16] over the [128, 8] cos/sin tables (a stale exporter): lint said 'cos_cache has
    16 columns > head_size/2 = 8' (RP301) and a pass would read 16 too; the tensor is what onnxruntime feeds."""
    import onnx

    from rope_passes.io import load_bundle
    from rope_passes.lint import lint_bundle

    work = shutil.copytree(tiny, tmp_path / "w")
    model = onnx.load(work / "model.onnx", load_external_data=False)
    for name in ("cos_cache", "sin_cache"):
        model.graph.value_info.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [128, 16]))
    onnx.save(model, work / "model.onnx")
    bundle = load_bundle(work)
    assert list(bundle.model.graph.initializers["cos_cache"].shape) == [128, 8]
    assert not [d for d in lint_bundle(work) if d.code == "RP301"]


def test_a_constant_node_s_shape_is_its_tensor_s(tmp_path):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from rope_passes.io import load_model

    table = numpy_helper.from_array(np.zeros((4, 14), np.float32))
    graph = helper.make_graph([helper.make_node("Constant", [], ["t"], value=table),
                               helper.make_node("Identity", ["t"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 14])],
                              value_info=[helper.make_tensor_value_info("t", TensorProto.FLOAT, [4, 16])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10),
              tmp_path / "m.onnx")
    (node, _) = load_model(tmp_path / "m.onnx").graph
    assert list(node.outputs[0].shape) == [4, 14]
