"""Red team 18's crashes (issue 18): malformed input gives a one-line error with exit code 2, never an internal
error (exit 3). Each test builds the bad input itself (tmp_path) and would have crashed before the fix."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rope_passes.errors import ModelLoadError
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


# -- (d) one parser for multiRotaryCacheConcatOffset; (e) the offset as a plain session config entry ------------------
from rope_passes.config import CONCAT_OFFSET_SESSION_ENTRY, GenaiConfig, parse_concat_offset  # noqa: E402

LLAMA_GENAI = "current/llama/webgpu_fp16"


def _genai(options: dict | None = None, session: dict | None = None, **decoder) -> dict:
    webgpu = {"enableGraphCapture": "0", **(options or {})}
    return {"model": {"decoder": {"head_size": 32, "session_options": {"provider_options": [{"webgpu": webgpu}],
                                                                       **(session or {})}, **decoder}}}


@pytest.mark.parametrize(("value", "offset"), [(32, 32), ("32", 32), ("32.0", 32), (32.0, 32), ("32 ", 32),
                                               ("0", 0), (0, 0)])
def test_offset_parser_accepts_integers(value, offset):
    assert parse_concat_offset(value) == offset
    assert GenaiConfig(_genai({"multiRotaryCacheConcatOffset": value})).concat_offset == (offset or None)


@pytest.mark.parametrize("value", ["3.2e1", True, None, [32], "-32", "+32", "32.5", 32.5, "99999999999999999999", " 32", " 32 ", "\t32", "²",
                                   "abc", "", {"a": 1}])
def test_offset_parser_refuses_the_rest(tmp_path, value):
    path = tmp_path / "genai_config.json"
    path.write_text(json.dumps(_genai({"multiRotaryCacheConcatOffset": value})))
    with pytest.raises(ModelLoadError) as info:
        GenaiConfig.load(path)
    assert "multiRotaryCacheConcatOffset" in str(info.value) and "\n" not in str(info.value)


def test_offset_session_entry_is_read():
    config = GenaiConfig(_genai(session={CONCAT_OFFSET_SESSION_ENTRY: "32"}))
    assert config.concat_offset == 32 and config.concat_offset_session_entry
    same = GenaiConfig(_genai({"multiRotaryCacheConcatOffset": "32"}, session={CONCAT_OFFSET_SESSION_ENTRY: 32}))
    assert same.concat_offset == 32
    with pytest.raises(ModelLoadError, match="two different offsets"):
        _ = GenaiConfig(_genai({"multiRotaryCacheConcatOffset": "32"},
                               session={CONCAT_OFFSET_SESSION_ENTRY: "64"})).concat_offset


def _llama(tmp_path: Path, edit) -> Path:
    from _utils import copy_folder
    from conftest import GENAI

    return copy_folder(GENAI / LLAMA_GENAI, tmp_path / "llama", lambda config: edit(config["model"]["decoder"]))


def _set_option(key, value):
    return lambda d: d["session_options"]["provider_options"][0]["webgpu"].__setitem__(key, value)


@pytest.mark.corpus
@pytest.mark.parametrize("value", ["32.0", 32.0])
def test_integral_float_offset_is_32(tmp_path, capsys, value):
    """G05: "32.0" crashed lint and optimize (int('32.0')); onnxruntime-webgpu applies it as 32: RP208, removed."""
    folder = _llama(tmp_path, _set_option("multiRotaryCacheConcatOffset", value))
    code, _ = _cli(capsys, ["lint", str(folder), "--select", "RP208"])
    assert code == 1
    code, err = _cli(capsys, ["optimize", str(folder), "-o", str(tmp_path / "out"), "--target", "webgpu"])
    assert code == 0, err
    assert "multiRotaryCacheConcatOffset" not in (tmp_path / "out" / "genai_config.json").read_text()


@pytest.mark.corpus
@pytest.mark.parametrize("value", ["3.2e1", True, None, [32]])
def test_malformed_offset_is_one_line_exit_2(tmp_path, capsys, value):
    """G05 / X10: the lint and removal paths crashed on int('3.2e1'), int('True'), int('None'), int('[32]')."""
    folder = _llama(tmp_path, _set_option("multiRotaryCacheConcatOffset", value))
    _one_line_exit_2(capsys, ["optimize", str(folder), "-o", str(tmp_path / "out"), "--target", "webgpu-graph"],
                     "multiRotaryCacheConcatOffset")
    _one_line_exit_2(capsys, ["lint", str(folder)], "multiRotaryCacheConcatOffset")


@pytest.mark.corpus
def test_offset_as_session_entry_is_linted_and_removed(tmp_path, capsys):
    """G04: session_options["ep.webgpuexecutionprovider.multiRotaryCacheConcatOffset"] on a plain llama: onnxruntime-genai
    passes it to the WebGPU EP; lint says RP208 and optimize removes it (and reports the removal)."""
    folder = _llama(tmp_path, lambda d: d["session_options"].__setitem__(CONCAT_OFFSET_SESSION_ENTRY, "32"))
    from rope_passes.cli import main

    assert main(["lint", str(folder), "--select", "RP208"]) == 1
    assert "RP208" in capsys.readouterr().out
    report = tmp_path / "report.json"
    code, err = _cli(capsys, ["optimize", str(folder), "-o", str(tmp_path / "out"), "--target", "webgpu",
                              "--report", str(report)])
    assert code == 0, err
    assert "multiRotaryCacheConcatOffset" not in (tmp_path / "out" / "genai_config.json").read_text()
    assert CONCAT_OFFSET_SESSION_ENTRY in report.read_text() and "removed" in report.read_text()


# -- (h) genai_config parts of the wrong JSON type: one line, exit 2, naming the key ---------------------------------
@pytest.mark.parametrize(("edit", "key"), [
    (lambda d: d["session_options"].__setitem__("provider_options", {"webgpu": {}}), "provider_options"),
    (lambda d: d["session_options"].__setitem__("provider_options", "webgpu"), "provider_options"),
    (lambda d: d["session_options"].__setitem__("provider_options", ["webgpu"]), "provider_options[0]"),
    (lambda d: d.__setitem__("session_options", [{"provider_options": []}]), "session_options"),
    (lambda d: d.__setitem__("head_size", "32"), "head_size"),
    (lambda d: d.__setitem__("head_size", True), "head_size"),
])
def test_genai_config_wrong_types(tmp_path, edit, key):
    config = _genai()
    edit(config["model"]["decoder"])
    path = tmp_path / "genai_config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ModelLoadError) as info:
        GenaiConfig.load(path)
    assert key in str(info.value) and "\n" not in str(info.value)


@pytest.mark.corpus
@pytest.mark.parametrize(("edit", "key"), [
    (lambda d: d["session_options"].__setitem__("provider_options", {"webgpu": {}}), "provider_options"),
    (lambda d: d.__setitem__("session_options", []), "session_options"),
    (lambda d: d.__setitem__("head_size", "32"), "head_size"),
])
def test_genai_config_wrong_types_cli(tmp_path, capsys, edit, key):
    folder = _llama(tmp_path, edit)
    _one_line_exit_2(capsys, ["optimize", str(folder), "-o", str(tmp_path / "out"), "--target", "webgpu-graph"], key)


# -- (i) --max-positions past any table: a usage error, not numpy's "Maximum allowed size exceeded" ------------------
@pytest.mark.parametrize("rows", ["99999999999999999999", str(2**31)])
def test_max_positions_huge(tmp_path, capsys, rows):
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")  # never read: the option is checked first
    _one_line_exit_2(capsys, ["optimize", str(model), "-o", str(tmp_path / "o.onnx"), "--target", "exporter",
                              "--max-positions", rows], "--max-positions")


# -- (f) longrope-concat's Q/K/V pack and (g) unfuse-gqa-qk-norm on graphs without value_info: typed new values -----
def _copy_corpus(tmp_path: Path, rel: str) -> Path:
    import shutil

    from tests.conftest import GENAI

    folder = tmp_path / rel.replace("/", "_")
    shutil.copytree(GENAI / rel, folder)
    for p in folder.iterdir():
        p.chmod(0o644)
    return folder


def _save(model, folder: Path) -> None:
    import onnx

    model.ir_version = 10
    (folder / "model.onnx.data").unlink()
    onnx.save(model, str(folder / "model.onnx"), save_as_external_data=True, location="model.onnx.data",
              size_threshold=1024)


def _loads_on_cpu(path: Path) -> None:
    import onnxruntime as ort

    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.corpus
def test_pack_qkv_of_untyped_split(tmp_path, capsys):
    """X01: phi3 (If short/long) whose GroupQueryAttention reads q/k/v from a Split with no value_info: the packing
    Concat's output had no dtype -> SerdeError on save (internal error)."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    folder = _copy_corpus(tmp_path, "current/phi3_mini_128k/webgpu_fp32")
    head = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]["head_size"]
    model = onnx.load(str(folder / "model.onnx"))
    nodes = []
    for node in model.graph.node:
        if node.op_type == "GroupQueryAttention":
            attrs = {a.name: a.i for a in node.attribute}
            heads, kv = attrs["num_heads"], attrs["kv_num_heads"]
            sizes = numpy_helper.from_array(np.array([heads * head, kv * head, kv * head], np.int64),
                                            node.name + "/split_sizes")
            model.graph.initializer.append(sizes)
            qkv = [f"{node.name}/{x}" for x in "qkv"]
            nodes.append(helper.make_node("Split", [node.input[0], sizes.name], qkv, axis=-1,
                                          name=node.name + "/split"))
            node.input[0], node.input[1], node.input[2] = qkv
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    del model.graph.value_info[:]
    _save(model, folder)
    _loads_on_cpu(folder / "model.onnx")
    out = tmp_path / "out"
    code, err = _cli(capsys, ["optimize", str(folder), "-o", str(out), "--target", "webgpu-graph"])
    assert code == 0, err
    result = onnx.load(str(out / "model.onnx"), load_external_data=False)
    packs = [n for n in result.graph.node if "rope_passes_packed_qkv" in n.name]
    assert packs, "longrope-concat did not pack q/k/v"
    typed = {v.name: v.type.tensor_type.elem_type for v in result.graph.value_info}
    assert all(typed.get(n.output[0]) == onnx.TensorProto.FLOAT for n in packs)
    _loads_on_cpu(out / "model.onnx")


