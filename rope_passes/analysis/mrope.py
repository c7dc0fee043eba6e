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
GroupQueryAttention q/k input and proves the layout ops and casts around it harmless; :func:`mrotary_tables`
reads the 1D tables of an ``MRotaryEmbedding`` from its caches once :func:`exact_positions` proved it reads the
caller's positions unchanged. The manual (builder 0.15.2) form's tables are evaluated by the fold pass itself
(``rope_passes.proofs.mrope_cone``: analysis opens no runtime session).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import MS_DOMAIN, attr, const_array, const_tensor, flag
from rope_passes.analysis.ops import ROTARY_OPS
from rope_passes.analysis.positions import PositionSource, exact_positions, position_source
from rope_passes.report import MatchFailure

__all__ = [
    "ADAPTER_OPS", "PositionSource", "Rotation", "TextTables", "axis_of_columns", "exact_positions", "is_token_index",
    "mrotary_key", "mrotary_positions", "mrotary_tables", "position_source", "trace_rotation",
]


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

#: Ops that only move or re-type q/k around a rotation (standard domain).
ADAPTER_OPS = ("Cast", "Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze")
_FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16)
#: (batch, seq) sizes the layout probe runs at: two, so that a reshape only right for one size is caught.
_PROBE_SIZES = ((2, 3), (3, 7))


@dataclasses.dataclass
class Rotation:
    """One rotary op whose (re-laid-out, re-typed) output is a GroupQueryAttention q or k input.

    What GroupQueryAttention must read instead, unrotated, is ``relayout`` (the ops after the rotation that are not
    undone by ops before it, nearest the rotation first) applied to ``pre``: ``pre`` itself when ``relayout`` is
    empty.
    """

    node: ir.Node  # MRotaryEmbedding or RotaryEmbedding
    pre: ir.Value  # the value before the rotation (after cancelling mirrored adapters)
    rotated: ir.Value  # the GQA-side value it produces (what GQA reads today)
    interleaved: bool  # the rotation's pairing (not the section layout)
    rotary_dim: int
    head_size: int
    num_heads: int
    relayout: tuple[ir.Node, ...] = ()  # ops to re-apply to ``pre`` (copies of the ones after the rotation)
    rounding: str | None = None  # set when the rotation runs in float and GQA in float16 (not bit-exact)

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


def _mirrors(before: ir.Node, after: ir.Node) -> bool:
    """True when ``after`` exactly undoes ``before`` (``after(before(w)) == w`` bit for bit)."""
    if before.op_type != after.op_type:
        return False
    if before.op_type == "Cast":
        src, mid = before.inputs[0].dtype, before.outputs[0].dtype
        widening = src == mid or (src, mid) == (ir.DataType.FLOAT16, ir.DataType.FLOAT)
        return widening and attr(after, "to") is not None and ir.DataType(attr(after, "to")) == src
    if before.op_type == "Transpose":
        perm_b = list(attr(before, "perm") or [])
        return bool(perm_b) and list(attr(after, "perm") or []) == _perm_inverse(perm_b)
    if before.op_type != "Reshape" or attr(before, "allowzero", 0) or attr(after, "allowzero", 0):
        return False
    back, orig = _shape_dims(after.outputs[0]), _shape_dims(before.inputs[0])
    if back is not None and orig is not None and back == orig and all(isinstance(d, int) or d for d in orig):
        return True
    target_b, target_a = const_array(before.inputs[1]), const_array(after.inputs[1])
    return (
        target_b is not None
        and target_a is not None
        and orig is not None
        and len(orig) == 3
        and list(target_b[:2]) == [0, 0]
        and list(target_a[:2]) == [0, 0]
        and len(target_a) == 3
        and (target_a[2] == -1 or (isinstance(orig[2], int) and target_a[2] == orig[2]))
    )


def _adapter(node: ir.Node | None) -> bool:
    return node is not None and node.op_type in ADAPTER_OPS and node.domain in ("", "ai.onnx") and bool(node.inputs)


