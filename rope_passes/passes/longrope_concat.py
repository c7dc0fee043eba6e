"""``longrope-concat``: replace the LongRoPE ``If`` cache switch with one concatenated table and an offset.

**Rewrites.** Builders emit LongRoPE (Phi-3 128k) as ``If(Greater(total_len, original))`` whose branches return
constant ``[cos|sin]_cache_large`` (then) or ``..._small`` (else), read by every GroupQueryAttention as
``cos_cache``/``sin_cache``. Control flow makes onnxruntime refuse WebGPU graph capture. The pass replaces the ``If``
with two initializers ``[small[:original]; large]`` (``original + max_positions`` rows) and records the offset
``original``:

* ``genai_config.json``: ``model.decoder.session_options.provider_options[{"webgpu": {...}}]`` gets
  ``"multiRotaryCacheConcatOffset": "<original>"`` (the spelling of the builder's own ``_graph`` variant);
* model metadata ``rope_passes.multi_rotary_cache_concat_offset = <original>``.

**Exact when** the WebGPU EP runs it with that offset: it reads row ``(total_seqlen > offset ? offset : 0) +
position`` — the If's choice, row for row, with bit-identical table values. The offset only acts on GQA's packed-QKV
path (key/value inputs empty).

**CPU: wrong past the offset, and flagged.** The CPU EP has no such option and reads row ``position`` of the
concatenated table: right up to ``original`` tokens, wrong after. The output is marked WebGPU-only: metadata
``rope_passes.webgpu_only`` and ``model.decoder.session_options["rope_passes.webgpu_only"]`` (onnxruntime-genai
passes unknown session_options on as session config entries, which onnxruntime ignores); ``lint`` rule RP204 says
so too. ``tests/test_longrope.py`` pins both the WebGPU match and the CPU mismatch.

**Packs Q/K/V** where a GQA reading the caches takes separate query/key/value inputs (the offset would be ignored
there): one ``Concat(q, k, v, axis=-1)`` becomes its query and key/value are left empty, which is GQA's packed
layout (it splits num_heads, kv_num_heads, kv_num_heads heads back out): exact, at the cost of one copy per layer.

**The offset is proved**, not read off the constant (:func:`rope_passes.analysis.longrope.switch_offset`): the
condition's cone may read only the total sequence length the GroupQueryAttention nodes get (their
``total_sequence_length`` input, through Cast/Identity) and small constants, through elementwise ops; it is evaluated
exactly for every total 1..rows and must be ``total > o`` for one ``o``, which becomes the offset. So
``Greater(total + 8, 32)`` is rewritten with offset 24 and ``GreaterOrEqual(total, 32)`` with 31, while a condition on
the call length (``Shape(input_ids)``) or on anything but the total is refused.

**Refuses** (graph unchanged, reason in the report, naming the node that broke the proof): separate Q/K/V that cannot
be packed (one of key/value missing, not rank 3, mixed dtypes, head sizes that differ); branches that are not constant
tables of matching width/dtype; a then-branch that is not the longer table; a small table with fewer than ``o`` rows;
a condition that reads anything but the total length, is not elementwise, or is not ``total > o`` (``Greater(x, y)``
with a non-constant ``y`` is refused as such).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import MS_DOMAIN, attr, const_array
from rope_passes.analysis.longrope import LongRoPE, if_switch, separate_qkv, switch_offset
from rope_passes.config import CONCAT_OFFSET_OPTION, GenaiConfig
from rope_passes.passes.base import RopePass
from rope_passes.report import MatchFailure, PassReport

OFFSET_KEY = CONCAT_OFFSET_OPTION
OFFSET_METADATA = "rope_passes.multi_rotary_cache_concat_offset"
WEBGPU_ONLY_KEY = "rope_passes.webgpu_only"


def _branch_tables(outputs: list[ir.Value], target: str) -> list[np.ndarray]:
    """The values of an If branch's outputs (the tables are read here, to be concatenated)."""
    tables = []
    for out in outputs:
        arr = const_array(out)
        if arr is None:
            raise MatchFailure.refuse(f"branch output {out.name!r} is not a constant table", target)
        tables.append(arr)
    return tables


