"""Where onnxruntime-webgpu 1.27 runs each node, which Memcpy nodes it inserts, and whether graph capture can start.

Two levels, which a test keeps in agreement on the whole genai corpus:

* :func:`predict_placement` — static, no session. It replays onnxruntime's own partitioning rules:

  1. a node gets WebGPU when the WebGPU kernel registry has a kernel for its op and input type
     (:data:`WEBGPU_KERNELS`, measured, see :func:`derive_kernel_table`); ``Shape`` of an int64 tensor has none, and
     every ``Shape`` output lives in CPU memory (:data:`CPU_OUTPUTS`), so shape math starts on CPU. With ``enableGraphCapture=1`` the EP also registers its int64 kernels, which changes the table;
  2. shape math downstream of ``Shape`` lands on CPU because its int64 ops have no WebGPU kernel (without capture,
     none; with capture, only ``Cast``/``Expand``/``Range``/``Unsqueeze`` have int64 kernels). The 1.27 WebGPU EP does
     not apply onnxruntime's ``GetCpuPreferredNodes`` heuristic (measured: an int32 ``ReduceSum`` fed only by a CPU
     ``Cast`` and a small initializer stays on WebGPU, with a Memcpy), so neither does this prediction. Before
     partitioning onnxruntime merges identical nodes (``CommonSubexpressionElimination``); the prediction does too, and
     a Memcpy on a merged tensor may carry any of its names (:attr:`Memcpy.aliases`). It also reads
     ``Shape(Cast(x))``/``Shape(Identity(x))`` as ``Shape(x)`` when the Cast/Identity feeds only Shape nodes
     (:func:`shape_bypass`);
  3. Memcpy (``transformer_memcpy``): ``MemcpyFromHost`` after a tensor produced on CPU (or a graph input also read
     by CPU nodes) that a WebGPU node reads in GPU memory; ``MemcpyToHost`` before a tensor produced on WebGPU that a
     CPU node reads, or that a WebGPU kernel reads in CPU memory (:data:`CPU_INPUTS`, e.g. ``Reshape``'s shape).
     Initializers and ``Constant`` outputs never need one (onnxruntime copies them per device);
  4. graph capture is refused for control flow (``If``/``Loop``/``Scan``) first, then for any Memcpy.

* :func:`probe_placement` — the runtime truth: a session in a subprocess with verbose logging; it reads onnxruntime's
  ``webgpu kernel not found`` and ``Node placements`` lines, the ``transformer_memcpy`` lines and the session
  creation error, if any.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import onnx_ir as ir

from rope_passes.analysis.graph import MS_DOMAIN

CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})

#: Ops whose CPU-memory inputs a WebGPU kernel declares (``InputMemoryType(OrtMemTypeCPU, i)``): a CPU tensor read
#: there needs no Memcpy, a GPU tensor read there needs a MemcpyToHost. From the 1.27 kernel registrations, checked
#: against the Memcpy lines of every corpus model (tests/test_placement.py).
CPU_INPUTS: dict[tuple[str, str], frozenset[int]] = {
    ("", "Reshape"): frozenset({1}),
    ("", "Expand"): frozenset({1}),
    ("", "Slice"): frozenset({1, 2, 3, 4}),
    ("", "Squeeze"): frozenset({1}),
    ("", "Unsqueeze"): frozenset({1}),
    ("", "Split"): frozenset({1}),
    ("", "Tile"): frozenset({1}),
    ("", "Range"): frozenset({0, 1, 2}),
    ("", "ConstantOfShape"): frozenset({0}),
    ("", "ReduceSum"): frozenset({1}),
    ("", "ReduceMax"): frozenset({1}),
    ("", "ReduceMin"): frozenset({1}),
    ("", "ReduceMean"): frozenset({1}),
    ("", "ReduceProd"): frozenset({1}),
    ("", "Pad"): frozenset({1, 2, 3}),
    ("", "CumSum"): frozenset({1}),
    ("", "Trilu"): frozenset({1}),
    ("", "If"): frozenset({0}),
}
#: WebGPU kernels whose outputs live in CPU memory (``OutputMemoryType(OrtMemTypeCPU, i)``): Shape's result.
CPU_OUTPUTS: dict[tuple[str, str], frozenset[int]] = {("", "Shape"): frozenset({0}), ("", "Size"): frozenset({0})}
#: GroupQueryAttention reads ``total_sequence_length`` (input 6) from CPU memory, except under graph capture, where
#: it must be a GPU tensor (measured: the builder's ``_graph`` models need a MemcpyToHost for it without capture and
#: none with capture).
GQA_TOTAL_SEQ_INPUT = 6

#: ops onnxruntime 1.27 cannot load at all, with its message (measured on the corpus)
UNREGISTERED_OPS: dict[tuple[str, str], str] = {
    (MS_DOMAIN, "MRotaryEmbedding"): "com.microsoft:MRotaryEmbedding(-1) is not a registered function/op",
}
#: input-count limits of contrib schemas that the corpus exceeds
MAX_INPUTS: dict[tuple[str, str], int] = {(MS_DOMAIN, "GroupQueryAttention"): 14}

# ----------------------------------------------------------------------------------------------------------------
# The WebGPU kernel registry of onnxruntime-webgpu 1.27, as measured.
#
# onnxruntime has no Python API to list an EP's kernels. This table was produced by `derive_kernel_table()` below:
# one probe model per (op, type) with every input a graph input, a WebGPU session with capture off and one with
# capture on (log_severity 0), and the EP's "webgpu kernel not found in registries for Op type: X node name: N"
# lines. Key: (domain, op, type key) with the type key from `_type_key` (the dtype of the type-constrained input;
# for Cast "FROM->TO"). Value: the capture modes with a kernel: "off", "on" (capture on registers int64 kernels).
# Regenerate with:  python -m rope_passes.analysis.placement --derive-kernels
# ----------------------------------------------------------------------------------------------------------------
_BOTH = frozenset({"off", "on"})
_ON = frozenset({"on"})
_NONE: frozenset[str] = frozenset()

WEBGPU_KERNELS: dict[tuple[str, str, str], frozenset[str]] = {}  # filled from _KERNEL_TABLE below


def _type_index(domain: str, op: str) -> int | None:
    """Which input carries the type that selects the kernel (None: output type, e.g. ConstantOfShape)."""
    if (domain, op) == ("", "Where"):
        return 1
    if (domain, op) in (("", "ConstantOfShape"), ("", "Constant")):
        return None
    return 0


def _type_key(domain: str, op: str, in_types: list[str | None], out_types: list[str | None],
              attrs: Mapping[str, Any]) -> str:
    if (domain, op) == ("", "Cast"):
        return f"{in_types[0] if in_types else None}->{out_types[0] if out_types else None}"
    index = _type_index(domain, op)
    if index is None:
        return str(out_types[0] if out_types else None)
    return str(in_types[index] if index < len(in_types) else None)


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


def _kernel_modes(node: ir.Node) -> tuple[frozenset[str] | None, str]:
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    ins = [value_dtype(v) for v in node.inputs]
    outs = [value_dtype(v) for v in node.outputs]
    if (domain, node.op_type) == ("", "Cast"):
        to = node.attributes.get("to")
        if to is not None:
            outs = [ir.DataType(to.value).name]
    key = _type_key(domain, node.op_type, ins, outs, node.attributes)
    return WEBGPU_KERNELS.get((domain, node.op_type, key)), key


def _has_kernel(node: ir.Node, capture: bool) -> tuple[bool, str]:
    modes, key = _kernel_modes(node)
    if modes is None:
        return False, f"no WebGPU kernel known for {node.op_type}({key}) (not in the measured table)"
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
    if (domain, node.op_type) == (MS_DOMAIN, "GroupQueryAttention"):
        return frozenset() if capture else frozenset({GQA_TOTAL_SEQ_INPUT})
    return CPU_INPUTS.get((domain, node.op_type), frozenset())


def _cpu_output(value: ir.Value) -> bool:
    """Whether a WebGPU kernel writes this output to CPU memory (Shape)."""
    node = value.producer()
    if node is None:
        return False
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    indices = CPU_OUTPUTS.get((domain, node.op_type), frozenset())
    return any(node.outputs[i] is value for i in indices if i < len(node.outputs))


def check_loadable(model: ir.Model) -> str | None:
    """The reason onnxruntime-webgpu 1.27 would refuse to load ``model`` (None: it loads), for the known cases."""
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        key = (domain, node.op_type)
        if key in UNREGISTERED_OPS:
            return f"Fatal error: {UNREGISTERED_OPS[key]}"
        limit = MAX_INPUTS.get(key)
        if limit is not None and len(node.inputs) > limit:
            return (f"This is an invalid model. In Node {node.name!r} ({node.op_type}): "
                    f"input size {len(node.inputs)} not in range [min=?, max={limit}]")
    return None


def predict_placement(model: ir.Model | str | os.PathLike, *, graph_capture: bool = True) -> Placement:
    """Static prediction of onnxruntime-webgpu 1.27's placement for ``model`` (see the module docstring)."""
    if not isinstance(model, ir.Model):
        name = str(model)
        model = ir.load(model)
    else:
        name = model.graph.name or "<model>"
    result = Placement(name, graph_capture, "static")
    error = check_loadable(model)
    if error is not None:
        result.loads = False
        result.load_error = error
        result.capture_ok = False if graph_capture else None
        result.capture_error = error if graph_capture else None
        return result
    _predict_graph(model.graph, graph_capture, result, outer_cpu=set())
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


