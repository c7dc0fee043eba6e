"""Issue 20: ``check`` varies what callers vary. Wrong rewrites of corpus graphs, each wrong only where one kind of
caller goes (a batch, a left-padded batch, a prompt over 8 tokens, a multi-token call after a past, token ids 0-3, an
fp16 table row off by 1 %, the CPU EP only), are each confirmed different by an independent onnxruntime CPU run of
both graphs (feeds built here, not by the checker), and ``check`` returns 1 on each, naming the schedule (or the
table row) that differs. ``check --budget`` shrinks a difference it draws to a minimal schedule whose command line
reruns it (exit 1).

Budget (2 cores): ~2 min.
"""

from __future__ import annotations

import dataclasses
import json
import shlex

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
from _utils import graph_const as _const
from _utils import graph_dim as _dim
from _utils import graph_op as _op
from conftest import GENAI

from rope_passes.check.core import EQUIVALENT, NOT_EQUIVALENT, check
from rope_passes.check.schedules import (
    LEFT,
    RIGHT,
    GraphFacts,
    Schedule,
    default_schedules,
    fits,
    parse,
    random_schedule,
    runs_on,
    shrink,
)
from rope_passes.cli import main
from rope_passes.io import load_bundle, save_bundle

pytestmark = [pytest.mark.corpus, pytest.mark.webgpu]

FP32 = "current/llama/cpu_fp32"
FP16 = "current/llama/webgpu_fp16"


# ---------------------------------------------------------------- wrong rewrites


def logits_plus_half_when(condition):
    """logits + 0.5 where ``condition(graph, inputs)`` (a bool scalar) holds: wrong for that caller only."""

    def edit(model: ir.Model, _config) -> None:
        g = model.graph
        inputs = {v.name: v for v in g.inputs}
        out = next(v for v in g.outputs if v.name == "logits")
        out.name = "logits_before"
        dtype = out.dtype
        cond = condition(g, inputs)
        bump = _op(g, "Mul", _op(g, "Cast", cond, to=dtype), _const(g, np.array(0.5, dtype.numpy())))
        new = _op(g, "Add", out, bump)
        new.name = "logits"
        new.dtype, new.shape = dtype, out.shape
        g.outputs[[v.name for v in g.outputs].index("logits_before")] = new

    return edit


def batch_over_1(g, inputs):
    return _op(g, "Greater", _dim(g, inputs["input_ids"], 0), _const(g, np.int64(1)))


def left_padded(g, inputs):
    """Some row's first mask column is 0: left padding (a right-padded row starts with 1)."""
    first = _op(g, "Slice", _op(g, "Cast", inputs["attention_mask"], to=ir.DataType.FLOAT),
                _const(g, np.array([0], np.int64)), _const(g, np.array([1], np.int64)),
                _const(g, np.array([1], np.int64)))
    return _op(g, "Less", _op(g, "ReduceMin", first, keepdims=0), _const(g, np.float32(0.5)))


def prompt_over_8(g, inputs):
    return _op(g, "Greater", _dim(g, inputs["input_ids"], 1), _const(g, np.int64(8)))


def multi_token_after_past(g, inputs):
    return _op(g, "And", _op(g, "Greater", _dim(g, inputs["input_ids"], 1), _const(g, np.int64(1))),
               _op(g, "Greater", _dim(g, inputs["past_key_values.0.key"], 2), _const(g, np.int64(0))))


def right_padded(g, inputs):
    """Some row's last mask column is 0: right padding (a left-padded row ends with 1)."""
    last = _op(g, "Slice", _op(g, "Cast", inputs["attention_mask"], to=ir.DataType.FLOAT),
               _const(g, np.array([-1], np.int64)), _const(g, np.array([2**31], np.int64)),
               _const(g, np.array([1], np.int64)))
    return _op(g, "Less", _op(g, "ReduceMin", last, keepdims=0), _const(g, np.float32(0.5)))


