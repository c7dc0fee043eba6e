"""Nothing lost on disk (issue 11): what optimize / save_bundle leave behind when writing goes wrong, is interrupted,
or lands somewhere that already holds files; and how the weights travel (issue 14)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from rope_passes.cli import main
from rope_passes.demo import build_tiny_decoder
from rope_passes.errors import ModelSaveError
from rope_passes.io import load_bundle, save_bundle
from rope_passes.io.load import external_tensors


def cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rope_passes", *args], capture_output=True, text=True, timeout=300,
                          **kw)


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("Warning:")]


def one_line_error(code: int, stderr: str, expect: str) -> None:
    lines = error_lines(stderr)
    assert code == 2, (code, stderr)
    assert len(lines) == 1 and lines[0].startswith("rope-passes: error: ") and expect in lines[0], stderr
    assert "Traceback" not in stderr


def staging_left(root: Path) -> list[Path]:
    return [p for p in root.rglob(".rope-passes-*")]


@pytest.fixture(scope="module")
def tiny_src(tmp_path_factory) -> Path:
    return build_tiny_decoder(tmp_path_factory.mktemp("disk") / "tiny")


@pytest.fixture()
def tiny(tiny_src, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_src, tmp_path / "tiny"))


def changed_bundle(path: Path):
    """The bundle with a weight changed and the config edited: a re-serialized output that differs everywhere."""
    bundle = load_bundle(path)
    value = bundle.model.graph.initializers["model.embed_tokens.weight"]
    value.const_value = ir.Tensor(value.const_value.numpy() + 1.0, name=value.name)
    bundle.genai_config.data["model"]["note"] = "changed"
    return bundle


# ---------------------------------------------------------------------------------------------------------------
# 1. a single-file output never overwrites the genai_config.json of the folder it lands in
# ---------------------------------------------------------------------------------------------------------------


def test_file_output_keeps_the_other_folders_genai_config(tiny, tmp_path):
    other = Path(shutil.copytree(tiny, tmp_path / "other"))
    config = json.loads((other / "genai_config.json").read_text())
    config["search"] = {"max_length": 7}
    (other / "genai_config.json").write_text(json.dumps(config))
    before = (other / "genai_config.json").read_bytes()
    # --target webgpu: the passes leave this model's config as it is (webgpu-graph turns capture on in it: refused
    # below, as any config change for a file output is)
    result = cli("optimize", str(tiny / "model.onnx"), "-o", str(other / "opt.onnx"), "--target", "webgpu")
    assert result.returncode == 0, result.stderr
    assert (other / "opt.onnx").is_file()
    assert (other / "genai_config.json").read_bytes() == before, "another model's genai_config.json overwritten"
    # the passes changed the config this model needs: refused (one line), nothing written, the other config kept
    with pytest.raises(ModelSaveError, match="genai_config.json"):
        save_bundle(changed_bundle(tiny / "model.onnx"), other / "opt2.onnx")
    assert (other / "genai_config.json").read_bytes() == before and not (other / "opt2.onnx").exists()
    # beside the input itself: the input's config is never rewritten either
    src_config = (tiny / "genai_config.json").read_bytes()
    with pytest.raises(ModelSaveError, match="genai_config.json"):
        save_bundle(changed_bundle(tiny / "model.onnx"), tiny / "opt.onnx")
    assert (tiny / "genai_config.json").read_bytes() == src_config and not (tiny / "opt.onnx").exists()


# ---------------------------------------------------------------------------------------------------------------
# 2. the multi-file commit is atomic: a failed rename rolls back
# ---------------------------------------------------------------------------------------------------------------


def failing_replace(monkeypatch, fail_at: int) -> list:
    """os.replace that fails on the ``fail_at``-th rename between a staging folder and its target (renames inside a
    staging folder, e.g. onnx_ir's own temporary data file, are not counted)."""
    real = os.replace
    calls: list = []

    def replace(src, dst, *a, **kw):
        inside = [".rope-passes-" in str(p) for p in (src, dst)]
        if inside[0] != inside[1]:
            calls.append((src, dst))
            if len(calls) == fail_at:
                raise OSError(errno.EIO, "Input/output error (injected)")
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(os, "replace", replace)
    return calls


@pytest.mark.parametrize("case", ["in_place", "existing_output_folder", "file_output"])
@pytest.mark.parametrize("fail_at", [1, 2, 3, 4, 5])
def test_commit_is_all_or_nothing(case, fail_at, tiny, tmp_path, monkeypatch):
    if case == "in_place":
        where, output, kw = tiny, None, {"in_place": True}
    elif case == "existing_output_folder":
        where = output = tmp_path / "out"
        save_bundle(load_bundle(tiny), output, unchanged=True)  # an earlier output of the same model
        kw = {}
    else:
        where, output = tmp_path / "single", tmp_path / "single" / "m.onnx"
        save_bundle(load_bundle(tiny / "model.onnx"), output)
        kw = {}
    before = digest(where)
    bundle = changed_bundle(tiny if case != "file_output" else tiny / "model.onnx")
    if case == "file_output":
        del bundle.genai_config.data["model"]["note"]  # a file output keeps the config beside it (test 1)
    calls = failing_replace(monkeypatch, fail_at)
    try:
        save_bundle(bundle, output, **kw)
    except ModelSaveError as exc:
        assert "\n" not in str(exc)
        assert digest(where) == before, f"half-written after a failed rename #{fail_at}: {calls}"
    else:
        assert len(calls) < fail_at, "a failed rename went unreported"
        assert digest(where) != before
        monkeypatch.undo()
        again = load_bundle(where if case != "file_output" else output)
        assert np.array_equal(again.model.graph.initializers["model.embed_tokens.weight"].const_value.numpy(),
                              bundle.model.graph.initializers["model.embed_tokens.weight"].const_value.numpy())
    assert not staging_left(tmp_path)


# ---------------------------------------------------------------------------------------------------------------
# 3. --in-place keeps the file mode and refuses read-only files
# ---------------------------------------------------------------------------------------------------------------


def test_in_place_keeps_file_mode(tiny):
    for name in ("model.onnx", "genai_config.json"):
        (tiny / name).chmod(0o640)
    save_bundle(changed_bundle(tiny), None, in_place=True)
    for name in ("model.onnx", "genai_config.json"):
        assert stat.S_IMODE((tiny / name).stat().st_mode) == 0o640, name
    assert load_bundle(tiny).genai_config.data["model"]["note"] == "changed"


def test_in_place_refuses_read_only_files(tiny):
    (tiny / "model.onnx").chmod(0o444)
    before = digest(tiny)
    result = cli("optimize", str(tiny), "--in-place", "--target", "webgpu-graph")
    one_line_error(result.returncode, result.stderr, "read-only")
    assert digest(tiny) == before and stat.S_IMODE((tiny / "model.onnx").stat().st_mode) == 0o444


# ---------------------------------------------------------------------------------------------------------------
# 4. an existing output folder: a foreign one is refused, an earlier output of ours is replaced whole
# ---------------------------------------------------------------------------------------------------------------


def test_existing_output_folder(tiny, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    result = cli("optimize", str(tiny), "-o", str(out))
    one_line_error(result.returncode, result.stderr, "notes.txt")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    # an earlier output of this model (here with a second data file the new one does not write): replaced whole
    (out / "notes.txt").unlink()
    assert cli("optimize", str(tiny), "-o", str(out)).returncode == 0
    (out / "model.onnx.rope.data").write_bytes(b"stale")
    result = cli("optimize", str(tiny), "-o", str(out), "--target", "webgpu-graph", "--weights", "rewrite")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in tiny.iterdir()), "stale files mixed in"
    # an empty folder is fine
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli("optimize", str(tiny), "-o", str(empty)).returncode == 0
    assert digest(empty) == digest(tiny)


# ---------------------------------------------------------------------------------------------------------------
# 5. a full disk leaves no empty output folder
# ---------------------------------------------------------------------------------------------------------------


def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("writer", ["serialize", "copy"])
@pytest.mark.parametrize("output", ["new/deeper/out", "new/deeper/m.onnx"])
def test_full_disk_leaves_nothing(writer, output, tiny, tmp_path, monkeypatch, capsys):
    if writer == "serialize":  # the graph file (onnx_ir.save writes through onnx.save too)
        monkeypatch.setattr(onnx, "save", no_space)
        extra = ["--target", "webgpu-graph"]
    else:  # an unchanged model is copied
        from rope_passes.io import disk

        monkeypatch.setattr(disk, "_reflink", lambda src_fd, dst_fd: False)  # a filesystem with clones: copy anyway
        monkeypatch.setattr(disk, "_copy_bytes", no_space)
        extra = []
    source = tiny if output.endswith("out") else tiny / "model.onnx"
    code = main(["optimize", str(source), "-o", str(tmp_path / output), *extra])
    one_line_error(code, capsys.readouterr().err, "No space left on device")
    assert not (tmp_path / "new").exists(), "output folders left behind"
    assert not staging_left(tmp_path)


# ---------------------------------------------------------------------------------------------------------------
# 6. a killed run's staging folder is cleaned by the next run
# ---------------------------------------------------------------------------------------------------------------


def test_stale_staging_is_cleaned(tiny, tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f".rope-passes-{dead.pid}-abc123"
    (stale / "sub").mkdir(parents=True)
    (stale / "sub" / "model.onnx.data").write_bytes(b"x" * 1000)
    legacy = tmp_path / ".rope-passes-k2j3h4"  # an older version's name: no pid in it
    legacy.mkdir()
    old = time.time() - 3600
    os.utime(legacy, (old, old))
    alive = tmp_path / f".rope-passes-{os.getpid()}-live"  # a run in progress (this process): left alone
    alive.mkdir()
    result = cli("optimize", str(tiny), "-o", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert not stale.exists() and not legacy.exists() and alive.exists()
    # the same inside a folder written in place and beside a file output
    stale_in = tiny / f".rope-passes-{dead.pid}-inplace"
    stale_in.mkdir()
    assert cli("optimize", str(tiny), "--in-place", "--target", "webgpu-graph").returncode == 0
    assert not stale_in.exists()
    alive.rmdir()


def test_killed_run_is_cleaned_up_by_the_next(tiny, tmp_path):
    for delay in (1.0, 2.5):
        proc = subprocess.Popen([sys.executable, "-m", "rope_passes", "optimize", str(tiny), "-o",
                                 str(tmp_path / "out"), "--target", "webgpu-graph"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.kill()
        proc.wait()
        if (tmp_path / "out").exists():  # it finished: start over
            shutil.rmtree(tmp_path / "out")
    result = cli("optimize", str(tiny), "-o", str(tmp_path / "out"), "--target", "webgpu-graph")
    assert result.returncode == 0, result.stderr
    assert not staging_left(tmp_path)


# ---------------------------------------------------------------------------------------------------------------
# 7. Ctrl-C at any moment: exit 130, one line, no traceback, nothing half-written
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.corpus
@pytest.mark.parametrize("command,moment", [("optimize", 0.5), ("tree", 0.5), ("tree", "[2/"), ("lint", 0.5)])
def test_ctrl_c(command, moment, genai_corpus, tmp_path):
    """SIGINT during start-up (imports), the passes, or a save: exit 130 and one line; what was written is complete
    (a tree of models: the models before the signal), no staging folder is left. ``moment`` is seconds after the
    start, or the progress line to wait for (a tree of three copies of the corpus: the signal comes mid-tree on any
    machine, never after the work is done)."""
    model = genai_corpus / "current/phi3_mini_128k/webgpu_fp32"
    tree = tmp_path / "tree"
    if command == "tree" and isinstance(moment, str):
        for copy in range(3):
            for part in ("current", "legacy"):
                shutil.copytree(genai_corpus / part, tree / f"copy{copy}" / part)
    args = {"optimize": ["optimize", str(model), "-o", str(tmp_path / "out"), "--target", "webgpu-graph"],
            "tree": ["optimize", str(tree if tree.exists() else genai_corpus), "-o", str(tmp_path / "out"),
                     "--target", "webgpu-graph"],
            "lint": ["lint", str(genai_corpus)]}[command]
    # SIGINT as a terminal delivers it: pytest-xdist workers ignore SIGINT, and an ignored signal is inherited
    proc = subprocess.Popen([sys.executable, "-m", "rope_passes", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    before: list[str] = []
    if isinstance(moment, str):
        assert proc.stderr is not None
        for line in proc.stderr:
            before.append(line)
            if line.startswith(moment):
                break
    else:
        time.sleep(moment)
    assert proc.poll() is None, "finished before the signal: the test needs a longer job"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    err = "".join(before) + err
    assert proc.returncode == 130, (proc.returncode, err)
    # what came before the signal (the runtime header, one progress line per finished model) stays; then one line
    progress = ("[", "output for ")
    assert [ln for ln in error_lines(err) if not ln.startswith(progress)] == ["rope-passes: interrupted"], err
    assert error_lines(err)[-1] == "rope-passes: interrupted" and "Traceback" not in err, err
    assert not staging_left(tmp_path)
    written = list((tmp_path / "out").rglob("model.onnx"))
    if isinstance(moment, str):
        assert 2 <= len(written) < 57, err  # mid-tree: the models before the signal, not all
    for path in written:  # written before the signal: complete
        load_bundle(path.parent)


def test_ctrl_c_that_passed_through_exec_exits_130(tmp_path):
    """A KeyboardInterrupt that left ``exec`` of a string (dataclasses build their methods so, while the commands
    are imported) is still the one-line interrupt with exit 130 under ``python -m``, not a death by SIGINT
    (CPython ≤ 3.11 marks it unhandled; :func:`rope_passes.interrupts.forget_interrupt_seen_in_exec`)."""
    (tmp_path / "interrupted_in_exec.py").write_text(
        "import sys, rope_passes.cli as cli\n"
        "def build_parser():\n    exec('raise KeyboardInterrupt')\n"
        "cli.build_parser = build_parser\n"
        "sys.exit(cli.main([]))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    proc = subprocess.run([sys.executable, "-m", "interrupted_in_exec"], capture_output=True, text=True, timeout=60,
                          env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert (proc.returncode, error_lines(proc.stderr)) == (130, ["rope-passes: interrupted"]), proc.stderr


def interrupt_here(*_args, **_kwargs) -> None:
    os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.parametrize("where", ["passes", "staging", "commit"])
@pytest.mark.parametrize("in_place", [False, True])
def test_ctrl_c_at_each_step(where, in_place, tiny, tmp_path, monkeypatch, capsys):
    """The same, at a chosen moment: during the passes or the staging nothing is written; during the commit the
    signal waits for the commit to finish, so the output is complete."""
    from rope_passes import api
    from rope_passes.io import disk

    # Python's own SIGINT handler, as in a terminal (pytest-xdist workers ignore SIGINT)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request_restore = lambda: signal.signal(signal.SIGINT, previous)  # noqa: E731
    before = digest(tiny)
    if where == "passes":
        monkeypatch.setattr(api, "remaining_problems", lambda bundle, *runtime: interrupt_here())
    elif where == "staging":
        real_save = onnx.save
        monkeypatch.setattr(onnx, "save", lambda *a, **kw: (real_save(*a, **kw), interrupt_here()))
    else:
        real_replace = os.replace

        def replace(src, dst):  # the signal comes with the commit's first rename
            if (".rope-passes-" in str(src)) != (".rope-passes-" in str(dst)):
                interrupt_here()
            return real_replace(src, dst)

        monkeypatch.setattr(disk.os, "replace", replace)
    out = tmp_path / "out"
    args = ["optimize", str(tiny), "--target", "webgpu-graph", *(["--in-place"] if in_place else ["-o", str(out)])]
    try:
        assert main(args) == 130
    finally:
        request_restore()
    assert error_lines(capsys.readouterr().err) == ["rope-passes: interrupted"]
    assert not staging_left(tmp_path)
    monkeypatch.undo()
    if where == "commit":
        load_bundle(tiny if in_place else out)
        assert (digest(tiny) != before) if in_place else (out / "model.onnx").is_file()
    else:
        assert digest(tiny) == before and not out.exists()


# ---------------------------------------------------------------------------------------------------------------
# 8. lint -o to a folder or an unwritable path
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["folder", "missing_parent", "proc"])
def test_lint_output_path_errors(where, tiny, tmp_path):
    target = {"folder": tmp_path, "missing_parent": tmp_path / "no" / "such" / "r.txt",
              "proc": Path("/proc/rope-passes-report.txt")}[where]
    result = cli("lint", str(tiny), "-o", str(target))
    one_line_error(result.returncode, result.stderr, "cannot write the report")


# ---------------------------------------------------------------------------------------------------------------
# 9. output piped into head ends quietly
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [["passes"], ["inspect", "{tiny}"], ["lint", "{tiny}", "--list-rules"],
                                  ["optimize", "{tiny}", "--dry-run", "--explain", "--target", "webgpu-graph"]])
def test_piped_into_head_ends_quietly(args, tiny):
    argv = " ".join(a.format(tiny=tiny) for a in args)
    script = f'{sys.executable} -m rope_passes {argv} | head -1 > /dev/null; echo "rc=${{PIPESTATUS[0]}}" >&2'
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=300)
    assert result.stderr.strip().splitlines() == ["rc=0"], result.stderr


# ---------------------------------------------------------------------------------------------------------------
# bad input stays one line, exit 2, the input untouched (with every new option)
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args,expect", [(["--weights", "nope"], "invalid choice")])
def test_bad_options_one_line(args, expect, tiny, tmp_path):
    before = digest(tiny)
    result = cli("optimize", str(tiny), "-o", str(tmp_path / "out"), *args)
    assert result.returncode == 2 and expect in result.stderr and len(error_lines(result.stderr)) == 1, result.stderr
    assert digest(tiny) == before


# ---------------------------------------------------------------------------------------------------------------
# 10. never rewrite untouched weights (issue 14): --weights reflink|copy|link|rewrite
# ---------------------------------------------------------------------------------------------------------------


def optimize_json(*args: str) -> dict:
    result = cli("optimize", *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("mode", ["reflink", "copy", "link"])
@pytest.mark.parametrize("output", ["folder", "file"])
def test_weights_modes_reuse_the_data_file(mode, output, tiny, tmp_path):
    src_data = tiny / "model.onnx.data"
    if output == "folder":
        source, out, data = tiny, tmp_path / "out", tmp_path / "out" / "model.onnx.data"
    else:
        source, out, data = tiny / "model.onnx", tmp_path / "single" / "m.onnx", tmp_path / "single" / "m.onnx.data"
    report = optimize_json(str(source), "-o", str(out), "--target", "webgpu-graph", "--weights", mode)
    assert report["modified"] and not report["copied_verbatim"]
    assert data.read_bytes() == src_data.read_bytes(), "the weights were rewritten"
    same_inode = data.stat().st_ino == src_data.stat().st_ino
    assert same_inode == (mode == "link")
    assert report["weights"] == mode or (mode == "reflink" and report["weights"] == "copy"), report["weights"]
    assert load_bundle(out if output == "folder" else out).external_data_files == [data.name]


def test_unchanged_model_carries_files_in_the_weights_mode(tiny, tmp_path):
    report = optimize_json(str(tiny), "-o", str(tmp_path / "out"), "--weights", "link")
    assert report["copied_verbatim"] and report["weights"] == "link"
    assert (tmp_path / "out" / "model.onnx.data").stat().st_ino == (tiny / "model.onnx.data").stat().st_ino
    assert digest(tmp_path / "out") == digest(tiny)


def _tensor_values(folder: Path) -> dict[str, np.ndarray]:
    return {t.name: t.numpy().copy() for t in external_tensors(load_bundle(folder).model)}


def test_hard_linked_weights_read_again(tiny, tmp_path):
    """After --weights link the data file has two names (nlink 2) and onnx_ir refuses to read it ("may indicate a
    hard link attack"): input and output alike must still optimize, lint and read their tensors (rope-passes waives
    that one check: io.load.LinkedExternalTensor)."""
    before = _tensor_values(tiny)
    assert before, "the tiny model keeps its weights in model.onnx.data"
    optimize_json(str(tiny), "-o", str(tmp_path / "out"), "--target", "webgpu-graph", "--weights", "link")
    assert (tiny / "model.onnx.data").stat().st_nlink == 2
    with pytest.raises(ValueError, match="multiple hard links"):  # the premise: onnx_ir alone refuses
        next(t for t in external_tensors(ir.load(tiny / "model.onnx"))).numpy()
    for folder in (tiny, tmp_path / "out"):
        after = _tensor_values(folder)
        assert after.keys() == before.keys()
        for name, value in before.items():
            np.testing.assert_array_equal(after[name], value)
        again = optimize_json(str(folder), "-o", str(tmp_path / f"again-{folder.name}"), "--target", "webgpu-graph")
        assert again["weights"] in ("reflink", "copy"), again
        assert cli("lint", str(folder)).returncode in (0, 1)


def test_hard_link_waiver_keeps_the_containment_checks(tiny, tmp_path):
    """A data file that is a symbolic link leading out of the model's folder is still refused, hard-linked or not: at
    load, in one line (onnx_ir's own containment check would refuse it at the first read)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    os.replace(tiny / "model.onnx.data", outside / "weights.bin")
    os.link(outside / "weights.bin", outside / "second-name.bin")  # nlink 2: the waiver applies, containment not
    (tiny / "model.onnx.data").symlink_to(outside / "weights.bin")
    from rope_passes.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="is a symbolic link to .*outside the model's folder"):
        load_bundle(tiny)


def decode_outputs(model_path: Path) -> list[np.ndarray]:
    from rope_passes.check.decode import DecoderSpec, run_decode, token_ids
    from rope_passes.config import GenaiConfig
    from rope_passes.runtime.sessions import create_session

    sess = create_session(str(model_path), "cpu")
    spec = DecoderSpec.from_session(sess, GenaiConfig.load(model_path.parent).data)
    steps = run_decode(sess, spec, token_ids(6), prefill=4, steps=2)
    return [step[name] for step in steps for name in spec.outputs]


@pytest.mark.corpus
def test_reused_weights_give_the_rewrite_outputs(genai_corpus, tmp_path, monkeypatch):
    """A corpus model whose passes make new tables: the default output reuses the data file byte for byte, puts the
    small tables into model.onnx itself (no second file to commit), and computes exactly what the rewrite output
    computes (CPU); tables over the inline limit go into a small model.onnx.rope.data, with the same outputs."""
    import rope_passes.io.weights as weights

    src = genai_corpus / "legacy/qwen35/cpu_fp32_text"
    reused, rewritten, side = tmp_path / "reused", tmp_path / "rewritten", tmp_path / "side"
    first = optimize_json(str(src), "-o", str(reused), "--target", "webgpu-graph")
    optimize_json(str(src), "-o", str(rewritten), "--target", "webgpu-graph", "--weights", "rewrite")
    assert first["modified"] and first["weights"] in ("reflink", "copy")
    assert (reused / "model.onnx.data").read_bytes() == (src / "model.onnx.data").read_bytes()
    assert not (reused / "model.onnx.rope.data").exists() and not (rewritten / "model.onnx.rope.data").exists()
    assert sorted(p.name for p in reused.iterdir()) == sorted(p.name for p in src.iterdir())
    monkeypatch.setattr(weights, "INLINE_NEW_BYTES", 0)  # every new table over the limit: the second file
    bundle = load_bundle(src)
    from rope_passes.pipeline import run_pipeline
    from rope_passes.plan import make_plan

    run_pipeline(bundle, make_plan(preset="webgpu-graph"))
    save_bundle(bundle, side)
    extra = side / "model.onnx.rope.data"
    assert extra.is_file() and 0 < extra.stat().st_size < (src / "model.onnx.data").stat().st_size
    assert sorted(p.name for p in side.iterdir()) == sorted([*(p.name for p in src.iterdir()), extra.name])
    expected = decode_outputs(rewritten / "model.onnx")
    for out in (reused, side):
        for a, b in zip(decode_outputs(out / "model.onnx"), expected, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.corpus
def test_in_place_leaves_the_data_file_alone(genai_corpus, tmp_path, monkeypatch):
    import rope_passes.io.weights as weights

    work = Path(shutil.copytree(genai_corpus / "legacy/qwen35/cpu_fp32_text", tmp_path / "m"))
    for p in work.iterdir():
        p.chmod(0o644)
    data = work / "model.onnx.data"
    old = time.time() - 3600
    os.utime(data, (old, old))
    before = data.stat()
    reference = decode_outputs(work / "model.onnx")

    def check_untouched():
        after = data.stat()
        assert (after.st_ino, after.st_mtime_ns, after.st_size) == (before.st_ino, before.st_mtime_ns, before.st_size)
        assert not staging_left(work)
        for a, b in zip(reference, decode_outputs(work / "model.onnx"), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)

    report = optimize_json(str(work), "--in-place", "--target", "webgpu-graph")
    assert report["modified"] and report["output"] == str(work / "model.onnx") and report["weights"] is None
    extra = work / "model.onnx.rope.data"
    assert not extra.exists()  # the new tables are small: inside model.onnx, no file to remember to commit
    check_untouched()
    # again, through the API, with tables over the inline limit: they go into the second data file
    monkeypatch.setattr(weights, "INLINE_NEW_BYTES", 0)
    bundle = load_bundle(work)
    bundle.genai_config.data["model"]["note"] = "again"
    save_bundle(bundle, None, in_place=True)
    assert extra.is_file()
    check_untouched()
    # and once more: the second data file is rewritten (its tensors are ours), the weights not
    first = extra.stat().st_ino
    bundle = load_bundle(work)
    bundle.genai_config.data["model"]["note"] = "and again"
    save_bundle(bundle, None, in_place=True)
    assert extra.stat().st_ino != first
    check_untouched()
    # weights="rewrite" in place rewrites the data file (and drops the second one)
    save_bundle(load_bundle(work), None, in_place=True, weights="rewrite")
    assert data.stat().st_ino != before.st_ino and not extra.exists()
    assert np.array_equal(reference[0], decode_outputs(work / "model.onnx")[0])


def test_streaming_copy_keeps_holes(tmp_path):
    from rope_passes.io.disk import copy_file

    src = tmp_path / "sparse.data"
    with open(src, "wb") as f:
        f.truncate(64 << 20)
        f.seek(32 << 20)
        f.write(b"weights")
    dst = tmp_path / "copy.data"
    assert copy_file(src, dst, reflink=False) == "copy"
    assert dst.read_bytes() == src.read_bytes()
    if src.stat().st_blocks * 512 < (1 << 20):  # the filesystem keeps holes
        assert dst.stat().st_blocks * 512 < (1 << 20), "the copy filled the holes"


def test_make_dirs_is_race_safe(tiny, tmp_path, monkeypatch):
    """Two writers creating outputs under the same new parent folder: the one that loses the race to ``mkdir`` uses
    the folder the other made (and does not count it as its own to remove on failure)."""
    import threading

    from rope_passes.io.disk import make_dirs

    parent = tmp_path / "new" / "parent"
    real_mkdir = Path.mkdir

    def lose_the_race(self: Path, *args, **kwargs):
        if self == parent and not self.exists():
            os.mkdir(self)  # the other writer, between make_dirs' check and its mkdir
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", lose_the_race)
    created: list[Path] = []
    make_dirs(parent / "out", created)
    assert created == [tmp_path / "new", parent / "out"]
    monkeypatch.undo()

    # end to end: threads writing outputs under one new folder at once
    root = tmp_path / "shared" / "outputs"
    bundles = [load_bundle(tiny) for _ in range(4)]
    barrier = threading.Barrier(len(bundles))
    errors: list[BaseException] = []

    def write(i: int) -> None:
        barrier.wait()
        try:
            save_bundle(bundles[i], root / f"out{i}")
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(bundles))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all((root / f"out{i}" / "model.onnx").is_file() for i in range(len(bundles)))
    assert not staging_left(tmp_path / "shared")
