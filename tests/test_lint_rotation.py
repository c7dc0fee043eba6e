"""RP405 rotation-conformance / RP406 rotation-shifted (issue 21, red team 21 T14, T16, T17, T18).

Each defect is injected in memory into a correct torch export (tests/fixtures/torch, config from
tests/fixtures/hf_rope), the rule must name the layer, query or key and the first differing position, and
onnxruntime confirms that the injected defect really changes the logits (and that query and key both shifted by the
same number of positions does not: RoPE is relative, so RP405 stays silent and RP406 only notes it). Every correct
torch/optimum/Olive fixture gets no RP405.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir
import pytest
from conftest import FIXTURES
from conftest import TORCH as CORPUS

from rope_passes.hf_config import HFConfig
from rope_passes.io import load_bundle
from rope_passes.lint import lint_bundle
from rope_passes.plan import lint_plan
from rope_passes.runtime.sessions import create_session

pytestmark = pytest.mark.corpus

TORCH = FIXTURES / "torch"
RULES = ["RP405", "RP406"]


def _case(family: str, tf: str = "tf5", exporter: str = "hf_onnx"):
    path = TORCH / tf / exporter / family / "decode.onnx"
    cfg = FIXTURES / "hf_rope" / tf / family / "config.json"
    if not path.is_file() or not cfg.is_file():
        pytest.skip(f"no fixture {path}")
    return load_bundle(str(path)), cfg


def _lint(bundle, cfg) -> list:
    return lint_bundle(bundle, lint_plan(hf_config=str(cfg)), select=RULES)


def _rotations(model: ir.Model) -> list[ir.Node]:
    """The rotation Adds ``Add(Mul(x, cos'), Mul(rotate_half(x), sin'))`` in graph order: layer 0 q, k, layer 1 ..."""
    out = []
    for node in model.graph:
        if node.op_type != "Add" or len(node.inputs) != 2:
            continue
        muls = [i.producer() for i in node.inputs]
        if all(m is not None and m.op_type == "Mul" for m in muls) and \
                any(_trig(m) == "Sin" for m in muls) and any(_trig(m) == "Cos" for m in muls):
            out.append(node)
    return out


def _trig(mul: ir.Node) -> str | None:
    for value in mul.inputs:
        v = value
        for _ in range(4):
            node = v.producer() if v is not None else None
            if node is None:
                break
            if node.op_type in ("Cos", "Sin"):
                return node.op_type
            v = node.inputs[0]
    return None


def _trig_input(add: ir.Node, kind: str) -> tuple[ir.Node, int]:
    """(the Mul, the index of its input) carrying ``kind``'s (Cos/Sin) table in one rotation."""
    for value in add.inputs:
        mul = value.producer()
        if _trig(mul) != kind:
            continue
        for index, inp in enumerate(mul.inputs):
            if _trig_value(inp) == kind:
                return mul, index
    raise AssertionError(f"no {kind} input")


def _trig_value(value: ir.Value) -> str | None:
    v = value
    for _ in range(4):
        node = v.producer() if v is not None else None
        if node is None:
            return None
        if node.op_type in ("Cos", "Sin"):
            return node.op_type
        v = node.inputs[0]
    return None


def _add(model: ir.Model, op: str, inputs, before: ir.Node, **attrs) -> ir.Value:
    node = ir.node(op, inputs, attributes=attrs)
    model.graph.insert_before(before, node)
    return node.outputs[0]