def _axes(node: ir.Node) -> list[int]:
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        values = const_array(node.inputs[1])
        if values is None:
            raise MatchFailure.refuse(f"{node.op_type} {node.name!r} takes its axes from a value computed in the graph",
                                      node)
        return [int(a) for a in np.asarray(values).reshape(-1)]
    return [int(a) for a in (attr(node, "axes") or [])]


def _relayout(node: ir.Node, array: np.ndarray) -> np.ndarray:
    """``node`` (an adapter op) applied to an index array; MatchFailure.refuse naming it when its parameters are not
    constants or do not fit."""
    op = node.op_type
    try:
        if op in ("Cast", "Identity"):
            return array
        if op == "Transpose":
            perm = attr(node, "perm")
            return array.transpose(list(perm) if perm is not None else None)
        if op == "Squeeze":
            axes = _axes(node)
            return np.squeeze(array, axis=tuple(axes)) if axes else np.squeeze(array)
        if op == "Unsqueeze":
            out = array
            rank = array.ndim + len(_axes(node))
            for a in sorted(a % rank for a in _axes(node)):
                out = np.expand_dims(out, a)
            return out
        target = const_array(node.inputs[1]) if len(node.inputs) > 1 else None
        if target is None:
            raise MatchFailure.refuse(f"Reshape {node.name!r} takes its shape from a value computed in the graph",
                                      node)
        dims = [int(d) for d in np.asarray(target).reshape(-1)]
        if not attr(node, "allowzero", 0):
            dims = [array.shape[i] if d == 0 else d for i, d in enumerate(dims)]
        return array.reshape(dims)
    except (ValueError, IndexError, TypeError) as exc:
        raise MatchFailure.refuse(f"{op} {node.name!r} does not fit q/k of [batch, seq, heads*head] ({exc})",
                                  node) from None


def _layout_rank(rot: ir.Node, after: list[ir.Node], heads: int, head_size: int) -> int:
    """The rank (3: ``[B, S, N*D]``, 4: ``[B, N, S, D]``) the rotation reads q/k in, proved by running the ops after
    it on index arrays: they must bring every (token, head, dim) element to GroupQueryAttention's ``[B, S, N*D]``
    place. MatchFailure.refuse naming the ops otherwise."""
    shape = rot.inputs[0].shape
    ranks = [len(shape)] if shape is not None else [3, 4]
    failure: MatchFailure | None = None
    for rank in ranks:
        ok = rank in (3, 4)
        for b, s in _PROBE_SIZES if ok else ():
            canon = np.arange(b * s * heads * head_size).reshape(b, s, heads, head_size)
            x = canon.reshape(b, s, heads * head_size) if rank == 3 else canon.transpose(0, 2, 1, 3)
            try:
                for node in after:
                    x = _relayout(node, x)
            except MatchFailure as exc:
                failure, ok = exc, False
                break
            want = canon.reshape(b, s, heads * head_size)
            if x.shape != want.shape or not np.array_equal(x, want):
                ok = False
                break
        if ok:
            return rank
    if failure is not None and len(ranks) == 1:
        raise failure
    ops = " -> ".join(f"{n.op_type} {n.name!r}" for n in after) or "nothing"
    target = next((n for n in reversed(after) if n.op_type not in ("Cast", "Identity")), rot)
    raise MatchFailure.refuse(f"{rot.name!r}: the ops after it ({ops}) do not put each head's rotated elements back "
                              f"where GroupQueryAttention reads them ([batch, seq, {heads}*{head_size}])",
                              target)


