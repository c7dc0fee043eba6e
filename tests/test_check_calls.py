"""Issue 33: the calls ``check`` did not make. Each probe is a deliberately wrong rewrite of a corpus graph, wrong only
where one call pattern goes; each is confirmed different by an independent onnxruntime CPU run of both graphs (feeds
built here, not by the checker) and equal on the plain call beside it; the default ``check`` says "not equivalent"
naming the schedule or the sweep position that shows it:

* a second conversation on onnxruntime-genai's shared KV buffers (past length 0 over an earlier conversation's rows),
  also under graph capture (the captured run against the same steps uncaptured); named by that trigger, not by rows
  a runtime left past the sequence (WebGPU's separate present arrays hold another call's rows there, which no client
  reads: the schedules feed the next call genai's buffer, the present's rows below the tokens so far written in);
* one row of a batch of four rows of different lengths (left and right padding);
* one exact past length of a single-token decode (137, which no sweep position, decode or schedule reached).

On the checker before issue 33 (3533bd0) the default check said "equivalent" on all three of ``cpu_fp32``; on
``webgpu_fp16_graph`` the captured run passed and the verdict came by accident (below). ``present.*`` rows past the sequence (no client reads them) decide nothing either way.
Budget (2 cores): ~1.5 min.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from _utils import graph_const as _const
from _utils import graph_dim as _dim
from _utils import graph_op as _op
from conftest import GENAI
from test_check_clients import _ids, _mutate, logits_plus_half_when, witness

from rope_passes.check.compare import Comparison, Tolerance
from rope_passes.check.core import NOT_EQUIVALENT, check
from rope_passes.check.evidence.schedules import compare_calls
from rope_passes.check.schedules import SHARED, Schedule

pytestmark = [pytest.mark.corpus, pytest.mark.webgpu]

LLAMA = GENAI / "current/llama/cpu_fp32"  # fp32, past_present_share_buffer, max_length 256
LLAMA_GRAPH = GENAI / "current/llama/webgpu_fp16_graph"  # the capture loop's model


def stale_rows(g, inputs):
    """The past buffer holds non-zero rows at or past the mask's tokens: an earlier conversation's. Elementwise ops
    and reductions only (no Shape: every node stays on WebGPU, so the graph still takes capture)."""
    f32 = ir.DataType.FLOAT
    past = _op(g, "Cast", inputs["past_key_values.0.key"], to=f32)
    rows = _op(g, "CumSum", _op(g, "Add", _op(g, "Mul", past, _const(g, np.float32(0))), _const(g, np.float32(1))),
               _const(g, np.int64(2)))  # 1, 2, 3, ... along the buffer's rows
    total = _op(g, "ReduceSum", _op(g, "Cast", inputs["attention_mask"], to=f32), keepdims=0)
    stale = _op(g, "Cast", _op(g, "Greater", rows, total), to=f32)
    held = _op(g, "ReduceSum", _op(g, "Mul", _op(g, "Abs", past), stale), keepdims=0)
    return _op(g, "Greater", held, _const(g, np.float32(0)))


def row3_of_four_lengths(model: ir.Model) -> None:
    """logits + 0.5 on row 3 only, only when a batch has at least 4 rows whose mask sums differ."""
    g = model.graph
    inputs = {v.name: v for v in g.inputs}
    out = next(v for v in g.outputs if v.name == "logits")
    out.name = "logits_before"
    mask = inputs["attention_mask"]
    sums = _op(g, "ReduceSum", mask, _const(g, np.array([1])), keepdims=0)
    uneven = _op(g, "Greater", _op(g, "ReduceMax", sums, keepdims=0), _op(g, "ReduceMin", sums, keepdims=0))
    four = _op(g, "GreaterOrEqual", _dim(g, mask, 0), _const(g, np.int64(4)))
    rows = _op(g, "Range", _const(g, np.int64(0)), _dim(g, mask, 0), _const(g, np.int64(1)))
    row3 = _op(g, "And", _op(g, "Equal", rows, _const(g, np.int64(3))), _op(g, "And", uneven, four))
    bump = _op(g, "Mul", _op(g, "Cast", row3, to=out.dtype), _const(g, np.array(0.5, out.dtype.numpy())))
    new = _op(g, "Add", out, _op(g, "Reshape", bump, _const(g, np.array([-1, 1, 1]))))
    new.name, new.dtype, new.shape = "logits", out.dtype, out.shape
    g.outputs[[v.name for v in g.outputs].index("logits_before")] = new


def total_138(g, inputs):
    single = _op(g, "Equal", _dim(g, inputs["input_ids"], 1), _const(g, np.int64(1)))
    return _op(g, "And", single, _op(g, "Equal", _dim(g, inputs["attention_mask"], 1), _const(g, np.int64(138))))


def _failing(report) -> set[str]:
    return {d.schedule or f"{c.kind} {d.step}" for c in report.comparisons if c.counts and c.status == "compared"
            for d in c.diffs if not d.ok}


def _row_diffs(wrong: str, orig: str, lengths, seed=5) -> list[float]:
    """Per row, the largest logits difference over its real tokens of a right-padded batch's prompt on the CPU EP
    (which computes right-padded rows as each alone; left-padded ones it reads uninitialised memory for)."""
    mask = np.array([[1] * n + [0] * (max(lengths) - n) for n in lengths], np.int64)
    a, b = _batch_logits(wrong, mask, seed), _batch_logits(orig, mask, seed)
    return [float(np.abs(a[r, :n] - b[r, :n]).max()) for r, n in enumerate(lengths)]


def _batch_logits(model: str, mask: np.ndarray, seed: int) -> np.ndarray:
    import onnxruntime as ort

    ids = np.random.RandomState(seed).randint(4, 200, mask.shape).astype(np.int64)
    lengths = mask.sum(axis=1)
    sess = ort.InferenceSession(f"{model}/model.onnx", providers=["CPUExecutionProvider"])
    feeds = {"input_ids": ids, "attention_mask": mask}
    for i in sess.get_inputs():
        if i.name.startswith("past_key_values."):
            head = i.shape[3] if isinstance(i.shape[3], int) else 32  # the corpus llama's head size (as cpu_call)
            feeds[i.name] = np.zeros((len(lengths), i.shape[1], 0, head), np.float32)
    return sess.run(["logits"], feeds)[0]


def test_second_conversation_on_shared_buffers(tmp_path):
    wrong = _mutate(LLAMA, tmp_path / "wrong", logits_plus_half_when(stale_rows))
    stale = dict(ids=_ids(3), mask=[[1] * 3], past_rows=256, past_real=12)  # a new prompt over 12 stale rows
    assert witness(wrong, str(LLAMA), stale) == pytest.approx(0.5, abs=1e-5)
    assert witness(wrong, str(LLAMA), dict(ids=_ids(3), mask=[[1] * 3], past_rows=256)) == 0  # fresh buffers
    assert witness(wrong, str(LLAMA), dict(ids=_ids(1), mask=[[1] * 5], past_rows=4, past_real=4)) == 0  # a decode
    report = check(LLAMA, wrong, isolate=False)
    assert report.verdict == NOT_EQUIVALENT, (report.reason, report.notes)
    assert "genai-second-conversation" in _failing(report)
    assert "genai-shared-buffers" not in _failing(report)  # the first conversation on the same buffers is right


def test_second_conversation_under_graph_capture(tmp_path):
    wrong = _mutate(LLAMA_GRAPH, tmp_path / "wrong", logits_plus_half_when(stale_rows))
    # the capture loop's call: a max_length mask; stale rows in the buffer past the mask's tokens
    stale = dict(ids=_ids(8), mask=[[1] * 8 + [0] * 8], past_rows=16, past_real=16)
    assert witness(wrong, str(LLAMA_GRAPH), stale) > 0.4
    assert witness(wrong, str(LLAMA_GRAPH), dict(ids=_ids(8), mask=[[1] * 8 + [0] * 8], past_rows=16)) == 0
    report = check(LLAMA_GRAPH, wrong, graph_capture=True, isolate=False, sweep=0, tables=False)
    assert report.verdict == NOT_EQUIVALENT
    # named by its trigger, not by rows a runtime left past the sequence (before issue 33 the WebGPU run of
    # genai-shared-buffers fed WebGPU's present, rows of another call past the sequence, back as the next past)
    failing = _failing(report)
    assert {"genai-second-conversation", "genai-capture-second-conversation"} <= failing, failing
    assert not failing & {"genai-shared-buffers", "genai-capture-steps"}, failing
    capture = next(c for c in report.comparisons if c.actual == "rewritten@webgpu+capture")
    assert capture.counts and not capture.ok and capture.first_failure.step == 0, capture.first_failure
    uncaptured = next(c for c in report.comparisons if c.actual == "rewritten@webgpu" and c.kind == "decode"
                      and c.reference == "original@webgpu")
    assert uncaptured.ok  # the same steps on fresh buffers are right


def test_one_row_of_four_lengths(tmp_path):
    wrong = _mutate(LLAMA, tmp_path / "wrong", row3_of_four_lengths)
    np.testing.assert_allclose(_row_diffs(wrong, str(LLAMA), (7, 3, 5, 1)), [0, 0, 0, 0.5], atol=1e-5)
    for even in ((7, 3, 5), (4, 4, 4, 4)):  # three rows of different lengths, four equal rows: the same function
        assert max(_row_diffs(wrong, str(LLAMA), even)) == 0
    report = check(LLAMA, wrong, isolate=False)
    assert report.verdict == NOT_EQUIVALENT
    assert {"left-padded-4", "right-padded-4"} <= _failing(report), _failing(report)


def test_one_exact_past_length(tmp_path):
    wrong = _mutate(LLAMA, tmp_path / "wrong", logits_plus_half_when(total_138))
    assert witness(wrong, str(LLAMA), dict(ids=_ids(1), mask=[[1] * 138], past_rows=137, past_real=137)) > 0.4
    for past in (136, 138):
        assert witness(wrong, str(LLAMA), dict(ids=_ids(1), mask=[[1] * (past + 1)], past_rows=past,
                                              past_real=past)) == 0
    report = check(LLAMA, wrong, isolate=False)
    assert report.verdict == NOT_EQUIVALENT
    # the sweep's single step at position 137, the single-token decode that runs to the context's end where the
    # sweep takes every position (long-decode, 3250f0d), and the call grid's batched decode steps after a past of 137
    # (evidence/calls.py) pass total 138; nothing else does
    failing = _failing(report)
    assert {"sweep 137", "long-decode"} <= failing, failing
    grid = failing - {"sweep 137", "long-decode"}
    assert grid and all("1 token(s) after a random past of 137" in f for f in grid), grid
    assert report.sweep_positions == list(range(256))


def test_rows_past_the_sequence_decide_nothing():
    """``present.*`` of a shared buffer holds rows past the tokens so far (on WebGPU, with separate past and present
    arrays, rows another call left: a 5-token prompt after an 8-token call returns rows 5-7 non-zero). No client
    reads them: they decide nothing either way; a difference in a row the client reads does."""
    s = Schedule("s", (3,), ((5, 6, 7),), kv=SHARED, max_length=8)
    ref = np.random.RandomState(0).standard_normal((1, 2, 8, 4)).astype(np.float32)
    for rows, fails in ((slice(3, 8), False), (slice(2, 3), True), (slice(0, 1), True)):
        actual = ref.copy()
        actual[:, :, rows] += 1
        c = Comparison("a", "b", Tolerance(1e-4, 1e-4, "fp32"), True, kind="schedule")
        compare_calls(s, [{"present.0.key": actual}], [{"present.0.key": ref}], c)
        assert c.status == "compared" and (c.first_failure is not None) == fails, rows
        assert c.diffs[0].max_abs == pytest.approx(1.0 if fails else 0.0, abs=1e-6)  # fp32 rounding of x + 1
