"""rope-passes: ONNX graph rewrite passes for rotary position embeddings, for onnxruntime's WebGPU EP.

    import rope_passes
    report = rope_passes.optimize("model_dir", "out_dir", target="webgpu-graph")
    bundle = rope_passes.load_bundle("model_dir")
"""

from __future__ import annotations

__version__ = "0.1.0"

from rope_passes import check  # noqa: E402 - a callable module: rope_passes.check(original, rewritten)
from rope_passes.api import optimize
from rope_passes.errors import ModelLoadError, ModelSaveError, RopePassesError, UsageError
from rope_passes.io import ModelBundle, load_bundle, load_model, save_bundle
from rope_passes.pipeline import PRESETS, run_pipeline
from rope_passes.report import Finding, Outcome, PassReport, PipelineReport

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
    "UsageError",
    "__version__",
    "check",
    "load_bundle",
    "load_model",
    "optimize",
    "run_pipeline",
    "save_bundle",
]
