"""Explicit pass order, and the named presets per target.

Order matters and is written down here, not left to rule discovery: each preset is a list, run first to last,
and ``tests/test_pipeline.py`` pins it. Passes that a preset names but this installation lacks are an error,
not a silent skip.

This module runs passes on a loaded bundle; loading, linting the result and saving is :func:`rope_passes.api.optimize`
(a layer above both this module and :mod:`rope_passes.lint`, which runs passes itself in ``fix_bundle``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from rope_passes.errors import UsageError
from rope_passes.io import ModelBundle
from rope_passes.passes import ALL_PASSES, PassContext, RopePass
from rope_passes.report import PipelineReport

#: Target presets. Later entries may rely on what earlier ones established (documented per pass).
PRESETS: dict[str, list[str]] = {
    "webgpu": ["fold-text-mrope", "lower-mrope", "cleanup"],
    # narrow-int64 right after total-seq-on-gpu: it reads the placement of the graph the passes before it left
    "webgpu-graph": ["fold-text-mrope", "lower-mrope", "longrope-concat", "annotate-cache-offset",
                     "total-seq-on-gpu", "narrow-int64", "cleanup"],
    # torch/optimum exports that recompute cos/sin on every call; needs a table size (--max-positions or
    # genai_config model.context_length)
    "exporter": ["precompute-cos-sin", "cleanup"],
}


def pass_names_for(target: str | None, passes: Sequence[str] | None) -> list[str]:
    """Resolve ``--target``/``--passes`` to an ordered list of registered pass names."""
    if passes is not None:
        names = [p.strip() for p in passes]
        if not names or "" in names:
            raise UsageError("--passes needs comma-separated pass names, none empty (see: rope-passes passes)")
    else:
        target = target or "webgpu"
        if target not in PRESETS:
            raise UsageError(f"unknown target {target!r} (choose from: {', '.join(PRESETS)})")
        names = list(PRESETS[target])
    unknown = [n for n in names if n not in ALL_PASSES]
    if unknown:
        raise UsageError(f"unknown pass {unknown[0]!r} (available: {', '.join(sorted(ALL_PASSES))})")
    return names


def build_passes(names: Sequence[str], context: PassContext, options: dict[str, Any] | None = None) -> list[RopePass]:
    """The pass objects of one run, sharing ``context``; each gets the options it declares.

    An option that no pass of the run takes is a UsageError (a misspelt or misplaced option is never dropped).
    """
    options = dict(options or {})
    taken = set().union(*(ALL_PASSES[n].option_names() for n in names)) if names else set()
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
) -> PipelineReport:
    """Run the passes on ``bundle.model`` in place; ``bundle.genai_config`` is updated by passes that need to.

    ``progress(pass_name, index, total)`` is called before each pass.
    """
    names = pass_names_for(target, passes)
    report = PipelineReport(str(bundle.model_path), None, None if passes is not None else (target or "webgpu"))
    pass_objects = build_passes(names, PassContext(bundle.genai_config, model_path=bundle.model_path), options)
    for index, pass_ in enumerate(pass_objects):
        if progress is not None:
            progress(pass_.name, index, len(pass_objects))
        start = time.perf_counter()
        result = pass_(bundle.model)
        bundle.model = result.model
        assert result.report is not None
        result.report.duration_s = time.perf_counter() - start
        report.passes.append(result.report)
    return report
