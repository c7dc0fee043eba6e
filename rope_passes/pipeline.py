"""Explicit pass order, and the named presets per target and runtime.

Order matters and is written down here, not left to rule discovery: each preset is a list, run first to last,
and ``tests/test_pipeline.py`` pins it. Passes that a preset names but this installation lacks are an error,
not a silent skip.

Presets are per runtime (:mod:`rope_passes.targets`): a *downlevel* pass (:data:`rope_passes.targets.DOWNLEVEL`:
``unfuse-gqa-qk-norm``, ``lower-mrope``) only makes a graph loadable on a runtime that lacks something, so the
preset for a runtime that has it leaves the pass out, and the report says why (:func:`presets_for`,
``PipelineReport.skipped``). :data:`PRESETS` lists every pass a preset may run.

This module runs passes on a loaded bundle; loading, linting the result and saving is :func:`rope_passes.api.optimize`
(a layer above both this module and :mod:`rope_passes.lint`, which runs passes itself in ``fix_bundle``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from rope_passes.errors import UsageError
from rope_passes.io import ModelBundle
from rope_passes.passes import ALL_PASSES, PassContext, RopePass, RopePassResult
from rope_passes.report import PipelineReport
from rope_passes.targets import RUNTIMES, RuntimeTarget, resolve_target

#: Target presets, every pass they may run. Later entries may rely on what earlier ones established (documented per
#: pass). Downlevel passes run only for a runtime that needs them: :func:`presets_for`.
PRESETS: dict[str, list[str]] = {
    # unfuse-gqa-qk-norm first: the passes after it read GroupQueryAttention in its standard (<= 14 inputs) form
    # annotate-cache-offset in both: the cache concat offset is one value for the whole session, so one no layer
    # honours is removed (and a concatenated cache without one gets it) whatever the target
    "webgpu": ["unfuse-gqa-qk-norm", "fold-text-mrope", "lower-mrope", "annotate-cache-offset", "cleanup"],
    # narrow-int64 right after total-seq-on-gpu: it reads the placement of the graph the passes before it left
    "webgpu-graph": ["unfuse-gqa-qk-norm", "fold-text-mrope", "lower-mrope", "longrope-concat",
                     "annotate-cache-offset", "total-seq-on-gpu", "narrow-int64", "cleanup"],
    # torch/optimum exports that recompute cos/sin on every call; needs a table size (--max-positions or
    # genai_config model.context_length)
    "exporter": ["precompute-cos-sin", "cleanup"],
}


def skipped_for(target: str, runtime: RuntimeTarget | str | None = None) -> dict[str, str]:
    """The passes of preset ``target`` that ``runtime`` (default: the one installed here) does not need, with why."""
    rt = resolve_target(runtime)
    return {n: why for n in PRESETS.get(target, ()) if (why := rt.skip_reason(n)) is not None}


def presets_for(runtime: RuntimeTarget | str | None = None) -> dict[str, list[str]]:
    """The presets for one runtime: :data:`PRESETS` without the downlevel passes it does not need."""
    rt = resolve_target(runtime)
    return {target: [n for n in names if rt.skip_reason(n) is None] for target, names in PRESETS.items()}


def runtime_presets() -> dict[str, dict[str, list[str]]]:
    """runtime -> target -> ordered pass names, for every runtime with a probed table (``rope-passes passes``)."""
    return {name: presets_for(name) for name in RUNTIMES}


def pass_names_for(target: str | None, passes: Sequence[str] | None,
                   runtime: RuntimeTarget | str | None = None) -> list[str]:
    """Resolve ``--target``/``--passes`` to an ordered list of registered pass names; a preset is the one for
    ``runtime`` (default: the one installed here); ``--passes`` runs exactly what it names."""
    if passes is not None:
        names = [p.strip() for p in passes]
        if not names or "" in names:
            raise UsageError("--passes needs comma-separated pass names, none empty (see: rope-passes passes)")
    else:
        target = target or "webgpu"
        if target not in PRESETS:
            raise UsageError(f"unknown target {target!r} (choose from: {', '.join(PRESETS)})")
        names = presets_for(runtime)[target]
    unknown = [n for n in names if n not in ALL_PASSES]
    if unknown:
        raise UsageError(f"unknown pass {unknown[0]!r} (available: {', '.join(sorted(ALL_PASSES))})")
    return names


def build_passes(names: Sequence[str], context: PassContext, options: dict[str, Any] | None = None,
                 skipped: Sequence[str] = ()) -> list[RopePass]:
    """The pass objects of one run, sharing ``context``; each gets the options it declares.

    An option that no pass of the run takes is a UsageError (a misspelt or misplaced option is never dropped), unless
    a pass of the preset that the runtime leaves out (``skipped``, said in the report) takes it: ``--text-only`` is
    the right option for ``webgpu-graph`` whatever runtime the output is for.
    """
    options = dict(options or {})
    taken = set().union(*(ALL_PASSES[n].option_names() for n in [*names, *skipped])) if names or skipped else set()
    for key in options:
        if key not in taken:
            raise UsageError(f"option {key!r} is not taken by any pass of this run ({', '.join(names)}); "
                             "see: rope-passes passes")
    out = []
    for name in names:
        cls = ALL_PASSES[name]
        out.append(cls(context, **{k: v for k, v in options.items() if k in cls.option_names()}))
    return out


def run_pipeline(
    bundle: ModelBundle,
    *,
    target: str | None = None,
    passes: Sequence[str] | None = None,
    options: dict[str, Any] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    runtime: RuntimeTarget | str | None = None,
) -> PipelineReport:
    """Run the passes on ``bundle.model`` in place; ``bundle.genai_config`` is updated by passes that need to.

    ``runtime``: the WebGPU runtime the output is for (default: the one installed here); it picks the preset's
    passes (:func:`presets_for`) and what the passes predict placement with. ``progress(pass_name, index, total)``
    is called before each pass.
    """
    from rope_passes.analysis.placement import capture_verdict

    rt = resolve_target(runtime)
    names = pass_names_for(target, passes, rt)
    report = PipelineReport(str(bundle.model_path), None, None if passes is not None else (target or "webgpu"))
    report.runtime = rt.name
    if passes is None:
        report.skipped = skipped_for(target or "webgpu", rt)
    context = PassContext(bundle.genai_config, model_path=bundle.model_path, runtime=rt.name)
    pass_objects = build_passes(names, context, options, skipped=list(report.skipped or {}))
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