def _predict_graph(graph: ir.Graph, capture: bool, result: Placement, outer_cpu: set[int]) -> None:
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
            ok = ("on" if capture else "off") in WEBGPU_KERNELS.get(("", "Shape", str(dtype)), frozenset())
            why = "" if ok else f"no WebGPU kernel for Shape({dtype}) (onnxruntime reads Shape(Cast(x)) as Shape(x))"
        else:
            ok, why = _has_kernel(node, capture)
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
                _predict_graph(attr.value, capture, result, outer_cpu | cpu_values)
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


# ----------------------------------------------------------------------------------------------------------------
# Runtime probe (subprocess)
# ----------------------------------------------------------------------------------------------------------------

_NOT_FOUND = re.compile(r"webgpu kernel not found in registries for Op type: (\S+) node name: (.*)$")
_MEMCPY = re.compile(r"transformer_memcpy\.cc:\d+ \w+\] Add (MemcpyFromHost|MemcpyToHost) (?:after|before) (.*) "
                     r"for WebGpuExecutionProvider")
_PLACED = re.compile(r"Node\(s\) placed on \[(\w+)\]")
_PLACED_NODE = re.compile(r"VerifyEachNodeIsAssignedToAnEp\]\s+(\S+) \((.*)\)$")


def _probe_child(model_path: str, capture: bool, options: Mapping[str, str]) -> None:
    """Runs in the subprocess: create the session, print a JSON line with the error; the log goes to stderr."""
    import onnxruntime as ort

    ort.set_default_logger_severity(0)
    so = ort.SessionOptions()
    so.log_severity_level = 0
    entries = dict(options)
    if capture:
        entries["enableGraphCapture"] = "1"
    for key, value in entries.items():
        so.add_session_config_entry(f"ep.webgpuexecutionprovider.{key}", str(value))
    out: dict[str, Any] = {"error": None, "providers": None}
    try:
        sess = ort.InferenceSession(model_path, so, providers=["WebGpuExecutionProvider", "CPUExecutionProvider"])
        out["providers"] = sess.get_providers()
    except Exception as exc:  # noqa: BLE001 - the message is the result
        out["error"] = str(exc)
    sys.stderr.flush()
    print("ROPE_PASSES_PROBE " + json.dumps(out), flush=True)


