"""`optimize` with a no-op pipeline round-trips every genai corpus model: same files, same config, input untouched,
and bit-identical outputs on onnxruntime-webgpu (same graph, same kernels, same inputs → same bits)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import GENAI, UNLOADABLE, genai_models

import rope_passes
from rope_passes.check.decode import DecoderSpec, run_decode, token_ids
from rope_passes.runtime.sessions import create_session

pytestmark = [pytest.mark.corpus]  # every test here: see tests/conftest.py


def node_signature(model: onnx.ModelProto) -> list[tuple]:
    """Nodes as (op, name, inputs, outputs); trailing omitted optional inputs ('') are not significant."""
    def inputs(n):
        names = list(n.input)
        while names and names[-1] == "":
            names.pop()
        return names
    return [(n.domain, n.op_type, n.name, inputs(n), list(n.output)) for n in model.graph.node]


def tree_digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def run_two_steps(model_path: Path, genai_config: dict) -> list[np.ndarray]:
    """A 4-token prefill and one decode step on WebGPU; every output of both calls."""
    sess = create_session(str(model_path), "webgpu")
    spec = DecoderSpec.from_session(sess, genai_config)
    steps = run_decode(sess, spec, token_ids(5), prefill=4, steps=1)
    return [step[name] for step in steps for name in spec.outputs]


@pytest.mark.webgpu
@pytest.mark.parametrize("name", genai_models())
def test_noop_optimize_round_trips(name, tmp_path):
    src = GENAI / name
    before = tree_digest(src)
    report = rope_passes.optimize(str(src), str(tmp_path / "out"), passes=["cleanup"])
    out = tmp_path / "out"
    assert tree_digest(src) == before, "input folder modified"
    assert not report.modified, [p.status for p in report.passes]
    assert sorted(p.name for p in out.iterdir()) == sorted(before), "files lost or added"
    ir_version = onnx.load(src / "model.onnx", load_external_data=False).ir_version
    # "unchanged" holds at file level: every file is the input's bytes (unless the IR version had to come down)
    assert report.copied_verbatim == (ir_version <= 13)
    if report.copied_verbatim:
        assert tree_digest(out) == before
    assert json.loads((out / "genai_config.json").read_text()) == json.loads((src / "genai_config.json").read_text())
    a = onnx.load(src / "model.onnx", load_external_data=False)
    b = onnx.load(out / "model.onnx", load_external_data=False)
    assert b.ir_version <= 13
    assert node_signature(a) == node_signature(b)
    assert {(o.domain, o.version) for o in a.opset_import} == {(o.domain, o.version) for o in b.opset_import}
    assert {p.key: p.value for p in a.metadata_props} == {p.key: p.value for p in b.metadata_props}
    if name in UNLOADABLE:
        # no onnxruntime can run it; the weights must still be the same bytes
        full_a, full_b = onnx.load(src / "model.onnx"), onnx.load(out / "model.onnx")
        assert {i.name: onnx.numpy_helper.to_array(i).tobytes() for i in full_a.graph.initializer} == {
            i.name: onnx.numpy_helper.to_array(i).tobytes() for i in full_b.graph.initializer}
        return
    config = json.loads((src / "genai_config.json").read_text())
    for x, y in zip(run_two_steps(src / "model.onnx", config), run_two_steps(out / "model.onnx", config)):
        np.testing.assert_array_equal(x, y)


def test_noop_optimize_copies_every_torch_export_byte_for_byte(tmp_path):
    """The 62 exporter graphs through the default preset: nothing in them is genai mRoPE, so each output must be the
    input's bytes (and the data file beside it, where there is one), never a re-serialization."""
    from conftest import TORCH

    models = sorted(TORCH.rglob("*.onnx"))
    assert len(models) == 62, "shared torch corpus missing or changed"
    for i, src in enumerate(models):
        out = tmp_path / f"{i}" / "out.onnx"
        report = rope_passes.optimize(str(src), str(out), preset="webgpu")
        assert not report.modified and report.copied_verbatim, (src, [p.status for p in report.passes])
        assert out.read_bytes() == src.read_bytes(), src
        for data in rope_passes.load_bundle(src).external_data_files:
            assert (out.parent / data).read_bytes() == (src.parent / data).read_bytes(), (src, data)
