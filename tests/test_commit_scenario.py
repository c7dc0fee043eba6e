"""What a user must commit (issue 25): the pre-commit hook, run by pre-commit itself in a real git repository, blocks
a commit that leaves a model's new data file unstaged; the commit made as its message says loads from a fresh clone.

The model: an exporter graph saved with external data (as large exports are), then ``optimize --in-place --target
exporter`` with a context long enough that its cos/sin tables (2 x 2 MiB) go into ``model.onnx.rope.data`` (small
tables go into ``model.onnx`` itself: no file to remember).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import FIXTURES, REPO

EXPORT = FIXTURES / "torch" / "tf5" / "hf_onnx" / "llama" / "decode.onnx"


def _git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid", "PRE_COMMIT_HOME": str(repo.parent / "pre-commit-home")}
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env)
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def _hook_config(repo: Path) -> None:
    """The project's hook (.pre-commit-hooks.yaml) as a local hook of the user's repository: the same entry (our
    console script), files pattern and arguments a user's config passes (docs/lint.md)."""
    hook = dict(line.strip().removeprefix("- ").split(": ", 1) for line in (REPO / ".pre-commit-hooks.yaml").read_text()
                .splitlines() if line.strip() and not line.startswith("#"))
    entry = shlex.split(hook["entry"])
    exe = Path(sys.executable).with_name(entry[0])
    (repo / ".pre-commit-config.yaml").write_text(
        "repos:\n- repo: local\n  hooks:\n"
        f"  - id: {hook['id']}\n    name: {hook['id']}\n    entry: {exe} {' '.join(entry[1:])}\n"
        f"    language: system\n    files: '{hook['files']}'\n    args: [--fail-on, error]\n")


def _outputs(path: Path) -> list[np.ndarray]:
    """One decode step on onnxruntime CPU: 3 new tokens at positions 5..7 after a past of 5."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    past, new = 5, 3
    feeds: dict[str, np.ndarray] = {"input_ids": np.array([[11, 42, 7]], np.int64),
                                    "attention_mask": np.ones((1, past + new), np.int64),
                                    "position_ids": np.arange(past, past + new, dtype=np.int64)[None]}
    rng = np.random.default_rng(0)
    for i in sess.get_inputs():
        if i.name not in feeds:  # past keys/values [batch, heads, past, head_size]
            feeds[i.name] = rng.standard_normal((1, i.shape[1], past, i.shape[3])).astype(np.float32)
    return sess.run(None, feeds)


@pytest.mark.corpus
def test_hook_blocks_the_unstaged_data_file_and_the_suggested_commit_loads(tmp_path):
    import pre_commit  # noqa: F401  (a test dependency: pyproject.toml [test])

    assert shutil.which("git"), "git is needed to test what a user commits"
    repo = tmp_path / "repo"
    (repo / "model").mkdir(parents=True)
    _git(repo, "init", "-q")
    model = onnx.load(EXPORT)
    onnx.save(model, repo / "model" / "model.onnx", save_as_external_data=True, location="model.onnx.data",
              size_threshold=1024)
    _hook_config(repo)
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "the export")
    done = subprocess.run([sys.executable, "-m", "pre_commit", "install"], cwd=repo, capture_output=True, text=True,
                          env={**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home")})
    assert done.returncode == 0, done.stdout + done.stderr

    # the user's step: precompute the tables in place, for a 32k context
    optimize = subprocess.run([str(Path(sys.executable).with_name("rope-passes")), "optimize",
                               str(repo / "model" / "model.onnx"), "--in-place", "--target", "exporter",
                               "--max-positions", "32768"], capture_output=True, text=True)
    assert optimize.returncode == 0, optimize.stdout + optimize.stderr
    extra = repo / "model" / "model.onnx.rope.data"
    assert extra.is_file() and extra.stat().st_size >= 2 << 20, "the 32k tables go into the second data file"
    expected = _outputs(repo / "model" / "model.onnx")

    # staged as a user would: the model, not the new file; the hook blocks the commit and says what to add
    _git(repo, "add", "model/model.onnx")
    blocked = _git(repo, "commit", "-m", "precomputed tables", check=False)
    assert blocked.returncode != 0, blocked.stdout + blocked.stderr
    said = blocked.stdout + blocked.stderr
    assert "RP006" in said and "model.onnx.rope.data" in said, said
    command = re.search(r"`(git add [^`]+)`", said)
    assert command is not None, said
    _git(repo, *shlex.split(command.group(1))[1:])
    _git(repo, "commit", "-q", "-m", "precomputed tables")

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True, capture_output=True)
    for a, b in zip(_outputs(clone / "model" / "model.onnx"), expected, strict=True):
        np.testing.assert_array_equal(a, b)  # the same files: bit-identical


def test_hook_blocks_a_commit_that_only_changes_genai_config(tmp_path):
    """Issue 32: a commit that changes only genai_config.json (an offset no layer reads: RP208, an error) runs the
    hook on the model that config belongs to and is blocked; the commit of the model as it was passes."""
    import json

    import pre_commit  # noqa: F401  (a test dependency: pyproject.toml [test])

    from rope_passes.demo import build_tiny_decoder

    assert shutil.which("git"), "git is needed to test what a user commits"
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    build_tiny_decoder(repo / "tiny")
    _hook_config(repo)
    _git(repo, "add", ".")
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home")}
    done = subprocess.run([sys.executable, "-m", "pre_commit", "install"], cwd=repo, capture_output=True, text=True,
                          env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    first = _git(repo, "commit", "-m", "the model", check=False)  # warnings only (RP201, RP205): --fail-on error
    assert first.returncode == 0, first.stdout + first.stderr
    assert "rope-passes-lint" in first.stdout + first.stderr and "Passed" in first.stdout + first.stderr

    path = repo / "tiny" / "genai_config.json"
    config = json.loads(path.read_text())
    config["model"]["decoder"]["session_options"]["provider_options"] = [
        {"webgpu": {"multiRotaryCacheConcatOffset": "64"}}]
    path.write_text(json.dumps(config, indent=4))
    _git(repo, "add", "tiny/genai_config.json")
    blocked = _git(repo, "commit", "-m", "an offset", check=False)
    said = blocked.stdout + blocked.stderr
    assert blocked.returncode != 0, said
    assert "RP208" in said and "multiRotaryCacheConcatOffset=64" in said, said
    assert _git(repo, "log", "--oneline").stdout.count("\n") == 1, "the blocked commit was not made"
