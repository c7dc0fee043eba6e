"""The ops RoPE analysis looks at: attention and rotary ops, their input slots, and the cos/sin/position inputs."""

from __future__ import annotations

from collections.abc import Iterator

import onnx_ir as ir

from rope_passes.analysis.graph import MS_DOMAIN, iter_nodes, op_domain

#: Input slot names per (domain, op_type); the op's schema order.
INPUT_SLOTS: dict[tuple[str, str], tuple[str, ...]] = {
    (MS_DOMAIN, "GroupQueryAttention"): (
        "query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
        "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale", "v_scale",
        # builder 0.18 fuses q/k RMSNorm into GQA (attribute qk_norm_epsilon) and passes the weights here:
        "q_norm_weight", "k_norm_weight",
    ),
    (MS_DOMAIN, "MultiHeadAttention"): (
        "query", "key", "value", "bias", "key_padding_mask", "attention_bias", "past_key", "past_value",
        "past_sequence_length", "cache_indirection",
    ),
    (MS_DOMAIN, "Attention"): (
        "input", "weights", "bias", "mask_index", "past", "attention_bias", "past_sequence_length",
    ),
    ("", "Attention"): ("Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen"),
    (MS_DOMAIN, "RotaryEmbedding"): ("input", "position_ids", "cos_cache", "sin_cache"),
    ("", "RotaryEmbedding"): ("X", "cos_cache", "sin_cache", "position_ids"),
    (MS_DOMAIN, "MRotaryEmbedding"): ("input", "position_ids", "cos_cache", "sin_cache"),
}
ATTENTION_OPS = ("GroupQueryAttention", "MultiHeadAttention", "Attention")
ROTARY_OPS = ("RotaryEmbedding", "MRotaryEmbedding")


def slots(node: ir.Node) -> tuple[str, ...]:
    """The input slot names of ``node``'s op (empty for ops not in :data:`INPUT_SLOTS`)."""
    return INPUT_SLOTS.get((op_domain(node), node.op_type), ())


def slot(node: ir.Node, name: str) -> ir.Value | None:
    """The value in ``node``'s input slot ``name`` (None when the op has no such slot or it is left out)."""
    names = slots(node)
    if name not in names:
        return None
    i = names.index(name)
    return node.inputs[i] if i < len(node.inputs) else None


def slot_name(node: ir.Node, index: int) -> str:
    names = slots(node)
    return names[index] if index < len(names) else f"input{index}"


def present(value: ir.Value | None) -> bool:
    """An input that is given (not an empty optional input)."""
    return value is not None and bool(value.name or value.producer() is not None)


def rope_sinks(model: ir.Model) -> Iterator[tuple[ir.Node, str, ir.Value]]:
    """(node, 'cos'|'sin'|'position_ids', value) for every cos/sin/position input of attention and rotary ops."""
    for node in iter_nodes(model):
        if node.op_type not in (*ATTENTION_OPS, *ROTARY_OPS):
            continue
        for name, role in (("cos_cache", "cos"), ("sin_cache", "sin"), ("position_ids", "position_ids")):
            value = slot(node, name)
            if present(value):
                yield node, role, value