@pytest.mark.corpus
def test_unfuse_qk_norm_without_value_info(tmp_path, capsys):
    """X03: qwen3 (GQA with fused q/k-norm) saved without value_info: unfuse-gqa-qk-norm's Reshape outputs had no
    dtype -> SerdeError on save (internal error)."""
    import onnx

    folder = _copy_corpus(tmp_path, "current/qwen3/webgpu_fp16")
    model = onnx.load(str(folder / "model.onnx"))
    del model.graph.value_info[:]
    _save(model, folder)
    out = tmp_path / "out"
    code, err = _cli(capsys, ["optimize", str(folder), "-o", str(out), "--target", "webgpu"])
    assert code == 0, err
    result = onnx.load(str(out / "model.onnx"), load_external_data=False)
    norms = [n for n in result.graph.node if n.op_type == "SimplifiedLayerNormalization" and "q_norm" in n.name]
    assert norms, "unfuse-gqa-qk-norm did not unfuse"
    typed = {v.name: v.type.tensor_type.elem_type for v in result.graph.value_info}
    assert all(typed.get(n.output[0]) == onnx.TensorProto.FLOAT16 for n in norms)
    _loads_on_cpu(out / "model.onnx")


# -- round 2 (issue 18b) ---------------------------------------------------------------------------------------------
# N02 / N03 / N04: only the WebGPU provider's options carry the offset the WebGPU EP gets; another provider's comes
# first in provider_options and is not read (onnxruntime-genai hands the webgpu entry to the WebGPU EP)
def _two_providers(cuda: str, webgpu: str) -> dict:
    config = _genai({"multiRotaryCacheConcatOffset": webgpu})
    config["model"]["decoder"]["session_options"]["provider_options"].insert(
        0, {"cuda": {"multiRotaryCacheConcatOffset": cuda}})
    return config


