"""The RoPE census (``rope-passes inspect``) on the 19 genai corpus graphs and on small graphs built here.

Per model it asserts the facts of the corpus README table (written out below, not derived from the census), and
cross-checks the census against each folder's ``analysis.json`` (written by the corpus generator with onnx, not by
this project). Loading a graph is milliseconds; no onnxruntime session is created.
"""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import onnx_ir as ir
import pytest
from conftest import GENAI, TORCH, genai_models
from rich.console import Console

from rope_passes.analysis.census import SMALL_TENSOR, census
from rope_passes.cli import main
from rope_passes.cli.inspect_cmd import render
from rope_passes.config import GenaiConfig
from rope_passes.io import load_bundle

MODELS = genai_models()

F32, F16 = "FLOAT", "FLOAT16"

# The README table, per model. caches: {(rows, columns)} of the cos tables; positions: None (no input),
# "[3,B,S]" (3D input) or "[B,S] tiled" (2D input expanded to 3 identical axes in-graph).
_LLAMA = dict(flavours=["fused-gqa"], do_rotary=1, packed=True, gqa_inputs=12, caches={(256, 16)}, positions=None,
              rotary=None, manual=None, longrope=None)
_QWEN3 = dict(_LLAMA, packed=False)
_PHI3_IF = dict(_LLAMA, flavours=["fused-gqa", "longrope-if"], caches={(32, 16), (256, 16)},
                longrope=("if", 32, 256, 32, None))
_QWEN25_VL = dict(flavours=["mrotary-embedding"], do_rotary=0, packed=False, gqa_inputs=12, caches={(256, 16)},
                  positions="[3,B,S]", rotary=("MRotaryEmbedding", 4, [4, 6, 6], 0), manual=None, longrope=None)
_QWEN35 = dict(_QWEN25_VL, caches={(256, 8)}, rotary=("MRotaryEmbedding", 4, [4, 2, 2], 1))
_LEGACY_QWEN25_VL = dict(flavours=["rotary-embedding", "manual-mrope", "inv-freq-matmul"], do_rotary=0,
                         packed=False, gqa_inputs=12, caches=set(), positions="[3,B,S]",
                         rotary=("RotaryEmbedding", 4, None, None), manual=("chunked", [4, 6, 6], 0), longrope=None)
_LEGACY_QWEN35 = dict(_LEGACY_QWEN25_VL, flavours=["rotary-embedding", "manual-mrope"], caches={(256, 8)},
                      manual=("masked", [4, 2, 2], 1))

EXPECTED: dict[str, dict] = {
    "current/llama/cpu_fp32": dict(_LLAMA, dtype=F32, total_seq_from_shape=True),
    "current/llama/webgpu_fp16": dict(_LLAMA, dtype=F16, total_seq_from_shape=True),
    "current/llama/webgpu_fp16_graph": dict(_LLAMA, dtype=F16, total_seq_from_shape=False),
    "current/qwen3/cpu_fp32": dict(_QWEN3, dtype=F32, total_seq_from_shape=True),
    "current/qwen3/webgpu_fp16": dict(_QWEN3, dtype=F16, total_seq_from_shape=True, gqa_inputs=16),
    "current/qwen3/webgpu_fp16_noqknormfuse": dict(_QWEN3, dtype=F16, total_seq_from_shape=True),
    "current/phi3_mini_128k/cpu_fp32": dict(_PHI3_IF, dtype=F32, total_seq_from_shape=True),
    "current/phi3_mini_128k/webgpu_fp32": dict(_PHI3_IF, dtype=F32, total_seq_from_shape=True),
    "current/phi3_mini_128k/webgpu_fp16_graph": dict(
        _LLAMA, flavours=["fused-gqa", "longrope-concat"], caches={(288, 16)}, dtype=F16,
        total_seq_from_shape=False, longrope=("concat", 32, 256, 32, 32)),
    "current/qwen25_vl/cpu_fp32": dict(_QWEN25_VL, dtype=F32, total_seq_from_shape=True),
    "current/qwen25_vl/webgpu_fp16": dict(_QWEN25_VL, dtype=F32, total_seq_from_shape=True),
    "current/qwen25_vl/webgpu_int4_graph": dict(_QWEN25_VL, dtype=F32, total_seq_from_shape=False),
    "current/qwen35/webgpu_fp32": dict(_QWEN35, dtype=F32, total_seq_from_shape=True),
    "current/qwen35/webgpu_fp16_graph": dict(_QWEN35, dtype=F32, total_seq_from_shape=False),
    "legacy/qwen25_vl/cpu_fp32": dict(_LEGACY_QWEN25_VL, dtype=None, total_seq_from_shape=True),
    "legacy/qwen25_vl/webgpu_fp16_graph": dict(_LEGACY_QWEN25_VL, dtype=None, total_seq_from_shape=False),
    "legacy/qwen35/cpu_fp32": dict(_LEGACY_QWEN35, dtype=F32, total_seq_from_shape=True),
    "legacy/qwen35/cpu_fp32_text": dict(_LEGACY_QWEN35, dtype=F32, total_seq_from_shape=True,
                                        positions="[B,S] tiled"),
    "legacy/qwen35/webgpu_fp16_graph_text": dict(_LEGACY_QWEN35, dtype=F32, total_seq_from_shape=False,
                                                 positions="[B,S] tiled"),
}


