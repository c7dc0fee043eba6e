"""RP402/RP404 on LongRoPE GroupQueryAttention caches (issue 21): the short and long tables are compared with the
ones config.json defines, in both of the forms builders write (the builder's ``If(Greater(total, original))``
choosing a short or a long cache, and one ``[short; long]`` concatenation read at genai_config's
multiRotaryCacheConcatOffset, or, as mobius writes it, split at original_max_position_embeddings without one).

The synthetic graphs here carry tables computed by an independent NumPy reference of transformers'
``_compute_longrope_parameters`` (inv_freq = 1 / (factor × base^(2i/d)); attention factor sqrt(1 + ln(s) /
ln(original)), s = max_position_embeddings / original), not by :mod:`rope_passes.hf_config`. The corpus tests inject
the defects into the builder's Phi-3 graphs in memory.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

from rope_passes.io import load_bundle
from rope_passes.lint import lint_bundle

HEAD, ORIG, MAX_POS, THETA = 16, 32, 128, 10000.0
SHORT = [1.0 + 0.05 * i for i in range(HEAD // 2)]
LONG = [1.0 + 0.9 * i for i in range(HEAD // 2)]
CODES = ("RP401", "RP402", "RP403", "RP404")


def reference(rows: int, factors: list[float], scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """transformers' LongRoPE cos/sin for positions 0..rows-1, one column per frequency (GQA's cache layout)."""
    if scale is None:
        scale = math.sqrt(1 + math.log(MAX_POS / ORIG) / math.log(ORIG))
    inv = 1.0 / (np.asarray(factors, np.float64) * THETA ** (np.arange(0, HEAD, 2) / HEAD))
    angles = np.arange(rows)[:, None] * inv.astype(np.float32).astype(np.float64)
    return (np.cos(angles) * scale).astype(np.float32), (np.sin(angles) * scale).astype(np.float32)


def hf_config() -> dict:
    return {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "hidden_size": 4 * HEAD,
            "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2,
            "max_position_embeddings": MAX_POS, "original_max_position_embeddings": ORIG,
            "rope_theta": THETA, "rope_scaling": {"type": "longrope", "short_factor": SHORT, "long_factor": LONG}}


def _const(name: str, array: np.ndarray) -> ir.Value:
    return ir.Value(name=name, const_value=ir.tensor(array, name=name), shape=ir.Shape(array.shape),
                    type=ir.TensorType(ir.DataType.FLOAT if array.dtype == np.float32 else ir.DataType.FLOAT16))


def build(tmp_path: Path, form: str, tables: list[tuple[np.ndarray, ...]], offset: bool = True) -> Path:
    """Two GroupQueryAttention layers; ``tables[layer]``: (cos, sin) of the concatenation, or (cos_short,
    sin_short, cos_long, sin_long) for the If form (one If per layer)."""
    f32 = ir.TensorType(ir.DataType.FLOAT)
    q = ir.Value(name="q", shape=ir.Shape([1, "S", 4 * HEAD]), type=f32)
    seqlens = ir.Value(name="seqlens_k", shape=ir.Shape([1]), type=ir.TensorType(ir.DataType.INT32))
    total = ir.Value(name="total_sequence_length", shape=ir.Shape([]), type=ir.TensorType(ir.DataType.INT32))
    inputs, nodes, outputs, inits = [q, seqlens, total], [], [], []
    for layer, t in enumerate(tables):
        past = [ir.Value(name=f"past_key_values.{layer}.{kv}", shape=ir.Shape([1, 4, "P", HEAD]), type=f32)
                for kv in ("key", "value")]
        inputs += past
        if form == "concat":
            cos, sin = _const(f"cos_cache_L{layer}", t[0]), _const(f"sin_cache_L{layer}", t[1])
            inits += [cos, sin]
        else:
            threshold = _const(f"orig_L{layer}", np.array(ORIG, np.int32))
            inits.append(threshold)
            greater = ir.Node("", "Greater", [total, threshold], name=f"/model/layers.{layer}/Greater")
            branches = {}
            for branch, (c, s) in (("then_branch", (t[2], t[3])), ("else_branch", (t[0], t[1]))):
                outs = []
                body = []
                for role, array in (("cos", c), ("sin", s)):
                    node = ir.Node("", "Constant", [], attributes=[ir.AttrTensor("value", ir.tensor(array))],
                                   name=f"{branch}_{role}_L{layer}")
                    node.outputs[0].name = f"{role}_cache_{'large' if branch == 'then_branch' else 'small'}_L{layer}"
                    node.outputs[0].shape, node.outputs[0].type = ir.Shape(array.shape), f32
                    body.append(node)
                    outs.append(node.outputs[0])
                branches[branch] = ir.Graph([], outs, nodes=body, name=f"{branch}_L{layer}")
            switch = ir.Node("", "If", [greater.outputs[0]], num_outputs=2, name=f"/model/layers.{layer}/If",
                             attributes=[ir.AttrGraph(k, v) for k, v in branches.items()])
            nodes += [greater, switch]
            cos, sin = switch.outputs
            cos.name, sin.name = f"cos_cache_L{layer}", f"sin_cache_L{layer}"
        gqa = ir.Node("com.microsoft", "GroupQueryAttention", [q, None, None, *past, seqlens, total, cos, sin],
                      attributes=[ir.AttrInt64("num_heads", 4), ir.AttrInt64("kv_num_heads", 4),
                                  ir.AttrInt64("do_rotary", 1)],
                      num_outputs=3, name=f"/model/layers.{layer}/attn/GroupQueryAttention")
        for out, name in zip(gqa.outputs, ("attn", "key", "value")):
            out.name = f"/model/layers.{layer}/attn/{name}" if name == "attn" else f"present.{layer}.{name}"
        nodes.append(gqa)
        outputs += list(gqa.outputs)
    graph = ir.Graph(inputs, outputs, nodes=nodes, initializers=inits, opset_imports={"": 17, "com.microsoft": 1})
    model = ir.Model(graph, ir_version=10)
    folder = tmp_path / form
    folder.mkdir()
    ir.save(model, folder / "model.onnx")
    (folder / "config.json").write_text(json.dumps(hf_config()))
    webgpu = {"multiRotaryCacheConcatOffset": str(ORIG)} if form == "concat" and offset else {}
    (folder / "genai_config.json").write_text(json.dumps({"model": {
        "type": "phi3", "context_length": MAX_POS, "decoder": {
            "filename": "model.onnx", "num_hidden_layers": 2, "head_size": HEAD,
            "session_options": {"provider_options": [{"webgpu": webgpu}]}}}}))
    return folder


def correct(form: str) -> tuple[np.ndarray, ...]:
    short, long = reference(ORIG, SHORT), reference(MAX_POS, LONG)
    if form == "concat":
        return tuple(np.concatenate([s, lg]) for s, lg in zip(short, long))
    return (*short, *long)


def findings(folder: Path) -> list:
    return [d for d in lint_bundle(load_bundle(str(folder))) if d.code in CODES]


@pytest.mark.parametrize("form", ["concat", "if"])
def test_correct_longrope_tables_are_clean(tmp_path, form):
    assert findings(build(tmp_path, form, [correct(form), correct(form)])) == []


def test_mobius_concatenation_without_offset_is_split_at_original(tmp_path):
    """mobius writes no multiRotaryCacheConcatOffset (and context_length 4096): original + max_position rows."""
    good = correct("concat")
    assert findings(build(tmp_path, "concat", [good, good], offset=False)) == []
    bad = (good[0].copy(), good[1])
    bad[0][ORIG + 7] = bad[0][ORIG + 6]
    (tmp_path / "concat").rename(tmp_path / "good")
    found = findings(build(tmp_path, "concat", [good, bad], offset=False))
    rp404 = [d for d in found if d.code == "RP404"]
    assert len(rp404) == 1 and "layer 1" in rp404[0].message and "long position 7 (row 39)" in rp404[0].message


def _frozen(form: str) -> tuple[np.ndarray, ...]:
    """The long table holds the short factors (a LongRoPE frozen at export)."""
    short_long = reference(MAX_POS, SHORT)
    if form == "concat":
        short = reference(ORIG, SHORT)
        return tuple(np.concatenate([s, lg]) for s, lg in zip(short, short_long))
    return (*reference(ORIG, SHORT), *short_long)


@pytest.mark.parametrize("form", ["concat", "if"])
def test_long_table_with_short_factors_names_layer_and_position(tmp_path, form):
    found = findings(build(tmp_path, form, [correct(form), _frozen(form)]))
    rp404 = [d for d in found if d.code == "RP404"]
    assert len(rp404) == 1, found
    where = "long position 1 (row 33)" if form == "concat" else "long position 1 on"
    assert "layer 1" in rp404[0].message and where in rp404[0].message
    assert "short factors" in rp404[0].message and rp404[0].target.endswith("layers.1/attn/GroupQueryAttention")
    assert [d.code for d in found if d.code == "RP402"] == ["RP402"]


@pytest.mark.parametrize("form", ["concat", "if"])
def test_attention_scaling_one_found_from_position_zero(tmp_path, form):
    bad = list(correct(form))
    if form == "concat":
        bad = [np.concatenate([s, lg]) for s, lg in zip(reference(ORIG, SHORT, 1.0), reference(MAX_POS, LONG, 1.0))]
    else:
        bad = [*reference(ORIG, SHORT, 1.0), *reference(MAX_POS, LONG, 1.0)]
    found = findings(build(tmp_path, form, [tuple(bad), correct(form)]))
    rp404 = [d for d in found if d.code == "RP404"]
    assert len(rp404) == 1 and "layer 0" in rp404[0].message and "short position 0 on" in rp404[0].message
    assert "attention scaling differs" in rp404[0].message and "by 1," in rp404[0].message


@pytest.mark.parametrize("form", ["concat", "if"])
def test_one_long_row_changed(tmp_path, form):
    bad = [t.copy() for t in correct(form)]
    if form == "concat":
        bad[1][ORIG + 100] = bad[1][ORIG + 99]  # sin, long position 100
    else:
        bad[3][100] = bad[3][99]
    found = findings(build(tmp_path, form, [correct(form), tuple(bad)]))
    rp404 = [d for d in found if d.code == "RP404"]
    assert len(rp404) == 1 and "layer 1" in rp404[0].message
    assert ("long position 100 (row 132)" if form == "concat" else "long position 100 on") in rp404[0].message


def test_short_rows_past_original_are_not_read(tmp_path):
    """The If form's short table may be longer than original: transformers never reads it past original - 1."""
    short = reference(MAX_POS, SHORT)
    short[0][ORIG + 3] = 0.0
    tables = (*short, *reference(MAX_POS, LONG))
    assert findings(build(tmp_path, "if", [tables, tables])) == []


