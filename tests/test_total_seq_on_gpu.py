"""`total-seq-on-gpu` and the `webgpu-graph` preset: GQA lengths from the GPU, 0 Memcpy, graph capture created.

* rules and refusals on corpus graphs edited in memory (each refusal reason asserted);
* exactness: on CPU the rewritten llama fp32 graph gives bit-identical outputs (seqlens_k is the same int32 sum,
  total_sequence_length the same number for an all-ones mask);
* Done-when: every corpus model that loads on onnxruntime-webgpu 1.27 goes through `optimize --target webgpu-graph`
  to a graph for which a WebGPU session with enableGraphCapture=1 is created with 0 Memcpy (runtime probe), the
  three whose 3D mRoPE positions come from outside included (int64 position math moved to the GPU in int32); with
  --text-only (the mRoPE fold) the five builder-0.18 VL graphs that do not load at all are capture-ready too; the
  checker's captured decode matches the original on every one of them (fp32, fp16, int4, LongRoPE, 3D-position VL).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from conftest import GENAI, SWEEP, UNLOADABLE, genai_models

from rope_passes.analysis.graph import ancestors, nodes_of
from rope_passes.analysis.placement import predict_placement
from rope_passes.api import optimize
from rope_passes.check import check
from rope_passes.check.client_schedules import CAPTURE_TOTAL
from rope_passes.check.core import PAST_SWITCH
from rope_passes.check.decode import DecoderSpec, run_decode, token_ids
from rope_passes.io import load_bundle
from rope_passes.passes.total_seq_on_gpu import TotalSeqOnGpuPass
from rope_passes.pipeline import run_pipeline
from rope_passes.plan import make_plan
from rope_passes.report import Outcome
from rope_passes.runtime.placement_probe import probe_placement
from rope_passes.runtime.sessions import create_session

LOADABLE = [m for m in genai_models() if m not in UNLOADABLE]
#: 3D position_ids come from outside (vision-language graphs): fold-text-mrope refuses without --text-only and the
#: manual mRoPE's int64 position math is moved to the GPU in int32 by narrow-int64. (Saving these
#: once failed with onnx_ir's "cannot close exported pointers exist"; io.save_bundle now inlines small tensors itself.)
VL_3D = ["legacy/qwen25_vl/cpu_fp32", "legacy/qwen25_vl/webgpu_fp16_graph", "legacy/qwen35/cpu_fp32"]
NOT_CAPTURE_READY: dict[str, str] = {}
CAPTURE_READY = LOADABLE


def _rewrite(model: ir.Model):
    pass_ = TotalSeqOnGpuPass()
    result = pass_(model)
    return result.model, result.report


def _load(rel: str) -> ir.Model:
    return ir.load(GENAI / rel / "model.onnx")


# --- rules and refusals ---------------------------------------------------------------------------------------


@pytest.mark.corpus
def test_rewrites_builder_mask_subgraph_into_int32_reduce(genai_corpus):
    model, report = _rewrite(_load("current/llama/webgpu_fp16"))
    assert report.count(Outcome.REWRITTEN) == 1, report.status
    for gqa in nodes_of(model, "GroupQueryAttention"):
        seqlens, total = gqa.inputs[5], gqa.inputs[6]
        assert seqlens.producer().op_type == "Sub" and total.producer().op_type == "ReduceMax"
        row_sum = seqlens.producer().inputs[0].producer()
        cast = row_sum.inputs[0].producer()
        assert row_sum.op_type == "ReduceSum" and cast.op_type == "Cast" and cast.inputs[0].name == "attention_mask"
        # the total: the width, as a row of ones summed (Add(Mul(mask, 0), 1))
        width = total.producer().inputs[0].producer()
        ones = width.inputs[0].producer()
        assert width.op_type == "ReduceSum" and ones.op_type == "Add" and ones.inputs[0].producer().op_type == "Mul"
        assert ones.inputs[0].producer().inputs[0].producer() is cast
        assert {seqlens.dtype, total.dtype} == {ir.DataType.INT32}
    placement = predict_placement(model)  # the pass removed the old chain itself
    assert placement.capture_ok and not placement.memcpy and not nodes_of(model, "Shape")


@pytest.mark.corpus
@pytest.mark.webgpu
def test_a_dead_shape_chain_still_gets_memcpy(genai_corpus, tmp_path):
    """Why the pass removes the old chain (and cleanup runs last): onnxruntime places dead nodes and copies for them."""
    model = _load("current/llama/webgpu_fp16")
    gqas = nodes_of(model, "GroupQueryAttention")
    mask = next(v for v in model.graph.inputs if v.name == "attention_mask")
    seqlens, total = TotalSeqOnGpuPass._build(model.graph, mask, 0)
    for gqa in gqas:
        gqa.replace_input_with(5, seqlens)
        gqa.replace_input_with(6, total)
    ir.save(model, tmp_path / "model.onnx", external_data="model.onnx.data")
    probe = probe_placement(tmp_path / "model.onnx")
    assert ("MemcpyFromHost", "/model/attn_mask_reformat/attn_mask_subgraph/Gather/output_0") in probe.memcpy_set
    assert not probe.capture_ok and predict_placement(tmp_path / "model.onnx").same_memcpy(probe)


@pytest.mark.corpus
def test_graph_variant_is_not_matched(genai_corpus):
    _model, report = _rewrite(_load("current/llama/webgpu_fp16_graph"))
    assert report.count(Outcome.REWRITTEN) == 0 and not report.modified
    assert "ReduceMax" in report.findings[0].reason


@pytest.mark.corpus
def test_refuses_other_dimension(genai_corpus):
    model = _load("current/llama/cpu_fp32")
    gather = next(n for n in model.graph if n.op_type == "Gather" and "attn_mask" in (n.name or ""))
    zero = ir.Value(name="zero_index", const_value=ir.tensor(np.array(0, dtype=np.int64)))
    model.graph.register_initializer(zero)
    gather.replace_input_with(1, zero)
    _, report = _rewrite(model)
    assert report.count(Outcome.REFUSED) == 1 and "dimension 0 of 'attention_mask'" in report.findings[0].reason


@pytest.mark.corpus
def test_mask_through_an_identity_is_the_mask(genai_corpus):
    """The chains read the mask through an Identity: the same values, proved by value (issue 32), rewritten on the
    graph input itself; a graph input that is not the mask (``input_ids``) is refused by name."""
    model = _load("current/llama/cpu_fp32")
    mask = next(v for v in model.graph.inputs if v.name == "attention_mask")
    users = list(mask.uses())
    ident = ir.node("Identity", [mask], name="mask_copy")
    ident.outputs[0].name = "mask_copy"
    ident.outputs[0].dtype, ident.outputs[0].shape = mask.dtype, mask.shape
    model.graph.insert_before(model.graph.node(0), ident)
    for user, index in users:
        user.replace_input_with(index, ident.outputs[0])
    rewritten, report = _rewrite(model)
    assert report.status == "rewritten 1" and report.findings[0].details["mask"] == "attention_mask", report.findings
    assert report.findings[0].details["seqlens_k_rewritten"] is True
    ids = next(v for v in rewritten.graph.inputs if v.name == "input_ids")
    model = _load("current/llama/cpu_fp32")
    _mask_node(model, "ReduceSum").replace_input_with(0, next(v for v in model.graph.inputs if v.name == "input_ids"))
    _, report = _rewrite(model)
    assert report.count(Outcome.REFUSED) == 1 and "'input_ids' is not the attention mask" in report.findings[0].reason
    assert ids is not None


def test_no_gqa_is_not_matched():
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
    node = ir.node("Relu", [x], name="relu")
    node.outputs[0].name = "y"
    graph = ir.Graph([x], node.outputs, nodes=[node], opset_imports={"": 21})
    _, report = _rewrite(ir.Model(graph, ir_version=10))
    assert report.status.startswith("not matched: no com.microsoft::GroupQueryAttention")


# --- exactness ---------------------------------------------------------------------------------------------------


@pytest.mark.corpus
def test_bit_identical_on_cpu(genai_corpus, tmp_path):
    """All-ones mask: seqlens_k and total_sequence_length are the same numbers, so CPU outputs are the same bits."""
    src = GENAI / "current/llama/cpu_fp32"
    optimize(str(src), str(tmp_path / "out"), passes=["total-seq-on-gpu", "cleanup"])
    outs = []
    for folder in (src, tmp_path / "out"):
        bundle = load_bundle(folder)
        sess = create_session(str(folder / "model.onnx"), "cpu")
        spec = DecoderSpec.from_session(sess, bundle.genai_config)
        steps = run_decode(sess, spec, token_ids(12), prefill=8, steps=4)
        outs.append([s[name] for s in steps for name in spec.outputs])
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)


def _llama_feeds(mask: np.ndarray, call: int, past: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(4, 492, size=(mask.shape[0], call)).astype(np.int64),
             "attention_mask": mask.astype(np.int64)}
    for layer in range(2):
        for kv in ("key", "value"):
            feeds[f"past_key_values.{layer}.{kv}"] = rng.standard_normal((mask.shape[0], 2, past, 32), np.float32)
    return feeds


@pytest.mark.corpus
@pytest.mark.parametrize("mask,call,past", [
    ([[1, 1, 1, 1, 1, 0, 0, 0]], 8, 0),  # batch 1 right-padded to 8 (padding="max_length")
    ([[0, 0, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1, 1, 1]], 1, 8),  # a decode, left-padded, no row full
    ([[1, 1, 1, 0, 0, 0, 0, 0, 0]], 1, 8),  # a decode into a mask wider than the sequence
    ([[1] * 9, [0, 0, 0] + [1] * 6], 1, 8),  # the usual batch: one row full
], ids=["right-padded-prefill", "left-padded-decode", "wide-mask-decode", "one-row-full"])
def test_masks_without_a_full_row_give_the_original_outputs(genai_corpus, tmp_path, mask, call, past):
    """total_sequence_length is the mask's width for every mask (what Shape gave), not the largest row sum: a mask
    where no row is all ones (Hugging Face's padding="max_length") runs as the original did, with the same bits
    (CPU) and the same KV-cache shapes; the largest row sum would fail the prefill and shorten the cache.

    Compared where GroupQueryAttention defines its outputs (it reads seqlens_k as right padding): a prefill's
    queries before the row's length, the cache rows before it. Past them the original itself returns whatever
    memory held (two runs of the original differ there)."""
    src = GENAI / "current/llama/cpu_fp32"
    optimize(str(src), str(tmp_path / "out"), passes=["total-seq-on-gpu", "cleanup"])
    feeds = _llama_feeds(np.array(mask), call, past)
    runs = []
    for folder in (src, tmp_path / "out"):
        sess = create_session(str(folder / "model.onnx"), "cpu")
        runs.append(dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds))))
    for name, expected in runs[0].items():
        got = runs[1][name]
        assert got.shape == expected.shape, name
        for row, length in enumerate(np.array(mask).sum(axis=1)):
            defined = (slice(None), slice(0, length)) if name.startswith("present") else \
                (slice(0, call if call == 1 else length),)
            np.testing.assert_array_equal(got[row][defined], expected[row][defined], err_msg=f"{name} row {row}")


@pytest.mark.corpus
def test_two_chains_on_one_mask_share_one_computation(genai_corpus, tmp_path):
    """Layers whose length inputs come from two copies of the builder's chain (same mask) get one int32 computation;
    the output is a valid model (unique names) that onnxruntime loads."""
    model = _load("current/llama/cpu_fp32")
    gqas = nodes_of(model, "GroupQueryAttention")
    chain = {id(n) for n in ancestors([gqas[1].inputs[5], gqas[1].inputs[6]])}
    copies: dict[int, ir.Value] = {}
    for node in [n for n in model.graph if id(n) in chain]:  # copy the chain, in graph order
        new = ir.node(node.op_type, [copies.get(id(v), v) for v in node.inputs], dict(node.attributes),
                      domain=node.domain, name=f"{node.name}_copy")
        for old_out, new_out in zip(node.outputs, new.outputs):
            new_out.name, new_out.dtype, new_out.shape = f"{old_out.name}_copy", old_out.dtype, old_out.shape
            copies[id(old_out)] = new_out
        model.graph.insert_after(node, new)
    gqas[1].replace_input_with(5, copies[id(gqas[1].inputs[5])])
    gqas[1].replace_input_with(6, copies[id(gqas[1].inputs[6])])
    _, report = _rewrite(model)
    assert report.count(Outcome.REWRITTEN) == 2 and report.count(Outcome.REFUSED) == 0, report.status
    assert len([n for n in model.graph if n.op_type == "ReduceMax"]) == 1
    assert gqas[0].inputs[6] is gqas[1].inputs[6] and gqas[0].inputs[5] is gqas[1].inputs[5]
    names = [v.name for n in model.graph for v in n.outputs if v.name]
    assert len(names) == len(set(names))  # single assignment: every value named once
    ir.save(model, tmp_path / "model.onnx", external_data="model.onnx.data")
    create_session(str(tmp_path / "model.onnx"), "cpu")


@pytest.mark.corpus
def test_refuses_constants_the_caller_can_override(genai_corpus):
    """The chain's ``1`` as an initializer that is also a graph input (keep_initializers_as_inputs): a caller can
    feed 2, so it is not the builder's seqlens_k; refused, naming the Sub."""
    model = _load("current/llama/cpu_fp32")
    sub = next(n for n in model.graph if n.op_type == "Sub" and "attn_mask" in (n.name or ""))
    one = ir.Value(name="seqlens_one", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([1]),
                   const_value=ir.tensor(np.array([1], dtype=np.int64), name="seqlens_one"))
    model.graph.register_initializer(one)
    model.graph.inputs.append(one)
    sub.replace_input_with(1, one)
    _, report = _rewrite(model)
    assert report.count(Outcome.REFUSED) == 1 and report.count(Outcome.REWRITTEN) == 0, report.status
    assert report.findings[0].place == "/model/layers.0/attn/GroupQueryAttention"
    assert "Sub" in report.findings[0].reason, report.findings[0].reason


# --- Done-when: webgpu-graph makes every loadable corpus model capture-ready --------------------------------------


@pytest.fixture(scope="module")
def optimized(genai_corpus, tmp_path_factory) -> dict[str, Path | str]:
    out: dict[str, Path | str] = {}
    root = tmp_path_factory.mktemp("webgpu_graph")
    for rel in LOADABLE:
        dest = root / rel.replace("/", "_")
        report = optimize(str(GENAI / rel), str(dest), preset="webgpu-graph")
        if rel in VL_3D:
            fold = next(p for p in report.passes if p.pass_name == "fold-text-mrope")
            assert fold.status.startswith("refused: positions come from outside"), fold.status
        out[rel] = dest
    return out


@pytest.fixture(scope="module")
def capture_probes(optimized) -> dict[str, object]:
    ready = [rel for rel in CAPTURE_READY if not isinstance(optimized[rel], str)]
    with ThreadPoolExecutor(2) as pool:
        probes = pool.map(lambda rel: probe_placement(Path(optimized[rel]) / "model.onnx", graph_capture=True), ready)
    return dict(zip(ready, probes))


@pytest.mark.corpus
def test_loadable_corpus_count():
    assert len(LOADABLE) == 13


@pytest.mark.corpus
@pytest.mark.webgpu
@pytest.mark.parametrize("rel", CAPTURE_READY)
def test_webgpu_graph_output_captures_with_zero_memcpy(optimized, capture_probes, rel):
    assert not isinstance(optimized[rel], str), optimized[rel]
    probe = capture_probes[rel]
    assert probe.loads, probe.load_error
    assert probe.capture_ok, probe.capture_error
    assert probe.memcpy == []
    static = predict_placement(Path(optimized[rel]) / "model.onnx")
    assert static.capture_ok and static.same_memcpy(probe)


@pytest.mark.corpus
@pytest.mark.webgpu
@pytest.mark.parametrize("rel", CAPTURE_READY)
def test_captured_decode_matches_original(optimized, rel):
    """The checker's runs: original on CPU and WebGPU, rewritten on WebGPU without and with graph capture."""
    report = check(GENAI / rel, optimized[rel], prefill=8, steps=4, graph_capture=True, sweep=SWEEP)
    captured = report.run("rewritten@webgpu+capture")
    assert captured is not None and captured.ok, (captured.status, captured.reason) if captured else None
    assert report.equivalent, report.to_json()[:2000]
    vs_plain = report.comparison("rewritten@webgpu+capture", "rewritten@webgpu")
    # every step compared: prefill + 4 decode steps, or (LongRoPE) as many as it takes to cross the cache switch
    # (the corpus phi3-mini-128k checkpoint has original_max_position_embeddings = 32); with capture the decode
    # goes on to total CAPTURE_TOTAL so a replay runs at every total up to it (the corpus contexts are 256)
    asked = 4 if "phi3" not in rel else 32 + PAST_SWITCH - 8
    expected = 1 + max(asked, CAPTURE_TOTAL - 8)
    assert vs_plain is not None and vs_plain.ok and len({d.step for d in vs_plain.diffs}) == expected
    if rel in VL_3D:  # int32 narrowing moves values, never changes them: same bits as the original on WebGPU
        same_ep = report.comparison("rewritten@webgpu", "original@webgpu")
        assert all(d.max_abs == 0.0 for d in same_ep.diffs) and len(same_ep.diffs) > 0


@pytest.mark.corpus
def test_int64_movement_narrowed_on_3d_vl_graph(genai_corpus):
    bundle = load_bundle(GENAI / "legacy/qwen35/cpu_fp32")
    report = run_pipeline(bundle, make_plan(passes=["total-seq-on-gpu", "narrow-int64", "cleanup"]))
    total_seq, narrow = report.passes[:2]
    assert total_seq.status == "rewritten 1" and narrow.count(Outcome.REWRITTEN) > 0, (total_seq.status, narrow.status)
    assert all("int32" in f.reason for f in narrow.findings)
    # what it assumes of the caller, in the report: the position input's values fit in int32
    notes = [f.reason for f in narrow.findings if f.outcome is Outcome.NOTE]
    assert notes == ["exact while the int64 values of 'position_ids' fit in int32 (-2^31 .. 2^31-1; positions and "
                     "lengths do): outside that range the int32 Cast wraps them around"], notes
    model = bundle.model
    casts = [n for n in model.graph if (n.name or "").startswith("/rope_passes/int32/")]
    assert casts and all(n.op_type in ("Cast", "Relu") for n in casts)
    gathers = [n for n in model.graph if n.name == "/model/rotary_emb/sin/dim0/pos/Gather"]
    assert gathers and gathers[0].outputs[0].dtype == ir.DataType.INT32


def test_int64_values_outside_int32_are_not_narrowed():
    """A data input is proved to fit int32 by its interval, whatever form its constants take: 2^31 + 7 would wrap in
    the int32 Cast. A graph input is the caller's (taken to fit int32: the note above says so)."""
    from rope_passes.passes.narrow_int64 import _fits_int32

    def value(array, constant=True):
        return ir.Value(name="c", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape(array.shape),
                        const_value=ir.tensor(array, name="c") if constant else None)
    assert _fits_int32(value(np.array([0, 5, 2**31 - 1, -(2**31)], np.int64)))
    assert not _fits_int32(value(np.array([3, 2**31 + 7], np.int64)))
    caller = value(np.array([2**40], np.int64), constant=False)
    ir.Graph([caller], [], nodes=[])  # a graph input: the caller's
    assert _fits_int32(caller)
    ints = ir.node("Constant", [], {"value_ints": [1, 2**31 + 7]}).outputs[0]  # a Constant without a tensor too
    assert not _fits_int32(ints)
    three_e9 = ir.node("Constant", [], {"value_float": 3e9}, name="f").outputs[0]
    three_e9.name = "f"
    as_int = ir.node("Cast", [three_e9], {"to": ir.DataType.INT64}, name="i").outputs[0]
    as_int.name = "i"
    assert not _fits_int32(as_int)  # a constant computed by a Cast: its value, not its form


#: vision-language graphs: capture-ready for text prompts once fold-text-mrope folds them (--text-only)
VL_MODELS = ["current/qwen25_vl/cpu_fp32", "current/qwen25_vl/webgpu_fp16", "current/qwen25_vl/webgpu_int4_graph",
             "current/qwen35/webgpu_fp16_graph", "current/qwen35/webgpu_fp32", *VL_3D]


@pytest.mark.corpus
@pytest.mark.webgpu
def test_text_only_vl_models_capture_with_zero_memcpy(genai_corpus, tmp_path):
    outs = []
    for rel in VL_MODELS:
        dest = tmp_path / rel.replace("/", "_")
        optimize(str(GENAI / rel), str(dest), preset="webgpu-graph", options={"text_only": True})
        outs.append(dest / "model.onnx")
    with ThreadPoolExecutor(2) as pool:
        probes = list(pool.map(lambda p: probe_placement(p, graph_capture=True), outs))
    bad = [f"{rel}: {p.summary()}" for rel, p in zip(VL_MODELS, probes) if not (p.capture_ok and not p.memcpy)]
    assert not bad, "\n".join(bad)


def _mask_node(model: ir.Model, op: str) -> ir.Node:
    return next(n for n in model.graph if n.op_type == op and "attn_mask" in (n.name or ""))


def _edit_sub_by_two(model):
    two = ir.Value(name="two", const_value=ir.tensor(np.array([2], dtype=np.int64)))
    model.graph.register_initializer(two)
    _mask_node(model, "Sub").replace_input_with(1, two)


def _edit_keepdims_axis0(model):
    """keepdims=1 alone is mobius's form (accepted, tests/test_mobius.py); over axis 0 it sums columns."""
    reduce = _mask_node(model, "ReduceSum")
    reduce.attributes["keepdims"] = ir.AttrInt64("keepdims", 1)
    zero = ir.Value(name="axes_zero", const_value=ir.tensor(np.array([0], dtype=np.int64)))
    model.graph.register_initializer(zero)
    reduce.replace_input_with(1, zero)


def _edit_shape_start(model):
    _mask_node(model, "Shape").attributes["start"] = ir.AttrInt64("start", 1)


@pytest.mark.corpus
@pytest.mark.parametrize("edit,reason", [
    (_edit_sub_by_two, "is the row sums of 'attention_mask' -2, not the row sums - 1 (last changed by Sub "),
    (_edit_keepdims_axis0, "ReduceSum '/model/attn_mask_reformat/attn_mask_subgraph/ReduceSum' sums axes [0] (b), "
                           "not the mask's columns alone"),
    (_edit_shape_start, "total_sequence_length is not the mask's width (Shape(mask)[1]): Cast "),
], ids=["sub-2", "keepdims", "shape-start"])
def test_refusals(genai_corpus, edit, reason):
    model = _load("current/llama/cpu_fp32")
    edit(model)
    before = [(g.inputs[5], g.inputs[6]) for g in nodes_of(model, "GroupQueryAttention")]
    rewritten, report = _rewrite(model)
    assert report.count(Outcome.REFUSED) == 1 and reason in report.findings[0].reason, report.findings
    assert [(g.inputs[5], g.inputs[6]) for g in nodes_of(rewritten, "GroupQueryAttention")] == before


@pytest.mark.corpus
@pytest.mark.webgpu
def test_lowered_mrope_graph_captures_and_keeps_its_bits(genai_corpus, tmp_path):
    """A builder-0.18 VL graph (MRotaryEmbedding, unloadable as is): `lower-mrope` alone vs the whole `webgpu-graph`
    preset. The preset's extra work (int32 position movement, GPU lengths) changes no bit on WebGPU and captures."""
    rel = "current/qwen35/webgpu_fp32"
    optimize(str(GENAI / rel), str(tmp_path / "lowered"), passes=["lower-mrope", "cleanup"])
    optimize(str(GENAI / rel), str(tmp_path / "graph"), preset="webgpu-graph")
    report = check(tmp_path / "lowered", tmp_path / "graph", prefill=8, steps=4, graph_capture=True, sweep=SWEEP)
    assert report.equivalent, report.to_json()[:2000]
    same_ep = report.comparison("rewritten@webgpu", "original@webgpu")
    assert same_ep.diffs and all(d.max_abs == 0.0 for d in same_ep.diffs)
    captured = report.comparison("rewritten@webgpu+capture", "rewritten@webgpu")
    assert captured.ok and all(d.max_abs == 0.0 for d in captured.diffs)


# --- the mask, the total-only branch, bf16 ------------------------------------------------------------------------


def _seqlens_through_identity(model: ir.Model) -> None:
    """seqlens_k = Identity(the builder's chain): the mask's row lengths, whatever node hands them over."""
    cast = _mask_node(model, "Sub").outputs[0].uses()[0][0]
    users = list(cast.outputs[0].uses())
    ident = ir.node("Identity", [cast.outputs[0]], name="seqlens_identity")
    ident.outputs[0].name, ident.outputs[0].dtype = "seqlens_identity", ir.DataType.INT32
    model.graph.insert_after(cast, ident)
    for user, index in users:
        user.replace_input_with(index, ident.outputs[0])


@pytest.mark.corpus
def test_seqlens_through_an_identity_is_proved_by_value(genai_corpus):
    model = _load("current/llama/cpu_fp32")
    _seqlens_through_identity(model)
    rewritten, report = _rewrite(model)
    assert report.count(Outcome.REWRITTEN) == 1 and report.findings[0].details["seqlens_k_rewritten"] is True
    assert all(g.inputs[5].name == "/rope_passes/total_seq_on_gpu/seqlens_k"
               for g in nodes_of(rewritten, "GroupQueryAttention"))
    assert not [n for n in rewritten.graph if n.name == "seqlens_identity"]  # the old chain went with its reader


@pytest.mark.corpus
def test_total_alone_moves_whatever_seqlens_reads(genai_corpus, tmp_path):
    """seqlens_k fed by the caller (not matched): the total moves alone, and is still the mask's width."""
    model = _load("current/llama/cpu_fp32")
    seqlens = ir.Value(name="seqlens_k", type=ir.TensorType(ir.DataType.INT32), shape=ir.Shape(["batch_size"]))
    model.graph.inputs.append(seqlens)
    for gqa in nodes_of(model, "GroupQueryAttention"):
        gqa.replace_input_with(5, seqlens)
    rewritten, report = _rewrite(model)
    assert report.status == "rewritten 1" and report.findings[0].details["seqlens_k_rewritten"] is False
    gqas = nodes_of(rewritten, "GroupQueryAttention")
    assert all(g.inputs[5] is seqlens for g in gqas)
    rewritten.graph.outputs.append(gqas[0].inputs[6])
    ir.save(rewritten, tmp_path / "model.onnx", external_data="model.onnx.data")
    sess = create_session(str(tmp_path / "model.onnx"), "cpu")
    feeds = _llama_feeds(np.array([[1, 1, 1, 0, 0, 0, 0]]), 7, 0) | {"seqlens_k": np.array([2], np.int32)}
    assert int(sess.run([gqas[0].inputs[6].name], feeds)[0]) == 7


def test_mask_named_by_genai_config():
    """The mask is genai_config's attention_mask input: a graph whose mask input has another name is matched when
    genai_config names it, and refused by name otherwise."""
    from rope_passes.config import GenaiConfig
    from rope_passes.passes.base import PassContext

    model = _bf16_gqa_model(ir.DataType.FLOAT, mask="mask")
    report = TotalSeqOnGpuPass()(model).report
    assert report.count(Outcome.REFUSED) == 1 and "'mask' is not the attention mask" in report.findings[0].reason
    config = GenaiConfig({"model": {"decoder": {"inputs": {"attention_mask": "mask"}}}})
    report = TotalSeqOnGpuPass(PassContext(config))(_bf16_gqa_model(ir.DataType.FLOAT, mask="mask")).report
    assert report.status == "rewritten 1", report.status


def _bf16_gqa_model(dtype: ir.DataType, mask: str = "attention_mask") -> ir.Model:
    """One GroupQueryAttention in ``dtype`` fed the builder's length chains from the int64 mask (Shape -> Gather ->
    Cast, ReduceSum -> Sub -> Cast): what total-seq-on-gpu rewrites, in a dtype onnxruntime has no GQA kernel for."""
    from onnx import TensorProto, helper

    t = {ir.DataType.BFLOAT16: TensorProto.BFLOAT16, ir.DataType.FLOAT: TensorProto.FLOAT}[dtype]
    nodes = [helper.make_node("Shape", [mask], ["shape"], name="Shape"),
             helper.make_node("Gather", ["shape", "one"], ["width"], name="Gather", axis=0),
             helper.make_node("Cast", ["width"], ["total"], name="Gather/Cast", to=TensorProto.INT32),
             helper.make_node("ReduceSum", [mask, "axes"], ["rows"], name="ReduceSum", keepdims=0),
             helper.make_node("Sub", ["rows", "one"], ["minus"], name="Sub"),
             helper.make_node("Cast", ["minus"], ["seqlens"], name="Sub/Cast", to=TensorProto.INT32),
             helper.make_node("GroupQueryAttention", ["q", "", "", "past_key", "past_value", "seqlens", "total"],
                              ["out", "present_key", "present_value"], name="gqa", domain="com.microsoft",
                              num_heads=1, kv_num_heads=1)]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("q", t, ["batch", "seq", 96]),
         helper.make_tensor_value_info(mask, TensorProto.INT64, ["batch", "total"]),
         helper.make_tensor_value_info("past_key", t, ["batch", 1, "past", 32]),
         helper.make_tensor_value_info("past_value", t, ["batch", 1, "past", 32])],
        [helper.make_tensor_value_info(n, t, None) for n in ("out", "present_key", "present_value")],
        initializer=[helper.make_tensor("one", TensorProto.INT64, [], [1]),
                     helper.make_tensor("axes", TensorProto.INT64, [1], [1])])
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                                 helper.make_opsetid("com.microsoft", 1)]))