def record_offset(model: ir.Model, genai_config: GenaiConfig, offset: int, report: PassReport) -> None:
    """Write the offset to genai_config.json's WebGPU options and the model metadata, and flag CPU as wrong."""
    reason = (f"concatenated LongRoPE cos/sin cache: correct with the WebGPU EP and {OFFSET_KEY}={offset}; "
              f"the CPU EP reads wrong rows past {offset} tokens")
    if model.metadata_props.get(OFFSET_METADATA) != str(offset):
        model.metadata_props[OFFSET_METADATA] = str(offset)
        report.metadata_changes.append(f"metadata_props[{OFFSET_METADATA!r}] = '{offset}'")
    if model.metadata_props.get(WEBGPU_ONLY_KEY) != reason:
        model.metadata_props[WEBGPU_ONLY_KEY] = reason
        report.metadata_changes.append(f"metadata_props[{WEBGPU_ONLY_KEY!r}] (CPU EP wrong past {offset})")
    if not genai_config.decoder:
        report.note("<model>", f"no genai_config.json: run with the WebGPU session config entry "
                    f"ep.webgpuexecutionprovider.{OFFSET_KEY}={offset}")
        return
    for change in (genai_config.set_provider_option("webgpu", OFFSET_KEY, str(offset)),
                   genai_config.set_session_option(WEBGPU_ONLY_KEY, "1")):
        if change:
            report.genai_config_changes.append(change)


def packable(gqa: ir.Node, target: str) -> None:
    """Refuse (MatchFailure) when a GQA with separate Q/K/V cannot be packed exactly into one input."""
    if not separate_qkv(gqa):
        return
    q, k, v = (gqa.inputs[i] if len(gqa.inputs) > i else None for i in range(3))
    if q is None or k is None or v is None:
        raise MatchFailure.refuse(f"{gqa.name}: only one of key/value is given; cannot pack Q/K/V", target)
    for value in (q, k, v):
        if value.shape is not None and len(value.shape) != 3:
            raise MatchFailure.refuse(f"{gqa.name}: {value.name!r} has rank {len(value.shape)}, expected [batch, "
                                      "seq, hidden] to pack Q/K/V", target)
    if len({value.dtype for value in (q, k, v)}) != 1:
        raise MatchFailure.refuse(f"{gqa.name}: query/key/value dtypes differ; cannot pack Q/K/V", target)
    widths = [value.shape[2] if value.shape is not None else None for value in (q, k, v)]
    heads = (attr(gqa, "num_heads"), attr(gqa, "kv_num_heads"), attr(gqa, "kv_num_heads"))
    known = all(isinstance(w, int) for w in widths) and all(isinstance(h, int) and h > 0 for h in heads)
    if known and (widths[1] != widths[2] or widths[0] * heads[1] != widths[1] * heads[0]):
        raise MatchFailure.refuse(f"{gqa.name}: query/key/value widths {widths} are not num_heads/kv_num_heads "
                                  f"{heads[0]}/{heads[1]} heads of one head size; cannot pack Q/K/V", target)


def pack_qkv(graph: ir.Graph, gqa: ir.Node) -> ir.Node:
    """Feed ``gqa`` one packed ``Concat(q, k, v, axis=-1)`` with key/value empty (GQA's packed-QKV layout).

    GroupQueryAttention splits a packed query back into ``num_heads``, ``kv_num_heads``, ``kv_num_heads`` heads of
    the head size, in that order: the same tensors as the separate inputs, so the attention is unchanged.
    """
    q, k, v = gqa.inputs[0], gqa.inputs[1], gqa.inputs[2]
    prefix = f"{gqa.name or 'GroupQueryAttention'}/rope_passes_packed_qkv"
    concat = ir.node("Concat", [q, k, v], attributes={"axis": -1}, name=prefix)
    out = concat.outputs[0]
    out.name, out.dtype = f"{prefix}/output_0", q.dtype
    if all(x.shape is not None and isinstance(x.shape[2], int) for x in (q, k, v)):
        out.shape = ir.Shape([q.shape[0], q.shape[1], q.shape[2] + k.shape[2] + v.shape[2]])
    graph.insert_before(gqa, concat)
    gqa.replace_input_with(0, out)
    gqa.replace_input_with(1, None)
    gqa.replace_input_with(2, None)
    return concat