@pytest.mark.corpus
def test_expectations_cover_the_corpus(genai_corpus):
    assert sorted(EXPECTED) == MODELS and len(MODELS) == 19


@pytest.fixture(scope="module")
def censuses() -> dict:
    out = {}
    for name in MODELS:
        bundle = load_bundle(GENAI / name)
        out[name] = census(bundle.model, bundle.genai_config, source=name)
    return out


@pytest.mark.corpus
@pytest.mark.parametrize("name", MODELS)
def test_readme_facts(name, censuses):
    c, want = censuses[name], EXPECTED[name]
    assert c.flavours == want["flavours"]
    assert json.loads(json.dumps(c.to_dict()))["flavours"] == want["flavours"]

    # attention: one GQA group over both layers
    assert c.attention_op == "GroupQueryAttention"
    (gqa,) = c.attention
    assert (gqa.count, gqa.num_heads, gqa.head_size) == (2, 4, 32)
    assert gqa.kv_num_heads == (4 if "phi3" in name else 2)
    assert gqa.do_rotary == want["do_rotary"] and gqa.rotary_interleaved == 0
    assert gqa.packed_qkv is want["packed"]
    assert gqa.num_inputs == want["gqa_inputs"]
    assert gqa.total_sequence_length_from_shape is want["total_seq_from_shape"]
    if want["total_seq_from_shape"]:
        assert gqa.total_sequence_length == "Shape(attention_mask)"
        assert [n.inputs for n in c.dynamic_nodes["Shape"] if n.inputs == ["attention_mask"]] == [["attention_mask"]]
    else:
        assert not any(n.inputs == ["attention_mask"] for n in c.dynamic_nodes["Shape"])

    # cos/sin caches: one cos and one sin table per shape, all of the expected dtype
    cos = {(k.rows, k.columns) for k in c.caches if k.role == "cos"}
    sin = {(k.rows, k.columns) for k in c.caches if k.role == "sin"}
    assert cos == sin == want["caches"]
    assert len(c.caches) == 2 * len(want["caches"])
    if want["dtype"]:
        assert {k.dtype for k in c.caches} == {want["dtype"]}
    assert c.context_length == 256
    for k in c.caches:
        expected_vs = {"short": "< context_length", "concat (short+long)": "= context_length + offset 32"}.get(
            k.variant, "= context_length")
        assert k.rows_vs_context == expected_vs, k

    # rotary ops
    if want["rotary"] is None:
        assert c.rotary == []
    else:
        op, count, sections, layout = want["rotary"]
        (r,) = c.rotary
        assert (r.op_type, r.count, r.mrope_section, r.mrope_layout) == (op, count, sections, layout)
        assert r.num_heads == [2, 4] and r.interleaved == 0

    # manual mRoPE: sections read from the graph's constants
    if want["manual"] is None:
        assert c.manual_mrope == []
    else:
        (m,) = c.manual_mrope
        assert (m.variant, m.sections, m.layout) == want["manual"]
        assert len(m.feeds) == 4
    if "inv-freq-matmul" in want["flavours"]:
        (f,) = c.inv_freq
        assert (f.inv_freq, f.inv_freq_shape, f.cos_nodes, f.sin_nodes) == ("model.inv_freq", [16], 2, 2)
        assert f.positions_from == ["position_ids"]
    else:
        assert c.inv_freq == []

    # LongRoPE
    if want["longrope"] is None:
        assert c.longrope is None
    else:
        kind, short, long_, original, offset = want["longrope"]
        lr = c.longrope
        assert (lr.kind, lr.short_rows, lr.long_rows, lr.original_max_position, lr.concat_offset) == (
            kind, short, long_, original, offset)
        if kind == "if":
            assert lr.switch == "If(Greater(total_sequence_length, 32))"
            assert [n.name for n in c.dynamic_nodes["If"]] == [lr.switch_node]
            assert {k.variant for k in c.caches} == {"short", "long"}
        else:
            assert {k.variant for k in c.caches} == {"concat (short+long)"}

    # positions
    if want["positions"] is None:
        assert c.positions == []
    else:
        (p,) = c.positions
        assert p.name == "position_ids"
        if want["positions"] == "[3,B,S]":
            assert (p.layout, p.rank, p.tiled_to_3d) == ("[3,B,S]", 3, False)
        else:
            assert (p.layout, p.rank, p.tiled_to_3d) == ("[B,S]", 2, True)
            assert p.tile_node == "/model/position_ids_expand/Tile"


