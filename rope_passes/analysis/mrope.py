"""Facts about multimodal RoPE (mRoPE) in decoder graphs, shared by ``fold-text-mrope`` and ``lower-mrope``.

mRoPE splits the rotary frequencies of a head into three sections, one per position axis (time, height, width).
Column ``c`` of the per-token cos/sin row comes from the axis :func:`axis_of_columns` assigns to it:

* layout 0 (*sectioned*, Qwen2-VL / Qwen2.5-VL): ``[t]*s0 + [h]*s1 + [w]*s2``;
* layout 1 (*interleaved*, Qwen3-VL / Qwen3.5): ``t`` everywhere, then ``h`` at columns ``1, 4, 7, …`` below
  ``3*s1`` and ``w`` at ``2, 5, 8, …`` below ``3*s2``.

This is onnxruntime's ``ComputeDimAssignments`` (contrib ``MRotaryEmbedding``). The section layout says which axis
feeds a *frequency*; it is unrelated to the rotation's *pairing* (rotate-half vs interleaved pairs), which is the
``interleaved`` attribute of the rotary op.

When the three axes carry the same position ``p`` every column reads row ``p``, so the per-token table is the
plain 1D ``[max_pos, rotary_dim/2]`` table. :func:`trace_rotation` finds the rotation feeding a
GroupQueryAttention q/k input; :func:`text_tables` derives that 1D table from the graph's own constants (or, for
the manual form, by evaluating its cos/sin subgraph with the :class:`~rope_passes.analysis.graph.Evaluate` the
caller hands in: analysis opens no runtime session). Whether the three axes are equal is
:func:`~rope_passes.analysis.positions.position_source`'s proof (re-exported here).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import MS_DOMAIN, Evaluate, ancestors, attr, const_array
from rope_passes.analysis.ops import ROTARY_OPS
from rope_passes.analysis.positions import PositionSource, position_source
from rope_passes.report import MatchFailure

__all__ = [
    "ADAPTER_OPS", "PositionSource", "Rotation", "TextTables", "axis_of_columns", "mrotary_tables", "per_token_tables",
    "position_source", "text_tables", "trace_rotation",
]

#: Ops that only move or re-type q/k around a rotation (and are undone after it).
ADAPTER_OPS = ("Cast", "Reshape", "Transpose")


def axis_of_columns(sections: Sequence[int], layout: int, half: int) -> np.ndarray:
    """For each of the ``half`` cos/sin columns, the position axis (0=t, 1=h, 2=w) feeding it."""
    out = np.zeros(half, dtype=np.int64)
    if layout == 0:
        pos = 0
        for axis in range(3):
            for _ in range(int(sections[axis])):
                if pos < half:
                    out[pos] = axis
                pos += 1
    elif layout == 1:
        for axis in (1, 2):
            for col in range(axis, min(int(sections[axis]) * 3, half), 3):
                out[col] = axis
    else:
        raise MatchFailure.absent(f"mrope_layout={layout} is neither 0 (sectioned) nor 1 (interleaved)")
    return out


# --------------------------------------------------------------------------------------------------------------
# Finding the rotation that feeds a GQA input
# --------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Rotation:
    """One rotary op whose (re-laid-out) output is a GroupQueryAttention q or k input."""

    node: ir.Node  # MRotaryEmbedding or RotaryEmbedding
    pre: ir.Value  # the value before the rotation, in the GQA input's layout and dtype
    rotated: ir.Value  # the GQA-side value it produces (what GQA reads today)
    interleaved: bool  # the rotation's pairing (not the section layout)
    rotary_dim: int
    head_size: int
    num_heads: int

    @property
    def kind(self) -> str:
        return self.node.op_type


def _shape_dims(value: ir.Value) -> tuple | None:
    if value.shape is None:
        return None
    return tuple(d if isinstance(d, int) else str(d) for d in value.shape)


def _perm_inverse(perm: Sequence[int]) -> list[int]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def _mirrors(before: ir.Node, after: ir.Node) -> str | None:
    """None when ``after`` undoes ``before`` (an adapter op before the rotation); otherwise why not."""
    if before.op_type != after.op_type:
        return f"{after.op_type} {after.name!r} after the rotation does not undo {before.op_type} {before.name!r}"
    if before.op_type == "Cast":
        if attr(after, "to") != before.inputs[0].dtype:
            return f"Cast {after.name!r} does not cast back to {before.inputs[0].dtype}"
        return None
    if before.op_type == "Transpose":
        perm_b = list(attr(before, "perm") or [])
        perm_a = list(attr(after, "perm") or [])
        if not perm_b or perm_a != _perm_inverse(perm_b):
            return f"Transpose {after.name!r} (perm {perm_a}) does not undo perm {perm_b}"
        return None
    # Reshape: the reshape after must give back the shape before the first reshape.
    back = _shape_dims(after.outputs[0])
    orig = _shape_dims(before.inputs[0])
    if back is not None and orig is not None and back == orig:
        return None
    target_b, target_a = const_array(before.inputs[1]), const_array(after.inputs[1])
    if (
        target_b is not None
        and target_a is not None
        and orig is not None
        and len(orig) == 3
        and list(target_b[:2]) == [0, 0]
        and list(target_a[:2]) == [0, 0]
        and len(target_a) == 3
        and (target_a[2] == -1 or (isinstance(orig[2], int) and target_a[2] == orig[2]))
    ):
        return None
    return f"Reshape {after.name!r} does not restore the shape before Reshape {before.name!r}"


def trace_rotation(value: ir.Value, heads: int, head_size_hint: int | None = None) -> Rotation:
    """The rotation whose output, through mirrored Cast/Reshape/Transpose adapters, is ``value``.

    ``heads`` is the GQA's head count for this input (num_heads for q, kv_num_heads for k); ``head_size_hint``
    (from the KV cache shape or genai_config) is used when the graph carries no static hidden size.
    """
    after: list[ir.Node] = []
    v = value
    producer = v.producer()
    while producer is not None and producer.op_type in ADAPTER_OPS and producer.domain in ("", "ai.onnx"):
        after.append(producer)
        v = producer.inputs[0]
        producer = v.producer()
    if producer is None or producer.op_type not in ROTARY_OPS or producer.domain != MS_DOMAIN:
        what = "a graph input or initializer" if producer is None else f"{producer.op_type} {producer.name!r}"
        raise MatchFailure.absent(f"{value.name!r} is produced by {what}, not by a rotary op")
    rot = producer
    before: list[ir.Node] = []
    x = rot.inputs[0]
    for mirror in after:  # after[0] is next to GQA, so it mirrors the *first* adapter before the rotation
        p = x.producer() if x is not None else None
        if p is None or p.op_type not in ADAPTER_OPS or p.domain not in ("", "ai.onnx"):
            raise MatchFailure.absent(f"{mirror.op_type} {mirror.name!r} after {rot.name!r} has no matching op before it")
        before.append(p)
        x = p.inputs[0]
    # before[-1] is the first op applied to the pre-rotation value, and after[0] the last one undoing it.
    for b_node, a_node in zip(before[::-1], after, strict=True):
        why = _mirrors(b_node, a_node)
        if why:
            raise MatchFailure.absent(why)
    pre = x
    layout_ops = [n.op_type for n in before[::-1] if n.op_type != "Cast"]
    rot_in = rot.inputs[0]
    rank = len(rot_in.shape) if rot_in.shape is not None else None
    if layout_ops == [] and rank in (3, None):
        pass
    elif layout_ops == ["Reshape", "Transpose"] and rank in (4, None):
        reshape = next(n for n in before[::-1] if n.op_type == "Reshape")
        transpose = next(n for n in before[::-1] if n.op_type == "Transpose")
        target = const_array(reshape.inputs[1])
        if list(attr(transpose, "perm") or []) != [0, 2, 1, 3] or target is None or len(target) != 4:
            raise MatchFailure.absent(f"{rot.name!r}: input is not [batch, heads, seq, head] from a [batch, seq, hidden] value")
        rank = 4
        if int(target[3]) > 0 and not (rot_in.shape is not None and isinstance(rot_in.shape[3], int)):
            head_size_hint = int(target[3])
    else:
        raise MatchFailure.absent(f"{rot.name!r}: unsupported layout around the rotation ({' -> '.join(layout_ops)})")
    if pre.dtype is not None and value.dtype is not None and pre.dtype != value.dtype:
        raise MatchFailure.absent(f"{rot.name!r}: value before the rotation is {pre.dtype}, GQA reads {value.dtype}")
    if rank == 4 and rot_in.shape is not None and isinstance(rot_in.shape[3], int):
        head_size = rot_in.shape[3]
    elif rank == 4 and head_size_hint:
        head_size = head_size_hint
    else:
        hidden = pre.shape[-1] if pre.shape is not None else None
        if isinstance(hidden, int):
            head_size = hidden // heads
        elif head_size_hint:
            head_size = head_size_hint
        else:
            raise MatchFailure.absent(f"{rot.name!r}: hidden size of {pre.name!r} is not static and the head size is unknown")
    num_heads = int(attr(rot, "num_heads", 0) or heads)
    if num_heads != heads:
        raise MatchFailure.absent(f"{rot.name!r}: num_heads={num_heads} but GroupQueryAttention has {heads} heads here")
    if int(attr(rot, "is_packed_batching", 0) or 0):
        raise MatchFailure.absent(f"{rot.name!r}: is_packed_batching=1 (packed batches) is not supported")
    rotary_dim = int(attr(rot, "rotary_embedding_dim", 0) or 0) or head_size
    return Rotation(rot, pre, value, bool(attr(rot, "interleaved", 0)), rotary_dim, head_size, num_heads)


# --------------------------------------------------------------------------------------------------------------
# The 1D text table a rotation reduces to
# --------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class TextTables:
    cos: np.ndarray  # [max_pos, rotary_dim/2] float32
    sin: np.ndarray
    source: str  # how they were obtained, for reports
    positions: PositionSource


def _is_token_index(value: ir.Value) -> bool:
    """True when ``value`` is Reshape(Range(0, n, 1), shape): token (b, s) reads row b*S + s of its table."""
    node = value.producer()
    if node is None or node.op_type != "Reshape":
        return False
    rng = node.inputs[0].producer()
    if rng is None or rng.op_type != "Range":
        return False
    start, delta = const_array(rng.inputs[0]), const_array(rng.inputs[2])
    return start is not None and delta is not None and int(start) == 0 and int(delta) == 1


def mrotary_tables(node: ir.Node) -> TextTables:
    """MRotaryEmbedding(x, position_ids, cos_cache, sin_cache): with equal axes every column reads row p."""
    cos, sin = const_array(node.inputs[2]), const_array(node.inputs[3])
    if cos is None or sin is None:
        raise MatchFailure.absent(f"{node.name!r}: cos_cache/sin_cache are not constants")
    if cos.ndim != 2 or cos.shape != sin.shape:
        raise MatchFailure.absent(f"{node.name!r}: cos/sin caches have shapes {cos.shape}/{sin.shape}, not [max_pos, half]")
    sections = [int(s) for s in (attr(node, "mrope_section") or [])]
    layout = int(attr(node, "mrope_layout", 0) or 0)
    half = cos.shape[1]
    if len(sections) != 3 or sum(sections) != half:
        raise MatchFailure.absent(f"{node.name!r}: mrope_section {sections} does not sum to rotary_dim/2 = {half}")
    axis_of_columns(sections, layout, half)  # validates the layout
    scale = float(attr(node, "scale", 1.0) or 1.0)
    cos32, sin32 = cos.astype(np.float32), sin.astype(np.float32)
    if scale != 1.0:
        cos32, sin32 = (cos32 * np.float32(scale)).astype(np.float32), (sin32 * np.float32(scale)).astype(np.float32)
    positions = position_source([node.inputs[1]])
    source = f"{node.inputs[2].name!r}/{node.inputs[3].name!r} (sections {sections}, layout {layout})"
    return TextTables(cos32, sin32, source, positions)


def _gathered_rows(nodes: Iterable[ir.Node]) -> int | None:
    rows = [
        n.inputs[0].shape[0]
        for n in nodes
        if n.op_type in ("Gather", "GatherElements")
        and n.inputs[0] is not None
        and n.inputs[0].const_value is not None
        and n.inputs[0].shape is not None
        and len(n.inputs[0].shape) == 2
        and int(attr(n, "axis", 0) or 0) == 0
    ]
    return min(rows) if rows else None


def per_token_tables(model: ir.Model, node: ir.Node, max_positions: int | None, evaluate: Evaluate) -> TextTables:
    """RotaryEmbedding(x, token_index, cos_per_token, sin_per_token): evaluate the graph's own cos/sin subgraph.

    The tables are computed by running the graph's cos/sin subgraph with ``evaluate`` (the passes hand in
    onnxruntime CPU, :func:`rope_passes.runtime.evaluate.evaluate_subgraph`) with the three axes set to
    ``0..max_pos-1``; a second run with permuted positions must permute the rows, which proves row i depends only
    on token i's position.
    """
    if not _is_token_index(node.inputs[1]):
        raise MatchFailure.absent(
            f"{node.name!r}: position_ids is not the token index Range(0, batch*seq) "
            "(plain RoPE, not per-token mRoPE tables)"
        )
    if float(attr(node, "scale", 1.0) or 1.0) != 1.0:
        raise MatchFailure.absent(f"{node.name!r}: RotaryEmbedding scale != 1 is not supported")
    cos_v, sin_v = node.inputs[2], node.inputs[3]
    positions = position_source([cos_v, sin_v])
    cut = positions.three_axis
    sub_nodes = [n for n in ancestors([cos_v, sin_v])]
    rows = _gathered_rows(sub_nodes)
    max_pos = rows if rows is not None else max_positions
    if not max_pos:
        raise MatchFailure.absent(
            f"{node.name!r}: the tables are computed from inv_freq with no cache size; set model.context_length in "
            "genai_config.json or pass max_positions"
        )
    pos = np.arange(max_pos, dtype=np.int64)
    dtype = np.int64 if cut.dtype == ir.DataType.INT64 else np.int32
    try:
        cos, sin = evaluate(model, [cut], [cos_v, sin_v], [np.tile(pos, (3, 1, 1)).astype(dtype)])
        perm = np.random.RandomState(0).permutation(max_pos)
        cos_p, sin_p = evaluate(model, [cut], [cos_v, sin_v], [np.tile(pos[perm], (3, 1, 1)).astype(dtype)])
    except ValueError as exc:  # extract(): not bounded by the positions
        raise MatchFailure.absent(f"{node.name!r}: cos/sin subgraph is not a function of the positions alone ({exc})") from None
    except Exception as exc:  # onnxruntime failures
        raise MatchFailure.absent(f"{node.name!r}: cannot evaluate the cos/sin subgraph ({type(exc).__name__})") from None
    if cos.ndim != 2 or cos.shape[0] != max_pos or cos.shape != sin.shape:
        raise MatchFailure.absent(
            f"{node.name!r}: cos/sin subgraph gives shape {cos.shape} for {max_pos} tokens, not [tokens, half]"
        )
    if not (np.array_equal(cos_p, cos[perm]) and np.array_equal(sin_p, sin[perm])):
        raise MatchFailure.absent(f"{node.name!r}: cos/sin rows do not depend on each token's own position alone")
    source = f"evaluated from the graph's cos/sin subgraph ({max_pos} positions)"
    return TextTables(cos.astype(np.float32), sin.astype(np.float32), source, positions)


def text_tables(model: ir.Model, rotation: Rotation, max_positions: int | None, evaluate: Evaluate) -> TextTables:
    """The 1D cos/sin tables ``rotation`` reduces to when its three position axes are equal (``evaluate`` runs a
    subgraph for the manual form, see :func:`per_token_tables`)."""
    if rotation.kind == "MRotaryEmbedding":
        return mrotary_tables(rotation.node)
    return per_token_tables(model, rotation.node, max_positions, evaluate)
