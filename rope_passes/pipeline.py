"""Explicit pass order, and the named presets per target.

Order matters and is written down here, not left to rule discovery: each preset is a list, run first to last,
and ``tests/test_pipeline.py`` pins it. Passes that a preset names but this installation lacks are an error,
not a silent skip.
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
    pass_objects = build_passes(names, PassContext(bundle.genai_config), options)
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


def optimize(
    input_path: str,
    output_path: str | None,
    *,
    target: str | None = "webgpu",
    passes: Sequence[str] | None = None,
    options: dict[str, Any] | None = None,
    dry_run: bool = False,
    in_place: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
) -> PipelineReport:
    """Load → passes → save. The library form of ``rope-passes optimize``."""
    from rope_passes.io import MAX_IR_VERSION, load_bundle, save_bundle

    if not dry_run and output_path is None and not in_place:
        raise UsageError("no output path given (use -o OUT, --in-place, or --dry-run)")
    bundle = load_bundle(input_path)
    report = run_pipeline(bundle, target=target, passes=passes, options=options, progress=progress)
    report.dry_run = dry_run
    report.remaining = remaining_problems(bundle)
    if not dry_run:
        # Nothing changed: copy the input's bytes (an IR version above what onnxruntime reads is still lowered).
        unchanged = (
            not report.modified
            and not bundle.genai_config_changed
            and (bundle.model.ir_version or 0) <= MAX_IR_VERSION
        )
        report.copied_verbatim = unchanged
        written = save_bundle(bundle, output_path, in_place=in_place, unchanged=unchanged)
        report.output_path = str(written)
    return report


#: lint findings about the output worth printing after optimize: it will not load / run right, or runs on WebGPU only
_AFTER_OPTIMIZE = ("RP002", "RP101", "RP203", "RP301", "RP204")


def remaining_problems(bundle: ModelBundle) -> list[dict[str, Any]]:
    """Lint errors (and the WebGPU-only note) the optimized model still has, one entry per code."""
    from rope_passes.lint import lint_bundle

    seen: dict[str, dict[str, Any]] = {}
    for d in lint_bundle(bundle, select=_AFTER_OPTIMIZE):
        entry = seen.setdefault(d.code, {**d.to_dict(), "count": 0})
        entry["count"] += 1
    return list(seen.values())