def probe_placement(model_path: str | os.PathLike, *, graph_capture: bool = True,
                    webgpu_options: Mapping[str, str] | None = None, timeout: float = 120) -> Placement:
    """The runtime truth: a WebGPU session in a subprocess with verbose logging (see the module docstring)."""
    cmd = [sys.executable, "-m", "rope_passes.analysis.placement", "--probe-child", str(model_path),
           "--capture", "1" if graph_capture else "0", "--options", json.dumps(dict(webgpu_options or {}))]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)  # exit code is data
    return parse_probe_log(str(model_path), graph_capture, proc.stdout + "\n" + proc.stderr, proc.returncode)


def parse_probe_log(model: str, graph_capture: bool, log: str, returncode: int = 0) -> Placement:
    result = Placement(model, graph_capture, "probe")
    marker = next((ln for ln in log.splitlines() if ln.startswith("ROPE_PASSES_PROBE ")), None)
    if marker is None:
        tail = " ".join(log.strip().splitlines()[-3:])[-300:]
        result.loads = False
        result.load_error = f"probe crashed (exit code {returncode}): {tail}"
        return result
    info = json.loads(marker.split(" ", 1)[1])
    error = info["error"]
    if error and "graph capture" not in error:
        result.loads = False
        result.load_error = _strip_ort(error)
    if info["providers"] is not None and info["providers"][0] != "WebGpuExecutionProvider":
        result.loads = False
        result.load_error = "WebGPU session fell back to CPU (no WebGPU adapter?)"
    placed: str | None = None
    for line in log.splitlines():
        m = _NOT_FOUND.search(line)
        if m:
            result.cpu_nodes.setdefault(m.group(2).strip(), f"no WebGPU kernel for {m.group(1)} (onnxruntime log)")
            continue
        m = _MEMCPY.search(line)
        if m:
            result.memcpy.append(Memcpy(m.group(1), m.group(2).strip()))
            continue
        m = _PLACED.search(line)
        if m:
            placed = m.group(1)
            continue
        m = _PLACED_NODE.search(line)
        if m and placed == "CPUExecutionProvider":
            result.cpu_nodes.setdefault(m.group(2), "placed on CPU (onnxruntime log)")
    result.memcpy = sorted(set(result.memcpy))
    if graph_capture:
        result.capture_ok = error is None and result.loads
        result.capture_error = _strip_ort(error) if error else None
    if not result.loads:
        result.capture_ok = False if graph_capture else None
    return result