class LongRoPEConcatPass(RopePass):
    name = "longrope-concat"
    summary = "replace the LongRoPE If(Greater(total, original)) cache switch by [small; large] + concat offset"

    def apply(self, model: ir.Model, report: PassReport) -> None:
        graph = model.graph
        found = False
        for node in list(graph):
            if node.op_type != "If" or node.domain not in ("", "ai.onnx"):
                continue
            users = [u for out in node.outputs for u, _ in out.uses()]
            gqas = [u for u in users if u.op_type == "GroupQueryAttention" and u.domain == MS_DOMAIN]
            if not gqas:
                report.not_matched(node.name or "If", "If does not feed GroupQueryAttention cos/sin caches")
                continue
            found = True
            switch = if_switch(model, node)
            try:
                offset, tables = self._match(model, switch, gqas)
            except MatchFailure as failure:
                report.record(failure)
                continue
            packed = [pack_qkv(graph, gqa) for gqa in gqas if separate_qkv(gqa)]
            if packed:
                report.note(node.name or "If", f"packed separate query/key/value into one input (Concat on the hidden "
                            f"axis) for {len(packed)} GroupQueryAttention node(s): {OFFSET_KEY} acts on packed QKV only")
            self._rewrite(graph, node, tables)
            record_offset(model, self.genai_config, offset, report)
            proved = "" if offset == switch.threshold else f" (the condition is total > {offset})"
            report.rewritten(node.name or "If", f"If replaced by concatenated caches [{offset} short; "
                             f"{tables[0].shape[0] - offset} long] rows, offset {offset}{proved}",
                             offset=offset, rows=int(tables[0].shape[0]), gqa=len(gqas))
        if not found:
            report.not_matched("<model>", "no If switching GroupQueryAttention cos/sin caches")

    @staticmethod
    def _match(model: ir.Model, switch: LongRoPE, gqas: list[ir.Node]) -> tuple[int, list[np.ndarray]]:
        """The offset and the ``[small[:offset]; large]`` tables for the If ``switch``; MatchFailure.refuse if not."""
        node = switch.node
        target = node.name or "If"
        if not node.inputs or node.inputs[0] is None:
            raise MatchFailure.refuse("If has no condition input", target)
        then_tables = _branch_tables(switch.then_tables, target)
        else_tables = _branch_tables(switch.else_tables, target)
        if len(then_tables) != len(node.outputs) or len(else_tables) != len(node.outputs):
            raise MatchFailure.refuse("branches do not return one table per If output", target)
        for out in node.outputs:
            for user, index in out.uses():
                if user.op_type != "GroupQueryAttention" or index not in (7, 8):
                    raise MatchFailure.refuse(f"{out.name!r} is read by {user.name or user.op_type} input {index}, "
                                              "not as a GQA cos/sin cache", target)
        for gqa in gqas:
            packable(gqa, target)  # refuses when separate Q/K/V cannot be packed
        # every total a GQA can be called with indexes the longer table: the condition is proved over all of them
        max_total = max(t.shape[0] for t in then_tables + else_tables if t.ndim >= 1)
        offset = switch_offset(model, switch, gqas, max_total)
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
            tables.append(np.concatenate([small[:offset], large], axis=0))
        return offset, tables

    @staticmethod
    def _rewrite(graph: ir.Graph, node: ir.Node, tables: list[np.ndarray]) -> None:
        for out, table in zip(list(node.outputs), tables):
            name = out.name
            out.name = f"{name}/rope_passes_replaced_if"
            init = ir.Value(name=name, shape=ir.Shape(table.shape), type=ir.TensorType(ir.DataType.from_numpy(
                table.dtype)), const_value=ir.tensor(table, name=name))
            graph.register_initializer(init)
            out.replace_all_uses_with(init)
            if out.is_graph_output():
                graph.outputs[graph.outputs.index(out)] = init
        graph.remove(node, safe=True)
