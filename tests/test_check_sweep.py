"""The checker beyond the first dozen positions (issue 11): the rotation-table comparison over every position, the
position sweep, and the reference used when the original does not load on onnxruntime-webgpu 1.27.

Each test can fail: the mutations below are caught (or, unmutated, pass) only through the piece they test.
"""

from __future__ import annotations

import json

import numpy as np
import onnx_ir as ir
import pytest
from conftest import FIXTURES, GENAI, ONE_SCHEDULE, SWEEP, TORCH

import rope_passes
from rope_passes.analysis.table_diff import compare_tables, ulp
from rope_passes.check import core
from rope_passes.check.core import COULD_NOT_RUN, EQUIVALENT, NOT_EQUIVALENT, check, rotation_tables
from rope_passes.check.decode import DecoderSpec
from rope_passes.check.models import read_model, rotation_tables_of
from rope_passes.check.report import EQUIVALENT_TABLES_ONLY, EquivalenceReport
from rope_passes.check.schedules import parse
from rope_passes.check.sweep import default_positions, sweep_feeds, sweep_positions
from rope_passes.cli import main
from rope_passes.io import load_bundle, save_bundle

#: every 16th row and the last one of the [256, 16] caches
ROWS = [*range(0, 256, 16), 255]
GQA_CACHES = {"fp32": "current/llama/cpu_fp32", "fp16": "current/llama/webgpu_fp16_graph"}
PHI3 = GENAI / "current/phi3_mini_128k"
#: builder 0.18 mRoPE originals (com.microsoft::MRotaryEmbedding: onnxruntime-webgpu 1.27 loads none of them)
MROPE = [GENAI / "current/qwen25_vl/webgpu_fp16", GENAI / "current/qwen35/webgpu_fp32",
         FIXTURES / "genai/qwen3_vl/webgpu_fp16"]


def change_value(model: ir.Model, table: str, row: int, column: int | None = None, delta: float = 1e-2) -> None:
    """Add ``delta`` to one value (``column``) or the whole row of initializer ``table``."""
    value = model.graph.initializers[table]
    array = value.const_value.numpy().copy()
    array[row, slice(None) if column is None else column] += delta
    value.const_value = ir.tensor(array, name=table)


def mutated(src, dst, table: str, row: int, column: int | None = 1) -> str:
    bundle = load_bundle(src)
    change_value(bundle.model, table, row, column)
    save_bundle(bundle, dst)
    return str(dst)


def cli_check(monkeypatch, *argv: str) -> tuple[int, EquivalenceReport]:
    """``rope-passes check ARGV``'s exit code and the report it printed: one check, read as its text and as the API's
    object (a second check of the same pair for the object alone would double a test's time)."""
    made: list[EquivalenceReport] = []
    with monkeypatch.context() as patch:
        patch.setattr(core, "check", lambda *args, **kwargs: made.append(check(*args, **kwargs)) or made[-1])
        rc = main(["check", *argv])
    (report,) = made
    return rc, report


def cos_table(model_dir) -> str:
    """The name of the 2D float cos initializer a rewritten model reads."""
    bundle = load_bundle(model_dir)
    return next(name for name, v in bundle.model.graph.initializers.items()
                if "cos" in name and v.shape is not None and len(v.shape) == 2 and v.dtype.is_floating_point())


# ---------------------------------------------------------------- the table comparison, every 16th row


@pytest.fixture(scope="module")
def gqa_tables():
    out = {}
    for precision, name in GQA_CACHES.items():
        info = read_model(GENAI / name)
        out[precision] = (info, rotation_tables_of(info, "webgpu"))
    return out


