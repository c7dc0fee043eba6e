"""Position arithmetic a mutant splices between the position input and the rotation.

Each transform is ``f(chain, positions) -> value`` on int64 positions ``[3, B, S]`` or ``[B, S]`` (the call length is
the last axis, the batch the one before it). The names say what they compute; ``POINTWISE`` ones depend on each
token's own position only (a table can absorb them), the others on the call (its length, batch, minimum, maximum).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from .edit import Chain

I64 = ir.DataType.INT64
F32 = ir.DataType.FLOAT
BOOL = ir.DataType.BOOL
#: threshold of the per-call switches: calls of the suite have largest positions 7 (prefill) up to 44 (past 37)
SWITCH_AT = 20


def mul(k: int):
    def f(c: Chain, p: ir.Value) -> ir.Value:
        return c.op("Mul", p, c.scalar(k), shape=p.shape)
    return f


def add(k: int):
    def f(c: Chain, p: ir.Value) -> ir.Value:
        return c.op("Add", p, c.scalar(k), shape=p.shape)
    return f


def div(k: int):
    def f(c: Chain, p: ir.Value) -> ir.Value:
        return c.op("Div", p, c.scalar(k), shape=p.shape)
    return f


def neg(c: Chain, p: ir.Value) -> ir.Value:
    return c.op("Neg", p, shape=p.shape)


def identity(c: Chain, p: ir.Value) -> ir.Value:
    return c.op("Identity", p, shape=p.shape)


def cast_same(c: Chain, p: ir.Value) -> ir.Value:
    return c.op("Cast", p, shape=p.shape, to=I64)


def minus_min(c: Chain, p: ir.Value) -> ir.Value:
    """Positions relative to the call's smallest one (0.. for every call)."""
    low = c.op("ReduceMin", p, keepdims=1)
    return c.op("Sub", p, low, shape=p.shape)


def minus_first(c: Chain, p: ir.Value) -> ir.Value:
    """Positions relative to each row's first position (Slice, no Reduce op)."""
    first = c.op("Slice", p, c.i64(0), c.i64(1), c.i64(-1))
    return c.op("Sub", p, first, shape=p.shape)


def _max_over_call(c: Chain, p: ir.Value) -> ir.Value:
    return c.op("ReduceMax", p, keepdims=0)


def max_switch_halve(c: Chain, p: ir.Value) -> ir.Value:
    """Frequency switch: positions halved (linear scaling 2) when the call's largest position exceeds SWITCH_AT."""
    cond = c.op("Greater", _max_over_call(c, p), c.scalar(SWITCH_AT), dtype=BOOL)
    return c.op("Where", cond, c.op("Div", p, c.scalar(2)), p, shape=p.shape)


def max_switch_shift(c: Chain, p: ir.Value) -> ir.Value:
    """Where on ReduceMax: positions + 1 while the call's largest position is at most SWITCH_AT."""
    cond = c.op("Greater", _max_over_call(c, p), c.scalar(SWITCH_AT), dtype=BOOL)
    return c.op("Where", cond, p, c.op("Add", p, c.scalar(1)), shape=p.shape)


def plus_call_length(c: Chain, p: ir.Value) -> ir.Value:
    return c.op("Add", p, c.dim(p, -1), shape=p.shape)


def plus_call_length_mod2(c: Chain, p: ir.Value) -> ir.Value:
    return c.op("Add", p, c.op("Mod", c.dim(p, -1), c.i64(2)), shape=p.shape)


def plus_decode_flag(c: Chain, p: ir.Value) -> ir.Value:
    """+1 in single-token calls only (the decode steps), +0 in any longer call."""
    one_token = c.op("Equal", c.dim(p, -1), c.i64(1), dtype=BOOL)
    return c.op("Add", p, c.op("Cast", one_token, dtype=I64, to=I64), shape=p.shape)


def plus_batch_minus_one(c: Chain, p: ir.Value) -> ir.Value:
    return c.op("Add", p, c.op("Sub", c.dim(p, -2), c.i64(1)), shape=p.shape)


def plus_batch_flag_through_pattern(c: Chain, p: ir.Value) -> ir.Value:
    """+1 when the batch is 4 or more, the batch counted as ReduceSum(ConstantOfShape([batch], 1)): a value whose
    stored pattern ([1]) is not the tensor ([batch])."""
    ones = c.op("ConstantOfShape", c.dim(p, -2), dtype=I64, value=ir.tensor(np.array([1], np.int64)))
    batch = c.op("ReduceSum", ones, keepdims=0)
    flag = c.op("Greater", batch, c.scalar(3), dtype=BOOL)
    return c.op("Add", p, c.op("Cast", flag, dtype=I64, to=I64), shape=p.shape)