def _const(model: ir.Model, name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(name=name, const_value=ir.tensor(array, name=name))
    model.graph.register_initializer(value)
    return value


def _shifted_tables(model: ir.Model, hf: HFConfig, shift: int, at: ir.Node) -> tuple[ir.Value, ir.Value]:
    """cos/sin ``[B, 1, S, D]`` of config.json's rope at ``position_ids + shift`` (half layout, scaling 1)."""
    rope = hf.rope()
    assert rope.attention_scaling == 1 and not rope.interleaved
    positions = next(v for v in model.graph.inputs if v.name == "position_ids")
    first = next(iter(model.graph))
    moved = _add(model, "Add", [positions, _const(model, f"shift_{shift}", np.array(shift, np.int64))], first)
    pos = _add(model, "Cast", [moved], first, to=ir.DataType.FLOAT)
    pos = _add(model, "Unsqueeze", [pos, _const(model, f"ax2_{shift}", np.array([2], np.int64))], first)
    freqs = _add(model, "Mul", [pos, _const(model, f"inv_{shift}", rope.inv_freq())], first)
    emb = _add(model, "Concat", [freqs, freqs], first, axis=-1)
    out = []
    for op in ("Cos", "Sin"):
        t = _add(model, op, [emb], first)
        out.append(_add(model, "Unsqueeze", [t, _const(model, f"ax1_{op}_{shift}", np.array([1], np.int64))], first))
    return out[0], out[1]


# -- the injected defects ---------------------------------------------------------------------------------------------
def _reverse_rotate_half(model: ir.Model, hf: HFConfig) -> None:
    """Layer 1's rotate_half reversed for q and k: ``Concat(x2, -x1)`` (a rotation by -angle, T18)."""
    for add in _rotations(model)[2:4]:
        mul, index = _trig_input(add, "Sin")
        cat = mul.inputs[1 - index].producer()
        assert cat.op_type == "Concat" and cat.inputs[0].producer().op_type == "Neg"
        x2 = cat.inputs[0].producer().inputs[0]
        x1 = cat.inputs[1]
        neg = _add(model, "Neg", [x1], cat)
        cat.replace_input_with(0, x2)
        cat.replace_input_with(1, neg)


def _swap_layers(model: ir.Model, hf: HFConfig) -> None:
    """Layers 0 and 1 read each other's cos/sin chain (Gemma 3 sliding <-> full, T16)."""
    adds = _rotations(model)
    for kind in ("Cos", "Sin"):
        for a, b in ((0, 2), (1, 3)):
            (ma, ia), (mb, ib) = _trig_input(adds[a], kind), _trig_input(adds[b], kind)
            va, vb = ma.inputs[ia], mb.inputs[ib]
            ma.replace_input_with(ia, vb)
            mb.replace_input_with(ib, va)


def _query_ahead(model: ir.Model, hf: HFConfig) -> None:
    """Layer 1's query rotated at position_ids + 1, its key at position_ids (M35's defect in a torch export)."""
    add = _rotations(model)[2]
    cos, sin = _shifted_tables(model, hf, 1, add)
    for kind, value in (("Cos", cos), ("Sin", sin)):
        mul, index = _trig_input(add, kind)
        mul.replace_input_with(index, value)


def _all_ahead(model: ir.Model, hf: HFConfig) -> None:
    """Every layer's query and key rotated at position_ids + 1 (T17: attention unchanged)."""
    adds = _rotations(model)
    cos, sin = _shifted_tables(model, hf, 1, adds[0])
    for add in adds:
        for kind, value in (("Cos", cos), ("Sin", sin)):
            mul, index = _trig_input(add, kind)
            mul.replace_input_with(index, value)


def _logits(model: ir.Model, seq: int = 6) -> np.ndarray:
    """A prefill of ``seq`` tokens from an empty cache (positions 0..seq-1) on onnxruntime CPU."""
    for value in model.graph.initializers.values():  # external data (mobius) into the bytes
        if value.const_value is not None and isinstance(value.const_value, ir.ExternalTensor):
            value.const_value = ir.tensor(value.const_value.numpy(), name=value.name)
    proto = ir.serde.serialize_model(ir.Model(model.graph, ir_version=10))
    sess = create_session(proto.SerializeToString(), "cpu")
    rng = np.random.default_rng(0)
    feeds = {}
    for inp in sess.get_inputs():
        if inp.name == "input_ids":
            feeds[inp.name] = rng.integers(0, 50, (1, seq)).astype(np.int64)
        elif inp.name == "attention_mask":
            feeds[inp.name] = np.ones((1, seq), np.int64)
        elif inp.name == "position_ids":
            feeds[inp.name] = np.arange(seq, dtype=np.int64)[None]
        else:
            dims = [d if isinstance(d, int) else 0 for d in inp.shape]
            dims[0] = 1
            feeds[inp.name] = np.zeros(dims, np.float32)
    return sess.run(None, feeds)[0]


CASES = {
    "reversed": ("llama", _reverse_rotate_half),
    "swapped": ("gemma3_text", _swap_layers),
    "query_ahead": ("llama", _query_ahead),
    "all_ahead": ("llama", _all_ahead),
}


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_correct_graph_clean(family):
    bundle, cfg = _case(family)
    assert _lint(bundle, cfg) == []


@pytest.mark.parametrize("name", sorted(CASES))
def test_injected_defect(name):
    family, inject = CASES[name]
    bundle, cfg = _case(family)
    hf = HFConfig.load(cfg)
    before = _logits(bundle.model)
    inject(bundle.model, hf)
    bundle.model.graph.sort()  # a valid ONNX graph is topologically sorted
    after = _logits(bundle.model)
    found = _lint(bundle, cfg)
    errors = [d.message for d in found if d.code == "RP405"]
    notes = [d.message for d in found if d.code == "RP406"]
    delta = float(np.abs(after - before).max())
    if name == "all_ahead":  # q and k shifted together: attention unchanged, a note only
        assert delta < 1e-4, delta
        assert errors == [] and len(notes) == 2, found
        assert all("position + 1" in n for n in notes) and "layer 0" in notes[0] and "layer 1" in notes[1]
        return
    assert delta > 1e-3, delta  # the defect is real
    assert notes == [], notes
    text = " | ".join(errors)
    if name == "reversed":
        assert len(errors) == 2 and all(e.startswith("layer 1 ") for e in errors), errors
        assert "layer 1 query" in text and "layer 1 key" in text and "from position 1 on" in text
        assert "rotates by -angle" in text
    elif name == "swapped":
        assert len(errors) == 4, errors
        for words in ("layer 0 query", "layer 0 key", "layer 1 query", "layer 1 key", "from position 1 on",
                      "it rotates by the full_attention rope", "it rotates by the sliding_attention rope"):
            assert words in text, (words, text)
    elif name == "query_ahead":
        assert len(errors) == 1 and errors[0].startswith("layer 1 rotates its query at position + 1 and its key "
                                                         "at position + 0"), errors
        assert "1 position(s) apart" in errors[0] and "from position 0 on" in errors[0]


def test_private_chain_names_the_layer():
    """T14: layer 1 reads its own chain with another theta: RP405 names layer 1 (RP402 names only the chain)."""
    bundle, cfg = _case("llama")
    hf = HFConfig.load(cfg)
    model = bundle.model
    rope = dataclasses.replace(hf.rope(), theta=hf.rope().theta * 10)
    adds = _rotations(model)
    positions = next(v for v in model.graph.inputs if v.name == "position_ids")
    first = next(iter(model.graph))
    pos = _add(model, "Cast", [positions], first, to=ir.DataType.FLOAT)
    pos = _add(model, "Unsqueeze", [pos, _const(model, "ax2_t", np.array([2], np.int64))], first)
    freqs = _add(model, "Mul", [pos, _const(model, "inv_t", rope.inv_freq())], first)
    emb = _add(model, "Concat", [freqs, freqs], first, axis=-1)
    tables = {op: _add(model, "Unsqueeze", [_add(model, op, [emb], first),
                                            _const(model, f"ax1_t_{op}", np.array([1], np.int64))], first)
              for op in ("Cos", "Sin")}
    before = _logits(_case("llama")[0].model)
    for add in adds[2:4]:
        for kind in ("Cos", "Sin"):
            mul, index = _trig_input(add, kind)
            mul.replace_input_with(index, tables[kind])
    assert float(np.abs(_logits(model) - before).max()) > 1e-3
    errors = [d.message for d in _lint(bundle, cfg) if d.code == "RP405"]
    assert len(errors) == 2 and all(e.startswith("layer 1 ") and "from position 1 on" in e for e in errors), errors


def _fixtures() -> list[tuple[str, object, object]]:
    out = []
    for m in sorted(TORCH.glob("*/*/*/decode.onnx")):
        cfg = FIXTURES / "hf_rope" / m.parts[-4] / m.parent.name / "config.json"
        if cfg.is_file():
            out.append((str(m.parent.relative_to(TORCH)), m, cfg))
    for m in sorted((FIXTURES / "torch_ext").glob("*/*/*/decode.onnx")):
        out.append((str(m.parent.relative_to(FIXTURES)), m, m.parent / "config.json"))
    for m in sorted([*(FIXTURES / "optimum").glob("*/model.onnx"), *(FIXTURES / "olive").glob("*/*/model.onnx")]):
        out.append((str(m.parent.relative_to(FIXTURES)), m.parent, None))
    for m in sorted(CORPUS.glob("*/*/*/*.onnx")):  # the shared torch corpus: decode and prefill graphs
        cfg = FIXTURES / "hf_rope" / m.parts[-4] / m.parent.name / "config.json"
        if cfg.is_file():
            out.append((f"corpus/{m.relative_to(CORPUS)}", m, cfg))
    return out


def _frozen(name: str) -> bool:
    """TorchScript exports of LongRoPE (transformers 4): the short factors frozen for every call (RP401 too)."""
    return "longrope" in name and ("tf4/" in name or name.startswith("optimum/"))


@pytest.mark.parametrize(("name", "path", "cfg"), _fixtures(), ids=[c[0] for c in _fixtures()])
def test_no_finding_on_correct_fixtures(name, path, cfg):
    """No finding on any correct graph; the frozen LongRoPE exports: each layer's query and key, in the long call."""
    found = lint_bundle(str(path), lint_plan(hf_config=str(cfg) if cfg is not None else None), select=RULES)
    if not _frozen(name):
        assert found == [], [(d.code, d.message) for d in found]
        return
    assert [d.code for d in found] == ["RP405"] * 4, found
    for d, words in zip(found, ("layer 0 query", "layer 0 key", "layer 1 query", "layer 1 key"), strict=True):
        assert d.message.startswith(words) and "(long factors): it rotates by the short factors in a call past " \
            "original_max_position_embeddings 64 (LongRoPE frozen)" in d.message, d.message


# -- RotaryEmbedding (mobius gpt_oss): the query of one layer one position ahead of its key (red team 21 M35) --------
def _mobius_gpt_oss():
    folder = FIXTURES / "mobius" / "gpt_oss" / "webgpu_f32"
    if not (folder / "model.onnx").is_file():
        pytest.skip("no mobius gpt_oss fixture")
    bundle = load_bundle(str(folder))
    cfg = folder / "hf_config.json"
    hf = HFConfig.load(cfg)
    # mobius 0.1.0's YaRN table is wrong (RP404, tests/test_conformance.py): config.json's table in its place
    rope = dataclasses.replace(hf.rope(), table_interleaved=False)
    for name in ("model.rotary_emb.cos_cache", "model.rotary_emb.sin_cache"):
        value = bundle.model.graph.initializers[name]
        cos, sin = rope.tables(value.const_value.shape[0], layout="cache")
        value.const_value = ir.tensor(cos if "cos" in name else sin, name=name)
    return bundle, cfg


def _gather_ahead(model: ir.Model, rotary: ir.Node) -> None:
    """``rotary``'s cos/sin Gathers read ``position_ids + 1``."""
    positions = next(v for v in model.graph.inputs if v.name == "position_ids")
    moved = _add(model, "Add", [positions, _const(model, f"one_{rotary.name}", np.array(1, np.int64))],
                 next(iter(model.graph)))
    for index in (1, 2):
        gather = rotary.inputs[index].producer()
        assert gather.op_type == "Gather"
        new = _add(model, "Gather", [gather.inputs[0], moved], rotary)
        rotary.replace_input_with(index, new)


def test_rotary_embedding_query_ahead():
    bundle, cfg = _mobius_gpt_oss()
    assert _lint(bundle, cfg) == []  # the repaired graph conforms
    before = _logits(bundle.model)
    rotaries = [n for n in bundle.model.graph if n.op_type == "RotaryEmbedding"]
    assert len(rotaries) == 4 and "layers.1" in rotaries[2].name
    _gather_ahead(bundle.model, rotaries[2])  # layer 1's query
    bundle.model.graph.sort()
    assert float(np.abs(_logits(bundle.model) - before).max()) > 1e-3  # 0.41 here (M35's checkpoint: 1.6e-4, near-uniform attention)
    found = _lint(bundle, cfg)
    assert [d.code for d in found] == ["RP405"], found
    assert found[0].message.startswith("layer 1 rotates its query at position + 1 and its key at position + 0")


def test_rotary_embedding_all_ahead_is_a_note():
    bundle, cfg = _mobius_gpt_oss()
    before = _logits(bundle.model)
    for rotary in [n for n in bundle.model.graph if n.op_type == "RotaryEmbedding"]:
        _gather_ahead(bundle.model, rotary)
    bundle.model.graph.sort()
    assert float(np.abs(_logits(bundle.model) - before).max()) < 1e-5
    found = _lint(bundle, cfg)
    assert [d.code for d in found] == ["RP406", "RP406"], found


def test_rotary_embedding_layout_flipped():
    """Layer 0's RotaryEmbeddings rotate interleaved pairs where gpt_oss rotates halves (red team 21 M27)."""
    bundle, cfg = _mobius_gpt_oss()
    before = _logits(bundle.model)
    for rotary in [n for n in bundle.model.graph if n.op_type == "RotaryEmbedding"][:2]:
        rotary.attributes["interleaved"] = ir.AttrInt64("interleaved", 1)
    assert float(np.abs(_logits(bundle.model) - before).max()) > 1e-3
    found = _lint(bundle, cfg)
    assert [d.code for d in found] == ["RP405", "RP405"], found
    for d, words in zip(found, ("layer 0 query", "layer 0 key"), strict=True):
        assert d.message.startswith(words) and "from position 1 on" in d.message
        assert "it rotates interleaved pairs (2i, 2i+1), config.json's family rotates halves" in d.message


def test_positions_plus_one_in_the_chain_is_no_table_error():
    """T17: the cos/sin chain reads position_ids + 1 (query and key alike): attention is unchanged (logits within
    1e-4, checked here on onnxruntime); before, RP402 called the computed table wrong "from position 0 on". Now
    the chain's rows are recognised as the config's rows one position on: no RP402, RP406 notes it per layer."""
    bundle, cfg = _case("llama")
    model = bundle.model
    before = _logits(model)
    pos = next(v for v in model.graph.inputs if v.name == "position_ids")
    one = ir.Value(name="rt_one", const_value=ir.tensor(np.array(1, np.int64)))
    model.graph.register_initializer(one)
    shift = ir.node("Add", [pos, one])
    shift.outputs[0].dtype, shift.outputs[0].shape = pos.dtype, pos.shape
    users = [(u, i) for u, i in pos.uses() if u is not shift]
    model.graph.insert_before(model.graph.node(0), shift)
    for user, index in users:
        user.replace_input_with(index, shift.outputs[0])
    model.graph.sort()
    assert float(np.abs(_logits(model) - before).max()) < 1e-4
    found = lint_bundle(bundle, lint_plan(hf_config=str(cfg)), select=["RP402", "RP405", "RP406"])
    assert not [d for d in found if d.code in ("RP402", "RP405")], [d.message for d in found]
    assert len([d for d in found if d.code == "RP406"]) == 2
