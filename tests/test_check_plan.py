"""The check's plan and run identity: a frozen CheckPlan built once (plan_check), runs keyed by RunKey (whose str()
is the label reports and JSON show), the fallback runtime from the descriptor, and --budget on the runtime the check
runs on (or nowhere)."""

from __future__ import annotations

import dataclasses

import pytest

from rope_passes.check.compare import TOLERANCES
from rope_passes.check.explore import explore
from rope_passes.check.plan import CheckOptions, CheckPlan
from rope_passes.check.spec import ORIGINAL, REWRITTEN, RunKey
from rope_passes.runtimes import DESCRIPTORS, WEBGPU_127, WEBGPU_PLUGIN, descriptor


def test_run_keys_are_their_labels():
    for label in ("original@cpu", "original@webgpu", "rewritten@webgpu", "rewritten@cpu",
                  "rewritten@webgpu+capture", "original@webgpu:plugin", "original@cpu:plugin"):
        assert str(RunKey.parse(label)) == label
    key = RunKey.parse("original@cpu:plugin")
    assert key == RunKey(ORIGINAL, "cpu", WEBGPU_PLUGIN) and key.original and key.elsewhere and not key.capture
    captured = RunKey.parse("rewritten@webgpu+capture")
    assert captured == RunKey(REWRITTEN, "webgpu", capture=True) and not captured.elsewhere
    assert len({RunKey(ORIGINAL, "cpu"), RunKey.parse("original@cpu")}) == 1  # hashable: runs are keyed by it


def test_the_fallback_runtime_is_the_descriptors():
    """The original's second runtime is the check runtime's descriptor's ``fallback`` (no name spelled in check/)."""
    assert descriptor(WEBGPU_127).fallback == WEBGPU_PLUGIN
    assert descriptor(WEBGPU_PLUGIN).fallback is None  # the plugin runtime has no second runtime
    assert all(d.fallback is None or descriptor(d.fallback) is not None for d in DESCRIPTORS)


def test_the_plan_is_frozen():
    plan = CheckPlan(8, 4, (1, 2), TOLERANCES["fp32"], None, ("a note",), frozenset({32}), None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.notes = ()  # type: ignore[misc]
    assert plan.for_ep("cpu") == [] and plan.embeddings == (None, None) and not plan.graph_capture


def test_budget_does_not_explore_on_another_runtime():
    """--runtime names where every run happens: random schedules drawn in this process would run on the runtime
    installed here, so with another one the exploration says so and draws nothing."""
    plan = CheckPlan(8, 4, (), TOLERANCES["fp32"], None, (), frozenset(), None)
    out = explore(None, None, plan, CheckOptions(budget=5.0, seed=3), "a", "b", WEBGPU_PLUGIN,  # type: ignore[arg-type]
                  "runs in its own interpreter (/venv-plugin/bin/python)")
    assert out.drawn == 0 and out.found is None
    assert out.reason.startswith("--budget draws in this process, and onnxruntime-ep-webgpu runs in its own")
    c = out.comparison(TOLERANCES["fp32"])
    assert c.status == "skipped" and c.kind == "random" and "nothing explored" in c.reason


@pytest.mark.corpus
def test_a_config_that_turns_capture_on_gets_the_captured_decode(tmp_path):
    """onnxruntime-genai runs the captured loop when the output's genai_config.json turns capture on: the plan makes
    the captured run and decodes to CAPTURE_TOTAL as --graph-capture does (red team 33's c4_static_mask_T20: since
    75925da the decode was extended for --graph-capture only, 8+4 tokens)."""
    from conftest import GENAI

    from rope_passes.check.client_schedules import CAPTURE_TOTAL
    from rope_passes.check.models import read_model
    from rope_passes.check.plan import plan_check

    orig, rew = read_model(GENAI / "current/llama/cpu_fp32"), read_model(GENAI / "current/llama/webgpu_fp16_graph")
    assert rew.capture_on and not orig.capture_on
    for flag in (False, True):
        plan = plan_check(orig, rew, CheckOptions(graph_capture=flag, tables=False), None, 0, tmp_path, True)
        assert plan.graph_capture and plan.capture_required and plan.prefill + plan.steps == CAPTURE_TOTAL
    plan = plan_check(rew, rew, CheckOptions(tables=False), None, 0, tmp_path, True)  # both configs: capture on
    assert plan.graph_capture and not plan.capture_required and plan.prefill + plan.steps == CAPTURE_TOTAL
    plan = plan_check(orig, rew, CheckOptions(tables=False), None, 0, tmp_path, False)  # no genai on this runtime
    assert not plan.graph_capture and plan.prefill + plan.steps == 12