@pytest.mark.corpus
@pytest.mark.parametrize("name", MODELS)
def test_agrees_with_analysis_json(name, censuses):
    """Everything analysis.json (the corpus generator's own onnx-based summary) also states."""
    c = censuses[name]
    a = json.loads((GENAI / name / "analysis.json").read_text())
    assert c.ir_version == a["ir_version"] and c.opsets == a["opsets"] and c.node_count == a["n_nodes"]
    assert [(i.name, i.shape, i.dtype) for i in c.inputs] == [(i["name"], i["shape"], i["dtype"]) for i in a["inputs"]]
    attn = a["attention"]
    assert sum(g.count for g in c.attention) == len(attn)
    for g in c.attention:
        for node in attn:
            for key in ("num_heads", "kv_num_heads", "do_rotary", "rotary_interleaved"):
                assert getattr(g, key) == node["attrs"][key]
            assert g.packed_qkv == (node["inputs"][1] == "" and node["inputs"][2] == "")
            assert g.num_inputs == len(node["inputs"])
    # 2D float tables the generator lists are exactly the census caches (If branch tables by their value name)
    tables = {(t["name"].split("/")[-1], tuple(t["dims"]), t["dtype"]) for t in a["caches"]
              if len(t["dims"]) == 2 and t["dtype"].startswith("FLOAT")}
    assert {(k.name, tuple(k.shape), k.dtype) for k in c.caches} == tables
    # 1D float constants are the inv_freq vectors; BOOL ones the h/w masks of a masked manual mRoPE
    assert {(f.inv_freq, tuple(f.inv_freq_shape)) for f in c.inv_freq} == {
        (t["name"], tuple(t["dims"])) for t in a["caches"] if len(t["dims"]) == 1 and t["dtype"] == "FLOAT"}
    masks = {t["name"] for t in a["caches"] if t["dtype"] == "BOOL"}
    assert {n for m in c.manual_mrope if m.variant == "masked" for n in m.section_constants} == masks
    # Shape and If nodes
    assert [(n.name, n.inputs[0]) for n in c.dynamic_nodes["Shape"]] == [
        (s["name"], s["input"]) for s in a["shape_nodes"]]
    assert [n.name for n in c.dynamic_nodes["If"]] == [i["name"] for i in a["if_nodes"]]
    assert len(c.dynamic_nodes["Range"]) == a["op_hist"].get("Range", 0)
    # rotary nodes
    rot = a["rotary"]
    assert sum(r.count for r in c.rotary) == (len(rot) if rot else sum(
        v for k, v in a["op_hist"].items() if k.endswith("RotaryEmbedding")))
    for r in c.rotary:
        for node in rot:
            for key, value in node["attrs"].items():
                if key != "num_heads":
                    assert getattr(r, key, r.attributes.get(key)) == value


