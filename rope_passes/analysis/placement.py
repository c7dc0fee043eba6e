"""Where a WebGPU runtime runs each node, which Memcpy nodes it inserts, and whether graph capture can start: a static
prediction, no session (:func:`predict_placement`), for one runtime target (:mod:`rope_passes.targets`:
onnxruntime-webgpu 1.27, or onnxruntime ≥ 1.31 + the WebGPU plugin EP; default: the one installed here).

It replays onnxruntime's own partitioning rules on the target's probed kernel table
(:class:`~.webgpu_kernels.KernelTable`) and the kernels' memory types (:mod:`.webgpu_kernels`); the runtime truth it
is checked against on the whole genai corpus and the builder fixtures, on both runtimes (tests/test_placement.py), is
:func:`rope_passes.runtime.placement_probe.probe_placement`, a session with verbose logging.

1. a node gets WebGPU when the target's WebGPU kernel registry has a kernel for its op and input type at the model's
   opset (``target.kernels``, probed); ``Shape`` of an int64 tensor has none, and every ``Shape`` output lives in CPU
   memory (:data:`~.webgpu_kernels.CPU_OUTPUTS`), so shape math starts on CPU. With ``enableGraphCapture=1`` the EP
   also registers its int64 kernels, which changes the table;
2. shape math downstream of ``Shape`` lands on CPU where its int64 ops have no WebGPU kernel (without capture, none;
   with capture, 1.27 has int64 kernels for ``Cast``/``Expand``/``Range``/``Unsqueeze`` only, the plugin for many
   more, ``Gather`` among them). The WebGPU EP does
   not apply onnxruntime's ``GetCpuPreferredNodes`` heuristic (measured: an int32 ``ReduceSum`` fed only by a CPU
   ``Cast`` and a small initializer stays on WebGPU, with a Memcpy), so neither does this prediction. Before
   partitioning onnxruntime merges identical nodes (``CommonSubexpressionElimination``); the prediction does too, and
   a Memcpy on a merged tensor may carry any of its names (:attr:`Memcpy.aliases`). It also reads
   ``Shape(Cast(x))``/``Shape(Identity(x))`` as ``Shape(x)`` when the Cast/Identity feeds only Shape nodes
   (:func:`shape_bypass`);
3. Memcpy (``transformer_memcpy``): ``MemcpyFromHost`` after a tensor produced on CPU (or a graph input also read
   by CPU nodes) that a WebGPU node reads in GPU memory; ``MemcpyToHost`` before a tensor produced on WebGPU that a
   CPU node reads, or that a WebGPU kernel reads in CPU memory (:data:`~.webgpu_kernels.CPU_INPUTS`, e.g.
   ``Reshape``'s shape). Initializers and ``Constant`` outputs never need one (onnxruntime copies them per device);
4. graph capture is refused for control flow (``If``/``Loop``/``Scan``) first, then for any Memcpy.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import onnx_ir as ir

import rope_passes.graph_walk as graph_walk
from rope_passes.analysis.webgpu_kernels import (
    CPU_INPUTS,
    CPU_INPUTS_WITHOUT_CAPTURE,
    CPU_OUTPUTS,
    KernelTable,
    type_key,
)
from rope_passes.targets import RuntimeTarget, resolve_target

CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})


# ----------------------------------------------------------------------------------------------------------------
# Result types
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, order=True)
class Memcpy:
    """One Memcpy node onnxruntime inserts: ``MemcpyFromHost`` after ``tensor`` or ``MemcpyToHost`` before it."""

    kind: str  # "MemcpyFromHost" | "MemcpyToHost"
    tensor: str
    producer: str = dataclasses.field(default="", compare=False)  # node (or "graph input") that makes the tensor
    consumers: tuple[str, ...] = dataclasses.field(default=(), compare=False)  # nodes that read the copy
    #: names of tensors onnxruntime merges with this one (common subexpressions); it may name any of them
    aliases: tuple[str, ...] = dataclasses.field(default=(), compare=False)

    @property
    def names(self) -> frozenset[str]:
        return frozenset((self.tensor, *self.aliases))

    def __str__(self) -> str:
        arrow = "CPU→WebGPU" if self.kind == "MemcpyFromHost" else "WebGPU→CPU"
        readers = ", ".join(self.consumers) or "?"
        return f"{self.kind} ({arrow}) on {self.tensor!r}: {self.producer or '?'} → {readers}"


@dataclasses.dataclass
class Placement:
    """Node placement of one model for one WebGPU configuration."""

    model: str
    graph_capture: bool
    method: str  # "static" | "probe"
    loads: bool = True
    load_error: str | None = None
    cpu_nodes: dict[str, str] = dataclasses.field(default_factory=dict)  # node name -> why on CPU
    memcpy: list[Memcpy] = dataclasses.field(default_factory=list)
    control_flow: list[str] = dataclasses.field(default_factory=list)
    capture_ok: bool | None = None  # session with enableGraphCapture=1 can be created (None: capture not asked)
    capture_error: str | None = None
    merged_nodes: list[str] = dataclasses.field(default_factory=list)  # duplicates onnxruntime's CSE removes
    runtime: str = ""  # the runtime target predicted for ("static"), or probed ("probe", when known)
    #: nodes the static rules cannot place (an element type or an (op, type) they do not know): node -> why. With
    #: any of these and no certain blocker, the capture verdict is unknown (``capture_ok`` None)
    unknown: dict[str, str] = dataclasses.field(default_factory=dict)
    #: nodes onnxruntime may constant-fold before placing (:func:`maybe_folded`): node -> why
    maybe_folded: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def memcpy_set(self) -> set[tuple[str, str]]:
        return {(m.kind, m.tensor) for m in self.memcpy}

    def same_memcpy(self, other: Placement) -> bool:
        """Same Memcpy nodes as ``other``, where a tensor merged by onnxruntime's CSE may go by any of its names."""
        if len(self.memcpy) != len(other.memcpy):
            return False
        left = list(other.memcpy)
        for mine in self.memcpy:
            match = next((m for m in left if m.kind == mine.kind and (m.names & mine.names)), None)
            if match is None:
                return False
            left.remove(match)
        return True

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["memcpy"] = [dataclasses.asdict(m) for m in self.memcpy]
        return d

    @property
    def state(self) -> str:
        """``"does-not-load"``, ``"blocked"`` (capture refused), ``"ready"`` (capture works), ``"unknown"`` (the
        static rules cannot tell: run the runtime, ``check --graph-capture``), or ``"loads"`` (capture not asked)."""
        if not self.loads:
            return "does-not-load"
        if not self.graph_capture:
            return "loads"
        if self.capture_ok is None:
            return "unknown"
        return "ready" if self.capture_ok else "blocked"

    def blockers(self) -> list[tuple[str, str]]:
        """What stops capture, each with its node: (node, why) for each control-flow node, then for each Memcpy the
        node on the CPU side of it (the producer of a ``MemcpyFromHost``, the reader of a ``MemcpyToHost``)."""
        out = [(name, "control flow: onnxruntime refuses graph capture with If/Loop/Scan") for name in self.control_flow]
        for m in self.memcpy:
            cpu_side = m.producer if m.kind == "MemcpyFromHost" else (m.consumers[0] if m.consumers else "")
            out.append((cpu_side or m.tensor, str(m)))
        return out

    def verdict(self) -> str:
        """One line for ``inspect``: ``does not load: ...`` / ``loads; capture-ready`` / ``loads; capture blocked
        by ...`` / ``loads; capture unknown: ...`` (with capture on), or ``loads; N Memcpy`` (capture not asked)."""
        state = self.state
        if state == "does-not-load":
            return f"does not load: {self.load_error}"
        if state == "loads":
            return f"loads; {len(self.memcpy)} Memcpy"
        if state == "ready":
            return "loads; capture-ready (0 Memcpy)"
        if state == "unknown":
            return f"loads; capture {self.unknown_line()}"
        if self.control_flow:
            return f"loads; capture blocked by control flow ({', '.join(self.control_flow[:2])})"
        first = self.memcpy[0] if self.memcpy else None
        where = f", e.g. {first.kind} on {first.tensor!r}" if first else ""
        return f"loads; capture blocked by {len(self.memcpy)} Memcpy{where}"

    def unknown_line(self) -> str:
        """``unknown: run `rope-passes check --graph-capture` (...)``: why the static rules cannot decide."""
        name, why = next(iter(self.unknown.items()), ("?", "?"))
        more = f" and {len(self.unknown) - 1} more" if len(self.unknown) > 1 else ""
        return (f"unknown: run `rope-passes check --graph-capture` (the static rules cannot place {len(self.unknown)} "
                f"node(s), e.g. {name}: {why}{more})")

    def summary(self) -> str:
        if not self.loads:
            return f"does not load: {self.load_error}"
        capture = ""
        if self.graph_capture:
            if self.capture_ok is None:
                capture = f"; capture {self.unknown_line()}"
            else:
                capture = "; capture: OK" if self.capture_ok else f"; capture refused: {self.capture_error}"
        unknown = f", {len(self.unknown)} unknown" if self.unknown else ""
        return f"{len(self.cpu_nodes)} node(s) on CPU{unknown}, {len(self.memcpy)} Memcpy{capture}"


