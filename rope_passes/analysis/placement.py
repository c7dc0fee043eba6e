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
from typing import Any

import onnx_ir as ir

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

    def verdict(self) -> str:
        """One line for ``inspect``: ``does not load: ...`` / ``loads; capture-ready`` / ``loads; capture blocked
        by ...`` (with capture on), or ``loads`` (capture not asked)."""
        if not self.loads:
            return f"does not load: {self.load_error}"
        if not self.graph_capture:
            return f"loads; {len(self.memcpy)} Memcpy"
        if self.capture_ok:
            return "loads; capture-ready (0 Memcpy)"
        if self.control_flow:
            return f"loads; capture blocked by control flow ({', '.join(self.control_flow[:2])})"
        first = self.memcpy[0] if self.memcpy else None
        where = f", e.g. {first.kind} on {first.tensor!r}" if first else ""
        return f"loads; capture blocked by {len(self.memcpy)} Memcpy{where}"

    def summary(self) -> str:
        if not self.loads:
            return f"does not load: {self.load_error}"
        capture = ""
        if self.graph_capture:
            capture = "; capture: OK" if self.capture_ok else f"; capture refused: {self.capture_error}"
        return f"{len(self.cpu_nodes)} node(s) on CPU, {len(self.memcpy)} Memcpy{capture}"


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


def _kernel_modes(node: ir.Node, kernels: KernelTable, opset: int | None) -> tuple[frozenset[str] | None, str]:
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    ins = [value_dtype(v) for v in node.inputs]
    outs = [value_dtype(v) for v in node.outputs]
    if (domain, node.op_type) == ("", "Cast"):
        to = node.attributes.get("to")
        if to is not None:
            outs = [ir.DataType(to.value).name]
    key = type_key(domain, node.op_type, ins, outs)
    return kernels.modes(domain, node.op_type, key, opset), key


def _has_kernel(node: ir.Node, capture: bool, kernels: KernelTable, opset: int | None) -> tuple[bool, str]:
    modes, key = _kernel_modes(node, kernels, opset)
    if modes is None:
        return False, f"no WebGPU kernel known for {node.op_type}({key}) (not in the probed table)"
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
        model = ir.load(model)
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
    _predict_graph(model.graph, graph_capture, result, set(), runtime.kernels, _opset(model))
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
        else:
            result.capture_ok = True
    result.memcpy.sort()
    return result


def _const_key(value: ir.Value) -> Any:
    """Identity of a constant input for CSE: small constants by value (onnxruntime's ConstantSharing), else by name."""
    tensor = value.const_value
    if tensor is None:
        producer = value.producer()
        a = producer.attributes.get("value") if producer is not None else None
        tensor = a.value if a is not None else None
    if tensor is not None and tensor.size <= 100:
        return ("const", tensor.dtype.name, tuple(tensor.shape), tensor.numpy().tobytes())
    return ("value", id(value))


def common_subexpressions(nodes: list[ir.Node]) -> dict[int, ir.Value]:
    """onnxruntime's CommonSubexpressionElimination (level 1, before partitioning), as a value map:
    id(value) -> the representative value of its class, for values of duplicate nodes."""
    rep: dict[int, ir.Value] = {}
    seen: dict[Any, ir.Node] = {}

    def key_of(value: ir.Value | None) -> Any:
        if value is None:
            return None
        value = rep.get(id(value), value)
        if _is_constant(value):
            return _const_key(value)
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


def _predict_graph(graph: ir.Graph, capture: bool, result: Placement, outer_cpu: set[int], kernels: KernelTable,
                   opset: int | None) -> None:
    nodes = list(graph)
    rep = common_subexpressions(nodes)
    redirect, dropped = shape_bypass(nodes)
    merged = {id(n) for n in nodes if n.outputs and all(id(o) in rep for o in n.outputs)} | dropped
    aliases: dict[int, list[str]] = {}
    for node in nodes:
        for out in node.outputs:
            if id(out) in rep:
                aliases.setdefault(id(rep[id(out)]), []).append(out.name or "")
    live = [n for n in nodes if id(n) not in merged]
    on_cpu: dict[int, str] = {}  # id(node) -> reason
    for node in live:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            continue  # folded into an initializer by onnxruntime at load
        if node.op_type in CONTROL_FLOW:
            result.control_flow.append(node.name or node.op_type)
        if id(node) in redirect:  # Shape of what onnxruntime really reads
            dtype = value_dtype(redirect[id(node)])
            ok = ("on" if capture else "off") in (kernels.modes("", "Shape", str(dtype), opset) or frozenset())
            why = "" if ok else f"no WebGPU kernel for Shape({dtype}) (onnxruntime reads Shape(Cast(x)) as Shape(x))"
        else:
            ok, why = _has_kernel(node, capture, kernels, opset)
        if not ok:
            on_cpu[id(node)] = why

    graph_inputs = {id(v) for v in graph.inputs}

    def location(value: ir.Value) -> str:
        """'cpu', 'gpu', 'input' (graph input), 'const' or 'outer' for one value."""
        if _is_constant(value):
            return "const"
        if id(value) in graph_inputs:
            return "input"
        producer = value.producer()
        if producer is None:
            return "outer-cpu" if id(value) in outer_cpu else "outer"
        return "cpu" if id(producer) in on_cpu or _cpu_output(value) else "gpu"

    def consumer_wants(node: ir.Node, index: int) -> str:
        if id(node) in on_cpu:
            return "cpu"
        return "cpu" if index in _cpu_inputs(node, capture) else "gpu"

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
            entry = reads.setdefault(id(value), (value, {"cpu": [], "gpu": []}))
            entry[1][consumer_wants(node, index)].append(node.name or node.op_type)
        for attr in node.attributes.values():  # subgraph reads of outer values: implicit inputs of this node
            if attr.type == ir.AttributeType.GRAPH:
                for sub_value in _outer_reads(attr.value):
                    entry = reads.setdefault(id(sub_value), (sub_value, {"cpu": [], "gpu": []}))
                    entry[1]["cpu" if id(node) in on_cpu else "gpu"].append(node.name or node.op_type)

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
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                cpu_values = {id(v) for n in live if id(n) in on_cpu for v in n.outputs}
                _predict_graph(attr.value, capture, result, outer_cpu | cpu_values, kernels, opset)
    result.merged_nodes.extend(n.name or n.op_type for n in nodes if id(n) in merged)


def _outer_reads(graph: ir.Graph) -> list[ir.Value]:
    inner = {id(v) for v in graph.inputs}
    for node in ir.traversal.RecursiveGraphIterator(graph):
        inner.update(id(v) for v in node.outputs)
    out, seen = [], set()
    for node in ir.traversal.RecursiveGraphIterator(graph):
        for v in node.inputs:
            if v is not None and id(v) not in inner and id(v) not in seen and not _is_constant(v):
                seen.add(id(v))
                out.append(v)
    return out