@pytest.mark.corpus
def test_feeds_name_the_rope_inputs(censuses):
    phi3 = censuses["current/phi3_mini_128k/cpu_fp32"]
    (shape,) = phi3.dynamic_nodes["Shape"]
    # Shape(attention_mask) decides both total_sequence_length and (through If) which cache GQA reads
    assert shape.feeds == ["GroupQueryAttention.cos_cache", "GroupQueryAttention.sin_cache",
                           "GroupQueryAttention.total_sequence_length"]
    legacy = censuses["legacy/qwen25_vl/cpu_fp32"]
    ranges = legacy.dynamic_nodes["Range"]
    assert len(ranges) == 4 and all(n.feeds == ["RotaryEmbedding.position_ids"] for n in ranges)
    (r,) = legacy.rotary
    assert r.position_source.startswith("Range: synthetic positions")


@pytest.mark.corpus
def test_reads_no_weights(monkeypatch):
    """Cache shapes come from metadata: only small constants (section sizes, masks) are ever read."""
    read: list[tuple[str, int]] = []
    original = ir.ExternalTensor.numpy

    def spy(self):
        read.append((self.name, self.size))
        return original(self)

    monkeypatch.setattr(ir.ExternalTensor, "numpy", spy)
    monkeypatch.setattr(ir.ExternalTensor, "tobytes", lambda self: pytest.fail(f"read bytes of {self.name}"))
    for name in ("legacy/qwen35/cpu_fp32", "current/phi3_mini_128k/cpu_fp32", "legacy/qwen25_vl/cpu_fp32"):
        bundle = load_bundle(GENAI / name)
        census(bundle.model, bundle.genai_config)
    assert read and all(size <= SMALL_TENSOR for _, size in read)
    assert {n for n, _ in read} <= {"model.rotary_emb.h_mask", "model.rotary_emb.w_mask"}


# ------------------------------------------------------------------------------------------------------------
# Torch exporter graphs (../shared/corpus/torch): the on-the-fly flavours
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.corpus
@pytest.mark.parametrize("name, flavours, inv_shape, sections, threshold", [
    ("tf4/torchscript/llama/decode.onnx", ["inv-freq-matmul"], [1, 8, 1], None, None),
    ("tf4/torchscript/qwen2_5_vl_text/decode.onnx", ["manual-mrope", "inv-freq-matmul"], [1, 1, 8, 1], [2, 3, 3],
     None),
    ("tf5/dynamo/qwen2_5_vl_text/prefill.onnx", ["manual-mrope", "inv-freq-matmul"], [8], [2, 3, 3], None),
    ("tf5/dynamo/phi4mini_longrope_partial/decode.onnx", ["inv-freq-matmul", "longrope-where"], [6], None, 64),
])
def test_torch_exports(name, flavours, inv_shape, sections, threshold):
    path = TORCH / name
    assert path.is_file(), f"the shared torch corpus is missing {path}"
    c = census(load_bundle(path).model)
    assert c.flavours == flavours and c.attention_op == "none"
    (f,) = c.inv_freq
    assert (f.inv_freq_shape, f.cos_nodes, f.sin_nodes, f.positions_from) == (inv_shape, 1, 1, ["position_ids"])
    if sections is None:
        assert c.manual_mrope == []
    else:
        (m,) = c.manual_mrope
        assert (m.variant, m.sections, m.layout) == ("chunked", sections, 0)
        assert m.table_source.startswith("inv_freq Mul (" if "tf5" in name else "inv_freq MatMul (")
        assert [p.layout for p in c.positions] == ["[3,B,S]"]
    if threshold is None:
        assert c.longrope is None
    else:
        assert (c.longrope.kind, c.longrope.original_max_position) == ("where", threshold)
        assert c.longrope.switch == f"Where(Greater(position_ids → ReduceMax → Add, {threshold}))"