# ----------------------------------------------------------------------------------------------------------------
# Static prediction
# ----------------------------------------------------------------------------------------------------------------

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


def _attr_dtype(node: ir.Node, name: str) -> str | None:
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
            return [_attr_dtype(node, "to")]
        if op == "CastLike":
            return [dtype(node.inputs[1]) if len(node.inputs) > 1 else None]
        if op == "Where":
            return [dtype(node.inputs[1]) if len(node.inputs) > 1 else None]
        if op == "Constant":
            return [_attr_dtype(node, "value")]
        if op == "ConstantOfShape":
            return [_attr_dtype(node, "value") or "FLOAT"]
        if op == "EyeLike":
            return [_attr_dtype(node, "dtype") or first]
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


def _kernel_modes(node: ir.Node, kernels: KernelTable, opset: int | None,
                  dtype: Callable[[ir.Value | None], str | None] = value_dtype) -> tuple[frozenset[str] | None, str]:
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    ins = [dtype(v) for v in node.inputs]
    outs = [dtype(v) for v in node.outputs]
    if (domain, node.op_type) == ("", "Cast"):
        to = node.attributes.get("to")
        if to is not None:
            outs = [ir.DataType(to.value).name]
    key = type_key(domain, node.op_type, ins, outs)
    return kernels.modes(domain, node.op_type, key, opset), key


