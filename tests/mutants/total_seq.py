"""Mutants attacking ``total-seq-on-gpu``: GroupQueryAttention's seqlens_k / total_sequence_length chains.

The rewrite (int32 ``ReduceSum`` of the mask; the total as the width: a row of ones summed) is exact when both chains
read the attention mask. The mutants feed them something else that has the mask's look (a rank-2 int64 graph input:
``input_ids``), or alter the chain around the mask (another dimension, another subtrahend, a sliced mask), or make
harmless detours (Identity, a float round trip, + 0) that the pattern may not see through.

``narrow-int64`` runs right after it in the ``webgpu-graph`` preset; its mutants here (issue 18: values the graph
computes are not the caller's) start from builder 0.15 Qwen3.5 (``legacy/qwen35/cpu_fp32``), whose synthetic token
index ``Reshape(Range(0, B*S, 1), [B, S])`` the pass narrows to int32. The Range is moved out of int32 by a start
constant spelled in several forms (its end moves with it) and the start is subtracted again after the Reshape: the
original computes the same token index, a narrowed Reshape would wrap.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from . import EQUIVALENT, REFUSE, Mutant, Work
from .edit import Chain, graph_input, node_named, nodes_of, splice

PASS = "total-seq-on-gpu"
CPU = "genai/current/llama/cpu_fp32"
FP16 = "genai/current/llama/webgpu_fp16"
SUB = "/model/attn_mask_reformat/attn_mask_subgraph"


def _places(work: Work) -> list[str]:
    gqas = [n for n in work.graph if n.op_type == "GroupQueryAttention"]
    return [n.name for n in gqas] + sorted({n.inputs[6].name for n in gqas})


def reads(node: str, source: str):
    """The chain's ``node`` (Shape or ReduceSum) reads graph input ``source`` instead of the mask."""
    def edit(work: Work) -> list[str]:
        n = node_named(work.graph, f"{SUB}/{node}")
        n.replace_input_with(0, graph_input(work.graph, source))
        return _places(work)
    return edit


def total_from_ids_seqlens_other(work: Work) -> list[str]:
    """total_sequence_length = Shape(input_ids)[1]; seqlens_k computed the same as before but through an Identity
    (so the pass, not matching it, rewrites the total alone)."""
    seqlens = node_named(work.graph, f"{SUB}/Sub/Cast").outputs[0]
    splice(work.graph, seqlens, lambda c, v: c.op("Identity", v), "seqlens")
    return reads("Shape", "input_ids")(work)


def on_mask(build, only: str | None = None):
    def edit(work: Work) -> list[str]:
        keep = None if only is None else (lambda u: u.name == f"{SUB}/{only}")
        splice(work.graph, graph_input(work.graph, "attention_mask"), build, "mask", keep=keep)
        return _places(work)
    return edit


def constant_input(node: str, index: int, value):
    def edit(work: Work) -> list[str]:
        n = node_named(work.graph, f"{SUB}/{node}")
        chain = Chain(work.graph, "const")
        n.replace_input_with(index, chain.const(value))
        return _places(work)
    return edit


def overridable_input(node: str, index: int, value):
    """The chain's constant as an initializer that is also a graph input (keep_initializers_as_inputs exports): its
    default is the builder's, but a caller may feed another value."""
    def edit(work: Work) -> list[str]:
        n = node_named(work.graph, f"{SUB}/{node}")
        constant = Chain(work.graph, "overridable").const(value)
        work.graph.inputs.append(constant)
        n.replace_input_with(index, constant)
        return _places(work)
    return edit


def total_plus_zero(work: Work) -> list[str]:
    gather = node_named(work.graph, f"{SUB}/Gather").outputs[0]
    splice(work.graph, gather, lambda c, v: c.op("Add", v, c.scalar(0)), "total")
    return _places(work)


NARROW = "narrow-int64"
QWEN35 = "genai/legacy/qwen35/cpu_fp32"
SYNTHETIC = "/model/attn/synthetic_pos_ids"


def _start_forms():
    def value_int(c: Chain, k: int) -> ir.Value:
        return c.op("Constant", dtype=ir.DataType.INT64, value_int=k)

    def cast_float(c: Chain, k: int) -> ir.Value:
        return c.op("Cast", c.op("Constant", dtype=ir.DataType.FLOAT, value_float=float(k)), dtype=ir.DataType.INT64,
                    to=ir.DataType.INT64)

    def gather_concat(c: Chain, k: int) -> ir.Value:
        both = c.op("Concat", c.i64(0), c.op("Constant", dtype=ir.DataType.INT64, value_ints=[k]), axis=0)
        return c.op("Gather", both, c.scalar(1), dtype=ir.DataType.INT64, axis=0)

    def initializer(c: Chain, k: int) -> ir.Value:
        return c.scalar(k)

    return {"value-int": value_int, "cast-float": cast_float, "gather-concat": gather_concat,
            "initializer": initializer}


START_FORMS = _start_forms()


