"""Census of the attention and rotary ops: groups of alike nodes, head sizes, and where total_sequence_length and
the rotary positions come from."""

from __future__ import annotations

import onnx_ir as ir

from rope_passes.analysis.graph import (
    MS_DOMAIN,
    PASS_THROUGH,
    ancestors,
    attr,
    const_tensor,
    graph_inputs_of,
    ints,
    iter_nodes,
    nodes_of,
    op_domain,
    small_const,
)
from rope_passes.analysis.ops import ATTENTION_OPS, ROTARY_OPS, present, slot, slot_name
from rope_passes.analysis.positions import describe_position_source
from rope_passes.analysis.schema import AttentionGroup, RotaryGroup, attributes
from rope_passes.config import GenaiConfig
from rope_passes.report import name_of


def _last_dim(value: ir.Value | None, depth: int = 0) -> int | None:
    """The static width of the last axis of ``value``: its shape, else the producing projection's width."""
    if value is None or depth > 10:
        return None
    if value.shape is not None and len(value.shape) and isinstance(value.shape[-1], int):
        return value.shape[-1]
    producer = value.producer()
    if producer is None:
        return None
    op = producer.op_type
    if op == "MatMul" and len(producer.inputs) > 1:
        w = const_tensor(producer.inputs[1])
        if w is not None and len(w.shape) >= 2 and isinstance(w.shape[-1], int):
            return w.shape[-1]
    if op == "MatMulNBits":
        return attr(producer, "N")
    if op == "Split":
        index = list(producer.outputs).index(value)
        split = ints(small_const(producer.inputs[1])) if len(producer.inputs) > 1 else attr(producer, "split")
        if split is not None and index < len(split):
            return int(split[index])
    if op in ("Add", "Sub", "Mul", "Div"):  # broadcasting: the widest known input
        widths = [w for w in (_last_dim(i, depth + 1) for i in producer.inputs) if w is not None]
        return max(widths) if widths else None
    if op in (*PASS_THROUGH, "SimplifiedLayerNormalization", "LayerNormalization", *ROTARY_OPS):
        return _last_dim(producer.inputs[0], depth + 1)
    return None


def total_seq_description(value: ir.Value | None, model: ir.Model) -> tuple[str | None, bool | None]:
    """How ``value`` is computed, in one line, and whether from a Shape: ``("Shape(attention_mask)", True)``, or the
    chain of ops from the first graph input (``"attention_mask → ReduceSum → Cast"``)."""
    if value is None:
        return None, None
    nodes = ancestors([value])
    shapes = [n for n in nodes if n.op_type == "Shape"]
    if shapes:
        src = shapes[0].inputs[0]
        return f"Shape({src.name if src is not None else '?'})", True
    order = {id(n): i for i, n in enumerate(model.graph)}
    nodes.sort(key=lambda n: order.get(id(n), -1))
    ops = [n.op_type for n in nodes if n.op_type != "Constant"]
    inputs = graph_inputs_of(nodes, model)
    chain = " → ".join([*inputs[:1], *ops]) if ops else (name_of(value) or "?")
    return chain, False