@pytest.mark.corpus
@pytest.mark.parametrize("row", ROWS)
@pytest.mark.parametrize("table", ["cos_cache", "sin_cache"])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_table_comparison_catches_one_value_in_any_row(gqa_tables, precision, table, row):
    info, original = gqa_tables[precision]
    saved = info.model.graph.initializers[table].const_value
    column = row % saved.shape[1]
    try:
        change_value(info.model, table, row, column)  # the rewritten copy: one value of one row, +1e-2
        rewritten = rotation_tables_of(info, "webgpu")
    finally:
        info.model.graph.initializers[table].const_value = saved
    result = compare_tables(original, rewritten, info.context_length)
    assert result.status == "compared" and not result.ok, result.summary()
    first = result.first
    assert (first.position, first.table, first.column) == (row, table[:3], column)
    assert first.totals == (row + 1, 256)
    assert first.rewritten_row == f"row {row} of '{table}' (GroupQueryAttention input {7 if table[0] == 'c' else 8})"
    assert first.rewritten - first.original == pytest.approx(1e-2, rel=0.1)  # rounded to fp16 there
    assert first.ulps > 1
    assert result.precision.startswith("float16" if precision == "fp16" else "float32")


@pytest.mark.corpus
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_table_comparison_passes_the_same_tables(gqa_tables, precision):
    info, original = gqa_tables[precision]
    result = compare_tables(original, rotation_tables_of(info, "webgpu"), info.context_length)
    assert result.ok and result.max_ulps == 0
    assert (result.positions, result.sites) == (256, 4)  # 2 layers x (q, k)


def test_one_ulp_is_the_tolerance():
    assert ulp(np.array([1.0]), "float16")[0] == 2.0 ** -10
    assert ulp(np.array([0.75]), "float32")[0] == 2.0 ** -24
    assert ulp(np.array([0.0]), "float16")[0] == 2.0 ** -24


