"""``total-seq-on-gpu``: compute GroupQueryAttention's ``seqlens_k`` and ``total_sequence_length`` on the GPU.

**Rewrites.** onnxruntime-genai's builder (without ``enable_webgpu_graph``) derives GQA's two length inputs from the
attention mask ``M [batch, total]`` (int64) as

* ``seqlens_k = Cast<int32>(Sub(ReduceSum(M, axes=[1], keepdims=0), 1))`` and
* ``total_sequence_length = Cast<int32>(Gather(Shape(M), 1))``.

onnxruntime-webgpu 1.27 has no int64 ``ReduceSum``/``Sub``/``Gather`` kernels and ``Shape`` writes to CPU memory, so
both land on CPU and two Memcpy nodes feed GQA: a WebGPU session with ``enableGraphCapture=1`` is refused. The pass
replaces both chains with what the builder emits for graph capture (its ``_graph`` variants)::

    m32 = Cast<int32>(M);  s = ReduceSum(m32, axes=[1], keepdims=0)
    seqlens_k = Sub(s, 1);  total_sequence_length = ReduceMax(s, keepdims=0)

All int32, all with WebGPU kernels, no ``Shape``: 0 Memcpy. The old chains are removed where nothing else reads
them (onnxruntime places a dead ``Shape`` chain too, with its Memcpy, and ``narrow-int64`` reads the placement).

**Exact when** (checked where possible, stated where not): ``seqlens_k`` is bit-identical (same sum, int32 is wide
enough for any mask length onnxruntime accepts). ``total_sequence_length`` becomes the largest row sum of ``M``
instead of its width; the two are equal when at least one row of the mask has no padding, which holds for every
mask onnxruntime-genai and Hugging Face build (the longest sequence of a batch is all ones). Under graph capture,
where genai binds the mask at its maximum length with zeros past the current one, the row sum is the *right*
value and the width is not — the reason the builder computes it this way.

**bfloat16 GroupQueryAttention**: no WebGPU runtime here has a bf16 GroupQueryAttention kernel (probed tables:
float16/float only), nor onnxruntime-webgpu 1.27's CPU EP (the session fails with ``NOT_IMPLEMENTED``), so moving the
length plumbing cannot make the model run or capture. The pass says so once (a note at the first bf16 GQA, :data:`BF16_GQA_NOTE`; ``narrow-int64`` and lint RP207
say the same) and rewrites nothing.

Int64 position movement that also lands on CPU (mRoPE position math) is the separate pass ``narrow-int64``,
which the ``webgpu-graph`` preset runs right after this one.

**The mask** is the graph input genai_config names as the decoder's ``attention_mask`` (``attention_mask`` without
a genai_config): a rank-2 integer input alone proves nothing (``input_ids`` has that look, and its row sums are
token ids). Where ``seqlens_k`` is computed some other way (not matched), only ``total_sequence_length`` is rewritten,
and only when ``seqlens_k`` provably reads that same mask and no other graph input.

**Refuses** (graph unchanged there, reason in the report): a mask that is not the attention mask graph input
(rank 2, integer);
``Shape`` with ``start``/``end``; ``Gather`` of another dimension than 1; a ``ReduceSum`` over other axes or with
``keepdims``; a Sub of something other than 1; the two chains reading different masks; a ``seqlens_k`` computed
otherwise that reads a graph input other than the mask (or none). GQA length inputs computed otherwise are "not
matched" with what was found.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import MS_DOMAIN, ancestors, nodes_of
from rope_passes.analysis.patterns import MASK_INPUT, SeqlensFromMaskSum, TotalSeqFromMaskShape, ValuePattern
from rope_passes.passes._rewrite import NodeTape, add_initializer
from rope_passes.passes.base import RopePass
from rope_passes.report import MatchFailure, PassReport

SEQLENS_K, TOTAL_SEQ = 5, 6

#: what the passes and lint say about a bf16 GroupQueryAttention. Both WebGPU runtimes' probed kernel tables
#: (rope_passes/runtime_tables) register GQA for T = float16/float only, and a one-node bf16 GQA session fails on
#: onnxruntime-webgpu 1.27's CPU EP too ("Could not find an implementation for GroupQueryAttention")
BF16_GQA_NOTE = ("GroupQueryAttention is bfloat16: neither WebGPU runtime (onnxruntime-webgpu 1.27, onnxruntime 1.31 "
                 "+ the WebGPU plugin EP) nor 1.27's CPU EP has a bf16 GroupQueryAttention kernel, so the model does "
                 "not run there whatever its int64 plumbing; rewriting that cannot help. Build it in fp16 or fp32")


def bf16_gqa(model: ir.Model) -> list[ir.Node]:
    """The GroupQueryAttention nodes whose query (input 0), or first output, is bfloat16."""
    out = []
    for gqa in nodes_of(model, "GroupQueryAttention", MS_DOMAIN):
        value = gqa.inputs[0] if gqa.inputs and gqa.inputs[0] is not None else gqa.outputs[0]
        if value.dtype == ir.DataType.BFLOAT16:
            out.append(gqa)
    return out


def note_bf16(model: ir.Model, report: PassReport) -> bool:
    """Record :data:`BF16_GQA_NOTE` once (and "not matched") when the model's GQA is bf16; True if it is."""
    found = bf16_gqa(model)
    if found:
        report.note(found[0].name or "GroupQueryAttention", BF16_GQA_NOTE, gqa=len(found))
        report.not_matched("<model>", "GroupQueryAttention is bfloat16: no onnxruntime kernel for it here, nothing "
                           "to move to the GPU")
    return bool(found)

