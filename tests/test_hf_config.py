"""``rope_passes.hf_config``: the Hugging Face config beside an exported model and the NumPy RoPE tables it defines.

References: ``tests/fixtures/hf_rope`` (``tools/make_hf_rope_refs.py``: transformers 5.23 and 4.57 gave bit-identical
arrays, so one set is kept): the configs of the torch corpus variants in both layouts (transformers 4: rope_theta +
rope_scaling; 5: rope_parameters) and transformers' own inv_freq and cos/sin for positions 0..255 (LongRoPE: also
the short call 0..63; Gemma3: both layer types). inv_freq, hence the float32 angles, must be bit-identical; cos/sin
within 2 float32 ulps (transformers' float32 cos/sin come from the CPU's vector math library and are not correctly
rounded; ours are).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rope_passes.errors import ModelLoadError
from rope_passes.hf_config import HFConfig, use_hf_config
from rope_passes.report import MatchFailure

pytestmark = pytest.mark.corpus  # reads the generated fixtures

REFS = Path(__file__).parent / "fixtures" / "hf_rope"
VARIANTS = sorted(p.name for p in (REFS / "tf5").iterdir() if (p / "inv_freq.npy").is_file())
CASES = [(tf, v) for tf in ("tf4", "tf5") for v in VARIANTS]


def _refs(variant: str, layer_type: str | None, suffix: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    local = "_local" if layer_type == "sliding_attention" else ""
    folder = REFS / "tf5" / variant
    return tuple(np.load(folder / f"{kind}{local}{suffix}.npy") for kind in ("inv_freq", "cos", "sin"))


def test_references_are_there():
    assert len(VARIANTS) == 14, VARIANTS  # 16 corpus variants less mRoPE and dynamic NTK


@pytest.mark.parametrize(("tf", "variant"), CASES, ids=[f"{t}-{v}" for t, v in CASES])
def test_tables_equal_transformers(tf, variant):
    config = HFConfig.load(REFS / tf / variant)
    assert config.max_position_embeddings == 256
    for layer_type in config.layer_types():
        rope = config.rope(layer_type)
        for long, suffix in ([(True, ""), (False, "_short")] if rope.switches else [(False, "")]):
            inv_freq, cos_ref, sin_ref = _refs(variant, layer_type, suffix)
            np.testing.assert_array_equal(rope.inv_freq(long), inv_freq)  # bit-identical: same float32 arithmetic
            cos, sin = rope.tables(len(cos_ref), long)
            assert cos.dtype == sin.dtype == np.float32 and cos.shape == cos_ref.shape
            for ours, theirs in ((cos, cos_ref), (sin, sin_ref)):
                ulps = np.abs(ours.astype(np.float64) - theirs) / np.spacing(np.maximum(np.abs(theirs), 1e-30))
                assert ulps.max() <= 2, f"{variant} {layer_type} {suffix}: {ulps.max()} ulps"
                assert (ours != theirs).mean() < 0.15  # measured 1.5%..8%: an ulp here and there


def test_what_the_configs_say():
    phi4 = HFConfig.load(REFS / "tf4" / "phi4mini_longrope_partial").rope()
    assert (phi4.kind, phi4.rotary_dim, phi4.original_max, phi4.switches) == ("longrope", 12, 64, True)
    assert phi4.attention_scaling == pytest.approx((1 + np.log(4) / np.log(64)) ** 0.5)
    yarn = HFConfig.load(REFS / "tf5" / "llama_yarn").rope()
    assert yarn.attention_scaling == pytest.approx(1 + 0.1 * np.log(4))
    for tf in ("tf4", "tf5"):
        gemma3 = HFConfig.load(REFS / tf / "gemma3_text")
        ropes = {t: gemma3.rope(t) for t in gemma3.layer_types()}
        assert set(ropes) == {"full_attention", "sliding_attention"}
        assert (ropes["full_attention"].kind, ropes["full_attention"].theta) == ("linear", 1e6)
        assert (ropes["sliding_attention"].kind, ropes["sliding_attention"].theta) == ("default", 1e4)
    assert "partial_rotary_factor 0.75 (rotary dim 12)" in phi4.describe()


@pytest.mark.parametrize("tf", ["tf4", "tf5"])
def test_dynamic_ntk_is_refused_with_the_reason(tf):
    config = HFConfig.load(REFS / tf / "llama_dynamic")
    with pytest.raises(MatchFailure) as info:
        config.rope()
    assert info.value.refused
    assert "rope_type 'dynamic' (dynamic NTK) rescales the frequencies from the call's largest position" in \
        info.value.reason


def test_unknown_rope_type_is_refused(tmp_path):
    data = json.loads((REFS / "tf4" / "llama" / "config.json").read_text())
    data["rope_scaling"] = {"rope_type": "su-per", "factor": 2.0}
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(MatchFailure, match="rope_type 'su-per' is not one rope-passes computes"):
        HFConfig.load(tmp_path).rope()


def test_found_beside_the_model_or_given(tmp_path):
    model = tmp_path / "m" / "model.onnx"
    model.parent.mkdir()
    model.write_bytes(b"")
    assert HFConfig.find(model) is None
    (model.parent / "model_config.json").write_text((REFS / "tf4" / "phi3" / "config.json").read_text())
    assert HFConfig.find(model).path.name == "model_config.json"
    (model.parent / "config.json").write_text((REFS / "tf4" / "qwen2" / "config.json").read_text())
    assert HFConfig.find(model.parent).data["model_type"] == "qwen2"  # config.json first, folder or file
    given = HFConfig.find(model, REFS / "tf5" / "mistral")
    assert given.data["model_type"] == "mistral"
    with use_hf_config(REFS / "tf5" / "gemma"):
        assert HFConfig.find(model).data["model_type"] == "gemma"
    assert HFConfig.find(model).data["model_type"] == "qwen2"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text('{"not": "a model config"}')
    assert HFConfig.find(tmp_path / "other" / "x.onnx") is None  # some other tool's config.json


def test_bad_config_is_a_load_error(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        HFConfig.load(tmp_path / "config.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no config.json or model_config.json in this folder"):
        HFConfig.load(tmp_path / "empty")
    with pytest.raises(ModelLoadError, match="cannot read the Hugging Face config"):
        HFConfig.load(tmp_path / "missing.json")
