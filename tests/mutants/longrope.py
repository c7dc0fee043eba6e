"""Mutants attacking ``longrope-concat``: the condition and branches of Phi-3's ``If(Greater(total, 32))`` switch.

The rewrite (one ``[small[:o]; large]`` table, WebGPU offset ``o``) is exact only for a switch of the form "large
exactly when total > o". A condition that is that form in disguise (``Less(32, total)``, ``Greater(2*total, 64)``,
``Greater(total + 8, 32)`` = total > 24, ``GreaterOrEqual(total, 32)`` = total > 31) has an exact rewrite with the
right ``o`` (expect "equivalent": the naive offset read from the constant is wrong, the right one or a refusal are
fine); a condition on anything but the total, or large-for-short choices, has none (expect "refuse").
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from . import EQUIVALENT, LONGROPE_CALLS, REFUSE, Mutant, Work
from .edit import Chain, nodes_of, splice

PASS = "longrope-concat"
CPU = "genai/current/phi3_mini_128k/cpu_fp32"
WEBGPU = "genai/current/phi3_mini_128k/webgpu_fp32"


def _switch(work: Work) -> tuple[ir.Node, ir.Node]:
    (if_node,) = nodes_of(work.graph, "If")
    greater = if_node.inputs[0].producer()
    assert greater is not None and greater.op_type == "Greater"
    return if_node, greater


def on_total(transform):
    """``Greater(transform(total), 32)``."""
    def edit(work: Work) -> list[str]:
        if_node, greater = _switch(work)
        splice(work.graph, greater.inputs[0], transform, "switch", keep=lambda u: u is greater)
        return [if_node.name]
    return edit


def total_plus(k: int):
    return on_total(lambda c, v: c.op("Add", v, c.scalar(k)))


def total_times(k: int, threshold: int):
    def edit(work: Work) -> list[str]:
        places = on_total(lambda c, v: c.op("Mul", v, c.scalar(k)))(work)
        threshold_is(threshold)(work)
        return places
    return edit


def call_length(work: Work) -> list[str]:
    """``Greater(Shape(input_ids)[1], 32)``: the call's length, not the total."""
    if_node, greater = _switch(work)
    chain = Chain(work.graph, "switch")
    ids = next(v for v in work.graph.inputs if v.name == "input_ids")
    shape = chain.op("Shape", ids, dtype=ir.DataType.INT64)
    length = chain.op("Gather", shape, chain.scalar(1), dtype=ir.DataType.INT64, axis=0)
    chain.insert([greater])
    greater.replace_input_with(0, length)
    work.graph.sort()
    return [if_node.name]


def call_length_or_total(work: Work) -> list[str]:
    """``Greater(Max(total, 11 * call length), 32)``: long past 32 tokens, and also for any call of 3+ new tokens."""
    if_node, greater = _switch(work)
    total = greater.inputs[0]
    chain = Chain(work.graph, "switch")
    ids = next(v for v in work.graph.inputs if v.name == "input_ids")
    shape = chain.op("Shape", ids, dtype=ir.DataType.INT64)
    length = chain.op("Gather", shape, chain.scalar(1), dtype=ir.DataType.INT64, axis=0)
    either = chain.op("Max", total, chain.op("Mul", length, chain.scalar(11)))
    chain.insert([greater])
    greater.replace_input_with(0, either)
    work.graph.sort()
    return [if_node.name]


def threshold_is(k: int):
    def edit(work: Work) -> list[str]:
        if_node, greater = _switch(work)
        chain = Chain(work.graph, "threshold")
        greater.replace_input_with(1, chain.scalar(k))
        return [if_node.name]
    return edit


def compare_with(op_type: str, swap: bool = False):
    """The Greater replaced by ``op_type`` (on swapped operands with ``swap``)."""
    def edit(work: Work) -> list[str]:
        if_node, greater = _switch(work)
        a, b = greater.inputs[0], greater.inputs[1]
        node = ir.node(op_type, [b, a] if swap else [a, b], name=f"/mutant/switch/{op_type}")
        node.outputs[0].name = f"{node.name}/output_0"
        node.outputs[0].dtype = ir.DataType.BOOL
        work.graph.insert_before(greater, node)
        greater.outputs[0].replace_all_uses_with(node.outputs[0])
        work.graph.remove(greater, safe=True)
        return [if_node.name]
    return edit


