"""Small read-only helpers over onnx_ir graphs shared by analysis and passes."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import onnx_ir as ir

import rope_passes.graph_walk as graph_walk

MS_DOMAIN = "com.microsoft"

#: Constants read for their values (section sizes, masks, thresholds) have at most this many elements.
SMALL_TENSOR = 256

#: Ops that pass a value through unchanged for the purpose of tracing a cache or a hidden size.
PASS_THROUGH = ("Cast", "Identity", "CastLike")


def iter_nodes(model_or_graph: ir.Model | ir.Graph) -> Iterator[ir.Node]:
    graph = model_or_graph.graph if isinstance(model_or_graph, ir.Model) else model_or_graph
    return graph_walk.nodes(graph)


def nodes_of(model: ir.Model | ir.Graph, op_type: str, domain: str | None = None) -> list[ir.Node]:
    out = []
    for node in iter_nodes(model):
        if node.op_type == op_type and (domain is None or (node.domain or "") in _domain_aliases(domain)):
            out.append(node)
    return out


def _domain_aliases(domain: str) -> set[str]:
    return {"", "ai.onnx"} if domain in ("", "ai.onnx") else {domain}


def op_domain(node: ir.Node) -> str:
    """The node's domain with ``ai.onnx`` spelled ``""``."""
    return "" if node.domain in ("", "ai.onnx") else node.domain


def attr(node: ir.Node, name: str, default=None):
    a = node.attributes.get(name)
    if a is None:
        return default
    return a.value


_SAME_RANK = frozenset({"Cast", "CastLike", "Identity", "Neg", "Abs", "Relu", "Sigmoid", "Tanh", "Sqrt", "Reciprocal",
                        "Softmax", "LayerNormalization", "SimplifiedLayerNormalization"})
_BROADCAST = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Where"})


def rank_of(value: ir.Value | None, depth: int = 16) -> int | None:
    """The rank of ``value``: its declared shape, else read off its producers (rank-keeping and elementwise ops,
    ``Reshape`` to a constant shape, ``Transpose``, ``MatMul`` of known ranks); None when not known."""
    if value is None:
        return None
    if value.shape is not None:
        return len(value.shape)
    node = value.producer()
    if node is None or depth == 0 or node.domain not in ("", "ai.onnx", MS_DOMAIN):
        return None
    op = node.op_type
    if op in _SAME_RANK and node.inputs:
        return rank_of(node.inputs[0], depth - 1)
    if op in _BROADCAST or op == "MatMul":
        ranks = [rank_of(v, depth - 1) for v in node.inputs if v is not None]  # all broadcast into the output
        known = [r for r in ranks if r is not None]
        if not known or len(known) != len(ranks) or (op == "MatMul" and min(known) < 2):  # a 1-D MatMul drops one
            return None
        return max(known)
    if op == "Reshape" and len(node.inputs) > 1:
        target = const_array(node.inputs[1])
        return int(target.size) if target is not None else None
    if op == "Transpose":
        perm = attr(node, "perm")
        return len(perm) if perm is not None else rank_of(node.inputs[0], depth - 1)
    return None


def flag(node: ir.Node, name: str) -> bool:
    """An int flag attribute as onnxruntime's contrib kernels read it: on only when it is exactly 1
    (``interleaved=2`` is rotate-half in MRotaryEmbedding, RotaryEmbedding and GroupQueryAttention alike)."""
    return int(attr(node, name, 0) or 0) == 1


def const_tensor(value: ir.Value | None) -> ir.TensorProtocol | None:
    """The constant tensor behind ``value`` (initializer or Constant ``value`` attribute), without reading it.

    An initializer that is also a graph input is not a constant: the caller may feed another value
    (``keep_initializers_as_inputs`` exports); a proof that read its default would hold for that default only."""
    if value is None or value.is_graph_input():
        return None
    if value.const_value is not None:
        return value.const_value
    producer = value.producer()
    if producer is not None and producer.op_type == "Constant" and producer.domain in ("", "ai.onnx"):
        a = producer.attributes.get("value")
        # the attribute's declared type, not isinstance(TensorProtocol): a runtime Protocol check costs ~0.1 ms
        if a is not None and a.type == ir.AttributeType.TENSOR:
            return a.value
    return None


