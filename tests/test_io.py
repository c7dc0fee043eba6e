"""Model I/O: lazy external data, nothing lost on save, atomic writes, the input never touched."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import onnx
import onnx_ir as ir
import pytest

from rope_passes.demo import build_tiny_decoder
from rope_passes.errors import ModelLoadError, ModelSaveError
from rope_passes.io import MAX_IR_VERSION, load_bundle, save_bundle


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture()
def tiny(tmp_path) -> Path:
    folder = build_tiny_decoder(tmp_path / "tiny")
    # things that must survive a round trip
    proto = onnx.load(folder / "model.onnx", load_external_data=False)
    proto.doc_string = "tiny doc"
    proto.graph.doc_string = "graph doc"
    proto.graph.value_info.append(onnx.helper.make_tensor_value_info("h0", onnx.TensorProto.FLOAT, ["b", "s", 64]))
    onnx.save_model(proto, folder / "model.onnx")
    return folder


def test_load_keeps_weights_on_disk(tiny):
    bundle = load_bundle(tiny)
    tensors = [v.const_value for v in bundle.model.graph.initializers.values()]
    external = [t for t in tensors if isinstance(t, ir.ExternalTensor)]
    assert len(external) >= 10 and bundle.external_data_files == ["model.onnx.data"]
    assert bundle.genai_config.data["model"]["decoder"]["filename"] == "model.onnx"
    assert bundle.folder == tiny and bundle.model_path == tiny / "model.onnx"


def test_save_keeps_everything_and_caps_ir_version(tiny, tmp_path):
    bundle = load_bundle(tiny)
    bundle.model.ir_version = 14  # what onnx 1.23 would write; onnxruntime 1.27 rejects it
    before = digest(tiny)
    written = save_bundle(bundle, tmp_path / "out")
    assert digest(tiny) == before, "the input folder was modified"
    out = onnx.load(written, load_external_data=False)
    src = onnx.load(tiny / "model.onnx", load_external_data=False)
    assert out.ir_version == MAX_IR_VERSION == 13
    assert {(o.domain, o.version) for o in out.opset_import} == {(o.domain, o.version) for o in src.opset_import}
    # the input's metadata kept, and which input this output was made from (an existing output folder is replaced
    # only by a new output of the same input: rope_passes.io.files)
    from rope_passes.io.files import INPUT_METADATA_KEY, input_identity

    assert {p.key: p.value for p in out.metadata_props} == {
        **{p.key: p.value for p in src.metadata_props}, INPUT_METADATA_KEY: input_identity(tiny / "model.onnx")}
    assert len(src.metadata_props) > 0
    assert out.doc_string == "tiny doc" and out.graph.doc_string == "graph doc"
    kept = {v.name: v for v in out.graph.value_info}
    assert "h0" in kept, "value_info lost"
    assert [d.dim_param or d.dim_value for d in kept["h0"].type.tensor_type.shape.dim] == ["b", "s", 64]
    # weights beside the model, tokenizer files copied, config identical
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        ["model.onnx", "model.onnx.data", "genai_config.json", "tokenizer_config.json"]
    )
    assert json.loads((tmp_path / "out" / "genai_config.json").read_text()) == bundle.genai_config.data
    full_out = onnx.load(written)
    full_src = onnx.load(tiny / "model.onnx")
    assert {i.name: i.raw_data for i in full_out.graph.initializer} == {
        i.name: i.raw_data for i in full_src.graph.initializer
    }
    assert not list((tmp_path / "out").glob(".rope-passes-*")), "staging folder left behind"


def test_refuses_to_overwrite_input_without_in_place(tiny):
    bundle = load_bundle(tiny)
    with pytest.raises(ModelSaveError, match="refusing to overwrite"):
        save_bundle(bundle, tiny)
    with pytest.raises(ModelSaveError, match="refusing to overwrite"):
        save_bundle(load_bundle(tiny / "model.onnx"), tiny / "model.onnx")


def test_in_place_rewrites_atomically(tiny):
    bundle = load_bundle(tiny)
    bundle.genai_config.data["model"]["note"] = "edited"
    save_bundle(bundle, None, in_place=True)
    again = load_bundle(tiny)
    assert again.genai_config.data["model"]["note"] == "edited"
    assert len(again.model.graph.initializers) == len(bundle.model.graph.initializers)
    assert not list(tiny.glob(".rope-passes-*"))


def test_file_input_file_output(tiny, tmp_path):
    written = save_bundle(load_bundle(tiny / "model.onnx"), tmp_path / "single" / "m.onnx")
    assert written == tmp_path / "single" / "m.onnx"
    assert (tmp_path / "single" / "m.onnx.data").is_file()
    assert (tmp_path / "single" / "genai_config.json").is_file()  # the config beside the input travels too


def test_unchanged_save_copies_bytes(tiny, tmp_path):
    # a file input: the model under its new name, its data file under the name the model references
    written = save_bundle(load_bundle(tiny / "model.onnx"), tmp_path / "single" / "m.onnx", unchanged=True)
    assert written.read_bytes() == (tiny / "model.onnx").read_bytes()
    assert (tmp_path / "single" / "model.onnx.data").read_bytes() == (tiny / "model.onnx.data").read_bytes()
    assert load_bundle(written).external_data_files == ["model.onnx.data"]
    # a folder input: the whole folder, byte for byte; in place: nothing written at all
    save_bundle(load_bundle(tiny), tmp_path / "copy", unchanged=True)
    assert digest(tmp_path / "copy") == digest(tiny)
    stamp = (tiny / "model.onnx").stat().st_mtime_ns
    assert save_bundle(load_bundle(tiny), None, in_place=True, unchanged=True) == tiny / "model.onnx"
    assert (tiny / "model.onnx").stat().st_mtime_ns == stamp


def test_save_bundle_decides_unchanged(tiny, tmp_path):
    """The caller says whether the graph changed; save_bundle decides the rest (config, IR version) in one place."""
    save_bundle(load_bundle(tiny), tmp_path / "same", graph_modified=False)
    assert digest(tmp_path / "same") == digest(tiny)
    edited = load_bundle(tiny)
    edited.genai_config.data["model"]["note"] = "edited"
    save_bundle(edited, tmp_path / "edited", graph_modified=False)
    assert json.loads((tmp_path / "edited" / "genai_config.json").read_text())["model"]["note"] == "edited"
    lowered = load_bundle(tiny)
    lowered.model.ir_version = 14
    save_bundle(lowered, tmp_path / "lowered", graph_modified=False)
    assert onnx.load(tmp_path / "lowered" / "model.onnx", load_external_data=False).ir_version == MAX_IR_VERSION


def test_layers_import_downward():
    """io <- pipeline <- lint <- api <- cli: no module imports one above it (no cycle hidden by a lazy import)."""
    import subprocess
    import sys

    below = {"rope_passes.io": ["rope_passes.pipeline", "rope_passes.lint", "rope_passes.api", "rope_passes.cli"],
             "rope_passes.pipeline": ["rope_passes.lint", "rope_passes.api", "rope_passes.cli"],
             "rope_passes.lint": ["rope_passes.api", "rope_passes.cli"],
             "rope_passes.api": ["rope_passes.cli"]}
    for module, above in below.items():
        code = f"import sys, {module}; print([m for m in {above!r} if m in sys.modules])"
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0 and result.stdout.strip() == "[]", (module, result.stdout, result.stderr)


def test_output_inside_input_folder_refused(tiny):
    with pytest.raises(ModelSaveError, match="inside the input folder"):
        save_bundle(load_bundle(tiny), tiny / "out" / "deeper")
    assert not (tiny / "out").exists()


@pytest.mark.parametrize("case", ["not_onnx", "truncated", "empty", "missing_data", "short_data", "no_model_dir",
                                  "missing_path"])
def test_bad_inputs_raise_one_line_errors(tiny, tmp_path, case):
    if case == "not_onnx":
        path = tmp_path / "x.onnx"
        path.write_text("hello, I am not a protobuf\n" * 10)
        expect = "not a readable ONNX model"
    elif case == "truncated":
        path = tmp_path / "t.onnx"
        path.write_bytes((tiny / "model.onnx").read_bytes()[:777])
        expect = "not a readable ONNX model"
    elif case == "empty":
        path = tmp_path / "e.onnx"
        path.write_bytes(b"")
        expect = "empty"
    elif case == "missing_data":
        (tiny / "model.onnx.data").unlink()
        path = tiny
        expect = "external data file 'model.onnx.data' is missing"
    elif case == "short_data":
        data = tiny / "model.onnx.data"
        data.write_bytes(data.read_bytes()[:1000])
        path = tiny
        expect = "is truncated"
    elif case == "no_model_dir":
        path = tmp_path / "empty_dir"
        path.mkdir()
        expect = "no .onnx model in this folder"
    else:
        path = tmp_path / "nope.onnx"
        expect = "no such file"
    with pytest.raises(ModelLoadError) as info:
        load_bundle(path)
    message = str(info.value)
    assert expect in message and "\n" not in message, message
