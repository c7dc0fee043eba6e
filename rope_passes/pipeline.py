"""Run a :class:`~rope_passes.plan.RunPlan`'s passes on a loaded bundle, in order, with one capture verdict per graph
state handed to the passes' contracts.

What runs (preset or pass list, runtime, options, Hugging Face config) is the plan's, resolved once by
:func:`rope_passes.plan.make_plan`; this module decides none of it again.

The last step of ``webgpu-graph`` (and of ``lint --fix``, for RP221/RP222) is here too: :func:`capture_config` makes
``genai_config.json``'s ``enableGraphCapture`` agree with the graph's capture verdict.

This module runs passes on a loaded bundle; loading, linting the result and saving is :func:`rope_passes.api.optimize`
(a layer above both this module and :mod:`rope_passes.lint`, which runs passes itself in ``fix_bundle``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rope_passes.io import ModelBundle
from rope_passes.passes import PassContext, RopePassResult
from rope_passes.plan import RunPlan
from rope_passes.report import PipelineReport
from rope_passes.runtimes.probed import ProbedRuntime

if TYPE_CHECKING:
    from rope_passes.analysis.placement import Placement


def run_pipeline(bundle: ModelBundle, plan: RunPlan,
                 progress: Callable[[str, int, int], None] | None = None) -> PipelineReport:
    """Run ``plan``'s passes on ``bundle.model`` in place; ``bundle.genai_config`` is updated by passes that need to.

    The plan's runtime is what the passes predict placement with. ``progress(pass_name, index, total)`` is called
    before each pass.
    """
    from rope_passes.analysis.placement import capture_verdict

    rt = plan.runtime
    report = PipelineReport(str(bundle.model_path), None, plan.preset)
    report.runtime = rt.name
    report.skipped = dict(plan.skipped)
    context = PassContext(bundle.genai_config, model_path=bundle.model_path, runtime=rt)
    pass_objects = plan.build(context)
    # One capture verdict per graph state: the graph's now, and after each pass that changed it (a pass that changed
    # nothing leaves it as it was). The pass's contracts read it, and the pass may take it once
    # (PassContext.take_verdict); each pass returns its output's (RopePassResult.verdict); the last one is the
    # output's (PipelineReport.verdict_of).
    verdict = capture_verdict(bundle.model, rt)
    # The roll-back snapshot of the graph before the next pass: taken by the pass itself (its contracts roll it back),
    # handed on while passes change nothing, so one is serialized only for a graph state no snapshot holds yet.
    snapshot = None
    for index, pass_ in enumerate(pass_objects):
        if progress is not None:
            progress(pass_.name, index, len(pass_objects))
        start = time.perf_counter()
        context.verdict = (bundle.model, rt.name, verdict)
        context.snapshot = (bundle.model, snapshot) if snapshot is not None else None
        try:
            result = pass_(bundle.model)
        finally:
            context.verdict = context.snapshot = None
        bundle.model = result.model
        assert isinstance(result, RopePassResult) and result.report is not None
        snapshot = result.snapshot
        if result.verdict is not None:
            verdict = result.verdict
        elif result.modified:
            verdict = capture_verdict(bundle.model, rt)
        result.report.duration_s = time.perf_counter() - start
        report.passes.append(result.report)
    report.verdict = (bundle.model, rt.name, verdict)
    return report


def capture_config(bundle: ModelBundle, runtime: ProbedRuntime, verdict: Placement | None = None) -> dict[str, Any]:
    """``webgpu-graph``'s last step: the output's graph-capture verdict (the one home,
    :func:`rope_passes.analysis.placement.capture_verdict`) and ``genai_config.json`` made to agree with it.

    Capture-ready: ``enableGraphCapture`` = "1" in the decoder's WebGPU provider options (the entry added as
    onnxruntime-genai's builder writes it where there is none), so onnxruntime-genai captures the folder as it is.
    Blocked: left off (set to "0" where the input had "1": onnxruntime-genai would fail at session creation), each
    blocker named with its node. Unknown or not loadable: the config is left as it is. Returns the report's
    ``capture`` entry: ``state``, ``verdict`` (one line), ``blockers`` ([{node, why}]), ``config`` (the change line,
    or why nothing was written). ``verdict``: the capture verdict of ``bundle.model`` on ``runtime`` where the caller
    already has it (the pipeline's), else it is computed here."""
    from rope_passes.analysis.placement import capture_verdict

    if verdict is None:
        verdict = capture_verdict(bundle.model, runtime)
    config = bundle.genai_config
    line: str | None = None
    if not config.present:
        why = "no genai_config.json: enableGraphCapture has nowhere to go"
    elif verdict.state == "ready":
        line = config.set_graph_capture(True)
        why = "enableGraphCapture is already '1' in genai_config.json"
    elif verdict.state == "blocked":
        line = config.set_graph_capture(False)
        why = "enableGraphCapture left off: capture is blocked"
    else:
        why = f"enableGraphCapture left as it is: capture is {verdict.state}"
    return {"state": verdict.state, "runtime": runtime.name, "verdict": verdict.verdict(),
            "blockers": [{"node": node, "why": why_} for node, why_ in verdict.blockers()],
            "unknown": dict(list(verdict.unknown.items())[:20]),
            "config": line or why}
