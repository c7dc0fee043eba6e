"""``precompute-cos-sin``: per-call cos/sin chains replaced by Gather from precomputed tables.

Corpus: every static exporter graph (transformers 5 dynamo, transformers 4 TorchScript; prefill and decode) is
rewritten and run on onnxruntime CPU against the original on the README's input cases. The tables are the graph's own
cos/sin subgraph evaluated by the same onnxruntime CPU kernels on the same values, so the CPU outputs must be
bit-identical (measured: all 58). On WebGPU (two graphs) the bar is fp32 1e-5: WebGPU's matmuls and cos/sin round
differently from CPU's (measured <= 1.7e-6 against the original on CPU). The tf5 LongRoPE graphs (Where on
ReduceMax(position_ids)) must be refused. A builder graph computing mRoPE cos/sin per call (genai corpus,
legacy/qwen25_vl) is rewritten bit-identically and still folds afterwards. Small graphs built in code cover the
refusals the corpus lacks (dynamic NTK, token mixing, unknown size, a second input), fp16 tables (ONNX reference
evaluator bit-identical; onnxruntime CPU within 4e-3, see the test) and the documented out-of-table behaviour.
"""

from __future__ import annotations

import collections
import json

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from _utils import serialize
from conftest import TORCH

from rope_passes.config import GenaiConfig
from rope_passes.errors import UsageError
from rope_passes.passes import ALL_PASSES, PassContext, PrecomputeCosSinPass
from rope_passes.passes.precompute_cos_sin import MAX_POSITIONS_KEY
from rope_passes.pipeline import run_pipeline
from rope_passes.plan import make_plan
from rope_passes.report import Outcome
from rope_passes.runtime.sessions import WEBGPU, create_session

MAX_POS = 256  # max_position_embeddings of every corpus model (corpus README)


def _manifest() -> list[dict]:
    entries = []
    for tf in ("tf4", "tf5"):
        path = TORCH / tf / "manifest.json"
        if path.is_file():
            entries += [e for e in json.loads(path.read_text()) if e["status"] != "export_fail"]
    return entries


def _is_dynamic(entry: dict) -> bool:
    """LongRoPE chosen per call by a Where in the graph: transformers 5 exports of longrope variants."""
    return entry["exporter"] == "dynamo" and "longrope" in entry["rope"]


ENTRIES = _manifest()
STATIC = [e["path"] for e in ENTRIES if not _is_dynamic(e)]
DYNAMIC = [e["path"] for e in ENTRIES if _is_dynamic(e)]


@pytest.mark.corpus
def test_corpus_is_there():
    assert len(ENTRIES) == 62, f"the torch corpus is missing or changed: {TORCH} ({len(ENTRIES)} graphs)"
    assert len(STATIC) == 58 and len(DYNAMIC) == 4


# ----------------------------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------------------------


def _ops(model: ir.Model) -> collections.Counter:
    return collections.Counter(n.op_type for n in ir.traversal.RecursiveGraphIterator(model.graph))