# -- the builder's Phi-3 graphs (corpus: If form; fixtures: the concatenation, fp32 and fp16) ----------------------
PHI3 = [("genai/current/phi3_mini_128k/cpu_fp32", "hf/phi3_mini_128k/config.json"),
        ("genai/current/phi3_mini_128k/webgpu_fp16_graph", "hf/phi3_mini_128k/config.json"),
        ("fixtures/genai/phi3_mini_128k/webgpu_fp32_graph_nofuseqkv", None),
        ("fixtures/genai/phi3_mini_128k/webgpu_fp16_graph_nofuseqkv", None),
        ("fixtures/genai/phi4_mini/webgpu_fp32_graph_nofuseqkv", None)]


def _phi3(where: str, config: str | None):
    from conftest import FIXTURES, GENAI

    folder = FIXTURES / where.removeprefix("fixtures/") if where.startswith("fixtures/") else \
        GENAI / where.removeprefix("genai/")
    hf = GENAI / config if config else folder / "hf_config.json"
    return load_bundle(str(folder)), hf


def _tables(bundle, layer: int) -> tuple[ir.Node, ir.Value]:
    from rope_passes.analysis.graph import MS_DOMAIN, nodes_of

    gqa = nodes_of(bundle.model, "GroupQueryAttention", MS_DOMAIN)[layer]
    return gqa, gqa.inputs[7]


