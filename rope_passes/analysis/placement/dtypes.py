"""Element types as onnxruntime's type inference gives them, where the static placement rules know the op: the key a
kernel is looked up by (:func:`value_dtype`, :class:`Dtypes`)."""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

import rope_passes.graph_walk as graph_walk

_PASSTHROUGH_TYPE = {"Gather", "GatherElements", "Squeeze", "Unsqueeze", "Reshape", "Slice", "Transpose", "Concat",
                     "Expand", "Tile", "Identity", "Split", "Flatten", "Neg", "Abs"}


def value_dtype(value: ir.Value | None) -> str | None:
    """The element type name of ``value`` (``"FLOAT"``, ``"INT64"``...), inferring it through type-preserving ops
    and ``Constant`` when the graph carries no value_info for it."""
    seen = 0
    while value is not None and seen < 64:
        seen += 1
        if value.dtype is not None:
            return value.dtype.name
        if value.const_value is not None:
            return value.const_value.dtype.name
        node = value.producer()
        if node is None:
            return None
        if node.op_type == "Constant":
            a = node.attributes.get("value")
            return a.value.dtype.name if a is not None else None
        if node.op_type == "Where":
            value = node.inputs[1]
        elif node.op_type in _PASSTHROUGH_TYPE and node.inputs:
            value = node.inputs[0]
        else:
            return None
    return None


# ----------------------------------------------------------------------------------------------------------------
# Element types: what onnxruntime's type inference gives every value, where our rules know the op
# ----------------------------------------------------------------------------------------------------------------

#: ONNX ops whose every output has input 0's element type (the type constraint ``T`` ties them)
_SAME_AS_INPUT0 = frozenset({
    "Abs", "Acos", "Acosh", "Add", "Asin", "Asinh", "Atan", "Atanh", "AveragePool", "BatchNormalization", "Ceil",
    "Celu", "Clip", "Concat", "Conv", "ConvTranspose", "Cos", "Cosh", "CumSum", "DepthToSpace", "Div", "Elu", "Erf",
    "Exp", "Expand", "Flatten", "Floor", "Gather", "GatherElements", "GatherND", "Gelu", "Gemm", "GlobalAveragePool",
    "GlobalMaxPool", "HardSigmoid", "HardSwish", "Identity", "InstanceNormalization", "LeakyRelu", "Log",
    "LogSoftmax", "LpNormalization", "MatMul", "Max", "Mean", "Min", "Mish", "Mod", "Mul", "Neg", "Pad", "Pow",
    "Range", "Reciprocal", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
    "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare", "Relu", "Reshape", "Resize", "Round", "ScatterElements",
    "ScatterND", "Selu", "Sigmoid", "Sign", "Sin", "Sinh", "Slice", "Softmax", "Softplus", "Softsign", "SpaceToDepth",
    "Split", "Sqrt", "Squeeze", "Sub", "Sum", "Tan", "Tanh", "ThresholdedRelu", "Tile", "Transpose", "Trilu",
    "Unsqueeze", "SimplifiedLayerNormalization", "RMSNormalization", "RotaryEmbedding"})
#: ONNX ops whose output 0 has input 0's type and whose other outputs are named here
_FIRST_SAME: dict[str, tuple[str | None, ...]] = {"TopK": ("INT64",), "Dropout": ("BOOL",), "MaxPool": ("INT64",),
                                                    "LayerNormalization": (None, None)}
_BOOL_OUT = frozenset({"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor",
                       "IsNaN", "IsInf"})
_INT64_OUT = frozenset({"Shape", "Size", "NonZero", "ArgMax", "ArgMin"})
#: com.microsoft ops: output index -> the input index whose type it has (every output not listed: unknown)
_MS_OUTPUT_FROM_INPUT: dict[str, dict[int, int]] = {
    "GroupQueryAttention": {0: 0, 1: 0, 2: 0}, "MultiHeadAttention": {0: 0, 1: 0, 2: 0},
    "Attention": {0: 0, 1: 0}, "RotaryEmbedding": {0: 0}, "MRotaryEmbedding": {0: 0},
    "SkipSimplifiedLayerNormalization": {0: 0, 3: 0}, "SkipLayerNormalization": {0: 0, 3: 0},
    "SimplifiedLayerNormalization": {0: 0}, "MatMulNBits": {0: 0}, "FastGelu": {0: 0}, "Gelu": {0: 0},
    "BiasGelu": {0: 0}, "QuickGelu": {0: 0}, "BiasAdd": {0: 0}, "BiasSplitGelu": {0: 0},
    "GatherBlockQuantized": {0: 2}, "MatMulNBitsMlp": {0: 0}, "MatMulNBitsQkv": {0: 0, 1: 0, 2: 0},
}
_MS_FIXED = {"SkipSimplifiedLayerNormalization": {1: "FLOAT", 2: "FLOAT"},
             "SkipLayerNormalization": {1: "FLOAT", 2: "FLOAT"}}


