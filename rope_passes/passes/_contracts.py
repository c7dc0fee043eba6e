"""The post-conditions every rope-passes pass carries, wherever it runs (our pipeline or a plain onnx_ir
``PassManager``): :meth:`rope_passes.passes.base.RopePass.call` checks them after the pass and, when one does not hold,
puts the model (and ``genai_config.json``) back as the pass received it and reports one refusal with the reason.

* **Valid where the input was** (:mod:`rope_passes.proofs.validity`): the IR version and opset imports kept, every
  added node within its schema at the model's opsets, and onnxruntime (CPU) loads the output wherever it loaded the
  input.
* **Placement never worse** (:class:`PlacementCount`): on the runtime the output is for, with graph capture on,
  no more Memcpy nodes and no more CPU nodes than before (judged only where the static prediction is exact).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from rope_passes.proofs.validity import Invalid
from rope_passes.report import PassReport

if TYPE_CHECKING:
    from rope_passes.analysis.placement import Placement

__all__ = ["PlacementCount", "refused_for_invalid", "refused_for_placement"]


@dataclasses.dataclass(frozen=True)
class PlacementCount:
    """What placement a graph has on one runtime with graph capture on (the static prediction,
    :func:`rope_passes.analysis.placement.capture_verdict`): Memcpy nodes, CPU nodes, nodes it cannot place."""

    loads: bool
    memcpy: tuple[str, ...]
    cpu_nodes: tuple[str, ...]
    unknown: frozenset[str]

    def worse_than(self, before: PlacementCount) -> str | None:
        """Why this placement is worse than ``before`` (more Memcpy or more CPU nodes), or None. Counts are compared
        only where they are exact: both graphs load and the static rules place every node of both (with nodes they
        cannot place, the counts are lower bounds: a pass that makes a node placeable can raise them while onnxruntime
        counts fewer, as precompute-cos-sin on the torch exports does)."""
        if not (self.loads and before.loads) or self.unknown or before.unknown:
            return None
        parts = []
        if len(self.memcpy) > len(before.memcpy):
            new = sorted(set(self.memcpy) - set(before.memcpy))
            parts.append(f"Memcpy {len(before.memcpy)}→{len(self.memcpy)}" + (f" (new: {', '.join(new[:3])})"
                                                                            if new else ""))
        if len(self.cpu_nodes) > len(before.cpu_nodes):
            new = sorted(set(self.cpu_nodes) - set(before.cpu_nodes))
            parts.append(f"CPU nodes {len(before.cpu_nodes)}→{len(self.cpu_nodes)}"
                         + (f" (new: {', '.join(new[:3])})" if new else ""))
        return "; ".join(parts) or None

    @classmethod
    def of(cls, p: Placement) -> PlacementCount:
        """The counts of a :func:`~rope_passes.analysis.placement.capture_verdict`."""
        return cls(p.loads, tuple(f"{m.kind} on {m.tensor!r}" for m in p.memcpy), tuple(p.cpu_nodes),
                   frozenset(p.unknown))


def _rolled_back(done: PassReport) -> list[str]:
    return [f"{f.outcome} {f.place}" for f in done.findings if str(f.outcome) in ("rewritten", "repaired")][:10]


def refused_for_placement(done: PassReport, why: str) -> PassReport:
    """The report of a pass rolled back because it made placement worse: one refusal with the reason."""
    out = PassReport(done.pass_name)
    out.refused("<model>", f"refused for this model: its rewrite makes WebGPU placement worse ({why}); its changes "
                "were rolled back", rolled_back=_rolled_back(done))
    return out


def refused_for_invalid(done: PassReport, problems: list[Invalid]) -> PassReport:
    """The report of a pass rolled back because its output would not be a valid model where its input was one."""
    out = PassReport(done.pass_name)
    first = problems[0]
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    out.refused(first.where, f"refused for this model: its rewrite would not be a valid model at the model's own "
                f"opsets ({first.rule}: {first.reason}){more}; its changes were rolled back",
                rolled_back=_rolled_back(done), invalid=[f"{p.rule} {p.where}: {p.reason}" for p in problems[:10]])
    return out