def _has_kernel(node: ir.Node, capture: bool, kernels: KernelTable, opset: int | None,
                dtype: Callable[[ir.Value | None], str | None] = value_dtype) -> tuple[bool | None, str]:
    """(True: a WebGPU kernel, False: none, so CPU, None: the static rules cannot tell; why)."""
    modes, key = _kernel_modes(node, kernels, opset, dtype)
    if "None" in key.split("->"):
        return None, f"element type of {node.op_type}'s type-selecting value unknown to the static rules"
    if modes is None:
        return None, f"{node.op_type}({key}) is not in the probed kernel table"
    mode = "on" if capture else "off"
    if mode in modes:
        return True, ""
    extra = " (int64 kernels need enableGraphCapture=1)" if "on" in modes else ""
    return False, f"no WebGPU kernel for {node.op_type}({key}){extra}"


def _is_constant(value: ir.Value) -> bool:
    if value.const_value is not None or value.is_initializer():
        return True
    producer = value.producer()
    return producer is not None and producer.op_type == "Constant" and producer.domain in ("", "ai.onnx")


def _cpu_inputs(node: ir.Node, capture: bool) -> frozenset[int]:
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    key = (domain, node.op_type)
    if capture:
        return CPU_INPUTS.get(key, frozenset())
    return CPU_INPUTS.get(key, frozenset()) | CPU_INPUTS_WITHOUT_CAPTURE.get(key, frozenset())


def _cpu_output(value: ir.Value) -> bool:
    """Whether a WebGPU kernel writes this output to CPU memory (Shape)."""
    node = value.producer()
    if node is None:
        return False
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    indices = CPU_OUTPUTS.get((domain, node.op_type), frozenset())
    return any(node.outputs[i] is value for i in indices if i < len(node.outputs))


