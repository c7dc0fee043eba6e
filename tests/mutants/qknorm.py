"""The test's own definition of GroupQueryAttention's fused q/k RMSNorm (inputs 14/15), written independently of
``unfuse-gqa-qk-norm``: each head's ``head_size`` values ``x`` become ``x / sqrt(mean(x^2) + eps) * w`` in float32,
then the input dtype, before GQA sees them (and rotates them). ``eps`` is ``qk_norm_epsilon``, read as onnxruntime
reads it (``GetAttrOrDefault<float>("qk_norm_epsilon", 1e-6f)``); onnxruntime requires both weights together, and
``do_rotary=1`` ("q_norm_weight / k_norm_weight require do_rotary=1"): the norm comes before GQA's own rotation.

onnxruntime >= 1.31's CPU EP does not implement inputs 14/15 (only its WebGPU plugin EP does), so the mutants are
judged against this lowering on onnxruntime 1.27 CPU, and ``tests/test_mutants.py`` checks the lowering against the
plugin runtime's WebGPU kernel.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

from .oracle import MS, Runner, _Ops, to_bytes

DEFAULT_EPSILON = 1e-6
Q_NORM, K_NORM = 14, 15


def _present(node: ir.Node, index: int) -> ir.Value | None:
    value = node.inputs[index] if len(node.inputs) > index else None
    return value if value is not None and value.name else None


def lower_qk_norm(model: ir.Model) -> int:
    """Replace every fused q/k norm of the main graph in place; returns how many GQA nodes changed."""
    graph = model.graph
    nodes = [n for n in graph if n.op_type == "GroupQueryAttention" and n.domain == MS
             and (_present(n, Q_NORM) or _present(n, K_NORM))]
    for k, node in enumerate(nodes):
        _lower_one(graph, node, _Ops(graph, f"/oracle/qknorm{k}"))
    return len(nodes)


def _lower_one(graph: ir.Graph, node: ir.Node, op: _Ops) -> None:
    q_w, k_w = _present(node, Q_NORM), _present(node, K_NORM)
    if q_w is None or k_w is None:
        raise ValueError(f"{node.name}: onnxruntime requires both q_norm_weight and k_norm_weight")
    attrs = {k: a.value for k, a in node.attributes.items()}
    if int(attrs.get("do_rotary", 0)) != 1:
        raise ValueError(f"{node.name}: onnxruntime requires do_rotary=1 with q/k-norm weights")
    heads, kv = int(attrs["num_heads"]), int(attrs["kv_num_heads"])
    eps = float(attrs.get("qk_norm_epsilon", DEFAULT_EPSILON))
    head = int(q_w.shape[-1])
    query = node.inputs[0]
    dtype = query.dtype

    def ints(*values: int) -> ir.Value:
        return op.const(np.array(values, np.int64))

    def norm(x: ir.Value, weight: ir.Value, n: ir.Value | int) -> ir.Value:
        xh = op("Cast", op("Reshape", x, ints(0, 0, n, head)), to=ir.DataType.FLOAT)
        # the mean over the head as a MatMul with [head, 1] of 1/head: the same in every opset (ReduceMean's axes
        # moved from attribute to input at 18)
        mean = op("MatMul", op("Mul", xh, xh), op.const(np.full((head, 1), 1.0 / head, np.float32)))
        rms = op("Sqrt", op("Add", mean, op.const(np.array(eps, np.float32))))
        out = op("Mul", op("Div", xh, rms), op("Cast", weight, to=ir.DataType.FLOAT))
        return op("Reshape", op("Cast", out, to=dtype), ints(0, 0, n * head))

    packed = _present(node, 1) is None
    if packed:
        q, k, v = (op("Slice", query, ints(a), ints(b), ints(2)) for a, b in
                   ((0, heads * head), (heads * head, (heads + kv) * head), ((heads + kv) * head, (heads + 2 * kv) * head)))
        new_query = op("Concat", norm(q, q_w, heads), norm(k, k_w, kv), v, axis=2)
    else:
        new_query = norm(query, q_w, heads)
        new_key = norm(node.inputs[1], k_w, kv)
    graph.insert_before(node, op.nodes)
    node.replace_input_with(0, new_query)
    if not packed:
        node.replace_input_with(1, new_key)
    node.replace_input_with(Q_NORM, None)
    node.replace_input_with(K_NORM, None)
    last = max(i for i, v in enumerate(node.inputs) if v is not None and v.name)
    node.resize_inputs(last + 1)
    node.attributes.pop("qk_norm_epsilon", None)


class UnfusedRunner(Runner):
    """The lowered model on onnxruntime CPU with basic graph optimizations only: the extended ones would fuse the
    lowering back into ``SimplifiedLayerNormalization`` (the kernel the candidate uses: no longer an independent
    reference) and, with a norm weight that is also a graph input, onnxruntime 1.27 crashes (segmentation fault) while
    fusing it."""

    def __init__(self, model: ir.Model):
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        self.offset = 0
        self.shifted = None
        self.session = ort.InferenceSession(to_bytes(model), so, providers=["CPUExecutionProvider"])