def attention_groups(model: ir.Model, genai_config: GenaiConfig) -> list[AttentionGroup]:
    """Attention nodes grouped by op type, attributes and input count."""
    groups: dict[tuple, list[ir.Node]] = {}
    for node in iter_nodes(model):
        if node.op_type not in ATTENTION_OPS or op_domain(node) not in ("", MS_DOMAIN):
            continue
        key = (node.op_type, op_domain(node), repr(sorted(attributes(node).items())), len(node.inputs))
        groups.setdefault(key, []).append(node)
    out = []
    for (op_type, domain, _, n_inputs), nodes in groups.items():
        first = nodes[0]
        heads = attr(first, "num_heads", attr(first, "q_num_heads"))
        kv_heads = attr(first, "kv_num_heads", heads if op_type != "GroupQueryAttention" else None)
        key_in = slot(first, "key") if (domain, op_type) != ("", "Attention") else first.inputs[1]
        value_in = slot(first, "value") if (domain, op_type) != ("", "Attention") else first.inputs[2]
        packed = (op_type == "Attention" and domain == MS_DOMAIN) or not (present(key_in) or present(value_in))
        head_size, head_source = None, None
        if (domain, op_type) == (MS_DOMAIN, "Attention"):  # hidden states in, weights [hidden, 3*hidden]
            weights = const_tensor(first.inputs[1]) if len(first.inputs) > 1 else None
            width = weights.shape[-1] if weights is not None and isinstance(weights.shape[-1], int) else None
            per_token_heads = 3 * heads if heads else None
        else:
            width = _last_dim(first.inputs[0])
            per_token_heads = (heads + 2 * (kv_heads or heads) if packed else heads) if heads else None
            query_shape = first.inputs[0].shape if first.inputs and first.inputs[0] is not None else None
            if domain == "" and query_shape is not None and len(query_shape) == 4:  # ONNX Attention [B,N,S,H]
                per_token_heads = 1
        if width is not None and per_token_heads and width % per_token_heads == 0:
            head_size, head_source = width // per_token_heads, "graph"
        if head_size is None and genai_config.head_size:
            head_size, head_source = genai_config.head_size, "genai_config"
        inputs = {slot_name(first, i): v.name for i, v in enumerate(first.inputs) if present(v)}
        group = AttentionGroup(
            op_type=op_type, domain=domain or "ai.onnx", count=len(nodes), nodes=[name_of(n) for n in nodes],
            num_heads=heads, kv_num_heads=kv_heads, head_size=head_size, head_size_source=head_source,
            do_rotary=attr(first, "do_rotary"), rotary_interleaved=attr(first, "rotary_interleaved"),
            packed_qkv=packed, num_inputs=n_inputs, inputs=inputs, attributes=attributes(first),
        )
        if op_type == "GroupQueryAttention":
            group.total_sequence_length, group.total_sequence_length_from_shape = total_seq_description(
                slot(first, "total_sequence_length"), model)
        out.append(group)
    return out


def rotary_groups(model: ir.Model) -> list[RotaryGroup]:
    """Rotary nodes grouped by op type, with the attributes they share and the inputs of the first."""
    by_op: dict[tuple[str, str], list[ir.Node]] = {}
    for node in iter_nodes(model):
        if node.op_type in ROTARY_OPS:
            by_op.setdefault((node.op_type, op_domain(node)), []).append(node)
    out = []
    for (op_type, domain), nodes in by_op.items():
        first = nodes[0]
        attrs = [attributes(n) for n in nodes]
        shared = {k: v for k, v in attrs[0].items() if all(a.get(k) == v for a in attrs[1:])}
        section = attr(first, "mrope_section")
        pos = slot(first, "position_ids")
        cos, sin = slot(first, "cos_cache"), slot(first, "sin_cache")
        out.append(RotaryGroup(
            op_type=op_type, domain=domain or "ai.onnx", count=len(nodes), nodes=[name_of(n) for n in nodes],
            num_heads=sorted({a["num_heads"] for a in attrs if "num_heads" in a}),
            interleaved=attr(first, "interleaved"), rotary_embedding_dim=attr(first, "rotary_embedding_dim"),
            mrope_section=list(section) if section is not None else None, mrope_layout=attr(first, "mrope_layout"),
            attributes={k: v for k, v in shared.items() if k != "num_heads"},
            position_input=pos.name if present(pos) else None,
            position_source=describe_position_source(pos, model) if present(pos) else None,
            cos_input=cos.name if present(cos) else None, sin_input=sin.name if present(sin) else None,
        ))
    return out


def attention_layout(model: ir.Model) -> list[tuple]:
    """How each attention node gets its inputs and positions: per GroupQueryAttention (sorted) its do_rotary, rotary
    layout and which inputs it is given (packed or separate Q/K/V, position_ids, fused norms; trailing inputs left
    out or given as "" are the same call). Another kernel path reads padding its own way (measured: separate vs
    packed Q/K/V differ by 1.65 on a left-padded row on WebGPU), so two graphs with the same list compute a padded
    row the same way (a difference there is a rewrite's), and they share a software adapter's error past its cap
    (batch 1; measured on lavapipe: Phi-3 vs its concatenated-cache output, 2-token calls after pasts of 23..37,
    bit-equal)."""
    out = []
    for node in nodes_of(model, "GroupQueryAttention", MS_DOMAIN):
        given = [i is not None for i in node.inputs]
        while given and not given[-1]:
            given.pop()
        out.append((attr(node, "do_rotary", 0), attr(node, "rotary_interleaved", 0), tuple(given)))
    return sorted(out)
