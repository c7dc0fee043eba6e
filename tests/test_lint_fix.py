"""``lint --fix`` on every genai corpus folder (issue 32): it applies every fix ``optimize`` applies with the same
options (``--text-only`` folds the 3-D mRoPE), settles in one run (a second ``--fix`` leaves every byte as it was),
and says which files it rewrote, by bytes.

One ``optimize --preset webgpu-graph`` per folder, with the same options (``--text-only`` or not), is the reference:
a finding ``lint --fix`` leaves must be one ``optimize`` leaves too (a pass that refused there refuses here; RP204 is
a note neither can fix).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from _utils import copy_folder
from conftest import GENAI, genai_models

from rope_passes.api import optimize
from rope_passes.lint import fix_bundle, lint_bundle
from rope_passes.plan import lint_plan

pytestmark = pytest.mark.corpus


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.parametrize("text_only", [True, False], ids=["text-only", "all-positions"])
@pytest.mark.parametrize("name", genai_models())
def test_fix_is_optimize_s_fixes_and_settles_in_one_run(name, text_only, tmp_path):
    options = {"text_only": True} if text_only else {}
    plan = lint_plan(fix=True, options=options)
    work = copy_folder(GENAI / name, tmp_path / "m")
    before = digest(work)
    said: list[str] = []
    fix_bundle(str(work), plan, log=said.append)
    first = digest(work)
    # the files line names exactly the files whose bytes changed
    changed = sorted(n for n in first if first[n] != before.get(n))
    files_lines = [s for s in said if ": files: " in s]
    if changed:
        assert len(files_lines) == 1, said
        line = files_lines[0].split(": files: ", 1)[1]
        named = line.split(" differ")[0] if " differ" in line else ""
        assert sorted(named.split(", ")) == changed, (line, changed)
    else:
        assert not files_lines, said
    assert set(first) == set(before), "lint --fix adds no file to a corpus folder (its tables are small)"

    again: list[str] = []
    fix_bundle(str(work), plan, log=again.append)
    assert digest(work) == first, ("a second lint --fix changed the model", again)
    assert not [s for s in again if ": files: " in s], again

    optimize(GENAI / name, tmp_path / "opt", preset="webgpu-graph", options=options)
    left = {d.code for d in lint_bundle(work, plan)}
    left_by_optimize = {d.code for d in lint_bundle(tmp_path / "opt", plan)}
    # what optimize fixes, lint --fix fixes: its passes' findings, and enableGraphCapture (RP221, RP222)
    assert left <= left_by_optimize, (left - left_by_optimize, said)
    if text_only:
        assert "RP103" not in left, "--text-only folds the 3-D mRoPE"


def test_fix_without_text_only_keeps_the_3d_mrope_and_says_what_folds_it(tmp_path):
    name = "legacy/qwen25_vl/cpu_fp32"
    work = copy_folder(GENAI / name, tmp_path / "m")
    fix_bundle(str(work), lint_plan(fix=True), log=lambda m: None)
    rp103 = [d for d in lint_bundle(work) if d.code == "RP103"]
    assert rp103 and rp103[0].fix_command == "fold-text-mrope --text-only", rp103


def test_fix_with_a_preset_runs_only_that_preset_s_passes(tmp_path):
    """``lint --fix --preset webgpu``: the findings' passes that preset has (lower-mrope), not the graph preset's
    (total-seq-on-gpu, narrow-int64): RP201 stays."""
    from rope_passes.cli import main

    work = copy_folder(GENAI / "current/qwen25_vl/cpu_fp32", tmp_path / "m")
    assert main(["lint", "--fix", "--preset", "webgpu", "--select", "RP101,RP201", str(work)]) == 1
    assert {d.code for d in lint_bundle(work)} & {"RP101", "RP201"} == {"RP201"}
