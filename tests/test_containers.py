"""The container fuzzer (issue 25): a model re-saved in each ONNX storage form, and at each opset where its ops exist,
run through the presets: the output loads on onnxruntime CPU and computes what the input computes (an independent
CPU run of both), or the pass refused; untouched parts (training_info, metadata, functions) reach the output.

Forms (tests/containers.py, written from the ONNX spec): sparse initializers, typed fields (``float_data``...), a
second external data file in a subfolder at offsets, ``training_info``, ``Constant(sparse_value)``, metadata and
doc strings, IR version 3 (initializers declared as inputs). Base models: the
embedded tiny decoder (no corpus) and the corpus's llama and Phi-3 LongRoPE builder folders (their presets rewrite
the graph: total-seq-on-gpu, longrope-concat).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.external_data_helper
import onnxruntime as ort
import pytest
from containers import at_opset, ir_version_3, sparse, split_external, typed_fields, with_training_info
from test_contracts import _logits

from rope_passes.cli import main
from rope_passes.demo import build_tiny_decoder


def _small_initializers(proto: onnx.ModelProto, limit: int = 4096) -> list[str]:
    """In-proto float initializers of at most ``limit`` elements (the constants a graph keeps inline)."""
    return [t.name for t in proto.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL
            and t.data_type == onnx.TensorProto.FLOAT and 0 < int(np.prod(t.dims)) <= limit]


def _external_tables(proto: onnx.ModelProto) -> list[str]:
    """The cos/sin caches (or any external initializer whose name says so), else the first external ones."""
    names = [t.name for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    tables = [n for n in names if "cos" in n or "sin" in n]
    return tables or names[:2]


def _constant_sparse(proto: onnx.ModelProto, src: Path) -> onnx.ModelProto | None:
    """The cos cache (else the first external or small float initializer) read through a ``Constant(sparse_value)``
    instead."""
    names = _external_tables(proto) or _small_initializers(proto)
    if not names:
        return None
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    tensor = next(t for t in out.graph.initializer if t.name == names[0])
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        onnx.external_data_helper.load_external_data_for_tensor(tensor, str(src))
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]
    array = onnx.numpy_helper.to_array(tensor)
    flat = np.flatnonzero(array.reshape(-1))
    values = onnx.numpy_helper.from_array(array.reshape(-1)[flat], tensor.name + "_values")
    indices = onnx.numpy_helper.from_array(flat.astype(np.int64), tensor.name + "_indices")
    node = onnx.helper.make_node("Constant", [], [tensor.name], name=tensor.name + "/sparse_constant",
                                 sparse_value=onnx.helper.make_sparse_tensor(values, indices, list(array.shape)))
    out.graph.initializer.remove(tensor)
    out.graph.node.insert(0, node)
    return out


FORMS = ["sparse", "typed", "split", "training_info", "constant_sparse", "metadata", "ir3"]


def _variant(src: Path, dst: Path, form: str) -> bool:
    shutil.copytree(src, dst)
    for p in dst.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    proto = onnx.load(dst / "model.onnx", load_external_data=False)
    if form == "sparse":  # the cos/sin caches (or the first external tensors) and a few small constants
        out = sparse(proto, [*_external_tables(proto), *_small_initializers(proto)[:2]], src)
    elif form == "typed":
        out = typed_fields(proto)
    elif form == "split":
        out = split_external(proto, src, dst, _external_tables(proto))
    elif form == "training_info":
        out = with_training_info(proto)
    elif form == "ir3":
        out = ir_version_3(proto)
    elif form == "metadata":
        out = proto
        entry = out.metadata_props.add()
        entry.key, entry.value = "test.untouched", "kept ✓"
        out.doc_string = "a doc string the output keeps"
    else:
        made = _constant_sparse(proto, src)
        if made is None:
            return False
        out = made
    onnx.save(out, dst / "model.onnx")
    ort.InferenceSession(str(dst / "model.onnx"), providers=["CPUExecutionProvider"])  # the variant is valid
    return True


def _kept(src: Path, out: Path, form: str) -> None:
    a = onnx.load(src / "model.onnx", load_external_data=False)
    b = onnx.load(out / "model.onnx", load_external_data=False)
    if form == "training_info":
        assert [t.SerializeToString() for t in b.training_info] == [t.SerializeToString() for t in a.training_info]
    if form == "ir3":  # every initializer, the ones the passes added too, declared an input (onnx.checker's rule)
        assert b.ir_version == 3
        assert {t.name for t in b.graph.initializer} <= {i.name for i in b.graph.input}
    if form == "metadata":
        assert {p.key: p.value for p in b.metadata_props}["test.untouched"] == "kept ✓"
        assert b.doc_string == a.doc_string


def _run(src: Path, out: Path, *args: str) -> None:
    assert main(["optimize", str(src), "-o", str(out), *args]) == 0
    ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(_logits(out / "model.onnx"), _logits(src / "model.onnx"), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", FORMS)
def test_tiny_decoder_in_every_form(form, tmp_path, capsys):
    """fp32 throughout: the rewrites move no arithmetic (total_sequence_length and seqlens_k computed another way),
    so the logits agree to float32 rounding of the same operations (1e-5 of magnitudes ~1)."""
    base = build_tiny_decoder(tmp_path / "demo")
    src = tmp_path / "variant"
    assert _variant(base, src, form), form
    for preset in ("webgpu", "webgpu-graph"):
        out = tmp_path / f"out-{preset}"
        _run(src, out, "--target", preset)
        _kept(src, out, form)
    capsys.readouterr()


@pytest.mark.corpus
@pytest.mark.parametrize("model", ["current/llama/cpu_fp32", "current/phi3_mini_128k/cpu_fp32"])
@pytest.mark.parametrize("form", FORMS)
def test_corpus_folder_in_every_form(model, form, genai_corpus, tmp_path, capsys):
    src = tmp_path / "variant"
    if not _variant(genai_corpus / model, src, form):
        pytest.fail(f"{model} has no initializer for the {form} form")
    _run(src, tmp_path / "out", "--target", "webgpu-graph")
    _kept(src, tmp_path / "out", form)
    capsys.readouterr()


@pytest.mark.corpus
@pytest.mark.parametrize("opset", range(11, 24))
def test_corpus_folder_at_every_opset(opset, genai_corpus, tmp_path, capsys):
    """llama and Phi-3 (LongRoPE) at each default-domain opset where the builder's ops exist (all of 11..23)."""
    for model in ("current/llama/cpu_fp32", "current/phi3_mini_128k/cpu_fp32"):
        src = tmp_path / model.replace("/", "_")
        shutil.copytree(genai_corpus / model, src)
        for p in src.iterdir():
            p.chmod(0o644)
        moved = at_opset(onnx.load(src / "model.onnx", load_external_data=False), opset)
        assert moved is not None
        onnx.save(moved, src / "model.onnx")
        _run(src, tmp_path / (src.name + "-out"), "--target", "webgpu-graph")
        out = onnx.load(tmp_path / (src.name + "-out") / "model.onnx", load_external_data=False)
        assert next(o.version for o in out.opset_import if o.domain == "") == opset
    capsys.readouterr()


