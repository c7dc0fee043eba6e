"""Mutants attacking ``precompute-cos-sin`` on the torch exports (tf5 dynamo, tf4 TorchScript Llama decode graphs).

The pass replaces the per-call cos/sin chain by a table lookup when its numeric probes (positions 0..N-1, a
permutation, a [2, 3] call) show every row depends on its own position only. Per-token arithmetic is absorbed by
the table (expect "equivalent"); a per-call choice the probes never exercise is not (expect "refuse"): a short/long
blend switched by the call's largest/last position, its length, or a single-token flag, written without Where and,
for some, without any Reduce op.
"""

from __future__ import annotations

import onnx_ir as ir

from . import EQUIVALENT, REFUSE, Mutant, Work
from . import transforms as t
from .edit import graph_input, splice

PASS = "precompute-cos-sin"
TF5 = "torch/tf5/dynamo/llama/decode.onnx"
TF4 = "torch/tf4/torchscript/llama/decode.onnx"


def _trig(graph: ir.Graph) -> list[str]:
    return [n.name for n in graph if n.op_type in ("Cos", "Sin")]


def positions(transform):
    def edit(work: Work) -> list[str]:
        splice(work.graph, graph_input(work.graph, "position_ids"), transform, "positions")
        return _trig(work.graph)
    return edit


def _inv_freq_side(graph: ir.Graph) -> tuple[ir.Value, ir.Node]:
    """(the inv_freq operand of the positions x inv_freq product, the product node)."""
    for name, value in graph.initializers.items():
        if "inv_freq" in name:
            (user,) = [u for u, _ in value.uses()]
            return value, user
    product = next(n for n in graph if n.op_type == "MatMul" and "rotary_emb" in (n.name or ""))
    return product.inputs[0], product


def blend(flag):
    """inv_freq -> inv_freq * (1 - flag) + inv_freq / 4 * flag, ``flag`` computed from the positions per call."""
    def edit(work: Work) -> list[str]:
        value, product = _inv_freq_side(work.graph)
        pos = graph_input(work.graph, "position_ids")
        splice(work.graph, value, lambda c, v: t.blend(flag)(c, v, pos), "blend", keep=lambda u: u is product)
        return _trig(work.graph)
    return edit


def mutants() -> list[Mutant]:
    def m(base, short, name, cls, expect, edit, why):
        return Mutant(f"precompute-{short}-{name}", cls, PASS, base, expect, edit, why, target="exporter",
                      options={"max_positions": 256}, reference="ort")

    never = "a per-call switch the probes (0..255, a permutation, a [2, 3] call of random positions) never flip"
    out = []
    for base, short, full in ((TF5, "tf5", True), (TF4, "tf4", False)):
        out += [
            m(base, short, "blend-reducemax", "blend", REFUSE, blend(t.switch_reducemax),
              "short/long blend by Cast(ReduceMax(positions) + 1 > 32), no Where"),
            m(base, short, "blend-maxpool", "blend", REFUSE, blend(t.switch_maxpool),
              f"blend by each row's largest position via GlobalMaxPool (no Reduce op): {never}"),
            m(base, short, "plus-decode-flag", "per-call", REFUSE, positions(t.plus_decode_flag),
              f"positions + 1 in single-token calls: {never}"),
            m(base, short, "minus-first", "per-call", REFUSE, positions(t.minus_first),
              "positions - each row's first position (Slice, no Reduce op)"),
            m(base, short, "identity", "harmless", EQUIVALENT, positions(t.identity), "Identity on the positions"),
            m(base, short, "pos-mul2", "position-arithmetic", EQUIVALENT, positions(t.mul(2)),
              "positions * 2: per-token, absorbed by the table"),
        ]
        if not full:
            continue
        out += [
            m(base, short, "blend-last", "blend", REFUSE, blend(t.switch_last),
              f"blend by each row's last position (Slice): {never}"),
            m(base, short, "blend-call-length", "blend", REFUSE, blend(t.switch_call_length),
              f"blend by call length > 2: {never}"),
            m(base, short, "blend-einsum-sum", "blend", REFUSE, blend(t.switch_einsum_sum),
              "blend by the sum of the call's positions (Einsum, no Reduce op) > 500"),
            m(base, short, "minus-min", "per-call", REFUSE, positions(t.minus_min), "positions - ReduceMin(positions)"),
            m(base, short, "max-switch-halve", "per-call", REFUSE, positions(t.max_switch_halve),
              f"positions halved when ReduceMax(positions) > {t.SWITCH_AT}"),
            m(base, short, "plus-batch", "per-call", REFUSE, positions(t.plus_batch_minus_one),
              "positions + (batch - 1)"),
            m(base, short, "plus-call-length-mod2", "per-call", REFUSE, positions(t.plus_call_length_mod2),
              "positions + (call length mod 2)"),
            m(base, short, "plus-batch-flag-pattern", "per-call", REFUSE, positions(t.plus_batch_flag_through_pattern),
              "positions + (batch >= 4), the batch as ReduceSum(ConstantOfShape(Shape(positions)[0])): the probes "
              "never use batch 4"),
            m(base, short, "plus-past-flag-dim-name", "per-call", REFUSE,
              positions(t.plus_past_flag_by_dim_name("attention_mask")),
              "positions + (mask width != call length): the graph declares both as 'seq'"),
            m(base, short, "pos-add1", "position-arithmetic", EQUIVALENT, positions(t.add(1)),
              "positions + 1: per-token, absorbed by the table"),
            m(base, short, "cast-same", "harmless", EQUIVALENT, positions(t.cast_same), "Cast int64 -> int64"),
        ]
    return out
