"""The library form of ``rope-passes optimize``: load → passes → lint the result → save, one model per call.

Layering (each imports only those below it): :mod:`rope_passes.io` (load, save, output paths) ←
:mod:`rope_passes.pipeline` (passes in order) ← :mod:`rope_passes.lint` (rules; ``fix_bundle`` runs passes) ←
this module ← :mod:`rope_passes.cli` (argparse and rendering only).

    for job in plan_outputs("builds/", "out/"):        # a model, or a folder of model folders
        report = optimize(job.input, job.output, make_plan("webgpu-graph", runtime="onnxruntime-webgpu"))
    optimize("model_dir", "out_dir", preset="webgpu-graph")   # the same: the plan built from the keywords

The output is for the plan's WebGPU runtime (:mod:`rope_passes.runtimes`; default: the one installed here): the
preset's downlevel passes run only if it needs them, lint findings are that runtime's, and a rewritten graph says
which runtime it is for in its metadata (:data:`RUNTIME_METADATA_KEY`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from rope_passes.io import check_output, check_output_given, load_bundle, plan_outputs, write_bundle
from rope_passes.io.weights import check_weights_mode
from rope_passes.lint import remaining_problems
from rope_passes.pipeline import capture_config, run_pipeline
from rope_passes.plan import RunPlan, make_plan
from rope_passes.report import PipelineReport

__all__ = ["RUNTIME_METADATA_KEY", "capture_config", "optimize", "plan_outputs"]

#: metadata_props key of a rewritten graph: the WebGPU runtime its passes were chosen for
RUNTIME_METADATA_KEY = "rope_passes.runtime"


def optimize(
    input_path: str | os.PathLike,
    output_path: str | os.PathLike | None,
    plan: RunPlan | None = None,
    *,
    preset: str | None = None,
    passes: Sequence[str] | None = None,
    options: dict[str, Any] | None = None,
    runtime: str | None = None,
    dry_run: bool = False,
    in_place: bool = False,
    weights: str = "reflink",
    progress: Callable[[str, int, int], None] | None = None,
) -> PipelineReport:
    """Load → passes → save one model (file or model folder); the output path is checked before the passes run.

    ``plan``: what runs (:func:`rope_passes.plan.make_plan`); without one, it is built here from ``preset``,
    ``passes``, ``options`` and ``runtime`` (the same arguments; giving both is a TypeError). ``weights``: how the
    input's external data reaches the output ("reflink", "copy", "link" or "rewrite"; see
    :mod:`rope_passes.io.weights`); the report says which was used. ``report.runtime`` and ``report.skipped`` say
    which runtime the output is for and which preset passes it did not need. A rewritten graph records the runtime in
    ``metadata_props[RUNTIME_METADATA_KEY]`` (an unchanged input stays byte for byte as it was).
    """
    if plan is None:
        plan = make_plan(preset, passes, options=options, runtime=runtime)
    elif preset is not None or passes is not None or options is not None or runtime is not None:
        raise TypeError("optimize: give a plan or preset/passes/options/runtime, not both")
    check_output_given(output_path, in_place=in_place, dry_run=dry_run)
    check_weights_mode(weights)
    if not dry_run:
        check_output(input_path, output_path, in_place=in_place, rewrites_data=weights == "rewrite")
    bundle = load_bundle(input_path)
    report = run_pipeline(bundle, plan, progress)
    report.dry_run = dry_run
    if plan.preset == "webgpu-graph":
        # the pipeline's verdict of the graph it left (nothing has changed it since)
        report.capture = capture_config(bundle, plan.runtime, report.verdict_of(bundle.model, plan.runtime.name))
    report.remaining = remaining_problems(bundle, plan)
    if report.modified:
        bundle.model.metadata_props[RUNTIME_METADATA_KEY] = plan.runtime.name
    if not dry_run:
        saved = write_bundle(bundle, output_path, in_place=in_place, graph_modified=report.modified, weights=weights)
        report.copied_verbatim = saved.verbatim
        report.output_path = str(saved.path)
        report.weights = saved.weights
        report.files = saved.files
    return report
