"""The base of every rope-passes pass.

A pass is an ``onnx_ir.passes.InPlacePass`` (drop it into any onnx_ir ``PassManager``) that also fills a
:class:`~rope_passes.report.PassReport`: what it matched, rewrote and refused, and why. Subclasses implement
:meth:`RopePass.apply`; counting nodes/initializers added and removed is done here, once, for all of them.

A pass that needs to update ``genai_config.json`` reads and writes ``self.genai_config`` (a dict, or ``None``
when the model came without one); the pipeline hands it in and writes it back out.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, ClassVar

import onnx_ir as ir

from rope_passes.report import PassReport


@dataclasses.dataclass
class RopePassResult(ir.passes.PassResult):
    """``PassResult`` plus the pass's report."""

    report: PassReport | None = None


class RopePass(ir.passes.InPlacePass):
    #: The name used on the command line (``--passes fold-text-mrope``).
    name: ClassVar[str] = ""
    #: One line for ``rope-passes passes`` and the docs.
    summary: ClassVar[str] = ""

    def __init__(self, *, genai_config: dict[str, Any] | None = None, **options: Any) -> None:
        super().__init__()
        self.genai_config = genai_config
        self.options = options
        self.report = PassReport(self.name)

    def apply(self, model: ir.Model, report: PassReport) -> None:
        """Match and rewrite ``model`` in place, recording every match, rewrite and refusal in ``report``."""
        raise NotImplementedError

    def call(self, model: ir.Model) -> RopePassResult:
        report = PassReport(self.name)
        self.report = report
        nodes_before = _node_ids(model)
        inits_before = set(model.graph.initializers)
        start = time.perf_counter()
        self.apply(model, report)
        report.duration_s = time.perf_counter() - start
        nodes_after = _node_ids(model)
        inits_after = set(model.graph.initializers)
        report.nodes_removed = len(nodes_before - nodes_after)
        report.nodes_added = len(nodes_after - nodes_before)
        report.initializers_removed = len(inits_before - inits_after)
        report.initializers_added = len(inits_after - inits_before)
        modified = report.modified or nodes_before != nodes_after or inits_before != inits_after
        return RopePassResult(model, modified, report)


def _node_ids(model: ir.Model) -> set[int]:
    return {id(node) for node in ir.traversal.RecursiveGraphIterator(model.graph)}
