"""Cross-cutting attacks (issue 18): values the graph computes trusted as if the caller gave them, constants in forms
a proof may not read, session-wide effects, values a pass removes that something else still reads.

* ``narrow-int64`` (``legacy/qwen25_vl/cpu_fp32``, 3D positions, ``webgpu-graph``): the token index
  ``Reshape(Range(0, B*S), [B, S])`` it narrows to int32, built by the graph from a large constant, or taken out of
  int32 and back, so that the narrowed copy wraps where the original does not.
* ``fold-text-mrope``, ``total-seq-on-gpu``: a value the rewrite removes or rewires is also a graph output or read
  inside an ``If`` body; constants the chains compare with written as ``Constant value_int(s)`` / ``Cast``.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from . import EQUIVALENT, REFUSE, Mutant, Work
from .edit import Chain, graph_input, node_named, nodes_of, splice
from .probes import as_graph_output, read_in_if

NARROW = "narrow-int64"
LEG_QWEN25 = "genai/legacy/qwen25_vl/cpu_fp32"
TWO_32 = 1 << 32
TWO_31 = 1 << 31


def _token_ranges(work: Work) -> list[ir.Node]:
    return [n for n in nodes_of(work.graph, "Range") if "_mrope/Range" in n.name]


def _narrow_places(work: Work) -> list[str]:
    """Every node: placement is a property of the whole graph, so whatever the pass narrows, anywhere, is judged
    (it reports no refusals: a Memcpy it cannot remove just stays)."""
    return [n.name for n in work.graph if n.name]


def range_from(start: int):
    """The token index Range starts at ``start`` (and its end moves with it), and ``start`` is subtracted again after
    the Reshape: the same token index, but the Reshape in between holds values past int32."""
    def edit(work: Work) -> list[str]:
        for rng in _token_ranges(work):
            (reshape,) = [u for u, _ in rng.outputs[0].uses()]
            chain = Chain(work.graph, "range")
            big = chain.scalar(start)
            rng.replace_input_with(0, big)
            end = chain.op("Add", rng.inputs[1], big, shape=ir.Shape([]))
            rng.replace_input_with(1, end)
            chain.insert([rng])
            splice(work.graph, reshape.outputs[0], lambda c, v: c.op("Sub", v, c.scalar(start), shape=v.shape),
                   "range_back")
        work.graph.sort()
        return _narrow_places(work)
    return edit


def out_and_back(offset: int):
    """token index + ``offset`` before the Reshape, - ``offset`` after it: an int64 round trip through values
    outside int32."""
    def edit(work: Work) -> list[str]:
        for rng in _token_ranges(work):
            splice(work.graph, rng.outputs[0], lambda c, v: c.op("Add", v, c.scalar(offset), shape=v.shape), "out")
            (reshape,) = [n for n in work.graph if n.op_type == "Reshape" and n.inputs[0] is not None
                          and n.inputs[0].producer() is not None
                          and n.inputs[0].producer().inputs[0] is rng.outputs[0]]
            splice(work.graph, reshape.outputs[0], lambda c, v: c.op("Sub", v, c.scalar(offset), shape=v.shape),
                   "back")
        return _narrow_places(work)
    return edit


def positions_plus(offset: int):
    """position_ids + ``offset`` - ``offset`` around the per-axis Gather the builder does (a computed value that
    leaves int32 between two ops the pass may narrow)."""
    def edit(work: Work) -> list[str]:
        pos = graph_input(work.graph, "position_ids")
        splice(work.graph, pos, lambda c, v: c.op("Sub", c.op("Add", v, c.scalar(offset)), c.scalar(offset),
                                                  shape=v.shape), "positions")
        return _narrow_places(work)
    return edit


def token_index_is_output(work: Work) -> list[str]:
    """Layer 0's q token index (what the pass narrows) is also a graph output."""
    places = _narrow_places(work)
    as_graph_output(work.graph, node_named(work.graph, places[0]).outputs[0], "mutant_token_index")
    return places


# ------------------------------------------------------------------------------------------------------------
# fold-text-mrope: what it removes, read elsewhere
# ------------------------------------------------------------------------------------------------------------
FOLD = "fold-text-mrope"
CUR_QWEN25 = "genai/current/qwen25_vl/cpu_fp32"
LEG_QWEN35_TEXT = "genai/legacy/qwen35/cpu_fp32_text"


def _gqa_places(work: Work) -> list[str]:
    return [n.name for n in nodes_of(work.graph, "GroupQueryAttention")]


