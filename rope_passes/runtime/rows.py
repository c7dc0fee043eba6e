"""A cos/sin cone over many positions, fast: NumPy moves the data, onnxruntime computes every number.

:func:`rope_passes.runtime.evaluate.subgraph_runner` runs a cone as the graph says, on every element it produces:
the manual mRoPE cone of a 128,000-row Qwen2.5-VL table computes ``Cos``/``Sin`` on ``[3, 1, N, 128]`` to keep
``[N, 64]`` (three equal position axes, a half that duplicates the other), and moves ~200 MB through Transpose,
Concat and Split per output, ~0.5 s per table. :class:`RowEvaluator` evaluates the same nodes with the *same
numbers* and less work:

* **data movement** (Identity, Unsqueeze, Squeeze, Reshape, Transpose, Slice, Split, Gather, Concat, Expand, Shape)
  runs in NumPy: each output element is a copy of one input element, so NumPy and onnxruntime agree bit for bit,
  and most of these are views (no copy);
* **pure elementwise unary ops** (:data:`DEFERRED`: Cos, Sin, Cast, Neg, ...) are *deferred*: data movement is
  applied to their input first and the op runs once, at the end, on the elements that reach an output
  (``f(move(x)) == move(f(x))`` for an op whose output element depends only on the same input element);
* **every other op, and every deferred op when it runs** is one node in its own onnxruntime CPU session (one per
  node, reused across chunks): the numbers are onnxruntime's own kernels', as in the whole-graph run.

Anything it cannot do (an op reading a value it cannot provide, a NumPy error) raises :class:`Unsupported`; the
caller then runs the whole cone on onnxruntime. The caller also compares the rows of probe calls run on the whole
cone with onnxruntime against these rows, bit for bit (:func:`rope_passes.proofs.mrope_cone.evaluate_tables`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import attr, const_tensor

#: elementwise ops of one input whose output element ``i`` depends on input element ``i`` only
DEFERRED = frozenset({"Cos", "Sin", "Tan", "Acos", "Asin", "Atan", "Cosh", "Sinh", "Tanh", "Exp", "Log", "Sqrt",
                      "Reciprocal", "Neg", "Abs", "Floor", "Ceil", "Round", "Sign", "Erf", "Sigmoid", "Relu",
                      "Identity", "Cast"})
_MOVEMENT = frozenset({"Unsqueeze", "Squeeze", "Reshape", "Transpose", "Slice", "Split", "Gather", "Concat", "Expand",
                       "Shape"})


class Unsupported(Exception):
    """This evaluator cannot run the cone (the caller runs it on onnxruntime whole)."""


@dataclasses.dataclass(frozen=True)
class _Deferred:
    """``chain`` (deferred unary nodes, first to last) applied to ``base``, not computed yet."""

    base: np.ndarray
    chain: tuple[ir.Node, ...]


_Val = np.ndarray | _Deferred


def _chain_key(chain: tuple[ir.Node, ...]) -> tuple:
    return tuple(id(n) for n in chain)


class RowEvaluator:
    """The values ``outputs`` of ``model`` as functions of ``inputs`` (every other graph input refused)."""

    def __init__(self, model: ir.Model, inputs: Sequence[ir.Value], outputs: Sequence[ir.Value]) -> None:
        self.model = model
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 18))
        self._sessions: dict[tuple, object] = {}
        self._order = self._topological()

    def _topological(self) -> list[ir.Node]:
        given = {id(v) for v in self.inputs}
        order: list[ir.Node] = []
        seen: set[int] = set()
        stack: list[tuple[ir.Node, bool]] = [(v.producer(), False) for v in self.outputs  # type: ignore[misc]
                                             if v.producer() is not None and id(v) not in given]
        while stack:
            node, ready = stack.pop()
            if ready:
                order.append(node)
                continue
            if id(node) in seen:
                continue
            seen.add(id(node))
            stack.append((node, True))
            for v in node.inputs:
                if v is None or id(v) in given or const_tensor(v) is not None:
                    continue
                producer = v.producer()
                if producer is None:
                    raise Unsupported(f"reads graph input {v.name!r}")
                if id(producer) not in seen:
                    stack.append((producer, False))
        return order

    def __call__(self, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
        vals: dict[int, _Val] = {id(v): f for v, f in zip(self.inputs, feeds, strict=True)}
        try:
            for node in self._order:
                ins = [None if v is None else self._get(v, vals) for v in node.inputs]
                outs = self._node(node, ins)
                for v, o in zip(node.outputs, outs, strict=True):
                    vals[id(v)] = o
            return [self._materialize(vals[id(v)]) for v in self.outputs]
        except Unsupported:
            raise
        except (ValueError, IndexError, TypeError, KeyError) as exc:  # NumPy could not do it as ONNX would
            raise Unsupported(f"{type(exc).__name__}: {exc}") from None

    def _get(self, v: ir.Value, vals: dict[int, _Val]) -> _Val:
        if id(v) in vals:
            return vals[id(v)]
        tensor = const_tensor(v)
        if tensor is None:
            raise Unsupported(f"value {v.name!r} is neither computed nor constant")
        array = tensor.numpy()
        vals[id(v)] = array
        return array

    # -- one node ---------------------------------------------------------------------------------------------
    def _node(self, node: ir.Node, ins: list[_Val | None]) -> Sequence[_Val]:
        op = node.op_type
        if node.domain not in ("", "ai.onnx"):
            raise Unsupported(f"custom op {node.domain}::{op}")
        if op in DEFERRED and len(ins) == 1 and ins[0] is not None and len(node.outputs) == 1:
            x = ins[0]
            if isinstance(x, _Deferred):
                return [_Deferred(x.base, (*x.chain, node))]
            return [_Deferred(x, (node,))]
        if op in _MOVEMENT and ins and ins[0] is not None:
            return self._move(node, ins)
        return self._run(node, [None if x is None else self._materialize(x) for x in ins])

    def _move(self, node: ir.Node, ins: list[_Val | None]) -> Sequence[_Val]:
        op = node.op_type
        x = ins[0]
        assert x is not None
        if op == "Concat":
            parts = [a for a in ins if a is not None]
            axis = int(attr(node, "axis", 0))
            deferred = [p for p in parts if isinstance(p, _Deferred)]
            if len(deferred) == len(parts) and len({_chain_key(p.chain) for p in deferred}) == 1:
                return [_Deferred(np.concatenate([p.base for p in deferred], axis=axis), deferred[0].chain)]
            return [np.concatenate([self._materialize(p) for p in parts], axis=axis)]
        if op == "Shape":
            shape = (x.base if isinstance(x, _Deferred) else x).shape
            start, end = attr(node, "start", 0), attr(node, "end", None)
            return [np.array(shape[slice(start, end)], dtype=np.int64)]
        rest = [None if a is None else self._materialize(a) for a in ins[1:]]
        if isinstance(x, _Deferred):
            return [_Deferred(y, x.chain) for y in self._move_array(node, x.base, rest)]
        return self._move_array(node, x, rest)

    def _move_array(self, node: ir.Node, x: np.ndarray, rest: list[np.ndarray | None]) -> list[np.ndarray]:
        op = node.op_type
        if op == "Identity":
            return [x]
        if op in ("Unsqueeze", "Squeeze"):
            axes = _ints(node, rest, 0, "axes", self.opset >= 13)
            if op == "Unsqueeze":
                rank = x.ndim + len(axes)
                return [np.expand_dims(x, tuple(sorted(a % rank for a in axes)))]
            if not axes:
                return [np.squeeze(x)]
            return [np.squeeze(x, axis=tuple(a % x.ndim for a in axes))]
        if op == "Reshape":
            shape = [int(s) for s in np.asarray(rest[0]).reshape(-1)]
            if not attr(node, "allowzero", 0):
                shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
            return [x.reshape(shape)]
        if op == "Transpose":
            perm = attr(node, "perm", None)
            return [np.transpose(x, None if perm is None else tuple(perm))]
        if op == "Expand":
            shape = [int(s) for s in np.asarray(rest[0]).reshape(-1)]
            return [np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(shape)))]
        if op == "Gather":
            axis = int(attr(node, "axis", 0)) % x.ndim
            idx = np.asarray(rest[0])
            if idx.size and (idx.min() < -x.shape[axis] or idx.max() >= x.shape[axis]):
                raise Unsupported("Gather index out of range")
            lead: tuple = (slice(None),) * axis
            if idx.ndim == 0:
                return [x[lead + (int(idx),)]]  # a view
            flat = idx.reshape(-1) % x.shape[axis]
            step = int(flat[1] - flat[0]) if flat.size > 1 else 1
            if idx.ndim == 1 and flat.size and step > 0 and np.array_equal(flat, flat[0] + step * np.arange(flat.size)):
                return [x[lead + (slice(int(flat[0]), int(flat[-1]) + 1, step),)]]  # evenly spaced: a view
            return [np.take(x, idx, axis=axis)]
        if op == "Slice":
            starts = _ints(node, rest, 0, "starts", self.opset >= 10)
            ends = _ints(node, rest, 1, "ends", self.opset >= 10)
            axes = _ints(node, rest, 2, "axes", self.opset >= 10) or list(range(len(starts)))
            steps = _ints(node, rest, 3, "steps", True) if self.opset >= 10 else []
            steps = steps or [1] * len(starts)
            index: list[slice] = [slice(None)] * x.ndim
            for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
                if st == 0:
                    raise Unsupported("Slice step 0")
                index[a % x.ndim] = slice(*slice(s, e, st).indices(x.shape[a % x.ndim]))
            return [x[tuple(index)]]
        if op == "Split":
            axis = int(attr(node, "axis", 0)) % x.ndim
            sizes = _ints(node, rest, 0, "split", self.opset >= 13)
            n = len(node.outputs)
            if not sizes:
                extent = x.shape[axis]
                if attr(node, "num_outputs", None) is not None:
                    size = -(-extent // n)
                    sizes = [min(size, extent - k * size) for k in range(n)]
                elif extent % n:
                    raise Unsupported("Split of an extent that the outputs do not divide")
                else:
                    sizes = [extent // n] * n
            if len(sizes) != n or sum(sizes) != x.shape[axis] or min(sizes) < 0:
                raise Unsupported("Split sizes that do not add up")
            return list(np.split(x, np.cumsum(sizes)[:-1].tolist(), axis=axis))
        raise Unsupported(f"movement op {op}")  # pragma: no cover - _MOVEMENT lists the ones above

    # -- numbers: onnxruntime -----------------------------------------------------------------------------------
    def _materialize(self, x: _Val) -> np.ndarray:
        if not isinstance(x, _Deferred):
            return x
        value = np.ascontiguousarray(x.base)
        for node in x.chain:
            (value,) = self._run(node, [value])
        return value

    def _run(self, node: ir.Node, ins: list[np.ndarray | None]) -> list[np.ndarray]:
        feeds = [a for a in ins if a is not None]
        key = (id(node), tuple((a.dtype.str, a.ndim) for a in feeds))
        session = self._sessions.get(key)
        if session is None:
            session = self._sessions[key] = self._session(node, ins)
        names = [f"in{k}" for k, a in enumerate(ins) if a is not None]
        return list(session.run(None, dict(zip(names, [np.ascontiguousarray(a) for a in feeds], strict=True))))  # type: ignore[attr-defined]

    def _session(self, node: ir.Node, ins: list[np.ndarray | None]) -> object:
        from rope_passes.runtime.sessions import create_session, session_options  # every session comes from there

        values = [None if a is None else ir.Value(name=f"in{k}", type=ir.TensorType(ir.DataType.from_numpy(a.dtype)),
                                                  shape=ir.Shape([None] * a.ndim)) for k, a in enumerate(ins)]
        attrs = [ir.Attr(a.name, a.type, a.value) for a in node.attributes.values()]
        one = ir.Node(node.domain, node.op_type, values, attributes=attrs, num_outputs=len(node.outputs))
        for k, out in enumerate(one.outputs):
            out.name = f"out{k}"
        graph = ir.Graph([v for v in values if v is not None], one.outputs, nodes=[one],
                         opset_imports={"": self.opset})
        proto = ir.serde.serialize_model(ir.Model(graph, ir_version=min(self.model.ir_version or 10, 10)))
        so = session_options("cpu")
        so.intra_op_num_threads = 1  # small single ops: threads cost more than they give
        try:
            return create_session(proto.SerializeToString(), "cpu", so=so)
        except Exception as exc:  # noqa: BLE001 - onnxruntime refuses the node alone: run the whole cone instead
            raise Unsupported(f"{node.op_type} alone does not load ({type(exc).__name__})") from None


def _ints(node: ir.Node, rest: list[np.ndarray | None], index: int, name: str, from_input: bool) -> list[int]:
    """An int list from input ``index + 1`` (``rest[index]``) when the opset reads it there, else the attribute."""
    if from_input:
        value = rest[index] if index < len(rest) else None
        return [] if value is None else [int(v) for v in np.asarray(value).reshape(-1)]
    found = attr(node, name, None)
    return [] if found is None else [int(v) for v in found]


__all__ = ["DEFERRED", "RowEvaluator", "Unsupported"]
