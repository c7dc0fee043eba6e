"""``annotate-cache-offset``: find a concatenated LongRoPE cos/sin cache and write its offset where missing or wrong.

**Detects** (:func:`rope_passes.analysis.longrope.concat_cache`) a GroupQueryAttention (``do_rotary=1``) whose
``cos_cache``/``sin_cache`` are constant tables of ``original + max_positions`` rows, ``max_positions`` =
``genai_config.json``'s ``context_length`` and ``original`` the rest (or ``original_max_position_embeddings`` where
the config has it), and checks the rows are really two tables: row ``original + p`` must equal the RoPE of position
``p`` under a *long* factor set and row ``p < original`` under a *short* one. The factors are recovered from the
table itself: each half's per-column frequency ``w`` is the least-squares slope of the unwrapped phase
``atan2(sin, cos)`` over its positions, and every row must then match ``scale * cos(p * w)`` / ``scale * sin(p * w)``
(``scale`` = the half's row 0, LongRoPE's attention scaling) within the dtype's rounding (2e-3 float16, 1e-4
float32) plus the float32 rounding of the angle ``p * w`` that builders make (``|p * w| * 2**-22``: 0.03 rad at
row 131072, where a misplaced split is off by ~1), and the two halves' frequencies must differ — a table that
is not a [short; long] pair is refused.

**Writes** ``multiRotaryCacheConcatOffset = original`` into ``genai_config.json``'s WebGPU provider options and the
model metadata (the same as ``longrope-concat``), and marks the model WebGPU-only (the CPU EP has no offset).
Already right: "not matched" with that finding.

**Packs Q/K/V** where a GroupQueryAttention reading the table takes separate query/key/value inputs (the builder's
``enable_webgpu_graph`` with ``fuse_qkv=false`` emits exactly that): WebGPU's GQA applies the offset on its packed-QKV
path only, so there it reads row ``position`` of the concatenation and is wrong from token ``original + 1`` (lint
RP206). The pass feeds it ``Concat(q, k, v, axis=-1)`` with key/value empty (``longrope-concat``'s ``pack_qkv``):
GQA splits the packed input back into ``num_heads``, ``kv_num_heads``, ``kv_num_heads`` heads, so the attention is
the same tensors, exact on every EP, one copy per layer. This is the pass's one graph change; it is done even where
the offset was already right.

**Not matched**: no such GroupQueryAttention; cos/sin not constant tables; a row count other than
``original + max_positions``. **Refuses** (graph and config unchanged): rows that do not fit a short/long pair, or
halves with the same factors; no ``context_length`` in genai_config.json (nothing to split the table by); separate
Q/K/V that cannot be packed (one of key/value missing, not rank 3, mixed dtypes, widths that are not the heads of one
head size).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import const_tensor
from rope_passes.analysis.longrope import ConcatCache, concat_cache
from rope_passes.passes.base import RopePass
from rope_passes.passes.longrope_concat import OFFSET_KEY, pack_qkv, packable, record_offset
from rope_passes.report import MatchFailure, PassReport

#: worst row error of a fitted table: float16 rounds values ~1.3 (LongRoPE scaling) to 1e-3 steps; float32 to ~1e-7
ROW_TOLERANCE = {ir.DataType.FLOAT16: 2e-3, ir.DataType.FLOAT: 1e-4}
#: builders compute the angle ``p * w`` in float32 (``torch.outer(t, inv_freq)``): the product and ``w`` itself are
#: rounded, so a row's angle is off by up to ``|p * w| * 2**-23`` (4e-3 rad at position 131072); allowed twice that
ANGLE_REL = 2.0**-22


@dataclasses.dataclass(frozen=True)
class Fit:
    """Per-column angular frequencies of one half and how well every row fits them."""

    w: np.ndarray
    error: float  # worst |scale * cos(p * w) - row| over rows and columns
    excess: float  # worst error / allowed error (<= 1: every row fits)
    row: int  # the row (within the half) of the worst excess


#: rows per step of the fit: two passes over ~3 MB pieces instead of a dozen table-sized temporaries (a 131072-row
#: table's float64 temporaries are 50 MB each, paid in page faults on every call)
FIT_CHUNK = 8192


def fit_frequencies(cos: np.ndarray, sin: np.ndarray, rows: range, tolerance: float) -> Fit:
    """Per-column angular frequency of a cos/sin table over ``rows`` (first row = position 0), and the worst error
    of ``scale * cos(p * w)`` / ``scale * sin(p * w)`` against the table (scale = row 0, the attention scaling),
    allowed ``tolerance`` (the dtype's rounding) plus the float32 rounding of the angle ``p * w`` (ANGLE_REL).

    ``w`` is the least-squares slope through 0 of the unwrapped phase ``atan2(sin, cos)``; unwrapping adds the
    multiple of 2π that brings each step within (-π, π], exact for RoPE, whose per-row step ``w`` is at most 1."""
    n = len(rows)
    if n == 0:
        return Fit(w=np.zeros(cos.shape[1]), error=0.0, excess=0.0, row=0)
    scale = cos[rows.start].astype(np.float64)
    # pass 1: sum(p * phase) over the unwrapped phase, carried from piece to piece
    moment = np.zeros(cos.shape[1])
    last = None
    for lo in range(0, n, FIT_CHUNK):
        hi = min(lo + FIT_CHUNK, n)
        phase = np.arctan2(sin[rows.start + lo : rows.start + hi].astype(np.float64),
                           cos[rows.start + lo : rows.start + hi].astype(np.float64))
        prev = phase[:1] if last is None else last[None, :]
        step = np.diff(phase, axis=0, prepend=prev)
        step -= (2 * np.pi) * np.round(step / (2 * np.pi))
        phase = prev + np.cumsum(step, axis=0)
        last = phase[-1]
        moment += np.arange(lo, hi, dtype=np.float64) @ phase
    w = moment / max(float((n - 1) * n * (2 * n - 1) / 6), 1.0)  # sum of p*p over 0..n-1
    # pass 2: every row against scale * cos/sin(p * w)
    error = excess = 0.0
    row = 0
    for lo in range(0, n, FIT_CHUNK):
        hi = min(lo + FIT_CHUNK, n)
        angle = np.arange(lo, hi, dtype=np.float64)[:, None] * w
        allowed = tolerance + np.abs(scale) * np.abs(angle) * ANGLE_REL
        err = np.maximum(np.abs(scale * np.cos(angle) - cos[rows.start + lo : rows.start + hi]),
                         np.abs(scale * np.sin(angle) - sin[rows.start + lo : rows.start + hi]))
        ratio = err / allowed
        at = int(np.argmax(ratio))
        error = max(error, float(err.max()))
        if ratio.flat[at] > excess:
            excess, row = float(ratio.flat[at]), lo + at // ratio.shape[1]
    return Fit(w=w, error=error, excess=excess, row=row)


class AnnotateCacheOffsetPass(RopePass):
    name = "annotate-cache-offset"
    summary = ("detect a concatenated [short; long] LongRoPE cache, write multiRotaryCacheConcatOffset, pack separate "
               "Q/K/V")

    def apply(self, model: ir.Model, report: PassReport) -> None:
        try:
            found, errors = self._match(model)
        except MatchFailure as failure:
            report.record(failure)
            return
        short_err, long_err = errors
        target = found.cos.name or "cos_cache"
        unpacked = found.ignoring_offset
        try:
            for gqa in unpacked:
                packable(gqa, gqa.name or "GroupQueryAttention")
        except MatchFailure as failure:
            report.record(failure)
            return
        for gqa in unpacked:
            pack_qkv(model.graph, gqa)
            report.rewritten(gqa.name or "GroupQueryAttention", f"separate query/key/value packed into one input "
                             f"(Concat on the hidden axis): {OFFSET_KEY} acts on packed QKV only")
        before = len(report.genai_config_changes) + len(report.metadata_changes)
        record_offset(model, self.genai_config, found.offset, report)
        if len(report.genai_config_changes) + len(report.metadata_changes) == before:
            if not unpacked:
                report.not_matched(target, f"{OFFSET_KEY} already {found.offset}")
        else:
            report.rewritten(target, f"concatenated cache detected ({found.offset} short + {found.context_length} "
                             f"long rows): {OFFSET_KEY} = {found.offset}", offset=found.offset,
                             short_fit_error=short_err, long_fit_error=long_err)

    def _match(self, model: ir.Model) -> tuple[ConcatCache, tuple[float, float]]:
        """The concatenated cache and the fit errors of its short and long halves; MatchFailure where it is not one."""
        context = self.genai_config.decoder.get("context_length") or self.genai_config.model.get("context_length")
        context = context if isinstance(context, int) else None
        # without a context length nothing splits the table: concat_cache refuses (original alone is not enough)
        found = concat_cache(model, context_length=context,
                             offset=self.genai_config.original_context_length if context is not None else None)
        target = found.cos.name or "cos_cache"
        cos = const_tensor(found.cos)
        cos_t, sin_t = cos.numpy(), const_tensor(found.sin).numpy()
        tolerance = ROW_TOLERANCE.get(cos.dtype, 2e-3)
        short = fit_frequencies(cos_t, sin_t, range(found.offset), tolerance)
        long = fit_frequencies(cos_t, sin_t, range(found.offset, found.rows), tolerance)
        for half, fit, first in (("short", short, 0), ("long", long, found.offset)):
            if fit.excess > 1.0:
                raise MatchFailure.refuse(f"rows do not fit a short+long RoPE pair: {half} half, row "
                                          f"{first + fit.row} is off by {fit.excess:.1f}x the allowed error "
                                          f"({tolerance:g} + float32 angle rounding)", target)
        if np.allclose(short.w, long.w, rtol=1e-3, atol=0):
            raise MatchFailure.refuse("short and long halves use the same factors: not LongRoPE", target)
        return found, (short.error, long.error)
