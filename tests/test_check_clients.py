"""Issue 26: the default ``check`` sends what real clients send. Each probe of the issue is a deliberately wrong
rewrite of a corpus graph, wrong only where one client's call pattern goes; each is confirmed different by an
independent onnxruntime CPU run of both graphs (feeds built here, not by the checker) and equal on the plain call
next to it, and the default ``check`` (in process) says "not equivalent" naming the schedule that shows it:

* onnxruntime-genai's shared KV buffers (``past_present_share_buffer``: past of ``max_length`` rows);
* its capture loop's decode step (a ``max_length`` mask with trailing zeros after a non-empty past);
* totals 249-252 of a 256-token context;
* a multi-token call after a past that straddles the LongRoPE switch (past 30 + 4 tokens, switch at 32);
* ``position_ids`` ahead of the KV cache (an exporter graph that takes positions from its caller).

Before issue 26 the default check passed every one (exit 0). Budget (2 cores): ~2 min.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
from _utils import graph_const as _const
from _utils import graph_dim as _dim
from _utils import graph_op as _op
from conftest import GENAI, TORCH

from rope_passes.check.core import NOT_EQUIVALENT, check
from rope_passes.io import load_bundle, save_bundle

pytestmark = [pytest.mark.corpus, pytest.mark.webgpu]

LLAMA = "current/llama/cpu_fp32"  # fp32, past_present_share_buffer, total length from Shape(mask)
LLAMA_GRAPH = "current/llama/webgpu_fp16_graph"  # total length from the mask's sum: takes the capture loop's mask
PHI3 = "current/phi3_mini_128k/cpu_fp32"  # LongRoPE If(Greater(total, 32))


def logits_plus_when(bumps):
    """logits + ``delta`` where ``condition(graph, inputs)`` holds, for each ``(condition, delta)`` of ``bumps``."""

    def edit(model: ir.Model) -> None:
        g = model.graph
        inputs = {v.name: v for v in g.inputs}
        out = next(v for v in g.outputs if v.name == "logits")
        out.name = "logits_before"
        dtype = out.dtype
        new = out
        for condition, delta in bumps:
            bump = _op(g, "Mul", _op(g, "Cast", condition(g, inputs), to=dtype),
                       _const(g, np.array(delta, dtype.numpy())))
            new = _op(g, "Add", new, bump)
        new.name, new.dtype, new.shape = "logits", dtype, out.shape
        g.outputs[[v.name for v in g.outputs].index("logits_before")] = new

    return edit


def logits_plus_half_when(condition):
    return logits_plus_when([(condition, 0.5)])


def past_rows_not_past_length(g, inputs):
    """The past buffer's rows differ from the mask's past length: only on a shared max_length buffer."""
    past = _op(g, "Sub", _dim(g, inputs["attention_mask"], 1), _dim(g, inputs["input_ids"], 1))
    return _op(g, "Not", _op(g, "Equal", _dim(g, inputs["past_key_values.0.key"], 2), past))


def capture_decode_step(g, inputs):
    """A decode step whose mask has trailing zeros (the capture loop's max_length mask)."""
    mask = inputs["attention_mask"]
    total = _op(g, "ReduceSum", _op(g, "Cast", mask, to=ir.DataType.INT64), keepdims=0)
    return _op(g, "And", _op(g, "Greater", _dim(g, mask, 1), total),
               _op(g, "Equal", _dim(g, inputs["input_ids"], 1), _const(g, np.int64(1))))


def totals_249_252(g, inputs):
    total = _dim(g, inputs["attention_mask"], 1)
    return _op(g, "And", _op(g, "Greater", total, _const(g, np.int64(248))),
               _op(g, "Less", total, _const(g, np.int64(253))))


def longrope_by_first_position(model: ir.Model) -> None:
    """The LongRoPE If picks its table by the call's first position (past + 1) after a past, by the total for a
    prompt: the same for single steps and prompts, wrong for a multi-token call that straddles the switch."""
    g = model.graph
    inputs = {v.name: v for v in g.inputs}
    node = next(n for n in g if n.op_type == "If")
    total = _dim(g, inputs["attention_mask"], 1)
    past = _op(g, "Sub", total, _dim(g, inputs["input_ids"], 1))
    switch = _const(g, np.int64(32))
    by_past = _op(g, "Greater", _op(g, "Add", past, _const(g, np.int64(1))), switch)
    prompt = _op(g, "Equal", past, _const(g, np.int64(0)))
    cond = _op(g, "Or", _op(g, "And", prompt, _op(g, "Greater", total, switch)),
               _op(g, "And", _op(g, "Not", prompt), by_past))
    node.replace_input_with(0, cond)
    g.sort()


def positions_never_ahead(model: ir.Model) -> None:
    """position_ids clipped to past + 0..S-1: equal for every caller whose positions do not run ahead of the cache
    (a decode, left padding), wrong where they do."""
    g = model.graph
    inputs = {v.name: v for v in g.inputs}
    pos = inputs["position_ids"]
    start = _dim(g, inputs["past_key_values.0.key"], 2)
    stop = _op(g, "Add", start, _dim(g, inputs["input_ids"], 1))
    cache = _op(g, "Unsqueeze", _op(g, "Range", start, stop, _const(g, np.int64(1))), _const(g, np.array([0])))
    clipped = _op(g, "Min", pos, cache)
    for use_node, index in list(pos.uses()):
        if use_node is not clipped.producer():
            use_node.replace_input_with(index, clipped)
    g.sort()


def _mutate(src, dst, edit) -> str:
    bundle = load_bundle(src)
    edit(bundle.model)
    save_bundle(bundle, dst)
    return str(dst)


# ---------------------------------------------------------------- an independent CPU run (not the checker's feeds)


def cpu_call(model: str, ids, mask, past_rows=0, past_real=0, positions=None, seed=0) -> dict[str, np.ndarray]:
    """One call on onnxruntime's CPU EP: ``ids`` [1, S]; ``mask`` [1, M]; past buffers of ``past_rows`` rows whose
    first ``past_real`` are random (the same at a seed for both graphs), zeros after."""
    path = model if model.endswith(".onnx") else f"{model}/model.onnx"
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = {"input_ids": np.asarray(ids, np.int64), "attention_mask": np.asarray(mask, np.int64)}
    rng = np.random.RandomState(seed)
    for i in sess.get_inputs():
        if i.name.startswith("past_key_values."):
            dtype = np.float16 if "float16" in i.type else np.float32
            shape = (1, i.shape[1], past_rows, i.shape[3] if isinstance(i.shape[3], int) else 32)
            buf = np.zeros(shape, dtype)
            buf[:, :, :past_real] = rng.standard_normal((*shape[:2], past_real, shape[3]))
            feeds[i.name] = buf
        elif i.name == "position_ids":
            feeds[i.name] = np.asarray(positions, np.int64)
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def witness(wrong: str, orig: str, call: dict) -> float:
    """The largest logits difference of one call; infinite where only the wrong rewrite raises (the LongRoPE probe:
    the short table has 32 rows, GroupQueryAttention refuses a total of 34 on it)."""
    want = cpu_call(orig, **call)
    try:
        got = cpu_call(wrong, **call)
    except Exception:  # noqa: BLE001 - a call only the rewrite raises on is a difference
        return float("inf")
    return float(np.abs(got["logits"].astype(np.float64) - want["logits"].astype(np.float64)).max())


def _ids(n: int, vocab: int = 256, seed: int = 3) -> list[list[int]]:
    return np.random.RandomState(seed).randint(0, vocab, (1, n)).tolist()


#: name -> (original, edit, the witness call that shows it, the plain call that must not, the schedule that shows it)
PROBES = {
    "shared-kv-buffer": (GENAI / LLAMA, logits_plus_half_when(past_rows_not_past_length),
                         dict(ids=_ids(3), mask=[[1] * 3], past_rows=256), dict(ids=_ids(3), mask=[[1] * 3]),
                         "genai-shared-buffers"),
    "capture-decode-step": (GENAI / LLAMA_GRAPH, logits_plus_half_when(capture_decode_step),
                            dict(ids=_ids(1), mask=[[1] * 5 + [0] * 251], past_rows=256, past_real=4),
                            dict(ids=_ids(1), mask=[[1] * 5], past_rows=4, past_real=4), "genai-capture-steps"),
    "totals-249-252": (GENAI / LLAMA, logits_plus_half_when(totals_249_252),
                       dict(ids=_ids(1), mask=[[1] * 250], past_rows=249, past_real=249),
                       dict(ids=_ids(1), mask=[[1] * 254], past_rows=253, past_real=253), "end-256-steps"),
    "longrope-straddle": (GENAI / PHI3, longrope_by_first_position,
                          dict(ids=_ids(4), mask=[[1] * 34], past_rows=30, past_real=30),
                          dict(ids=_ids(1), mask=[[1] * 34], past_rows=33, past_real=33), "near-32-calls-4+2"),
    "positions-ahead": (TORCH / "tf5/dynamo/llama/decode.onnx", positions_never_ahead,
                        dict(ids=_ids(3), mask=[[1] * 7], past_rows=4, past_real=4, positions=[[9, 10, 11]]),
                        dict(ids=_ids(3), mask=[[1] * 7], past_rows=4, past_real=4, positions=[[4, 5, 6]]),
                        "positions-ahead"),
}


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_default_check_catches_each_client_probe(probe, tmp_path):
    orig, edit, shows, hides, schedule = PROBES[probe]
    dst = tmp_path / ("wrong.onnx" if str(orig).endswith(".onnx") else "wrong")
    wrong = _mutate(orig, dst, edit)
    # independent witness: both graphs on onnxruntime's CPU EP, feeds built here
    assert witness(wrong, str(orig), shows) > 0.4, probe
    assert witness(wrong, str(orig), hides) == 0, probe
    report = check(orig, wrong, isolate=False)
    assert report.verdict == NOT_EQUIVALENT and report.exit_code == 1, (probe, report.reason, report.notes)
    failing = {d.schedule for c in report.comparisons if c.counts and c.status == "compared"
               for d in c.diffs if not d.ok}
    assert schedule in failing, (probe, failing)