def _strip_ort(message: str) -> str:
    return re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", message).strip()


def annotate(placement: Placement, model: ir.Model) -> Placement:
    """Fill producer/consumer names of a probe's Memcpy entries from the graph."""
    values: dict[str, ir.Value] = {}
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        for v in list(node.inputs) + list(node.outputs):
            if v is not None and v.name:
                values.setdefault(v.name, v)
    for v in model.graph.inputs:
        values.setdefault(v.name or "", v)
    out = []
    for m in placement.memcpy:
        v = values.get(m.tensor)
        if v is None:
            out.append(m)
            continue
        producer = v.producer()
        users = tuple(u.name or u.op_type for u, _ in v.uses())
        out.append(Memcpy(m.kind, m.tensor, (producer.name or producer.op_type) if producer else "graph input", users))
    placement.memcpy = out
    return placement


# ----------------------------------------------------------------------------------------------------------------
# Kernel registry derivation (how WEBGPU_KERNELS was made)
# ----------------------------------------------------------------------------------------------------------------

#: (domain, op, attributes, input templates) probed by derive_kernel_table; "T" inputs take the probed dtype.
_PROBE_DTYPES = ("FLOAT", "FLOAT16", "INT32", "INT64", "UINT32", "BOOL")
_PROBE_OPS: list[tuple[str, str, dict[str, Any], list[str], int]] = [
    # (domain, op, attrs, inputs ("T" or a fixed dtype), n_outputs)
    ("", "Add", {}, ["T", "T"], 1), ("", "Sub", {}, ["T", "T"], 1), ("", "Mul", {}, ["T", "T"], 1),
    ("", "Div", {}, ["T", "T"], 1), ("", "Equal", {}, ["T", "T"], 1), ("", "Greater", {}, ["T", "T"], 1),
    ("", "Less", {}, ["T", "T"], 1), ("", "GreaterOrEqual", {}, ["T", "T"], 1), ("", "Max", {}, ["T", "T"], 1),
    ("", "Min", {}, ["T", "T"], 1), ("", "Neg", {}, ["T"], 1), ("", "Relu", {}, ["T"], 1), ("", "Abs", {}, ["T"], 1), ("", "Cos", {}, ["T"], 1), ("", "Sin", {}, ["T"], 1),
    ("", "Sigmoid", {}, ["T"], 1), ("", "Identity", {}, ["T"], 1), ("", "Transpose", {"perm": [1, 0]}, ["T"], 1),
    ("", "Shape", {}, ["T"], 1), ("", "Size", {}, ["T"], 1), ("", "Gather", {"axis": 0}, ["T", "INT64"], 1),
    ("", "GatherElements", {"axis": 0}, ["T", "INT64"], 1), ("", "Reshape", {}, ["T", "INT64"], 1),
    ("", "Expand", {}, ["T", "INT64"], 1), ("", "Slice", {}, ["T", "INT64", "INT64", "INT64", "INT64"], 1),
    ("", "Squeeze", {}, ["T", "INT64"], 1), ("", "Unsqueeze", {}, ["T", "INT64"], 1),
    ("", "Split", {"axis": 0}, ["T", "INT64"], 2), ("", "Tile", {}, ["T", "INT64"], 1),
    ("", "Concat", {"axis": 0}, ["T", "T"], 1), ("", "Range", {}, ["T", "T", "T"], 1),
    ("", "ReduceSum", {"keepdims": 0}, ["T", "INT64"], 1), ("", "ReduceMax", {"keepdims": 0}, ["T", "INT64"], 1),
    ("", "ReduceMin", {"keepdims": 0}, ["T", "INT64"], 1), ("", "ReduceProd", {"keepdims": 0}, ["T", "INT64"], 1),
    ("", "Where", {}, ["BOOL", "T", "T"], 1), ("", "MatMul", {}, ["T", "T"], 1), ("", "CumSum", {}, ["T", "INT64"], 1),
    ("", "Trilu", {}, ["T"], 1), ("", "Softmax", {}, ["T"], 1),
    ("", "SimplifiedLayerNormalization", {}, ["T", "T"], 1),
    (MS_DOMAIN, "SkipSimplifiedLayerNormalization", {}, ["T", "T", "T"], 1),
    (MS_DOMAIN, "RotaryEmbedding", {}, ["T", "INT64", "T", "T"], 1),
    (MS_DOMAIN, "GroupQueryAttention", {"num_heads": 2, "kv_num_heads": 2},
     ["T", "T", "T", "T", "T", "INT32", "INT32"], 3),
    (MS_DOMAIN, "MatMulNBits", {"K": 32, "N": 32, "bits": 4, "block_size": 32}, ["T", "UINT8", "T"], 1),
]


