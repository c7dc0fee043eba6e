"""Mutants attacking ``longrope-concat``: the condition and branches of Phi-3's ``If(Greater(total, 32))`` switch.

The rewrite (one ``[small[:o]; large]`` table, WebGPU offset ``o``) is exact only for a switch of the form "large
exactly when total > o". A condition that is that form in disguise (``Less(32, total)``, ``Greater(2*total, 64)``,
``Greater(total + 8, 32)`` = total > 24, ``GreaterOrEqual(total, 32)`` = total > 31) has an exact rewrite with the
right ``o`` (expect "equivalent": the naive offset read from the constant is wrong, the right one or a refusal are
fine); a condition on anything but the total, or large-for-short choices, has none (expect "refuse").

Session mutants (class ``session``): ``multiRotaryCacheConcatOffset`` is one value for the whole session, applied by
WebGPU to every packed-QKV GroupQueryAttention with do_rotary=1. Layer 1 is made to read something else than layer
0's switch: a plain table, a second ``If`` at another (or the same) threshold, over other tables, or the same plain
table through separate Q/K/V (which WebGPU reads without the offset). The reference ("offset") emulates the offset
on every packed-QKV GroupQueryAttention of the output, as WebGPU does.
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


def both_read_total_plus1(work: Work) -> list[str]:
    """The If and every GroupQueryAttention read ``width + 1`` as the total: the condition is ``total > 32`` of the
    total GQA reads, but WebGPU's offset switches each row on ``seqlens_k + 1`` = the width, one token later."""
    if_node, greater = _switch(work)
    splice(work.graph, greater.inputs[0], lambda c, v: c.op("Add", v, c.scalar(1)), "total")
    return [if_node.name]


def seqlens_minus2(work: Work) -> list[str]:
    """Every GroupQueryAttention reads ``seqlens_k`` = row sums - 2: WebGPU's offset switches on ``seqlens_k + 1`` =
    width - 1, one token after the If (which switches on the width)."""
    if_node, _ = _switch(work)
    seqlens = gqas(work)[0].inputs[5]
    splice(work.graph, seqlens, lambda c, v: c.op("Sub", v, c.scalar(1, np.int32)), "seqlens")
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


# ------------------------------------------------------------------------------------------------------------
# Session: what layer 1 reads
# ------------------------------------------------------------------------------------------------------------
def gqas(work: Work) -> list[ir.Node]:
    return nodes_of(work.graph, "GroupQueryAttention")


def branch_tables(if_node: ir.Node, branch: str) -> list[np.ndarray]:
    """The constant tables an If branch returns, in output order."""
    graph = if_node.attributes[branch].value
    return [np.array(out.producer().attributes["value"].value.numpy()) for out in graph.outputs]


def rope_rows(table_cos: np.ndarray, table_sin: np.ndarray, rows: int, factor: float = 1.0) -> tuple[np.ndarray, ...]:
    """``rows`` rows of the RoPE whose row 0 is the scale and row 1 gives the frequencies (times ``factor``)."""
    c0, c1, s1 = (a.astype(np.float64) for a in (table_cos[0], table_cos[1], table_sin[1]))
    w = np.arctan2(s1, c1) * factor
    p = np.arange(rows, dtype=np.float64)[:, None]
    return (c0 * np.cos(p * w)).astype(table_cos.dtype), (c0 * np.sin(p * w)).astype(table_sin.dtype)


def feed_tables(work: Work, gqa: ir.Node, cos: np.ndarray, sin: np.ndarray, tag: str) -> None:
    """``gqa`` reads new initializers ``cos``/``sin`` as its caches (the other layers keep theirs)."""
    chain = Chain(work.graph, tag)
    gqa.replace_input_with(7, chain.const(cos))
    gqa.replace_input_with(8, chain.const(sin))


def unpack_qkv(work: Work, gqa: ir.Node) -> None:
    """``gqa`` fed separate q/k/v: a Split of its packed projection (the attention is the same tensors)."""
    packed = gqa.inputs[0]
    heads, kv = int(gqa.attributes["num_heads"].value), int(gqa.attributes["kv_num_heads"].value)
    head = packed.shape[2] // (heads + 2 * kv)
    sizes = [heads * head, kv * head, kv * head]
    chain = Chain(work.graph, "unpack")
    split = ir.node("Split", [packed, chain.i64(*sizes)], attributes={"axis": 2}, num_outputs=3,
                    name=f"{gqa.name}/mutant_split")
    for out, size, part in zip(split.outputs, sizes, "qkv"):
        out.name, out.dtype = f"{gqa.name}/mutant_{part}", packed.dtype
        out.shape = ir.Shape([packed.shape[0], packed.shape[1], size])
    work.graph.insert_before(gqa, split)
    for i in range(3):
        gqa.replace_input_with(i, split.outputs[i])


def _constant_branch(name: str, arrays: list[np.ndarray]) -> ir.Graph:
    nodes, outs = [], []
    for k, array in enumerate(arrays):
        node = ir.node("Constant", [], attributes={"value": ir.tensor(array, name=f"{name}/t{k}")},
                       name=f"{name}/Constant_{k}")
        node.outputs[0].name = f"{name}/table_{k}"
        node.outputs[0].dtype = ir.DataType.from_numpy(array.dtype)
        node.outputs[0].shape = ir.Shape(array.shape)
        nodes.append(node)
        outs.append(node.outputs[0])
    return ir.Graph([], outs, nodes=nodes, name=name)


