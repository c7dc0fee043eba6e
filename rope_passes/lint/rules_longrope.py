"""LongRoPE and attention-dtype lint rules: where a configured WebGPU feature silently does not act.

* RP206 (error): a concatenated ``[short; long]`` LongRoPE cache read by a GroupQueryAttention with separate Q/K/V.
  WebGPU applies ``multiRotaryCacheConcatOffset`` on GQA's packed-QKV path only, so such a GQA reads row ``position``
  of the concatenation and is wrong from token ``offset + 1`` (the builder's ``enable_webgpu_graph`` with
  ``fuse_qkv=false`` emits exactly this). Fix: ``annotate-cache-offset`` packs Q/K/V.
* RP207 (note): bfloat16 GroupQueryAttention, which no WebGPU runtime here (nor 1.27's CPU EP) has a kernel for.
* RP208 (error): ``multiRotaryCacheConcatOffset`` configured, but no GroupQueryAttention reads a concatenated cache
  split there: WebGPU applies it to every packed-QKV rotary GQA of the session, which then reads row
  ``offset + position`` of a plain table. On any graph, LongRoPE or not. Fix: ``annotate-cache-offset`` removes it.
* RP209 (error): the offset is right for some layers and wrong for others (a layer reading a plain table, or a
  second concatenation split elsewhere): one value per session cannot serve them all; no pass fixes it.

The session facts (which GQAs read the offset, whether a table is a ``[short; long]`` pair split at it) are
:mod:`rope_passes.proofs.concat_offset`'s, the ones ``longrope-concat`` and ``annotate-cache-offset`` prove with.
"""

from __future__ import annotations

from collections.abc import Iterator

from rope_passes.analysis.bf16 import BF16_GQA_NOTE, bf16_gqa
from rope_passes.analysis.longrope import ConcatCache, concat_cache
from rope_passes.config import CONCAT_OFFSET_OPTION as OFFSET_KEY
from rope_passes.lint.core import LintContext, Severity, rule
from rope_passes.proofs.concat_offset import consumer_name, no_layer_honours, offset_consumers, session_concat
from rope_passes.report import MatchFailure, Place

Found = Iterator[tuple[Place, str]]


def concat_cache_of(ctx: LintContext) -> ConcatCache | None:
    """The concatenated LongRoPE table (:func:`~rope_passes.analysis.longrope.concat_cache`): of ``offset + context``
    rows at the configured offset, else the rows past the context length; None when the graph has none."""
    context, offset = ctx.genai_config.context_length, ctx.genai_config.concat_offset
    for split in ([offset] if offset else []) + [None]:
        if context is None and split is None:
            continue
        try:
            return concat_cache(ctx.model, context_length=context, offset=split)
        except MatchFailure:
            continue
    return None


@rule("RP206", "concat-offset-ignored", Severity.ERROR,
      "concatenated LongRoPE cache read by GroupQueryAttention with separate Q/K/V: the offset is ignored there",
      """WebGPU's GroupQueryAttention applies multiRotaryCacheConcatOffset only on its packed-QKV path (query packed,
      key/value inputs empty): with separate query/key/value it reads row `position` of the concatenated [short;
      long] cos/sin table whatever the offset, i.e. the short table's continuation past the switch, and logits are
      wrong from token offset + 1 (by ~3 on the builder's Phi-3/Phi-4 enable_webgpu_graph fuse_qkv=false graphs).
      `annotate-cache-offset` packs Q/K/V into one Concat (exact: GQA splits it back into the same heads).""",
      fix="annotate-cache-offset")
def concat_offset_ignored(ctx: LintContext) -> Found:
    found = concat_cache_of(ctx)
    if found is None:
        return
    configured = ctx.genai_config.concat_offset
    said = f"{OFFSET_KEY}={configured}" if configured else f"{OFFSET_KEY} (not set yet)"
    for gqa in found.ignoring_offset:
        yield gqa, (
            f"reads the concatenated LongRoPE cache {found.cos.name!r} ({found.offset} short + "
            f"{found.rows - found.offset} long rows) with separate query/key/value: WebGPU ignores {said} there, "
            f"wrong past {found.offset} tokens")


def _session_verdict(ctx: LintContext) -> tuple[int, MatchFailure | None, int | None] | None:
    """(configured offset, the session proof's failure at it or None, the split the tables really have or None);
    None when no offset is configured. One evaluation shared by RP208 and RP209."""
    return ctx.memo("RP208-RP209", lambda: _session_evaluation(ctx))


