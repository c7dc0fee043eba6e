"""``annotate-cache-offset``: find a concatenated LongRoPE cos/sin cache and write its offset where missing or wrong.

**Detects** (:func:`rope_passes.proofs.concat_offset.session_concat`, for each table read) a GroupQueryAttention (``do_rotary=1``) whose
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

**The whole session.** The offset is one value per session, applied by WebGPU to every GroupQueryAttention with
do_rotary=1 and packed QKV (:func:`rope_passes.proofs.concat_offset.offset_consumers`). The pass reads every distinct
cos/sin pair such a node reads (:func:`rope_passes.proofs.concat_offset.session_concat`) and writes the offset only when
every one is a fitted ``[short; long]`` pair split at the same row: a layer reading a plain table, or a second
concatenation split elsewhere, is refused, naming that GroupQueryAttention (nothing written). Several layers reading
one table, or different tables split at the same row, are fine.

**Removes a stale offset.** A genai_config.json that carries ``multiRotaryCacheConcatOffset`` for a graph in which no
GroupQueryAttention reads a concatenated cache (plain RoPE, an ``If`` switch, no rotary GQA at all) gets it removed,
with the metadata and WebGPU-only marks, reported as a genai_config change with the reason: WebGPU would otherwise
read row ``offset + position`` of a plain table past ``offset`` tokens. Lint RP208 flags it.

**Not matched**: no such GroupQueryAttention; cos/sin not constant tables; a row count other than
``original + max_positions`` (and no offset configured); an offset already configured that the model's metadata says
a pass of ours recorded (``longrope-concat``, which proves the switch it replaces by value), where the session reads
tables split there and only the fit of the rows refuses: tables rounded on the way (int8 codes, bf16, fp16) fit no
RoPE pair within float32's rounding, and refitting them says nothing the proof did not (the words say so). **Refuses** (graph and config unchanged): rows that do not
fit a short/long pair (where all rows are one RoPE table from row 0 and an offset is configured, that is plain RoPE
and the offset is removed), or halves with the same factors; no ``context_length`` in genai_config.json and no offset configured (nothing to split the
table by); separate Q/K/V that cannot be packed (one of key/value missing, not rank 3, mixed dtypes, widths that are
not the heads of one head size); a session consumer the offset would make wrong (above).
"""

from __future__ import annotations

import onnx_ir as ir

from rope_passes.passes._concat_offset import OFFSET_KEY, OFFSET_METADATA, pack_qkv, record_offset, remove_offset
from rope_passes.passes.base import RopePass
from rope_passes.proofs.concat_offset import (
    ANGLE_REL,
    ROW_TOLERANCE,
    Fit,
    SessionConcat,
    consumer_name,
    fit_frequencies,
    no_layer_honours,
    packable,
    rotary_gqas,
    session_concat,
)
from rope_passes.report import MatchFailure, PassReport

# the fit lives with the session proof (lint reads it too); named here for the callers that knew it here
__all__ = ["ANGLE_REL", "ROW_TOLERANCE", "AnnotateCacheOffsetPass", "Fit", "fit_frequencies"]