def _probe_nodes() -> list[tuple[tuple[str, str, str], Any]]:
    from onnx import TensorProto, helper

    out = []
    for domain, op, attrs, inputs, n_out in _PROBE_OPS:
        for dtype in _PROBE_DTYPES:
            out.append(((domain, op, dtype), (domain, op, attrs, [dtype if t == "T" else t for t in inputs], n_out)))
    for src in _PROBE_DTYPES:
        for dst in _PROBE_DTYPES:
            if src != dst:
                out.append((("", "Cast", f"{src}->{dst}"),
                            ("", "Cast", {"to": getattr(TensorProto, dst)}, [src], 1)))
    for dst in _PROBE_DTYPES:
        out.append((("", "ConstantOfShape", dst),
                    ("", "ConstantOfShape", {"value": helper.make_tensor("v", getattr(TensorProto, dst), [1], [0])},
                     ["INT64"], 1)))
    return out


def _probe_model_bytes(entries: list[tuple[tuple[str, str, str], Any]]) -> tuple[bytes, dict[str, tuple]]:
    from onnx import TensorProto, helper

    nodes, inputs, outputs, names = [], [], [], {}
    for i, (key, (domain, op, attrs, in_types, n_out)) in enumerate(entries):
        node_inputs = []
        for j, t in enumerate(in_types):
            name = f"n{i}_in{j}"
            inputs.append(helper.make_tensor_value_info(name, getattr(TensorProto, t), None))
            node_inputs.append(name)
        outs = [f"n{i}_out{j}" for j in range(n_out)]
        outputs.extend(helper.make_empty_tensor_value_info(o) for o in outs)
        nodes.append(helper.make_node(op, node_inputs, outs, name=f"probe{i}", domain=domain, **attrs))
        names[f"probe{i}"] = key
    graph = helper.make_graph(nodes, "kernel_probe", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS_DOMAIN, 1)])
    model.ir_version = 10
    return model.SerializeToString(), names