#: a Constant node's scalar and list attributes and the element type ONNX gives them (``value_float`` is float32)
CONSTANT_ATTRIBUTE_DTYPES = {"value_int": np.int64, "value_ints": np.int64, "value_float": np.float32,
                             "value_floats": np.float32}


def constant_node_value(node: ir.Node, max_size: int | None = None, *, strings: bool = False) -> np.ndarray | None:
    """The value of a ``Constant`` node, in any attribute form, with ONNX's element types
    (:data:`CONSTANT_ATTRIBUTE_DTYPES`); ``value_string(s)`` as an object array where ``strings``; None for a
    ``sparse_value``, or a value of more than ``max_size`` elements. The one reader of a Constant's attribute: the
    leaf of :func:`const_array` and of :mod:`rope_passes.proofs.constants`' cone evaluation alike."""
    for name, a in node.attributes.items():
        if a.is_ref():
            return None  # a function body's reference to its call's attribute: not one value
        if name == "value":
            if a.type != ir.AttributeType.TENSOR or (max_size is not None and a.value.size > max_size):
                return None
            return a.value.numpy()
        if name in CONSTANT_ATTRIBUTE_DTYPES:
            array = np.array(a.value, dtype=CONSTANT_ATTRIBUTE_DTYPES[name])
            return array if max_size is None or array.size <= max_size else None
        if name in ("value_string", "value_strings"):
            return np.array(a.value, dtype=object) if strings else None
    return None  # sparse_value: not read


def const_array(value: ir.Value | None, max_size: int | None = None) -> np.ndarray | None:
    """The constant content of a value: an initializer or a Constant node's output (:func:`constant_node_value`);
    None if not such a constant (a value computed from constants is :func:`rope_passes.proofs.constants.constant`'s).

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
    if producer is not None and producer.op_type == "Constant" and producer.domain in ("", "ai.onnx") \
            and not value.is_graph_input():
        return constant_node_value(producer, max_size)
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


def small_const(value: ir.Value | None) -> np.ndarray | None:
    """The values of a small constant (at most :data:`SMALL_TENSOR` elements); None for anything else or large."""
    return const_array(value, max_size=SMALL_TENSOR)


def ints(array: np.ndarray | None) -> list[int] | None:
    """The elements of ``array`` as a flat list of ints (None stays None)."""
    return None if array is None else [int(x) for x in np.asarray(array).reshape(-1)]


def through(value: ir.Value | None, ops: tuple[str, ...] = PASS_THROUGH) -> ir.Value | None:
    """Follow ``value`` up through pass-through ops (Cast, Identity)."""
    while value is not None:
        producer = value.producer()
        if producer is None or producer.op_type not in ops or not producer.inputs:
            return value
        value = producer.inputs[0]
    return value


def graph_inputs_of(nodes: Iterable[ir.Node], model: ir.Model) -> list[str]:
    """Names of the main graph's inputs that ``nodes`` read, in order of first use."""
    graph_inputs = {id(v): v.name for v in model.graph.inputs}
    out = []
    for node in nodes:
        for inp in node.inputs:
            if inp is not None and id(inp) in graph_inputs and graph_inputs[id(inp)] not in out:
                out.append(graph_inputs[id(inp)])
    return out


def is_vector(shape: ir.ShapeProtocol) -> bool:
    """One axis longer than 1, the others 1: ``[16]``, or ``[1, 16, 1]`` (torch exporters fold
    ``inv_freq[None, :, None]`` into a constant)."""
    dims = [d for d in shape if d != 1]
    return len(dims) == 1 and isinstance(dims[0], int)


def table_like(tensor: ir.TensorProtocol | None) -> bool:
    """A 2D floating-point tensor: the shape of a cos/sin table."""
    return tensor is not None and len(tensor.shape) == 2 and tensor.dtype.is_floating_point()


def precision_of(model: ir.Model) -> str:
    """fp32 / fp16 / bf16 from the graph's first float output; int4 when it has MatMulNBits (``model``: onnx_ir)."""
    if any(n.op_type == "MatMulNBits" for n in model.graph):
        return "int4"
    for out in model.graph.outputs:
        if out.dtype == ir.DataType.FLOAT16:
            return "fp16"
        if out.dtype == ir.DataType.BFLOAT16:
            return "bf16"
        if out.dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE):
            return "fp32"
    return "fp32"