def _private_copy(bundle, layer: int, change) -> None:
    """Give ``layer`` its own copy of its cos table(s), changed by ``change(array, part)`` (part: concat | short |
    long), the other layers keep the shared one."""
    from rope_passes.analysis.graph import attr, const_tensor

    gqa, cos = _tables(bundle, layer)
    switch = cos.producer()
    if switch is not None and switch.op_type == "If":
        copy = ir.Node("", "If", list(switch.inputs), num_outputs=len(switch.outputs), name=f"If_L{layer}",
                       attributes=[])
        for branch, part in (("then_branch", "long"), ("else_branch", "short")):
            body = attr(switch, branch)
            outs, nodes = [], []
            for k, out in enumerate(body.outputs):
                array = const_tensor(out).numpy().copy()
                if k == 0:
                    change(array, part)
                node = ir.Node("", "Constant", [], attributes=[ir.AttrTensor("value", ir.tensor(array))])
                node.outputs[0].shape, node.outputs[0].type = ir.Shape(array.shape), out.type
                node.outputs[0].name = f"{out.name}_L{layer}"
                nodes.append(node)
                outs.append(node.outputs[0])
            copy.attributes[branch] = ir.AttrGraph(branch, ir.Graph([], outs, nodes=nodes, name=f"{branch}_L{layer}"))
        bundle.model.graph.insert_after(switch, copy)
        for k, out in enumerate(copy.outputs):
            out.name = f"{switch.outputs[k].name}_L{layer}"
            out.shape, out.type = switch.outputs[k].shape, switch.outputs[k].type
        gqa.replace_input_with(7, copy.outputs[0])
        gqa.replace_input_with(8, copy.outputs[1])
        return
    array = const_tensor(cos).numpy().copy()
    change(array, "concat")
    value = ir.Value(name=f"cos_cache_L{layer}", const_value=ir.tensor(array, name=f"cos_cache_L{layer}"),
                     shape=cos.shape, type=cos.type)
    bundle.model.graph.register_initializer(value)
    gqa.replace_input_with(7, value)


