"""LongRoPE and attention-dtype lint rules: where a configured WebGPU feature silently does not act.

* RP206 (error): a concatenated ``[short; long]`` LongRoPE cache read by a GroupQueryAttention with separate Q/K/V.
  WebGPU applies ``multiRotaryCacheConcatOffset`` on GQA's packed-QKV path only, so such a GQA reads row ``position``
  of the concatenation and is wrong from token ``offset + 1`` (the builder's ``enable_webgpu_graph`` with
  ``fuse_qkv=false`` emits exactly this). Fix: ``annotate-cache-offset`` packs Q/K/V.
* RP207 (note): bfloat16 GroupQueryAttention, which no WebGPU runtime here (nor 1.27's CPU EP) has a kernel for.
"""

from __future__ import annotations

from collections.abc import Iterator

from rope_passes.analysis.longrope import ConcatCache, concat_cache
from rope_passes.lint.core import LintContext, Severity, rule
from rope_passes.passes.longrope_concat import OFFSET_KEY
from rope_passes.passes.total_seq_on_gpu import BF16_GQA_NOTE, bf16_gqa
from rope_passes.report import MatchFailure

Found = Iterator[tuple[str, str]]


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
        yield gqa.name or "GroupQueryAttention", (
            f"reads the concatenated LongRoPE cache {found.cos.name!r} ({found.offset} short + "
            f"{found.rows - found.offset} long rows) with separate query/key/value: WebGPU ignores {said} there, "
            f"wrong past {found.offset} tokens")


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
        yield found[0].name or "GroupQueryAttention", BF16_GQA_NOTE + more
