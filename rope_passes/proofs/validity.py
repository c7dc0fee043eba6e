"""Is a rewritten model still a valid model where its input was one? The validity contract every pass carries.

A rewrite is valid when, judged against the model as the pass received it:

* the IR version and the opset imports are those of the input (a pass builds for the model's opsets; it never
  raises or lowers them);
* every node the pass added satisfies its operator's schema at the model's own opset imports (the op exists at that
  version; input and output counts in range; attributes known and of the right type: ``onnx.checker.check_node``).
  Ops ONNX does not define (onnxruntime's contrib ops in ``com.microsoft``, or those the builder writes in the default
  domain) are judged by the load below;
* onnxruntime's CPU EP loads the output wherever it loaded the input (schemas of contrib ops, type and shape
  inference, a kernel per node), judged on a weightless stand-in (:mod:`rope_passes.runtime.loads`): no weight is read.

:func:`schema_errors` is also what lint's RP003 reports for a whole model (static, no onnxruntime).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping

import onnx
import onnx.checker
import onnx_ir as ir

import rope_passes.graph_walk as graph_walk

__all__ = ["Baseline", "Invalid", "node_schema_error", "schema_errors", "validity_errors"]


@dataclasses.dataclass(frozen=True)
class Invalid:
    """One way a model is not valid: the rule it breaks, one line of why, and the node, when one is to blame."""

    rule: str  # "schema", "load", "ir-version", "opsets"
    reason: str
    node: ir.Node | None = None

    @property
    def where(self) -> str:
        if self.node is None:
            return "<model>"
        return self.node.name or f"{self.node.op_type} (unnamed)"


def _has_subgraph(node: ir.Node) -> bool:
    return any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()
               if isinstance(a, ir.Attr))


def node_schema_error(node: ir.Node, opsets: Mapping[str, int], ir_version: int) -> str | None:
    """Why ``node`` breaks its operator's schema at ``opsets`` (one line), or None. Ops ONNX does not define and
    nodes holding subgraphs (judged with their scope by the load) are not judged here."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    if not onnx.defs.has(node.op_type, domain):
        return None  # a contrib op (onnxruntime's, even in the default domain) or a function: the load judges it
    if domain not in opsets:
        return f"{node.op_type}: its domain {domain or 'ai.onnx'!r} is not imported by the model"
    if _has_subgraph(node):
        return None
    ctx = onnx.checker.C.CheckerContext()
    ctx.ir_version = ir_version
    ctx.opset_imports = dict(opsets)
    try:
        onnx.checker.check_node(ir.serde.serialize_node(node), ctx, onnx.checker.C.LexicalScopeContext())
    except onnx.checker.ValidationError as exc:
        text = " ".join(str(exc).split())
        text = re.sub(r"==> Context:.*$", "", text).strip()
        return f"{text} (opset {opsets.get(domain)})"
    return None


def _opsets(model: ir.Model) -> dict[str, int]:
    return {("" if d == "ai.onnx" else d): v for d, v in model.opset_imports.items()}


def _all_nodes(model: ir.Model) -> Iterable[ir.Node]:
    yield from graph_walk.nodes(model.graph)
    for function in model.functions.values():
        yield from function


def schema_errors(model: ir.Model, nodes: Iterable[ir.Node] | None = None) -> list[Invalid]:
    """The nodes (default: every node of the model, its subgraphs and its functions) that break their schema at the
    model's opset imports."""
    opsets = _opsets(model)
    out = []
    for node in _all_nodes(model) if nodes is None else nodes:
        error = node_schema_error(node, opsets, model.ir_version or onnx.IR_VERSION)
        if error is not None:
            out.append(Invalid("schema", error, node))
    return out


@dataclasses.dataclass
class Baseline:
    """The model as a pass received it: what its output is judged against."""

    ir_version: int | None
    opsets: dict[str, int]
    node_ids: set[int]
    #: onnxruntime CPU's load error on the input (None: it loaded), computed only when the output fails to load
    input_load_error: Callable[[], str | None]

    @classmethod
    def of(cls, model: ir.Model, input_load_error: Callable[[], str | None]) -> Baseline:
        return cls(model.ir_version, _opsets(model), {id(n) for n in _all_nodes(model)}, input_load_error)


_NODE_IN_ERROR = re.compile(r'In Node, \("([^"]*)", (\w+)')


def _blamed(model: ir.Model, error: str) -> ir.Node | None:
    """The node onnxruntime's load error names, when it names one of the model."""
    match = _NODE_IN_ERROR.search(error)
    if match is None:
        return None
    return next((n for n in _all_nodes(model) if n.name == match.group(1) and n.op_type == match.group(2)), None)


def validity_errors(model: ir.Model, baseline: Baseline, output_load_error: Callable[[], str | None]) -> list[Invalid]:
    """What makes ``model`` (a pass's output) invalid where the pass's input (``baseline``) was valid; empty when it
    is valid. The load is tried last, and the input's load only when the output fails."""
    out: list[Invalid] = []
    if model.ir_version != baseline.ir_version:
        out.append(Invalid("ir-version", f"the IR version changed from {baseline.ir_version} to {model.ir_version}"))
    opsets = _opsets(model)
    changed = sorted(d for d in set(opsets) | set(baseline.opsets) if opsets.get(d) != baseline.opsets.get(d)
                     and d in baseline.opsets)
    if changed:
        out.append(Invalid("opsets", "the opset imports changed: " + ", ".join(
            f"{d or 'ai.onnx'} {baseline.opsets.get(d)} -> {opsets.get(d)}" for d in changed)))
    added = [n for n in _all_nodes(model) if id(n) not in baseline.node_ids]
    out.extend(schema_errors(model, added))
    if out:
        return out
    error = output_load_error()
    if error is not None and baseline.input_load_error() is None:
        out.append(Invalid("load", f"onnxruntime (CPU) no longer loads the model: {error}", _blamed(model, error)))
    return out