def _lint(bundle, hf: Path) -> list:
    from rope_passes.plan import lint_plan

    return [d for d in lint_bundle(bundle, lint_plan(hf_config=str(hf))) if d.code in CODES]


@pytest.mark.corpus
@pytest.mark.parametrize("where,config", PHI3, ids=[p[0] for p in PHI3])
def test_builder_longrope_graphs_conform(where, config):
    bundle, hf = _phi3(where, config)
    assert _lint(bundle, hf) == []


@pytest.mark.corpus
@pytest.mark.parametrize("where,config", PHI3[:1] + PHI3[2:4], ids=[p[0] for p in PHI3[:1] + PHI3[2:4]])
def test_builder_longrope_defects_name_layer_and_position(where, config):
    from rope_passes.hf_config import HFConfig

    # one row of layer 1's long table changed: long position 100
    bundle, hf = _phi3(where, config)
    orig = HFConfig.load(hf).rope().original_max

    def one_row(array, part):
        if part in ("concat", "long"):
            row = (orig if part == "concat" else 0) + 100
            array[row] = array[row - 1]

    _private_copy(bundle, 1, one_row)
    rp404 = [d for d in _lint(bundle, hf) if d.code == "RP404"]
    assert len(rp404) == 1 and "layer 1" in rp404[0].message and "long position 100" in rp404[0].message

    # attention scaling 1.0 in layer 0 (every part divided by the config's factor)
    bundle, hf = _phi3(where, config)
    scale = HFConfig.load(hf).rope().attention_scaling

    def unscaled(array, part):
        array /= np.float32(scale)

    _private_copy(bundle, 0, unscaled)
    rp404 = [d for d in _lint(bundle, hf) if d.code == "RP404"]
    assert len(rp404) == 1 and "layer 0" in rp404[0].message and "short position 0 on" in rp404[0].message
    assert "attention scaling differs" in rp404[0].message