def synthetic_from(start: int, form):
    """The token index Range starts at ``start`` (spelled by ``form``; its end moves with it) and ``start`` is
    subtracted after the Reshape: the same token index, the Reshape in between holding ``start + i``."""
    def edit(work: Work) -> list[str]:
        (rng,) = [n for n in nodes_of(work.graph, "Range") if n.name.startswith(SYNTHETIC)]
        reshape = node_named(work.graph, f"{SYNTHETIC}/Reshape")
        chain = Chain(work.graph, "synthetic")
        big = form(chain, start)
        rng.replace_input_with(0, big)
        rng.replace_input_with(1, chain.op("Add", rng.inputs[1], big, shape=ir.Shape([])))
        chain.insert([rng])
        splice(work.graph, reshape.outputs[0], lambda c, v: c.op("Sub", v, form(c, start), shape=v.shape), "back")
        work.graph.sort()
        return [reshape.name]
    return edit


def mutants() -> list[Mutant]:
    def m(base, short, name, expect, edit, why, cls="mask", fp16=False):
        return Mutant(f"totalseq-{short}-{name}", cls, PASS, base, expect, edit, why, target="webgpu-graph",
                      reference="ort", fp16=fp16)

    roundtrip = lambda c, v: c.op("Cast", c.op("Cast", v, dtype=ir.DataType.FLOAT, to=ir.DataType.FLOAT),  # noqa: E731
                                  dtype=ir.DataType.INT64, to=ir.DataType.INT64)
    out = []
    for form_name, form in START_FORMS.items():
        out.append(Mutant(f"narrow-qwen35-synthetic-from-2p32-{form_name}", "constant-form", NARROW, QWEN35, EQUIVALENT,
                          synthetic_from(1 << 32, form), f"token index Range(2^32, 2^32 + B*S) (2^32 as {form_name}), "
                          "- 2^32 after the Reshape: a narrowed Reshape wraps 2^32 + i to i", target="webgpu-graph",
                          reference="ort", calls=((0, 8, 1), (0, 3, 2), (5, 1, 2))))
    out.append(Mutant("narrow-qwen35-synthetic-from-0-gather-concat", "constant-form", NARROW, QWEN35, EQUIVALENT,
                      synthetic_from(0, START_FORMS["gather-concat"]), "token index Range(0, B*S) with its 0 written "
                      "as Gather(Concat(...)): proved to fit int32 by value, narrowed as before", target="webgpu-graph",
                      reference="ort", calls=((0, 8, 1), (0, 3, 2), (5, 1, 2))))
    for base, short, full in ((CPU, "cpu", True), (FP16, "fp16", False)):
        f16 = base == FP16
        out += [
            m(base, short, "total-from-ids", REFUSE, total_from_ids_seqlens_other,
              "total_sequence_length = Shape(input_ids)[1] (the call length) and seqlens_k not matched: input_ids "
              "has the mask's look (rank-2 int64 graph input) but its row sums are token ids", fp16=f16),
            m(base, short, "mask-identity", EQUIVALENT, on_mask(lambda c, v: c.op("Identity", v)),
              "the mask through an Identity", cls="harmless", fp16=f16),
        ]
        if not full:
            continue
        out += [
            m(base, short, "total-shape-of-ids", REFUSE, reads("Shape", "input_ids"),
              "total_sequence_length = Shape(input_ids)[1], seqlens_k from the mask"),
            m(base, short, "seqlens-sum-of-ids", REFUSE, reads("ReduceSum", "input_ids"),
              "seqlens_k = ReduceSum(input_ids) - 1, total from the mask"),
            m(base, short, "mask-float-roundtrip", EQUIVALENT, on_mask(roundtrip),
              "the mask cast to float and back (same values)", cls="harmless"),
            m(base, short, "gather-dim0", REFUSE, constant_input("Gather", 1, np.array(0, np.int64)),
              "total_sequence_length = the mask's batch dimension"),
            m(base, short, "sub-two", REFUSE, constant_input("Sub", 1, np.array([2], np.int64)),
              "seqlens_k = ReduceSum(mask) - 2"),
            m(base, short, "total-plus-zero", EQUIVALENT, total_plus_zero, "total_sequence_length + 0",
              cls="harmless"),
            m(base, short, "sub-one-overridable", REFUSE, overridable_input("Sub", 1, np.array([1], np.int64)),
              "seqlens_k = ReduceSum(mask) - s, s a graph input whose default is 1"),
            m(base, short, "gather-dim-overridable", REFUSE, overridable_input("Gather", 1, np.array(1, np.int64)),
              "total_sequence_length = Shape(mask)[d], d a graph input whose default is 1"),
            m(base, short, "total-of-sliced-mask", REFUSE, on_mask(lambda c, v: c.op(
                "Slice", v, c.i64(1), c.i64(1 << 40), c.i64(1)), only="Shape"),
              "total_sequence_length = width of mask[:, 1:] (one less)"),
        ]
    return out