@pytest.mark.parametrize("cuda", ["0", "16", "32"])
def test_offset_read_from_webgpu_provider_only(cuda):
    assert GenaiConfig(_two_providers(cuda, "32")).concat_offset == 32
    only_cuda = _two_providers(cuda, "0")
    del only_cuda["model"]["decoder"]["session_options"]["provider_options"][1]["webgpu"]["multiRotaryCacheConcatOffset"]
    assert GenaiConfig(only_cuda).concat_offset is None


def test_offset_removed_from_webgpu_provider_only():
    config = GenaiConfig(_two_providers("16", "32"))
    changes = config.remove_provider_option("multiRotaryCacheConcatOffset", "why")
    assert len(changes) == 1 and ".webgpu." in changes[0]
    providers = config.data["model"]["decoder"]["session_options"]["provider_options"]
    assert providers[0] == {"cuda": {"multiRotaryCacheConcatOffset": "16"}}
    assert "multiRotaryCacheConcatOffset" not in providers[1]["webgpu"]


@pytest.mark.corpus
def test_other_provider_offset_first_lint_and_optimize(tmp_path, capsys):
    """N02: a plain llama with cuda's offset "0" before webgpu's "32": RP208, and optimize removes webgpu's 32."""
    def edit(d):
        providers = d["session_options"]["provider_options"]
        providers[0]["webgpu"]["multiRotaryCacheConcatOffset"] = "32"
        providers.insert(0, {"cuda": {"multiRotaryCacheConcatOffset": "0"}})

    folder = _llama(tmp_path, edit)
    code, _ = _cli(capsys, ["lint", str(folder), "--select", "RP208"])
    assert code == 1
    code, err = _cli(capsys, ["optimize", str(folder), "-o", str(tmp_path / "out"), "--target", "webgpu"])
    assert code == 0, err
    providers = json.loads((tmp_path / "out" / "genai_config.json").read_text())["model"]["decoder"][
        "session_options"]["provider_options"]
    webgpu = next(e["webgpu"] for e in providers if "webgpu" in e)
    assert "multiRotaryCacheConcatOffset" not in webgpu