# ------------------------------------------------------------------------------------------------------------
# Small graphs built here: flavours the corpus lacks
# ------------------------------------------------------------------------------------------------------------


def _torch_style_mha(folded: bool) -> ir.Model:
    """position_ids [B,S] → Cast → MatMul(inv_freq) → Cos/Sin → scaled into packed QKV → MultiHeadAttention.

    ``folded``: inv_freq is the [1,4,1] constant torch exporters fold ``inv_freq[None, :, None]`` into; else a
    1D [4] initializer reshaped in-graph.
    """
    b, s = ir.SymbolicDim("batch"), ir.SymbolicDim("seq")
    pos = ir.Value(name="position_ids", shape=ir.Shape([b, s]), type=ir.TensorType(ir.DataType.INT64))
    qkv = ir.Value(name="qkv", shape=ir.Shape([b, s, 3 * 2 * 8]), type=ir.TensorType(ir.DataType.FLOAT))

    def const(name, array):
        return ir.Value(name=name, const_value=ir.tensor(array, name=name))

    inv_freq = const("inv_freq", np.linspace(1, 0.01, 4, dtype=np.float32).reshape((1, 4, 1) if folded else (4,)))
    unused = const("unrelated_vector", np.ones(4, dtype=np.float32))  # on no Cos path: must not be reported
    axes = const("axes", np.array([1], dtype=np.int64))
    inv_shape = const("inv_shape", np.array([1, 4, 1], dtype=np.int64))
    unsqueeze = ir.node("Unsqueeze", [pos, axes])  # [B,1,S]
    cast = ir.node("Cast", [unsqueeze.outputs[0]], attributes={"to": ir.DataType.FLOAT})
    reshape = [] if folded else [ir.node("Reshape", [inv_freq, inv_shape])]  # [1,4,1]
    matmul = ir.node("MatMul", [reshape[0].outputs[0] if reshape else inv_freq, cast.outputs[0]])  # [B,4,S]
    cos = ir.node("Cos", [matmul.outputs[0]])
    sin = ir.node("Sin", [matmul.outputs[0]])
    # (not a real rotation: the census only needs the data flow, and the hidden width through the Mul/Add)
    mul = ir.node("Mul", [qkv, cos.outputs[0]])
    add = ir.node("Add", [mul.outputs[0], sin.outputs[0]])
    mha = ir.node("MultiHeadAttention", [add.outputs[0]], attributes={"num_heads": 2}, domain="com.microsoft")
    nodes = [unsqueeze, cast, *reshape, matmul, cos, sin, mul, add, mha]
    graph = ir.Graph([pos, qkv], mha.outputs, nodes=nodes,
                     initializers=[inv_freq, unused, axes, inv_shape], opset_imports={"": 21, "com.microsoft": 1})
    return ir.Model(graph, ir_version=10)


@pytest.mark.parametrize("folded", [False, True])
def test_torch_style_inv_freq_and_mha(folded):
    c = census(_torch_style_mha(folded))
    assert c.flavours == ["inv-freq-matmul"]
    (f,) = c.inv_freq
    shape = [1, 4, 1] if folded else [4]
    assert (f.inv_freq, f.inv_freq_shape, f.cos_nodes, f.sin_nodes) == ("inv_freq", shape, 1, 1)
    assert f.positions_from == ["position_ids"]
    (g,) = c.attention
    assert (g.op_type, g.count, g.packed_qkv, g.num_heads, g.head_size, g.head_size_source) == (
        "MultiHeadAttention", 1, True, 2, 8, "graph")
    assert c.caches == [] and c.longrope is None and c.context_length is None
    (p,) = c.positions
    assert (p.layout, p.tiled_to_3d) == ("[B,S]", False)


