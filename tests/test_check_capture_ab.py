"""Capture A/B (:mod:`rope_passes.check.evidence.capture_ab`): the replayed steps of a captured run against the same
steps run uncaptured on the same runtime, through the same driver.

No graph here is wrong under replay only (onnxruntime-webgpu 1.27 on lavapipe replays every corpus ``_graph`` model
exactly), so the failing side is tested with an injected backend whose captured driver returns a different step 2:
through the real run loop (:func:`rope_passes.check.runner.execute_run`) and the real comparison and verdict."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import GENAI

from rope_passes.check.backends import RunBackend
from rope_passes.check.compare import TOLERANCES
from rope_passes.check.evidence import Evidence, capture_ab, parts
from rope_passes.check.models import ModelInfo
from rope_passes.check.plan import CheckOptions, CheckPlan
from rope_passes.check.runner import execute_run
from rope_passes.check.spec import OK, RunKey, RunResult, RunSpec
from rope_passes.check.verdict import decide

STEPS = 4


def _evidence(runs: list[RunResult]) -> Evidence:
    from pathlib import Path

    info = ModelInfo(Path("m"), None, "fp32", {}, None, False)
    plan = CheckPlan(8, STEPS, (), TOLERANCES["fp32"], None, (), frozenset(), None, graph_capture=True)
    return Evidence(plan, CheckOptions(), info, info, runs)


def _steps(shift_at: int | None = None, shift: float = 0.5) -> list[dict[str, np.ndarray]]:
    rng = np.random.RandomState(0)
    out = []
    for k in range(STEPS + 1):
        logits = rng.standard_normal((1, 1, 32)).astype(np.float32)
        out.append({"logits": logits + (np.float32(shift) if k == shift_at else np.float32(0))})
    return out


class _Driver:
    def __init__(self, steps: list[dict[str, np.ndarray]]) -> None:
        self.steps, self.providers, self.notes = steps, ["WebGpuExecutionProvider"], []

    def run(self, on_step=None, results=None):
        results = [] if results is None else results
        results.extend(self.steps)
        return results


class _ReplayWrongBackend(RunBackend):
    """A runtime whose replays (steps >= 2 of a captured session) are off at step ``wrong``."""

    what = "a test runtime"

    def __init__(self, wrong: int | None) -> None:
        self.wrong, self.opened = wrong, []

    def start(self) -> str:
        return "test runtime"

    def capture(self, spec, table, captured=True):
        self.opened.append(captured)
        return _Driver(_steps(self.wrong if captured else None))


def _spec() -> RunSpec:
    key = RunKey("rewritten", "webgpu", capture=True)
    spec = RunSpec(label=str(key), model="m.onnx", ep="webgpu", prefill=8, steps=STEPS, graph_capture=True)
    spec.parts = parts(None, spec, None)
    return spec


def test_the_capture_run_makes_the_ab_and_no_other_run_does():
    spec = _spec()
    assert spec.parts == {"capture-ab": {"steps": STEPS}}
    plain = RunSpec(label=str(RunKey("rewritten", "webgpu")), model="m.onnx", ep="webgpu", prefill=8, steps=STEPS)
    assert capture_ab.parts(None, plain) is None


def test_a_replay_that_differs_is_its_own_verdict_line():
    backend = _ReplayWrongBackend(wrong=2)
    result = execute_run(_spec(), backend)
    assert result.status == OK and backend.opened == [True, False]  # the captured run, then the same uncaptured
    assert len(result.parts["capture-ab"]) == STEPS + 1
    (c,) = capture_ab.compare(_evidence([result]))
    assert c.counts and c.status == "compared" and not c.ok
    d = c.first_failure
    assert d.step == 2 and d.output == "logits" and d.max_abs == pytest.approx(0.5, abs=1e-6)
    assert all(x.max_abs == 0.0 for x in c.diffs if x.step != 2)
    line = capture_ab.failure_line(c)
    assert line.startswith("replay differs from the uncaptured run at step 2: output logits, max abs 0.5"), line


def test_a_replay_that_agrees_passes_and_decides_nothing_else():
    result = execute_run(_spec(), _ReplayWrongBackend(wrong=None))
    (c,) = capture_ab.compare(_evidence([result]))
    assert c.ok and len(c.diffs) == STEPS + 1 and all(d.max_abs == 0.0 for d in c.diffs)
    assert capture_ab.failure_line(c) is None


def test_the_verdict_counts_the_ab():
    from rope_passes.check.report import NOT_EQUIVALENT

    captured = execute_run(_spec(), _ReplayWrongBackend(wrong=3))
    plain = RunResult(str(RunKey("rewritten", "webgpu")), OK, steps=_steps())
    orig = RunResult(str(RunKey("original", "webgpu")), OK, steps=_steps())
    ev = _evidence([orig, plain, captured])
    verdict, _, _ = decide(ev, capture_ab.compare(ev))
    assert verdict == NOT_EQUIVALENT


@pytest.mark.corpus
@pytest.mark.webgpu
def test_a_captured_corpus_model_replays_as_it_runs_uncaptured():
    """No false alarm: the builder's _graph model, captured and replayed on onnxruntime-webgpu, gives the same
    steps as the same calls on the same buffers without capture (bit-identical)."""
    import rope_passes

    model = GENAI / "current/llama/webgpu_fp16_graph"
    report = rope_passes.check(model, model, graph_capture=True, sweep=0, schedules=[], tables=False)
    c = report.comparison("rewritten@webgpu+capture", "rewritten@webgpu+capture uncaptured", kind=capture_ab.NAME)
    assert c is not None and c.status == "compared" and c.counts, report.to_json()
    assert len({d.step for d in c.diffs}) == report.steps + 1
    assert all(d.max_abs == 0.0 for d in c.diffs), [(d.step, d.output, d.max_abs) for d in c.diffs if d.max_abs]
    assert report.verdict == "equivalent"