def plus_past_flag_by_dim_name(mask_name: str):
    """+1 when the call has a past: the mask's width differs from the call's length. Exporters declare both as
    "seq", so a proof that trusted the names would take them as equal."""
    def f(c: Chain, p: ir.Value) -> ir.Value:
        mask = next(v for v in c.graph.inputs if v.name == mask_name)
        has_past = c.op("Not", c.op("Equal", c.dim(mask, -1), c.dim(p, -1), dtype=BOOL), dtype=BOOL)
        return c.op("Add", p, c.op("Cast", has_past, dtype=I64, to=I64), shape=p.shape)
    return f


def plus_past_from_mask(mask_name: str):
    """+ (mask width - call length) = + past length: reads a second graph input (the attention mask)."""
    def f(c: Chain, p: ir.Value) -> ir.Value:
        mask = next(v for v in c.graph.inputs if v.name == mask_name)
        past = c.op("Sub", c.dim(mask, -1), c.dim(p, -1))
        return c.op("Add", p, past, shape=p.shape)
    return f


# -- per-axis edits of [3, B, S] positions --------------------------------------------------------------------
def _axes(c: Chain, p: ir.Value) -> list[ir.Value]:
    return [c.op("Slice", p, c.i64(a), c.i64(a + 1), c.i64(0)) for a in range(3)]


def axis_add(axis: int, k: int):
    def f(c: Chain, p: ir.Value) -> ir.Value:
        parts = _axes(c, p)
        parts[axis] = c.op("Add", parts[axis], c.scalar(k))
        return c.op("Concat", *parts, shape=p.shape, axis=0)
    return f


def axis_mul(axis: int, k: int):
    def f(c: Chain, p: ir.Value) -> ir.Value:
        parts = _axes(c, p)
        parts[axis] = c.op("Mul", parts[axis], c.scalar(k))
        return c.op("Concat", *parts, shape=p.shape, axis=0)
    return f


def axes_permuted(c: Chain, p: ir.Value) -> ir.Value:
    t, h, w = _axes(c, p)
    return c.op("Concat", h, w, t, shape=p.shape, axis=0)


# -- per-call frequency switches without Where (a float factor in {0, 1}) ---------------------------------------
def _flag(c: Chain, cond: ir.Value) -> ir.Value:
    return c.op("Cast", cond, dtype=F32, to=F32)


def switch_reducemax(c: Chain, p: ir.Value) -> ir.Value:
    """Cast(ReduceMax(positions) + 1 > 32): transformers' LongRoPE test written without Where."""
    top = c.op("Add", _max_over_call(c, p), c.scalar(1))
    return _flag(c, c.op("Greater", top, c.scalar(32), dtype=BOOL))


def switch_maxpool(c: Chain, p: ir.Value) -> ir.Value:
    """Per-row largest position by GlobalMaxPool (no Reduce op): [B, 1, 1]."""
    pf = c.op("Unsqueeze", c.op("Cast", p, dtype=F32, to=F32), c.i64(1))
    top = c.op("GlobalMaxPool", pf)
    return _flag(c, c.op("Greater", top, c.scalar(31.0, np.float32), dtype=BOOL))


def switch_last(c: Chain, p: ir.Value) -> ir.Value:
    """Per-row last position by Slice (no Reduce op): [B, 1, 1]."""
    last = c.op("Slice", p, c.i64(-1), c.i64(np.iinfo(np.int64).max), c.i64(-1))
    flag = _flag(c, c.op("Greater", last, c.scalar(31), dtype=BOOL))
    return c.op("Unsqueeze", flag, c.i64(2))


def switch_call_length(c: Chain, p: ir.Value) -> ir.Value:
    return _flag(c, c.op("Greater", c.dim(p, -1), c.i64(2), dtype=BOOL))


def switch_einsum_sum(c: Chain, p: ir.Value) -> ir.Value:
    """Sum of the call's positions by Einsum (no Reduce op) above 500."""
    total = c.op("Einsum", c.op("Cast", p, dtype=F32, to=F32), equation="bs->")
    return _flag(c, c.op("Greater", total, c.scalar(500.0, np.float32), dtype=BOOL))


def blend(flag_of):
    """``v -> v * (1 - flag) + (v * 0.25) * flag``: LongRoPE's short/long factor choice as arithmetic."""
    def build(c: Chain, v: ir.Value, positions: ir.Value) -> ir.Value:
        flag = flag_of(c, positions)
        short = c.op("Mul", v, c.op("Sub", c.scalar(1.0, np.float32), flag))
        long = c.op("Mul", c.op("Mul", v, c.scalar(0.25, np.float32)), flag)
        return c.op("Add", short, long)
    return build
