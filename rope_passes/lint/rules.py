"""The lint rules. Codes: RP0xx loading on the target runtime, RP1xx mRoPE, RP2xx graph capture, RP3xx rotary caches.

Each rule is a small function over the graph (and the RoPE census); its registration states code, name, severity,
summary, explanation and the pass that fixes it. Rules about loading and placement read the runtime target
(``ctx.runtime``, :mod:`rope_passes.runtimes`: its probed IR version limit, GroupQueryAttention input counts, registered
ops, kernel table), so ``lint --runtime R`` gives R's findings: a current Qwen3 build (16-input GQA) is RP002 on
onnxruntime-webgpu 1.27 and clean with the WebGPU plugin EP.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import onnx_ir as ir

from rope_passes.analysis.graph import MS_DOMAIN, flag, nodes_of
from rope_passes.analysis.longrope import ConcatCache, concat_cache
from rope_passes.lint.core import LintContext, Severity, rule
from rope_passes.report import MatchFailure, Place, place_of
from rope_passes.runtimes.probed import LoadProblem

if TYPE_CHECKING:
    from rope_passes.analysis.placement import Placement

Found = Iterator[tuple[Place, str]]


def _gqa(ctx: LintContext) -> list[ir.Node]:
    return nodes_of(ctx.model, "GroupQueryAttention", MS_DOMAIN)


def _context_length(ctx: LintContext) -> int | None:
    return ctx.genai_config.context_length


def _load_problems(ctx: LintContext, kind: str) -> list[LoadProblem]:
    return [p for p in ctx.load_problems if p.kind == kind]


@rule("RP001", "ir-version-unsupported", Severity.ERROR,
      "IR version newer than the target runtime accepts",
      """Both WebGPU runtimes (onnxruntime-webgpu 1.27, onnxruntime 1.31 + the WebGPU plugin EP) load IR versions up
      to 13 (probed); onnx 1.23 saves 14 by default, which fails with 'max supported IR version: 13'. Saving
      through rope-passes caps the IR version at 13.""",
      fix="cleanup")
def ir_version(ctx: LintContext) -> Found:
    target = ctx.runtime
    for _ in _load_problems(ctx, "ir-version"):
        yield "<model>", (f"IR version {ctx.model.ir_version} > {target.max_ir_version}: {target.label} will not "
                          "load it")


@rule("RP002", "gqa-input-count", Severity.ERROR,
      "GroupQueryAttention with more inputs than the target runtime accepts",
      """GroupQueryAttention takes 7 to 14 inputs in onnxruntime-webgpu 1.27 and 7 to 16 with onnxruntime 1.31 + the
      WebGPU plugin EP (probed). Builders that fuse q/k-norm into GQA (inputs 14/15) produce graphs 1.27 refuses to
      load; `unfuse-gqa-qk-norm` moves the norms back out (the `webgpu*` presets run it for 1.27 only).""",
      fix="unfuse-gqa-qk-norm")
def gqa_inputs(ctx: LintContext) -> Found:
    target = ctx.runtime
    low, high = target.gqa_range
    for problem in _load_problems(ctx, "gqa-inputs"):
        node = next(n for n in _gqa(ctx) if (n.name or "GroupQueryAttention") == problem.place)
        yield problem.place, (f"GroupQueryAttention has {len(node.inputs)} inputs ({target.label} accepts "
                               f"{low}..{high})")


@rule("RP003", "op-not-registered", Severity.ERROR,
      "an op the target runtime does not register: the graph does not load",
      """The target runtime's onnxruntime has no schema for this op (probed: every schema it knows was listed), so
      session creation fails with 'is not a registered function/op' on every EP. MRotaryEmbedding has its own rule
      (RP101) and fix.""")
def unregistered(ctx: LintContext) -> Found:
    for problem in _load_problems(ctx, "unregistered-op"):
        if problem.op != f"{MS_DOMAIN}::MRotaryEmbedding":
            yield problem.place, f"{problem.op} is not registered in {ctx.runtime.label}"


@rule("RP004", "unknown-attribute", Severity.ERROR,
      "an attribute the target runtime's schema for the op does not declare: the graph does not load",
      """onnxruntime checks every node's attributes against its own op schema and refuses the model ('Unrecognized
      attribute: rotary_embedding_dim for operator GroupQueryAttention'), on every EP. The schemas are the runtime's
      own (runtime_tables/<runtime>.schemas.json, dumped by tools/probe_schemas.py from onnxruntime's
      get_all_operator_schema), read for the schema version the model's opset selects. No pass removes an
      attribute: the exporter that wrote it targets another onnxruntime.""")
def unknown_attribute(ctx: LintContext) -> Found:
    for problem in _load_problems(ctx, "unknown-attribute"):
        yield problem.place, f"{problem.message.split('): ', 1)[-1]} in {ctx.runtime.label}"


@rule("RP101", "mrotary-embedding-unsupported", Severity.ERROR,
      "com.microsoft::MRotaryEmbedding cannot be loaded by the target runtime",
      """onnxruntime-webgpu 1.27 does not register MRotaryEmbedding at all, so the graph fails to load there;
      onnxruntime 1.31 + the WebGPU plugin EP runs it on WebGPU (probed). `lower-mrope` replaces it with standard ops
      + RotaryEmbedding (full 3-axis semantics; the presets run it for 1.27 only); for text-only use,
      `fold-text-mrope --text-only` folds it into GroupQueryAttention.""",
      fix="lower-mrope")
def mrotary(ctx: LintContext) -> Found:
    for problem in _load_problems(ctx, "unregistered-op"):
        if problem.op == f"{MS_DOMAIN}::MRotaryEmbedding":
            yield problem.place, f"MRotaryEmbedding is not registered in {ctx.runtime.label}"


@rule("RP102", "text-mrope-not-folded", Severity.WARNING,
      "mRoPE with provably text-only positions computed at run time",
      """The graph takes 2D position ids and tiles them to three identical mRoPE axes, so its mRoPE equals plain
      1D RoPE. The manual cos/sin subgraph costs time and its Shape paths force Memcpy, blocking graph capture.
      `fold-text-mrope` folds it into GroupQueryAttention (do_rotary=1) exactly.""",
      fix="fold-text-mrope")
def text_mrope(ctx: LintContext) -> Found:
    if ctx.census is None or "manual-mrope" not in ctx.census.flavours:
        return
    for pos in ctx.census.positions:
        if pos.tiled_to_3d:
            yield pos.name, f"manual mRoPE over 2D {pos.name} tiled to 3 identical axes: foldable into GQA"


@rule("RP103", "vl-mrope-text-use", Severity.NOTE,
      "mRoPE with 3D position ids from the caller",
      """Positions arrive as [3, batch, seq] from outside, so the graph cannot prove they are text-only.
      Folding mRoPE into GroupQueryAttention is exact only for text prompts: use
      `rope-passes optimize --text-only` (or `lint --fix --text-only`) for a text-only deployment, otherwise keep
      (or lower) the mRoPE.""",
      fix="fold-text-mrope", fix_option="text_only")
def vl_mrope(ctx: LintContext) -> Found:
    if ctx.census is None or not {"manual-mrope", "mrotary-embedding"} & set(ctx.census.flavours):
        return
    for pos in ctx.census.positions:
        if pos.rank == 3:
            yield pos.name, f"{pos.name} is a [3,B,S] input: mRoPE folds into GQA only with --text-only"


@rule("RP201", "total-seq-from-shape", Severity.WARNING,
      "total_sequence_length computed from Shape on CPU",
      """GroupQueryAttention's total_sequence_length comes from Shape(attention_mask) → Gather → Cast. Shape
      outputs live on the CPU, so onnxruntime inserts a Memcpy and WebGPU graph capture is refused.
      `total-seq-on-gpu` computes the same width from the mask on the GPU (int32 ReduceSum of a row of ones),
      with no Shape.""",
      fix="total-seq-on-gpu")
def total_seq(ctx: LintContext) -> Found:
    for group in ctx.census.attention if ctx.census is not None else ():
        if group.total_sequence_length_from_shape:
            for name in group.nodes:
                yield name, f"total_sequence_length comes from {group.total_sequence_length} on CPU"


@rule("RP202", "control-flow-blocks-capture", Severity.WARNING,
      "If/Loop/Scan nodes: WebGPU graph capture refused",
      """onnxruntime refuses enableGraphCapture when the graph has control flow. Builders emit
      If(Greater(total_len, original_max)) to switch LongRoPE cos/sin caches; `longrope-concat` replaces it
      with one concatenated table and records multiRotaryCacheConcatOffset.""",
      fix="longrope-concat")
def control_flow(ctx: LintContext) -> Found:
    for node in ctx.model.graph:
        if node.op_type in ("If", "Loop", "Scan") and node.domain in ("", "ai.onnx"):
            yield node, f"{node.op_type} node: graph capture will be refused"


def _capture(ctx: LintContext) -> Placement:
    """The capture verdict of the linted graph on the target runtime: the one home every command reads
    (:func:`rope_passes.analysis.placement.capture_verdict`), computed once per lint context."""
    from rope_passes.analysis.placement import capture_verdict

    return ctx.memo("capture_verdict", lambda: capture_verdict(ctx.model, ctx.runtime))


@rule("RP205", "memcpy-blocks-capture", Severity.WARNING,
      "onnxruntime will insert Memcpy nodes: WebGPU graph capture refused",
      """Static placement prediction for the target runtime (rope_passes.analysis.placement.capture_verdict, from
      its probed kernel table; checked against real capture sessions on every graph the project builds, both
      runtimes) with enableGraphCapture=1: tensors computed on the CPU (Shape math, int64 ops without WebGPU
      kernels) feed GPU nodes, so onnxruntime inserts Memcpy and refuses capture. Reported only where the static
      rules are sure; where they cannot place a node, RP220 says so instead. `narrow-int64` moves int64 position
      movement to the GPU in int32 (`total-seq-on-gpu`, RP201's fix, the attention-mask math); `fold-text-mrope`
      removes manual mRoPE shape paths.""",
      fix="narrow-int64")
def memcpy(ctx: LintContext) -> Found:
    placement = _capture(ctx)
    if placement.loads and placement.memcpy:
        first = placement.memcpy[0]
        yield "<model>", (f"{len(placement.memcpy)} Memcpy predicted with graph capture on, e.g. {first.kind} on "
                          f"{first.tensor!r}: capture will be refused")


@rule("RP220", "capture-unknown", Severity.NOTE,
      "whether WebGPU graph capture works cannot be told without the runtime",
      """The static placement rules cannot place some node (an element type or an (op, type) pair they do not know,
      or shape math onnxruntime may fold to a constant before placing), and no certain blocker was found: only a
      real session can tell whether capture works. Run `rope-passes check ORIGINAL REWRITTEN --graph-capture`, or
      `python -m rope_passes.runtime.placement_probe model.onnx --probe` to see onnxruntime's own placement.""")
def capture_unknown(ctx: LintContext) -> Found:
    placement = _capture(ctx)
    if placement.state == "unknown":
        yield "<model>", f"graph capture {placement.unknown_line()}"


def _capture_in_config(ctx: LintContext) -> bool | None:
    return ctx.genai_config.graph_capture if ctx.genai_config.present else None


@rule("RP221", "capture-on-not-ready", Severity.ERROR,
      "genai_config.json turns WebGPU graph capture on, but the graph is not capture-ready",
      """enableGraphCapture is "1" in the decoder's WebGPU provider options, and the graph has control flow or needs
      Memcpy nodes on the target runtime: onnxruntime refuses to create the session, so onnxruntime-genai fails to
      load the model. Remove the blockers (`rope-passes optimize --preset webgpu-graph`, which also sets the option
      to match), or set enableGraphCapture to "0" (`lint --fix` sets it to match the graph it leaves).""")
def capture_on_not_ready(ctx: LintContext) -> Found:
    if _capture_in_config(ctx) and _capture(ctx).state == "blocked":
        for node, why in _capture(ctx).blockers()[:5]:
            yield node, (f"enableGraphCapture='1' in genai_config.json, but capture will be refused (predicted from "
                         f"{ctx.runtime.label}'s probed table): {why}")


@rule("RP222", "capture-ready-but-off", Severity.NOTE,
      "the graph is WebGPU capture-ready, but genai_config.json leaves capture off",
      """The graph creates a WebGPU session with enableGraphCapture=1 (no control flow, no Memcpy), but the decoder's
      WebGPU provider options do not turn it on, so onnxruntime-genai runs every decode step without capture. Set
      "enableGraphCapture": "1" there (`rope-passes optimize --preset webgpu-graph` and `lint --fix` do).""")
def capture_ready_but_off(ctx: LintContext) -> Found:
    if _capture_in_config(ctx) is False and _capture(ctx).state == "ready":
        yield "<model>", (f"capture-ready (predicted from {ctx.runtime.label}'s probed table), but genai_config.json's "
                          "WebGPU provider options have enableGraphCapture off")


def _concat_cache(ctx: LintContext) -> ConcatCache | None:
    """The GQA cos/sin table that is a concatenated [short; long] LongRoPE table: longer than the context (the
    detector's :func:`~rope_passes.analysis.longrope.concat_cache`, the offset read as the rows past the context),
    or, where genai_config's context_length cannot split it (none, or past the table), the table the session proof
    reads as one by its rows (:func:`rope_passes.proofs.concat_offset.session_concat`, the proof
    ``annotate-cache-offset`` writes the offset by)."""
    context = _context_length(ctx)
    if context:
        try:
            return concat_cache(ctx.model, context_length=context)
        except MatchFailure:
            pass
    from rope_passes.proofs.concat_offset import session_concat

    try:
        return session_concat(ctx.model, context_length=context or None).tables[0]
    except MatchFailure:
        return None


@rule("RP203", "concat-cache-offset-missing", Severity.ERROR,
      "concatenated LongRoPE cache without multiRotaryCacheConcatOffset",
      """The cos/sin cache has more rows than the context length: a [short; long] LongRoPE concatenation. Without
      multiRotaryCacheConcatOffset in genai_config.json's WebGPU provider options, onnxruntime reads the short
      table past the switch point and results are wrong. `annotate-cache-offset` writes it.""",
      fix="annotate-cache-offset")
def concat_offset(ctx: LintContext) -> Found:
    found = _concat_cache(ctx)
    if found and not ctx.genai_config.concat_offset:
        yield found.gqa, (
            f"cos_cache has {found.rows} rows: a concatenated LongRoPE cache ({found.offset} short + "
            f"{found.rows - found.offset} long) and no multiRotaryCacheConcatOffset")


@rule("RP204", "webgpu-only-cache", Severity.NOTE,
      "concatenated LongRoPE cache: correct on WebGPU only",
      """multiRotaryCacheConcatOffset is a WebGPU EP option; the CPU EP has none and reads the concatenated
      table from row 0, so CPU results are wrong past the offset. Use this model with the WebGPU EP.""")
def webgpu_only(ctx: LintContext) -> Found:
    offset = ctx.genai_config.concat_offset
    if offset and _concat_cache(ctx):
        yield "<model>", f"multiRotaryCacheConcatOffset={offset}: CPU EP results are wrong past {offset} tokens"


@rule("RP301", "rotary-cache-layout", Severity.ERROR,
      "GQA cos/sin cache shape or dtype GroupQueryAttention cannot use",
      """With do_rotary=1, GroupQueryAttention's cos_cache/sin_cache are [max_pos, rotary_dim/2] in the query's
      dtype, with rotary_dim/2 a multiple of 8 and at most head_size/2; cos and sin must match.""")
def cache_layout(ctx: LintContext) -> Found:
    head = ctx.genai_config.head_size
    for node in _gqa(ctx):
        if not flag(node, "do_rotary") or len(node.inputs) < 9:
            continue
        cos, sin = node.inputs[7], node.inputs[8]
        name = place_of(node)
        if cos is None or sin is None:
            yield name, "do_rotary=1 but cos_cache/sin_cache are missing"
            continue
        if cos.shape != sin.shape or cos.dtype != sin.dtype:
            yield name, f"cos_cache {cos.shape} {cos.dtype} and sin_cache {sin.shape} {sin.dtype} differ"
        shape = cos.shape
        if shape is not None and len(shape) == 2 and isinstance(shape[1], int):
            half = shape[1]
            if half % 8:
                yield name, f"cos_cache has {half} columns: rotary_dim/2 must be a multiple of 8"
            if head and half > head // 2:
                yield name, f"cos_cache has {half} columns > head_size/2 = {head // 2}"
        query = node.inputs[0]
        if query is not None and query.dtype is not None and cos.dtype is not None and query.dtype != cos.dtype:
            yield name, f"cos_cache is {cos.dtype}, query is {query.dtype}: they must match"


@rule("RP302", "rotary-cache-short", Severity.WARNING,
      "cos/sin cache shorter than the context length",
      """Positions past the cache's last row have no rotation angle: GroupQueryAttention reads out of range.
      The cache needs at least context_length rows (genai_config.json model.context_length).""")
def cache_short(ctx: LintContext) -> Found:
    context = _context_length(ctx)
    longrope = ctx.census.longrope if ctx.census is not None else None
    if not context or (longrope is not None and longrope.kind == "if"):
        return  # LongRoPE If graphs switch between a short and a long table on purpose
    for node in _gqa(ctx):
        if flag(node, "do_rotary") and len(node.inputs) > 7 and node.inputs[7] is not None:
            shape = node.inputs[7].shape
            if shape is not None and isinstance(shape[0], int) and shape[0] < context:
                yield node, f"cos_cache has {shape[0]} rows < context length {context}"
