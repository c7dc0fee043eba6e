"""``rope_passes.hf_config``: the Hugging Face config beside an exported model and the NumPy RoPE tables it defines.

References: ``tests/fixtures/hf_rope`` (``tools/make_hf_rope_refs.py``: transformers 5.23 and 4.57 gave bit-identical
arrays, so one set is kept): the configs of the torch corpus variants in both layouts (transformers 4: rope_theta +
rope_scaling; 5: rope_parameters) and transformers' own inv_freq and cos/sin for positions 0..255 (LongRoPE: also
the short call 0..63; Gemma3: both layer types). inv_freq, hence the float32 angles, must be bit-identical; cos/sin
within 2 float32 ulps (transformers' float32 cos/sin come from the CPU's vector math library and are not correctly
rounded; ours are).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from rope_passes.errors import ModelLoadError
from rope_passes.hf_config import INV_FREQ_ULPS, HFConfig
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


# --- the conformance model (issue 21): per-layer rope, layout, tolerance, against transformers' own tables ----------

MOBIUS = Path(__file__).parent / "fixtures" / "mobius"
MOBIUS_FAMILIES = sorted(p.parent.parent.name for p in MOBIUS.glob("*/hf_rope/cos*.npy"))


def _hf_table(family: str, layer_type: str | None) -> tuple[np.ndarray, np.ndarray]:
    folder = MOBIUS / family / "hf_rope"
    suffix = f"_{layer_type}" if layer_type and (folder / f"cos_{layer_type}.npy").is_file() else ""
    return np.load(folder / f"cos{suffix}.npy"), np.load(folder / f"sin{suffix}.npy")


@pytest.mark.parametrize("family", sorted(set(MOBIUS_FAMILIES)))
def test_every_layer_within_float32_rounding_of_transformers(family):
    """Each layer's rope (type, layout, partial width, NoPE) gives transformers' cos/sin module output (``tools/
    make_mobius_rope_refs.py``) within :meth:`Rope.tolerance`, and that bound is tight: most entries bit-equal."""
    config = HFConfig.load(MOBIUS / family / "webgpu_f32" / "hf_config.json")
    assert config.num_layers == 2
    for layer in range(2):
        rope = config.layer_rope(layer)
        if rope is None:
            assert family == "smollm3" and layer == 1  # no_rope_layers [1, 0]
            continue
        cos_ref, sin_ref = _hf_table(family, rope.layer_type)
        layout = "cache" if cos_ref.shape[1] == rope.rotary_dim // 2 else None
        cos, sin = rope.tables(len(cos_ref), layout=layout)
        assert cos.shape == cos_ref.shape, (family, cos.shape, cos_ref.shape)
        tol = rope.tolerance(len(cos_ref))
        if layout is None:
            tol = np.repeat(tol, 2, axis=1) if rope.table_interleaved else np.concatenate([tol, tol], axis=1)
        for ours, theirs in ((cos, cos_ref), (sin, sin_ref)):
            diff = np.abs(ours.astype(np.float64) - theirs)
            assert (diff <= tol).all(), f"{family} layer {layer}: {diff.max():.3g} (tol {tol.max():.3g})"
            assert (ours == theirs).mean() > 0.85


def test_layouts_and_layers_the_configs_say():
    cohere = HFConfig.load(MOBIUS / "cohere/webgpu_f32/hf_config.json").rope()
    assert cohere.interleaved and cohere.table_interleaved
    ernie = HFConfig.load(MOBIUS / "ernie4_5/webgpu_f32/hf_config.json").rope()
    assert ernie.interleaved and not ernie.table_interleaved  # cat(f, f), repeated inside apply_rotary_pos_emb
    gptj = HFConfig.load(MOBIUS / "gptj/webgpu_f32/hf_config.json")  # n_positions, n_embd, n_head, rotary_dim
    assert (gptj.max_position_embeddings, gptj.head_dim, gptj.rope().rotary_dim, gptj.rope().interleaved) == \
        (256, 32, 16, True)
    assert not HFConfig.load(MOBIUS / "llama_yarn/webgpu_f32/hf_config.json").rope().interleaved
    smol = HFConfig.load(MOBIUS / "smollm3/webgpu_f32/hf_config.json")
    assert smol.layer_rope(0) is not None and smol.layer_rope(1) is None
    gemma3 = HFConfig.load(MOBIUS / "gemma3_text/webgpu_f32/hf_config.json")
    assert [gemma3.layer_rope(i).layer_type for i in range(2)] == ["sliding_attention", "full_attention"]
    tf4 = HFConfig.load(REFS / "tf4" / "gemma3_text")  # sliding_window_pattern: every 6th layer global
    if tf4.data.get("sliding_window_pattern"):
        assert [tf4.layer_type_of(i) for i in (0, 5)] == ["sliding_attention", "full_attention"]


def test_yarn_tolerance_covers_torch_pow_and_nothing_like_a_defect():
    """GPT-OSS-style YaRN (theta 150000): torch's float32 pow is 1 ulp off the correctly rounded power in dims 6
    and 10 (what made RP402 fire past position ~1050 with a flat 1e-5). The bound grows with the position, stays
    far below any real defect (a theta or factor off moves cos by 1e-2 and more within the first rows)."""
    tiny = HFConfig.load(MOBIUS / "gpt_oss/webgpu_f32/hf_config.json").rope()
    # GPT-OSS-20b's own numbers: head_dim 64, factor 32, original 4096
    rope = dataclasses.replace(tiny, head_dim=64, params={**tiny.params, "factor": 32.0,
                                                          "original_max_position_embeddings": 4096})
    rows = 4096
    tol = rope.tolerance(rows)
    assert tol[1].max() < 2e-6 and 1e-5 < tol[rows - 1].max() < 5e-3
    one_ulp = rope.inv_freq().copy()
    one_ulp[[6, 10]] = np.nextafter(one_ulp[[6, 10]], np.float32(1))  # what torch gives there
    angles = (np.arange(rows, dtype=np.float32)[:, None] * one_ulp).astype(np.float64)
    cos_torchlike = (np.cos(angles) * np.float32(rope.attention_scaling)).astype(np.float32)
    cos, _ = rope.tables(rows, layout="cache")
    diff = np.abs(cos_torchlike.astype(np.float64) - cos)
    assert diff.max() > 1e-5 and (diff <= tol).all()  # a flat 1e-5 calls this correct table wrong
    wrong = dataclasses.replace(rope, params={**rope.params, "factor": 32.5}).tables(rows, layout="cache")[0]
    assert (np.abs(wrong.astype(np.float64) - cos) > tol).any(axis=1).argmax() < 64


@pytest.mark.parametrize("tf", ["tf4", "tf5"])
def test_dynamic_ntk_model_equals_transformers_per_call_length(tf):
    """Asked for, dynamic NTK is modelled per call: transformers' rotary module's inv_freq after a call of L
    positions (``tools/make_dynamic_refs.py``): bit-equal up to max_position_embeddings and just past it, within
    the tolerance's INV_FREQ_ULPS where torch's float32 pow is an ulp or two off the correctly rounded one."""
    rope = HFConfig.load(REFS / tf / "llama_dynamic").rope(dynamic=True)
    assert rope.kind == "dynamic"
    for length, ulps in ((256, 0), (300, 0), (512, 1), (1000, 2)):
        ref = np.load(REFS / "tf5" / "llama_dynamic" / f"dynamic_inv_freq_{length}.npy")
        got = rope.dynamic_inv_freq(length)
        assert np.abs(got.view(np.int32) - ref.view(np.int32)).max() == ulps <= INV_FREQ_ULPS
    np.testing.assert_array_equal(rope.inv_freq(), np.load(REFS / "tf5" / "llama_dynamic" / "dynamic_inv_freq_256.npy"))