@pytest.mark.corpus
@pytest.mark.parametrize("name", ["tf5/dynamo/llama/decode.onnx", "tf4/torchscript/gemma3_text/decode.onnx"])
def test_exporter_graph_at_every_opset(name, tmp_path, capsys):
    """The exporter preset (precompute-cos-sin: Gather/Unsqueeze/Where/ReduceMax built by NodeTape) on dynamo exports
    re-saved at each opset 11..23 where their ops exist in the form the export wrote them (a re-save onnxruntime
    does not load is no model: Shape's start/end attributes are opset 15's): the output loads on onnxruntime CPU at
    the same opset and computes the export's outputs (fp32: 1e-5, the tables are the values the graph computed,
    rounded once)."""
    from conftest import TORCH
    from test_commit_scenario import _outputs

    base = onnx.load(TORCH / name, load_external_data=False)
    ran = []
    for opset in range(11, 24):
        moved = at_opset(base, opset)
        if moved is None:
            continue  # an op of the graph does not exist at this opset: no such model to run
        src, out = tmp_path / f"in{opset}.onnx", tmp_path / f"out{opset}.onnx"
        onnx.save(moved, src)
        try:
            ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
        except Exception:  # noqa: BLE001  (onnxruntime's load errors share no base class)
            continue
        assert main(["optimize", str(src), "-o", str(out), "--target", "exporter", "--max-positions", "256"]) == 0
        proto = onnx.load(out, load_external_data=False)
        assert next(o.version for o in proto.opset_import if o.domain == "") == opset
        assert any(n.op_type == "Gather" and "rope_passes" in n.name for n in proto.graph.node), "tables built"
        for a, b in zip(_outputs(out), _outputs(src), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        ran.append(opset)
    own = next(o.version for o in base.opset_import if o.domain == "")
    assert set(range(own, 24)) <= set(ran) and len(ran) >= 6, ran  # llama 18..23, gemma3 12..23 (measured)
    capsys.readouterr()


def test_data_behind_a_link_out_of_the_folder_is_one_line(tmp_path):
    """A Hugging Face cache snapshot links its files to ../../blobs/: onnx_ir will not read a data file through such a
    link, so the load says so up front, in one line (exit 2), instead of failing at the first tensor a pass reads."""
    base = build_tiny_decoder(tmp_path / "demo")
    blobs, snapshot = tmp_path / "blobs", tmp_path / "snapshot"
    blobs.mkdir()
    snapshot.mkdir()
    for item in base.iterdir():
        shutil.move(item, blobs / item.name)
        (snapshot / item.name).symlink_to(blobs / item.name)
    done = subprocess.run([sys.executable, "-m", "rope_passes", "optimize", str(snapshot), "-o", str(tmp_path / "o")],
                          capture_output=True, text=True)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "is a symbolic link to" in done.stderr and "cp -rL" in done.stderr