def attr_dtype(node: ir.Node, name: str) -> str | None:
    a = node.attributes.get(name)
    if a is None:
        return None
    if a.type == ir.AttributeType.TENSOR:
        return a.value.dtype.name
    try:
        return ir.DataType(a.value).name
    except (ValueError, TypeError):
        return None


def _node_output_dtypes(node: ir.Node, dtype: Callable[[ir.Value | None], str | None]) -> list[str | None]:
    """The element types onnxruntime infers for ``node``'s outputs, from its inputs' (None: our rules do not know)."""
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    n = len(node.outputs)
    op = node.op_type
    first = dtype(node.inputs[0]) if node.inputs else None
    if domain == "":
        if op in _SAME_AS_INPUT0:
            return [first] * n
        if op in _FIRST_SAME:
            return [first, *_FIRST_SAME[op]][:n]
        if op in _BOOL_OUT:
            return ["BOOL"] * n
        if op in _INT64_OUT:
            return ["INT64"] * n
        if op == "Cast":
            return [attr_dtype(node, "to")]
        if op == "CastLike":
            return [dtype(node.inputs[1]) if len(node.inputs) > 1 else None]
        if op == "Where":
            return [dtype(node.inputs[1]) if len(node.inputs) > 1 else None]
        if op == "Constant":
            return [attr_dtype(node, "value")]
        if op == "ConstantOfShape":
            return [attr_dtype(node, "value") or "FLOAT"]
        if op == "EyeLike":
            return [attr_dtype(node, "dtype") or first]
        return [None] * n
    if domain == "com.microsoft":
        from_input = _MS_OUTPUT_FROM_INPUT.get(op, {})
        fixed = _MS_FIXED.get(op, {})
        out: list[str | None] = []
        for i in range(n):
            if i in fixed:
                out.append(fixed[i])
            elif i in from_input and from_input[i] < len(node.inputs):
                out.append(dtype(node.inputs[from_input[i]]))
            else:
                out.append(None)
        return out
    return [None] * n


class Dtypes:
    """Element type of every value of a graph (and its subgraphs): the value's own type where the graph records it
    (value_info, initializers, graph inputs), else inferred from its producer's inputs (:func:`_node_output_dtypes`),
    in graph order. ``dtypes(value)`` -> ``"FLOAT"``, ``"INT64"``... or None (unknown to our rules)."""

    def __init__(self, graph: ir.Graph, outer: Dtypes | None = None) -> None:
        self.known: dict[int, str | None] = dict(outer.known) if outer is not None else {}
        for _ in range(3):  # graphs are topologically sorted; a few rounds cover one that is not
            changed = False
            visited: set[int] = set()
            ordered = True  # every producer came before its readers: this round's answers are final
            for node in graph_walk.nodes(graph):
                if ordered:
                    for v in node.inputs:
                        producer = v.producer() if v is not None else None
                        if producer is not None and id(producer) not in visited:
                            ordered = False
                    visited.add(id(node))
                inferred = _node_output_dtypes(node, self)
                for value, dt in zip(node.outputs, inferred):
                    if value.dtype is None and value.const_value is None and dt is not None \
                            and self.known.get(id(value)) != dt:
                        self.known[id(value)] = dt
                        changed = True
            if not changed or ordered:
                break

    def __call__(self, value: ir.Value | None) -> str | None:
        if value is None:
            return None
        if value.dtype is not None:
            return value.dtype.name
        if value.const_value is not None:
            return value.const_value.dtype.name
        return self.known.get(id(value))
