"""Lint rules about the model as a file: nodes that break their schema (RP005), data files git does not have (RP006).

Neither reads the runtime: RP005 judges each node against the ONNX schema at the model's own opset imports
(:func:`rope_passes.proofs.validity.schema_errors`, the same check every pass's validity contract makes on the nodes
it adds); RP006 asks git which of the external data files a model references it tracks or has staged.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from rope_passes.io.load import external_tensors
from rope_passes.lint.core import LintContext, Severity, rule
from rope_passes.proofs.validity import schema_errors

Found = Iterator[tuple[str, str]]


@rule("RP005", "schema-invalid", Severity.ERROR,
      "a node breaks its operator's schema at the model's own opset: the graph does not load",
      """Every node of the default ONNX domain is checked against its schema at the opset the model imports
      (onnx.checker.check_node): the op exists at that version, its input and output counts are in range, its
      attributes are known and typed right. ReduceSum takes its axes as an input from opset 13 on and as an attribute
      before; ReduceMax/Min/Mean/... moved at 18: a node in the other form fails to load on every runtime ("has input
      size 2 not in range [min=1, max=1]"). onnxruntime's contrib ops are judged by RP003/RP004. Every rope-passes
      pass builds its nodes for the model's opset and is rolled back if its output would break this.""")
def schema_invalid(ctx: LintContext) -> Found:
    for problem in schema_errors(ctx.model):
        yield problem.where, problem.reason


def _in_git(folder: Path) -> bool:
    try:
        done = subprocess.run(["git", "-C", str(folder), "rev-parse", "--is-inside-work-tree"], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):  # no git here: nothing to say about what it tracks
        return False
    return done.returncode == 0 and done.stdout.strip() == "true"


def untracked_files(folder: Path, names: list[str]) -> list[str]:
    """The ``names`` (paths relative to ``folder``) that the git repository ``folder`` is in neither tracks nor has
    staged; empty when ``folder`` is not in a git work tree (or git is not installed)."""
    if not names or not _in_git(folder):
        return []
    try:
        done = subprocess.run(["git", "-C", str(folder), "ls-files", "--cached", "-z", "--", *names],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return []
    if done.returncode != 0:
        return []
    known = {os.path.normpath(p) for p in done.stdout.split("\0") if p}
    return [n for n in names if os.path.normpath(n) not in known]


@rule("RP006", "data-file-untracked", Severity.ERROR,
      "the model references an external data file that git neither tracks nor has staged",
      """A model in a git work tree whose weights (or the tables a pass wrote, model.onnx.rope.data) live in a file
      git does not have: a commit of the model alone passes every check in the working tree, and a fresh clone cannot
      load it ('external data file ... is missing'). The message names the file and the `git add` to run. rope-passes
      writes small new tables into model.onnx itself (under 1 MiB each, 8 MiB in all), so `lint --fix` and
      `optimize --in-place` add a file only for larger ones.""")
def data_file_untracked(ctx: LintContext) -> Found:
    model_path = Path(ctx.path)
    folder = model_path.parent
    names = sorted({str(t.location) for t in external_tensors(ctx.model)})
    for name in untracked_files(folder, names):
        path = os.path.relpath(folder / name)
        yield "<model>", (f"{model_path.name} reads its tensors from {name!r}, which git neither tracks nor has "
                          f"staged: a clone will not load the model; run `git add {path}`")