def check_loadable(model: ir.Model, target: RuntimeTarget | str | None = None) -> str | None:
    """The reason the target runtime would refuse to load ``model`` (None: it loads): an op it does not register,
    GroupQueryAttention input counts outside its range (:meth:`~rope_passes.targets.RuntimeTarget.load_problems`;
    the IR version is not checked: rope-passes saves with the highest one both runtimes load)."""
    problems = resolve_target(target).load_problems(model, ir_version=False)
    return problems[0].message if problems else None


def _opset(model: ir.Model) -> int | None:
    for domain in ("", "ai.onnx"):
        if domain in model.opset_imports:
            return model.opset_imports[domain]
    return None


def predict_placement(model: ir.Model | str | os.PathLike, *, graph_capture: bool = True,
                      target: RuntimeTarget | str | None = None) -> Placement:
    """Static prediction of the target runtime's placement for ``model`` (see the module docstring); ``target``: a
    :class:`~rope_passes.targets.RuntimeTarget` or runtime name, default the runtime installed here."""
    runtime = resolve_target(target)
    if not isinstance(model, ir.Model):
        name = str(model)
        from rope_passes.io.load import load_model  # lazy external data; reads what `--weights link` leaves

        model = load_model(model)
    else:
        name = model.graph.name or "<model>"
    result = Placement(name, graph_capture, "static", runtime=runtime.name)
    error = check_loadable(model, runtime)
    if error is not None:
        result.loads = False
        result.load_error = error
        result.capture_ok = False if graph_capture else None
        result.capture_error = error if graph_capture else None
        return result
    facts: dict[int, _GraphFacts] = {}  # per graph: what both predictions (fold or not) read
    _predict_graph(model.graph, graph_capture, result, set(), runtime.kernels, _opset(model), facts=facts)
    if result.maybe_folded:
        # onnxruntime may fold these to constants before placing (ConstantFolding): where folding them all and
        # folding none give the same Memcpy, the answer does not depend on it; else the Memcpy both give are
        # certain and the folded nodes' placement is unknown
        folded = Placement(name, graph_capture, "static", runtime=runtime.name)
        _predict_graph(model.graph, graph_capture, folded, set(), runtime.kernels, _opset(model), fold=True,
                       facts=facts)
        if not result.same_memcpy(folded):
            result.memcpy = [m for m in result.memcpy
                             if any(f.kind == m.kind and f.names & m.names for f in folded.memcpy)]
            result.unknown.update(result.maybe_folded)
    if graph_capture:
        if result.control_flow:
            result.capture_ok = False
            result.capture_error = ("This session cannot use the graph capture feature as requested by the user as "
                                    "the model has control flow nodes which can't be supported by "
                                    "WebGpuExecutionProvider")
        elif result.memcpy:
            result.capture_ok = False
            result.capture_error = ("This session cannot use the graph capture feature as requested by the user  as "
                                    "all compute graph nodes have not been partitioned to the WebGpuExecutionProvider")
        elif result.unknown:
            result.capture_ok = None  # the static rules cannot tell: the runtime decides
        else:
            result.capture_ok = True
    result.memcpy.sort()
    return result


def capture_verdict(model: ir.Model | str | os.PathLike, runtime: RuntimeTarget | str | None = None) -> Placement:
    """**The one answer** to "does WebGPU graph capture work for this model on this runtime": ``optimize``'s summary
    and its ``enableGraphCapture`` config write, ``inspect``, ``lint`` (RP205, RP220-RP222) and the pipeline's
    placement guard all read it. The static prediction with capture on (:func:`predict_placement`), whose
    :attr:`Placement.state` is ``"does-not-load"``, ``"blocked"`` (with :meth:`Placement.blockers`, each with its
    node), ``"ready"``, or ``"unknown"`` where the static rules cannot place some node (then only the runtime can
    tell: ``rope-passes check --graph-capture``). Agreement with a real capture session on every graph the project
    can build is tests/test_one_truth.py."""
    return predict_placement(model, graph_capture=True, target=runtime)


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
        if _is_constant(value):
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
        if why is None and inputs and all(_is_constant(v) or id(v) in folded_values for v in inputs):
            why = "every input is constant: onnxruntime may fold it to a constant"
        if why is not None:
            out[id(node)] = why
            folded_values.update(id(v) for v in node.outputs)
    return out