def _match(pattern: ValuePattern, model: ir.Model, value: ir.Value, what: str) -> tuple[ir.Value, list[ir.Node]]:
    """(mask, the chain's nodes); MatchFailure.refuse (structure there, unsound) or .absent (structure absent)."""
    found = pattern.match_value(model, value, what)
    if found.refused:
        raise MatchFailure.refuse(found.reason, value.name or what)
    if not found.ok:
        raise MatchFailure.absent(found.reason, value.name or what)
    return found.bindings["mask"], found.nodes


def match_total_seq(model: ir.Model, value: ir.Value, mask: str = MASK_INPUT) -> tuple[ir.Value, list[ir.Node]]:
    """``Cast<int32>(Gather(Shape(M), 1))`` → (M, the chain's nodes), M the graph input ``mask``. Raises
    MatchFailure."""
    return _match(TotalSeqFromMaskShape((mask,)), model, value, "total_sequence_length")


def match_seqlens_k(model: ir.Model, value: ir.Value, mask: str = MASK_INPUT) -> tuple[ir.Value, list[ir.Node]]:
    """``Cast<int32>(Sub(ReduceSum(M, axes=[1], keepdims=0), 1))`` → (M, nodes), M the graph input ``mask``.
    Raises MatchFailure."""
    return _match(SeqlensFromMaskSum((mask,)), model, value, "seqlens_k")


def reads_only(value: ir.Value, mask: ir.Value) -> None:
    """MatchFailure.refuse unless ``value`` is computed from ``mask`` and from no other graph input."""
    nodes = ancestors([value])
    inputs = {id(v): v for n in nodes for v in n.inputs if v is not None and v.is_graph_input()}
    if value.is_graph_input():
        inputs[id(value)] = value
    others = sorted(v.name or "?" for v in inputs.values() if v is not mask)
    if others or id(mask) not in inputs:
        reads = f"reads {', '.join(map(repr, others))}" if others else f"does not read {mask.name!r}"
        raise MatchFailure.refuse(f"seqlens_k {value.name!r} is not matched and {reads}: not provably the row "
                                  f"lengths of the mask {mask.name!r} the new total_sequence_length is computed from",
                                  value.name or "seqlens_k")


