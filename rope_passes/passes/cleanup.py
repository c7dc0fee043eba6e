"""``cleanup``: remove what rewrites left dead.

Rules (each is onnx_ir's own, reused rather than rewritten):

1. nodes whose outputs nobody reads and that are not graph outputs (``RemoveUnusedNodesPass``);
2. initializers nobody reads that are not graph inputs or outputs (same pass).

Exact: removing dead code changes no output. Graph inputs and outputs are never touched, nor are
opset imports (a user may rely on them). Graphs without dead code come out unchanged.
"""

from __future__ import annotations

import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

import rope_passes.graph_walk as graph_walk
from rope_passes.passes.base import RopePass
from rope_passes.report import PassReport


class CleanupPass(RopePass):
    name = "cleanup"
    summary = "remove dead nodes and initializers left by rewrites"

    def apply(self, model: ir.Model, report: PassReport) -> None:
        nodes_before = sum(1 for _ in graph_walk.nodes(model.graph))
        inits_before = len(model.graph.initializers)
        arity = {id(node): (node, len(node.inputs)) for node in graph_walk.nodes(model.graph)}
        RemoveUnusedNodesPass()(model)
        for node, count in arity.values():
            # onnx_ir's pass also drops trailing empty inputs: harmless where the op takes fewer, but Loop(M, "") left
            # as Loop(M) does not load (onnxruntime: "input size 1 not in range [min=2"): below the op's schema
            # minimum, a kept node gets its inputs back as they were
            if len(node.inputs) < count and node.graph is not None and len(node.inputs) < _min_inputs(model, node):
                node.resize_inputs(count)
        nodes_removed = nodes_before - sum(1 for _ in graph_walk.nodes(model.graph))
        inits_removed = inits_before - len(model.graph.initializers)
        if nodes_removed or inits_removed:
            report.rewritten("<model>", f"removed {nodes_removed} dead nodes and {inits_removed} dead initializers")
        else:
            report.not_matched("<model>", "no dead nodes or initializers")


def _min_inputs(model: ir.Model, node: ir.Node) -> int:
    """The fewest inputs the ONNX schema of ``node`` allows at the model's opset (0 where onnx does not know it)."""
    import onnx

    domain = node.domain if node.domain != "ai.onnx" else ""
    version = model.opset_imports.get(domain, model.opset_imports.get("ai.onnx", 0) if not domain else 0)
    try:
        return int(onnx.defs.get_schema(node.op_type, max_inclusive_version=version or 1_000,
                                        domain=domain).min_input)
    except onnx.defs.SchemaError:
        return 0
