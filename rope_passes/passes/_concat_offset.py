"""Shared writes of the two passes that set ``multiRotaryCacheConcatOffset`` (``longrope-concat``,
``annotate-cache-offset``): the offset and WebGPU-only marks in genai_config.json and the model metadata, their
removal, and packing separate Q/K/V into GroupQueryAttention's packed input. A helper module, not a pass: the facts
these writes rest on are proved in :mod:`rope_passes.proofs.concat_offset`.
"""

from __future__ import annotations

import onnx_ir as ir

from rope_passes.config import CONCAT_OFFSET_OPTION, CONCAT_OFFSET_SESSION_ENTRY, GenaiConfig
from rope_passes.report import PassReport, place_of

OFFSET_KEY = CONCAT_OFFSET_OPTION
OFFSET_METADATA = "rope_passes.multi_rotary_cache_concat_offset"
WEBGPU_ONLY_KEY = "rope_passes.webgpu_only"

__all__ = ["OFFSET_KEY", "OFFSET_METADATA", "WEBGPU_ONLY_KEY", "pack_qkv", "record_offset", "remove_offset"]


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
    if not genai_config.has_decoder:
        report.note("<model>", f"no genai_config.json: run with the WebGPU session config entry "
                    f"ep.webgpuexecutionprovider.{OFFSET_KEY}={offset}")
        return
    entry = (genai_config.set_session_option(CONCAT_OFFSET_SESSION_ENTRY, str(offset), "the same offset, set there too")
             if genai_config.concat_offset_session_entry else None)
    for change in (genai_config.set_provider_option("webgpu", OFFSET_KEY, str(offset)), entry,
                   genai_config.set_session_option(WEBGPU_ONLY_KEY, "1")):
        if change:
            report.genai_config_changes.append(change)


def remove_offset(model: ir.Model, genai_config: GenaiConfig, why: str, report: PassReport) -> list[str]:
    """Remove a ``multiRotaryCacheConcatOffset`` no GroupQueryAttention can honour (``why``) from genai_config.json,
    with the metadata and WebGPU-only marks :func:`record_offset` wrote; the change lines (also in ``report``)."""
    changes = genai_config.remove_provider_option(OFFSET_KEY, why)
    changes += genai_config.remove_session_option(CONCAT_OFFSET_SESSION_ENTRY, why)
    if genai_config.session_option(WEBGPU_ONLY_KEY) is not None:
        changes += genai_config.remove_session_option(WEBGPU_ONLY_KEY, "the offset it marked is removed")
    report.genai_config_changes.extend(changes)
    for key in (OFFSET_METADATA, WEBGPU_ONLY_KEY):
        if key in model.metadata_props:
            del model.metadata_props[key]
            report.metadata_changes.append(f"removed metadata_props[{key!r}] ({why})")
    return changes


def pack_qkv(graph: ir.Graph, gqa: ir.Node) -> ir.Node:
    """Feed ``gqa`` one packed ``Concat(q, k, v, axis=-1)`` with key/value empty (GQA's packed-QKV layout).

    GroupQueryAttention splits a packed query back into ``num_heads``, ``kv_num_heads``, ``kv_num_heads`` heads of
    the head size, in that order: the same tensors as the separate inputs, so the attention is unchanged.
    (:func:`rope_passes.proofs.concat_offset.packable` says whether it can be done exactly.)
    """
    q, k, v = gqa.inputs[0], gqa.inputs[1], gqa.inputs[2]
    prefix = f"{place_of(gqa)}/rope_passes_packed_qkv"
    concat = ir.node("Concat", [q, k, v], attributes={"axis": -1}, name=prefix)
    out = concat.outputs[0]
    out.name = f"{prefix}/output_0"
    # GQA's T: q's, else any of its inputs of that type (a graph saved without value_info leaves q/k/v untyped)
    dtype = next((x.dtype for x in (q, k, v, *gqa.inputs[3:5], *gqa.inputs[7:9]) if x is not None
                  and x.dtype is not None), None)
    if dtype is not None:
        out.dtype = dtype
        if all(x.shape is not None and len(x.shape) == 3 and isinstance(x.shape[2], int) for x in (q, k, v)):
            out.shape = ir.Shape([q.shape[0], q.shape[1], q.shape[2] + k.shape[2] + v.shape[2]])
    target_graph = gqa.graph if gqa.graph is not None else graph
    target_graph.insert_before(gqa, concat)
    gqa.replace_input_with(0, out)
    gqa.replace_input_with(1, None)
    gqa.replace_input_with(2, None)
    return concat