@dataclasses.dataclass
class _GraphFacts:
    """What placing one graph reads that does not depend on ``fold``: computed once for both predictions."""

    nodes: list[ir.Node]
    dtypes: Dtypes
    rep: dict[int, ir.Value]
    redirect: dict[int, ir.Value]
    merged: set[int]
    aliases: dict[int, list[str]]
    live: list[ir.Node]
    foldable: dict[int, str]
    #: id(node) -> (_has_kernel's answer, why), filled as nodes are placed
    kernel: dict[int, tuple[bool | None, str]] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, graph: ir.Graph, outer: Dtypes | None) -> _GraphFacts:
        nodes = list(graph)
        dtypes = Dtypes(graph, outer)
        rep = common_subexpressions(nodes)
        for node in nodes:  # onnxruntime's CastElimination: a Cast to the type its input already has is removed
            if (node.op_type == "Cast" and node.domain in ("", "ai.onnx") and node.inputs
                    and node.inputs[0] is not None and not node.outputs[0].is_graph_output()
                    and id(node.outputs[0]) not in rep and dtypes(node.inputs[0]) is not None
                    and dtypes(node.inputs[0]) == _attr_dtype(node, "to")):
                rep[id(node.outputs[0])] = rep.get(id(node.inputs[0]), node.inputs[0])
        redirect, dropped = shape_bypass(nodes)
        merged = {id(n) for n in nodes if n.outputs and all(id(o) in rep for o in n.outputs)} | dropped
        aliases: dict[int, list[str]] = {}
        for node in nodes:
            for out in node.outputs:
                if id(out) in rep:
                    aliases.setdefault(id(rep[id(out)]), []).append(out.name or "")
        live = [n for n in nodes if id(n) not in merged]
        return cls(nodes, dtypes, rep, redirect, merged, aliases, live, maybe_folded(live, redirect))


