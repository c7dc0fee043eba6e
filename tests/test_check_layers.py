"""``check --layers N``: both graphs cut after decoder layer N, weights read in place, the first N layers compared.

CI-sized: the 2-layer corpus models cut after layer 1 (a copy in tmp_path: the cut is written beside the model).
A change in the cos/sin rows layer 0 reads is caught; a change that only layer 1 reads is, by design, not looked at
(docs/performance.md, "check at real size"; rope_passes/cut.py); equivalent graphs pass; the cut reads the model's own data file, no weight
byte copied. Budget (2 cores): ~40 s.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from conftest import GENAI, TORCH, genai_models

from rope_passes.check.core import EQUIVALENT, NOT_EQUIVALENT, check
from rope_passes.check.decode import DecoderSpec, run_decode, token_ids
from rope_passes.cut import cut_model, cut_pair
from rope_passes.errors import UsageError
from rope_passes.io import load_bundle, save_bundle

LLAMA = "current/llama/cpu_fp32"
FAST = {"sweep": 4, "isolate": False, "calls": False}  # in-process, a short sweep: the cut is what is under test here
#: a check that must fail, at the step it names: no schedules (of a broken model they would only fail too)
FAILING = {**FAST, "schedules": []}


def copy_of(name: str, dst) -> str:
    shutil.copytree(GENAI / name, dst)
    for p in [dst, *dst.iterdir()]:  # the corpus is read-only; the cut is written beside the model
        p.chmod(p.stat().st_mode | 0o200)
    return str(dst)


def perturb_layer(src: str, dst, layer: int, row: int = 3, delta: float = 1e-2) -> str:
    """``src`` with the cos/sin caches of ``layer``'s GroupQueryAttention replaced by copies whose row ``row`` is off
    by ``delta`` (the other layer keeps reading the original tables)."""
    bundle = load_bundle(src)
    g = bundle.model.graph
    gqa = next(n for n in g if n.op_type == "GroupQueryAttention" and f"/layers.{layer}/" in (n.name or ""))
    for idx in (7, 8):  # cos_cache, sin_cache
        old = gqa.inputs[idx]
        table = old.const_value.numpy().copy()
        table[row] += delta
        new = ir.Value(name=f"{old.name}_layer{layer}", const_value=ir.tensor(table, name=f"{old.name}_layer{layer}"))
        g.register_initializer(new)
        gqa.replace_input_with(idx, new)
    save_bundle(bundle, dst)
    return str(dst)


def _data_files(folder) -> dict[str, int]:
    return {p.name: p.stat().st_ino for p in folder.iterdir()}


@pytest.mark.corpus
def test_cut_reads_the_weights_in_place(tmp_path):
    folder = tmp_path / "m"
    copy_of(LLAMA, folder)
    before = _data_files(folder)
    with cut_pair(folder, folder, 1) as (a, b):
        assert a.model.parent == folder and a.model != b.model  # beside the model, one file per side
        assert set(_data_files(folder)) == set(before) | {a.model.name, b.model.name}  # no new data file
        cut = onnx.load(str(a.model), load_external_data=False)
        locations = {e.value for t in cut.graph.initializer for e in t.external_data if e.key == "location"}
        assert locations == {"model.onnx.data"}  # the model's own data file, by reference
        assert a.model.stat().st_size < 64 * 1024  # the graph only
        assert [o.name for o in cut.graph.output] == ["hidden_states.1", "present.0.key", "present.0.value"]
        assert [i.name for i in cut.graph.input if i.name.startswith("past")] == [
            "past_key_values.0.key", "past_key_values.0.value"]
        assert not any("layers.1/attn" in n.name for n in cut.graph.node)
        assert "lm_head.MatMul.weight" not in {t.name for t in cut.graph.initializer}
        assert "model.onnx.data read in place" in a.summary()
    assert _data_files(folder) == before  # the cuts are gone, the data file is the same file


@pytest.mark.corpus
def test_cut_in_a_scratch_folder_copies_only_the_kept_weights(tmp_path):
    """Where the model's folder is not writable: the kept tensors are copied, and compute the same."""
    src = GENAI / LLAMA
    beside = cut_model(copy_of(LLAMA, tmp_path / "m"), 1, tmp_path / "scratch", "a")
    copied = cut_model(src, 1, tmp_path / "scratch", "b", beside=False)
    try:
        assert copied.model.parent == tmp_path / "scratch" / "b"
        data = copied.model.parent / "model.onnx.data"
        assert 0 < data.stat().st_size < (src / "model.onnx.data").stat().st_size
        outs = []
        for c in (beside, copied):
            sess = ort.InferenceSession(str(c.model), providers=["CPUExecutionProvider"])
            spec = DecoderSpec.from_session(sess, json.loads((src / "genai_config.json").read_text()))
            outs.append(run_decode(sess, spec, token_ids(9), 8, 1))
        for x, y in zip(*outs):
            assert x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
    finally:
        beside.remove()