def _session_evaluation(ctx: LintContext) -> tuple[int, MatchFailure | None, int | None] | None:
    offset = ctx.genai_config.concat_offset
    out: tuple[int, MatchFailure | None, int | None] | None = None
    if offset:
        context = ctx.genai_config.context_length
        try:
            found = session_concat(ctx.model, context_length=context, offset=offset)
            out = (offset, None, found.offset)
        except MatchFailure as failure:
            real = None
            try:  # not split at the offset: split elsewhere (by the context length, else where sin restarts)?
                real = session_concat(ctx.model, context_length=context).offset
            except MatchFailure:
                real = None
            out = (offset, failure, real)
    return out


@rule("RP208", "concat-offset-without-concat-cache", Severity.ERROR,
      "multiRotaryCacheConcatOffset configured, but no GroupQueryAttention reads a concatenated cache split there",
      """multiRotaryCacheConcatOffset is one WebGPU provider option for the whole session: every GroupQueryAttention
      with do_rotary=1 and packed QKV reads row (total > offset ? offset : 0) + position of its cos/sin cache. Only
      a [short; long] LongRoPE concatenation split at that row is read right that way; a plain table (or an If
      switch) is read offset rows too far once the call passes offset tokens. On any graph, LongRoPE or not.
      `annotate-cache-offset` removes the offset (or corrects it where the graph's concatenation splits elsewhere).""",
      fix="annotate-cache-offset")
def concat_offset_without_cache(ctx: LintContext) -> Found:
    verdict = _session_verdict(ctx)
    if verdict is None:
        return
    offset, failure, real = verdict
    if failure is None:
        return
    if real is not None and real != offset:
        yield "<model>", (f"{OFFSET_KEY}={offset}, but the concatenated cos/sin cache splits at {real}: every "
                          f"layer reads the wrong rows past {min(offset, real)} tokens")
        return
    if not no_layer_honours(failure):
        return
    readers = offset_consumers(ctx.model)
    who = (f"{len(readers)} packed-QKV GroupQueryAttention node(s) with do_rotary=1 (first "
           f"{consumer_name(readers[0])!r}) read no concatenated cache ({failure.reason})" if readers
           else f"no GroupQueryAttention reads a rotary cache at an offset ({failure.reason})")
    yield "<model>", f"{OFFSET_KEY}={offset} in genai_config.json, but {who}: no layer can honour it"


@rule("RP209", "concat-offset-not-for-every-layer", Severity.ERROR,
      "multiRotaryCacheConcatOffset is right for some GroupQueryAttention layers and wrong for others",
      """The offset is one value for the whole session and WebGPU applies it to every packed-QKV GroupQueryAttention
      with do_rotary=1. When one layer reads a [short; long] concatenation split at the offset and another a plain
      table (or a concatenation split elsewhere), no single value is right for both: the named layer is wrong past
      the offset. No pass fixes it (longrope-concat and annotate-cache-offset refuse such graphs); rebuild the model
      with one concatenated table (or one split) for every layer.""")
def concat_offset_not_for_every_layer(ctx: LintContext) -> Found:
    verdict = _session_verdict(ctx)
    if verdict is None:
        return
    offset, failure, _ = verdict
    if failure is not None and failure.details.get("breaks_session"):
        yield failure.place, f"with {OFFSET_KEY}={offset}: {failure.reason}"


@rule("RP207", "bf16-attention", Severity.NOTE,
      "bfloat16 GroupQueryAttention: no onnxruntime kernel for it here",
      """Both WebGPU runtimes (onnxruntime-webgpu 1.27, onnxruntime 1.31 + the WebGPU plugin EP) register
      GroupQueryAttention for float16 and float only (probed kernel tables), and 1.27's CPU EP has no bf16 kernel
      either: a bf16 GQA fails at session creation (NOT_IMPLEMENTED, 'Could not find an implementation for
      GroupQueryAttention'). No rope-passes rewrite changes that (total-seq-on-gpu and narrow-int64 leave the int64
      plumbing alone and say so); build the model in fp16 or fp32 for WebGPU.""")
def bf16_attention(ctx: LintContext) -> Found:
    found = bf16_gqa(ctx.model)
    if found:
        more = f" ({len(found)} GroupQueryAttention nodes)" if len(found) > 1 else ""
        yield found[0], BF16_GQA_NOTE + more