def test_no_attention_no_rope():
    x = ir.Value(name="x", shape=ir.Shape([2]), type=ir.TensorType(ir.DataType.FLOAT))
    relu = ir.node("Relu", [x], outputs=[ir.Value(name="y")])
    model = ir.Model(ir.Graph([x], relu.outputs, nodes=[relu], opset_imports={"": 21}), ir_version=10)
    c = census(model)
    assert (c.attention_op, c.attention, c.flavours, c.caches, c.positions) == ("none", [], [], [], [])
    assert c.dynamic_counts == {"Shape": 0, "If": 0, "Range": 0, "Loop": 0}
    json.dumps(c.to_dict())


@pytest.mark.corpus
def test_concat_offset_without_long_cache_is_a_note(censuses):
    bundle = load_bundle(GENAI / "current/llama/cpu_fp32")
    config = json.loads(json.dumps(bundle.genai_config.data))
    config["model"]["decoder"]["session_options"]["provider_options"] = [
        {"webgpu": {"multiRotaryCacheConcatOffset": "32"}}]
    c = census(bundle.model, GenaiConfig(config))
    assert c.longrope is None and "longrope-concat" not in c.flavours
    assert any("multiRotaryCacheConcatOffset=32" in n for n in c.notes)


# ------------------------------------------------------------------------------------------------------------
# The CLI
# ------------------------------------------------------------------------------------------------------------


def _run_cli(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["inspect", *args])
    return rc, out.getvalue()


@pytest.mark.corpus
def test_cli_json_one_model(genai_corpus):
    rc, out = _run_cli(str(genai_corpus / "current/qwen25_vl/cpu_fp32"), "--json")
    assert rc == 0
    d = json.loads(out)
    assert d["flavours"] == ["mrotary-embedding"]
    (r,) = d["rotary"]
    assert (r["op_type"], r["count"], r["mrope_section"], r["mrope_layout"]) == ("MRotaryEmbedding", 4, [4, 6, 6], 0)
    assert d["attention"][0]["do_rotary"] == 0
    assert d["positions"][0]["shape"] == [3, "batch_size", "sequence_length"]
    assert d["dynamic_counts"] == {"Shape": 1, "If": 0, "Range": 0, "Loop": 0}


@pytest.mark.corpus
def test_cli_json_several_models_and_a_file(genai_corpus):
    phi3 = genai_corpus / "current/phi3_mini_128k/webgpu_fp16_graph"
    rc, out = _run_cli(str(phi3), str(genai_corpus / "current/llama/cpu_fp32/model.onnx"), "--json")
    assert rc == 0
    first, second = json.loads(out)
    assert first["longrope"]["kind"] == "concat" and first["longrope"]["concat_offset"] == 32
    assert [c["shape"] for c in first["caches"]] == [[288, 16], [288, 16]]
    # a bare .onnx file still finds the genai_config.json beside it
    assert second["flavours"] == ["fused-gqa"] and second["context_length"] == 256


@pytest.mark.corpus
def test_cli_human_output(genai_corpus):
    console = Console(file=io.StringIO(), width=200)
    bundle = load_bundle(genai_corpus / "legacy/qwen25_vl/cpu_fp32")
    render(census(bundle.model, bundle.genai_config, source="legacy/qwen25_vl/cpu_fp32"), console)
    text = console.file.getvalue()
    assert "rotary-embedding, manual-mrope, inv-freq-matmul" in text
    assert "chunked, sections [4, 6, 6], layout 0 (sectioned)" in text
    assert "position_ids [3,batch_size,sequence_length] [3,B,S]" in text  # markup-like text printed, not eaten
    rc, out = _run_cli(str(genai_corpus / "current/phi3_mini_128k/cpu_fp32"))
    assert rc == 0
    assert "fused-gqa, longrope-if" in out and "If(Greater(total_sequence_length, 32))" in out
    assert "cos_cache_small [32,16] FLOAT" in out


def test_cli_missing_model_is_one_line(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "nope.onnx")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file or directory" in err