class TotalSeqOnGpuPass(RopePass):
    name = "total-seq-on-gpu"
    summary = "compute GQA seqlens_k/total_sequence_length from the mask on the GPU (int32, no Shape): no Memcpy"

    def apply(self, model: ir.Model, report: PassReport) -> None:
        graph = model.graph
        gqas = nodes_of(graph, "GroupQueryAttention", MS_DOMAIN)
        if not gqas:
            raise MatchFailure.absent("no com.microsoft::GroupQueryAttention node")
        if note_bf16(model, report):
            return
        mask_name = self.genai_config.decoder_inputs.get("attention_mask", MASK_INPUT)
        by_pair: dict[tuple[int, int], tuple[ir.Value | None, ir.Value]] = {}
        failed: set[tuple[int, int]] = set()  # one finding per (seqlens_k, total) pair, not per layer
        stale: list[ir.Node] = []
        for gqa in gqas:
            if len(gqa.inputs) <= TOTAL_SEQ or gqa.inputs[SEQLENS_K] is None or gqa.inputs[TOTAL_SEQ] is None:
                report.not_matched(gqa.name or "GroupQueryAttention", "GQA without seqlens_k/total_sequence_length")
                continue
            seqlens, total = gqa.inputs[SEQLENS_K], gqa.inputs[TOTAL_SEQ]
            key = (id(seqlens), id(total))
            if key in failed:  # same length inputs as a GQA already reported
                continue
            if key in by_pair:
                new_seqlens, new_total = by_pair[key]
            else:
                try:
                    mask, old_nodes = match_total_seq(model, total, mask_name)
                    try:
                        seq_mask, seq_nodes = match_seqlens_k(model, seqlens, mask_name)
                        old_nodes = old_nodes + seq_nodes
                    except MatchFailure as failure:
                        if failure.refused:
                            raise
                        seq_mask = None  # seqlens_k already computed some other way: leave it, fix total only
                        reads_only(seqlens, mask)  # ... if it provably reads the same mask
                    if seq_mask is not None and seq_mask is not mask:
                        raise MatchFailure.refuse(f"seqlens_k reads mask {seq_mask.name!r} but total_sequence_length "
                                                  f"reads {mask.name!r}", seqlens.name or "seqlens_k")
                except MatchFailure as failure:
                    report.record(failure, gqa.name or "GroupQueryAttention")
                    failed.add(key)
                    continue
                new_seqlens, new_total = self._build(graph, mask, seqlens if seq_mask is not None else None, total)
                by_pair[key] = (new_seqlens, new_total)
                stale.extend(old_nodes)
                report.rewritten(
                    total.name or "total_sequence_length",
                    f"seqlens_k/total_sequence_length from int32 ReduceSum/ReduceMax of {mask.name!r} (no Shape)",
                    mask=mask.name, seqlens_k=new_seqlens.name if new_seqlens is not None else seqlens.name,
                    total_sequence_length=new_total.name,
                    seqlens_k_rewritten=seq_mask is not None,
                )
            if new_seqlens is not None:
                gqa.replace_input_with(SEQLENS_K, new_seqlens)
            gqa.replace_input_with(TOTAL_SEQ, new_total)
        # the old chains, where nothing else reads them (a dead Shape chain still gets placed, with its Memcpy)
        for node in stale:
            if node.graph is graph and not any(o.uses() or o.is_graph_output() for o in node.outputs):
                graph.remove(node, safe=True)

    @staticmethod
    def _build(graph: ir.Graph, mask: ir.Value, old_seqlens: ir.Value | None,
               old_total: ir.Value) -> tuple[ir.Value | None, ir.Value]:
        prefix = "/rope_passes/total_seq_on_gpu"
        axes = add_initializer(graph, f"{prefix}/axes", np.array([1], dtype=np.int64))
        one = add_initializer(graph, f"{prefix}/one", np.array([1], dtype=np.int32))
        i32 = ir.DataType.INT32
        batch = mask.shape[0] if mask.shape is not None else None
        tape = NodeTape()
        mask32 = tape.op("Cast", [mask], {"to": i32}, name=f"{prefix}/Cast", output=f"{prefix}/mask_int32", dtype=i32,
                         shape=mask.shape)
        lengths = tape.op("ReduceSum", [mask32, axes], {"keepdims": 0}, name=f"{prefix}/ReduceSum",
                          output=f"{prefix}/row_lengths", dtype=i32, shape=[batch])
        seqlens_k = tape.op("Sub", [lengths, one], name=f"{prefix}/Sub", output=f"{prefix}/seqlens_k", dtype=i32,
                            shape=[batch])
        total = tape.op("ReduceMax", [lengths], {"keepdims": 0}, name=f"{prefix}/ReduceMax",
                        output=f"{prefix}/total_sequence_length", dtype=i32, shape=[])
        # insert right after the mask's first reader so the graph stays topologically sorted
        first_user = next((n for n in graph if any(v is mask for v in n.inputs)), None)
        if first_user is not None:
            tape.insert_before(graph, first_user)
        else:
            tape.append(graph)
        if old_seqlens is None:  # seqlens_k is computed some other way: keep it, only total moves
            graph.remove(seqlens_k.producer(), safe=True)
            return None, total
        return seqlens_k, total
