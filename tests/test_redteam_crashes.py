"""Red team 18's crashes (issue 18): malformed input gives a one-line error with exit code 2, never an internal
error (exit 3). Each test builds the bad input itself (tmp_path) and would have crashed before the fix."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rope_passes.errors import ModelLoadError, RopePassesError
from rope_passes.hf_config import HFConfig

LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2, "max_position_embeddings": 64,
         "rope_theta": 10000.0}


def _rope_error(tmp_path: Path, **changes) -> str:
    data = {**LLAMA, **changes}
    data = {k: v for k, v in data.items() if v is not ...}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    hf = HFConfig.load(path)
    with pytest.raises(ModelLoadError) as info:
        for layer_type in hf.layer_types():
            hf.rope(layer_type).describe()
    message = str(info.value)
    assert "\n" not in message
    return message


# -- (a) theta / partial_rotary_factor / rope_local_base_freq: a real finite number, checked before float() -------
@pytest.mark.parametrize("value", ["abc", [10000], {"a": 1}, True, math.nan, math.inf])
def test_theta_not_a_number(tmp_path, value):
    assert "rope_theta" in _rope_error(tmp_path, rope_theta=value)


@pytest.mark.parametrize("value", ["half", [0.5], math.nan, False])
def test_partial_rotary_factor_not_a_number(tmp_path, value):
    assert "partial_rotary_factor" in _rope_error(tmp_path, partial_rotary_factor=value)


def test_local_base_freq_not_a_number(tmp_path):
    assert "rope_local_base_freq 'x'" not in (m := _rope_error(tmp_path, rope_local_base_freq="x"))
    assert 'rope_local_base_freq "x"' in m


# -- (b) rope_scaling's numbers (describe formatted factor with :g) ---------------------------------------------------
@pytest.mark.parametrize("scaling", [
    {"rope_type": "linear", "factor": "2"}, {"rope_type": "linear", "factor": [2]},
    {"rope_type": "yarn", "factor": "4", "original_max_position_embeddings": 32},
    {"rope_type": "yarn", "factor": 4.0, "beta_fast": "x", "original_max_position_embeddings": 32},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": {"a": 1}, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 32},
])
def test_rope_scaling_numbers(tmp_path, scaling):
    message = _rope_error(tmp_path, rope_scaling=scaling)
    assert any(key in message for key in ("factor", "beta_fast")), message


# -- (c) LongRoPE's original context and max_position_embeddings: positive integers ----------------------------------
@pytest.mark.parametrize("orig", [-64, 0.5, "64", True])
def test_longrope_original_not_positive(tmp_path, orig):
    scaling = {"rope_type": "longrope", "short_factor": [1.0] * 16, "long_factor": [2.0] * 16,
               "original_max_position_embeddings": orig}
    assert "original_max_position_embeddings" in _rope_error(tmp_path, rope_scaling=scaling)


def test_longrope_top_level_original_negative(tmp_path):
    scaling = {"rope_type": "longrope", "short_factor": [1.0] * 16, "long_factor": [2.0] * 16}
    message = _rope_error(tmp_path, rope_scaling=scaling, original_max_position_embeddings=-64)
    assert "original_max_position_embeddings -64" in message


def test_max_position_embeddings_bool(tmp_path):
    assert "max_position_embeddings true" in _rope_error(tmp_path, max_position_embeddings=True)


def test_valid_configs_still_compute(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, "rope_scaling": {"rope_type": "linear", "factor": 2},
                                "partial_rotary_factor": 1}))
    rope = HFConfig.load(path).rope()
    assert "factor 2" in rope.describe() and rope.rotary_dim == 32


# -- the same through the CLI (optimize --target exporter --hf-config): exit 2, one line ----------------------------
FIXTURES = Path(__file__).parent / "fixtures"


def _cli(capsys, argv: list[str]) -> tuple[int, str]:
    from rope_passes.cli import main

    code = main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return code, "\n".join(err)


def _one_line_exit_2(capsys, argv: list[str], *says: str) -> str:
    code, err = _cli(capsys, argv)
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("rope-passes: error: "), err
    for word in says:
        assert word in err, err
    return err


@pytest.mark.corpus
@pytest.mark.parametrize(("edit", "says"), [
    (lambda c: c.update(rope_theta="abc"), "rope_theta"),
    (lambda c: c.update(partial_rotary_factor=math.nan), "partial_rotary_factor"),
    (lambda c: c["rope_scaling"].update(original_max_position_embeddings=-64), "original_max_position_embeddings"),
    (lambda c: c.update(max_position_embeddings=True), "max_position_embeddings"),
])
def test_malformed_hf_config_cli(tmp_path, capsys, edit, says):
    config = json.loads((FIXTURES / "hf_rope" / "tf4" / "phi3_longrope" / "config.json").read_text())
    edit(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = FIXTURES / "torch" / "tf4" / "optimum" / "phi3_longrope" / "decode.onnx"
    _one_line_exit_2(capsys, ["optimize", str(model), "-o", str(tmp_path / "o.onnx"), "--target", "exporter",
                              "--max-positions", "128", "--hf-config", str(tmp_path / "config.json")], says)
