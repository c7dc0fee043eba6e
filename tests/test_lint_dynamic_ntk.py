"""Lint RP404 on dynamic NTK configs (issue 21, red team 21 M15).

transformers' dynamic NTK (``rope_type: dynamic``) rotates every call up to ``max_position_embeddings`` by the
default frequencies (``dynamic_rope_update`` rescales the base only for longer calls). mobius-onnx 0.1.0 bakes the
NTK-scaled base ``theta × factor ** (d / (d - 2))`` into its one table, so every such call is rotated wrong from
position 1: RP404 reports it per layer. A table with the default base is right for every call it can serve: no
RP404, only RP403's warning about the longer calls. The expected numbers are computed here with NumPy alone.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from conftest import FIXTURES

from rope_passes.lint import lint_bundle
from rope_passes.plan import lint_plan

pytestmark = pytest.mark.corpus

SOURCE = FIXTURES / "mobius" / "llama_yarn" / "webgpu_f32"  # 2 layers, head_dim 32, max_position_embeddings 512
THETA, FACTOR, DIM, MAX_POS = 10000.0, 2.0, 32, 512
NAMES = ("model.rotary_emb.cos_cache", "model.rotary_emb.sin_cache")


def _numpy_tables(theta: float, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Independent of rope_passes: ``[rows, DIM / 2]`` float32 cos/sin of ``p / theta ** (2i / DIM)``."""
    inv = 1.0 / theta ** (np.arange(0, DIM, 2, dtype=np.float64) / DIM)
    angles = np.arange(rows, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


SCALED_THETA = THETA * FACTOR ** (DIM / (DIM - 2))  # what mobius bakes in: 20945.9


def _folder(tmp_path: Path, theta: float, tables: tuple[np.ndarray, np.ndarray] | None = None) -> Path:
    """The 2-layer mobius graph with its cos/sin caches replaced (``tables``, else the ``theta`` ones), a dynamic
    NTK config beside it."""
    model = ir.load(SOURCE / "model.onnx")
    for name, table in zip(NAMES, tables or _numpy_tables(theta, MAX_POS)):
        model.graph.initializers[name].const_value = ir.tensor(table, name=name)
    ir.save(model, tmp_path / "model.onnx", external_data="model.onnx.data")
    shutil.copy(SOURCE / "genai_config.json", tmp_path / "genai_config.json")
    config = json.loads((SOURCE / "hf_config.json").read_text())
    config["rope_parameters"] = {"rope_type": "dynamic", "factor": FACTOR, "rope_theta": THETA}
    (tmp_path / "hf_config.json").write_text(json.dumps(config))
    return tmp_path


def _lint(folder: Path) -> list:
    plan = lint_plan(hf_config=str(folder / "hf_config.json"))
    return lint_bundle(str(folder), plan, select=["RP401", "RP402", "RP403", "RP404"])


def test_source_graph_is_what_the_test_assumes():
    config = json.loads((SOURCE / "hf_config.json").read_text())
    assert (config["head_dim"], config["max_position_embeddings"], config["num_hidden_layers"]) == (DIM, MAX_POS, 2)
    model = ir.load(SOURCE / "model.onnx")
    assert [model.graph.initializers[n].const_value.shape[0] for n in NAMES] == [MAX_POS, MAX_POS]


def test_ntk_scaled_table_is_an_error_per_layer(tmp_path):
    found = _lint(_folder(tmp_path, SCALED_THETA))
    assert sorted(d.code for d in found) == ["RP403", "RP404", "RP404"], [(d.code, d.message) for d in found]
    # expected by NumPy alone: the first position the scaled table differs at, and by how much
    want_cos, _ = _numpy_tables(THETA, MAX_POS)
    got_cos, _ = _numpy_tables(SCALED_THETA, MAX_POS)
    diff = np.abs(got_cos.astype(np.float64) - want_cos.astype(np.float64))
    first = int(np.flatnonzero((diff > 1e-5).any(axis=1))[0])
    at_first, worst = diff[first].max(), diff.max()
    assert first == 1 and at_first == pytest.approx(0.0133, abs=5e-4) and worst > 1.9
    messages = sorted(d.message for d in found if d.code == "RP404")
    for layer, text in enumerate(messages):
        assert text.startswith(f"layer {layer} (GroupQueryAttention "), text
        assert "'model.rotary_emb.cos_cache'" in text and f"from position {first} on" in text, text
        assert f"by {at_first:.3g} there, up to {worst:.3g}" in text, text
        assert "dynamic rope, theta 10000, factor 2" in text and "max_position_embeddings 512" in text, text
        assert "the table uses the NTK-scaled base" in text and f"= {SCALED_THETA:.6g}" in text, text
        assert "uses the default frequencies (theta 10000) up to max_position_embeddings 512" in text, text
    (warning,) = [d for d in found if d.code == "RP403"]
    assert "dynamic NTK" in warning.message and "longer calls" in warning.message


def test_default_table_is_conformant_below_max_position_embeddings(tmp_path):
    found = _lint(_folder(tmp_path, THETA))
    assert [d.code for d in found] == ["RP403"], [(d.code, d.message) for d in found]


def test_rows_past_max_position_embeddings_are_not_compared(tmp_path):
    """A table longer than max_position_embeddings: its first 512 rows (calls up to 512) are the default ones; the
    rows after it serve only longer calls, which no static table serves (RP403's)."""
    cos, sin = _numpy_tables(THETA, MAX_POS)
    long_cos, long_sin = _numpy_tables(SCALED_THETA, 2 * MAX_POS)
    tables = (np.concatenate([cos, long_cos[MAX_POS:]]), np.concatenate([sin, long_sin[MAX_POS:]]))
    assert [d.code for d in _lint(_folder(tmp_path, THETA, tables))] == ["RP403"]


def test_a_table_wrong_from_a_later_position_names_it(tmp_path):
    cos, sin = _numpy_tables(THETA, MAX_POS)
    cos[300] += 0.25
    found = [d for d in _lint(_folder(tmp_path, THETA, (cos, sin))) if d.code == "RP404"]
    said = "from position 300 on, in calls up to max_position_embeddings 512 (by 0.25 there"
    assert len(found) == 2 and all(said in d.message for d in found)
    assert all("the table is not the default frequencies' table" in d.message for d in found)