def rotated_q_output(work: Work) -> list[str]:
    """Layer 0's rotated q (what GQA stops reading after the fold) is also a graph output."""
    (rot,) = [n for n in work.graph if n.op_type == "MRotaryEmbedding" and "layers.0/attn/q_rotary" in n.name]
    as_graph_output(work.graph, rot.outputs[0], "mutant_rotated_q")
    return _gqa_places(work)


def positions_read_in_if(work: Work) -> list[str]:
    """position_ids (the input the fold removes when nothing reads it) is also read inside an If body."""
    pos = graph_input(work.graph, "position_ids")
    chain = Chain(work.graph, "pos_float")
    as_float = chain.op("Cast", pos, dtype=ir.DataType.FLOAT, to=ir.DataType.FLOAT)
    chain.insert([])
    read_in_if(work.graph, as_float, "mutant_positions_sum")
    return _gqa_places(work)


def positions_read_directly_in_if(work: Work) -> list[str]:
    """position_ids itself is read inside an If body (the outer-scope reference is the graph input)."""
    read_in_if(work.graph, graph_input(work.graph, "position_ids"), "mutant_positions_sum")
    return _gqa_places(work)


def cos_table_output(work: Work) -> list[str]:
    """The manual form's per-token cos (what the fold removes) is also a graph output."""
    rot = next(n for n in work.graph if n.op_type == "RotaryEmbedding")
    as_graph_output(work.graph, rot.inputs[2], "mutant_cos_per_token")
    return _gqa_places(work)


# ------------------------------------------------------------------------------------------------------------
# total-seq-on-gpu: the old chain, read elsewhere; its constants in other forms
# ------------------------------------------------------------------------------------------------------------
TOTAL = "total-seq-on-gpu"
LLAMA = "genai/current/llama/cpu_fp32"
SUB = "/model/attn_mask_reformat/attn_mask_subgraph"


def _total_places(work: Work) -> list[str]:
    gqas = nodes_of(work.graph, "GroupQueryAttention")
    return [n.name for n in gqas] + sorted({n.inputs[6].name for n in gqas})


def old_total_output(work: Work) -> list[str]:
    """The old total_sequence_length (int32 Cast of Gather(Shape(mask), 1)) is also a graph output."""
    gqa = nodes_of(work.graph, "GroupQueryAttention")[0]
    as_graph_output(work.graph, gqa.inputs[6], "mutant_total")
    return _total_places(work)


def old_seqlens_in_if(work: Work) -> list[str]:
    """The old seqlens_k is also read inside an If body."""
    gqa = nodes_of(work.graph, "GroupQueryAttention")[0]
    chain = Chain(work.graph, "seqlens_float")
    as_float = chain.op("Cast", gqa.inputs[5], dtype=ir.DataType.FLOAT, to=ir.DataType.FLOAT)
    chain.insert([])
    read_in_if(work.graph, as_float, "mutant_seqlens_sum")
    return _total_places(work)


def constant_node(node: str, index: int, attrs: dict, dtype: ir.DataType, shape: list[int]):
    """The chain's ``node`` input ``index`` becomes a ``Constant`` node with ``attrs`` (value_int, value_ints...)."""
    def edit(work: Work) -> list[str]:
        n = node_named(work.graph, f"{SUB}/{node}")
        const = ir.node("Constant", [], attributes=attrs, name=f"/mutant/constant/{node}")
        const.outputs[0].name = f"/mutant/constant/{node}/output_0"
        const.outputs[0].dtype = dtype
        const.outputs[0].shape = ir.Shape(shape)
        work.graph.insert_before(n, const)
        n.replace_input_with(index, const.outputs[0])
        return _total_places(work)
    return edit


def cast_of_constant(node: str, index: int, value: np.ndarray):
    """The chain's ``node`` input ``index`` becomes ``Cast<int64>(float constant)``."""
    def edit(work: Work) -> list[str]:
        n = node_named(work.graph, f"{SUB}/{node}")
        chain = Chain(work.graph, "cast_const")
        cast = chain.op("Cast", chain.const(value.astype(np.float32)), dtype=ir.DataType.INT64, to=ir.DataType.INT64)
        chain.insert([n])
        n.replace_input_with(index, cast)
        return _total_places(work)
    return edit


