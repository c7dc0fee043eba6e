"""``total-seq-on-gpu``: compute GroupQueryAttention's ``seqlens_k`` and ``total_sequence_length`` on the GPU.

**Rewrites.** onnxruntime-genai's builder (without ``enable_webgpu_graph``) derives GQA's two length inputs from the
attention mask ``M [batch, total]`` (int64) as

* ``seqlens_k = Cast<int32>(Sub(ReduceSum(M, axes=[1], keepdims=0), 1))`` and
* ``total_sequence_length = Cast<int32>(Gather(Shape(M), 1))``.

onnxruntime-webgpu 1.27 has no int64 ``ReduceSum``/``Sub``/``Gather`` kernels and ``Shape`` writes to CPU memory, so
both land on CPU and two Memcpy nodes feed GQA: a WebGPU session with ``enableGraphCapture=1`` is refused. The pass
replaces both chains with int32 arithmetic on the mask (one computation per mask, shared by every layer)::

    m32 = Cast<int32>(M);  seqlens_k = Sub(ReduceSum(m32, axes=[1], keepdims=0), 1)
    total_sequence_length = ReduceMax(ReduceSum(Add(Mul(m32, 0), 1), axes=[1], keepdims=0))   # the width of M

All int32, all with WebGPU kernels, no ``Shape``: 0 Memcpy. The old chains are removed where nothing else reads
them (onnxruntime places a dead ``Shape`` chain too, with its Memcpy, and ``narrow-int64`` reads the placement).

**Exact when.** ``total_sequence_length`` is the mask's width, as ``Shape`` gave it, for every mask with a row (a
row of ones summed: the width of each row; their maximum, the width; an empty batch has no row, and ReduceMax of
nothing is the int32 minimum, which GroupQueryAttention rejects, where onnxruntime 1.27's CPU EP ends the process on
the original: red team 36). ``seqlens_k`` is the same row sum minus one, in int32
instead of int64: bit-identical whenever a row sums below 2³¹, i.e. for every 0/1 mask onnxruntime can hold (a mask
2³¹ wide is 16 GiB). Only a mask of other values whose row reaches 2³¹ tells them apart (the original's Cast
wraps that sum around, the int32 ReduceSum saturates: two nonsense lengths). The builder's own ``_graph`` variant takes the *largest row sum* as the
total instead; that differs from the width for a mask where no row is all ones (Hugging Face's
``padding="max_length"``, batch 1 right-padded): the prefill then fails in GroupQueryAttention and a decode returns a
shorter KV cache. Under graph capture the value does not matter: the WebGPU GQA kernel takes
``total_sequence_length`` on the GPU then and reads the lengths from ``seqlens_k`` (its CPU-memory input 6 is
declared only without capture); ``check --graph-capture`` binds the mask at its maximum length, zeros after the
current one, and compares with the original run on exact-length masks.

**bfloat16 GroupQueryAttention**: no WebGPU runtime here has a bf16 GroupQueryAttention kernel (probed tables:
float16/float only), nor onnxruntime-webgpu 1.27's CPU EP (the session fails with ``NOT_IMPLEMENTED``), so moving the
length plumbing cannot make the model run or capture. The pass says so once (a note at the first bf16 GQA, :data:`rope_passes.analysis.bf16.BF16_GQA_NOTE`; ``narrow-int64`` and lint RP207
say the same) and rewrites nothing.

Int64 position movement that also lands on CPU (mRoPE position math) is the separate pass ``narrow-int64``,
which the ``webgpu-graph`` preset runs right after this one.

**Proved by value, whatever the nodes** (:mod:`rope_passes.proofs.mask_lengths`): the two inputs are evaluated
abstractly over their cones, each node in the form its own opset gives it: ``total_sequence_length`` must be the mask's
width and ``seqlens_k`` its row sums minus one, batch on axis 0. The builder's chains, or the same values through
``Squeeze``/``Unsqueeze``/``ReduceSum``/``Split`` with axes as attributes or inputs, ``Shape`` with ``start``/``end``,
``Slice``/``Split`` (``num_outputs`` too) of the shape, ``Pad`` columns of zeros, ``Identity`` and integer ``Cast``/
``CastLike`` chains, ``Add(x, -1)``, ``ReduceMax`` of a one-element shape slice, ``Where(s == s, s - 1, s)``, the row
sums of ``mask * 0 + 1``, the mask moved and given back (``Transpose`` round trips, ``Shape(Transpose(mask))[0]``,
``Flatten`` + ``Reshape [0, -1]``, ``Expand`` to its own shape, ``Tile`` by ones: :mod:`rope_passes.proofs.mask_moves`),
the last column of a ``CumSum`` (the first with ``reverse=1``) as the row sums, the width through integer
arithmetic that gives it back (``w * 1 + 0``, ``1000 - (1000 - w)``, ``Max(w, 0)``, ``Min(w, 2^40)``,
``Shape(Concat(mask, mask, axis=1))[1] / 2``) or as the ``ArgMax`` of a ``Concat`` of ``w`` zeros and a one, the width
of a cast or row-concatenated mask, the row sums as ``-(1 - s)``, ``Where(s > 0, s - 1, -1)`` (a mask of 0s and 1s) or
the sum of two column slices cut at one bound, or a model-local function (evaluated in place at its own opset, its reference attributes
bound to the call's; the call node is removed with the old chains where nothing else reads it, the function body is
left as it was) are all rewritten the same way. A length that is also a graph output keeps its name and values (read
from the new chain through an ``Identity``), so the old chain goes; one of another rank keeps its chain (a note).
Lengths computed in int32 from the mask without ``Shape`` already (this pass's own output) are not matched.
GroupQueryAttention inside a model-local function is rewritten in the function's body, at the function's opset
(constants as ``Constant`` nodes), when every call passes the attention mask itself as one parameter (proved for each
call, the body's chain built from that parameter).

**The mask** is the graph input genai_config names as the decoder's ``attention_mask`` (``attention_mask`` without
a genai_config): a rank-2 integer input alone proves nothing (``input_ids`` has that look, and its row sums are
token ids). Where ``seqlens_k`` reads no rank-2 integer input's values (a graph input, say: not matched), only
``total_sequence_length`` is rewritten (the width is exact on its own); where its proof fails (refused), neither
is: ``seqlens_k``'s chain would still block capture. Constants in the chains must be constants: an
initializer that is also a graph input can be overridden by the caller and is not one
(:mod:`rope_passes.proofs.constants`).

**Refuses** (graph unchanged there, the reason naming the node that broke the proof): a value read from another
rank-2 integer input than the attention mask; a total that is not the width (another dimension, a padded or sliced
mask's width, arithmetic on it, ``Size(mask) / batch``, which divides by zero for an empty batch, ``Max(width, 1)``, ``Max``/``Where`` of the width
and ``input_ids``' length, equal only under the client's contract that the mask is at least as wide, which the graph
does not prove: the refusal names that dimension); a ``seqlens_k``
that is not the row sums minus one (another subtrahend, a sum over other axes, ``Pad`` columns of non-zeros, a
``Cast`` of the mask's values to a type other than int32/int64, which wraps or rounds them, a mask scaled by ``k``
and divided back, which is not ``sum - 1`` for a row of zeros, a shape that moves the batch off dimension 0, a
``Reshape``/``Flatten`` that mixes the batch with the columns, an ``Expand``/``Tile`` that copies elements, an
exclusive ``CumSum`` or another of its columns); a step the proof does not follow (control flow,
custom ops, ``Squeeze`` without axes); the two chains reading different masks. ``keepdims=1`` (mobius-onnx's form,
seqlens_k ``[batch, 1]``) is accepted: GroupQueryAttention reads the same ``batch`` values by flat index. A
``total_sequence_length`` that reads no mask shape (the builder's ``_graph`` variant: the largest row sum, on the GPU
already) is "not matched", with the node that computes it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

import rope_passes.graph_walk as graph_walk
from rope_passes.analysis.bf16 import BF16_GQA_NOTE, bf16_gqa, note_bf16
from rope_passes.analysis.graph import MS_DOMAIN, nodes_of
from rope_passes.passes._rewrite import NodeTape, add_initializer, opset_of
from rope_passes.passes.base import RopePass
from rope_passes.proofs.mask_lengths import MASK_INPUT, MaskLengths, Proved
from rope_passes.report import MatchFailure, PassReport

SEQLENS_K, TOTAL_SEQ = 5, 6


def _function_gqas(model: ir.Model) -> list[tuple[ir.Function, list[ir.Node]]]:
    """The model-local functions holding GroupQueryAttention nodes, with those nodes."""
    found = []
    for function in model.functions.values():
        gqas = [n for n in graph_walk.nodes(function.graph) if n.op_type == "GroupQueryAttention"
                and n.domain == MS_DOMAIN]
        if gqas:
            found.append((function, gqas))
    return found


def _int32_already(nodes: list[ir.Node]) -> bool:
    """The proved lengths' cones are int32 arithmetic on the mask already: no Shape/Size, no model-local function
    call, every computed value int32 (constants aside): rewriting would build the same chain again."""
    computed = [n for n in nodes if n.op_type != "Constant"]
    return bool(computed) and all(n.op_type in _OWN_OPS and n.domain in ("", "ai.onnx")
                                  and all(o.dtype == ir.DataType.INT32 for o in n.outputs) for n in computed)


#: the ops of the chain :meth:`TotalSeqOnGpuPass._build` writes (and of a graph output's Identity)
_OWN_OPS = frozenset({"Cast", "ReduceSum", "Sub", "Mul", "Add", "ReduceMax", "Identity"})


def _keep_output(graph: ir.Graph, old: ir.Value, new: ir.Value, same_rank: bool, opset: int | None,
                 report: PassReport) -> None:
    """``old``, a graph output the new int32 chain computes too (proved equal by value), is read from ``new`` under its
    own name: the caller reads the same values, and the old chain (on CPU, with its Memcpy) goes. Where the ranks differ
    (seqlens_k ``[batch, 1]``), the old chain stays for the output, and the report says so."""
    if not same_rank or old.dtype not in (None, new.dtype):  # GroupQueryAttention reads both lengths as int32
        report.note(old, f"{old.name!r} is also a graph output, of another shape or type than the int32 chain's: its "
                    "own chain still computes it (on CPU)")
        return
    tape = NodeTape(opset if opset is not None else opset_of(graph))
    kept = tape.op("Identity", [new], name=f"{new.name}/as_output", output=f"{new.name}/as_output", dtype=new.dtype,
                   shape=old.shape)
    if new.producer() is not None:
        tape.insert_after(graph, new.producer())
    else:
        tape.append(graph)
    name = old.name
    old.name = f"{name}/rope_passes_replaced"
    kept.name = name
    for i, out in enumerate(graph.outputs):
        if out is old:
            graph.outputs[i] = kept


def _move_readers(old: ir.Value, new: ir.Value, chain: set[int]) -> None:
    """Every reader of the old ``seqlens_k`` besides GroupQueryAttention (``longrope-concat``'s batch switch reads
    ``max(seqlens_k)``) reads the new one: the same values, proved, of the same rank and type; the old chain (on CPU,
    with its Memcpy) can then go. Readers inside the old chain keep it."""
    if old.dtype not in (None, new.dtype):
        return
    for user, index in list(old.uses()):
        if user.op_type != "GroupQueryAttention" and id(user) not in chain and user.graph is new.graph:
            user.replace_input_with(index, new)


class TotalSeqOnGpuPass(RopePass):
    name = "total-seq-on-gpu"
    summary = "compute GQA seqlens_k/total_sequence_length from the mask on the GPU (int32, no Shape): no Memcpy"

    def apply(self, model: ir.Model, report: PassReport) -> None:
        graph = model.graph
        gqas = nodes_of(graph, "GroupQueryAttention", MS_DOMAIN)
        hidden = _function_gqas(model)
        if not gqas and not hidden:
            raise MatchFailure.absent("no com.microsoft::GroupQueryAttention node")
        if note_bf16(model, report):
            return
        mask_name = self.genai_config.decoder_inputs.get("attention_mask", MASK_INPUT)
        lengths = MaskLengths(model, (mask_name,))
        if gqas:
            self._rewrite(graph, gqas, lengths.total, lengths.seqlens, opset_of(graph), None, report)
        for function, inner in hidden:
            calls = [n for n in graph_walk.nodes(graph) if (n.domain, n.op_type, n.overload) == function.identifier()]
            if not calls:
                report.not_matched(function.name, f"model-local function {function.name!r} holds GroupQueryAttention "
                                   "but is never called")
                continue
            scopes = [lengths.scope(call, function) for call in calls]

            def proof(kind: str, function: ir.Function = function, scopes: list = scopes) -> Callable[..., Proved]:
                def prove(value: ir.Value) -> Proved:
                    """Proved for every call, the mask passed as one parameter of the function (built from it)."""
                    param = found = None
                    for scope in scopes:
                        found = getattr(lengths, kind)(value, scope)
                        here = lengths.parameter(scope, function, found.mask)
                        if here is None or (param is not None and here is not param):
                            raise MatchFailure.refuse(
                                f"model-local function {function.name!r} does not receive {found.mask.name!r} as one "
                                "parameter at every call: its body cannot compute the lengths from it", value.name
                                or kind)
                        param = here
                    assert param is not None and found is not None
                    return Proved(param, found.nodes, found.rank)
                return prove
            opset = int(function.opset_imports.get("", function.opset_imports.get("ai.onnx", opset_of(graph) or 18)))
            self._rewrite(function.graph, inner, proof("total"), proof("seqlens"), opset, function.name, report)

    def _rewrite(self, graph: ir.Graph, gqas: list[ir.Node], prove_total: Callable[[ir.Value], Proved],
                 prove_seqlens: Callable[[ir.Value], Proved], opset: int | None, in_function: str | None,
                 report: PassReport) -> None:
        """Rewrite the GroupQueryAttention nodes ``gqas`` of ``graph`` (the main graph, or the body of the model-local
        function ``in_function``: new nodes at its ``opset``, constants as Constant nodes)."""
        by_pair: dict[tuple[int, int], tuple[ir.Value | None, ir.Value]] = {}
        by_mask: dict[int, tuple[ir.Value, ir.Value]] = {}  # one int32 computation per mask, whatever reads it
        failed: set[tuple[int, int]] = set()  # one finding per (seqlens_k, total) pair, not per layer
        stale: list[ir.Node] = []
        for gqa in gqas:
            if len(gqa.inputs) <= TOTAL_SEQ or gqa.inputs[SEQLENS_K] is None or gqa.inputs[TOTAL_SEQ] is None:
                report.not_matched(gqa, "GQA without seqlens_k/total_sequence_length")
                continue
            seqlens, total = gqa.inputs[SEQLENS_K], gqa.inputs[TOTAL_SEQ]
            key = (id(seqlens), id(total))
            if key in failed:  # same length inputs as a GQA already reported
                continue
            if key in by_pair:
                new_seqlens, new_total = by_pair[key]
            else:
                seq_found = None
                try:
                    found = prove_total(total)
                    mask, old_nodes = found.mask, found.nodes
                    try:
                        seq_found = prove_seqlens(seqlens)
                        seq_mask, old_nodes = seq_found.mask, old_nodes + seq_found.nodes
                    except MatchFailure as failure:
                        if failure.refused:
                            raise
                        seq_mask = None  # seqlens_k computed some other way: left as it is, the total moves alone
                    if seq_mask is not None and seq_mask is not mask:
                        raise MatchFailure.refuse(f"seqlens_k reads mask {seq_mask.name!r} but total_sequence_length "
                                                  f"reads {mask.name!r}", seqlens)
                    if _int32_already(old_nodes):  # this pass's own output (or the same values in its form)
                        raise MatchFailure.absent("seqlens_k/total_sequence_length are computed from the mask in int32 "
                                                  "already, without Shape", total)
                except MatchFailure as failure:
                    report.record(failure, gqa)
                    failed.add(key)
                    continue
                if id(mask) not in by_mask:
                    by_mask[id(mask)] = self._build(graph, mask, len(by_mask), opset, in_function is not None)
                built_seqlens, new_total = by_mask[id(mask)]
                new_seqlens = built_seqlens if seq_mask is not None else None
                by_pair[key] = (new_seqlens, new_total)
                stale.extend(old_nodes)
                where = f" (in model-local function {in_function!r})" if in_function else ""
                report.rewritten(
                    total,
                    f"seqlens_k/total_sequence_length from int32 sums of {mask.name!r} (no Shape){where}",
                    mask=mask.name, seqlens_k=new_seqlens.name if new_seqlens is not None else seqlens.name,
                    total_sequence_length=new_total.name,
                    seqlens_k_rewritten=seq_mask is not None,
                )
                outputs = [(total, new_total, found.rank, 0)]
                if new_seqlens is not None and seq_found is not None:
                    outputs.append((seqlens, new_seqlens, seq_found.rank, 1))
                for old, new, rank, new_rank in outputs:  # after the finding: it names the old value as it was
                    if old.is_graph_output():
                        _keep_output(graph, old, new, rank == new_rank, opset, report)
                if new_seqlens is not None and seq_found is not None and seq_found.rank == 1:
                    _move_readers(seqlens, new_seqlens, {id(n) for n in old_nodes})
            if new_seqlens is not None:
                gqa.replace_input_with(SEQLENS_K, new_seqlens)
            gqa.replace_input_with(TOTAL_SEQ, new_total)
        # the old chains, where nothing else reads them (a dead Shape chain still gets placed, with its Memcpy),
        # and a seqlens_k built but not used (every pair reading that mask kept its own)
        unused = [v.producer() for v, _ in by_mask.values() if not v.uses()]
        dead = {id(n): n for n in [*stale, *unused] if n is not None}
        while True:  # the cones, readers first: a node goes once nothing else reads it
            gone = [n for n in dead.values() if n.graph is graph and not any(o.uses() or o.is_graph_output()
                                                                            for o in n.outputs)]
            if not gone:
                break
            for node in gone:
                graph.remove(node, safe=True)
                del dead[id(node)]

    @staticmethod
    def _build(graph: ir.Graph, mask: ir.Value, index: int, opset: int | None = None,
               as_nodes: bool = False) -> tuple[ir.Value, ir.Value]:
        """(seqlens_k, total_sequence_length) of ``mask`` in int32: row sums - 1, and the width as the sum of a row
        of ones (the ``index``-th mask gets its own names), at ``opset`` (default the graph's); ``as_nodes``:
        constants as Constant nodes (a function body holds no initializers)."""
        prefix = "/rope_passes/total_seq_on_gpu" + (f"/mask{index}" if index else "")
        tape = NodeTape(opset if opset is not None else opset_of(graph))

        def constant(name: str, array: np.ndarray) -> ir.Value:
            if as_nodes:
                return tape.op("Constant", [], {"value": ir.tensor(array, name=name)}, name=name, output=name,
                               dtype=ir.DataType.from_numpy(array.dtype), shape=array.shape)
            return add_initializer(graph, name, array)

        axes = constant(f"{prefix}/axes", np.array([1], dtype=np.int64))
        one = constant(f"{prefix}/one", np.array([1], dtype=np.int32))
        zero = constant(f"{prefix}/zero", np.array(0, dtype=np.int32))
        i32 = ir.DataType.INT32
        batch = mask.shape[0] if mask.shape is not None else None
        mask32 = tape.op("Cast", [mask], {"to": i32}, name=f"{prefix}/Cast", output=f"{prefix}/mask_int32", dtype=i32,
                         shape=mask.shape)
        lengths = tape.op("ReduceSum", [mask32, axes], {"keepdims": 0}, name=f"{prefix}/ReduceSum",
                          output=f"{prefix}/row_lengths", dtype=i32, shape=[batch])
        seqlens_k = tape.op("Sub", [lengths, one], name=f"{prefix}/Sub", output=f"{prefix}/seqlens_k", dtype=i32,
                            shape=[batch])
        zeros = tape.op("Mul", [mask32, zero], name=f"{prefix}/Mul", output=f"{prefix}/zeros", dtype=i32,
                        shape=mask.shape)
        ones = tape.op("Add", [zeros, one], name=f"{prefix}/Add", output=f"{prefix}/ones", dtype=i32,
                       shape=mask.shape)
        widths = tape.op("ReduceSum", [ones, axes], {"keepdims": 0}, name=f"{prefix}/ReduceSum_width",
                         output=f"{prefix}/widths", dtype=i32, shape=[batch])
        total = tape.op("ReduceMax", [widths], {"keepdims": 0}, name=f"{prefix}/ReduceMax",
                        output=f"{prefix}/total_sequence_length", dtype=i32, shape=[])
        if not axes.uses() and not as_nodes:  # below opset 13 ReduceSum takes its axes as an attribute
            del graph.initializers[axes.name]
        # insert right after the mask's first reader so the graph stays topologically sorted
        first_user = next((n for n in graph if any(v is mask for v in n.inputs)), None)
        if first_user is not None:
            tape.insert_before(graph, first_user)
        else:
            tape.append(graph)
        return seqlens_k, total


__all__ = ["BF16_GQA_NOTE", "SEQLENS_K", "TOTAL_SEQ", "TotalSeqOnGpuPass", "bf16_gqa", "note_bf16"]
