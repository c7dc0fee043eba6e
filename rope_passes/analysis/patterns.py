"""Graph patterns on the onnxscript rewriter API: structure matched by onnxscript, soundness checked with a reason.

Each pattern is an :class:`onnxscript.rewriter.pattern.PatternBase`: ``pattern()`` states the node structure (matched
by onnxscript's ``SimplePatternMatcher``, so commuted inputs, extra attributes and the like are its business, not
ours) and ``check()`` states when the match is *sound to rewrite*, failing with ``MatchResult.fail(reason)``. A pass
reads the outcome through :meth:`ValuePattern.match_value`, which tells three cases apart:

* matched (``ValueMatch.ok``): the bindings (graph input, constants, the named intermediate values) and the nodes;
* refused: the structure is there but ``check`` failed; the reason is onnxscript's ``MatchResult.reason``;
* not matched: the structure is not there; the reason names what produces the value instead.

The pattern here is the LongRoPE cache switch's condition (read for its threshold; what it computes is proved by
value in :func:`rope_passes.analysis.longrope_switch.switch_offset`). GroupQueryAttention's length inputs are proved by value,
whatever nodes compute them (:mod:`rope_passes.proofs.mask_lengths`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import onnx_ir as ir
from onnxscript.rewriter import pattern as orp

from rope_passes.analysis.graph import const_array

__all__ = [
    "LongRoPESwitchCondition",
    "ValueMatch",
    "ValuePattern",
]


@dataclasses.dataclass
class ValueMatch:
    ok: bool
    refused: bool = False  # the structure matched, the soundness check failed
    reason: str = ""
    bindings: dict[str, Any] = dataclasses.field(default_factory=dict)
    nodes: list[ir.Node] = dataclasses.field(default_factory=list)


class ValuePattern(orp.PatternBase):
    """A pattern whose root node is the producer of one given value."""

    #: what the value is expected to be computed as, for "not matched" reasons
    expected: str = ""

    def match_value(self, model: ir.Model, value: ir.Value, what: str) -> ValueMatch:
        node = value.producer()
        if node is None:
            return ValueMatch(False, reason=f"{what} is a graph input or initializer, not {self.expected}")
        graph = node.graph if node.graph is not None else model.graph
        tracer = orp.MatchingTracer()
        result = self.match(model, graph, node, check_nodes_are_removable=False, tracer=tracer)
        if result:
            return ValueMatch(True, bindings=dict(result.bindings), nodes=list(result.nodes))
        for infos in tracer.best_matches_map.values():
            for info in infos:
                if info.root_node is node and info.status is orp.MatchStatus.CONDITION_FAILED:
                    return ValueMatch(False, refused=True, reason=info.match_result.reason)
        detail = f" ({result.reason})" if result is not None and result.reason else ""
        return ValueMatch(False, reason=f"{what} comes from {node.op_type} {node.name!r}, not {self.expected}{detail}")


class LongRoPESwitchCondition(ValuePattern):
    """``Greater(length, original)``: the condition of onnxruntime-genai's LongRoPE cache ``If`` (and of the ``Where``
    on inv_freq in transformers exports), read for its constant threshold.

    Structure only: ``length`` is bound to whatever Greater compares. That it is the total sequence length, and that
    the condition is ``total > offset`` for one offset, is proved numerically by
    :func:`rope_passes.analysis.longrope_switch.switch_offset` before anything is rewritten on it.
    """

    expected = "Greater(total_length, original)"

    def pattern(self, op, total_length, original):
        return op.Greater(total_length, original)

    def check(self, context, total_length, original, **_) -> orp.MatchResult:  # type: ignore[override]
        result = orp.MatchResult()
        threshold = const_array(original)
        if threshold is None or threshold.size != 1:
            return result.fail("Greater's threshold is not a constant", original)
        return result
