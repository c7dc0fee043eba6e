"""Issue 33, red team 33's classes the default ``check`` still passed: calls real clients make that no schedule made.
Each probe is a deliberately wrong rewrite of a corpus graph, wrong only where one call pattern goes, confirmed by an
independent onnxruntime CPU run of both graphs (feeds built here, not by the checker) and equal on the call beside
it; ``check`` says "not equivalent" naming the schedule that sends that call:

* a batch of exactly 5 rows (``batch-5``: every batch size 1..8 is sent at least once);
* a 4-token call ending at total 252, near the context's end 256 (``near-256-calls-4+0``: calls of 2, 3 and 4 tokens
  end at every total near each threshold);
* a decode step after a right-padded prompt (a 0 between ones in the mask: ``right-padded-4`` then decode steps, as
  onnxruntime-genai appends a 1 to the prompt's mask);
* the capture loop's static mask from total 20 on (``genai-capture-steps`` and the captured decode reach total 64);
* a 2-token call ending at total 33 across Phi-3's LongRoPE switch (``near-32-calls-2+1`` on WebGPU past the
  software adapter's cap, where both graphs run the same attention kernels);
* a left-padded row of a batch where the rewrite folds the rotation into GroupQueryAttention (those rows were left
  out: the original does not compute them as each alone; now compared with its same batch or the row alone).

And a config that binds the KV cache wrong is "not equivalent" with that reason in the verdict's line
(``report.reason``), not an empty one. Budget (2 cores): ~5 min.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
from _utils import graph_const as _const
from _utils import graph_dim as _dim
from _utils import graph_op as _op
from conftest import GENAI
from test_check_clients import _mutate, logits_plus_half_when

from rope_passes.check.core import NOT_EQUIVALENT, check
from rope_passes.demo import build_tiny_decoder

LLAMA = GENAI / "current/llama/cpu_fp32"  # fp32, shared buffers of 256 rows, context 256
LLAMA_GRAPH = GENAI / "current/llama/webgpu_fp16_graph"  # the capture loop's model: total from the mask's sum


def _f32(g, v):
    return _op(g, "Cast", v, to=ir.DataType.FLOAT)


def three_triggers(g, inputs):
    """A batch of 5; a 4-token call ending at total 252; a mask with a 0 between ones (any row)."""
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    batch5 = _op(g, "Equal", _dim(g, ids, 0), _const(g, np.int64(5)))
    end252 = _op(g, "And", _op(g, "Equal", _dim(g, ids, 1), _const(g, np.int64(4))),
                 _op(g, "Equal", _dim(g, mask, 1), _const(g, np.int64(252))))
    m = _f32(g, mask)
    seen = _op(g, "CumSum", m, _const(g, np.int64(1)))  # ones so far per row
    total = _op(g, "ReduceSum", m, _const(g, np.array([1])), keepdims=1)
    middle = _op(g, "Mul", _op(g, "Mul", _f32(g, _op(g, "Equal", m, _const(g, np.float32(0)))),
                               _f32(g, _op(g, "Greater", seen, _const(g, np.float32(0))))),
                 _f32(g, _op(g, "Less", seen, total)))  # a 0 after a 1 and before the row's last 1
    gap = _op(g, "Greater", _op(g, "ReduceSum", middle, keepdims=0), _const(g, np.float32(0)))
    return _op(g, "Or", _op(g, "Or", batch5, end252), gap)


def static_mask_from_20(g, inputs):
    """The capture loop's mask (trailing zeros) once 20 tokens are in. Elementwise ops and reductions only (no Shape:
    every node stays on WebGPU, so the graph still takes capture)."""
    m = _f32(g, inputs["attention_mask"])
    total = _op(g, "ReduceSum", m, keepdims=0)
    width = _op(g, "ReduceSum", _op(g, "Add", _op(g, "Mul", m, _const(g, np.float32(0))), _const(g, np.float32(1))),
                keepdims=0)
    return _op(g, "And", _op(g, "Greater", width, total), _op(g, "GreaterOrEqual", total, _const(g, np.float32(20))))


def cpu_logits(model: str, ids, mask, past=0, past_rows=None, seed=0) -> np.ndarray:
    """One call on onnxruntime's CPU EP, any batch: ``ids`` [B, S], ``mask`` [B, M], past buffers of ``past_rows``
    rows (default ``past``) whose first ``past`` rows are random (the same at a seed for both graphs)."""
    sess = ort.InferenceSession(f"{model}/model.onnx", providers=["CPUExecutionProvider"])
    ids, mask = np.asarray(ids, np.int64), np.asarray(mask, np.int64)
    feeds = {"input_ids": ids, "attention_mask": mask}
    rng = np.random.RandomState(seed)
    config = json.loads((Path(model) / "genai_config.json").read_text())
    for i in sess.get_inputs():
        if i.name.startswith("past_key_values."):
            dtype = np.float16 if "float16" in i.type else np.float32
            heads, head = (d if isinstance(d, int) else config["model"]["decoder"][key]
                           for d, key in ((i.shape[1], "num_key_value_heads"), (i.shape[3], "head_size")))
            shape = (ids.shape[0], heads, past if past_rows is None else past_rows, head)
            buf = np.zeros(shape, dtype)
            buf[:, :, :past] = rng.standard_normal((*shape[:2], past, shape[3]))
            feeds[i.name] = buf
    return sess.run(["logits"], feeds)[0].astype(np.float64)


def _diff(wrong: str, orig: str, **call) -> float:
    return float(np.abs(cpu_logits(wrong, **call) - cpu_logits(orig, **call)).max())


def _failing(report) -> set[str]:
    return {d.schedule or f"{c.kind} {d.step}" for c in report.comparisons if c.counts and c.status == "compared"
            for d in c.diffs if not d.ok}


def _ids(b: int, n: int) -> list[list[int]]:
    return np.random.RandomState(3).randint(4, 200, (b, n)).tolist()


@pytest.mark.corpus
@pytest.mark.webgpu
def test_batch_of_five_calls_near_the_end_and_a_step_after_right_padding(tmp_path):
    wrong = _mutate(LLAMA, tmp_path / "wrong", logits_plus_half_when(three_triggers))
    orig = str(LLAMA)
    assert _diff(wrong, orig, ids=_ids(5, 3), mask=[[1] * 3] * 5) == pytest.approx(0.5, abs=1e-5)
    assert _diff(wrong, orig, ids=_ids(4, 3), mask=[[1] * 3] * 4) == 0  # a batch of 4
    assert _diff(wrong, orig, ids=_ids(1, 4), mask=[[1] * 252], past=248) == pytest.approx(0.5, abs=1e-5)
    assert _diff(wrong, orig, ids=_ids(1, 4), mask=[[1] * 251], past=247) == 0  # ending at 251
    assert _diff(wrong, orig, ids=_ids(1, 1), mask=[[1] * 5 + [0, 0, 1]], past=7) == pytest.approx(0.5, abs=1e-5)
    assert _diff(wrong, orig, ids=_ids(1, 1), mask=[[1] * 8], past=7) == 0  # a decode step, no padding
    report = check(LLAMA, wrong, isolate=False, sweep=0, tables=False)
    assert report.verdict == NOT_EQUIVALENT, (report.reason, report.notes)
    assert {"batch-5", "near-256-calls-4+0", "right-padded-4"} <= _failing(report), _failing(report)


@pytest.mark.corpus
@pytest.mark.webgpu
def test_capture_loop_steps_reach_total_64(tmp_path):
    wrong = _mutate(LLAMA_GRAPH, tmp_path / "wrong", logits_plus_half_when(static_mask_from_20))
    orig = str(LLAMA_GRAPH)
    step = dict(ids=_ids(1, 1), past=19, past_rows=256)
    assert _diff(wrong, orig, mask=[[1] * 20 + [0] * 236], **step) > 0.4
    assert _diff(wrong, orig, mask=[[1] * 20], ids=_ids(1, 1), past=19) == 0  # a growing mask
    assert _diff(wrong, orig, mask=[[1] * 12 + [0] * 244], ids=_ids(1, 1), past=11, past_rows=256) == 0  # total 12
    report = check(LLAMA_GRAPH, wrong, graph_capture=True, isolate=False, sweep=0, tables=False)
    assert report.verdict == NOT_EQUIVALENT, (report.reason, report.notes)
    failing = _failing(report)
    assert "genai-capture-steps" in failing, failing
    capture = next(c for c in report.comparisons if c.actual == "rewritten@webgpu+capture")
    steps = sorted({d.step for d in capture.diffs if not d.ok})
    assert capture.counts and steps and steps[0] >= 12, (capture.status, capture.reason, steps)


def two_tokens_to_33(g, inputs):
    return _op(g, "And", _op(g, "Equal", _dim(g, inputs["input_ids"], 1), _const(g, np.int64(2))),
               _op(g, "Equal", _dim(g, inputs["attention_mask"], 1), _const(g, np.int64(33))))


@pytest.mark.corpus
@pytest.mark.webgpu
def test_a_call_across_the_switch_past_the_adapters_cap(tmp_path):
    """Phi-3's concatenated-cache output (offset 32) wrong only on a 2-token call ending at total 33: its CPU
    comparison stops at the offset (the CPU EP has no offset) and a software adapter's WebGPU used to skip calls of
    several tokens past 8; with the same attention kernels on both graphs WebGPU takes them."""
    import rope_passes

    phi3 = GENAI / "current/phi3_mini_128k/cpu_fp32"
    concat = tmp_path / "concat"
    rope_passes.optimize(phi3, concat, preset="webgpu-graph", weights="copy")
    wrong = _mutate(concat, tmp_path / "wrong", logits_plus_half_when(two_tokens_to_33))
    assert _diff(wrong, str(concat), ids=_ids(1, 2), mask=[[1] * 33], past=31) == pytest.approx(0.5, abs=1e-5)
    assert _diff(wrong, str(concat), ids=_ids(1, 2), mask=[[1] * 34], past=32) == 0  # ending at 34
    report = check(phi3, wrong, isolate=False, sweep=0, tables=False)
    assert report.verdict == NOT_EQUIVALENT
    assert any(name.startswith("near-32-calls-2+") for name in _failing(report)), _failing(report)


def left_padded_row(g, inputs):
    """Per row: the mask starts with a 0 (a left-padded row of a batch), as ``[B, 1, 1]``."""
    first = _op(g, "Slice", inputs["attention_mask"], _const(g, np.array([0])), _const(g, np.array([1])),
                _const(g, np.array([1])))
    return _op(g, "Reshape", _op(g, "Equal", first, _const(g, np.int64(0))), _const(g, np.array([-1, 1, 1])))


@pytest.mark.corpus
@pytest.mark.webgpu
def test_padded_rows_of_a_fold_are_compared(tmp_path):
    """``optimize`` folds the rotation into GroupQueryAttention (do_rotary=1): the original does not compute a
    left-padded row as it computes that row alone (on CPU nor WebGPU), which used to leave every such row out. The
    client reads them: a rewrite wrong on them only (logits + 0.5 on a left-padded row) differs from the correct
    fold by 0.5 on the same batch (an independent CPU run), and ``check`` names the padded schedules."""
    import rope_passes

    fold = tmp_path / "fold"
    rope_passes.optimize(LLAMA, fold, preset="webgpu-graph", weights="copy")
    wrong = _mutate(fold, tmp_path / "wrong", logits_plus_half_when(left_padded_row))
    step = dict(ids=_ids(2, 1), mask=[[1] * 8, [0, 0, 0, 0, 1, 1, 1, 1]], past=7)  # a decode step (deterministic)
    rows = np.abs(cpu_logits(wrong, **step) - cpu_logits(str(fold), **step))
    assert rows[0].max() == 0 and rows[1].max() == pytest.approx(0.5, abs=1e-5)
    assert _diff(wrong, str(fold), ids=_ids(2, 1), mask=[[1] * 8] * 2, past=7) == 0  # no padding
    report = check(LLAMA, fold, isolate=False, sweep=0, tables=False)
    assert report.exit_code == 0, report.first_differences()  # the correct fold: every padded row agrees
    report = check(LLAMA, wrong, isolate=False, sweep=0, tables=False)
    assert report.verdict == NOT_EQUIVALENT
    assert {"left-padded-batch", "left-padded-4"} <= _failing(report), _failing(report)


def test_a_config_that_binds_the_cache_wrong_is_the_verdicts_reason(tmp_path):
    """genai binds its shared KV buffers by the names genai_config gives. An Identity before ``present.0.key`` is
    the same tensor by value (onnxruntime-genai 0.18's own loop, two conversations on shared buffers: bit-equal on
    the CPU EP, within 3.5e-6 on WebGPU, builder llama): equivalent. Swapping present_key_names and
    present_value_names leaves the graph computing the same (an independent CPU run: bit-equal) but binds each layer's
    key buffer as its value: "not equivalent", the reason the verdict's own line, not only a note."""
    demo = build_tiny_decoder(tmp_path / "demo")

    def identity_before_present(model: ir.Model) -> None:
        g = model.graph
        out = next(v for v in g.outputs if v.name == "present.0.key")
        out.name = "present.0.key_gqa"
        new = _op(g, "Identity", out)
        new.name, new.dtype, new.shape = "present.0.key", out.dtype, out.shape
        g.outputs[[v.name for v in g.outputs].index("present.0.key_gqa")] = new

    same = _mutate(demo, tmp_path / "identity", identity_before_present)
    for call in (dict(ids=_ids(1, 5), mask=[[1] * 5]), dict(ids=_ids(1, 1), mask=[[1] * 6], past=5)):
        assert _diff(same, str(demo), **call) == 0
    options = dict(ep="cpu", isolate=False, sweep=0, tables=False, schedules=[], calls=False)
    assert check(demo, same, **options).exit_code == 0
    swapped = Path(_mutate(demo, tmp_path / "swapped", lambda model: None))
    config = json.loads((swapped / "genai_config.json").read_text())
    names = config["model"]["decoder"]["outputs"]
    names["present_key_names"], names["present_value_names"] = names["present_value_names"], names["present_key_names"]
    (swapped / "genai_config.json").write_text(json.dumps(config))
    report = check(demo, swapped, **options)
    assert report.verdict == NOT_EQUIVALENT and report.exit_code == 1
    assert report.first_failure is None  # no comparison failed: the config is the reason
    assert report.reason.startswith("the rewritten genai_config.json does not describe its graph: present_key_names"), \
        report.reason
