"""Exporter graphs as users have them (issue 13): a folder with the exported graph and the model's ``config.json``.

Every torch fixture graph (``tests/fixtures/torch``: transformers 4 dynamo, transformers 4 optimum (TorchScript),
transformers 5's own exporter) is put in a folder beside its variant's ``config.json`` (``fixtures/hf_rope``) and
optimized with ``--target exporter`` and no other flag:

* static RoPE with a ``position_ids`` input: tables of ``max_position_embeddings`` rows, bit-identical to the
  original on onnxruntime CPU for batch 1-2, past 0..200;
* LongRoPE frozen at export (optimum phi3_longrope, phi4mini_longrope_partial: the graph uses the short factors for
  every call): with the config merely beside the model, a table of what the graph computes (bit-identical on every
  call) and a note naming the difference; with ``--hf-config`` (a repair, on request) two tables and transformers'
  switch, reported as *repaired*: bit-identical to the original where the original is right (calls whose largest
  position < 64), and past the switch the rows are transformers' (``fixtures/hf_rope``: same inv_freq, cos/sin within
  2 float32 ulps);
* dynamic NTK config (optimum llama_dynamic): refused with the reason;
* LongRoPE chosen per call in the graph (transformers 5 Where on ReduceMax): with the LongRoPE config, a table per
  branch and the graph's switch, bit-identical to the original on every call (crossing the switch too); without a
  config it stays refused (tests/test_precompute_cos_sin.py);
* positions made in the graph (optimum Gemma family: ``Range(past, past + S)``, no ``position_ids`` input): the
  Range output is the position source (tables gathered by it), bit-identical like the static ones. Small graphs
  pin the forms around it that must be refused or not matched.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from _utils import exporter_outputs

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






def test_fixtures_are_there():
    assert len(GRAPHS) == 40, GRAPHS
    assert set(GRAPHS) >= FROZEN | RANGE_POSITIONS | PER_CALL | DYNAMIC


@pytest.mark.parametrize("graph", GRAPHS)
def test_exporter_folder(graph, tmp_path):
    folder = _folder(tmp_path, graph)
    report = rope_passes.optimize(str(folder), str(tmp_path / "out"), preset="exporter")
    (pc,) = [p for p in report.passes if p.pass_name == "precompute-cos-sin"]
    findings = [f for f in pc.findings if f.outcome is not Outcome.NOTE]
    if graph in RANGE_POSITIONS:  # positions made in the graph: Gather by the Range's output
        assert all(f.details["positions"] == "/model/Range_output_0" for f in findings), findings
    if graph in DYNAMIC:
        assert not report.modified and pc.count(Outcome.REFUSED) == 2
        assert "rope_type 'dynamic' (dynamic NTK)" in findings[0].reason
        return
    if graph in PER_CALL:  # transformers 5's own per-call Where: two tables and the same switch, exact everywhere
        assert all("LongRoPE chosen per call: a table for each" in f.reason for f in findings), findings
    notes = [f for f in pc.findings if f.outcome is Outcome.NOTE and "differs from config.json" in f.reason]
    assert pc.count(Outcome.REWRITTEN) == pc.matched > 0, pc.status
    if graph in FROZEN:  # a config beside the model never changes what it computes: the repair is on request
        assert len(notes) == 2 and all("a repair, done only on request: give this config with --hf-config" in f.reason
                                       for f in notes), notes
    else:
        assert not notes, notes
    out = tmp_path / "out" / "model.onnx"
    model = ir.load(out)
    tables = {k: v.const_value.numpy() for k, v in model.graph.initializers.items() if k.startswith("rope_passes.")}
    assert all(t.shape[0] == 256 for t in tables.values())  # max_position_embeddings: no --max-positions
    assert model.metadata_props["rope_passes.cos_sin_max_positions"] == "256"
    for ref, new in zip(exporter_outputs(folder / "model.onnx", CALLS), exporter_outputs(out, CALLS), strict=True):
        for r, n in zip(ref, new, strict=True):
            np.testing.assert_array_equal(n, r)  # bit-identical: the rewrite computes what the graph computes


@pytest.mark.parametrize("graph", sorted(FROZEN))
def test_frozen_longrope_repaired_on_request(graph, tmp_path):
    """``hf_config`` given explicitly: LongRoPE frozen at export is rebuilt as two tables and transformers' switch,
    reported as *repaired* in the words of lint's RP401 (what the input computed, what the output computes, what the
    config says), never as an ordinary rewrite."""
    folder = _folder(tmp_path, graph)
    report = rope_passes.optimize(str(folder), str(tmp_path / "out"), preset="exporter",
                                  options={"hf_config": str(folder / "config.json")})
    (pc,) = [p for p in report.passes if p.pass_name == "precompute-cos-sin"]
    repaired = [f for f in pc.findings if f.outcome is Outcome.REPAIRED]
    assert len(repaired) == 2 and pc.count(Outcome.REWRITTEN) == 0 and pc.status == "repaired 2", pc.status
    assert all(f.reason.startswith("repaired: the input computed") and "the output computes them with the short "
               "factors while the call's largest position + 1 <= 64 and the long factors after" in f.reason
               and f"because {folder / 'config.json'} says longrope rope" in f.reason for f in repaired), repaired
    out = tmp_path / "out" / "model.onnx"
    model = ir.load(out)
    tables = {k: v.const_value.numpy() for k, v in model.graph.initializers.items() if k.startswith("rope_passes.")}
    right = [c for c in CALLS if c[1] + c[2] <= 64]
    for ref, new in zip(exporter_outputs(folder / "model.onnx", right), exporter_outputs(out, right), strict=True):
        for r, n in zip(ref, new, strict=True):
            np.testing.assert_array_equal(n, r)  # bit-identical where the original is right
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
    original = exporter_outputs(folder / "model.onnx", [(1, 4, 80)])
    rewritten = exporter_outputs(folder.parent / "out" / "model.onnx", [(1, 4, 80)])
    assert np.abs(original[0][0] - rewritten[0][0]).max() > 1e-3


def test_lint_names_frozen_longrope_and_fix_repairs_it(tmp_path):
    from rope_passes.lint import fix_bundle, lint_bundle
    from rope_passes.plan import lint_plan

    folder = _folder(tmp_path, "tf4/optimum/phi3_longrope")
    found = lint_bundle(str(folder), select=["RP401", "RP402", "RP403"])
    assert [d.code for d in found] == ["RP401", "RP401"]
    assert "from position 64 on" in found[0].message
    assert "LongRoPE frozen at export: the graph uses the short factors past position 63" in found[0].message
    assert found[0].fix == "precompute-cos-sin"
    # lint says what the repair does in the words the repair is reported in
    assert "(repaired: the input computed cos with LongRoPE's short factors for every call (frozen at export), the " \
           "output computes them with the short factors while the call's largest position + 1 <= 64" in \
           found[0].message and f"because {folder / 'config.json'} says longrope rope" in found[0].message
    # --fix without --hf-config: the config beside the model does not change what it computes
    assert fix_bundle(str(folder), select=["RP401"], log=lambda m: None) == ["precompute-cos-sin", "cleanup"]
    assert "rope_passes.cos_table_long" not in ir.load(folder / "model.onnx").graph.initializers
    (tmp_path / "again").mkdir()
    folder = _folder(tmp_path / "again", "tf4/optimum/phi3_longrope")
    asked = lint_plan(fix=True, hf_config=str(folder / "config.json"))  # lint --fix --hf-config: the repair
    assert fix_bundle(str(folder), asked, select=["RP401"], log=lambda m: None) == ["precompute-cos-sin", "cleanup"]
    model = ir.load(folder / "model.onnx")
    assert "rope_passes.cos_table_long" in model.graph.initializers


@pytest.mark.parametrize("graph", ["tf4/optimum/llama", "tf5/hf_onnx/gemma3_text", "tf5/hf_onnx/phi3_longrope",
                                   "tf4/dynamo/qwen2_5_vl_text", "tf4/optimum/gemma3_text"])
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


def _per_row_switch(folder: Path) -> None:
    """transformers 5's per-call LongRoPE switch edited to choose per batch row: ReduceMax over the sequence axis
    only (keepdims), so each row of a batch picks its own factors."""
    model = ir.load(folder / "model.onnx")
    top = next(n for n in model.graph if n.op_type == "ReduceMax" and n.inputs[0].name == "position_ids")
    axes = ir.Value(name="per_row_axes", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([1]),
                    const_value=ir.tensor(np.array([1], np.int64), name="per_row_axes"))
    model.graph.register_initializer(axes)
    row_max = ir.node("ReduceMax", [top.inputs[0], axes], {"keepdims": 1}, name="per_row_max")
    last = ir.Value(name="per_row_last", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([1]),
                    const_value=ir.tensor(np.array([-1], np.int64), name="per_row_last"))
    model.graph.register_initializer(last)
    unsq = ir.node("Unsqueeze", [row_max.outputs[0], last], name="per_row_unsqueeze")
    row_max.outputs[0].name, unsq.outputs[0].name = "per_row_max_out", "per_row_max_3d"
    row_max.outputs[0].dtype = unsq.outputs[0].dtype = ir.DataType.INT64
    model.graph.insert_before(top, [row_max, unsq])
    top.outputs[0].replace_all_uses_with(unsq.outputs[0])
    model.graph.remove(top, safe=True)
    for v in ir.traversal.RecursiveGraphIterator(model.graph):  # the shapes below the switch change: re-inferred
        for out in v.outputs:
            if out.name not in {i.name for i in model.graph.outputs}:
                out.shape = None
    ir.save(model, folder / "model.onnx")


def test_per_call_switch_must_be_one_choice_for_the_call(tmp_path):
    """A LongRoPE switch per batch row is not transformers' (one choice for the whole call): refused, naming the
    switch, where a rewrite to the call-wide switch would give a batch [[10], [70]] the long factors in row 0."""
    folder = _folder(tmp_path, "tf5/hf_onnx/phi3_longrope")
    _per_row_switch(folder)
    report = rope_passes.optimize(str(folder), str(tmp_path / "out"), preset="exporter")
    (pc,) = [p for p in report.passes if p.pass_name == "precompute-cos-sin"]
    refused = [f for f in pc.findings if f.outcome is Outcome.REFUSED]
    assert pc.count(Outcome.REWRITTEN) == 0 and len(refused) == pc.matched > 0, pc.status
    assert all("not one choice ReduceMax(positions) + 1 > 64 for the whole call" in f.reason for f in refused)


def test_per_call_switch_past_the_table_is_refused(tmp_path):
    """--max-positions at or below the switch: the long factors could never be read; refused, not a crash."""
    folder = _folder(tmp_path, "tf5/hf_onnx/phi3_longrope")
    report = rope_passes.optimize(str(folder), str(tmp_path / "out"), preset="exporter",
                                  options={"max_positions": 48})
    (pc,) = [p for p in report.passes if p.pass_name == "precompute-cos-sin"]
    refused = [f for f in pc.findings if f.outcome is Outcome.REFUSED]
    assert refused and all("switches at 64 but the table holds 48 positions" in f.reason for f in refused), pc.status


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
    assert pc["status"] == "repaired 2" and pc["findings"][0]["outcome"] == "repaired", pc
    assert "repaired: the input computed" in pc["findings"][0]["reason"]
    without = cli("optimize", str(bare), "-o", str(tmp_path / "out2.onnx"), "--target", "exporter", "--json")
    assert json.loads(without.stdout)["passes"][0]["status"].startswith("refused: table size unknown")


# ----------------------------------------------------------------------------------------------------------------
# Positions made in the graph: the forms around the Range that must not be rewritten
# ----------------------------------------------------------------------------------------------------------------
def _range_graph(between: str = "pos = Identity (r)", start: str = "past = Gather <axis = 0> (shp, i2)") -> ir.Model:
    """``Range(past, past + S) → <between> → Unsqueeze → Cast → Mul(inv_freq) → Concat → Cos|Sin``, optimum style."""
    from onnx import parser

    text = f"""<ir_version: 10, opset_import: ["" : 20]>
    g (int64[B, S] input_ids, float[B, 2, P, 4] past_key, int64[B, T] attention_mask)
      => (float[1, 1, S, 4] cos_out, float[1, 1, S, 4] sin_out) {{
        inv = Constant <value = float[2] {{1.0, 0.01}}> ()
        shp = Shape (past_key)
        i2 = Constant <value = int64 {{2}}> ()
        {start}
        ids = Shape (input_ids)
        i1 = Constant <value = int64 {{1}}> ()
        s = Gather <axis = 0> (ids, i1)
        lim = Add (past, s)
        one = Constant <value = int64 {{1}}> ()
        r = Range (past, lim, one)
        {between}
        z = Constant <value = int64[1] {{0}}> ()
        p1 = Unsqueeze (pos, z)
        a2 = Constant <value = int64[1] {{2}}> ()
        p2 = Unsqueeze (p1, a2)
        f = Cast <to = 1> (p2)
        fr = Mul (f, inv)
        emb = Concat <axis = -1> (fr, fr)
        c = Cos (emb)
        si = Sin (emb)
        a1 = Constant <value = int64[1] {{1}}> ()
        cos_out = Unsqueeze (c, a1)
        sin_out = Unsqueeze (si, a1)
    }}"""
    model = ir.serde.deserialize_model(parser.parse_model(text))
    for node in model.graph:
        node.name = node.name or f"{node.op_type.lower()}_{node.outputs[0].name}"
    return model


def _run_range(model: ir.Model, past: int, seq: int) -> list[np.ndarray]:
    from _utils import serialize

    feeds = {"input_ids": np.zeros((1, seq), np.int64), "past_key": np.zeros((1, 2, past, 4), np.float32),
             "attention_mask": np.ones((1, past + seq), np.int64)}
    return create_session(serialize(model), "cpu").run(None, feeds)


def test_range_positions_rewritten_bit_identical():
    from rope_passes.passes import PrecomputeCosSinPass

    model = _range_graph()
    before = [_run_range(model, past, seq) for past, seq in ((0, 5), (7, 1), (60, 3))]
    result = PrecomputeCosSinPass(max_positions=64)(model)
    assert result.report.count(Outcome.REWRITTEN) == 2, result.report.status
    assert {n.op_type for n in model.graph} >= {"Range", "Gather", "Unsqueeze"} and not any(
        n.op_type in ("Cos", "Sin") for n in model.graph)
    for (past, seq), ref in zip(((0, 5), (7, 1), (60, 3)), before, strict=True):
        for r, n in zip(ref, _run_range(model, past, seq), strict=True):
            np.testing.assert_array_equal(n, r)


@pytest.mark.parametrize(("case", "between", "start", "outcome", "reason"), [
    ("plus-call-length", "pos = Add (r, s)", None, Outcome.REFUSED,
     "Add 'add_pos' (r, s) mixes a value computed from the call's shape"),
    ("plus-single-token-flag", "eq = Equal (s, one)\n flag = Cast <to = 7> (eq)\n pos = Add (r, flag)", None,
     Outcome.REFUSED, "Add 'add_pos' (r, flag) mixes a value computed from the call's shape"),
    ("relative-to-first", "z0 = Constant <value = int64[1] {0}> ()\n first = Gather <axis = 0> (r, z0)\n"
     "pos = Sub (r, first)", None, Outcome.REFUSED, "Gather 'gather_first' (r, z0) gathers along a position axis"),
    ("reversed", "pos = ReverseSequence (r, r)", None, Outcome.REFUSED, "ReverseSequence 'reversesequence_pos'"),
    ("mask-cumsum-left-padding", "ax = Constant <value = int64 {1}> ()\n cs = CumSum (attention_mask, ax)\n"
     "pos = Sub (cs, one)", None, Outcome.REFUSED, "CumSum 'cumsum_cs' (attention_mask, ax) reads across"),
    ("past-from-mask-values", "pos = Identity (r)", "msum = ReduceSum <keepdims = 0> (attention_mask)\n"
     "past = Sub (msum, i2)", Outcome.REFUSED, "ReduceSum 'reducesum_msum' (attention_mask) reads across"),
])
def test_range_forms_that_must_not_be_rewritten(case, between, start, outcome, reason):
    """A dependency on anything but the token's own position between the Range and the rows is refused (naming the
    node); a Range whose start is read from a tensor's values (it could be negative) is no position source: the
    tensor it reads is then taken for the positions, and the cone refuses the reduction."""
    from rope_passes.passes import PrecomputeCosSinPass

    model = _range_graph(between, start or "past = Gather <axis = 0> (shp, i2)")
    result = PrecomputeCosSinPass(max_positions=64)(model)
    assert not result.modified and result.report.count(outcome) == 2, result.report.status
    assert result.report.findings[0].reason.startswith(reason), result.report.findings[0].reason


@pytest.mark.webgpu
def test_exporter_then_ort_fusions_example(tmp_path):
    """examples/exporter_then_ort_fusions.py runs (WebGPU) and every variant stays within 1e-5 of the original;
    nothing is left in the temp dir."""
    import os
    import subprocess
    import sys

    (tmp_path / "tmpdir").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmpdir")}  # a fresh temp dir: what the example leaves there
    proc = subprocess.run([sys.executable, str(FIXTURES.parents[1] / "examples" / "exporter_then_ort_fusions.py"),
                           "--steps", "3"], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list((tmp_path / "tmpdir").iterdir()) == []  # its variants (rope-exporter-fusions-*) are removed
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines()
            if line.split() and line.split()[0] in ("original", "exporter", "original+fusions", "exporter+fusions")}
    assert set(rows) == {"original", "exporter", "original+fusions", "exporter+fusions"}, proc.stdout
    assert all(float(r[5]) <= 1e-5 for r in rows.values()), proc.stdout
    assert "rope-passes precompute-cos-sin: rewritten 2" in proc.stdout