def batch_is_2(g, inputs):
    """Exactly two rows (the independent set's case: batches of 1 and 3 passed it)."""
    return _op(g, "Equal", _dim(g, inputs["input_ids"], 0), _const(g, np.int64(2)))


def batch_over_3_multi_token(g, inputs):
    """A batch of at least 4 rows in a multi-token call (red team 26: passed every schedule of 1-3 rows)."""
    return _op(g, "And", _op(g, "Greater", _dim(g, inputs["input_ids"], 0), _const(g, np.int64(3))),
               _op(g, "Greater", _dim(g, inputs["input_ids"], 1), _const(g, np.int64(1))))


def call_over_8_after_past(g, inputs):
    """A call of more than 8 tokens after a past: a chat's second turn (red team 26: chunked prefills stop at 8)."""
    return _op(g, "And", _op(g, "Greater", _dim(g, inputs["input_ids"], 1), _const(g, np.int64(8))),
               _op(g, "Greater", _dim(g, inputs["past_key_values.0.key"], 2), _const(g, np.int64(0))))


def past_is_12(g, inputs):
    """One decode step at past 12 only (the 5th step after an 8-token prompt: the decode stopped at past 11)."""
    return _op(g, "Equal", _dim(g, inputs["past_key_values.0.key"], 2), _const(g, np.int64(12)))


def id_496(g, inputs):
    """Some token is id 496: neither a vocabulary edge nor a likely random draw."""
    hit = _op(g, "Equal", inputs["input_ids"], _const(g, np.int64(496)))
    return _op(g, "Greater", _op(g, "ReduceMax", _op(g, "Cast", hit, to=ir.DataType.INT64), keepdims=0),
               _const(g, np.int64(0)))


def logits_plus_half_on_padded_rows(model: ir.Model, _config) -> None:
    """logits + 0.5 on the rows whose attention mask has a 0 (padded rows), their real tokens included (the
    independent set's case: the checker left such rows out wherever the runtime computes them unlike each row
    alone, whatever the rewrite)."""
    g = model.graph
    inputs = {v.name: v for v in g.inputs}
    out = next(v for v in g.outputs if v.name == "logits")
    out.name = "logits_before"
    dtype = out.dtype
    lowest = _op(g, "ReduceMin", inputs["attention_mask"], _const(g, np.array([1], np.int64)), keepdims=1)  # [B, 1]
    padded = _op(g, "Cast", _op(g, "Equal", lowest, _const(g, np.int64(0))), to=dtype)
    bump = _op(g, "Mul", _op(g, "Unsqueeze", padded, _const(g, np.array([2], np.int64))),
               _const(g, np.array(0.5, dtype.numpy())))  # [B, 1, 1]
    new = _op(g, "Add", out, bump)
    new.name = "logits"
    new.dtype, new.shape = dtype, out.shape
    g.outputs[[v.name for v in g.outputs].index("logits_before")] = new


def embedding_rows_0_3(model: ir.Model, _config) -> None:
    """Token ids 0..3 embed differently (special tokens sit there)."""
    value = model.graph.initializers["model.embed_tokens.weight"]
    table = value.const_value.numpy().copy()
    table[:4] += 0.05
    value.const_value = ir.tensor(table, name=value.name)


FP16_ROW = 100


def cos_row_one_percent(model: ir.Model, _config) -> None:
    """One fp16 cos_cache row 1 % larger: far under the end-to-end fp16 tolerance (atol 0.1)."""
    value = model.graph.initializers["cos_cache"]
    table = value.const_value.numpy().copy()
    table[FP16_ROW] = (table[FP16_ROW].astype(np.float32) * 1.01).astype(table.dtype)
    value.const_value = ir.tensor(table, name=value.name)