def test_bf16_attention_is_said_once_and_not_rewritten(tmp_path):
    """No bf16 GroupQueryAttention kernel in onnxruntime here: total-seq-on-gpu and narrow-int64 each say so in one
    note and change nothing; lint says it once (RP207)."""
    from rope_passes.io import ModelBundle
    from rope_passes.lint import lint_bundle
    from rope_passes.passes.total_seq_on_gpu import BF16_GQA_NOTE

    model = _bf16_gqa_model(ir.DataType.BFLOAT16)
    before = [n.op_type for n in model.graph]
    bundle = ModelBundle(model=model, model_path=tmp_path / "model.onnx")
    report = run_pipeline(bundle, make_plan(passes=["total-seq-on-gpu", "narrow-int64"]))
    for p in report.passes:
        notes = [f for f in p.findings if f.outcome is Outcome.NOTE]
        assert len(notes) == 1 and notes[0].reason == BF16_GQA_NOTE and notes[0].place == "gqa", p.findings
        assert not p.modified and p.status.startswith("not matched: GroupQueryAttention is bfloat16"), p.status
    assert [n.op_type for n in bundle.model.graph] == before
    found = [d for d in lint_bundle(bundle) if d.code == "RP207"]
    assert len(found) == 1 and str(found[0].severity) == "note" and found[0].target == "gqa"
    fp32 = ModelBundle(model=_bf16_gqa_model(ir.DataType.FLOAT), model_path=tmp_path / "model.onnx")
    assert not [d for d in lint_bundle(fp32) if d.code == "RP207"]
    assert run_pipeline(fp32, make_plan(passes=["total-seq-on-gpu"])).passes[0].status == "rewritten 1"
