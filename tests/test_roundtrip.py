"""`optimize` with a no-op pipeline round-trips every genai corpus model: same files, same config, input untouched,
and bit-identical outputs on onnxruntime-webgpu (same graph, same kernels, same inputs → same bits)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

import rope_passes
from rope_passes.check.runtime import create_session

from conftest import GENAI, UNLOADABLE, genai_models

ORT_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float)": np.float32,
             "tensor(float16)": np.float16}


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


def feeds_for(sess, genai_config: dict, tokens: np.ndarray, past: dict | None) -> dict[str, np.ndarray]:
    """Prefill (past=None) or one decode step: the inputs each graph declares, from one token sequence."""
    decoder = genai_config["model"]["decoder"]
    seq = tokens.shape[1]
    past_len = 0 if past is None else next(iter(past.values())).shape[2]
    total = past_len + seq
    rng = np.random.RandomState(1)
    out = {}
    for i in sess.get_inputs():
        dtype = ORT_TYPES[i.type]
        if i.name == "input_ids":
            out[i.name] = tokens.astype(dtype)
        elif i.name == "inputs_embeds":
            table = rng.standard_normal((512, i.shape[-1])).astype(dtype) * 0.5
            out[i.name] = table[tokens]
        elif i.name == "attention_mask":
            out[i.name] = np.ones((1, total), dtype)
        elif i.name == "position_ids":
            pos = np.arange(past_len, total, dtype=dtype)[None]
            out[i.name] = np.broadcast_to(pos, (3, 1, seq)).copy() if len(i.shape) == 3 else pos
        elif i.name.startswith("past_key_values."):
            out[i.name] = past[i.name] if past is not None else np.zeros(
                (1, i.shape[1], 0, decoder["head_size"]), dtype)
        else:
            raise AssertionError(f"unexpected input {i.name}")
    return out


def run_two_steps(model_path: Path, genai_config: dict) -> list[np.ndarray]:
    sess = create_session(str(model_path), "webgpu")
    names = [o.name for o in sess.get_outputs()]
    tokens = np.random.RandomState(0).randint(4, 492, size=(1, 5))
    outs = dict(zip(names, sess.run(None, feeds_for(sess, genai_config, tokens[:, :4], None))))
    past = {n.replace("present.", "past_key_values."): v for n, v in outs.items() if n.startswith("present.")}
    outs2 = dict(zip(names, sess.run(None, feeds_for(sess, genai_config, tokens[:, 4:], past))))
    return [outs[n] for n in names] + [outs2[n] for n in names]


@pytest.mark.parametrize("name", genai_models())
def test_noop_optimize_round_trips(name, tmp_path):
    src = GENAI / name
    before = tree_digest(src)
    report = rope_passes.optimize(str(src), str(tmp_path / "out"), passes=["cleanup"])
    out = tmp_path / "out"
    assert tree_digest(src) == before, "input folder modified"
    assert not report.modified, [p.status for p in report.passes]
    assert sorted(p.name for p in out.iterdir()) == sorted(before), "files lost or added"
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