def _feeds(sess: ort.InferenceSession, batch: int, seq: int, past: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for one call: ``seq`` new tokens at positions past..past+seq-1 (prefill: past must be 0)."""
    rng = np.random.RandomState(seed + 100 * batch + 10 * seq + past)
    ins = {i.name: i for i in sess.get_inputs()}
    pos = np.tile(np.arange(past, past + seq, dtype=np.int64), (batch, 1))
    feeds = {"input_ids": rng.randint(0, 256, (batch, seq)).astype(np.int64)}
    if "attention_mask" in ins:
        feeds["attention_mask"] = np.ones((batch, past + seq), np.int64)
    if "position_ids" in ins:
        feeds["position_ids"] = np.stack([pos] * 3) if len(ins["position_ids"].shape) == 3 else pos
    for name, i in ins.items():
        if name.startswith("past_key_values"):
            feeds[name] = (0.5 * rng.randn(batch, i.shape[1], past, i.shape[3])).astype(np.float32)
    return feeds


#: (batch, new tokens, past). Prefill graphs take the past as part of the prompt (positions from 0), as the
#: corpus generator does; decode graphs take it as KV cache. The last case reaches positions 80..83.
CASES = [(2, 7, 5), (1, 3, 9), (1, 4, 80)]


def _run_cases(original: bytes, rewritten: bytes, kind: str, ep: str = "cpu", cases=CASES) -> float:
    ref_sess = create_session(original, "cpu")
    new_sess = create_session(rewritten, ep)
    worst = 0.0
    for batch, seq, past in cases:
        if kind == "prefill":
            seq, past = seq + past, 0
        feeds = _feeds(ref_sess, batch, seq, past)
        ref, new = ref_sess.run(None, feeds), new_sess.run(None, feeds)
        assert len(ref) == len(new)
        for r, n in zip(ref, new, strict=True):
            assert r.shape == n.shape
            worst = max(worst, float(np.max(np.abs(r.astype(np.float64) - n.astype(np.float64)))))
    return worst


def _rewrite(path: str, genai_config: dict | None = None, **options) -> tuple[bytes, ir.Model, object]:
    original = (TORCH / path).read_bytes()
    model = ir.serde.deserialize_model(onnx.load_from_string(original))
    result = PrecomputeCosSinPass(PassContext(GenaiConfig(genai_config)), **options)(model)
    return original, result.model, result


# ----------------------------------------------------------------------------------------------------------------
# Corpus: every static variant rewritten and equal to the original
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.corpus
@pytest.mark.parametrize("path", STATIC)
def test_corpus_static_rewritten_and_equal(path):
    original, model, result = _rewrite(path, max_positions=MAX_POS)
    before = _ops(ir.serde.deserialize_model(onnx.load_from_string(original)))
    after = _ops(model)
    report = result.report
    n = before["Cos"]  # chains: gemma3_text has two (local and global), the others one
    assert result.modified and report.count(Outcome.REWRITTEN) == 2 * n, report.status
    assert report.count(Outcome.REFUSED) == 0
    # the per-call chain is gone: no Cos/Sin, no inv_freq constant, and for TorchScript its Shape/Expand plumbing
    assert after["Cos"] == after["Sin"] == 0
    inv_freq = {f.details["inv_freq"] for f in report.findings if f.outcome is Outcome.REWRITTEN}
    assert len(inv_freq) == n
    assert not inv_freq & ({v.name for node in model.graph for v in node.outputs} | set(model.graph.initializers))
    if "torchscript" in path:
        for op in ("MatMul", "Expand", "Transpose", "ConstantOfShape"):
            assert after[op] == before[op] - n, op
        assert after["Shape"] == before["Shape"] - (n + 1)  # Shape(position_ids) is shared by gemma3's chains
        assert report.nodes_removed == {1: 35, 2: 63}[n]
    else:
        assert after["Concat"] == before["Concat"] - (0 if "qwen2_5_vl" in path else n)  # mRoPE: Expand instead
        assert report.nodes_removed == (8 if "yarn" in path else {1: 6, 2: 10}[n])  # yarn: + 2 Mul(1.1386)
    assert model.metadata_props[MAX_POSITIONS_KEY] == str(MAX_POS)
    gathers = [node for node in model.graph if node.op_type == "Gather" and node.name.startswith("rope_passes/")]
    assert len(gathers) == 2 * n and report.initializers_added == 2 * n
    for g in gathers:
        table = g.inputs[0].const_value
        assert table is not None and table.shape[0] == MAX_POS and table.dtype == ir.DataType.FLOAT
        assert g.inputs[1].is_graph_input() and g.inputs[1].name == "position_ids"
    kind = "prefill" if path.endswith("prefill.onnx") else "decode"
    worst = _run_cases(original, serialize(model), kind)
    assert worst == 0.0, f"max |rewritten - original| = {worst}"  # same kernels on the same values: bit-identical


@pytest.mark.corpus
@pytest.mark.parametrize("path", DYNAMIC)
def test_corpus_longrope_where_refused(path):
    original, model, result = _rewrite(path, max_positions=MAX_POS)
    report = result.report
    assert not result.modified
    assert report.count(Outcome.REFUSED) == 2 and report.count(Outcome.REWRITTEN) == 0
    for f in report.findings:
        assert f.reason.startswith("LongRoPE chosen per call: Where(Greater(position_ids → ReduceMax → Add, 64))"), f
    assert serialize(model) == serialize(ir.serde.deserialize_model(onnx.load_from_string(original)))
    assert MAX_POSITIONS_KEY not in model.metadata_props


@pytest.mark.corpus
def test_positions_past_the_table(tmp_path):
    """README case 4 (positions 300-301, past 256): a 512-row table is still exact; a 256-row one fails loudly."""
    path = "tf5/dynamo/llama_yarn/decode.onnx"
    original, model, _ = _rewrite(path, max_positions=512)
    assert _run_cases(original, serialize(model), "decode", cases=[(1, 2, 300)]) <= 1e-5
    _, small, _ = _rewrite(path, max_positions=MAX_POS)
    sess = create_session(serialize(small), "cpu")
    with pytest.raises(Exception, match="out of bounds|indices"):
        sess.run(None, _feeds(sess, 1, 2, 300))


@pytest.mark.corpus
def test_mrope_positions_differing_per_axis():
    """mRoPE [3,B,S]: the table is gathered per axis before the section split, so vision-style positions (three
    different axes) stay exact too, not only text."""
    path = "tf5/dynamo/qwen2_5_vl_text/decode.onnx"
    original, model, _ = _rewrite(path, max_positions=MAX_POS)
    ref_sess, new_sess = create_session(original, "cpu"), create_session(serialize(model), "cpu")
    feeds = _feeds(ref_sess, 2, 5, 6)
    rng = np.random.RandomState(7)
    feeds["position_ids"] = np.stack([feeds["position_ids"][0], rng.randint(0, 40, (2, 5)), rng.randint(0, 40, (2, 5))])
    for r, n in zip(ref_sess.run(None, feeds), new_sess.run(None, feeds), strict=True):
        np.testing.assert_array_equal(n, r)


@pytest.mark.corpus
def test_genai_context_length_sizes_the_table_and_second_run_is_a_no_op():
    path = "tf4/torchscript/llama/decode.onnx"
    _, model, result = _rewrite(path, genai_config={"model": {"context_length": 128}})
    assert result.report.count(Outcome.REWRITTEN) == 2
    assert all(v.const_value.shape[0] == 128 for k, v in model.graph.initializers.items() if k.startswith("rope_"))
    again = PrecomputeCosSinPass(max_positions=64)(model)
    assert not again.modified and again.report.status.startswith("not matched: no Cos/Sin node")
    assert model.metadata_props[MAX_POSITIONS_KEY] == "128"


@pytest.mark.corpus
@pytest.mark.webgpu
@pytest.mark.parametrize("path", ["tf5/dynamo/qwen2_5_vl_text/decode.onnx", "tf4/torchscript/gemma3_text/prefill.onnx"])
def test_webgpu_equal_to_original(path):
    """The rewritten graph on WebGPU against the original on WebGPU and on CPU (prefills stay <= 8 tokens)."""
    original, model, _ = _rewrite(path, max_positions=MAX_POS)
    kind = "prefill" if path.endswith("prefill.onnx") else "decode"
    cases = [(2, 7, 0), (1, 1, 80)] if kind == "prefill" else [(2, 7, 5), (1, 1, 80)]
    new_sess = create_session(serialize(model), "webgpu")
    assert new_sess.get_providers()[0] == WEBGPU
    assert _run_cases(original, serialize(model), kind, ep="webgpu", cases=cases) <= 1e-5
    # and against the original on WebGPU (what the user ran before the rewrite)
    ref_sess = create_session(original, "webgpu")
    for batch, seq, past in cases:
        feeds = _feeds(ref_sess, batch, seq + (past if kind == "prefill" else 0), 0 if kind == "prefill" else past)
        for r, n in zip(ref_sess.run(None, feeds), new_sess.run(None, feeds), strict=True):
            np.testing.assert_allclose(n, r, rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------------------------------------------
# Small graphs built in code
# ----------------------------------------------------------------------------------------------------------------

HALF = 4
INV_FREQ = (1.0 / (10000.0 ** (np.arange(HALF) * 2.0 / (2 * HALF)))).astype(np.float32)


def _chain_graph(kind: str = "static", extra_input: bool = False, fp16: bool = False) -> ir.Model:
    """x[B,S,2H] rotated by cos/sin of position_ids[B,S] × inv_freq, exporter style (tf5 dynamo).

    ``kind``: "static" (default RoPE, × 0.5 attention scaling); "ntk" (dynamic NTK spelled out: the frequencies
    are divided by max(1, (ReduceMax(position_ids) + 1) / 8)); "relative" (positions relative to the call's first
    token: no reduction op, yet a row depends on another token's position). ``fp16``: x is float16 and cos/sin
    are cast to float16 after the float32 computation (as fp16 exports do).
    """
    dtype = ir.DataType.FLOAT16 if fp16 else ir.DataType.FLOAT
    pos = ir.Value(name="position_ids", shape=ir.Shape(["batch", "seq"]), type=ir.TensorType(ir.DataType.INT64))
    x = ir.Value(name="x", shape=ir.Shape(["batch", "seq", 2 * HALF]), type=ir.TensorType(dtype))
    inputs = [x, pos]
    nodes: list[ir.Node] = []

    def add(op, ins, attrs=None, name=None):
        node = ir.node(op, ins, attrs or {}, name=name or f"{op.lower()}_{len(nodes)}")
        nodes.append(node)
        return node.outputs[0]

    def const(array, name):
        return add("Constant", [], {"value": ir.tensor(np.asarray(array), name=name)}, name=name)

    inv = const(INV_FREQ, "inv_freq")
    p = pos
    if kind == "relative":
        first = add("Gather", [pos, const(np.array([0], np.int64), "zero")], {"axis": 1})
        p = add("Sub", [pos, first])
    if extra_input:
        offset = ir.Value(name="offset", shape=ir.Shape([]), type=ir.TensorType(ir.DataType.INT64))
        inputs.append(offset)
        p = add("Add", [p, offset])
    pf = add("Cast", [add("Unsqueeze", [p, const(np.array([2], np.int64), "axis2")])], {"to": ir.DataType.FLOAT})
    if kind == "ntk":
        biggest = add("Cast", [add("ReduceMax", [pos], {"keepdims": 0})], {"to": ir.DataType.FLOAT})
        factor = add("Max", [add("Div", [add("Add", [biggest, const(np.float32(1), "one")]),
                                         const(np.float32(8), "orig")]), const(np.float32(1), "one_")])
        inv = add("Div", [inv, factor])
    freqs = add("Mul", [pf, inv])
    emb = add("Concat", [freqs, freqs], {"axis": -1})
    cos = add("Mul", [add("Cos", [emb], name="cos"), const(np.float32(0.5), "scaling")])
    sin = add("Mul", [add("Sin", [emb], name="sin"), const(np.float32(0.5), "scaling_")])
    if fp16:
        cos, sin = (add("Cast", [v], {"to": ir.DataType.FLOAT16}) for v in (cos, sin))
    x1 = add("Slice", [x, const(np.array([0], np.int64), "s0"), const(np.array([HALF], np.int64), "s1"),
                       const(np.array([2], np.int64), "ax")])
    x2 = add("Slice", [x, const(np.array([HALF], np.int64), "s2"), const(np.array([2 * HALF], np.int64), "s3"),
                       const(np.array([2], np.int64), "ax_")])
    rot = add("Concat", [add("Neg", [x2]), x1], {"axis": -1})
    y = add("Add", [add("Mul", [x, cos]), add("Mul", [rot, sin])])
    y.name = "y"
    graph = ir.Graph(inputs, [y], nodes=nodes, opset_imports={"": 20}, name="rope")
    return ir.Model(graph, ir_version=10)


def _run_small(model: ir.Model, positions: np.ndarray) -> np.ndarray:
    sess = create_session(serialize(model), "cpu")
    rng = np.random.RandomState(1)
    fp16 = sess.get_inputs()[0].type == "tensor(float16)"
    x = rng.randn(*positions.shape, 2 * HALF).astype(np.float16 if fp16 else np.float32)
    feeds = {"x": x, "position_ids": positions}
    if "offset" in {i.name for i in sess.get_inputs()}:
        feeds["offset"] = np.array(3, np.int64)
    return sess.run(None, feeds)[0]


def test_small_static_graph_rewritten_bit_identical():
    positions = np.array([[0, 1, 2, 3], [17, 5, 31, 9]], np.int64)  # any order, any rows below max_positions
    reference = _run_small(_chain_graph(), positions)
    model = _chain_graph()
    result = PrecomputeCosSinPass(max_positions=32)(model)
    assert result.report.count(Outcome.REWRITTEN) == 2, result.report.status
    ops = _ops(model)
    assert ops["Cos"] == ops["Sin"] == ops["Cast"] == ops["Unsqueeze"] == 0 and ops["Gather"] == 2
    cos = model.graph.initializers["rope_passes.cos_table"].const_value.numpy()
    expected = 0.5 * np.cos(np.arange(32, dtype=np.float32)[:, None] * np.concatenate([INV_FREQ, INV_FREQ]))
    np.testing.assert_allclose(cos, expected, rtol=0, atol=1e-6)  # the scaling is inside the table
    np.testing.assert_array_equal(_run_small(model, positions), reference)


def test_small_fp16_graph_gets_an_fp16_table():
    """The table takes the dtype the chain ends in (here float16 after a Cast).

    ONNX semantics (onnx's reference evaluator): bit-identical. onnxruntime CPU has no float16 Mul/Add kernels and
    runs them through inserted float32 casts, which drop the original's rounding of cos/sin to float16; measured
    4.9e-4 (2 float16 ulps at |y| ~ 0.35) between original and rewritten, so the bar there is 4e-3 (|y| < 2)."""
    from onnx.reference import ReferenceEvaluator

    positions = np.array([[3, 0, 30, 7]], np.int64)
    original = _chain_graph(fp16=True)
    model = _chain_graph(fp16=True)
    result = PrecomputeCosSinPass(max_positions=32)(model)
    assert result.report.count(Outcome.REWRITTEN) == 2
    table = model.graph.initializers["rope_passes.sin_table"]
    assert table.dtype == ir.DataType.FLOAT16 and table.shape == ir.Shape([32, 2 * HALF])
    assert _ops(model)["Cast"] == 0  # the Cast to float16 is inside the table
    x = np.random.RandomState(1).randn(1, 4, 2 * HALF).astype(np.float16)
    ref, new = (ReferenceEvaluator(onnx.load_from_string(serialize(m))).run(None, {"x": x, "position_ids": positions})[0]
                for m in (original, model))
    assert new.dtype == np.float16
    np.testing.assert_array_equal(new, ref)
    out = _run_small(model, positions)
    assert out.dtype == np.float16 and np.abs(out).max() < 2
    np.testing.assert_allclose(out.astype(np.float32), _run_small(original, positions), rtol=0, atol=4e-3)


def test_small_dynamic_ntk_refused():
    model = _chain_graph("ntk")
    before = serialize(model)
    result = PrecomputeCosSinPass(max_positions=32)(model)
    assert not result.modified and result.report.count(Outcome.REFUSED) == 2
    reason = result.report.findings[0].reason
    assert reason.startswith("ReduceMax 'reducemax_") and "reads across the positions of the call" in reason
    assert serialize(model) == before


def test_small_token_mixing_refused_by_the_cone():
    """No reduction op, but each row depends on the call's first position: the cone accounting names the Gather."""
    model = _chain_graph("relative")
    result = PrecomputeCosSinPass(max_positions=32)(model)
    assert not result.modified and result.report.count(Outcome.REFUSED) == 2
    assert result.report.findings[0].reason.startswith(
        "Gather 'gather_2' (position_ids, val_1) gathers along a position axis")


def test_small_token_mixing_refused_by_evaluation_too(monkeypatch):
    """The numeric evidence stands on its own: with the cone accounting switched off, the probes still refuse."""
    from rope_passes.proofs import cone as _cos_sin_cone

    monkeypatch.setattr(_cos_sin_cone.Cone, "prove", lambda self, end, trig, unit_axes=False: 0)
    monkeypatch.setattr(_cos_sin_cone.Cone, "unit_axes", [], raising=False)
    result = PrecomputeCosSinPass(max_positions=32)(_chain_graph("relative"))
    assert not result.modified and result.report.count(Outcome.REFUSED) == 2
    assert result.report.findings[0].reason.endswith(
        "with permuted positions the rows are not the table's rows at those positions, so a row depends on more "
        "than its own position")


def test_small_table_size_unknown_refused():
    model = _chain_graph()
    result = PrecomputeCosSinPass()(model)
    assert not result.modified
    assert result.report.status == (
        "refused: table size unknown: give max_positions (or model.context_length in genai_config.json, or "
        "max_position_embeddings in the config.json beside the model)")


def test_small_second_input_not_matched():
    result = PrecomputeCosSinPass(max_positions=32)(model := _chain_graph(extra_input=True))
    assert not result.modified and result.report.count(Outcome.NOT_MATCHED) == 2
    assert "depends on 2 graph inputs ('offset', 'position_ids')" in result.report.findings[0].reason
    assert _ops(model)["Cos"] == 1


def _cone_graph(body: str) -> ir.Model:
    """``positions[B,S] → <body> → p2 → Unsqueeze → Cast → Mul(inv_freq) → Concat → Cos|Sin → Unsqueeze(1)``."""
    from onnx import parser

    text = f"""<ir_version: 10, opset_import: ["" : 20]>
    g (int64[B, S] position_ids) => (float[B, 1, S, {2 * HALF}] cos_out, float[B, 1, S, {2 * HALF}] sin_out) {{
        inv = Constant <value = float[{HALF}] {{{", ".join(repr(float(f)) for f in INV_FREQ)}}}> ()
        two = Constant <value = int64[1] {{2}}> ()
        {body}
        u = Unsqueeze (p2, two)
        f = Cast <to = 1> (u)
        fr = Mul (f, inv)
        emb = Concat <axis = -1> (fr, fr)
        c = Cos (emb)
        s = Sin (emb)
        ax1 = Constant <value = int64[1] {{1}}> ()
        cos_out = Unsqueeze (c, ax1)
        sin_out = Unsqueeze (s, ax1)
    }}"""
    model = ir.serde.deserialize_model(parser.parse_model(text))
    for node in model.graph:
        node.name = node.name or f"{node.op_type.lower()}_{node.outputs[0].name}"
    return model


CONE_CASES = {
    # per-token forms the allow-list accepts (the table absorbs them)
    "reshape-gather-table": ("k = Constant <value = int64[3] {0, 0, 1}> ()\n r = Reshape (position_ids, k)\n"
                             "t = Constant <value = int64[64] {" + ", ".join(str(3 * i) for i in range(64)) + "}> ()\n"
                             "g = Gather <axis = 0> (t, r)\n one = Constant <value = int64[1] {2}> ()\n"
                             "p2 = Squeeze (g, one)", None),
    "where-per-token": ("lim = Constant <value = int64 {16}> ()\n lt = Less (position_ids, lim)\n"
                        "k2 = Constant <value = int64 {2}> ()\n dbl = Mul (position_ids, k2)\n"
                        "p2 = Where (lt, position_ids, dbl)", None),
    # a constant expanded by the call's shape along the token axis: rows would repeat one token when S == 1
    "expand-inflates-tokens": ("sh = Shape (position_ids)\n i0 = Constant <value = int64[1] {0}> ()\n"
                               "b = Gather <axis = 0> (sh, i0)\n five = Constant <value = int64[1] {5}> ()\n"
                               "cs = Concat <axis = 0> (b, five)\n z = Constant <value = int64[1, 1] {0}> ()\n"
                               "zz = Expand (z, cs)\n p2 = Add (position_ids, zz)",
                               "Add 'add_p2' (position_ids, zz) broadcasts a constant of extent 5 along position axis 1"),
    # a product over the tokens of the call (MatMul contracting the sequence axis)
    "matmul-over-tokens": ("pf = Cast <to = 1> (position_ids)\n w = Constant <value = float[1] {1.0}> ()\n"
                           "pt = Transpose <perm = [1, 0]> (pf)\n m = MatMul (pf, pt)\n"
                           "one = Constant <value = int64[1] {1}> ()\n mm = ReduceSum (m, one)\n"
                           "p2i = Cast <to = 7> (mm)\n p2 = Identity (p2i)",
                           "MatMul 'matmul_m' (pf, pt) sums over the tokens of the call"),
}


@pytest.mark.parametrize("case", sorted(CONE_CASES))
def test_cone_accounting(case):
    body, refusal = CONE_CASES[case]
    model = _cone_graph(body)
    before = serialize(model)
    result = PrecomputeCosSinPass(max_positions=64)(model)
    if refusal is None:
        assert result.report.count(Outcome.REWRITTEN) == 2, result.report.status
        positions = np.array([[0, 3, 17, 40], [1, 1, 63, 9]], np.int64)
        ref = create_session(before, "cpu").run(None, {"position_ids": positions})
        new = create_session(serialize(model), "cpu").run(None, {"position_ids": positions})
        for r, n in zip(ref, new, strict=True):
            np.testing.assert_array_equal(n, r)
    else:
        assert not result.modified and result.report.count(Outcome.REFUSED) == 2, result.report.status
        assert result.report.findings[0].reason.startswith(refusal), result.report.findings[0].reason


@pytest.mark.parametrize("bad", [0, -4, "many", 12.5])
def test_bad_max_positions_is_a_usage_error(bad):
    with pytest.raises(UsageError, match="max_positions must be a positive integer"):
        PrecomputeCosSinPass(max_positions=bad)(_chain_graph())


def test_registered_and_runs_in_a_pipeline(tmp_path):
    from rope_passes.io import load_bundle

    assert ALL_PASSES["precompute-cos-sin"] is PrecomputeCosSinPass
    path = tmp_path / "m.onnx"
    path.write_bytes(serialize(_chain_graph()))
    bundle = load_bundle(str(path))
    report = run_pipeline(bundle, make_plan(passes=["precompute-cos-sin", "cleanup"], options={"max_positions": 16}))
    assert report.passes[0].status == "rewritten 2"
    assert report.passes[0].metadata_changes == [f"metadata_props[{MAX_POSITIONS_KEY!r}] = '16'"]
    assert bundle.model.metadata_props[MAX_POSITIONS_KEY] == "16"


def test_cli_sizes_the_table_from_genai_config(tmp_path):
    """``rope-passes optimize --passes precompute-cos-sin``: a genai folder's context_length sizes the table; a bare
    .onnx has no size (the CLI has no max_positions flag) and the pass refuses with the reason."""
    import subprocess
    import sys

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(serialize(_chain_graph()))
    (folder / "genai_config.json").write_text(json.dumps(
        {"model": {"context_length": 24, "decoder": {"filename": "model.onnx"}}}))

    def optimize(src, out):
        proc = subprocess.run([sys.executable, "-m", "rope_passes", "optimize", str(src), "-o", str(out),
                               "--passes", "precompute-cos-sin", "--json"],
                              check=False, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)["passes"][0]

    report = optimize(folder, tmp_path / "out")
    assert report["status"] == "rewritten 2" and report["nodes_removed"] == 12  # chain, its Constants
    saved = onnx.load(tmp_path / "out" / "model.onnx")
    assert {p.key: p.value for p in saved.metadata_props}[MAX_POSITIONS_KEY] == "24"
    assert sorted(i.name for i in saved.graph.initializer) == ["rope_passes.cos_table", "rope_passes.sin_table"]
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "m.onnx").write_bytes(serialize(_chain_graph()))  # no genai_config.json beside it
    bare = optimize(tmp_path / "bare" / "m.onnx", tmp_path / "bare_out.onnx")
    assert bare["status"] == "refused: table size unknown: give max_positions (or model.context_length in " \
                             "genai_config.json, or max_position_embeddings in the config.json beside the model)"


@pytest.mark.webgpu
def test_positions_outside_the_table_behave_as_documented():
    """The documented hazard, pinned: past the table CPU fails, WebGPU silently reads zeros, negatives wrap."""
    model = _chain_graph()
    PrecomputeCosSinPass(max_positions=16)(model)
    x = np.ones((1, 3, 2 * HALF), np.float32)
    feeds = {"x": x, "position_ids": np.array([[15, 16, -1]], np.int64)}  # last row, one past it, negative
    with pytest.raises(Exception, match="indices element out of data bounds"):
        create_session(serialize(model), "cpu").run(None, feeds)
    y = create_session(serialize(model), "webgpu").run(None, feeds)[0]
    assert np.all(y[0, 1] == 0)  # cos = sin = 0 at position 16
    np.testing.assert_allclose(y[0, 2], y[0, 0], rtol=0, atol=1e-6)  # -1 reads row 15


@pytest.mark.corpus
def test_builder_manual_mrope_rewritten_and_fold_text_mrope_still_folds(tmp_path):
    """A builder 0.15.2 graph computing mRoPE cos/sin from inv_freq per call (legacy/qwen25_vl): the tables size
    from genai_config's context_length, the output stays bit-identical with three different position axes, and
    fold-text-mrope still folds the result (the pass composes with the presets' passes)."""
    from conftest import GENAI

    from rope_passes.io import load_bundle, save_bundle
    from rope_passes.passes import FoldTextMRoPEPass

    src = GENAI / "legacy" / "qwen25_vl" / "cpu_fp32"
    original = save_bundle(load_bundle(str(src)), str(tmp_path / "orig"))
    bundle = load_bundle(str(src))
    context = bundle.genai_config.data["model"]["context_length"]
    result = PrecomputeCosSinPass(PassContext(bundle.genai_config))(bundle.model)
    assert result.report.status == "rewritten 4"  # cos and sin of each layer's own mrope_dynamic_cache
    assert bundle.model.metadata_props[MAX_POSITIONS_KEY] == str(context)
    rewritten = save_bundle(bundle, str(tmp_path / "new"))
    sessions = [create_session(str(p), "cpu") for p in (original, rewritten)]  # save_bundle gives the .onnx path
    rng = np.random.RandomState(0)
    batch, seq, past = 1, 5, 7
    head = bundle.genai_config.data["model"]["decoder"]["head_size"]
    feeds = {}
    for i in sessions[0].get_inputs():
        if i.name == "inputs_embeds":
            feeds[i.name] = rng.randn(batch, seq, i.shape[2]).astype(np.float32)
        elif i.name == "attention_mask":
            feeds[i.name] = np.ones((batch, past + seq), np.int64)
        elif i.name == "position_ids":
            pos = np.arange(past, past + seq)[None]
            feeds[i.name] = np.stack([pos, pos + 3, 2 * pos]).astype(np.int64)  # vision-style: axes differ
        else:
            feeds[i.name] = rng.randn(batch, i.shape[1], past, head).astype(np.float32)
    ref, new = (s.run(None, feeds) for s in sessions)
    for r, n in zip(ref, new, strict=True):
        np.testing.assert_array_equal(n, r)
    fold = FoldTextMRoPEPass(PassContext(bundle.genai_config), text_only=True)(bundle.model)
    assert fold.report.status == "rewritten 2"


# ----------------------------------------------------------------------------------------------------------------
# A Range position source: its start and limit proved past + c and past + c + length, every call admitted
# ----------------------------------------------------------------------------------------------------------------
def _range_product(body: str) -> ir.Node:
    """``Range(start, limit, 1) → Cast → Mul(0.5)`` after ``body`` (which defines ``start`` and ``limit`` from
    ``past`` = Shape(past_key)[2] and ``S`` = Shape(input_ids)[1]); the Mul node."""
    text = f"""<ir_version: 10, opset_import: ["" : 20]>
    g (int64[B, S] input_ids, float[B, 2, P, 4] past_key, int64[B, T] attention_mask) => (float[L] y) {{
        i1 = Constant <value = int64 {{1}}> ()
        i2 = Constant <value = int64 {{2}}> ()
        pks = Shape (past_key)
        past = Gather <axis = 0> (pks, i2)
        ids = Shape (input_ids)
        S = Gather <axis = 0> (ids, i1)
        {body}
        r = Range (start, limit, i1)
        rf = Cast <to = 1> (r)
        h = Constant <value = float {{0.5}}> ()
        y = Mul (rf, h)
    }}"""
    model = ir.serde.deserialize_model(onnx.parser.parse_model(text))
    for node in model.graph:
        node.name = node.name or f"{node.op_type.lower()}_{node.outputs[0].name}"
    return next(n for n in model.graph if n.outputs[0].name == "y")


def test_a_range_whose_length_is_not_the_call_is_refused():
    """``Range(past, past + Shape(attention_mask)[1])``: the mask's width is past + S, so positions reach 2·past + S - 1
    for a call with past + S <= max_positions (the old proof took the limit with every dimension 0: 0 beyond)."""
    from rope_passes.proofs.positions import range_source
    from rope_passes.report import MatchFailure

    product = _range_product("""
        ms = Shape (attention_mask)
        T = Gather <axis = 0> (ms, i1)
        start = Identity (past)
        limit = Add (past, T)
    """)
    with pytest.raises(MatchFailure) as refused:
        range_source(product)
    assert refused.value.refused and refused.value.place == "range_r"
    assert "Shape(past_key)[2] .. Shape(attention_mask)[1] + Shape(past_key)[2] - 1" in refused.value.reason


def test_a_range_computed_through_a_wrapping_int32_is_refused_where_it_wraps():
    """``limit = past + (int32(S) + K - K)`` with ``K = 2^31 - 48``: the form is past + S, but ``int32(S) + K`` leaves
    int32 once S > 47, so the proof holds for max_positions 40 and is refused (naming the Range) for 256."""
    from rope_passes.proofs.positions import range_source

    product = _range_product("""
        k = Constant <value = int32 {2147483599}> ()
        s32 = Cast <to = 6> (S)
        up = Add (s32, k)
        back = Sub (up, k)
        s64 = Cast <to = 7> (back)
        start = Identity (past)
        limit = Add (past, s64)
    """)
    source = range_source(product)
    assert source is not None and source.excess == 0
    assert (source.past, source.length) == ("Shape(past_key)[2]", "Shape(input_ids)[1]")
    assert source.overflow(40) is None
    wraps = source.overflow(256)
    assert wraps is not None and wraps.refused and wraps.place == "range_r"
    assert "Add 'add_up'" in wraps.reason and "outside int32" in wraps.reason