@pytest.mark.corpus
@pytest.mark.webgpu
def test_cli_names_a_row_the_decode_never_reads(tmp_path, capsys, monkeypatch):
    """fp16 cos_cache row 200, one value +1e-2: far past the 12 decoded positions and below the fp16 logits
    tolerance even at position 200 itself; the table comparison is what catches it."""
    src = GENAI / GQA_CACHES["fp16"]
    bad = mutated(src, tmp_path / "bad", "cos_cache", 200)
    rc, report = cli_check(monkeypatch, str(src), bad, "--no-sweep", "--schedule", ONE_SCHEDULE)
    assert rc == 1  # the tables alone see row 200
    text = capsys.readouterr().out
    assert "rotation tables: DIFFERENT" in text and "first failure: rotation tables: layer 0 q, position 200" in text
    data = json.loads(report.to_json())  # what --json prints for the same check
    first = data["tables"]["first_difference"]
    assert (first["position"], first["table"], first["column"]) == (200, "cos", 1)
    assert "row 200 of 'cos_cache'" in first["line"]
    assert all(c["ok"] for c in data["comparisons"] if c["kind"] == "decode" and c["counts"])
    # the pair against itself: the tables agree (its default schedules are test_check.py's self-consistency's)
    assert main(["check", str(src), str(src), "--no-sweep", "--schedule", ONE_SCHEDULE, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tables"]["ok"] and data["schedule"]["sweep_positions"] == []


# ---------------------------------------------------------------- the position sweep


def test_sweep_positions_cover_switches_and_the_end():
    positions = sweep_positions(256, [32], 32)
    assert len(positions) == 32 and positions == sorted(set(positions))
    assert {30, 31, 32, 33, 254, 255} <= set(positions) and min(positions) >= 1
    assert sweep_positions(256, [32], 3) == [31, 32, 255]  # a small budget keeps the switch and the end first
    assert sweep_positions(256, [], 0) == []
    assert sweep_positions(10, [], 32) == list(range(1, 10))


def test_default_sweep_is_every_position_or_a_stated_sample_with_its_bound():
    every, note = default_positions(256, [32], 2 * 2**20)  # a tiny model: 2 MB of weights, context 256
    assert every == list(range(256)) and "every position 0..255" in note
    # 4 GB of weights, context 131072: 2 positions afforded, so the least sample (32): half by rule, half drawn
    sample, note = default_positions(131072, [4096], 4 * 2**30, seed=0)
    assert 17 <= len(sample) <= 32 and {4095, 4096, 131071} <= set(sample)
    width = -(-131072 // 16)
    assert f"strata of {width}" in note and f"probability 1/{width}" in note
    assert all(any(lo <= p < lo + width for p in sample) for lo in range(0, 131072, width))  # one in every stratum
    assert default_positions(131072, [4096], 4 * 2**30, seed=1)[0] != sample  # another seed draws others
    small, note = default_positions(256, [], 100 * 2**20)  # 100 MB x 256 positions is over 8 GB: 81 afforded
    assert 41 <= len(small) <= 81 and "strata of 7" in note and 255 in small


@pytest.mark.corpus
def test_sweep_feeds_are_a_random_past_of_the_position():
    spec = DecoderSpec.from_model(GENAI / GQA_CACHES["fp16"] / "model.onnx",
                                  json.loads((GENAI / GQA_CACHES["fp16"] / "genai_config.json").read_text()))
    feeds = sweep_feeds(spec, 100)
    assert feeds["input_ids"].shape == (1, 1)
    assert feeds["attention_mask"].shape == (1, 101) and feeds["attention_mask"].all()
    assert feeds["past_key_values.0.key"].shape[2] == 100 and feeds["past_key_values.0.key"].dtype == np.float16
    again = sweep_feeds(spec, 100)
    assert all(np.array_equal(feeds[k], again[k]) for k in feeds)  # the same past for both graphs
    assert not np.array_equal(feeds["past_key_values.0.key"], feeds["past_key_values.1.key"])


@pytest.mark.corpus
@pytest.mark.webgpu
def test_sweep_catches_a_row_the_decode_never_reads(tmp_path):
    """fp32 cos_cache row 254 (+1e-2 on the whole row): the decode reads rows 0..11; the sweep's position 254 (the
    table end's neighbour) reads it. Tables, schedules and the call grid off, so only the sweep can see it."""
    src = GENAI / GQA_CACHES["fp32"]
    bad = mutated(src, tmp_path / "bad", "cos_cache", 254, column=None)
    report = check(src, bad, steps=4, isolate=False, tables=False, schedules=[], calls=False)
    assert report.verdict == NOT_EQUIVALENT
    assert report.first_failure is None  # the decode agrees
    cmp, diff = report.first_sweep_failure
    assert diff.step == 254 and cmp.name == "sweep: rewritten@webgpu vs original@webgpu"
    assert all(d.ok for d in cmp.diffs if d.step != 254)
    assert check(src, bad, steps=4, isolate=False, tables=False, sweep=0, schedules=[],
                 calls=False).verdict == EQUIVALENT
    # the context end's boundary schedules (issue 26: totals 248..256 step by step) read row 254 too
    ends = check(src, bad, steps=4, isolate=False, tables=False, sweep=0, calls=False)
    assert ends.verdict == NOT_EQUIVALENT and ends.first_schedule_failure[1].schedule.startswith("end-256-")


# ---------------------------------------------------------------- originals onnxruntime-webgpu 1.27 cannot load


@pytest.fixture(scope="module")
def folded(tmp_path_factory):
    """``optimize --target webgpu-graph --text-only`` of each builder 0.18 mRoPE original."""
    root = tmp_path_factory.mktemp("folded")
    out = {}
    for i, src in enumerate(MROPE):
        out[src] = root / f"m{i}"
        rope_passes.optimize(src, out[src], preset="webgpu-graph", options={"text_only": True}, weights="copy")
    return out


@pytest.mark.corpus
@pytest.mark.webgpu
@pytest.mark.parametrize("src", MROPE, ids=lambda p: p.parent.name + "/" + p.name)
def test_mrope_original_vs_its_fold_output(src, folded, tmp_path, capsys, monkeypatch):
    rc, report = cli_check(monkeypatch, str(src), str(folded[src]), "--sweep", str(SWEEP))  # subject: which reference
    text = capsys.readouterr().out
    reference = next(line for line in text.splitlines() if line.startswith("reference: "))
    assert "MRotaryEmbedding" in text  # why the original does not load here is said
    assert report.equivalent and report.tables.ok
    assert rc == report.exit_code  # 0 with the second runtime's reference, 3 on the tables alone (issue 26)
    if report.run("original@webgpu:plugin") is not None:  # the second runtime is set up: it ran the original
        assert "onnxruntime-ep-webgpu" in reference and rc == 0
        assert report.comparison("rewritten@webgpu", "original@cpu:plugin").status == "compared"
        assert report.comparison("rewritten@webgpu", "original@cpu:plugin", kind="sweep").ok
    else:
        assert reference.startswith("reference: the rotation tables alone")
    # without the second runtime: the tables alone, and said so
    alone = check(src, folded[src], fallback_python=None, isolate=False, sweep=0)
    assert alone.verdict == EQUIVALENT_TABLES_ONLY and alone.reference.startswith("the rotation tables alone")
    # an output with one cos value off at position 100 is not equivalent, whatever the reference
    table = cos_table(folded[src])  # the folded 1D table, or the caches lower-mrope gathers from (qwen3_vl fp16)
    bad = mutated(folded[src], tmp_path / "bad", table, 100)
    for fallback in ("auto", None):
        report = check(src, bad, fallback_python=fallback, isolate=False, sweep=4, schedules=[parse(ONE_SCHEDULE)])
        assert report.verdict == NOT_EQUIVALENT and report.exit_code == 1
        assert report.tables.first.position == 100
        if table.startswith("rope_passes."):
            assert f"row 100 of '{table}'" in report.tables.first.rewritten_row


@pytest.mark.corpus
def test_no_reference_at_all_is_a_one_line_reason(tmp_path):
    """The original loads nowhere and the requested runtime does not start: exit 2 with the reason."""
    src = MROPE[0]
    report = check(src, src, ep="cpu", isolate=False, sweep=0, reference_python=str(tmp_path / "nopython"))
    assert report.verdict == COULD_NOT_RUN and report.exit_code == 2
    assert report.reason and "\n" not in report.reason


# ---------------------------------------------------------------- LongRoPE


@pytest.mark.corpus
@pytest.mark.parametrize("row,position,first_total", [(65, 33, 34), (33, 1, 33)])
def test_row_in_the_long_half_of_a_concatenated_cache_is_caught(row, position, first_total):
    """phi3 [short 32; long 256] cache read at offset 32: row 65 is position 33 just past the original context;
    row 33 is position 1 of the long table, read only by a prefill longer than 32 tokens."""
    info = read_model(PHI3 / "webgpu_fp16_graph")
    original = rotation_tables_of(info, "webgpu")
    change_value(info.model, "cos_cache", row, 2)
    result = compare_tables(original, rotation_tables_of(info, "webgpu"), info.context_length)
    assert not result.ok
    assert (result.first.position, result.first.totals) == ((position), (first_total, 256))
    assert result.first.rewritten_row == f"row {row} of 'cos_cache' (GroupQueryAttention input 7)"


@pytest.mark.corpus
def test_concatenated_cache_equals_the_if_model_at_its_offset():
    """The builder's concat model (fp16, offset 32) reads what its If model (fp32) reads at every position and
    total, at fp16 precision; without the offset (the CPU EP) it does not."""
    webgpu = rotation_tables(PHI3 / "webgpu_fp32", PHI3 / "webgpu_fp16_graph")
    assert webgpu.ok and webgpu.positions == 256 and webgpu.precision.startswith("float16")
    assert any("row = (total > 32 ? 32 : 0) + position" in s for s in webgpu.rewritten_semantics)
    cpu = rotation_tables(PHI3 / "webgpu_fp32", PHI3 / "webgpu_fp16_graph", ep="cpu")
    assert not cpu.ok and cpu.first.position < 32 and cpu.first.totals == (33, 256)  # reads the short rows
    # separate Q/K/V: onnxruntime ignores the offset (packed QKV only), so the builder's nofuseqkv model differs
    unpacked = rotation_tables(PHI3 / "webgpu_fp32", FIXTURES / "genai/phi3_mini_128k/webgpu_fp32_graph_nofuseqkv")
    assert not unpacked.ok and unpacked.first.totals[0] == 33
    assert any("ignored" in s for s in unpacked.rewritten_semantics)


@pytest.mark.corpus
@pytest.mark.webgpu
def test_if_model_vs_its_concat_rewrite_end_to_end(tmp_path):
    src = PHI3 / "webgpu_fp32"
    rope_passes.optimize(src, tmp_path / "concat", preset="webgpu-graph", weights="copy")
    report = check(src, tmp_path / "concat", isolate=False)
    assert report.verdict == EQUIVALENT, report.first_differences()
    assert report.tables.ok and report.tables.positions == 256
    assert {31, 32, 33, 255} <= set(report.sweep_positions)
    sweep = report.comparison("rewritten@webgpu", "original@webgpu", kind="sweep")
    assert sweep.ok and {d.step for d in sweep.diffs} == set(report.sweep_positions)


# ---------------------------------------------------------------- exporter graphs: the position cone


@pytest.mark.corpus
def test_position_cone_of_an_exporter_graph(tmp_path):
    """transformers-5 llama (cos/sin computed per call) vs precompute-cos-sin's table: equal; one value off: named."""
    src = TORCH / "tf5/dynamo/llama/decode.onnx"
    rope_passes.optimize(src, tmp_path / "pre.onnx", preset="exporter", options={"max_positions": 256})
    same = rotation_tables(src, tmp_path / "pre.onnx")
    assert same.ok and same.form == "position cone" and same.positions == 256
    bundle = load_bundle(tmp_path / "pre.onnx")
    change_value(bundle.model, "rope_passes.cos_table", 77, 3)
    save_bundle(bundle, tmp_path / "bad.onnx")
    bad = rotation_tables(src, tmp_path / "bad.onnx")
    assert not bad.ok and bad.first.position == 77


@pytest.mark.corpus
@pytest.mark.parametrize("op", ["Mul", "Add"])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_table_the_graph_computes_from_constants_is_compared(precision, op):
    """Independent set (issue 20): ``cos_cache`` fed to GroupQueryAttention through ``Mul(cos, 1.01)`` or
    ``Add(cos, delta)`` (one row) is no stored table; before, the comparison skipped it and the decode (fp16: 0.04
    under the 0.1 tolerance; fp32: row 170 never reached) passed it. Now the one constant evaluator gives its rows."""
    info = read_model(GENAI / GQA_CACHES[precision])
    original = rotation_tables_of(info, "webgpu")
    graph = info.model.graph
    cos = graph.initializers["cos_cache"]
    dtype = cos.const_value.numpy().dtype
    if op == "Mul":
        other = ir.Value(name="rt_factor", const_value=ir.tensor(np.array(1.01, dtype)))
    else:
        delta = np.zeros(cos.const_value.shape.numpy(), dtype)
        delta[170, :] = 0.01
        other = ir.Value(name="rt_delta", const_value=ir.tensor(delta))
    graph.register_initializer(other)
    node = ir.node(op, [cos, other])
    gqas = [n for n in graph if n.op_type == "GroupQueryAttention"]
    graph.insert_before(gqas[0], node)
    for gqa in gqas:
        gqa.replace_input_with(7, node.outputs[0])
    result = compare_tables(original, rotation_tables_of(info, "webgpu"), info.context_length)
    assert result.status == "compared" and not result.ok, result.summary()
    assert result.first.position == (0 if op == "Mul" else 170) and result.first.table == "cos"