def mutants() -> list[Mutant]:
    out = []

    def narrow(name, cls, expect, edit, why):
        out.append(Mutant(f"narrow-legqwen25-{name}", cls, NARROW, LEG_QWEN25, expect, edit, why,
                          target="webgpu-graph", reference="ort", calls=((0, 8, 1), (0, 3, 2), (5, 1, 2))))

    narrow("range-from-2p32", "constant-form", EQUIVALENT, range_from(TWO_32),
           "token index Range(2^32, 2^32 + B*S) - 2^32 after the Reshape: int32 wraps 2^32 + i to i, and the "
           "subtraction then gives i - 2^32")
    narrow("range-from-2p31", "constant-form", EQUIVALENT, range_from(TWO_31),
           "token index Range(2^31, ...) - 2^31: 2^31 + i wraps to a negative int32")
    narrow("out-and-back-2p32", "position-arithmetic", EQUIVALENT, out_and_back(TWO_32),
           "token index + 2^32 before the Reshape, - 2^32 after it")
    narrow("positions-out-and-back", "position-arithmetic", EQUIVALENT, positions_plus(TWO_32),
           "(position_ids + 2^32) - 2^32: the same positions, a computed detour outside int32")
    narrow("token-index-is-output", "graph-output", EQUIVALENT, token_index_is_output,
           "the narrowed Reshape's output is also a graph output (its int64 values must stay)")

    def fold(name, cls, expect, edit, why, base=CUR_QWEN25, reference="plugin", options=None):
        short = "curqwen25" if base == CUR_QWEN25 else "legqwen35text"
        out.append(Mutant(f"fold-{short}-{name}", cls, FOLD, base, expect, edit, why, target="webgpu",
                          options={"text_only": True} if options is None else options, reference=reference))

    fold("rotated-q-is-output", "graph-output", EQUIVALENT, rotated_q_output,
         "layer 0's rotated q is also a graph output: the fold must keep computing it")
    fold("positions-read-in-if", "subgraph", EQUIVALENT, positions_read_in_if,
         "position_ids (cast to float) is also read inside an If body: the input must stay")
    fold("positions-input-read-in-if", "subgraph", EQUIVALENT, positions_read_directly_in_if,
         "position_ids itself is read inside an If body: the input must stay")
    fold("cos-per-token-is-output", "graph-output", EQUIVALENT, cos_table_output,
         "the per-token cos the fold removes is also a graph output", base=LEG_QWEN35_TEXT, reference="ort",
         options={})
    fold("positions-input-read-in-if", "subgraph", EQUIVALENT, positions_read_directly_in_if,
         "the 2D position input is also read inside an If body", base=LEG_QWEN35_TEXT, reference="ort", options={})

    def total(name, cls, expect, edit, why):
        out.append(Mutant(f"totalseq-llama-{name}", cls, TOTAL, LLAMA, expect, edit, why, target="webgpu-graph",
                          reference="ort"))

    total("old-total-is-output", "graph-output", EQUIVALENT, old_total_output,
          "the old total_sequence_length is also a graph output")
    total("old-seqlens-read-in-if", "subgraph", EQUIVALENT, old_seqlens_in_if,
          "the old seqlens_k is also read inside an If body")
    total("sub-two-value-ints", "constant-form", REFUSE,
          constant_node("Sub", 1, {"value_ints": [2]}, ir.DataType.INT64, [1]),
          "seqlens_k = ReduceSum(mask) - Constant(value_ints=[2])")
    total("sub-two-value-int", "constant-form", REFUSE,
          constant_node("Sub", 1, {"value_int": 2}, ir.DataType.INT64, []),
          "seqlens_k = ReduceSum(mask) - Constant(value_int=2)")
    total("sub-one-value-int", "constant-form", EQUIVALENT,
          constant_node("Sub", 1, {"value_int": 1}, ir.DataType.INT64, []),
          "seqlens_k = ReduceSum(mask) - Constant(value_int=1): the builder's chain")
    total("gather-dim0-value-int", "constant-form", REFUSE,
          constant_node("Gather", 1, {"value_int": 0}, ir.DataType.INT64, []),
          "total_sequence_length = Shape(mask)[Constant(value_int=0)]: the batch")
    total("sub-two-cast", "constant-form", REFUSE, cast_of_constant("Sub", 1, np.array([2.0])),
          "seqlens_k = ReduceSum(mask) - Cast<int64>(2.0)")
    total("gather-dim0-cast", "constant-form", REFUSE, cast_of_constant("Gather", 1, np.array(0.0)),
          "total_sequence_length = Shape(mask)[Cast<int64>(0.0)]: the batch")
    return out
