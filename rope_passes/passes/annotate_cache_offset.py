"""``annotate-cache-offset``: find a concatenated LongRoPE cos/sin cache and write its offset where missing or wrong.

**Detects** a GroupQueryAttention (``do_rotary=1``) whose ``cos_cache``/``sin_cache`` are initializers of
``original + max_positions`` rows, ``max_positions`` = ``genai_config.json``'s ``context_length`` and ``original``
the rest (or ``original_max_position_embeddings`` where the config has it), and checks the rows are really two tables: row ``original + p`` must equal the RoPE of position
``p`` under a *long* factor set and row ``p < original`` under a *short* one. The factors are recovered from the
table itself: each half's per-column frequency ``w`` is the least-squares slope of the unwrapped phase
``atan2(sin, cos)`` over its positions, and every row must then match ``scale * cos(p * w)`` / ``scale * sin(p * w)``
(``scale`` = the half's row 0, LongRoPE's attention scaling) within the dtype's rounding (2e-3 float16, 1e-4
float32), and the two halves' frequencies must differ — a table that is not a [short; long] pair is refused.

**Writes** ``multiRotaryCacheConcatOffset = original`` into ``genai_config.json``'s WebGPU provider options and the
model metadata (the same as ``longrope-concat``), and marks the model WebGPU-only (the CPU EP has no offset). The
graph itself is not changed. Already right: "not matched" with that finding.

**Refuses**: row count other than ``original + max_positions``; rows that do not fit a short/long pair; no
genai_config.json (nothing to read ``original`` from).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import MS_DOMAIN, attr, nodes_of
from rope_passes.passes.base import RopePass
from rope_passes.passes.longrope_concat import OFFSET_KEY, record_offset
from rope_passes.report import PassReport

#: worst row error of a fitted table: float16 rounds values ~1.3 (LongRoPE scaling) to 1e-3 steps; float32 to ~1e-7
ROW_TOLERANCE = {ir.DataType.FLOAT16: 2e-3, ir.DataType.FLOAT: 1e-4}


def fit_frequencies(cos: np.ndarray, sin: np.ndarray, rows: range) -> tuple[np.ndarray, float]:
    """Per-column angular frequency of a cos/sin table over ``rows`` (first row = position 0), and the worst error
    of ``scale * cos(p * w)`` / ``scale * sin(p * w)`` against the table (scale = row 0, the attention scaling)."""
    c = cos.astype(np.float64)[rows.start : rows.stop]
    s = sin.astype(np.float64)[rows.start : rows.stop]
    scale = c[0]
    phase = np.unwrap(np.arctan2(s, c), axis=0)
    p = np.arange(c.shape[0], dtype=np.float64)[:, None]
    w = (p * phase).sum(axis=0) / max(float((p * p).sum()), 1.0)
    err = max(float(np.max(np.abs(scale * np.cos(p * w) - c))), float(np.max(np.abs(scale * np.sin(p * w) - s))))
    return w, err


class AnnotateCacheOffsetPass(RopePass):
    name = "annotate-cache-offset"
    summary = "detect a concatenated [short; long] LongRoPE cache and write multiRotaryCacheConcatOffset"

    def apply(self, model: ir.Model, report: PassReport) -> None:
        gqas = [n for n in nodes_of(model, "GroupQueryAttention", MS_DOMAIN)
                if attr(n, "do_rotary", 0) and len(n.inputs) > 8 and n.inputs[7] is not None]
        if not gqas:
            report.not_matched("<model>", "no GroupQueryAttention with do_rotary=1 and a cos_cache")
            return
        cos = gqas[0].inputs[7]
        if cos.const_value is None:
            report.not_matched(cos.name or "cos_cache", "cos_cache is not an initializer")
            return
        context = self.genai_config.decoder.get("context_length") or self.genai_config.model.get("context_length")
        if not isinstance(context, int):
            report.refused("<model>", "no context_length in genai_config.json to split the cache by")
            return
        rows = cos.const_value.shape[0]
        original = self.genai_config.original_context_length or rows - context
        if rows != original + context or original <= 1:
            report.not_matched(cos.name or "cos_cache", f"cos_cache has {rows} rows, not original + context "
                               f"{context} (not a concatenated cache)")
            return
        sin = gqas[0].inputs[8]
        if sin is None or sin.const_value is None or sin.const_value.shape != cos.const_value.shape:
            report.not_matched(cos.name or "cos_cache", "sin_cache is not an initializer shaped like cos_cache")
            return
        cos_t, sin_t = cos.const_value.numpy(), sin.const_value.numpy()
        tolerance = ROW_TOLERANCE.get(cos.const_value.dtype, 2e-3)
        short, short_err = fit_frequencies(cos_t, sin_t, range(original))
        long, long_err = fit_frequencies(cos_t, sin_t, range(original, rows))
        if max(short_err, long_err) > tolerance:
            report.refused(cos.name or "cos_cache", f"rows do not fit a short+long RoPE pair (worst row error "
                           f"{max(short_err, long_err):.2e} > {tolerance})")
            return
        if np.allclose(short, long, rtol=1e-3, atol=0):
            report.refused(cos.name or "cos_cache", "short and long halves use the same factors: not LongRoPE")
            return
        before = len(report.genai_config_changes) + len(report.metadata_changes)
        record_offset(model, self.genai_config, original, report)
        if len(report.genai_config_changes) + len(report.metadata_changes) == before:
            report.not_matched(cos.name or "cos_cache", f"{OFFSET_KEY} already {original}")
        else:
            report.rewritten(cos.name or "cos_cache", f"concatenated cache detected ({original} short + {context} "
                             f"long rows): {OFFSET_KEY} = {original}", offset=original,
                             short_fit_error=short_err, long_fit_error=long_err)