def swap_branches(work: Work) -> list[str]:
    if_node, _ = _switch(work)
    then, other = if_node.attributes["then_branch"].value, if_node.attributes["else_branch"].value
    if_node.attributes["then_branch"] = ir.AttrGraph("then_branch", other)
    if_node.attributes["else_branch"] = ir.AttrGraph("else_branch", then)
    return [if_node.name]


def _branch_constants(branch: ir.Graph) -> list[ir.Node]:
    return [out.producer() for out in branch.outputs]


def both_long(work: Work) -> list[str]:
    """The else branch returns the long tables too (always long: [large[:32]; large] + offset is exact)."""
    if_node, _ = _switch(work)
    then, other = if_node.attributes["then_branch"].value, if_node.attributes["else_branch"].value
    for src, dst in zip(_branch_constants(then), _branch_constants(other), strict=True):
        array = src.attributes["value"].value.numpy()
        dst.attributes["value"] = ir.AttrTensor("value", ir.tensor(np.array(array), name=dst.outputs[0].name))
    return [if_node.name]


def cos_sin_swapped(work: Work) -> list[str]:
    """Both branches return (sin, cos) instead of (cos, sin): odd, but the concatenation keeps it."""
    if_node, _ = _switch(work)
    for key in ("then_branch", "else_branch"):
        branch = if_node.attributes[key].value
        first, second = branch.outputs[0], branch.outputs[1]
        branch.outputs[0], branch.outputs[1] = second, first
    return [if_node.name]


def mutants() -> list[Mutant]:
    def m(base, short, name, expect, edit, why, cls="switch"):
        return Mutant(f"longrope-{short}-{name}", cls, PASS, base, expect, edit, why, target="webgpu-graph",
                      reference="offset", calls=LONGROPE_CALLS)

    out = []
    for base, short, full in ((CPU, "cpu", True), (WEBGPU, "webgpu", False)):
        out += [
            m(base, short, "total-plus8", EQUIVALENT, total_plus(8),
              "Greater(total + 8, 32) switches at total > 24: offset 32 (read from the constant) is wrong, 24 right"),
            m(base, short, "call-length", REFUSE, call_length,
              "Greater(call length, 32): the long table only for calls of > 32 new tokens; no offset expresses it "
              "(the mutant itself fails past 32 tokens: its short table has 32 rows)"),
            m(base, short, "call-length-or-total", REFUSE, call_length_or_total,
              "Greater(Max(total, 11 * call length), 32): long past 32 tokens and for every call of 3+ new tokens; "
              "no offset expresses it"),
            m(base, short, "less", REFUSE, compare_with("Less"),
              "Less(total, 32): the long table for short contexts; no offset expresses it"),
            m(base, short, "identity-total", EQUIVALENT, on_total(lambda c, v: c.op("Identity", v)),
              "Greater(Identity(total), 32)", cls="harmless"),
        ]
        if not full:
            continue
        out += [
            m(base, short, "threshold-16", EQUIVALENT, threshold_is(16),
              "Greater(total, 16): offset 16 with [small[:16]; large] is exact"),
            m(base, short, "threshold-40", REFUSE, threshold_is(40),
              "Greater(total, 40): totals 33..40 read rows 32..39 of a 32-row short table"),
            m(base, short, "less-swapped", EQUIVALENT, compare_with("Less", swap=True),
              "Less(32, total) is Greater(total, 32)"),
            m(base, short, "greater-equal", EQUIVALENT, compare_with("GreaterOrEqual"),
              "GreaterOrEqual(total, 32) switches at total > 31: offset 32 is wrong at total 32, 31 right"),
            m(base, short, "greater-swapped", REFUSE, compare_with("Greater", swap=True),
              "Greater(32, total): the long table for short contexts"),
            m(base, short, "total-times2-64", EQUIVALENT, total_times(2, 64),
              "Greater(2 * total, 64) is total > 32: offset 64 (read from the constant) is wrong, 32 right"),
            m(base, short, "total-minus8", REFUSE, total_plus(-8),
              "Greater(total - 8, 32) switches at total > 40, but the short table has only 32 rows"),
            m(base, short, "swapped-branches", REFUSE, swap_branches,
              "then = short, else = long: the long table for short contexts"),
            m(base, short, "both-long", EQUIVALENT, both_long,
              "both branches return the long tables: [large[:32]; large] with offset 32 is exact"),
            m(base, short, "cos-sin-swapped", EQUIVALENT, cos_sin_swapped,
              "both branches return (sin, cos): kept in order by the concatenation", cls="harmless"),
        ]
    return out