def _precision(rot: ir.Node, after: list[ir.Node], gqa_dtype: ir.DataType | None) -> str | None:
    """None when the rotation and GQA compute in the same type; a note for float rotation + Cast to float16;
    MatchFailure.refuse naming the Cast for anything else."""
    casts = [n for n in after if n.op_type == "Cast"]
    rot_dtype = rot.inputs[0].dtype
    changing = [n for n in casts if n.inputs[0].dtype != n.outputs[0].dtype or n.inputs[0].dtype is None]
    if not changing and (rot_dtype == gqa_dtype or None in (rot_dtype, gqa_dtype)):
        return None
    if (rot_dtype, gqa_dtype) == (ir.DataType.FLOAT, ir.DataType.FLOAT16) and len(changing) == 1 and (
            changing[0].inputs[0].dtype, ir.DataType(attr(changing[0], "to"))) == (rot_dtype, gqa_dtype):
        return (f"{rot.name!r} rotates in float and Cast {changing[0].name!r} rounds to float16; GroupQueryAttention "
                "rotates in float16: equal within float16 rounding (4 float16 ulps of the head row's largest element)")
    bad = changing[0] if changing else rot
    raise MatchFailure.refuse(
        f"{bad.op_type} {bad.name!r}: the rotation computes in {rot_dtype} and GroupQueryAttention reads {gqa_dtype} "
        "through casts that change precision other than float -> float16 after the rotation, so moving the "
        "rotation into GroupQueryAttention changes the rounding", bad)


def trace_rotation(value: ir.Value, heads: int, head_size_hint: int | None = None) -> Rotation:
    """The rotation whose output, through layout ops and casts, is ``value`` (a GroupQueryAttention q or k input).

    ``heads`` is the GQA's head count for this input (num_heads for q, kv_num_heads for k); ``head_size_hint``
    (from the KV cache shape or genai_config) is used when the graph carries no static hidden size.

    Any chain of Reshape / Transpose / Squeeze / Unsqueeze / Identity / Cast after the rotation is accepted when,
    run on index arrays at two (batch, seq) sizes, it brings every rotated (token, head, dim) element to its place
    in GQA's ``[batch, seq, heads*head]`` input (so rotating there is the same rotation); GQA then reads those ops
    applied to the unrotated value (``relayout``), or, where they exactly undo the ops before the rotation
    (mirrored Transpose / Reshape / widening Cast), the value before those (``pre``). Casts: none that change
    precision, or a float rotation cast to float16 GQA (``rounding``: not bit-exact, within float16 rounding).
    """
    after: list[ir.Node] = []  # nearest the rotation last while walking up; reversed below
    v = value
    producer = v.producer()
    while _adapter(producer):
        after.append(producer)
        v = producer.inputs[0]
        producer = v.producer()
    if producer is None or producer.op_type not in ROTARY_OPS or producer.domain != MS_DOMAIN:
        what = "a graph input or initializer" if producer is None else f"{producer.op_type} {producer.name!r}"
        raise MatchFailure.absent(f"{value.name!r} is produced by {what}, not by a rotary op")
    rot = producer
    after.reverse()  # after[0] reads the rotation's output
    rot_in = rot.inputs[0]
    head_size = _head_size(rot, value, heads, head_size_hint)
    rank = _layout_rank(rot, after, heads, head_size)
    rounding = _precision(rot, after, value.dtype)
    # cancel mirrored pairs: after[i] undoes before[i] (before[0] makes the rotation's input)
    moves = [n for n in after if n.op_type != "Identity"]
    cancelled = 0
    x = rot_in
    while cancelled < len(moves):
        while x.producer() is not None and x.producer().op_type == "Identity" and _adapter(x.producer()):
            x = x.producer().inputs[0]
        if not (_adapter(x.producer()) and _mirrors(x.producer(), moves[cancelled])):
            break
        x = x.producer().inputs[0]
        cancelled += 1
    relayout = tuple(moves[cancelled:])
    num_heads = int(attr(rot, "num_heads", 0) or heads)
    if num_heads != heads:
        raise MatchFailure.absent(f"{rot.name!r}: num_heads={num_heads} but GroupQueryAttention has {heads} heads here")
    if int(attr(rot, "is_packed_batching", 0) or 0):
        raise MatchFailure.absent(f"{rot.name!r}: is_packed_batching=1 (packed batches) is not supported")
    del rank  # the rank is proved; the rotation itself is rank-agnostic from here on
    rotary_dim = int(attr(rot, "rotary_embedding_dim", 0) or 0) or head_size
    return Rotation(rot, x, value, flag(rot, "interleaved"), rotary_dim, head_size, num_heads, relayout,
                    rounding)