class AnnotateCacheOffsetPass(RopePass):
    name = "annotate-cache-offset"
    summary = ("detect a concatenated [short; long] LongRoPE cache, write multiRotaryCacheConcatOffset (or remove one "
               "no layer can honour), pack separate Q/K/V")

    def apply(self, model: ir.Model, report: PassReport) -> None:
        try:
            found = self._match(model)
        except MatchFailure as failure:
            if no_layer_honours(failure) and self._remove_stale(model, report, failure):
                return
            recorded = self.genai_config.concat_offset
            if failure.refused and self._recorded(model):
                report.not_matched(failure.place, f"{OFFSET_KEY} already {recorded}, recorded by a proof of ours "
                                   f"(longrope-concat's, by value); the rows, not re-fitted, fit no RoPE pair within "
                                   f"float32's rounding (tables rounded on the way: int8, bf16, fp16): {failure.reason}")
                return
            report.record(failure)
            return
        first = found.tables[0]
        target = first.cos
        unpacked = found.to_pack
        try:
            for gqa in unpacked:
                packable(gqa)
        except MatchFailure as failure:
            report.record(failure)
            return
        for gqa in unpacked:
            pack_qkv(model.graph, gqa)
            report.rewritten(consumer_name(gqa), f"separate query/key/value packed into one input "
                             f"(Concat on the hidden axis): {OFFSET_KEY} acts on packed QKV only")
        before = len(report.genai_config_changes) + len(report.metadata_changes)
        record_offset(model, self.genai_config, found.offset, report)
        if len(report.genai_config_changes) + len(report.metadata_changes) == before:
            if not unpacked:
                report.not_matched(target, f"{OFFSET_KEY} already {found.offset}")
        else:
            fits = found.fits
            report.rewritten(target, f"concatenated cache detected ({found.offset} short + "
                             f"{first.rows - found.offset} long rows): {OFFSET_KEY} = {found.offset}"
                             + (f", proved for all {len(found.consumers)} GroupQueryAttention nodes reading "
                                f"{len(found.tables)} tables" if len(found.tables) > 1 else ""),
                             offset=found.offset, short_fit_error=max(f.short_error for f in fits),
                             long_fit_error=max(f.long_error for f in fits), consumers=len(found.consumers))

    def _recorded(self, model: ir.Model) -> bool:
        """The configured offset is the one the model's metadata says a pass of ours recorded, and the session reads
        concatenated tables split there (every check but the fit of the rows: :func:`session_concat` without it),
        with nothing to pack: the fit alone refuses, and it refits what that pass proved."""
        configured = self.genai_config.concat_offset
        if not configured or model.metadata_props.get(OFFSET_METADATA) != str(configured):
            return False
        try:
            found = session_concat(model, context_length=None, offset=configured, fit=False)
        except MatchFailure:
            return False
        return found.offset == configured and not found.to_pack

    def _remove_stale(self, model: ir.Model, report: PassReport, failure: MatchFailure) -> bool:
        """No GroupQueryAttention reads a concatenated cache by genai_config's lengths (``failure`` says why): remove a
        configured offset, which WebGPU would apply to every packed-QKV rotary GroupQueryAttention, unless the tables
        read at that offset are a [short; long] pair (or the proof there refuses: the offset stays, the refusal is
        recorded). True when the case is settled here (removed, kept or refused)."""
        configured = self.genai_config.concat_offset
        if not configured:
            return False
        # the proof read the tables by genai_config's lengths; before removing, read them at the offset itself: a
        # [short; long] pair split there (whatever context_length says) honours it, and the offset stays
        try:
            session_concat(model, context_length=None, offset=configured)
        except MatchFailure as at_offset:
            if not no_layer_honours(at_offset):
                report.record(at_offset)
                return True
        else:
            report.not_matched(failure.place, f"{OFFSET_KEY}={configured} kept: the cos/sin rows are a [short; long] "
                               f"pair split there ({failure.reason}, by genai_config's lengths)")
            return True
        readers = rotary_gqas(model)
        who = (f"{len(readers)} GroupQueryAttention node(s) with do_rotary=1, none reading a concatenated [short; "
               f"long] cache ({failure.reason})" if readers else f"no GroupQueryAttention reads a rotary cache "
               f"({failure.reason})")
        why = (f"no layer can honour {OFFSET_KEY}={configured}: {who}; WebGPU would read row {configured} + "
               f"position of a plain table past {configured} tokens")
        changes = remove_offset(model, self.genai_config, why, report)
        if not changes:
            return False
        report.rewritten(failure.place, f"removed {OFFSET_KEY}={configured} from genai_config.json: {why}",
                         offset_removed=configured)
        return True

    def _match(self, model: ir.Model) -> SessionConcat:
        """The concatenated cache(s) every offset consumer of the session reads, at one offset, fitted;
        MatchFailure where there is none (absent) or one breaks the proof (refuse, naming it)."""
        context = self.genai_config.context_length
        if context is None:
            # without a context length only a configured offset splits the table (the fit then decides); without
            # either, session_concat refuses (original alone is not enough)
            return session_concat(model, context_length=None, offset=self.genai_config.concat_offset)
        return session_concat(model, context_length=context, offset=self.genai_config.original_context_length)
