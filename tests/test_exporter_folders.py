"""Exporter graphs as users have them (issue 13): a folder with the exported graph and the model's ``config.json``.

Every torch fixture graph (``tests/fixtures/torch``: transformers 4 dynamo, transformers 4 optimum (TorchScript),
transformers 5's own exporter) is put in a folder beside its variant's ``config.json`` (``fixtures/hf_rope``) and
optimized with ``--target exporter`` and no other flag:

* static RoPE with a ``position_ids`` input: tables of ``max_position_embeddings`` rows, bit-identical to the
  original on onnxruntime CPU for batch 1-2, past 0..200;
* LongRoPE frozen at export (optimum phi3_longrope, phi4mini_longrope_partial: the graph uses the short factors for
  every call): two tables and transformers' switch. Bit-identical to the original where the original is right
  (calls whose largest position < 64), and past the switch the rows are transformers' (``fixtures/hf_rope``: same
  inv_freq, cos/sin within 2 float32 ulps);
* dynamic NTK config (optimum llama_dynamic): refused with the reason;
* LongRoPE chosen per call in the graph (transformers 5 Where on ReduceMax): refused, as without a config;
* positions made in the graph (optimum Gemma family: ``Range(past, past + S)``, no ``position_ids`` input): not
  matched yet.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

import rope_passes
from rope_passes.report import Outcome
from rope_passes.runtime.evaluate import evaluate_subgraph
from rope_passes.runtime.sessions import create_session

pytestmark = pytest.mark.corpus  # reads the generated fixtures

FIXTURES = Path(__file__).parent / "fixtures"
GRAPHS = sorted(str(p.relative_to(FIXTURES / "torch").parent) for p in (FIXTURES / "torch").glob("*/*/*/decode.onnx"))
FROZEN = {"tf4/optimum/phi3_longrope", "tf4/optimum/phi4mini_longrope_partial"}
RANGE_POSITIONS = {"tf4/optimum/gemma", "tf4/optimum/gemma2", "tf4/optimum/gemma3_text"}
PER_CALL = {"tf5/hf_onnx/phi3_longrope", "tf5/hf_onnx/phi4mini_longrope_partial"}
DYNAMIC = {"tf4/optimum/llama_dynamic"}
#: (batch, new tokens, past)
CALLS = [(1, 1, 0), (2, 3, 5), (1, 4, 37), (2, 1, 60), (1, 7, 100), (2, 2, 150), (1, 1, 200)]


def _folder(tmp: Path, graph: str) -> Path:
    tf, _, variant = graph.split("/")
    folder = tmp / graph.replace("/", "_")
    folder.mkdir()
    shutil.copy(FIXTURES / "torch" / graph / "decode.onnx", folder / "model.onnx")
    shutil.copy(FIXTURES / "hf_rope" / tf / variant / "config.json", folder / "config.json")
    return folder


def _feeds(sess, batch: int, seq: int, past: int) -> dict[str, np.ndarray]:
    rng = np.random.RandomState(1000 * batch + 10 * seq + past)
    feeds = {}
    for i in sess.get_inputs():
        if i.name == "input_ids":
            feeds[i.name] = rng.randint(0, 256, (batch, seq)).astype(np.int64)
        elif i.name == "attention_mask":
            feeds[i.name] = np.ones((batch, past + seq), np.int64)
        elif i.name == "position_ids":
            pos = np.tile(np.arange(past, past + seq, dtype=np.int64), (batch, 1))
            feeds[i.name] = np.stack([pos] * 3) if len(i.shape) == 3 else pos
        else:
            feeds[i.name] = (0.5 * rng.randn(batch, i.shape[1], past, i.shape[3])).astype(np.float32)
    return feeds


def _outputs(path: Path, calls) -> list[list[np.ndarray]]:
    sess = create_session(str(path), "cpu")
    return [sess.run(None, _feeds(sess, *c)) for c in calls]


def test_fixtures_are_there():
    assert len(GRAPHS) == 40, GRAPHS
    assert FROZEN | RANGE_POSITIONS | PER_CALL | DYNAMIC <= set(GRAPHS)


@pytest.mark.parametrize("graph", GRAPHS)
def test_exporter_folder(graph, tmp_path):
    folder = _folder(tmp_path, graph)
    report = rope_passes.optimize(str(folder), str(tmp_path / "out"), target="exporter")
    (pc,) = [p for p in report.passes if p.pass_name == "precompute-cos-sin"]
    findings = [f for f in pc.findings if f.outcome is not Outcome.NOTE]
    if graph in RANGE_POSITIONS:
        assert not report.modified and pc.status.startswith("not matched"), pc.status
        assert "reads no position input: its positions are made in the graph" in findings[0].reason
        return
    if graph in DYNAMIC:
        assert not report.modified and pc.count(Outcome.REFUSED) == 2
        assert "rope_type 'dynamic' (dynamic NTK)" in findings[0].reason
        return
    if graph in PER_CALL:
        assert not report.modified and findings[0].reason.startswith("LongRoPE chosen per call")
        return
    assert pc.count(Outcome.REWRITTEN) == pc.matched > 0 and not any(
        f.outcome is Outcome.NOTE and "differs from config.json" in f.reason for f in pc.findings), pc.status
    out = tmp_path / "out" / "model.onnx"
    model = ir.load(out)
    tables = {k: v.const_value.numpy() for k, v in model.graph.initializers.items() if k.startswith("rope_passes.")}
    assert all(t.shape[0] == 256 for t in tables.values())  # max_position_embeddings: no --max-positions
    assert model.metadata_props["rope_passes.cos_sin_max_positions"] == "256"
    right = CALLS if graph not in FROZEN else [c for c in CALLS if c[1] + c[2] <= 64]
    for ref, new in zip(_outputs(folder / "model.onnx", right), _outputs(out, right), strict=True):
        for r, n in zip(ref, new, strict=True):
            np.testing.assert_array_equal(n, r)  # bit-identical where the original is right
    if graph in FROZEN:
        _check_switch(graph, model, tables, folder)


def _check_switch(graph: str, model: ir.Model, tables: dict[str, np.ndarray], folder: Path) -> None:
    variant = graph.split("/")[-1]
    refs = FIXTURES / "hf_rope" / "tf5" / variant
    for role in ("cos", "sin"):
        long, short = tables[f"rope_passes.{role}_table_long"], tables[f"rope_passes.{role}_table_short"]
        for ours, theirs in ((long, np.load(refs / f"{role}.npy")), (short[:64], np.load(refs / f"{role}_short.npy"))):
            ulps = np.abs(ours.astype(np.float64) - theirs) / np.spacing(np.abs(theirs).astype(np.float32) + 1e-30)
            assert ulps.max() <= 4, f"{role}: {ulps.max()} ulps from transformers"
    # the switch: rows of the short table while the call's largest position + 1 <= 64, of the long one after
    positions = next(v for v in model.graph.inputs if v.name == "position_ids")
    rows = {n.outputs[0].name: n.outputs[0] for n in model.graph if n.name.startswith("rope_passes/cos")
            and n.op_type == "Where"}
    (where,) = rows.values()
    long, short = tables["rope_passes.cos_table_long"], tables["rope_passes.cos_table_short"]
    for call in (np.array([[0, 63]]), np.array([[5, 6, 7], [61, 62, 63]]), np.array([[63, 64]]),
                 np.array([[0], [200]]), np.array([[64]])):
        (got,) = evaluate_subgraph(model, [positions], [where], [call])
        want = long[call] if call.max() + 1 > 64 else short[call]
        np.testing.assert_array_equal(got, want)
    # and past the switch the original (frozen) graph is wrong where the rewritten one follows transformers
    original, rewritten = _outputs(folder / "model.onnx", [(1, 4, 80)]), _outputs(folder.parent / "out" /
                                                                                  "model.onnx", [(1, 4, 80)])
    assert np.abs(original[0][0] - rewritten[0][0]).max() > 1e-3


def test_lint_names_frozen_longrope_and_fix_repairs_it(tmp_path):
    from rope_passes.lint import fix_bundle, lint_bundle

    folder = _folder(tmp_path, "tf4/optimum/phi3_longrope")
    found = lint_bundle(str(folder), select=["RP401", "RP402", "RP403"])
    assert [d.code for d in found] == ["RP401", "RP401"]
    assert "from position 64 on" in found[0].message
    assert "LongRoPE frozen at export: the graph uses the short factors past position 63" in found[0].message
    assert found[0].fix == "precompute-cos-sin"
    assert fix_bundle(str(folder), select=["RP401"], log=lambda m: None) == ["precompute-cos-sin", "cleanup"]
    model = ir.load(folder / "model.onnx")
    assert "rope_passes.cos_table_long" in model.graph.initializers


@pytest.mark.parametrize("graph", ["tf4/optimum/llama", "tf5/hf_onnx/gemma3_text", "tf5/hf_onnx/phi3_longrope",
                                   "tf4/dynamo/qwen2_5_vl_text"])
def test_lint_is_quiet_where_the_graph_follows_its_config(graph, tmp_path):
    from rope_passes.lint import lint_bundle

    assert lint_bundle(str(_folder(tmp_path, graph)), select=["RP401", "RP402", "RP403"]) == []


@pytest.mark.parametrize(("edit", "cause"), [
    ({"rope_theta": 20000.0}, "theta differs: the graph uses theta ≈ 10000, config.json 20000"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, "scaling ignored: the graph computes plain"),
    ({"partial_rotary_factor": 0.5}, "the graph rotates 16 channels, config.json's rotary dimension is 8"),
])
def test_lint_names_the_cause(edit, cause, tmp_path):
    import json

    from rope_passes.lint import lint_bundle

    folder = _folder(tmp_path, "tf4/optimum/phi3")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **edit}))
    found = lint_bundle(str(folder), select=["RP402"])
    assert len(found) == 2 and cause in found[0].message, found[0].message


def test_dynamic_config_is_a_lint_warning(tmp_path):
    from rope_passes.lint import lint_bundle

    found = lint_bundle(str(_folder(tmp_path, "tf4/optimum/llama_dynamic")), select=["RP403"])
    assert len(found) == 1 and "dynamic NTK" in found[0].message


def test_cli_hf_config_flag(tmp_path):
    """``--hf-config`` for a bare .onnx (optimize and lint)."""
    import json
    import subprocess
    import sys

    bare = tmp_path / "decode.onnx"
    shutil.copy(FIXTURES / "torch" / "tf4" / "optimum" / "phi3_longrope" / "decode.onnx", bare)
    config = FIXTURES / "hf_rope" / "tf4" / "phi3_longrope" / "config.json"

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "rope_passes", *args], check=False, capture_output=True,
                              text=True, timeout=300)

    lint = cli("lint", str(bare), "--hf-config", str(config), "--select", "RP401", "--format", "json")
    assert lint.returncode == 1 and json.loads(lint.stdout)[0]["code"] == "RP401" if lint.stdout.startswith("[") \
        else "RP401" in lint.stdout
    proc = cli("optimize", str(bare), "-o", str(tmp_path / "out.onnx"), "--target", "exporter", "--hf-config",
               str(config), "--json")
    assert proc.returncode == 0, proc.stderr
    (pc, _) = json.loads(proc.stdout)["passes"]
    assert pc["status"] == "rewritten 2" and "LongRoPE frozen at export" in pc["findings"][0]["reason"]
    without = cli("optimize", str(bare), "-o", str(tmp_path / "out2.onnx"), "--target", "exporter", "--json")
    assert json.loads(without.stdout)["passes"][0]["status"].startswith("refused: table size unknown")