def _head_size(rot: ir.Node, value: ir.Value, heads: int, hint: int | None) -> int:
    """From the rotation's 4D input, else GQA's static hidden size, else ``hint``."""
    shape = rot.inputs[0].shape
    if shape is not None and len(shape) == 4 and isinstance(shape[3], int):
        return shape[3]
    hidden = value.shape[-1] if value.shape is not None and len(value.shape) == 3 else None
    if isinstance(hidden, int) and hidden % heads == 0:
        return hidden // heads
    if hint:
        return hint
    raise MatchFailure.absent(f"{rot.name!r}: hidden size of {value.name!r} is not static and the head size is unknown")


# --------------------------------------------------------------------------------------------------------------
# The 1D text table a rotation reduces to
# --------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class TextTables:
    """The 1D tables a rotation reduces to with equal position axes; one object per distinct table (identity
    is what the fold shares caches by)."""

    cos: np.ndarray  # [max_pos, rotary_dim/2] float32
    sin: np.ndarray
    source: str  # how they were obtained, for reports
    positions: PositionSource


def is_token_index(value: ir.Value | None) -> bool:
    """True when ``value`` is Reshape(Range(0, n, 1), shape): token (b, s) reads row b*S + s of its table."""
    node = value.producer() if value is not None else None
    if node is None or node.op_type != "Reshape":
        return False
    rng = node.inputs[0].producer()
    if rng is None or rng.op_type != "Range":
        return False
    start, delta = const_array(rng.inputs[0]), const_array(rng.inputs[2])
    return start is not None and delta is not None and int(start) == 0 and int(delta) == 1


def mrotary_key(node: ir.Node) -> tuple:
    """What an MRotaryEmbedding's 1D tables depend on: its caches (by identity), sections, layout and scale."""
    return (id(node.inputs[2]), id(node.inputs[3]), tuple(int(s) for s in attr(node, "mrope_section") or []),
            int(attr(node, "mrope_layout", 0) or 0), float(attr(node, "scale", 1.0)))


def mrotary_positions(node: ir.Node) -> PositionSource:
    """The positions an MRotaryEmbedding reads: the caller's, exactly (:func:`exact_positions`), or refuse."""
    return exact_positions(node.inputs[1], node)


def mrotary_tables(node: ir.Node) -> TextTables:
    """MRotaryEmbedding(x, position_ids, cos_cache, sin_cache): with equal axes every column reads row p."""
    positions = mrotary_positions(node)
    cos_t, sin_t = const_tensor(node.inputs[2]), const_tensor(node.inputs[3])
    if cos_t is None or sin_t is None:
        raise MatchFailure.absent(f"{node.name!r}: cos_cache/sin_cache are not constants")
    if len(cos_t.shape) != 2 or tuple(cos_t.shape) != tuple(sin_t.shape):
        raise MatchFailure.absent(f"{node.name!r}: cos/sin caches have shapes {list(cos_t.shape)}/{list(sin_t.shape)}, "
                                  "not [max_pos, half]")
    sections = [int(s) for s in (attr(node, "mrope_section") or [])]
    layout = int(attr(node, "mrope_layout", 0) or 0)
    half = int(cos_t.shape[1])  # type: ignore[arg-type]  # a tensor's dims are ints, never symbolic
    if len(sections) != 3 or sum(sections) != half:
        raise MatchFailure.absent(f"{node.name!r}: mrope_section {sections} does not sum to rotary_dim/2 = {half}")
    axis_of_columns(sections, layout, half)  # validates the layout
    scale = float(attr(node, "scale", 1.0))
    cos32, sin32 = (np.asarray(t.numpy(), dtype=np.float32) for t in (cos_t, sin_t))
    if scale != 1.0:
        cos32, sin32 = (cos32 * np.float32(scale)).astype(np.float32), (sin32 * np.float32(scale)).astype(np.float32)
    source = f"{node.inputs[2].name!r}/{node.inputs[3].name!r} (sections {sections}, layout {layout})"
    return TextTables(cos32, sin32, source, positions)