def _predict_graph(graph: ir.Graph, capture: bool, result: Placement, outer_cpu: set[int], kernels: KernelTable,
                   opset: int | None, dtypes: Dtypes | None = None, outer_unknown: set[int] | None = None,
                   fold: bool = False, facts: dict[int, _GraphFacts] | None = None) -> None:
    """Place ``graph``'s nodes into ``result``; ``fold``: as if onnxruntime folded every :func:`maybe_folded` node
    to a constant (else as if it folded none). ``facts``: id(graph) -> its :class:`_GraphFacts`, shared by the
    predictions of one unchanged model (filled here)."""
    facts = {} if facts is None else facts
    known = facts.get(id(graph))
    if known is None or known.nodes != list(graph):
        known = facts[id(graph)] = _GraphFacts.of(graph, dtypes)
    nodes, dtypes, rep, redirect = known.nodes, known.dtypes, known.rep, known.redirect
    merged, aliases, live, foldable = known.merged, known.aliases, known.live, known.foldable
    outer_unknown = outer_unknown or set()
    on_cpu: dict[int, str] = {}  # id(node) -> reason
    unknown: dict[int, str] = {}  # id(node) -> why the static rules cannot place it
    for node in live:
        if id(node) in foldable:
            result.maybe_folded[node.name or node.op_type] = foldable[id(node)]
    folded_values = {id(v) for n in live if id(n) in foldable for v in n.outputs} if fold else set()
    if fold:
        live = [n for n in live if id(n) not in foldable]
    for node in live:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            continue  # folded into an initializer by onnxruntime at load
        if node.op_type in CONTROL_FLOW:
            result.control_flow.append(node.name or node.op_type)
        ok: bool | None
        if id(node) in known.kernel:
            ok, why = known.kernel[id(node)]
        elif id(node) in redirect:  # Shape of what onnxruntime really reads
            dtype = dtypes(redirect[id(node)])
            modes = kernels.modes("", "Shape", str(dtype), opset)
            ok = None if dtype is None or modes is None else ("on" if capture else "off") in modes
            why = "" if ok else (f"no WebGPU kernel for Shape({dtype}) (onnxruntime reads Shape(Cast(x)) as Shape(x))"
                                 if ok is False else f"Shape({dtype}) unknown to the static rules")
        else:
            ok, why = _has_kernel(node, capture, kernels, opset, dtypes)
        known.kernel[id(node)] = (ok, why)
        if ok is None:
            unknown[id(node)] = why
        elif not ok:
            on_cpu[id(node)] = why

    graph_inputs = {id(v) for v in graph.inputs}

    def location(value: ir.Value) -> str:
        """'cpu', 'gpu', 'input' (graph input), 'const', 'outer', 'outer-cpu' or 'unknown' for one value."""
        if _is_constant(value) or id(value) in folded_values:
            return "const"
        if id(value) in graph_inputs:
            return "input"
        producer = value.producer()
        if producer is None:
            if id(value) in outer_unknown:
                return "unknown"
            return "outer-cpu" if id(value) in outer_cpu else "outer"
        if id(producer) in unknown:
            return "unknown"
        return "cpu" if id(producer) in on_cpu or _cpu_output(value) else "gpu"

    def consumer_wants(node: ir.Node, index: int) -> str:
        if id(node) in on_cpu or index in _cpu_inputs(node, capture):
            return "cpu"  # a CPU-memory input is read on CPU wherever the node runs
        return "unknown" if id(node) in unknown else "gpu"

    # which values are read in which memory
    reads: dict[int, tuple[ir.Value, dict[str, list[str]]]] = {}
    for node in live:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            continue
        for index, value in enumerate(node.inputs):
            if value is None:
                continue
            if index == 0 and id(node) in redirect:
                value = redirect[id(node)]
            value = rep.get(id(value), value)
            entry = reads.setdefault(id(value), (value, {"cpu": [], "gpu": [], "unknown": []}))
            entry[1][consumer_wants(node, index)].append(node.name or node.op_type)
        for attr in node.attributes.values():  # subgraph reads of outer values: implicit inputs of this node
            if attr.type == ir.AttributeType.GRAPH:
                for sub_value in _outer_reads(attr.value):
                    entry = reads.setdefault(id(sub_value), (sub_value, {"cpu": [], "gpu": [], "unknown": []}))
                    want = "cpu" if id(node) in on_cpu else "unknown" if id(node) in unknown else "gpu"
                    entry[1][want].append(node.name or node.op_type)

    for value, wants in reads.values():
        where = location(value)
        producer = value.producer()
        producer_name = (producer.name or producer.op_type) if producer is not None else "graph input"
        also = tuple(aliases.get(id(value), ()))
        if (where == "cpu" and wants["gpu"]) or (where == "input" and wants["gpu"] and wants["cpu"]):
            result.memcpy.append(Memcpy("MemcpyFromHost", value.name or "", producer_name, tuple(wants["gpu"]), also))
        elif where == "gpu" and wants["cpu"]:
            result.memcpy.append(Memcpy("MemcpyToHost", value.name or "", producer_name, tuple(wants["cpu"]), also))

    for node in live:
        if id(node) in on_cpu:
            result.cpu_nodes[node.name or node.op_type] = on_cpu[id(node)]
        if id(node) in unknown:
            result.unknown[node.name or node.op_type] = unknown[id(node)]
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                cpu_values = {id(v) for n in live if id(n) in on_cpu for v in n.outputs}
                unknown_values = {id(v) for n in live if id(n) in unknown for v in n.outputs}
                _predict_graph(attr.value, capture, result, outer_cpu | cpu_values, kernels, opset, dtypes,
                               outer_unknown | unknown_values, fold, facts)
    result.merged_nodes.extend(n.name or n.op_type for n in nodes if id(n) in merged)


def _outer_reads(graph: ir.Graph) -> list[ir.Value]:
    inner = {id(v) for v in graph.inputs}
    for node in graph_walk.nodes(graph):
        inner.update(id(v) for v in node.outputs)
    out, seen = [], set()
    for node in graph_walk.nodes(graph):
        for v in node.inputs:
            if v is not None and id(v) not in inner and id(v) not in seen and not _is_constant(v):
                seen.add(id(v))
                out.append(v)
    return out