# N22: a provider entry spelled "WebGPU" (onnxruntime-genai matches provider names ignoring case) is read and written
# in place: no second "webgpu" entry (onnxruntime-genai: "Provider WebGpuExecutionProvider has already been registered")
def test_provider_name_case_insensitive():
    config = GenaiConfig({"model": {"decoder": {"session_options": {"provider_options": [
        {"WebGPU": {"enableGraphCapture": "0", "multiRotaryCacheConcatOffset": "32"}}]}}}})
    assert config.graph_capture is False and config.concat_offset == 32
    assert config.provider_options("webgpu")["enableGraphCapture"] == "0"
    line = config.set_graph_capture(True)
    assert line and "WebGPU" in line
    providers = config.data["model"]["decoder"]["session_options"]["provider_options"]
    assert providers == [{"WebGPU": {"enableGraphCapture": "1", "multiRotaryCacheConcatOffset": "32"}}]
    assert config.remove_provider_option("multiRotaryCacheConcatOffset") and providers == [
        {"WebGPU": {"enableGraphCapture": "1"}}]


@pytest.mark.corpus
def test_provider_name_case_optimize_writes_one_entry(tmp_path, capsys):
    def edit(d):
        providers = d["session_options"]["provider_options"]
        providers[0] = {"WebGPU": providers[0]["webgpu"]}

    folder = _llama(tmp_path, edit)
    code, err = _cli(capsys, ["optimize", str(folder), "-o", str(tmp_path / "out"), "--target", "webgpu-graph"])
    assert code == 0, err
    providers = json.loads((tmp_path / "out" / "genai_config.json").read_text())["model"]["decoder"][
        "session_options"]["provider_options"]
    assert len(providers) == 1 and list(providers[0]) == ["WebGPU"], providers
    assert providers[0]["WebGPU"]["enableGraphCapture"] == "1"


# N01: a context length that is not a positive (ASCII-digit) integer: one line, exit 2 (not int('²') crashing)
@pytest.mark.parametrize(("section", "key"), [("model", "context_length"), ("search", "max_length")])
@pytest.mark.parametrize("value", ["²", "x", 0, -4096, True, "0", 4096.5, [4096], 2**31])
def test_context_length_garbage(tmp_path, section, key, value):
    config = _genai()
    config.setdefault(section, {})[key] = value
    path = tmp_path / "genai_config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ModelLoadError) as info:
        GenaiConfig.load(path)
    assert f"{section}.{key}" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("value", [4096, "4096", 4096.0])
def test_context_length_accepted(value):
    config = _genai()
    config["model"]["context_length"] = value
    GenaiConfig(config).validate()
    assert GenaiConfig(config).context_length == 4096


@pytest.mark.corpus
def test_context_length_superscript_cli(tmp_path, capsys):
    folder = _llama(tmp_path, lambda d: None)
    path = folder / "genai_config.json"
    config = json.loads(path.read_text())
    config["model"]["context_length"] = "²"
    path.write_text(json.dumps(config))
    _one_line_exit_2(capsys, ["lint", str(folder)], "context_length")
    _one_line_exit_2(capsys, ["optimize", str(folder), "-o", str(tmp_path / "out"), "--target", "webgpu"],
                     "context_length")


# C01 / C02: config.json max_position_embeddings past int32 (numpy's "Maximum allowed size exceeded") and a
# partial_rotary_factor outside (0, 1] (1e308: OverflowError in int(head_dim * factor)): one line
@pytest.mark.parametrize("value", [10**30, 2**31, 0, -64])
def test_max_position_embeddings_out_of_range(tmp_path, value):
    assert f"max_position_embeddings {value}" in _rope_error(tmp_path, max_position_embeddings=value)


def test_original_max_position_embeddings_huge(tmp_path):
    scaling = {"rope_type": "longrope", "short_factor": [1.0] * 16, "long_factor": [2.0] * 16,
               "original_max_position_embeddings": 10**30}
    assert "original_max_position_embeddings" in _rope_error(tmp_path, rope_scaling=scaling)


@pytest.mark.parametrize("value", [1e308, 2.0, 0, 0.0, -0.5])
def test_partial_rotary_factor_out_of_range(tmp_path, value):
    assert "partial_rotary_factor" in _rope_error(tmp_path, partial_rotary_factor=value)


@pytest.mark.corpus
@pytest.mark.parametrize(("edit", "says"), [
    (lambda c: c.update(max_position_embeddings=10**30), "max_position_embeddings"),
    (lambda c: c.update(partial_rotary_factor=1e308), "partial_rotary_factor"),
])
def test_out_of_range_hf_config_cli(tmp_path, capsys, edit, says):
    test_malformed_hf_config_cli(tmp_path, capsys, edit, says)
