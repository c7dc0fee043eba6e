"""rope-passes: ONNX graph rewrite passes for rotary position embeddings, for onnxruntime's WebGPU EP.

    import rope_passes
    report = rope_passes.optimize("model_dir", "out_dir", preset="webgpu-graph")
    bundle = rope_passes.load_bundle("model_dir")

The names below are imported on first use (onnx_ir, onnxscript and the passes take a second or two to import): the
command line starts at once, and Ctrl-C during start-up is the command's one-line "interrupted", not a traceback.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> the module that defines it
_EXPORTS = {
    "optimize": "rope_passes.api",
    "ModelLoadError": "rope_passes.errors",
    "ModelSaveError": "rope_passes.errors",
    "RopePassesError": "rope_passes.errors",
    "UsageError": "rope_passes.errors",
    "ModelBundle": "rope_passes.io",
    "load_bundle": "rope_passes.io",
    "load_model": "rope_passes.io",
    "save_bundle": "rope_passes.io",
    "PRESETS": "rope_passes.plan",
    "RunPlan": "rope_passes.plan",
    "make_plan": "rope_passes.plan",
    "run_pipeline": "rope_passes.pipeline",
    "Finding": "rope_passes.report",
    "Outcome": "rope_passes.report",
    "PassReport": "rope_passes.report",
    "PipelineReport": "rope_passes.report",
}

if TYPE_CHECKING:
    from rope_passes.api import optimize
    from rope_passes.errors import ModelLoadError, ModelSaveError, RopePassesError, UsageError
    from rope_passes.io import ModelBundle, load_bundle, load_model, save_bundle
    from rope_passes.pipeline import run_pipeline
    from rope_passes.plan import PRESETS, RunPlan, make_plan
    from rope_passes.report import Finding, Outcome, PassReport, PipelineReport


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rope_passes' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "PRESETS",
    "Finding",
    "ModelBundle",
    "ModelLoadError",
    "ModelSaveError",
    "Outcome",
    "PassReport",
    "PipelineReport",
    "RopePassesError",
    "RunPlan",
    "UsageError",
    "__version__",
    "check",
    "load_bundle",
    "load_model",
    "make_plan",
    "optimize",
    "run_pipeline",
    "save_bundle",
]


# ``rope_passes.check`` is a plain function. The package of the same name is imported first (its __init__ imports
# nothing), so this definition is what the name holds: importing a submodule later (rope_passes.check.decode) does
# not rebind it, since the package is already loaded.
from rope_passes import check as _check_package  # noqa: E402


def check(original: Any, rewritten: Any, options: Any = None, **overrides: Any) -> Any:
    """Is ``rewritten`` the same function as ``original``? :func:`rope_passes.check.core.check` (docs/checker.md):
    an ``EquivalenceReport`` (``.verdict``, ``.exit_code``, ``.first_failure``, ``.to_json()``)."""
    from rope_passes.check.core import check as run

    return run(original, rewritten, options, **overrides)


del _check_package