def second_switch(condition, long_factor: float = 1.0):
    """Layer 1 reads a second ``If(condition(chain, total))`` whose branches are layer 0's tables (the long ones
    rebuilt with ``long_factor`` x their frequencies when it is not 1)."""
    def edit(work: Work) -> list[str]:
        if_node, greater = _switch(work)
        large, small = branch_tables(if_node, "then_branch"), branch_tables(if_node, "else_branch")
        if long_factor != 1.0:
            large = list(rope_rows(large[0], large[1], large[0].shape[0], long_factor))
        chain = Chain(work.graph, "second_switch")
        cond = condition(chain, greater.inputs[0], work)
        node = ir.node("If", [cond], num_outputs=2, name="/mutant/second_switch/If", attributes={
            "then_branch": ir.AttrGraph("then_branch", _constant_branch("mutant_then", large)),
            "else_branch": ir.AttrGraph("else_branch", _constant_branch("mutant_else", small))})
        for out, table, role in zip(node.outputs, large, ("cos", "sin")):
            out.name, out.dtype = f"/mutant/second_switch/{role}_cache", ir.DataType.from_numpy(table.dtype)
        chain.nodes.append(node)
        layer1 = gqas(work)[1]
        chain.insert([layer1])
        layer1.replace_input_with(7, node.outputs[0])
        layer1.replace_input_with(8, node.outputs[1])
        work.graph.sort()
        return [if_node.name, node.name]
    return edit


def greater_than(k: int, op: str = "Greater"):
    return lambda c, total, work: c.op(op, total, c.scalar(k), dtype=ir.DataType.BOOL)


def on_call_length(c: Chain, total: ir.Value, work: Work) -> ir.Value:
    ids = next(v for v in work.graph.inputs if v.name == "input_ids")
    length = c.op("Gather", c.op("Shape", ids, dtype=ir.DataType.INT64), c.scalar(1), dtype=ir.DataType.INT64,
                  axis=0)
    return c.op("Greater", length, c.scalar(32), dtype=ir.DataType.BOOL)


def layer1_plain(which: str, separate: bool = False):
    """Layer 1 reads a plain constant table: the If's long table (``"long"``) or the short RoPE continued to the
    long table's length (``"short"``); through separate Q/K/V with ``separate``."""
    def edit(work: Work) -> list[str]:
        if_node, _ = _switch(work)
        large, small = branch_tables(if_node, "then_branch"), branch_tables(if_node, "else_branch")
        cos, sin = large if which == "long" else rope_rows(small[0], small[1], large[0].shape[0])
        layer1 = gqas(work)[1]
        feed_tables(work, layer1, cos, sin, "layer1_plain")
        if separate:
            unpack_qkv(work, layer1)
        return [if_node.name]
    return edit


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
            m(base, short, "total-plus1-everywhere", REFUSE, both_read_total_plus1,
              "the If and GQA both read width + 1: the If switches at width > 31, WebGPU per row at seqlens_k + 1 "
              "= width > 32 (red team 32's phi3 control)"),
            m(base, short, "seqlens-minus2", REFUSE, seqlens_minus2,
              "GQA's seqlens_k is row sums - 2: WebGPU switches at seqlens_k + 1 = width - 1 > 32, the If at "
              "width > 32"),
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
    out += [
        m(CPU, "cpu", "layer1-plain-long", REFUSE, layer1_plain("long"),
          "layer 1 reads the long table as a plain table (no If): with the session-wide offset 32 it would read row "
          "32 + position past 32 tokens", cls="session"),
        m(CPU, "cpu", "layer1-plain-short-rope", REFUSE, layer1_plain("short"),
          "layer 1 reads plain RoPE with the short factors (256 rows): the offset would shift it past 32 tokens",
          cls="session"),
        m(CPU, "cpu", "layer1-separate-qkv-plain", EQUIVALENT, layer1_plain("long", separate=True),
          "layer 1 reads the long table through separate Q/K/V: WebGPU's separate-QKV rotary path ignores the offset, "
          "so only layer 0 is rewritten and read at the offset", cls="session"),
        m(CPU, "cpu", "second-switch-at-24", REFUSE, second_switch(greater_than(24)),
          "layer 1 reads a second If switching at total > 24, layer 0 at > 32: one offset cannot serve both",
          cls="session"),
        m(CPU, "cpu", "second-switch-greater-equal", REFUSE, second_switch(greater_than(32, "GreaterOrEqual")),
          "layer 1's If is GreaterOrEqual(total, 32) (switch at > 31), layer 0's Greater(total, 32): offsets 31/32",
          cls="session"),
        m(CPU, "cpu", "second-switch-on-call-length", REFUSE, second_switch(on_call_length),
          "layer 1's If switches on the call length (refused alone): rewriting layer 0's If and setting the offset "
          "would make layer 1 read its If's output at the offset", cls="session"),
        m(CPU, "cpu", "second-switch-same", EQUIVALENT, second_switch(greater_than(32)),
          "layer 1 reads a second If identical to layer 0's: both rewritten, one offset 32 is exact for both",
          cls="session"),
        m(CPU, "cpu", "second-switch-other-long-table", EQUIVALENT, second_switch(greater_than(32), 0.9),
          "layer 1's If switches at 32 too, to another long table (0.9x its frequencies): each layer reads its own "
          "[short; long] at offset 32, exact", cls="session"),
    ]
    return out
