"""Positions for ``precompute-cos-sin``: made in the graph (``Range(past, past + length, 1)``), and the calls the
numeric evidence runs (:func:`probes`).

Exporters of models called without ``position_ids`` (optimum's Gemma family, TorchScript) compute them in the graph:
``Range(Cast(Shape(past_key)[2]), Cast(Shape(past_key)[2] + Shape(embeds)[1]), 1) → Unsqueeze(0)``. That Range is the
*position source* of the chain: the cos/sin rows are a per-token function of its values (proved from the Range output
on, by the same cone accounting as for a ``position_ids`` input), and its values are ``past .. past + length - 1``,
never negative (the start is a sum of tensor dimensions: only ``Shape``/``Gather``/``Cast``/``Add``/``Squeeze``/
``Unsqueeze``/``Concat``/``Reshape``/``Identity`` of shapes and non-negative integer constants). So
``Gather(table, Range output)`` is exact while ``past + length <= max_positions``.

The Range output has no type in exporter graphs; :func:`typed` gives it one (int, ``[S]``) while the pass or lint
works with it, and takes it back unless a rewrite reads it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import ancestors, attr, const_tensor

_INT = (ir.DataType.INT64, ir.DataType.INT32)


def _dtype(value: ir.Value | None) -> ir.DataType | None:
    """The element type of an untyped shape-arithmetic value: from its Cast, constant, or Shape."""
    while value is not None:
        if value.dtype is not None:
            return value.dtype
        tensor = const_tensor(value)
        if tensor is not None:
            return tensor.dtype
        producer = value.producer()
        if producer is None:
            return None
        if producer.op_type == "Cast":
            return ir.DataType(attr(producer, "to"))
        if producer.op_type in ("Shape", "Size"):
            return ir.DataType.INT64
        if producer.op_type not in ("Gather", "Add", "Identity", "Squeeze", "Unsqueeze", "Reshape", "Concat"):
            return None
        value = producer.inputs[0]
    return None


#: per op, the inputs that are data (must be non-negative); the others are axes / indices / shapes
_DATA_INPUTS = {"Add": (0, 1), "Concat": None, "Gather": (0,), "Cast": (0,), "Squeeze": (0,), "Unsqueeze": (0,),
                "Reshape": (0,), "Identity": (0,)}


def _non_negative(value: ir.Value) -> bool:
    """A sum of tensor dimensions and non-negative integer constants (never a value read from a tensor)."""
    tensor = const_tensor(value)
    if tensor is not None:
        return tensor.dtype in _INT and bool(np.all(tensor.numpy() >= 0))
    producer = value.producer()
    if producer is None:
        return False
    for node in [producer, *ancestors(producer.inputs, stop=("Shape", "Size"))]:
        if node.op_type in ("Shape", "Size", "Constant"):
            continue
        if node.op_type not in _DATA_INPUTS or node.domain not in ("", "ai.onnx"):
            return False
        if node.op_type == "Cast" and attr(node, "to") not in (int(t) for t in _INT):
            return False
        data = _DATA_INPUTS[node.op_type]
        for i, v in enumerate(node.inputs):
            t = const_tensor(v) if v is not None else None
            if t is not None and (data is None or i in data) and (t.dtype not in _INT or np.any(t.numpy() < 0)):
                return False
    return True


def range_source(product: ir.Node) -> ir.Node | None:
    """The one ``Range(start, limit, 1)`` with a non-negative integer start whose output reaches ``product`` by value
    (not through Shape); None otherwise."""
    found = [n for n in ancestors(product.inputs, stop=("Shape", "Size", "Range")) if n.op_type == "Range"
             and n.domain in ("", "ai.onnx")]
    if len(found) != 1:
        return None
    (node,) = found
    start, limit, delta = node.inputs
    step = const_tensor(delta)
    if step is None or step.size != 1 or int(step.numpy().reshape(())) != 1 or _dtype(start) not in _INT:
        return None
    return node if _non_negative(start) and _non_negative(limit) else None


@contextlib.contextmanager
def typed(range_node: ir.Node | None) -> Iterator[None]:
    """While inside, the Range output has its type and a ``[S]`` shape (what evaluation and the cone need)."""
    if range_node is None:
        yield
        return
    value = range_node.outputs[0]
    old = value.type, value.shape
    if value.type is None:
        value.type = ir.TensorType(_dtype(range_node.inputs[0]) or ir.DataType.INT64)
    if value.shape is None:
        value.shape = ir.Shape([f"{range_node.name or 'range'}_length"])
    try:
        yield
    finally:
        if not any(user.name.startswith("rope_passes/") for user, _ in value.uses()):  # not read by a rewrite
            value.type, value.shape = old


def probes(rows: int, three: bool, switches: tuple[int, ...] = ()) -> list[tuple[str, np.ndarray]]:
    """Calls differing in what callers vary: the table (0..rows-1), permuted, batch 1..3, one and two tokens at the
    smallest and largest positions, windows across every power of two and every ``switches`` position, and random
    calls; for ``[3, B, S]`` positions also with the three axes differing."""
    rng = np.random.RandomState(0)
    last = rows - 1
    edges = sorted({b for b in [*(1 << k for k in range(1, 40) if (1 << k) < rows), *switches] if 0 < b < rows})
    out = [("positions 0..max_positions-1", np.arange(rows)[None, :]),
           ("permuted positions", rng.permutation(rows)[None, :]),
           ("a batch of 2 full-length calls", np.stack([np.arange(rows)[::-1], rng.permutation(rows)])),
           ("one token at position 0", np.array([[0]])),
           (f"one token at position {last}", np.array([[last]])),
           ("one token, batch 3", np.array([[min(5, last)], [last], [0]])),
           ("two tokens at the end", np.array([[max(last - 1, 0), last]])),
           ("two tokens, batch 2", np.array([[0, min(1, last)], [last, min(3, last)]])),
           ("positions of another batch and length", rng.randint(0, rows, size=(2, 3))),
           ("positions of batch 3, length 5", rng.randint(0, rows, size=(3, 5)))]
    for b in edges:
        window = np.clip(np.arange(b - 2, b + 2), 0, last)
        out += [(f"4 tokens across {b}", window[None, :]), (f"one token at {b - 1}", np.array([[b - 1]])),
                (f"one token at {b}", np.array([[b]])), (f"offset calls across {b}", np.stack([window, window[::-1]]))]
    if not three:
        return out
    shifted = [(f"{label}, axes differing", np.stack([p, (p + 7) % rows, p[:, ::-1]])) for label, p in out[1:]]
    return [(label, np.stack([p, p, p])) for label, p in out] + shifted


__all__ = ["probes", "range_source", "typed"]
