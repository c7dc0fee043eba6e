"""onnxruntime's level-1 graph transforms that run before partitioning, replayed so the prediction places the graph
onnxruntime places: model-local functions inlined (:func:`inline_functions`), common subexpressions merged
(:func:`common_subexpressions`), ``Shape(Cast(x))`` read as ``Shape(x)`` (:func:`shape_bypass`), nodes it may fold
to constants (:func:`maybe_folded`)."""

from __future__ import annotations

from typing import Any

import onnx_ir as ir


def inline_functions(model: ir.Model) -> ir.Model:
    """``model`` with every call of a model-local function replaced by the function's body, as onnxruntime does at load
    (its nodes are then placed one by one; a call node itself is in no kernel table). A copy of the graph sharing the
    tensors (``model`` is left as it is); ``model`` itself when it calls none, or when onnx_ir's inliner cannot
    (the prediction then says it cannot place the call)."""
    local = {(f.domain, f.name, f.overload) for f in model.functions.values()}
    if not local or not any((n.domain, n.op_type, n.overload) in local for n in model.graph):
        return model
    from onnx_ir.passes.common import InlinePass

    copy = ir.Model(model.graph.clone(), ir_version=model.ir_version, functions=list(model.functions.values()))
    for domain, version in model.opset_imports.items():
        copy.opset_imports[domain] = version
    try:
        return InlinePass()(copy).model
    except Exception:  # noqa: BLE001 - a function the inliner cannot expand: the call stays, placed as unknown
        return model


def is_constant(value: ir.Value) -> bool:
    if value.const_value is not None or value.is_initializer():
        return True
    producer = value.producer()
    return producer is not None and producer.op_type == "Constant" and producer.domain in ("", "ai.onnx")



def _const_key(value: ir.Value) -> Any:
    """Identity of a constant input for CSE: small constants by value (onnxruntime's ConstantSharing), else by name."""
    tensor = value.const_value
    if tensor is None:
        producer = value.producer()
        a = producer.attributes.get("value") if producer is not None else None
        tensor = a.value if a is not None else None
    if tensor is not None and _size(tensor) <= 100:
        return ("const", tensor.dtype.name, tuple(tensor.shape), tensor.numpy().tobytes())
    return ("value", id(value))


def _size(tensor: Any) -> int:
    """``tensor.size`` without onnx_ir's ``math.prod(shape.numpy())`` (a NumPy array per call)."""
    n = 1
    for d in tensor.shape.dims:
        if not isinstance(d, int):
            return int(tensor.size)
        n *= d
    return n


def common_subexpressions(nodes: list[ir.Node]) -> dict[int, ir.Value]:
    """onnxruntime's CommonSubexpressionElimination (level 1, before partitioning), as a value map:
    id(value) -> the representative value of its class, for values of duplicate nodes."""
    rep: dict[int, ir.Value] = {}
    seen: dict[Any, ir.Node] = {}
    const_keys: dict[int, Any] = {}  # id(constant value) -> its key (a constant's key never changes)

    def key_of(value: ir.Value | None) -> Any:
        if value is None:
            return None
        value = rep.get(id(value), value)
        key = const_keys.get(id(value))
        if key is not None:
            return key
        if is_constant(value):
            key = const_keys[id(value)] = _const_key(value)
            return key
        return ("value", id(value))

    for node in nodes:
        if node.op_type == "Constant" or any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
                                             for a in node.attributes.values()):
            continue
        if any(out.is_graph_output() for out in node.outputs) or node.op_type.startswith("Random"):
            continue
        attrs = tuple(sorted((k, repr(a.value)) for k, a in node.attributes.items()))
        key = (node.domain, node.op_type, attrs, tuple(key_of(v) for v in node.inputs), len(node.outputs))
        first = seen.get(key)
        if first is None:
            seen[key] = node
            continue
        for mine, theirs in zip(node.outputs, first.outputs):
            rep[id(mine)] = rep.get(id(theirs), theirs)
    return rep


def shape_bypass(nodes: list[ir.Node]) -> tuple[dict[int, ir.Value], set[int]]:
    """onnxruntime reads ``Shape(Cast(x))`` and ``Shape(Identity(x))`` as ``Shape(x)`` when the Cast/Identity feeds
    only Shape nodes (measured: the Cast disappears and an int64 ``Shape`` lands on CPU). Returns
    (id(Shape node) -> the value it really reads, ids of the dropped Cast/Identity nodes)."""
    redirect: dict[int, ir.Value] = {}
    dropped: set[int] = set()
    for node in nodes:
        if node.op_type != "Shape" or not node.inputs or node.inputs[0] is None:
            continue
        value = node.inputs[0]
        while True:
            producer = value.producer()
            if producer is None or producer.op_type not in ("Cast", "Identity") or producer.domain not in ("", "ai.onnx"):
                break
            users = [u for u, _ in value.uses()]
            if value.is_graph_output() or any(u.op_type != "Shape" and id(u) not in dropped for u in users):
                break
            dropped.add(id(producer))
            value = producer.inputs[0]
        if value is not node.inputs[0]:
            redirect[id(node)] = value
    return redirect, dropped


def _shape_known(node: ir.Node, value: ir.Value) -> bool | None:
    """Whether ``Shape`` reads only concrete dims of ``value`` (True), some symbolic one (False), or the graph does
    not record its shape (None: onnxruntime's own shape inference may know it)."""
    shape = value.shape
    if shape is None:
        return None
    rank = len(shape)
    start = node.attributes.get("start")
    end = node.attributes.get("end")
    lo = start.value if start is not None else 0
    hi = end.value if end is not None else rank
    lo, hi = (lo + rank if lo < 0 else lo), (hi + rank if hi < 0 else hi)
    return all(isinstance(shape[i], int) for i in range(max(lo, 0), min(hi, rank)))


def maybe_folded(nodes: list[ir.Node], redirect: dict[int, ir.Value] | None = None) -> dict[int, str]:
    """Nodes onnxruntime's level-1 optimizers may replace by a constant before partitioning (``ConstantFolding``),
    which the static rules do not replay: every input a constant (initializer, ``Constant``) or the output of such a
    node, or a ``Shape`` whose input's dims it reads are concrete or not recorded in the graph (onnxruntime's shape
    inference may know them). id(node) -> why; their placement is unknown to the static rules."""
    redirect = redirect or {}
    out: dict[int, str] = {}
    folded_values: set[int] = set()
    for node in nodes:
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        if (domain == "" and node.op_type == "Constant") or node.op_type.startswith("Random") \
                or any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()):
            continue
        why = None
        if domain == "" and node.op_type == "Shape" and node.inputs and node.inputs[0] is not None:
            known = _shape_known(node, redirect.get(id(node), node.inputs[0]))
            if known is None:
                why = "Shape of a tensor whose shape the graph does not record: onnxruntime may fold it to a constant"
            elif known:
                why = "Shape of concrete dims: onnxruntime folds it to a constant"
        inputs = [v for v in node.inputs if v is not None]
        if why is None and inputs and all(is_constant(v) or id(v) in folded_values for v in inputs):
            why = "every input is constant: onnxruntime may fold it to a constant"
        if why is not None:
            out[id(node)] = why
            folded_values.update(id(v) for v in node.outputs)
    return out
