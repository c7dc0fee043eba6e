"""Small read-only helpers over onnx_ir graphs shared by analysis and passes."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import onnx_ir as ir

MS_DOMAIN = "com.microsoft"


def iter_nodes(model_or_graph: ir.Model | ir.Graph) -> Iterator[ir.Node]:
    graph = model_or_graph.graph if isinstance(model_or_graph, ir.Model) else model_or_graph
    return ir.traversal.RecursiveGraphIterator(graph)


def nodes_of(model: ir.Model | ir.Graph, op_type: str, domain: str | None = None) -> list[ir.Node]:
    out = []
    for node in iter_nodes(model):
        if node.op_type == op_type and (domain is None or (node.domain or "") in _domain_aliases(domain)):
            out.append(node)
    return out


def _domain_aliases(domain: str) -> set[str]:
    return {"", "ai.onnx"} if domain in ("", "ai.onnx") else {domain}


def attr(node: ir.Node, name: str, default=None):
    a = node.attributes.get(name)
    if a is None:
        return default
    return a.value


def const_tensor(value: ir.Value | None) -> ir.TensorProtocol | None:
    """The constant tensor behind ``value`` (initializer or Constant ``value`` attribute), without reading it."""
    if value is None:
        return None
    if value.const_value is not None:
        return value.const_value
    producer = value.producer()
    if producer is not None and producer.op_type == "Constant" and producer.domain in ("", "ai.onnx"):
        a = producer.attributes.get("value")
        if a is not None and isinstance(a.value, ir.TensorProtocol):
            return a.value
    return None


def const_array(value: ir.Value | None, max_size: int | None = None) -> np.ndarray | None:
    """The constant content of a value: an initializer or a Constant node's output; None if not constant.

    ``max_size``: return None for tensors with more elements (so weights are never read by accident). Without it,
    an external initializer is read from disk, so only call it when the values are needed.
    """
    if value is None:
        return None
    tensor = const_tensor(value)
    if tensor is not None:
        if max_size is not None and tensor.size > max_size:
            return None
        return tensor.numpy()
    producer = value.producer()
    if producer is not None and producer.op_type == "Constant" and producer.domain in ("", "ai.onnx"):
        for key in ("value_int", "value_ints", "value_float", "value_floats"):
            a = producer.attributes.get(key)
            if a is not None:
                return np.array(a.value)
    return None


def ancestors(values: Iterable[ir.Value | None], stop: Iterable[str] = ()) -> list[ir.Node]:
    """Producers of ``values`` transitively, in discovery order; does not walk past nodes whose op is in ``stop``."""
    stop = frozenset(stop)
    seen: dict[int, ir.Node] = {}
    stack = [v.producer() for v in values if v is not None and v.producer() is not None]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen[id(node)] = node
        if node.op_type in stop:
            continue
        stack.extend(inp.producer() for inp in node.inputs if inp is not None and inp.producer() is not None)
    return list(seen.values())


def consumers(value: ir.Value) -> list[ir.Node]:
    return [user for user, _ in value.uses()]
