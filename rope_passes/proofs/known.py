"""Values of the cos/sin cone that do not read the positions' values (:class:`Known`): constants, constants
broadcast to a call's shape (``Expand`` / ``ConstantOfShape``: uniform along those axes, extents set per call), and
the shape arithmetic of a call (``Shape`` / ``Size`` of the positions), whose elements are tracked symbolically
(:class:`Dim` ``k`` = ``positions.shape[k]``; :data:`OPAQUE` = a call-dependent number nothing more is known about).
Numbers are computed by onnx's reference evaluator one node at a time; data movement on symbols by running the op on
element indices. Used by :mod:`rope_passes.proofs.cone`; :func:`evaluate_node` is also the per-node step of
:mod:`rope_passes.proofs.constants`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import attr
from rope_passes.proofs.dims import OPAQUE, Affine, Dim, Ext, _Opaque, affine, affine_sum, symbolic
from rope_passes.report import MatchFailure

SMALL = 4096  # elements kept as values


@dataclasses.dataclass(frozen=True)
class Known:
    shape: tuple[Ext, ...] | None  # None: not known
    pattern: tuple[int, ...] | None = None  # static extents of the data (1 = uniform along that axis)
    values: np.ndarray | None = None  # shaped like ``pattern``; object dtype when it holds symbols
    varies: bool = False

    @classmethod
    def of(cls, array: np.ndarray) -> Known:
        sym = array.dtype == object and any(isinstance(x, (Dim, _Opaque)) for x in array.flat)
        if array.dtype == object and not sym:  # numbers only after all: back to a numeric array
            array = np.array(array.tolist()).reshape(array.shape)
        return cls(tuple(int(d) for d in array.shape), tuple(array.shape), array, sym)


UNKNOWN_VARYING = Known(None, None, None, True)
UNARY = {"Cast", "Identity", "Neg", "Abs", "Cos", "Sin", "Tan", "Exp", "Log", "Sqrt", "Reciprocal", "Floor", "Ceil",
          "Round", "Sign", "Not", "Relu", "Sigmoid", "Tanh", "Erf", "IsNaN", "IsInf", "Atan", "Asin", "Acos", "Sinh",
          "Cosh", "Softplus"}
NARY = {"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Equal", "Greater", "GreaterOrEqual", "Less",
         "LessOrEqual", "And", "Or", "Xor", "Where", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "Sum",
         "Mean", "CastLike"}
_MOVES = {"Identity", "Unsqueeze", "Squeeze", "Reshape", "Slice", "Transpose", "Expand", "Gather", "Concat", "Flatten",
          "Pad", "GatherElements", "GatherND",
          "Tile", "Split"}
def combine(exts: Sequence) -> Ext:
    """The broadcast extent of feature axes (ints, Dim, OPAQUE)."""
    ints = {e for e in exts if isinstance(e, int)} - {1}
    syms = {e for e in exts if not isinstance(e, int)}
    if len(ints) > 1:
        raise MatchFailure.refuse(f"feature extents {sorted(ints)} do not broadcast")
    if ints:
        return ints.pop()
    if len(syms) == 1:
        return syms.pop()
    return OPAQUE if syms else 1


def const(tensor: ir.TensorProtocol) -> Known:
    shape = tuple(int(d) for d in tensor.shape)
    values = tensor.numpy() if tensor.size <= SMALL else None
    return Known(shape, shape, values, False)


def known_values(v: object) -> np.ndarray | None:
    if not isinstance(v, Known) or v.values is None or v.shape is None or v.pattern != v.shape:
        return None
    return v.values


# -- values not reading the positions ---------------------------------------------------------------------------------
def known_op(node: ir.Node, ins: list[Known | None], opset: int) -> list[Known]:
    op = node.op_type
    n_out = len(node.outputs)
    if op == "ConstantOfShape" or (op == "Expand" and ins[0] is not None):
        shape = known_values(ins[-1])
        if shape is None or shape.ndim != 1:
            return [UNKNOWN_VARYING]
        entries = shape.tolist()
        if op == "ConstantOfShape":
            fill = attr(node, "value", None)
            data = fill.numpy().reshape(()) if fill is not None else np.float32(0)
            base = Known((), (), np.asarray(data), False)
        else:
            base = ins[0]
        if base.shape is None:
            return [UNKNOWN_VARYING]
        rank = max(len(entries), len(base.shape))
        b_shape = (1,) * (rank - len(base.shape)) + base.shape
        pattern = (1,) * (rank - len(base.shape)) + (base.pattern if base.pattern is not None else base.shape)
        entries = [1] * (rank - len(entries)) + entries
        out_shape = tuple(combine([b, e]) if not isinstance(e, _Opaque) or b == 1 else b
                          for b, e in zip(b_shape, entries, strict=True))
        values = None if base.values is None else base.values.reshape(pattern)
        if values is not None and all(isinstance(e, int) for e in out_shape) and int(np.prod(out_shape)) <= SMALL:
            return [Known.of(np.broadcast_to(values, out_shape).copy()) if not base.varies else
                    Known(out_shape, out_shape, np.broadcast_to(values, out_shape).copy(), True)]
        return [Known(out_shape, tuple(int(p) for p in pattern), values, base.varies)]
    if any(a is None or a.shape is None for a in ins if a is not None) or not ins:
        return [UNKNOWN_VARYING] * n_out
    present = [a for a in ins if a is not None]
    varies = any(a.varies for a in present)
    if op in UNARY or op in NARY:
        shape = tuple(combine(col) for col in _columns([a.shape for a in present]))  # type: ignore[misc]
        patterns = [a.pattern for a in present]
        if any(p is None for p in patterns) or any(a.values is None for a in present):
            return [Known(shape, None, None, varies)]
        out = evaluate_node(node, [a.values for a in ins] if op != "CastLike" else [ins[0].values, ins[1].values], opset)
        if out is None:
            return [Known(shape, None, None, True)]
        value = Known.of(out[0])
        return [Known(shape, value.pattern, value.values, varies and value.varies)]
    if op in _MOVES and all(a.pattern == a.shape for a in present):
        return _move(node, ins, opset, varies)
    if op in ("Shape", "Size"):
        a = present[0]
        if op == "Size":
            return [Known.of(np.array(int(np.prod(a.shape)) if all(isinstance(d, int) for d in a.shape) else OPAQUE,
                                      dtype=object))]
        start, end = attr(node, "start", 0), attr(node, "end", None)
        return [Known.of(np.array(list(a.shape)[start:end], dtype=object))]
    if op in _REDUCE and ins[0] is not None:
        reduced = _reduce(node, ins, opset)
        if reduced is not None:
            return [reduced]
    # any other op on numbers: only on whole tensors (a stored pattern is not the tensor: ReduceSum of a
    # ConstantOfShape(Shape(positions)) counts the batch)
    if not varies and all(a.values is not None and a.values.dtype != object and a.pattern == a.shape
                          for a in present):
        out = evaluate_node(node, [None if a is None else a.values for a in ins], opset)
        if out is not None:
            return [Known.of(v) for v in out]
    return [UNKNOWN_VARYING] * n_out


_REDUCE = {"ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean", "ReduceProd"}


def _reduce(node: ir.Node, ins: list[Known | None], opset: int) -> Known | None:
    """A reduction of a value holding call dimensions, or uniform along an axis of a call's extent (a constant
    broadcast to the mask's shape): axes of one element are moved, uniform axes reduced by their value (``c`` for
    Max/Min/Mean, ``c * extent`` for Sum: a row of ones sums to the width). None: not such a reduction."""
    x = ins[0]
    assert x is not None
    if x.shape is None or x.pattern is None or x.values is None:
        return None
    rank = len(x.shape)
    if len(ins) > 1 and ins[1] is not None:
        given = known_values(ins[1])
        if given is None or given.dtype == object:
            return None
        axes = [int(a) for a in given.reshape(-1)]
    else:
        axes = [int(a) for a in attr(node, "axes", None) or []]
    if not axes:
        if attr(node, "noop_with_empty_axes", 0):
            return x
        axes = list(range(rank))
    summed = sorted({a % rank for a in axes}) if rank else []
    values = np.asarray(x.values, dtype=object)
    op = node.op_type
    for a in summed:
        extent, uniform = x.shape[a], x.pattern[a] == 1
        if extent == 1 or uniform:
            picked = np.take(values, [0], axis=a) if values.shape[a] else values
            if op == "ReduceSum" and extent != 1:
                picked = np.vectorize(lambda c, e=extent: _times(c, e), otypes=[object])(picked)
            elif op == "ReduceProd" and extent != 1:
                return None
            values = picked
        elif values.dtype == object and any(isinstance(e, (Dim, _Opaque)) for e in values.flat):
            return None  # symbols along an axis of several elements: not followed
        else:
            return None  # numbers along a data axis: the plain evaluator's (whole tensors only)
    keep = attr(node, "keepdims", 1)
    shape = tuple(1 if i in summed else d for i, d in enumerate(x.shape) if keep or i not in summed)
    pattern = tuple(1 if i in summed else p for i, p in enumerate(x.pattern) if keep or i not in summed)
    values = values.reshape(pattern)
    sym = any(isinstance(e, (Dim, _Opaque)) for e in values.flat)
    if not sym:
        values = np.array(values.tolist(), dtype=x.values.dtype).reshape(pattern)
    if shape == pattern:
        return Known.of(values)
    return Known(shape, pattern, values, x.varies or sym)


def arg_of_parts(parts: list[Known], axis: int, keepdims: bool, last: bool, smallest: bool) -> Known | None:
    """``ArgMax`` (``smallest``: ``ArgMin``) along ``axis`` of the concatenation of ``parts`` along it, where each
    part is one number throughout: the index where the first (``last``: the last) part holding the extreme starts
    (ends), summed from the parts' extents (ints and call dimensions: :func:`~rope_passes.proofs.dims.affine`).
    Exact for every call: a part whose extent may be 0 takes no part in the extreme, so the chosen part must have an
    extent of at least 1 and every part before it (after it, for ``last``) a value strictly less extreme, the others
    one not more extreme. None where that is not so (a part of several numbers, NaN, an extent nothing is known of)."""
    numbers, extents = [], []
    for p in parts:
        if p.shape is None or p.values is None or p.values.dtype == object or len(p.shape) != len(parts[0].shape):
            return None
        flat = np.unique(p.values)
        if flat.size != 1 or (flat.dtype.kind == "f" and not np.isfinite(flat[0])):
            return None
        numbers.append(-flat[0].item() if smallest else flat[0].item())
        extents.append(p.shape[axis])
    order = range(len(parts) - 1, -1, -1) if last else range(len(parts))
    top = max((n for n, e in zip(numbers, extents, strict=True) if e != 0), default=None)
    chosen = next((i for i in order if numbers[i] == top and isinstance(extents[i], int) and extents[i] >= 1), None)
    if chosen is None:
        return None
    before = range(chosen + 1, len(parts)) if last else range(chosen)
    if any(numbers[i] == top and extents[i] != 0 for i in before):
        return None  # a part of the same value that may or may not be empty: the index moves with it
    index: object = 0
    for i in range(chosen):
        if not isinstance(extents[i], (int, Dim, Affine)):
            return None
        index = affine_sum(index, extents[i])
    if last:
        index = affine_sum(index, extents[chosen] - 1)  # type: ignore[operator]
    if index is OPAQUE:
        return None
    shape = tuple(1 if a == axis else d for a, d in enumerate(parts[0].shape) if keepdims or a != axis)  # type: ignore[union-attr]
    ones = (1,) * len(shape)
    sym = not isinstance(index, int)
    values = np.full(ones, index, dtype=object if sym else np.int64)
    return Known.of(values) if shape == ones else Known(shape, ones, values, sym)


def arg_of_concat(node: ir.Node, value_of: Callable[[int], object]) -> Known | None:
    """``ArgMax``/``ArgMin`` ``node`` of a ``Concat`` along its axis, the parts' values by id (``value_of``): where
    the first (last) extreme part starts (:func:`arg_of_parts`), e.g. the width for ``ArgMax(Concat(zeros[w], [1]))``;
    None where that is not so."""
    concat = node.inputs[0].producer() if node.inputs and node.inputs[0] is not None else None
    if concat is None or concat.op_type != "Concat" or concat.domain not in ("", "ai.onnx"):
        return None
    parts = [value_of(id(v)) if v is not None else None for v in concat.inputs]
    known = [p for p in parts if isinstance(p, Known) and p.shape]
    if not known or len(known) != len(parts):
        return None
    rank = len(known[0].shape)  # type: ignore[arg-type]
    axis = int(attr(node, "axis", 0)) % rank
    if int(attr(concat, "axis", 0)) % rank != axis:
        return None
    return arg_of_parts(known, axis, bool(attr(node, "keepdims", 1)),
                        bool(attr(node, "select_last_index", 0)), node.op_type == "ArgMin")


def _times(c: object, extent: object) -> object:
    """``c`` summed ``extent`` times (a call dimension: only 0 and 1 give a known number)."""
    if isinstance(extent, int) and not isinstance(c, (Dim, _Opaque)):
        return c * extent
    if isinstance(c, (Dim, _Opaque)):
        return OPAQUE
    if c == 0:
        return 0
    return extent if c == 1 else OPAQUE


def _columns(shapes: list[tuple]) -> list[list]:
    rank = max(len(s) for s in shapes)
    return [[s[i - (rank - len(s))] for s in shapes if i - (rank - len(s)) >= 0] for i in range(rank)]


def _move(node: ir.Node, ins: list[Known | None], opset: int, varies: bool) -> list[Known]:
    """A data-movement op on known values (symbols included): run on element indices, then take the elements."""
    if node.op_type == "Pad":  # its pad value is moved too: given as an element (0 where the input is absent)
        first = ins[0]
        if opset < 11 or first is None:
            return [UNKNOWN_VARYING] * len(node.outputs)  # pads and value as attributes: not followed
        if len(ins) < 3 or ins[2] is None:
            zero = np.zeros((), first.values.dtype if first.values is not None and first.values.dtype != object
                            else np.int64)
            ins = [ins[0], ins[1] if len(ins) > 1 else None, Known.of(zero), *ins[3:]]
    # the inputs whose elements are moved (each fed as its elements' indices); Pad's constant_value is one of them
    data_inputs = range(len(ins)) if node.op_type == "Concat" else [0, 2] if node.op_type == "Pad" else [0]
    feeds: list[np.ndarray | None] = []
    pool: list = []
    for i, a in enumerate(ins):
        if a is None or a.values is None:
            if i in data_inputs and a is not None and a.pattern is not None and int(np.prod(a.pattern)) <= 1 << 20:
                feeds.append(np.arange(len(pool), len(pool) + int(np.prod(a.pattern))).reshape(a.pattern))
                pool.extend([None] * int(np.prod(a.pattern)))
                continue
            if a is None:
                feeds.append(None)
                continue
            return [UNKNOWN_VARYING] * len(node.outputs)
        if i in data_inputs:
            feeds.append(np.arange(len(pool), len(pool) + a.values.size, dtype=np.int64).reshape(a.values.shape))
            pool.extend(a.values.reshape(-1).tolist())
        elif a.values.dtype == object:
            return [UNKNOWN_VARYING] * len(node.outputs)
        else:
            feeds.append(a.values)
    out = evaluate_node(node, feeds, opset)
    if out is None:
        return [UNKNOWN_VARYING] * len(node.outputs)
    results: list[Known] = []
    dtype = next((a.values.dtype for i, a in enumerate(ins) if i in data_inputs and a is not None
                  and a.values is not None), object)
    for idx in out:
        elems = [pool[int(i)] for i in idx.reshape(-1)]
        if any(e is None for e in elems):
            results.append(Known(tuple(int(d) for d in idx.shape), tuple(int(d) for d in idx.shape), None, varies))
            continue
        sym = any(isinstance(e, (Dim, _Opaque)) for e in elems)
        arr = np.array(elems, dtype=object if sym else dtype).reshape(idx.shape)
        results.append(Known.of(arr))
    return results


def evaluate_node(node: ir.Node, arrays: list[np.ndarray | None], opset: int) -> list[np.ndarray] | None:
    """One node on known values: onnx's reference evaluator on numbers, :func:`rope_passes.proofs.dims.symbolic` on object arrays."""
    if any(a is not None and a.dtype == object for a in arrays):
        return symbolic(node, arrays) if node.op_type in UNARY or node.op_type in NARY else None
    from onnx.reference import ReferenceEvaluator

    try:
        proto = ir.serde.serialize_node(node)
    except Exception:  # noqa: BLE001 - a node that cannot be written (unnamed values) is not evaluated
        return None
    names = [f"x{i}" if a is not None else "" for i, a in enumerate(arrays)]
    del proto.input[:]
    proto.input.extend(names)
    outs = [f"y{i}" for i in range(len(proto.output))]
    del proto.output[:]
    proto.output.extend(outs)
    feeds = {n: a for n, a in zip(names, arrays, strict=True) if n}
    if node.op_type in ("Unsqueeze", "Squeeze") and opset < 13 and "axes" in node.attributes:
        # onnx's reference evaluator runs opset 11's form through its opset-13 kernel and fails on a list attribute:
        # the same op with the axes as an input (13 changed the form only)
        (axes,) = [a for a in proto.attribute if a.name == "axes"]
        feeds["axes"] = np.array(list(axes.ints), dtype=np.int64)
        proto.attribute.remove(axes)
        proto.input.append("axes")
        opset = 13
    versions = [opset]
    first, later = _SAME_LATER.get(node.op_type, (opset + 1, opset))
    if first <= opset < later:
        versions.append(later)
    for version in versions:
        try:
            ref = ReferenceEvaluator(proto, opsets={"": version})
            return [np.asarray(r) for r in ref.run(None, feeds)]
        except Exception:  # noqa: BLE001 - an op the evaluator cannot run is simply not known
            continue
    return None


#: ops onnx's reference evaluator implements only from a later opset whose definition is the same for every input
#: the earlier one accepts: op -> (the earliest such opset, the version to run). DequantizeLinear 13..18 (int8 /
#: uint8 / int32 data, float scale, per-axis) is version 19 restricted to those types (19 adds float8 and fp16
#: scales); QuantizeLinear likewise.
_SAME_LATER = {"DequantizeLinear": (13, 19), "QuantizeLinear": (13, 19)}


__all__ = ["NARY", "OPAQUE", "SMALL", "UNARY", "UNKNOWN_VARYING", "Affine", "Dim", "Ext", "Known", "affine", "arg_of_concat", "arg_of_parts", "combine",
           "const", "evaluate_node", "known_op", "known_values"]