def gqa_position_ids_zero(model: ir.Model, _config) -> None:
    """GroupQueryAttention fed position_ids of zeros: WebGPU ignores them (position = seqlens_k + 1 - S + s), the
    CPU EP rotates a decode step's token at them: right on WebGPU, wrong on CPU."""
    g = model.graph
    ids = next(v for v in g.inputs if v.name == "input_ids")
    zeros = _op(g, "Mul", ids, _const(g, np.int64(0)))  # [B, S] int64 zeros
    for node in list(g):
        if node.op_type == "GroupQueryAttention":
            node.replace_input_with(9, zeros)
    g.sort()


def mutate(src: str, dst, edit) -> str:
    bundle = load_bundle(GENAI / src)
    edit(bundle.model, bundle.genai_config)
    save_bundle(bundle, dst)
    return str(dst)


# ---------------------------------------------------------------- an independent CPU run (not the checker's feeds)


def cpu_run(model: str, ids, mask, past_len=0, positions=None, seed=0):
    """One call on onnxruntime's CPU EP: ``ids`` [B, S], ``mask`` [B, past+S], a random past (the same for both
    graphs at a seed); every output."""
    sess = ort.InferenceSession(f"{model}/model.onnx", providers=["CPUExecutionProvider"])
    ids, mask = np.asarray(ids, np.int64), np.asarray(mask, np.int64)
    rng = np.random.RandomState(seed)
    feeds = {"input_ids": ids, "attention_mask": mask}
    for i in sess.get_inputs():
        if i.name.startswith("past_key_values."):
            dtype = np.float16 if "float16" in i.type else np.float32
            feeds[i.name] = rng.standard_normal((ids.shape[0], i.shape[1], past_len, 32)).astype(dtype)
        elif i.name == "position_ids":
            feeds[i.name] = positions
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def max_diff(a: dict, b: dict, mask) -> float:
    """Largest difference of what a caller reads: logits at the real new tokens, present.* at real positions
    (GroupQueryAttention on CPU leaves padding positions uninitialised: they differ run to run)."""
    mask = np.asarray(mask, bool)
    out = 0.0
    for n in a:
        x, y = a[n].astype(np.float64), b[n].astype(np.float64)
        if n == "logits":
            real = mask[:, -x.shape[1]:]
            x, y = x[real], y[real]
        elif x.shape[2] == mask.shape[1]:
            x, y = np.moveaxis(x, 2, 1)[mask], np.moveaxis(y, 2, 1)[mask]
        out = max(out, float(np.abs(x - y).max()))
    return out


