"""The passes, one module each, and the registry the CLI and presets use.

Add a pass: write ``rope_passes/passes/<name>.py`` with one ``RopePass`` subclass, import it here, add it to
``ALL_PASSES`` and, if it belongs there, to a preset in ``rope_passes/plan.py``.
"""

from __future__ import annotations

from rope_passes.passes.annotate_cache_offset import AnnotateCacheOffsetPass
from rope_passes.passes.base import PassContext, RopePass, RopePassResult, option
from rope_passes.passes.cleanup import CleanupPass
from rope_passes.passes.fold_text_mrope import FoldTextMRoPEPass
from rope_passes.passes.longrope_concat import LongRoPEConcatPass
from rope_passes.passes.lower_mrope import LowerMRoPEPass
from rope_passes.passes.name_batch_dim import NameBatchDimPass
from rope_passes.passes.narrow_int64 import NarrowInt64Pass
from rope_passes.passes.precompute_cos_sin import PrecomputeCosSinPass
from rope_passes.passes.total_seq_on_gpu import TotalSeqOnGpuPass
from rope_passes.passes.unfuse_gqa_qk_norm import UnfuseGQAQKNormPass

ALL_PASSES: dict[str, type[RopePass]] = {cls.name: cls for cls in (
    UnfuseGQAQKNormPass, FoldTextMRoPEPass, LowerMRoPEPass, LongRoPEConcatPass, AnnotateCacheOffsetPass,
    TotalSeqOnGpuPass, NarrowInt64Pass, PrecomputeCosSinPass, NameBatchDimPass, CleanupPass)}


__all__ = ["ALL_PASSES", "AnnotateCacheOffsetPass", "CleanupPass", "FoldTextMRoPEPass", "LongRoPEConcatPass",
           "LowerMRoPEPass", "NameBatchDimPass", "NarrowInt64Pass", "PassContext", "PrecomputeCosSinPass", "RopePass",
           "RopePassResult", "TotalSeqOnGpuPass", "UnfuseGQAQKNormPass", "option"]
