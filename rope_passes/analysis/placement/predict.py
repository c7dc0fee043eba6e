"""The static placement prediction (see :mod:`rope_passes.analysis.placement`): each node on WebGPU or CPU from the
runtime's probed kernel table, the Memcpy nodes between them, and the capture verdict."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import onnx_ir as ir

import rope_passes.graph_walk as graph_walk
from rope_passes.analysis.placement.dtypes import Dtypes, attr_dtype, value_dtype
from rope_passes.analysis.placement.ort_rewrites import (
    common_subexpressions,
    inline_functions,
    is_constant,
    maybe_folded,
    shape_bypass,
)
from rope_passes.analysis.placement.result import Memcpy, Placement
from rope_passes.report import name_of
from rope_passes.runtimes.choose import resolve
from rope_passes.runtimes.probed import ProbedRuntime
from rope_passes.webgpu_kernels import (
    CPU_INPUTS,
    CPU_INPUTS_WITHOUT_CAPTURE,
    CPU_OUTPUTS,
    KernelTable,
    type_key,
)

CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})


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


def check_loadable(model: ir.Model, runtime: ProbedRuntime | str | None = None) -> str | None:
    """The reason the target runtime would refuse to load ``model`` (None: it loads): an op it does not register,
    GroupQueryAttention input counts outside its range (:meth:`~rope_passes.runtimes.probed.ProbedRuntime.load_problems`;
    the IR version is not checked: rope-passes saves with the highest one both runtimes load)."""
    problems = resolve(runtime).load_problems(model, ir_version=False)
    return problems[0].message if problems else None


def _opset(model: ir.Model) -> int | None:
    for domain in ("", "ai.onnx"):
        if domain in model.opset_imports:
            return model.opset_imports[domain]
    return None


def predict_placement(model: ir.Model | str | os.PathLike, *, graph_capture: bool = True,
                      runtime: ProbedRuntime | str | None = None) -> Placement:
    """Static prediction of the runtime's placement for ``model`` (see the module docstring); ``runtime``: a
    :class:`~rope_passes.runtimes.probed.ProbedRuntime` or runtime name, default the runtime installed here."""
    runtime = resolve(runtime)
    if not isinstance(model, ir.Model):
        name = str(model)
        from rope_passes.io.load import load_model  # lazy external data; reads what `--weights link` leaves

        model = load_model(model)
    else:
        name = name_of(model.graph) or "<model>"
    result = Placement(name, graph_capture, "static", runtime=runtime.name)
    model = inline_functions(model)
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


def capture_verdict(model: ir.Model | str | os.PathLike, runtime: ProbedRuntime | str | None = None) -> Placement:
    """**The one answer** to "does WebGPU graph capture work for this model on this runtime": ``optimize``'s summary
    and its ``enableGraphCapture`` config write, ``inspect``, ``lint`` (RP205, RP220-RP222) and the pipeline's
    placement guard all read it. The static prediction with capture on (:func:`predict_placement`), whose
    :attr:`Placement.state` is ``"does-not-load"``, ``"blocked"`` (with :meth:`Placement.blockers`, each with its
    node), ``"ready"``, or ``"unknown"`` where the static rules cannot place some node (then only the runtime can
    tell: ``rope-passes check --graph-capture``). Agreement with a real capture session on every graph the project
    can build is tests/test_one_truth.py."""
    return predict_placement(model, graph_capture=True, runtime=runtime)


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
                    and dtypes(node.inputs[0]) == attr_dtype(node, "to")):
                rep[id(node.outputs[0])] = rep.get(id(node.inputs[0]), node.inputs[0])
        redirect, dropped = shape_bypass(nodes)
        merged = {id(n) for n in nodes if n.outputs and all(id(o) in rep for o in n.outputs)} | dropped
        aliases: dict[int, list[str]] = {}
        for node in nodes:
            for out in node.outputs:
                if id(out) in rep:
                    aliases.setdefault(id(rep[id(out)]), []).append(name_of(out))
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
        if is_constant(value) or id(value) in folded_values:
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
            result.memcpy.append(Memcpy("MemcpyFromHost", name_of(value), producer_name, tuple(wants["gpu"]), also))
        elif where == "gpu" and wants["cpu"]:
            result.memcpy.append(Memcpy("MemcpyToHost", name_of(value), producer_name, tuple(wants["cpu"]), also))

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
            if v is not None and id(v) not in inner and id(v) not in seen and not is_constant(v):
                seen.add(id(v))
                out.append(v)
    return out