#: name -> (base, edit, the call that shows it [ids, mask, past], the call that must not, the schedules that may
#: name it in the report)
CASES = {
    "batch>1": (FP32, logits_plus_half_when(batch_over_1),
                ([[5, 6], [7, 8]], [[1, 1], [1, 1]], 0), ([[5, 6]], [[1, 1]], 0),
                {"left-padded-batch", "right-padded-batch"}),
    "left-padded": (FP32, logits_plus_half_when(left_padded),
                    ([[0, 6], [7, 8]], [[0, 1], [1, 1]], 0), ([[5, 6], [7, 0]], [[1, 1], [1, 0]], 0),
                    {"left-padded-batch"}),
    "prompt>8": (FP32, logits_plus_half_when(prompt_over_8),
                 ([list(range(10, 19))], [[1] * 9], 0), ([list(range(10, 18))], [[1] * 8], 0),
                 {"long-prompt"}),
    "multi-token-after-past": (FP32, logits_plus_half_when(multi_token_after_past),
                               ([[5, 6]], [[1] * 5], 3), ([[5]], [[1] * 4], 3),
                               {"one-token-prompt", "long-prompt", "long-prompt-chunked"}),
    "batch>=4": (FP32, logits_plus_half_when(batch_over_3_multi_token),
                 ([[5, 6]] * 4, [[1, 1]] * 4, 0), ([[5, 6]] * 3, [[1, 1]] * 3, 0), {"batch-rows"}),
    "call>8-after-past": (FP32, logits_plus_half_when(call_over_8_after_past),
                          ([list(range(10, 19))], [[1] * 12], 3), ([list(range(10, 18))], [[1] * 11], 3),
                          {"second-turn"}),
    "ids-0-3": (FP32, embedding_rows_0_3, ([[0, 9]], [[1, 1]], 0), ([[4, 9]], [[1, 1]], 0),
                {"vocabulary-edges"}),
    "batch==2": (FP32, logits_plus_half_when(batch_is_2),
                 ([[5, 6], [7, 8]], [[1, 1], [1, 1]], 0), ([[5, 6]], [[1, 1]], 0), {"two-rows"}),
    "past==12": (FP32, logits_plus_half_when(past_is_12), ([[5]], [[1] * 13], 12), ([[5]], [[1] * 12], 11),
                 {"long-decode"}),
    "id==496": (FP32, logits_plus_half_when(id_496), ([[496, 9]], [[1, 1]], 0), ([[495, 9]], [[1, 1]], 0),
                {"every-id"}),
    "padded-rows": (FP32, logits_plus_half_on_padded_rows,
                    ([[0, 6], [7, 8]], [[0, 1], [1, 1]], 0), ([[5, 6], [7, 8]], [[1, 1], [1, 1]], 0),
                    {"left-padded-batch"}),
    "right-padded": (FP32, logits_plus_half_when(right_padded),  # a do_rotary=1 graph: the CPU EP's schedule
                     ([[5, 6], [7, 0]], [[1, 1], [1, 0]], 0), ([[5, 6], [7, 8]], [[1, 1], [1, 1]], 0),
                     {"right-padded-batch"}),
    "cpu-only": (FP32, gqa_position_ids_zero, ([[5]], [[1] * 5], 4), ([[5, 6, 7]], [[1] * 3], 0), None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_wrong_only_where_one_caller_goes(case, tmp_path):
    base, edit, shows, hides, named_by = CASES[case]
    wrong = mutate(base, tmp_path / "wrong", edit)
    orig = str(GENAI / base)
    # independent: both graphs on onnxruntime's CPU EP, feeds built here
    assert max_diff(cpu_run(wrong, *shows), cpu_run(orig, *shows), shows[1]) > 0.04, case
    assert max_diff(cpu_run(wrong, *hides), cpu_run(orig, *hides), hides[1]) == 0, case  # and only there
    report = check(orig, wrong, isolate=False, sweep=0)
    assert report.verdict == NOT_EQUIVALENT and report.exit_code == 1, report.to_json()[-3000:]
    found = report.first_schedule_failure
    assert found is not None, report.first_differences()
    comparison, diff = found
    data = json.loads(report.to_json())
    named = {s["name"]: s for s in data["schedule"]["schedules"]}
    assert diff.schedule in named and data["first_differences"]
    call = named[diff.schedule]["calls"][diff.step]  # the call that differs, spelled out
    assert call["call"] == diff.step and call["batch"] == len(call["ids"]) and call["tokens"] == len(call["ids"][0])
    assert {"past", "lengths", "positions"} <= set(call)
    assert any(f"schedule {diff.schedule}:" in line and "rerun: --schedule" in line
               for line in data["first_differences"])
    if named_by is not None:
        assert diff.schedule in named_by, (diff.schedule, comparison.name)
    else:  # right on WebGPU: only the CPU run of the rewritten graph shows it
        assert comparison.actual == "rewritten@cpu" and comparison.reference == "original@cpu"
        web = report.comparison("rewritten@webgpu", "original@webgpu", "schedule")
        assert web is not None and web.ok
        decode = report.comparison("rewritten@webgpu", "original@webgpu")
        assert decode is not None and decode.ok


def test_fp16_table_row_one_percent(tmp_path):
    """1 % on one fp16 cos row: end to end that is under the fp16 tolerance; the table comparison (fp16 ulp) names
    the row, and the CPU run confirms the graphs differ there."""
    wrong = mutate(FP16, tmp_path / "wrong", cos_row_one_percent)
    orig = str(GENAI / FP16)
    p = FP16_ROW
    a = cpu_run(wrong, [[9]], [[1] * (p + 1)], past_len=p)
    b = cpu_run(orig, [[9]], [[1] * (p + 1)], past_len=p)
    key = "present.0.key"
    assert np.abs(a[key][:, :, p].astype(np.float32) - b[key][:, :, p].astype(np.float32)).max() > 0
    assert max_diff(cpu_run(wrong, [[9]], [[1] * p], past_len=p - 1),
                    cpu_run(orig, [[9]], [[1] * p], past_len=p - 1), [[1] * p]) == 0  # row p - 1: the same
    report = check(orig, wrong, isolate=False, sweep=0)
    assert report.verdict == NOT_EQUIVALENT
    assert report.tables is not None and not report.tables.ok
    first = report.tables.diffs[0]
    assert first.position == p, report.tables.summary()
    assert any(f"position {p}" in line for line in report.first_differences())


def qkv_row_one_percent(model: ir.Model, _config) -> None:
    """One row of an fp16 weight a RoPE rewrite could touch (the packed Q/K/V projection) 1 % larger."""
    value = model.graph.initializers["model.layers.0.attn.qkv_proj.MatMul.weight"]
    table = value.const_value.numpy().copy()
    table[5] = (table[5].astype(np.float32) * 1.01).astype(table.dtype)
    value.const_value = ir.tensor(table, name=value.name)


def test_fp16_weight_one_percent(tmp_path):
    """1 % on one fp16 weight row moves the logits under the fp16 tolerance (measured by the independent CPU run):
    the constants both graphs keep under one name are compared at 1 ulp of their type, and name it."""
    wrong = mutate(FP16, tmp_path / "wrong", qkv_row_one_percent)
    orig = str(GENAI / FP16)
    ids, mask = [[5, 9, 17, 300]], [[1] * 4]
    moved = max_diff(cpu_run(wrong, ids, mask), cpu_run(orig, ids, mask), mask)
    assert 0 < moved < 0.1  # different, and within the end-to-end fp16 atol
    report = check(orig, wrong, isolate=False, sweep=0)
    assert report.verdict == NOT_EQUIVALENT
    constants = report.comparison("rewritten", "original", "constants")
    assert constants is not None and constants.counts and not constants.ok
    assert [d.output for d in constants.diffs if not d.ok] == ["model.layers.0.attn.qkv_proj.MatMul.weight"]
    assert any(line.startswith("constant model.layers.0.attn.qkv_proj.MatMul.weight: ")
               for line in report.first_differences())


def qkv_one_percent_node(model: ir.Model, _config) -> None:
    """Layer 1's packed Q/K/V times 1.01 through a Mul node: no stored constant changes (independent set)."""
    g = model.graph
    gqa = [n for n in g if n.op_type == "GroupQueryAttention"][1]
    qkv = gqa.inputs[0]
    scaled = ir.node("Mul", [qkv, ir.Value(name="rt_101", const_value=ir.tensor(np.array(1.01, np.float16)))])
    g.register_initializer(scaled.inputs[1])
    g.insert_before(gqa, scaled)
    scaled.outputs[0].dtype, scaled.outputs[0].shape = qkv.dtype, qkv.shape
    gqa.replace_input_with(0, scaled.outputs[0])


def test_fp16_one_percent_inside_a_layer(tmp_path):
    """1 % on one layer's Q/K/V (a node, no constant changed) moves fp16 logits by ~0.03: under the end-to-end fp16
    tolerance (0.1), which the independent set's case passed. The CPU EP's two graphs (same runtime, fp32
    accumulation) differ by at most 0.0049 on a correct rewrite of any corpus folder: compared at 0.02 + 0.4 %."""
    wrong = mutate(FP16, tmp_path / "wrong", qkv_one_percent_node)
    orig = str(GENAI / FP16)
    ids, mask = [[5, 9, 17, 300]], [[1] * 4]
    moved = max_diff(cpu_run(wrong, ids, mask), cpu_run(orig, ids, mask), mask)
    assert 0.01 < moved < 0.1, moved  # different (independent run), and within the end-to-end fp16 atol
    report = check(orig, wrong, isolate=False, sweep=0)
    assert report.verdict == NOT_EQUIVALENT, report.first_differences()
    failing = [c for c in report.comparisons if c.counts and c.status == "compared" and not c.ok]
    assert failing and all(c.actual == "rewritten@cpu" and c.reference == "original@cpu" for c in failing)


def test_correct_rewrite_still_passes(tmp_path):
    """The identical graph and a copy saved through the bundle are equivalent with every schedule."""
    same = mutate(FP16, tmp_path / "same", lambda m, c: None)
    report = check(str(GENAI / FP16), same, isolate=False, sweep=0)
    assert report.verdict == EQUIVALENT, report.first_differences()
    kinds = {(c.actual, c.reference) for c in report.comparisons if c.kind == "schedule" and c.status == "compared"}
    assert kinds == {("rewritten@webgpu", "original@webgpu"), ("rewritten@cpu", "original@cpu")}
    assert "schedules:" in report.reference
    constants = report.comparison("rewritten", "original", "constants")
    assert constants is not None and constants.ok and not constants.counts  # equal constants vouch for nothing


# ---------------------------------------------------------------- schedules as data


def test_schedule_calls_pad_as_genai():
    """Left padding: mask 0 and position 0 at padding, 0.. over each row's real tokens, every row going on after."""
    s = Schedule("s", (3, 1), ((5, 6, 7, 8, 9), (4, 1, 2)), LEFT, then=(1, 1), pad=0)
    calls = list(s.calls())
    assert [c.tokens for c in calls] == [3, 1, 1] and [c.past for c in calls] == [0, 3, 4]
    assert calls[0].ids.tolist() == [[5, 6, 7], [0, 0, 4]]
    assert calls[0].mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert calls[0].positions.tolist() == [[0, 1, 2], [0, 0, 0]]
    assert calls[1].positions.tolist() == [[3], [1]] and calls[2].positions.tolist() == [[4], [2]]
    assert calls[2].mask.tolist() == [[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]
    r = Schedule("r", (3, 1), ((5, 6, 7), (4,)), RIGHT)
    (call,) = r.calls()
    assert call.ids.tolist() == [[5, 6, 7], [4, 0, 0]] and call.positions.tolist() == [[0, 1, 2], [0, 0, 0]]
    assert parse(s.text(), "s") == s and parse(r.text(), "r") == r


def test_no_right_padded_batch_where_the_graph_rotates_inside_groupqueryattention():
    """GroupQueryAttention do_rotary=1 derives positions from seqlens_k as left padding lays them out on WebGPU: a
    right-padded batch is not a call such a graph takes there (onnxruntime-genai pads left), in the default set or
    drawn at random. The CPU EP's reads right padding as it is laid out: the default set runs it there (the
    independent set's "position + 1 only for a right-padded batch" on a do_rotary=1 graph passed before)."""
    facts = GraphFacts(vocab=500, pad=0, max_call=8, context=256, no_right_padding="fused rotary")
    right = next(s for s in default_schedules(facts) if s.name == "right-padded-batch")
    assert not runs_on(right, "webgpu", facts) and runs_on(right, "cpu", facts)  # CPU GQA reads right padding
    assert runs_on(right, "webgpu", dataclasses.replace(facts, no_right_padding=None))
    rng = np.random.RandomState(3)
    drawn = [random_schedule(rng, facts) for _ in range(200)]
    assert all(s.padding != RIGHT for s in drawn) and any(s.batch > 1 for s in drawn)


def test_default_schedules_cover_the_callers():
    facts = GraphFacts(vocab=500, pad=0, switches=(32,), max_call=8, context=256)
    sched = {s.name: s for s in default_schedules(facts)}
    assert set(sched) == {"vocabulary-edges", "one-token-prompt", "left-padded-batch", "right-padded-batch",
                          "two-rows", "long-decode", "every-id", "long-prompt", "long-prompt-chunked"}
    assert {i for row in sched["every-id"].ids for i in row} == set(range(500))  # every id
    assert fits(sched["every-id"], 8) and fits(sched["long-decode"], 8)  # single tokens: WebGPU runs them
    decode = sched["long-decode"]
    assert decode.lengths == (1,) and decode.then == (1,) * 63  # a step at every position 1..63
    # where the sweep takes every position: a decode step at every one, its ids a fifth at the vocabulary's edges
    dense = {s.name: s for s in default_schedules(dataclasses.replace(facts, decode_to=256))}["long-decode"]
    assert dense.then == (1,) * 255 and {497, 498, 499} <= set(dense.ids[0][70:240])
    assert sched["two-rows"].batch == 2
    assert "every-id" not in {s.name for s in default_schedules(GraphFacts(vocab=32000, max_call=8))}
    ids = {i for s in sched.values() for row in s.ids for i in row}
    assert {0, 1, 2, 3, 499} <= ids and max(ids) < 500
    assert sched["one-token-prompt"].lengths == (1,) and max(sched["one-token-prompt"].then) > 1
    batch = sched["left-padded-batch"]
    assert batch.batch >= 2 and len(set(batch.lengths)) == batch.batch and batch.then
    assert sched["long-prompt"].width > 32 + 1 and sched["long-prompt"].longest_call > 8
    assert sched["long-prompt-chunked"].longest_call <= 8  # WebGPU on a software adapter
    assert all(s.width + sum(s.then) <= 256 for s in sched.values())


def test_shrink_finds_the_smallest_that_differs():
    facts = GraphFacts(vocab=500, max_call=8, context=256)
    rng = np.random.RandomState(3)
    s = next(s for s in (random_schedule(rng, facts) for _ in range(100)) if s.batch >= 3 and s.then)
    small, tries = shrink(s, lambda c: c.batch > 1)
    assert small.size == (2, 2, 1) and tries > 0  # two rows of one token, one call
    small, _ = shrink(s, lambda c: any(i < 4 for row in c.ids for i in row))
    assert small.size == (1, 1, 1) and small.ids[0][0] < 4


# ---------------------------------------------------------------- --budget


def test_budget_shrinks_and_prints_a_command_that_reruns_it(tmp_path, capsys):
    wrong = mutate(FP32, tmp_path / "wrong", logits_plus_half_when(batch_over_1))
    orig = str(GENAI / FP32)
    report = check(orig, wrong, isolate=False, sweep=0, tables=False, schedules=[], budget=60, seed=7)
    assert report.verdict == NOT_EQUIVALENT
    ex = report.exploration
    assert ex is not None and ex.found is not None and ex.shrunk is not None
    assert ex.shrunk.size == (2, 2, 1), ex.shrunk.summary()  # batch 2, one token each, one call
    argv = shlex.split(ex.command)
    assert argv[:4] == ["rope-passes", "check", orig, wrong] and "--schedule" in argv
    assert main([*argv[1:], "--in-process", "--no-sweep", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["first_differences"] and any("schedule given-0" in line for line in out["first_differences"])
    # the unchanged graph: the same budget finds nothing
    same = check(orig, orig, isolate=False, sweep=0, tables=False, schedules=[], budget=5, seed=7)
    assert same.verdict == EQUIVALENT and same.exploration.drawn > 0 and same.exploration.found is None