def _well_typed(entry: tuple[tuple[str, str, str], Any]) -> bool:
    """Whether the ONNX schema accepts this (op, types) at all (contrib ops: float types only)."""
    import onnx

    (domain, op, dtype) = entry[0]
    if domain == MS_DOMAIN or not onnx.defs.has(op, domain):
        return dtype in ("FLOAT", "FLOAT16")
    data, _ = _probe_model_bytes([entry])
    try:
        onnx.shape_inference.infer_shapes(onnx.load_from_string(data), check_type=True, strict_mode=True)
    except Exception:  # noqa: BLE001 - a type error is the answer
        return False
    return True


def derive_kernel_table() -> dict[tuple[str, str, str], frozenset[str]]:
    """Measure the WebGPU kernel registry: returns {(domain, op, type key): modes with a kernel}.

    Only (op, type) pairs the ONNX schema accepts are probed; the others are absent from the result.
    """
    entries = [e for e in _probe_nodes() if _well_typed(e)]
    table: dict[tuple[str, str, str], set[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "probe.onnx"
        for capture in (False, True):
            todo = list(entries)
            while True:
                data, names = _probe_model_bytes(todo)
                path.write_bytes(data)
                placement = probe_placement(path, graph_capture=capture)
                if placement.loads and (placement.capture_ok is not False or "graph capture" in
                                        (placement.capture_error or "")):
                    break
                # a (op, type) no EP at all can run makes the whole session fail: drop it and retry
                bad = re.search(r"probe(\d+)", placement.load_error or "")
                if bad is None:
                    raise RuntimeError(f"kernel probe model did not load: {placement.load_error}")
                del todo[int(bad.group(1))]
            missing = set(placement.cpu_nodes)
            for node_name, key in names.items():
                table.setdefault(key, set())
                if node_name not in missing:
                    table[key].add("on" if capture else "off")
    return {k: frozenset(v) for k, v in table.items()}


def _format_table(table: Mapping[tuple[str, str, str], frozenset[str]]) -> str:
    lines = ["_KERNEL_TABLE: dict[tuple[str, str], dict[str, frozenset[str]]] = {"]
    by_op: dict[tuple[str, str], dict[str, frozenset[str]]] = {}
    for (domain, op, key), modes in sorted(table.items()):
        by_op.setdefault((domain, op), {})[key] = modes
    for (domain, op), keys in by_op.items():
        parts = []
        for key, modes in keys.items():
            name = "_BOTH" if modes == _BOTH else "_ON" if modes == _ON else "_NONE" if not modes else repr(set(modes))
            if modes:
                parts.append(f"{key!r}: {name}")
        lines.append(f"    ({domain!r}, {op!r}): {{{', '.join(parts)}}},")
    lines.append("}")
    return "\n".join(lines)


# fmt: off
# Generated by `python -m rope_passes.analysis.placement --derive-kernels` on onnxruntime-webgpu 1.27.0 (lavapipe).
# Types not listed have no WebGPU kernel in either mode.
_KERNEL_TABLE: dict[tuple[str, str], dict[str, frozenset[str]]] = {
    ('', 'Abs'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH},
    ('', 'Add'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH, 'INT32': _BOTH, 'UINT32': _BOTH},
    ('', 'Cast'): {'BOOL->FLOAT': _BOTH, 'BOOL->FLOAT16': _BOTH, 'BOOL->INT32': _BOTH, 'BOOL->INT64': _ON, 'BOOL->UINT32': _BOTH, 'FLOAT->BOOL': _BOTH, 'FLOAT->FLOAT16': _BOTH, 'FLOAT->INT32': _BOTH, 'FLOAT->INT64': _ON, 'FLOAT->UINT32': _BOTH, 'FLOAT16->BOOL': _BOTH, 'FLOAT16->FLOAT': _BOTH, 'FLOAT16->INT32': _BOTH, 'FLOAT16->INT64': _ON, 'FLOAT16->UINT32': _BOTH, 'INT32->BOOL': _BOTH, 'INT32->FLOAT': _BOTH, 'INT32->FLOAT16': _BOTH, 'INT32->INT64': _ON, 'INT32->UINT32': _BOTH, 'INT64->BOOL': _ON, 'INT64->FLOAT': _ON, 'INT64->FLOAT16': _ON, 'INT64->INT32': _ON, 'INT64->UINT32': _ON, 'UINT32->BOOL': _BOTH, 'UINT32->FLOAT': _BOTH, 'UINT32->FLOAT16': _BOTH, 'UINT32->INT32': _BOTH, 'UINT32->INT64': _ON},
    ('', 'Concat'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH, 'INT32': _BOTH, 'UINT32': _BOTH},
    ('', 'ConstantOfShape'): {},
    ('', 'Cos'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH},
    ('', 'CumSum'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH},
    ('', 'Div'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH, 'INT32': _BOTH, 'UINT32': _BOTH},
    ('', 'Equal'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH, 'INT32': _BOTH, 'UINT32': _BOTH},
    ('', 'Expand'): {'BOOL': _BOTH, 'FLOAT': _BOTH, 'FLOAT16': _BOTH, 'INT32': _BOTH, 'INT64': _ON, 'UINT32': _BOTH},
    ('', 'Gather'): {'BOOL': _BOTH, 'FLOAT': _BOTH, 'FLOAT16': _BOTH, 'INT32': _BOTH, 'UINT32': _BOTH},
    ('', 'GatherElements'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH},
    ('', 'Greater'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH, 'INT32': _BOTH, 'UINT32': _BOTH},
    ('', 'GreaterOrEqual'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH, 'INT32': _BOTH, 'UINT32': _BOTH},
    ('', 'Identity'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH, 'INT32': _BOTH, 'UINT32': _BOTH},
    ('', 'Less'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH, 'INT32': _BOTH, 'UINT32': _BOTH},
    ('', 'MatMul'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH},
    ('', 'Max'): {},
    ('', 'Min'): {},
    ('', 'Mul'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH, 'INT32': _BOTH, 'UINT32': _BOTH},
    ('', 'Neg'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH},
    ('', 'Range'): {'FLOAT': _BOTH, 'INT32': _BOTH, 'INT64': _ON},
    ('', 'ReduceMax'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH, 'INT32': _BOTH, 'UINT32': _BOTH},
    ('', 'ReduceMin'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH, 'INT32': _BOTH, 'UINT32': _BOTH},
    ('', 'ReduceProd'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH, 'INT32': _BOTH, 'UINT32': _BOTH},
    ('', 'ReduceSum'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH, 'INT32': _BOTH, 'UINT32': _BOTH},
    ('', 'Relu'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH},
    ('', 'Reshape'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH, 'INT32': _BOTH, 'UINT32': _BOTH},
    ('', 'Shape'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH, 'INT32': _BOTH, 'UINT32': _BOTH},
    ('', 'Sigmoid'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH},
    ('', 'SimplifiedLayerNormalization'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH},
    ('', 'Sin'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH},
    ('', 'Size'): {},
    ('', 'Slice'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH},
    ('', 'Softmax'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH},
    ('', 'Split'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH, 'INT32': _BOTH, 'UINT32': _BOTH},
    ('', 'Squeeze'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH, 'INT32': _BOTH, 'UINT32': _BOTH},
    ('', 'Sub'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH, 'INT32': _BOTH, 'UINT32': _BOTH},
    ('', 'Tile'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH},
    ('', 'Transpose'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH, 'INT32': _BOTH, 'UINT32': _BOTH},
    ('', 'Trilu'): {},
    ('', 'Unsqueeze'): {'BOOL': _BOTH, 'FLOAT': _BOTH, 'FLOAT16': _BOTH, 'INT32': _BOTH, 'INT64': _ON, 'UINT32': _BOTH},
    ('', 'Where'): {'BOOL': _BOTH, 'FLOAT': _BOTH, 'FLOAT16': _BOTH, 'INT32': _BOTH, 'UINT32': _BOTH},
    ('com.microsoft', 'GroupQueryAttention'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH},
    ('com.microsoft', 'MatMulNBits'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH},
    ('com.microsoft', 'RotaryEmbedding'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH},
    ('com.microsoft', 'SkipSimplifiedLayerNormalization'): {'FLOAT': _BOTH, 'FLOAT16': _BOTH},
}
# fmt: on


def _load_table() -> None:
    WEBGPU_KERNELS.clear()
    # If has a WebGPU kernel (cond read from CPU memory); not probed above (needs subgraphs): measured on the phi3
    # LongRoPE corpus graphs, where it never appears in the "kernel not found" lines and needs no Memcpy.
    WEBGPU_KERNELS[("", "If", "BOOL")] = _BOTH
    for (domain, op), keys in _KERNEL_TABLE.items():
        for key, modes in keys.items():
            WEBGPU_KERNELS[(domain, op, key)] = modes
    for domain, op, _attrs, _inputs, _n in _PROBE_OPS:  # probed types without a kernel: known "no"
        for dtype in _PROBE_DTYPES:
            WEBGPU_KERNELS.setdefault((domain, op, dtype), _NONE)
    for src in _PROBE_DTYPES:
        for dst in _PROBE_DTYPES:
            WEBGPU_KERNELS.setdefault(("", "Cast", f"{src}->{dst}"), _NONE)


_load_table()


def main(argv: Iterable[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m rope_passes.analysis.placement")
    parser.add_argument("model", nargs="?")
    parser.add_argument("--probe-child", metavar="MODEL")
    parser.add_argument("--capture", default="1")
    parser.add_argument("--options", default="{}")
    parser.add_argument("--derive-kernels", action="store_true")
    parser.add_argument("--probe", action="store_true", help="also run the runtime probe")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.probe_child:
        _probe_child(args.probe_child, args.capture == "1", json.loads(args.options))
        return 0
    if args.derive_kernels:
        print(_format_table(derive_kernel_table()))
        return 0
    if not args.model:
        parser.error("give a model path")
    capture = args.capture == "1"
    static = predict_placement(args.model, graph_capture=capture)
    print("static:", static.summary())
    for m in static.memcpy:
        print("  ", m)
    if args.probe:
        probe = annotate(probe_placement(args.model, graph_capture=capture), ir.load(args.model))
        print("probe: ", probe.summary())
        for m in probe.memcpy:
            print("  ", m)
    return 0


if __name__ == "__main__":
    sys.exit(main())
