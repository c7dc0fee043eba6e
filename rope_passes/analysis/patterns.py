"""Graph patterns on the onnxscript rewriter API: structure matched by onnxscript, soundness checked with a reason.

Each pattern is an :class:`onnxscript.rewriter.pattern.PatternBase`: ``pattern()`` states the node structure (matched
by onnxscript's ``SimplePatternMatcher``, so commuted inputs, extra attributes and the like are its business, not
ours) and ``check()`` states when the match is *sound to rewrite*, failing with ``MatchResult.fail(reason)``. A pass
reads the outcome through :meth:`ValuePattern.match_value`, which tells three cases apart:

* matched (``ValueMatch.ok``): the bindings (graph input, constants, the named intermediate values) and the nodes;
* refused: the structure is there but ``check`` failed; the reason is onnxscript's ``MatchResult.reason``;
* not matched: the structure is not there; the reason names what produces the value instead.

The patterns here are the ones the graph-capture passes rewrite (onnxruntime-genai's GQA length subgraphs and the
LongRoPE cache switch's condition).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

import onnx_ir as ir
from onnxscript.rewriter import pattern as orp

from rope_passes.analysis.graph import attr, const_array

__all__ = [
    "MASK_INPUT",
    "LongRoPESwitchCondition",
    "SeqlensFromMaskSum",
    "TotalSeqFromMaskShape",
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


def _single_int(value: ir.Value | None) -> int | None:
    arr = const_array(value)
    if arr is None or arr.size != 1 or arr.dtype.kind not in "iu":
        return None
    return int(arr.reshape(-1)[0])


#: the attention mask's graph input name where no genai_config names it
MASK_INPUT = "attention_mask"


def _mask_problem(mask: ir.Value, names: Collection[str]) -> str | None:
    """Why ``mask`` is not the attention mask: a rank-2 integer graph input named as genai_config's
    ``attention_mask`` input (``names``). A rank-2 integer input alone proves nothing: ``input_ids`` has that look."""
    if not mask.is_graph_input():
        return f"{mask.name!r} is not a graph input (the attention mask is expected as one)"
    if mask.name not in names:
        return (f"{mask.name!r} is not the attention mask (the graph input {' / '.join(map(repr, sorted(names)))}, "
                "genai_config's decoder input attention_mask)")
    if mask.dtype not in (ir.DataType.INT64, ir.DataType.INT32):
        return f"mask {mask.name!r} has dtype {mask.dtype}, expected int64/int32"
    if mask.shape is not None and len(mask.shape) != 2:
        return f"mask {mask.name!r} has rank {len(mask.shape)}, expected [batch, total_sequence_length]"
    return None


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


class MaskPattern(ValuePattern):
    """A pattern over the attention mask: ``mask_names`` are the graph input names the mask may have."""

    def __init__(self, mask_names: Collection[str] = (MASK_INPUT,)) -> None:
        super().__init__()
        self.mask_names = frozenset(mask_names)


class TotalSeqFromMaskShape(MaskPattern):
    """``Cast<int32>(Gather(Shape(mask), 1))``: onnxruntime-genai's total_sequence_length (the mask's width, on CPU)."""

    expected = "Cast<int32>(Gather(Shape(mask), 1))"

    def pattern(self, op, mask, index):
        dim = op.Gather(op.Shape(mask, _outputs=["mask_shape"]), index, _outputs=["mask_width"])
        return op.Cast(dim, to=ir.DataType.INT32)

    # onnxscript calls check(context, **bindings): the parameters are the pattern's names, hence type: ignore[override]
    def check(self, context, mask, index, mask_shape, mask_width, **_) -> orp.MatchResult:  # type: ignore[override]
        result = orp.MatchResult()
        shape, gather = mask_shape.producer(), mask_width.producer()
        if attr(shape, "start", 0) != 0 or attr(shape, "end") is not None:
            return result.fail(f"Shape {shape.name!r} has start/end attributes", shape)
        position = _single_int(index)
        if attr(gather, "axis", 0) != 0 or position not in (1, -1):
            return result.fail(f"Gather {gather.name!r} reads dimension {position}, not the mask's dimension 1", gather)
        problem = _mask_problem(mask, self.mask_names)
        return result.fail(problem, mask) if problem else result


class SeqlensFromMaskSum(MaskPattern):
    """``Cast<int32>(Sub(ReduceSum(mask, axes=[1]), 1))``: seqlens_k, the mask's row sums minus one (int64 on CPU).

    Two forms, one value: onnxruntime-genai's builder reduces with ``keepdims=0`` (``[batch]``); mobius-onnx 0.1.0
    keeps the dimension (``keepdims`` 1, its default) and subtracts a ``[1]`` constant (``[batch, 1]``).
    GroupQueryAttention reads seqlens_k as ``batch`` int32 values by flat index (its check asks ``dims[0] ==
    batch`` only), and ``[batch, 1]`` holds row ``b``'s length at flat index ``b`` as ``[batch]`` does: the
    rewrite's ``[batch]`` seqlens_k gives GQA the same numbers for every mask. Sound only while the Sub keeps that
    shape (``1`` of rank <= 1 with keepdims 0, <= 2 with keepdims 1): a wider constant moves the batch off
    dimension 0 and is refused.
    """

    expected = "Cast<int32>(Sub(ReduceSum(mask), 1))"

    def pattern(self, op, mask, one):
        row_sum = op.ReduceSum(mask, _allow_other_inputs=True, _outputs=["row_sum"])
        return op.Cast(op.Sub(row_sum, one, _outputs=["minus_one"]), to=ir.DataType.INT32)

    def check(self, context, mask, one, row_sum, minus_one, **_) -> orp.MatchResult:  # type: ignore[override]
        result = orp.MatchResult()
        sub = minus_one.producer()
        if _single_int(one) != 1:
            return result.fail(f"Sub {sub.name!r} subtracts something other than the constant 1", sub)
        reduce = row_sum.producer()
        axes = const_array(reduce.inputs[1]) if len(reduce.inputs) > 1 and reduce.inputs[1] is not None else None
        axes_list = [int(a) for a in (axes.reshape(-1) if axes is not None else (attr(reduce, "axes") or []))]
        keepdims = attr(reduce, "keepdims", 1)
        if axes_list not in ([1], [-1]) or keepdims not in (0, 1):
            return result.fail(f"ReduceSum {reduce.name!r} reduces axes {axes_list} with keepdims={keepdims}, "
                               "expected axes [1] (keepdims 0 or 1)", reduce)
        one_rank = const_array(one).ndim  # a constant: _single_int read it
        if one_rank > 1 + keepdims:
            return result.fail(f"Sub {sub.name!r} broadcasts the row sums (rank {1 + keepdims}) with a rank-{one_rank} "
                               "constant: the batch leaves dimension 0 of seqlens_k", sub)
        problem = _mask_problem(mask, self.mask_names)
        return result.fail(problem, mask) if problem else result


class LongRoPESwitchCondition(ValuePattern):
    """``Greater(length, original)``: the condition of onnxruntime-genai's LongRoPE cache ``If`` (and of the ``Where``
    on inv_freq in transformers exports), read for its constant threshold.

    Structure only: ``length`` is bound to whatever Greater compares. That it is the total sequence length, and that
    the condition is ``total > offset`` for one offset, is proved numerically by
    :func:`rope_passes.analysis.longrope.switch_offset` before anything is rewritten on it.
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