@pytest.mark.corpus
@pytest.mark.parametrize("name", genai_models())
def test_every_builder_graph_has_one_hidden_state(name, tmp_path):
    cut = cut_model(GENAI / name, 1, tmp_path, "x", beside=False)
    assert cut.hidden == ["hidden_states.1"] and cut.presents == ["present.0.key", "present.0.value"]
    assert cut.total_layers == 2


@pytest.mark.corpus
@pytest.mark.parametrize("exporter", ["tf5/dynamo", "tf4/torchscript"])
def test_exporter_graphs_are_cut_at_the_residual(exporter, tmp_path):
    """torch names layers in node names (TorchScript) or in the namespace metadata (dynamo); the shared cos/sin values
    that layer 1 reads from layer 0's nodes are not the hidden state."""
    for model in sorted((TORCH / exporter).glob("*/decode.onnx"))[:4]:
        cut = cut_model(model, 1, tmp_path, model.parent.name, beside=False)
        assert cut.hidden == ["hidden_states.1"], model
        assert cut.presents == ["present.0.key", "present.0.value"], model


@pytest.mark.corpus
def test_out_of_range_and_logit_references_are_refused(tmp_path):
    folder = copy_of(LLAMA, tmp_path / "m")
    with pytest.raises(UsageError, match="decoder layers"):
        cut_model(folder, 3, tmp_path)  # 2 layers; --layers 2 cuts at the builder's final norm
    with pytest.raises(UsageError, match="logits"):
        check(folder, folder, layers=1, reference_logits=np.zeros((8, 500), np.float32))


@pytest.mark.corpus
@pytest.mark.webgpu
def test_a_change_in_layer_0_is_caught(tmp_path):
    orig = copy_of(LLAMA, tmp_path / "orig")
    bad = perturb_layer(orig, tmp_path / "bad", layer=0)
    report = check(orig, bad, layers=1, **FAILING)
    assert report.verdict == NOT_EQUIVALENT
    cmp, diff = report.first_failure
    assert diff.step == 0 and diff.output in ("hidden_states.1", "present.0.key")
    assert any("--layers 1" in n for n in report.notes)


@pytest.mark.corpus
@pytest.mark.webgpu
def test_a_change_only_in_layer_1_is_not_looked_at(tmp_path):
    """Documented: --layers 1 compares layer 0 only. The same graph fails the whole-model check."""
    orig = copy_of(LLAMA, tmp_path / "orig")
    bad = perturb_layer(orig, tmp_path / "bad", layer=1)
    assert check(orig, bad, layers=1, **FAST).verdict == EQUIVALENT
    assert check(orig, bad, steps=0, **FAILING).verdict == NOT_EQUIVALENT


@pytest.mark.corpus
@pytest.mark.webgpu
def test_rewritten_model_passes_from_the_cli(tmp_path):
    orig = copy_of("legacy/qwen25_vl/cpu_fp32", tmp_path / "orig")
    out = tmp_path / "opt"
    cli = [sys.executable, "-m", "rope_passes"]
    subprocess.run([*cli, "optimize", orig, "-o", str(out), "--target", "webgpu-graph", "--text-only", "--weights",
                    "link"], check=True, capture_output=True)
    done = subprocess.run([*cli, "check", orig, str(out), "--layers", "1", "--sweep", "4", "--in-process",
                           "--progress"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "hidden_states.1" in done.stdout and "equivalent" in done.stdout
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("[")]  # --progress: one line per step
    # every step of the decode, however long the plan makes it (an output whose config turns capture on decodes to
    # CAPTURE_TOTAL, c60bbb1)
    assert any("original@cpu: started" in ln for ln in lines)
    assert any(re.search(r"rewritten@webgpu: (\d+)/\1$", ln) for ln in lines), lines
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []  # the cut is cleaned up
