"""``longrope-concat``: replace the LongRoPE ``If`` cache switch with one concatenated table and an offset.

**Rewrites.** Builders emit LongRoPE (Phi-3 128k) as ``If(Greater(total_len, original))`` whose branches return
constant ``[cos|sin]_cache_large`` (then) or ``..._small`` (else), read by every GroupQueryAttention as
``cos_cache``/``sin_cache``. Control flow makes onnxruntime refuse WebGPU graph capture. The pass replaces the ``If``
with ``Concat(Where(max(seqlens_k) + 1 > original, large[:original], small[:original]), large)`` for each table
(``original + max_positions`` rows; the condition's nodes go with it where nothing else reads them) and records the
offset ``original``. WebGPU reads row ``(seqlens_k[b] + 1 > original ? original : 0) + position`` of it: a row past
``original`` reads ``large``; a shorter row reads the head, which is the long table's while the batch's longest row
is past ``original`` — the ``If``'s choice for the whole batch (its total is the mask's width, the longest row's
length wherever one row is unpadded, as clients pad) — and the short one's otherwise. Without the head switch a
left-padded row would read the short table while the batch is past the switch (docs/passes/longrope-concat.md,
"Batches"). Where the mask's batch dimension is 1 (or the heads are equal) the tables are the constant
``[small[:original]; large]``. A branch's table is read by value, whatever computes it from constants (a ``Constant``, int8 codes
through a per-column ``DequantizeLinear``, an outer bf16 table through ``Identity``/``Cast``, an fp32 table cast to
fp16 in the branch, a ``Slice``): folded by the one constant evaluator (:func:`rope_passes.proofs.constants.table`,
onnx's reference evaluator node by node at the model's opset; tests/test_form_fuzzer.py compares each output with
its input on onnxruntime CPU, bit for bit). The offset is recorded in:

* ``genai_config.json``: ``model.decoder.session_options.provider_options[{"webgpu": {...}}]`` gets
  ``"multiRotaryCacheConcatOffset": "<original>"`` (the spelling of the builder's own ``_graph`` variant);
* model metadata ``rope_passes.multi_rotary_cache_concat_offset = <original>``.

**Exact when** the WebGPU EP runs it with that offset: it reads row ``(total_seqlen > offset ? offset : 0) +
position`` — the If's choice, row for row, with bit-identical table values, for every batch in which some row is
unpadded (a batch whose every row is padded switches on its longest row, as Hugging Face's ``max(position_ids) + 1``
does, where the ``If`` switches on the width). The offset only acts on GQA's packed-QKV path (key/value inputs
empty). The head switch costs one ``Concat`` of each table per call (``original + max_positions`` rows written).

**CPU: wrong past the offset, and flagged.** The CPU EP has no such option and reads row ``position`` of the
concatenated table: right up to ``original`` tokens, wrong after (a position past ``original`` reads
``large[position - original]``). The output is marked WebGPU-only: metadata
``rope_passes.webgpu_only`` and ``model.decoder.session_options["rope_passes.webgpu_only"]`` (onnxruntime-genai
passes unknown session_options on as session config entries, which onnxruntime ignores); ``lint`` rule RP204 says
so too. ``tests/test_longrope.py`` pins both the WebGPU match and the CPU mismatch.

**Other spellings of the switch.** ``If(Not(total > o))`` with the short table in the then-branch (and
``Where(Not(...), small, large)``) is proved on the negated condition. ``Where(condition, large, small)`` over two
constant tables of one shape (no control flow, the short table padded) is proved the same way once the condition is
proved one element
(:func:`rope_passes.proofs.concat_offset.selects_whole_tables`: it picks a whole table), and replaced the same way.
An ``If`` inside a model-local function whose outputs GroupQueryAttention reads as its caches is proved after the
calls are inlined (what onnxruntime does at load; only where the function imports the model's opsets), then
rewritten in the main graph; where nothing is rewritten the calls are put back (the pass refuses, naming the
function). The condition may read the total through a model-local function or another layer's copy of the chain:
its leaves are the values proved to be the mask's width by value (:func:`rope_passes.proofs.concat_offset.width_test`).

**Packs Q/K/V** where a GQA reading the caches takes separate query/key/value inputs (the offset would be ignored
there): one ``Concat(q, k, v, axis=-1)`` becomes its query and key/value are left empty, which is GQA's packed
layout (it splits num_heads, kv_num_heads, kv_num_heads heads back out): exact, at the cost of one copy per layer.

**The offset is proved**, not read off the constant (:func:`rope_passes.analysis.longrope_switch.switch_offset`): the
condition's cone may read only the total sequence length the GroupQueryAttention nodes get (their
``total_sequence_length`` input, through Cast/Identity) and small constants, through elementwise ops; it is evaluated
exactly for every total 1..rows and must be ``total > o`` for one ``o``, which becomes the offset. So
``Greater(total + 8, 32)`` is rewritten with offset 24 and ``GreaterOrEqual(total, 32)`` with 31, while a condition on
the call length (``Shape(input_ids)``) or on anything but the total is refused. WebGPU switches each row on its own
``seqlens_k + 1``, not on ``total_sequence_length``: the two must be one number for every row of ones, so the total
must be proved the attention mask's width and ``seqlens_k`` its row sums - 1, by value
(:func:`rope_passes.proofs.concat_offset.switch_reads_row_lengths`); a total of width + 1 or row sums - 2 is refused.

**The offset is proved for the whole session.** ``multiRotaryCacheConcatOffset`` is one value per session, and
onnxruntime's WebGPU EP applies it to every GroupQueryAttention with do_rotary=1 and packed QKV
(:func:`rope_passes.proofs.concat_offset.offset_consumers`), whatever table it reads. So the pass first proves each
``If`` on its own, then rewrites only when *every* such consumer reads (as cos and as sin cache) an output of an
``If`` it rewrites, and all those ``If`` nodes switch at the same ``o``. A layer that reads a plain table, an ``If``
refused on its own, or a switch at another offset refuses every ``If``, naming that GroupQueryAttention. Switches at
the same offset over different tables are fine: each consumer reads row ``(total > o ? o : 0) + position`` of its
own concatenation, its own ``If``'s choice.

**Refuses** (graph unchanged, reason in the report, naming the node that broke the proof): separate Q/K/V that cannot
be packed (one of key/value missing, not rank 3, mixed dtypes, head sizes that differ); branches that are not constant
tables of matching width/dtype (a table computed from anything the call gives is refused naming the node that reads
it); a then-branch that is not the longer table; a small table with fewer than ``o`` rows;
a condition that reads anything but the total length, is not elementwise, or is not ``total > o`` (``Greater(x, y)``
with a non-constant ``y`` is refused as such); a total or ``seqlens_k`` not proved the mask's width and row sums - 1; an ``If`` output that is also a graph output (callers read the chosen
table); a session consumer the offset would make wrong (above).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import MS_DOMAIN, const_tensor
from rope_passes.analysis.longrope import LongRoPE, if_switch, separate_qkv, where_switch
from rope_passes.analysis.longrope_switch import switch_offset
from rope_passes.passes._concat_offset import OFFSET_KEY, OFFSET_METADATA, WEBGPU_ONLY_KEY, pack_qkv, record_offset
from rope_passes.passes._rewrite import NodeTape, add_initializer, inline_functions, opset_of, remove_dead
from rope_passes.passes.base import RopePass
from rope_passes.proofs.concat_offset import (
    consumer_name,
    hidden_attention,
    offset_consumers,
    packable,
    selects_whole_tables,
    switch_reads_row_lengths,
    width_test,
)
from rope_passes.proofs.constants import table as constant_table
from rope_passes.proofs.mask_lengths import MASK_INPUT
from rope_passes.report import MatchFailure, PassReport, Place, place_of

__all__ = ["OFFSET_KEY", "OFFSET_METADATA", "WEBGPU_ONLY_KEY", "LongRoPEConcatPass"]


def _branch_tables(outputs: list[ir.Value], target: Place, opset: int | None) -> list[np.ndarray]:
    """The values of an If branch's outputs (the tables are read here, to be concatenated): any constant cone, as
    the one constant evaluator computes it (:func:`rope_passes.proofs.constants.table`)."""
    tables = []
    for out in outputs:
        arr = constant_table(out, opset)
        if arr is None:
            producer = out.producer()
            by = f" (computed by {producer.op_type} {producer.name!r} from a value not known before the call, or " \
                 "larger than the evaluator reads)" if producer is not None and producer.op_type != "Constant" else ""
            raise MatchFailure.refuse(f"branch output {out.name!r} is not a constant table{by}", target)
        tables.append(arr)
    return tables


def _inline_switches(model: ir.Model, report: PassReport) -> list[str]:
    """Calls of model-local functions holding an ``If`` whose outputs GroupQueryAttention reads as cos/sin caches,
    inlined into the main graph (what onnxruntime does at load: the model computes the same), so the If is proved
    and rewritten there. A function importing another opset than the model's is not inlined (its nodes would be read
    at the model's opset): refused, naming it. The functions' names."""
    chosen = []
    for function in model.functions.values():
        calls = [n for n in model.graph if (n.domain, n.op_type, n.overload) == function.identifier()]
        if not any(n.op_type == "If" for n in function) or not any(
                u.op_type == "GroupQueryAttention" and i in (7, 8) for c in calls for o in c.outputs
                for u, i in o.uses()):
            continue
        clash = {d: v for d, v in function.opset_imports.items() if d in model.opset_imports
                 and model.opset_imports[d] != v}
        if clash:
            report.record(MatchFailure.refuse(
                f"model-local function {function.name!r} holds the If GroupQueryAttention reads its tables from, and "
                f"imports {clash} where the model imports "
                f"{ {d: model.opset_imports[d] for d in clash} }: not inlined to prove it", calls[0]))
            continue
        chosen.append(function)
    if chosen:
        try:
            inline_functions(model, chosen)
        except Exception as e:  # noqa: BLE001 - the inliner's refusal (a cycle, a graph attribute): said, rolled back
            raise MatchFailure.refuse(f"model-local function {chosen[0].name!r} holds the LongRoPE If and cannot be "
                                      f"inlined to prove it: {e}", chosen[0].name) from None
    return [f.name for f in chosen]


def _table_where(node: ir.Node, users: list[tuple[ir.Node, int]]) -> bool:
    """A Where read as GQA cos/sin caches (by one reader at least) choosing between two constant tables: a LongRoPE
    switch without control flow, proved as an If is."""
    if not any(u.op_type == "GroupQueryAttention" and u.domain == MS_DOMAIN and i in (7, 8) for u, i in users):
        return False
    tables = [constant_table(v) if v is not None else None for v in node.inputs[1:3]]
    return len(tables) == 2 and all(t is not None and t.ndim == 2 for t in tables)


class _Proved:
    """One If proved on its own: its offset, the (long, short) table pairs, the GQAs reading it and the mask whose
    row lengths they read."""

    def __init__(self, node: ir.Node, gqas: list[ir.Node], offset: int, tables: list[tuple[np.ndarray, np.ndarray]],
                 threshold: int | None, mask: ir.Value):
        self.node, self.gqas, self.offset, self.tables, self.threshold = node, gqas, offset, tables, threshold
        self.mask = mask

    @property
    def name(self) -> str:
        return place_of(self.node)


def _reads(value: ir.Value | None, refused: dict[int, ir.Node]) -> str:
    """What a GQA cache input is, in words, for a refusal."""
    if value is None:
        return "no table"
    producer = value.producer()
    if producer is not None and id(producer) in refused:
        return f"{value.name!r}, an output of If {producer.name!r} that is refused on its own"
    tensor = const_tensor(value)
    if tensor is not None:
        rows = tensor.shape[0] if len(tensor.shape) else "?"
        return f"the plain constant table {value.name!r} ({rows} rows)"
    made = f" computed by {producer.op_type} {producer.name!r}" if producer is not None else ""
    return f"{value.name!r}{made}"


def session_offset(model: ir.Model, proved: list[_Proved], refused: list[ir.Node]) -> int:
    """The one offset for the session: every If in ``proved`` switches at it, and every GroupQueryAttention it
    acts on (packed QKV with do_rotary=1, and the separate-Q/K/V readers of a proved If, which get packed) reads both
    its caches from a proved If. ``MatchFailure.refuse`` naming the GroupQueryAttention that breaks it."""
    first = proved[0]
    for other in proved[1:]:
        if other.offset != first.offset:
            raise MatchFailure.refuse(
                f"{consumer_name(other.gqas[0])!r} reads If {other.name!r}, which switches at total > {other.offset}, "
                f"and {consumer_name(first.gqas[0])!r} reads If {first.name!r}, which switches at total > "
                f"{first.offset}: {OFFSET_KEY} is one value for the whole session; no offset serves both",
                consumer_name(other.gqas[0]))
    offset = first.offset
    hidden = hidden_attention(model)
    if hidden is not None:  # onnxruntime inlines it: a consumer of the offset this walk cannot prove
        raise MatchFailure.refuse(
            f"model-local function {hidden!r} holds a GroupQueryAttention: {OFFSET_KEY} is one value for the whole "
            "session and WebGPU applies it there too, and what it reads is not proved here", hidden)
    switched = {id(out) for p in proved for out in p.node.outputs}
    refused_ids = {id(n): n for n in refused}
    consumers = {id(g): g for g in offset_consumers(model)}
    consumers.update({id(g): g for p in proved for g in p.gqas if separate_qkv(g)})
    for gqa in consumers.values():
        for index, role in ((7, "cos"), (8, "sin")):
            value = gqa.inputs[index] if len(gqa.inputs) > index else None
            if value is not None and id(value) in switched:
                continue
            raise MatchFailure.refuse(
                f"{consumer_name(gqa)!r} reads {_reads(value, refused_ids)} as its {role}_cache: {OFFSET_KEY} is one "
                f"value for the whole session and WebGPU applies it to every packed-QKV GroupQueryAttention with "
                f"do_rotary=1, so with {OFFSET_KEY}={offset} this one would read row {offset} + position past "
                f"{offset} tokens", consumer_name(gqa))
    return offset


class LongRoPEConcatPass(RopePass):
    name = "longrope-concat"
    summary = "replace the LongRoPE If(Greater(total, original)) cache switch by [small; large] + concat offset"

    def apply(self, model: ir.Model, report: PassReport) -> None:
        inlined = _inline_switches(model, report)
        if not self._apply(model, report) and inlined:  # nothing rewritten: the calls go back (the base rolls back)
            raise MatchFailure.refuse(f"the If in model-local function {inlined[0]!r}, inlined to be proved, is not "
                                      "rewritten: the call is left as it was", inlined[0])

    def _apply(self, model: ir.Model, report: PassReport) -> bool:
        graph = model.graph
        proved: list[_Proved] = []
        refused: list[ir.Node] = []
        masks = {self.genai_config.decoder_inputs.get("attention_mask", MASK_INPUT)}
        is_width = width_test(model, masks)
        for node in list(graph):
            if node.op_type not in ("If", "Where") or node.domain not in ("", "ai.onnx"):
                continue
            users = [(u, i) for out in node.outputs for u, i in out.uses()]
            gqas = list({id(u): u for u, _ in users if u.op_type == "GroupQueryAttention" and u.domain == MS_DOMAIN}
                        .values())
            if node.op_type == "Where" and not _table_where(node, users):
                continue  # a Where of anything but two constant tables read as GQA caches: not a switch
            if not gqas:
                report.not_matched(node, "If does not feed GroupQueryAttention cos/sin caches")
                continue
            switch = if_switch(model, node) if node.op_type == "If" else where_switch(model, node)
            try:
                if node.op_type == "Where":
                    selects_whole_tables(model, node, 2)
                offset, tables = self._match(model, switch, gqas, is_width)
                mask = switch_reads_row_lengths(model, gqas, masks)
            except MatchFailure as failure:
                report.record(failure)
                refused.append(node)
                continue
            proved.append(_Proved(node, gqas, offset, tables, switch.threshold, mask))
        if not proved:
            if not refused:
                report.not_matched("<model>", "no If switching GroupQueryAttention cos/sin caches")
            return False
        try:
            offset = session_offset(model, proved, refused)
        except MatchFailure as failure:
            for p in proved:  # proved alone, refused for the session: one finding per If, naming the consumer
                report.record(MatchFailure.refuse(f"{p.node.op_type} {p.name!r} (total > {p.offset}) not rewritten: "
                                                  f"{failure.reason}", failure.place))
            return False
        for p in proved:
            packed = [pack_qkv(graph, gqa) for gqa in p.gqas if separate_qkv(gqa)]
            if packed:
                report.note(p.name, f"packed separate query/key/value into one input (Concat on the hidden "
                            f"axis) for {len(packed)} GroupQueryAttention node(s): {OFFSET_KEY} acts on packed QKV only")
            batch = _batch_switch(p.mask, p.tables, offset)
            self._rewrite(graph, p.node, p.tables, offset, p.gqas[0].inputs[5] if batch else None, opset_of(model))
            proved_note = "" if offset == p.threshold else f" (the condition is total > {offset})"
            rows = offset + p.tables[0][0].shape[0]
            how = (f"; its first {offset} rows switched per call on the batch's longest row (Where), as the "
                   f"{p.node.op_type} switches the whole batch" if batch else
                   f"; one row per call ({p.mask.name!r} has batch dimension 1)")
            report.rewritten(p.name, f"{p.node.op_type} replaced by concatenated caches [{offset} short; "
                             f"{rows - offset} long] rows, offset {offset}{proved_note}{how}",
                             offset=offset, rows=int(rows), gqa=len(p.gqas), batch_switch=batch)
        record_offset(model, self.genai_config, offset, report)
        if len(proved) > 1:
            report.note("<model>", f"{len(proved)} switches (If/Where), all at total > {offset}: one {OFFSET_KEY} serves "
                        "every GroupQueryAttention of the session")
        return True

    @staticmethod
    def _match(model: ir.Model, switch: LongRoPE, gqas: list[ir.Node],
               is_total: Callable[[ir.Value], bool] | None = None) -> tuple[int, list[tuple[np.ndarray, np.ndarray]]]:
        """The offset and the ``(large, small[:offset])`` tables for the If ``switch``; MatchFailure.refuse if
        not."""
        node = switch.node
        assert node is not None
        target = node
        if not node.inputs or node.inputs[0] is None:
            raise MatchFailure.refuse("If has no condition input", target)
        opset = opset_of(model)
        if len(switch.then_tables) != len(node.outputs) or len(switch.else_tables) != len(node.outputs):
            raise MatchFailure.refuse("branches do not return one table per If output", target)
        read = _read_outputs(node)  # an output nothing reads goes with the If, whatever it holds
        then_tables = _branch_tables([switch.then_tables[i] for i in read], target, opset)
        else_tables = _branch_tables([switch.else_tables[i] for i in read], target, opset)
        for out in node.outputs:
            if out.is_graph_output():
                raise MatchFailure.refuse(f"{out.name!r} is a graph output: callers read the table the If chose on "
                                          "each call, which a concatenated table would change", target)
            for user, index in out.uses():
                if user.op_type != "GroupQueryAttention" or index not in (7, 8):
                    raise MatchFailure.refuse(f"{out.name!r} is read by {user.name or user.op_type} input {index}, "
                                              "not as a GQA cos/sin cache", target)
        for gqa in gqas:
            packable(gqa, target)  # refuses when separate Q/K/V cannot be packed
        # every total a GQA can be called with indexes the longer table: the condition is proved over all of them
        max_total = max(t.shape[0] for t in then_tables + else_tables if t.ndim >= 1)
        offset = switch_offset(model, switch, gqas, max_total, is_total)
        tables = []
        for large, small in zip(then_tables, else_tables):
            if large.ndim != 2 or small.ndim != 2 or large.shape[1] != small.shape[1] or large.dtype != small.dtype:
                raise MatchFailure.refuse(f"tables {large.shape} {large.dtype} / {small.shape} {small.dtype} do not "
                                          "stack", target)
            if large.shape[0] <= offset:
                raise MatchFailure.refuse(f"then-branch table has {large.shape[0]} rows, not more than original "
                                          f"{offset}", target)
            if small.shape[0] < offset:
                raise MatchFailure.refuse(f"short table has {small.shape[0]} rows < original {offset}", target)
            tables.append((large, small[:offset]))
        return offset, tables

    @staticmethod
    def _rewrite(graph: ir.Graph, node: ir.Node, tables: list[tuple[np.ndarray, np.ndarray]], offset: int,
                 seqlens: ir.Value | None, opset: int | None) -> None:
        """Replace ``node``'s outputs: with ``seqlens`` (GroupQueryAttention's ``seqlens_k``, proved the mask's row
        sums - 1), ``Concat(Where(max(seqlens) + 1 > offset, large[:offset], small[:offset]), large)`` (the batch
        switch, :func:`_batch_switch`); without, the constant ``[small[:offset]; large]``."""
        tape = NodeTape(opset)
        condition = None
        if seqlens is not None:  # the batch's longest row, max(seqlens_k) + 1, past the offset (on the GPU)
            prefix = f"{place_of(node)}/rope_passes_batch_switch"
            longest = tape.op("ReduceMax", [seqlens], {"keepdims": 0}, name=f"{prefix}/ReduceMax",
                              output=f"{prefix}/longest_seqlens_k", dtype=ir.DataType.INT32, shape=[])
            threshold = add_initializer(graph, f"{prefix}/offset_minus_1", np.array(offset - 1, dtype=np.int32))
            condition = tape.op("Greater", [longest, threshold], name=f"{prefix}/Greater",
                                output=f"{prefix}/past_offset", dtype=ir.DataType.BOOL, shape=[])
        for out, (large, head) in zip([node.outputs[i] for i in _read_outputs(node)], tables, strict=True):
            name = out.name
            out.name = f"{name}/rope_passes_replaced_if"
            if condition is None:
                table = np.concatenate([head, large], axis=0)
                new = add_initializer(graph, name, table)
            else:
                dtype = ir.DataType.from_numpy(large.dtype)
                width = large.shape[1]
                heads = [add_initializer(graph, f"{name}/rope_passes_{kind}_head", t)
                         for kind, t in (("long", large[:offset]), ("short", head))]
                rest = add_initializer(graph, f"{name}/rope_passes_long", large)
                chosen = tape.op("Where", [condition, *heads], name=f"{name}/rope_passes_head",
                                 output=f"{name}/rope_passes_head", dtype=dtype, shape=[offset, width])
                new = tape.op("Concat", [chosen, rest], {"axis": 0}, name=f"{name}/rope_passes_concat",
                              output=name, dtype=dtype, shape=[offset + large.shape[0], width])
            out.replace_all_uses_with(new)  # never a graph output (_match refuses those)
        if tape.nodes:
            tape.insert_before(graph, node)
        condition_in = node.inputs[0] if node.inputs else None
        graph.remove(node, safe=True)
        remove_dead(graph, [condition_in])  # the switch's condition, read by nothing else now (its Greater, ...)


def _read_outputs(node: ir.Node) -> list[int]:
    """The indices of the switch's outputs something reads (or the caller: a graph output)."""
    return [i for i, out in enumerate(node.outputs) if out.uses() or out.is_graph_output()]


def _batch_switch(mask: ir.Value, tables: list[tuple[np.ndarray, np.ndarray]], offset: int) -> bool:
    """Whether the rewrite needs the batch switch: WebGPU switches each row on its own length, the ``If`` the whole
    batch on its width, so a batch whose rows differ in length (left padding) would read the short table's head where
    the ``If`` reads the long one's. Not needed where the mask has one row (batch dimension 1) or the heads are
    equal."""
    one_row = mask.shape is not None and len(mask.shape) >= 1 and mask.shape[0] == 1
    return not one_row and not all(np.array_equal(large[:offset], head) for large, head in tables)
