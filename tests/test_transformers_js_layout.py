"""The optimum / transformers.js folder as input and output (issue 28), on a small synthetic decoder-shaped graph (no
corpus, no runtime): ``config.json`` + tokenizer at the top, ``onnx/model.onnx`` with transformers.js's data file
name (``model.onnx_data``) and a quantized sibling in ``onnx/``. What is read, what is written where, what is carried
byte for byte, and the ``name-batch-dim`` repair's refusals. The real client (transformers.js generating from such a
folder) is tests/test_transformers_js.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from rope_passes.check.models import read_model
from rope_passes.cli import main
from rope_passes.errors import ModelLoadError
from rope_passes.hf_config import HFConfig
from rope_passes.io import discover_models, load_bundle, save_bundle
from rope_passes.lint import lint_bundle
from rope_passes.passes import ALL_PASSES
from rope_passes.plan import PRESETS

WEIGHTS = np.arange(1024, dtype=np.float32)  # 4 KiB: external (above the 256-byte inline threshold)


def _graph(batch: str = "batch", other: str = "batch") -> onnx.ModelProto:
    """past_key_values.{0,1}.key [batch, 2, past, 4] -> present.*; logits = Cast(input_ids) summed + weights."""
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [batch, "seq"]),
              helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, [batch, 2, "past", 4]),
              helper.make_tensor_value_info("past_key_values.1.key", TensorProto.FLOAT, [other, 2, "past", 4])]
    outputs = [helper.make_tensor_value_info("present.0.key", TensorProto.FLOAT, [batch, 2, "past", 4]),
               helper.make_tensor_value_info("present.1.key", TensorProto.FLOAT, [other, 2, "past", 4]),
               helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1024])]
    nodes = [helper.make_node("Identity", ["past_key_values.0.key"], ["present.0.key"]),
             helper.make_node("Identity", ["past_key_values.1.key"], ["present.1.key"]),
             helper.make_node("Cast", ["input_ids"], ["ids_f"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["ids_f"], ["total"], keepdims=0),
             helper.make_node("Add", ["w", "total"], ["logits"])]
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(WEIGHTS, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _folder(root: Path, **kw: str) -> Path:
    folder = root / "dl"
    (folder / "onnx").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 64,
                                                       "vocab_size": 300}))
    (folder / "tokenizer.json").write_text('{"model": {}}\n')
    for name in ("model", "model_q4f16"):
        onnx.save(_graph(**kw), folder / "onnx" / f"{name}.onnx", save_as_external_data=True,
                  location=f"{name}.onnx_data", size_threshold=256)
    return folder


def _run(path: Path) -> list[np.ndarray]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    past = np.random.default_rng(0).standard_normal((1, 2, 3, 4)).astype(np.float32)
    return sess.run(None, {"input_ids": np.array([[1, 2, 3]]), "past_key_values.0.key": past,
                           "past_key_values.1.key": past})


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_folder_is_one_model_its_onnx_model(tmp_path):
    folder = _folder(tmp_path)
    assert discover_models(tmp_path) == [folder]  # a tree walk stops at the folder: onnx/ is part of it
    bundle = load_bundle(folder)
    assert bundle.model_path == folder / "onnx" / "model.onnx" and bundle.folder == folder
    hf = HFConfig.find(folder / "onnx" / "model_q4f16.onnx")  # a sibling named alone reads the folder's config
    assert hf is not None and hf.data["max_position_embeddings"] == 64
    info = read_model(folder)  # check: the model and what it accepts (ids below config.json's vocab_size)
    assert info.path == bundle.model_path and 300 in info.vocab
    with pytest.raises(ModelLoadError, match="give the transformers.js folder"):
        load_bundle(folder / "onnx")  # several models there: the folder or one file
    (folder / "onnx" / "model.onnx").rename(folder / "onnx" / "other.onnx")
    with pytest.raises(ModelLoadError, match="without onnx/model.onnx"):
        load_bundle(folder)


def test_optimize_writes_the_same_layout_and_carries_the_rest(tmp_path):
    folder = _folder(tmp_path)
    before = _files(folder)
    out = tmp_path / "out"
    assert main(["optimize", str(folder), "-o", str(out), "--passes", "name-batch-dim"]) == 0
    after = _files(out)
    assert sorted(after) == sorted(before) == ["config.json", "onnx/model.onnx", "onnx/model.onnx_data",
                                               "onnx/model_q4f16.onnx", "onnx/model_q4f16.onnx_data",
                                               "tokenizer.json"]
    changed = sorted(name for name in before if after[name] != before[name])
    assert changed == ["onnx/model.onnx"]  # the weights under transformers.js's name, the sibling: as they were
    assert _files(folder) == before  # the input untouched
    for a, b in zip(_run(folder / "onnx" / "model.onnx"), _run(out / "onnx" / "model.onnx")):
        np.testing.assert_array_equal(a, b)
    past = onnx.load(str(out / "onnx" / "model.onnx"), load_external_data=False).graph.input[1]
    assert past.type.tensor_type.shape.dim[0].dim_param == "batch_size"
    # again onto the same output: an earlier output of this folder is replaced
    assert main(["optimize", str(folder), "-o", str(out), "--passes", "name-batch-dim"]) == 0
    assert _files(out) == after


def test_optimize_says_when_transformers_js_still_cannot_run_the_output(tmp_path, capsys):
    folder = _folder(tmp_path)
    assert main(["optimize", str(folder), "-o", str(tmp_path / "out"), "--passes", "cleanup"]) == 0
    assert "RP501" in capsys.readouterr().out  # optimize never renames the dim itself, but says what stands


def test_new_tensors_go_inline_and_rewrite_keeps_the_data_name(tmp_path):
    """transformers.js hands the browser's onnxruntime only <model>.onnx_data: a new table may not go to a second
    data file there."""
    folder = _folder(tmp_path)
    bundle = load_bundle(folder)
    table = ir.tensor(np.ones((64, 8), np.float32), name="cos_table")  # 2 KiB, in memory: what a pass makes
    bundle.model.graph.register_initializer(ir.Value(name="cos_table", const_value=table))
    save_bundle(bundle, tmp_path / "out")
    files = _files(tmp_path / "out")
    assert not [n for n in files if n.endswith(".rope.data")]
    assert files["onnx/model.onnx_data"] == (folder / "onnx" / "model.onnx_data").read_bytes()
    saved = onnx.load(str(tmp_path / "out" / "onnx" / "model.onnx"), load_external_data=False)
    inline = {t.name for t in saved.graph.initializer if t.data_location != TensorProto.EXTERNAL}
    assert "cos_table" in inline
    save_bundle(load_bundle(folder), tmp_path / "rewritten", weights="rewrite")
    assert (tmp_path / "rewritten" / "onnx" / "model.onnx_data").is_file()
    assert not (tmp_path / "rewritten" / "onnx" / "model.onnx.data").exists()


def test_lint_fix_repairs_the_batch_dim_in_place(tmp_path):
    folder = _folder(tmp_path)
    found = [d for d in lint_bundle(folder) if d.code == "RP501"]
    assert [d.target for d in found] == ["past_key_values.0.key"] and "'batch'" in found[0].message
    data = folder / "onnx" / "model.onnx_data"
    inode = data.stat().st_ino
    assert main(["lint", str(folder), "--fix", "--select", "RP501"]) == 0
    assert data.stat().st_ino == inode  # in place: the weights stay where they are
    assert not [d for d in lint_bundle(folder) if d.code == "RP501"]


def test_name_batch_dim_is_metadata_only_in_no_preset_and_refuses_what_it_cannot_prove(tmp_path):
    assert all("name-batch-dim" not in passes for passes in PRESETS.values())
    assert "Changes metadata only" in (sys.modules[ALL_PASSES["name-batch-dim"].__module__].__doc__ or "")
    cases = {"disagree": _graph(batch="batch", other="b2"), "taken": _graph(batch="batch", other="batch_size"),
             "clean": _graph(batch="batch_size", other="batch_size")}
    for name, proto in cases.items():
        model = ir.serde.deserialize_model(proto)
        result = ALL_PASSES["name-batch-dim"]()(model)
        report = result.report
        assert not result.modified, name
        expected = {"disagree": "refused: the cache inputs name their batch axis differently",
                    "taken": "refused: 'batch_size' already names",
                    "clean": "not matched: no cache input"}[name]
        assert report.status.startswith(expected), (name, report.status)
