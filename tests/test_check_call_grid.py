"""Issue 33: the call grid (``rope_passes/check/evidence/calls.py``): every call shape a client can send inside the
context, each once after a random past, on the CPU EP. Each probe is a deliberately wrong rewrite of a corpus graph,
wrong only for one shape of call that no fixed schedule, decode or sweep position made (the classes an independent
probe set got through the default check with: red team 35), confirmed different by an independent onnxruntime CPU
call of both graphs (feeds built here) and equal on the shape beside it; the grid names a call of that shape. A
correct rewrite (the ``optimize`` output) and the model against itself stay equivalent.

Budget (2 cores): ~1.5 min.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
from _utils import graph_const as _const
from _utils import graph_dim as _dim
from _utils import graph_op as _op
from conftest import GENAI
from test_check_clients import _mutate, logits_plus_half_when, logits_plus_when

from rope_passes.check.core import EQUIVALENT, NOT_EQUIVALENT, check
from rope_passes.check.evidence.calls import GRID_MAX, _families, plan_calls

pytestmark = [pytest.mark.corpus]

LLAMA = GENAI / "current/llama/cpu_fp32"  # fp32, context 256, genai's shared buffers of 256 rows


def _and(g, *conds):
    out = conds[0]
    for c in conds[1:]:
        out = _op(g, "And", out, c)
    return out


def _i(g, v):
    return _const(g, np.int64(v))


def _seq(g, inputs):
    return _dim(g, inputs["input_ids"], 1)


def _batch(g, inputs):
    return _dim(g, inputs["input_ids"], 0)


def _past(g, inputs):
    """Tokens before the call: the mask's width less the call's (the past buffer's rows on shared buffers)."""
    return _op(g, "Sub", _dim(g, inputs["attention_mask"], 1), _seq(g, inputs))


def prompt_17_to_24(g, inputs):
    s = _seq(g, inputs)
    return _and(g, _op(g, "GreaterOrEqual", s, _i(g, 17)), _op(g, "LessOrEqual", s, _i(g, 24)),
                _op(g, "Equal", _past(g, inputs), _i(g, 0)))


def five_tokens_after_a_past(g, inputs):
    return _and(g, _op(g, "Equal", _seq(g, inputs), _i(g, 5)), _op(g, "Greater", _past(g, inputs), _i(g, 0)))


def call_ending_at_37(g, inputs):
    return _and(g, _op(g, "Greater", _seq(g, inputs), _i(g, 1)),
                _op(g, "Equal", _dim(g, inputs["attention_mask"], 1), _i(g, 37)))


def batch_times_length_over_256(g, inputs):
    return _op(g, "Greater", _op(g, "Mul", _batch(g, inputs), _seq(g, inputs)), _i(g, 256))


def batch_of_9_or_more(g, inputs):
    return _op(g, "GreaterOrEqual", _batch(g, inputs), _i(g, 9))


def identical_rows(g, inputs):
    """At least two rows, every column the same id on every row (num_return_sequences)."""
    ids = inputs["input_ids"]
    same = _op(g, "Equal", _op(g, "ReduceMax", ids, _const(g, np.array([0])), keepdims=0),
               _op(g, "ReduceMin", ids, _const(g, np.array([0])), keepdims=0))
    every = _op(g, "Equal", _op(g, "ReduceMin", _op(g, "Cast", same, to=ir.DataType.INT64), keepdims=0), _i(g, 1))
    return _and(g, _op(g, "GreaterOrEqual", _batch(g, inputs), _i(g, 2)), every)


def one_repeated_id(g, inputs):
    """A prompt of at least two tokens, all one id."""
    ids = inputs["input_ids"]
    return _and(g, _op(g, "GreaterOrEqual", _seq(g, inputs), _i(g, 2)),
                _op(g, "Equal", _op(g, "ReduceMax", ids, keepdims=0), _op(g, "ReduceMin", ids, keepdims=0)))


def batched_decode_past_16(g, inputs):
    return _and(g, _op(g, "Greater", _batch(g, inputs), _i(g, 1)), _op(g, "Equal", _seq(g, inputs), _i(g, 1)),
                _op(g, "Greater", _dim(g, inputs["attention_mask"], 1), _i(g, 16)))


def shared_buffers_past_70(g, inputs):
    """genai's shared buffers (the past's rows are not the past's length) once the mask is past 70 tokens."""
    rows = _dim(g, inputs["past_key_values.0.key"], 2)
    return _and(g, _op(g, "Not", _op(g, "Equal", rows, _past(g, inputs))),
                _op(g, "Greater", _dim(g, inputs["attention_mask"], 1), _i(g, 70)))


def crossing_row_128(g, inputs):
    past = _past(g, inputs)
    return _and(g, _op(g, "Greater", past, _i(g, 0)), _op(g, "Less", past, _i(g, 128)),
                _op(g, "Greater", _dim(g, inputs["attention_mask"], 1), _i(g, 128)),
                _op(g, "Greater", _seq(g, inputs), _i(g, 1)))


def seventeen_after_a_past(g, inputs):
    return _and(g, _op(g, "Equal", _seq(g, inputs), _i(g, 17)), _op(g, "Greater", _past(g, inputs), _i(g, 0)))


def shared_buffers_multi_token(g, inputs):
    """Several tokens after a past on genai's shared buffers."""
    rows = _dim(g, inputs["past_key_values.0.key"], 2)
    return _and(g, _op(g, "Not", _op(g, "Equal", rows, _past(g, inputs))),
                _op(g, "Greater", _past(g, inputs), _i(g, 0)), _op(g, "Greater", _seq(g, inputs), _i(g, 1)))


def padded_decode_past_100(g, inputs):
    """A decode step of a batch with a padded row (a mask zero), past total 100."""
    mask = inputs["attention_mask"]
    holes = _op(g, "Less", _op(g, "ReduceMin", mask, keepdims=0), _i(g, 1))
    return _and(g, holes, _op(g, "Equal", _seq(g, inputs), _i(g, 1)),
                _op(g, "Greater", _dim(g, mask, 1), _i(g, 100)))


def shared_identical_rows_decode(g, inputs):
    """num_return_sequences on genai's shared buffers: identical rows, a decode step (red team 37: missed)."""
    rows = _dim(g, inputs["past_key_values.0.key"], 2)
    return _and(g, identical_rows(g, inputs), _op(g, "Not", _op(g, "Equal", rows, _past(g, inputs))),
                _op(g, "Equal", _seq(g, inputs), _i(g, 1)))


def cpu(model: str, batch: int, tokens: int, past: int, rows: int | None = None, same_ids=False, same_rows=False,
        pad=0, seed=0) -> np.ndarray:
    """The logits of one call on onnxruntime's CPU EP, feeds built here: ``batch`` rows of ``tokens`` ids after a
    random past of ``past`` rows (a buffer of ``rows`` rows: genai's shared buffers), the mask all ones but the last
    row's first ``pad`` columns (left padding)."""
    sess = ort.InferenceSession(f"{model}/model.onnx", providers=["CPUExecutionProvider"])
    rng = np.random.RandomState(seed)
    ids = rng.randint(4, 250, (1 if same_rows else batch, tokens)).astype(np.int64)
    if same_ids:
        ids[:] = ids[:, :1]
    ids = np.repeat(ids, batch, axis=0) if same_rows else ids
    mask = np.ones((batch, past + tokens), np.int64)
    mask[-1, :pad] = 0
    feeds = {"input_ids": ids, "attention_mask": mask}
    for i in sess.get_inputs():
        if i.name.startswith("past_key_values."):
            feeds[i.name] = rng.standard_normal((batch, i.shape[1], rows or past, 32)).astype(np.float32)
    return sess.run(["logits"], feeds)[0]


def apart(wrong: str, orig: str, **call) -> float:
    return float(np.abs(cpu(wrong, **call).astype(np.float64) - cpu(orig, **call)).max())


#: name -> (edit, the call that shows it, the call beside it that must not, the grid families that may name it first)
PROBES = {
    "prompt-17-24": (prompt_17_to_24, dict(batch=1, tokens=20, past=0), dict(batch=1, tokens=25, past=0), ("prompt",)),
    "5-after-past": (five_tokens_after_a_past, dict(batch=1, tokens=5, past=40), dict(batch=1, tokens=6, past=40),
                     ("call-5",)),
    "ending-at-37": (call_ending_at_37, dict(batch=1, tokens=3, past=34), dict(batch=1, tokens=3, past=35),
                     ("call-", "prompt")),
    "batch-x-length": (batch_times_length_over_256, dict(batch=2, tokens=129, past=0),
                       dict(batch=2, tokens=128, past=0), ("prompt-pair", "batch-")),
    "batch-9": (batch_of_9_or_more, dict(batch=9, tokens=3, past=0), dict(batch=8, tokens=3, past=0), ("batch-9",)),
    "identical-rows": (identical_rows, dict(batch=2, tokens=3, past=0, same_rows=True),
                       dict(batch=2, tokens=3, past=0), ("-pair",)),
    "repeated-id": (one_repeated_id, dict(batch=1, tokens=6, past=0, same_ids=True), dict(batch=1, tokens=6, past=0),
                    ("prompt-repeated",)),
    "batched-decode-past-16": (batched_decode_past_16, dict(batch=2, tokens=1, past=16),
                               dict(batch=2, tokens=1, past=15), ("decode-", "batch-", "shared-pair")),
    "shared-past-70": (shared_buffers_past_70, dict(batch=1, tokens=1, past=70, rows=256),
                       dict(batch=1, tokens=1, past=70), ("shared",)),
    "17-after-past": (seventeen_after_a_past, dict(batch=1, tokens=17, past=40), dict(batch=1, tokens=16, past=40),
                      ("call-17",)),
    "shared-multi-token": (shared_buffers_multi_token, dict(batch=1, tokens=3, past=20, rows=256),
                           dict(batch=1, tokens=3, past=20), ("shared-call",)),
    "padded-decode-past-100": (padded_decode_past_100, dict(batch=2, tokens=1, past=120, pad=9),
                               dict(batch=2, tokens=1, past=90, pad=9), ("-padded",)),
    "shared-twins": (shared_identical_rows_decode, dict(batch=2, tokens=1, past=30, rows=256, same_rows=True),
                     dict(batch=2, tokens=1, past=30, same_rows=True), ("shared-twins",)),
    "crossing-128": (crossing_row_128, dict(batch=1, tokens=4, past=126), dict(batch=1, tokens=4, past=128),
                     ("call-",)),
}


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_each_probe_is_wrong_only_on_its_shape(probe, tmp_path):
    edit, shows, hides, _ = PROBES[probe]
    wrong = _mutate(LLAMA, tmp_path / "wrong", logits_plus_half_when(edit))
    assert apart(wrong, str(LLAMA), **shows) == pytest.approx(0.5, abs=1e-4)  # independent: feeds built here
    assert apart(wrong, str(LLAMA), **hides) == 0


def logits_plus_bit_when(conditions):
    """logits + 2^i / 16 where ``conditions[i]`` holds: one graph wrong for every probe, each by its own bit."""
    return logits_plus_when([(cond, 2.0**i / 16) for i, cond in enumerate(conditions)])


def test_the_grid_catches_every_probe(tmp_path, monkeypatch):
    """One check of a graph wrong for every probe (each by its own bit of the logits' difference): every probe's bit
    shows in some call of the grid, the first such call is of a family that has its shape, and the decode, the
    schedules and the sweep are not needed for it (none run)."""
    from rope_passes.check.evidence import calls as grid_kind

    names = sorted(PROBES)
    wrong = _mutate(LLAMA, tmp_path / "wrong", logits_plus_bit_when([PROBES[n][0] for n in names]))
    monkeypatch.setattr(grid_kind, "KEEP_FAILURES", 10**6)  # every failing call, to read each probe's bit
    report = check(LLAMA, wrong, ep="cpu", sweep=0, schedules=[], calls=True, tables=False, isolate=False, steps=0,
                   prefill=1)
    assert report.verdict == NOT_EQUIVALENT and report.exit_code == 1
    grid = next(c for c in report.comparisons if c.kind == "calls")
    assert grid.counts and not grid.ok
    decode = next(c for c in report.comparisons if c.kind == "decode" and c.counts)
    assert decode.ok  # a one-token prompt: none of the probes
    first: dict[str, str] = {}
    for d in grid.diffs:
        if d.output == "logits" and not d.ok:
            bits = round(d.max_abs * 16)
            assert d.max_abs == pytest.approx(bits / 16, abs=1e-4), d
            for i, name in enumerate(names):
                if bits >> i & 1:
                    first.setdefault(name, d.schedule)
    assert set(first) == set(names), sorted(set(names) - set(first))
    for name, call in first.items():
        assert any(f in call for f in PROBES[name][3]), (name, call)
    assert any(line.startswith("call grid: ") for line in report.first_differences())
    data = report.to_dict()["first_failure"]  # JSON names it too, though the decode passed
    assert data["kind"] == "calls" and data["schedule"] and not data["ok"]


def test_a_correct_rewrite_stays_equivalent(tmp_path):
    from rope_passes.api import optimize

    optimize(LLAMA, tmp_path / "out", preset="webgpu-graph")
    report = check(LLAMA, tmp_path / "out", ep="cpu", sweep=0, schedules=[], calls=True, tables=False, isolate=False)
    assert report.verdict == EQUIVALENT, report.first_differences()
    grid = next(c for c in report.comparisons if c.kind == "calls")
    assert grid.ok and grid.status == "compared" and grid.diffs
    assert max(d.max_abs for d in grid.diffs) < 1e-4  # fp32 on the CPU EP
    assert any(n.startswith("call grid: ") and "prompt every shape" in n for n in report.notes)


def test_the_grid_is_every_shape_and_a_stated_sample_where_not_afforded():
    every, note = plan_calls(256, 256, cacheless=False, every=True, thresholds=(32,))
    shapes = {(c.family, c.batch, c.past, c.tokens) for c in every}
    assert {("prompt", 1, 0, k) for k in range(1, 257)} <= shapes  # every prompt length
    assert {("decode-pair", 2, p, 1) for p in range(1, 256)} <= shapes  # identical rows at every past
    for k in range(2, GRID_MAX + 1):
        pasts = {p for f, _, p, n in shapes if f == f"call-{k}"}
        assert all(p in pasts for p in range(128 - k + 1, 128)), k  # every call crossing row 128
        assert all(p in pasts for p in range(32 - k + 1, 32)), k  # and the threshold 32
        assert all(pasts & set(range(lo, lo + 8)) for lo in range(1, 256 - k - 7)), k  # one in 8 consecutive pasts
    assert {b for f, b, p, n in shapes if f.startswith("batch-")} == set(range(3, 17))
    assert all(c.past + c.tokens <= 256 for c in every)
    assert f"{len(every)} calls" in note and "prompt every shape" in note and "call every 8th" in note
    assert "probability 1/s per seed" in note
    sample, why = plan_calls(256, 256, cacheless=False, every=False, seed=3)
    assert len(sample) <= 300 and set(sample) <= {c for cs in _families(256, 256, False, (32,)).values() for c in cs}
    assert "does not afford" in why and "seed 3" in why
    cacheless, _ = plan_calls(64, None, cacheless=True, every=True)
    assert cacheless and all(c.past == 0 for c in cacheless)
