"""Every output of ``optimize`` on the shared corpus is a valid model at its own opset (issue 25).

Judged independently of the package's own validity contract:

* ``onnx.checker.check_model(full_check=True)`` (schemas at the model's opset imports, strict shape inference) on
  the output, after the same neutral steps on input and output: nodes of ops ONNX does not define that the builder
  writes in the default domain (onnxruntime's ``SimplifiedLayerNormalization``, ...) are moved to a domain of their
  own, which the checker skips (it cannot judge them; the load below does), and the graph's ``value_info`` hints
  are dropped (the builder writes some that disagree with inference: a Constant's rank). Nothing else is changed;
* the output loads in onnxruntime's CPU EP, with its weights (the corpus graphs are small).

The 19 builder folders with ``--target webgpu-graph`` (and ``--text-only`` for the mRoPE families), and the 62
exporter graphs with ``--target exporter``: the presets' passes all run.
"""

from __future__ import annotations

import shutil

import onnx
import onnx.checker
import onnx.defs
import onnxruntime as ort
import pytest
from conftest import GENAI, TORCH, genai_models

from rope_passes.cli import main

_CONTRIB = "test.unknown-to-onnx"


def _checked(path, scratch) -> str | None:
    """onnx.checker's full check of the model at ``path`` (see the module doc), or its error (first line). The
    checked proto is written into ``scratch`` with copies of the data files beside the model (the checker reads
    them relative to the model file)."""
    proto = onnx.load(str(path), load_external_data=False)
    moved = False
    for node in proto.graph.node:  # the main graph: where the builder writes them
        if node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type):
            node.domain = _CONTRIB
            moved = True
    if moved:
        proto.opset_import.append(onnx.helper.make_opsetid(_CONTRIB, 1))
    del proto.graph.value_info[:]  # the builder's own value_info disagrees with inference (its Constant ranks)
    scratch.mkdir(parents=True, exist_ok=False)
    for item in path.parent.iterdir():
        if item.is_file() and item.suffix != ".onnx":
            shutil.copy(item, scratch / item.name)
    onnx.save(proto, scratch / path.name)
    try:
        onnx.checker.check_model(str(scratch / path.name), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        return str(exc).splitlines()[0]
    return None


def _loads(path) -> None:
    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _opset(path) -> int:
    proto = onnx.load(str(path), load_external_data=False)
    return next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))


MRoPE = ("qwen25_vl", "qwen35")
GENAI_RUNS = [(m, ()) for m in genai_models()] + [(m, ("--text-only",)) for m in genai_models()
                                                   if any(f in m for f in MRoPE)]
TORCH_MODELS = sorted(str(p.relative_to(TORCH)) for p in TORCH.rglob("*.onnx")) if TORCH.is_dir() else []


@pytest.mark.corpus
@pytest.mark.parametrize("name, extra", GENAI_RUNS, ids=[m + "".join(e) for m, e in GENAI_RUNS])
def test_builder_outputs_are_valid_at_their_opset(name, extra, tmp_path, capsys):
    src = GENAI / name
    out = tmp_path / "out"
    assert main(["optimize", str(src), "-o", str(out), "--target", "webgpu-graph", *extra]) == 0
    capsys.readouterr()
    source_error = _checked(src / "model.onnx", tmp_path / "in")
    assert source_error is None, f"the corpus input itself: {source_error}"
    assert _checked(out / "model.onnx", tmp_path / "checked") is None
    assert _opset(out / "model.onnx") == _opset(src / "model.onnx")
    _loads(out / "model.onnx")


@pytest.mark.corpus
@pytest.mark.parametrize("name", TORCH_MODELS)
def test_exporter_outputs_are_valid_at_their_opset(name, tmp_path, capsys):
    src = TORCH / name
    out = tmp_path / "out.onnx"
    assert main(["optimize", str(src), "-o", str(out), "--target", "exporter", "--max-positions", "512"]) == 0
    capsys.readouterr()
    source_error = _checked(src, tmp_path / "in")
    if source_error is None:
        assert _checked(out, tmp_path / "checked") is None
    else:  # judged against its input: nothing that passed there may fail here
        assert _checked(out, tmp_path / "checked") in (None, source_error)
    assert _opset(out) == _opset(src)
    _loads(out)


@pytest.mark.corpus
def test_every_corpus_model_is_run():
    """The lists above are the corpus (19 builder folders, 62 exporter graphs), not an accidental empty sweep."""
    assert len(genai_models()) == 19 and len(TORCH_MODELS) == 62
