"""Export folders as the tools write them, end to end (issue 13's Done-when).

``tests/fixtures/optimum/<variant>/`` (``optimum-cli export onnx --task text-generation-with-past``: model.onnx,
config.json, generation_config.json) and ``tests/fixtures/olive/tf<N>/<variant>/`` (``olive capture-onnx-graph
--use_dynamo_exporter``: model.onnx, model_config.json; transformers 5.23 and 4.57.6, the latter without the two
LongRoPE variants, which torch.export cannot export there) for Llama, Qwen2, Mistral, Gemma2, Gemma3 text, Phi-3 128k
and Phi-4-mini (LongRoPE, original 64 / max 256), built offline from tiny random checkpoints by
``tests/fixtures/tools/make_export_folders.py`` (see ``tests/fixtures/README.md``). Each folder goes through the
CLI as a user would run it, ``rope-passes optimize FOLDER -o OUT --target exporter`` and no other flag:

* every Cos/Sin becomes a table of ``max_position_embeddings`` rows, and the output is bit-identical on onnxruntime
  CPU to the original for batch 1-2, past 0, 1, 50, 199 (and a 20-token call from past 50, crossing the LongRoPE
  switch at position 64);
* except LongRoPE frozen at export (optimum's TorchScript Phi-3 / Phi-4-mini: the graph uses the short factors for
  every call): ``rope-passes lint FOLDER`` reports RP401 errors, and ``optimize --target exporter --hf-config
  FOLDER/config.json`` (a repair, reported as ``repaired``) follows transformers past the switch: its decode logits are within 1e-5 of Hugging Face's own
  (``tests/fixtures/hf_decode``: a 60-token prompt, then 12 one-token calls, positions 60..71), while staying
  bit-identical to the original on the calls the original gets right (largest position < 64).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from _utils import exporter_outputs

from rope_passes.cli import main
from rope_passes.hf_config import HFConfig
from rope_passes.runtime.sessions import create_session

pytestmark = pytest.mark.corpus  # reads the generated fixtures

FIXTURES = Path(__file__).parent / "fixtures"
VARIANTS = ["llama", "qwen2", "mistral", "gemma2", "gemma3_text", "phi3_longrope", "phi4mini_longrope_partial"]
LONGROPE = {"phi3_longrope", "phi4mini_longrope_partial"}
FOLDERS = ([f"optimum/{v}" for v in VARIANTS] + [f"olive/tf5/{v}" for v in VARIANTS]
           + [f"olive/tf4/{v}" for v in VARIANTS if v not in LONGROPE])
#: TorchScript froze transformers-4 LongRoPE at the sample input; Olive's dynamo graphs choose per call (tf5 Where)
FROZEN = {f"optimum/{v}" for v in LONGROPE}
FILES = {"optimum": {"model.onnx", "config.json", "generation_config.json"}, "olive": {"model.onnx", "model_config.json"}}
#: (batch, new tokens, past)
CALLS = [(1, 1, 0), (2, 4, 0), (1, 1, 1), (2, 3, 1), (1, 1, 50), (2, 20, 50), (1, 1, 199), (2, 2, 199)]
ORIGINAL_MAX, PROMPT, STEPS = 64, 60, 12






def _decode(path: Path, ids: np.ndarray) -> np.ndarray:
    """The prompt's last logits, then each one-token call's, feeding present.* back (as hf_decode was made)."""
    sess = create_session(str(path), "cpu")
    names, batch = [o.name for o in sess.get_outputs()], ids.shape[0]
    past = {i.name: np.zeros((batch, i.shape[1], 0, i.shape[3]), np.float32) for i in sess.get_inputs()
            if i.name.startswith("past_key_values")}
    logits = []
    for start, stop in [(0, PROMPT)] + [(p, p + 1) for p in range(PROMPT, PROMPT + STEPS)]:
        feeds = {"input_ids": ids[:, start:stop], "attention_mask": np.ones((batch, stop), np.int64),
                 "position_ids": np.tile(np.arange(start, stop, dtype=np.int64), (batch, 1)), **past}
        out = dict(zip(names, sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()}), strict=True))
        past = {n.replace("present", "past_key_values"): v for n, v in out.items() if n.startswith("present")}
        logits.append(out["logits"][:, -1])
    return np.stack(logits)


def _cli(capsys, *args: str) -> tuple[int, object]:
    capsys.readouterr()
    code = main(list(args))
    return code, json.loads(capsys.readouterr().out)


def test_folders_are_as_the_tools_write_them():
    for folder in FOLDERS:
        files = {p.name for p in (FIXTURES / folder).iterdir()}
        assert files == FILES[folder.split("/")[0]], (folder, files)
        assert (FIXTURES / folder / "model.onnx").stat().st_size < 1_000_000
    for v in LONGROPE:
        assert np.load(FIXTURES / "hf_decode" / v / "logits.npy").shape == (STEPS + 1, 2, 256)


def test_olive_model_config_is_read_as_the_hf_config():
    """Olive writes the HF config as ``config.model_attributes`` of its ``model_config.json``: no --hf-config."""
    config = HFConfig.find(FIXTURES / "olive" / "tf5" / "phi3_longrope" / "model.onnx")
    assert config is not None and config.path.name == "model_config.json"
    rope = config.rope()
    assert (config.max_position_embeddings, rope.kind, rope.original_max) == (256, "longrope", ORIGINAL_MAX)
    for tf in ("tf4", "tf5"):  # transformers 5: per-layer rope_parameters; 4: rope_local_base_freq
        layers = HFConfig.load(FIXTURES / "olive" / tf / "gemma3_text").layer_types()
        assert layers == ["full_attention", "sliding_attention"], (tf, layers)


def test_olive_model_config_without_model_attributes_is_not_a_config(tmp_path):
    (tmp_path / "model_config.json").write_text(json.dumps({"type": "onnxmodel", "config": {"model_path": "m.onnx"}}))
    assert HFConfig.find(tmp_path / "model.onnx") is None
    olive = json.loads((FIXTURES / "olive" / "tf4" / "llama" / "model_config.json").read_text())
    (tmp_path / "model_config.json").write_text(json.dumps(olive))
    assert HFConfig.find(tmp_path / "model.onnx").data["model_type"] == "llama"


@pytest.mark.parametrize("folder", FOLDERS)
def test_export_folder(folder, tmp_path, capsys):
    src, out = FIXTURES / folder, tmp_path / "out"
    extra = ["--hf-config", str(src / "config.json")] if folder in FROZEN else []
    code, report = _cli(capsys, "optimize", str(src), "-o", str(out), "--target", "exporter", "--json", *extra)
    assert code == 0, report
    (pc,) = [p for p in report["passes"] if p["pass"] == "precompute-cos-sin"]
    assert pc["rewritten"] + pc["repaired"] == pc["matched"] > 0 and pc["refused"] == 0, pc["status"]
    # following config.json past the switch is a repair (asked for with --hf-config), reported as one
    assert pc["repaired"] == (2 if folder in FROZEN else 0), pc["status"]
    assert not any("differs from config.json" in f["reason"] for f in pc["findings"]), pc["findings"]
    model = ir.load(out / "model.onnx")
    assert not [n for n in ir.traversal.RecursiveGraphIterator(model.graph) if n.op_type in ("Cos", "Sin")]
    tables = [v for k, v in model.graph.initializers.items() if k.startswith("rope_passes.")]
    assert tables and all(t.shape[0] == 256 for t in tables)  # max_position_embeddings from the folder's config
    assert model.metadata_props["rope_passes.cos_sin_max_positions"] == "256"
    variant = folder.split("/")[-1]
    if variant in LONGROPE:  # two tables (short, long) and the switch, whichever way the graph chose
        assert {k for k in model.graph.initializers if k.startswith("rope_passes.")} >= {
            "rope_passes.cos_table_long", "rope_passes.cos_table_short"}
    right = CALLS if folder not in FROZEN else [c for c in CALLS if c[1] + c[2] <= ORIGINAL_MAX]
    for ref, new in zip(exporter_outputs(src / "model.onnx", right), exporter_outputs(out / "model.onnx", right),
                        strict=True):
        for r, n in zip(ref, new, strict=True):
            np.testing.assert_array_equal(n, r)  # bit-identical (where the original is right)
    if variant in LONGROPE:
        refs = FIXTURES / "hf_decode" / variant
        ids, hf = np.load(refs / "input_ids.npy"), np.load(refs / "logits.npy")
        ours = _decode(out / "model.onnx", ids)
        np.testing.assert_allclose(ours, hf, rtol=0, atol=1e-5)  # transformers' decode, across the switch
        if folder in FROZEN:  # the original is wrong from the first call past the switch: what lint reports
            wrong = np.abs(_decode(src / "model.onnx", ids) - hf).max(axis=(1, 2))
            first_long = ORIGINAL_MAX - PROMPT + 1  # row of the call at position 64
            assert wrong[:first_long].max() < 1e-5 < 1e-3 < wrong[first_long:].min(), wrong


@pytest.mark.parametrize("folder", FOLDERS)
def test_lint_on_the_folder(folder, capsys):
    code, found = _cli(capsys, "lint", str(FIXTURES / folder), "--select", "RP401,RP402,RP403", "--format", "json")
    (diagnostics,) = found.values()
    if folder in FROZEN:
        assert code == 1 and [d["code"] for d in diagnostics] == ["RP401", "RP401"], diagnostics
        assert all(d["severity"] == "error" and d["fix"] == "precompute-cos-sin" for d in diagnostics)
        assert "LongRoPE frozen at export: the graph uses the short factors past position 63" in diagnostics[0][
            "message"]
    else:
        assert code == 0 and diagnostics == [], diagnostics
