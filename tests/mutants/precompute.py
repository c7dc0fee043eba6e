"""Mutants attacking ``precompute-cos-sin`` on the torch exports (tf5 dynamo, tf4 TorchScript Llama decode graphs).

The pass replaces the per-call cos/sin chain by a table lookup when its numeric probes (positions 0..N-1, a
permutation, a [2, 3] call) show every row depends on its own position only. Per-token arithmetic is absorbed by
the table (expect "equivalent"); a per-call choice the probes never exercise is not (expect "refuse"): a short/long
blend switched by the call's largest/last position, its length, or a single-token flag, written without Where and,
for some, without any Reduce op.

Positions made in the graph (issue 18: proofs over values, not forms): the tf5 graph's ``position_ids`` input is
replaced by optimum's ``Range(past + k, past + k + S, 1)`` (``past`` = ``Shape(past_key)[2]``, ``S`` =
``Shape(input_ids)[1]``), the rows gathered by the Range output. With ``k`` negative the graph computes cos/sin of
negative positions, which a table lookup wraps to its end: refused, however ``k`` is spelled (an initializer, a
``Constant`` ``value_int`` / ``value_ints``, a ``Cast`` of a float, a ``Gather(Concat(...))``, arithmetic). With ``k``
positive the graph's own positions start at ``k``: a table of ``max_positions`` rows would be read past its end, so the
table must be sized from what the graph proves (``max_positions + k``), or refused.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import onnx_ir as ir

from . import EQUIVALENT, REFUSE, Built, Mutant, Work
from . import transforms as t
from .edit import Chain, graph_input, splice

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


# -- positions made in the graph ---------------------------------------------------------------------------------
def _value_int(c: Chain, k: int) -> ir.Value:
    return c.op("Constant", dtype=ir.DataType.INT64, value_int=k)


def _value_ints_gather(c: Chain, k: int) -> ir.Value:
    ks = c.op("Constant", dtype=ir.DataType.INT64, value_ints=[7, k])
    return c.op("Gather", ks, c.scalar(1), dtype=ir.DataType.INT64, axis=0)


def _cast_float(c: Chain, k: int) -> ir.Value:
    f = c.op("Constant", dtype=ir.DataType.FLOAT, value_float=float(k))
    return c.op("Cast", f, dtype=ir.DataType.INT64, to=ir.DataType.INT64)


def _gather_concat(c: Chain, k: int) -> ir.Value:
    both = c.op("Concat", c.i64(3), c.op("Constant", dtype=ir.DataType.INT64, value_ints=[k]), axis=0)
    return c.op("Gather", both, c.scalar(1), dtype=ir.DataType.INT64, axis=0)


def _initializer(c: Chain, k: int) -> ir.Value:
    return c.scalar(k)


def _arithmetic(c: Chain, k: int) -> ir.Value:
    """k as (k + 7) * 2 - k - 14, from value_int Constants."""
    a = c.op("Mul", c.op("Add", _value_int(c, k), _value_int(c, 7)), _value_int(c, 2))
    return c.op("Sub", c.op("Sub", a, _value_int(c, k)), _value_int(c, 14))


OFFSET_FORMS = {"initializer": _initializer, "value-int": _value_int, "value-ints-gather": _value_ints_gather,
                "cast-float": _cast_float, "gather-concat": _gather_concat, "arithmetic": _arithmetic}


def range_positions(offset: int, form=_initializer, delta_form=None, start_form=None):
    """``position_ids`` replaced by ``Unsqueeze(Range(past + offset, past + offset + S, delta), 0)`` (optimum's
    positions made in the graph; ``delta`` 1 written as ``delta_form``), the input removed. ``start_form(c, graph,
    past, S)``, when given, is the Range's start instead of ``past + offset`` (the limit stays start + S)."""
    def edit(work: Work) -> list[str]:
        graph = work.graph
        pos = graph_input(graph, "position_ids")
        c = Chain(graph, "range_positions")
        past = c.op("Gather", c.op("Shape", graph_input(graph, "past_key_values.0.key"), dtype=ir.DataType.INT64),
                    c.scalar(2), dtype=ir.DataType.INT64, axis=0)
        length = c.op("Gather", c.op("Shape", graph_input(graph, "input_ids"), dtype=ir.DataType.INT64),
                      c.scalar(1), dtype=ir.DataType.INT64, axis=0)
        start = c.op("Add", past, form(c, offset)) if offset else past
        if start_form is not None:
            start = start_form(c, graph, past, length)
        limit = c.op("Add", start, length)
        delta = delta_form(c, 1) if delta_form is not None else c.scalar(1)
        made = c.op("Range", start, limit, delta, dtype=ir.DataType.INT64)
        made.name = "mutant_positions"
        rows = c.op("Unsqueeze", made, c.i64(0), dtype=ir.DataType.INT64)
        readers = list(pos.uses())
        c.insert([u for u, _ in readers])
        for user, index in readers:
            user.replace_input_with(index, rows)
        graph.inputs.remove(pos)
        graph.sort()
        return _trig(graph)
    return edit


def _dim(c: Chain, graph: ir.Graph, name: str, axis: int) -> ir.Value:
    return c.op("Gather", c.op("Shape", graph_input(graph, name), dtype=ir.DataType.INT64), c.scalar(axis),
                dtype=ir.DataType.INT64, axis=0)


#: Range starts that grow faster than the call, or read a dimension that is not the past (the red team's
#: ``precompute_range_past_table`` forms): a table of max_positions (+ the limit with every dimension 0) rows is read
#: past its end by a call with past + S <= max_positions. (start, why, expect)
RANGE_STARTS = {
    "mul2": (lambda c, g, past, s: c.op("Mul", past, c.scalar(2)), "start = 2·past: positions up to 2·past + S - 1",
             REFUSE),
    "plus-s": (lambda c, g, past, s: c.op("Add", past, s), "start = past + S: positions up to past + 2S - 1", REFUSE),
    "mask-total": (lambda c, g, past, s: _dim(c, g, "attention_mask", 1),
                   "start = Shape(attention_mask)[1] (= past + S): positions up to past + 2S - 1", REFUSE),
    "mul-s": (lambda c, g, past, s: c.op("Mul", past, s), "start = past·S: positions up to past·S + S - 1", REFUSE),
    "max-s": (lambda c, g, past, s: c.op("Max", past, s), "start = Max(past, S): positions S..2S-1 when past < S",
              REFUSE),
    "plus-static-dim": (lambda c, g, past, s: c.op("Add", past, _dim(c, g, "past_key_values.0.key", 3)),
                        "start = past + Shape(past_key_values.0.key)[3], a static 16 (the head size): positions up "
                        "to past + 16 + S - 1, so the table needs max_positions + 16 rows (not + the dimension at 0)",
                        EQUIVALENT),
}
#: calls at the end of a 256-row table (past + S <= 256), and a long prompt (Max(past, S) = S): where a table too
#: short for the graph's positions fails
EDGE_CALLS = ((240, 8, 1), (248, 8, 1), (255, 1, 1), (0, 160, 1))


# -- semantics changed to match a config: a repair, never an ordinary rewrite ---------------------------------------
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@dataclasses.dataclass(frozen=True)
class WithConfig(Mutant):
    """A mutant written with a Hugging Face ``config.json`` beside it (``config``: the fixture's, edited)."""

    config: str = ""
    config_edit: Callable[[dict], None] | None = None

    def build(self, dest: Path) -> Built:
        built = super().build(dest)
        data = json.loads((FIXTURES / "hf_rope" / self.config / "config.json").read_text())
        if self.config_edit is not None:
            self.config_edit(data)
        (built.model_file.parent / "config.json").write_text(json.dumps(data, indent=2))
        return built


def _unchanged(work: Work) -> list[str]:
    return _trig(work.graph)


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
        out += [m(base, short, "range-positions", "harmless", EQUIVALENT, range_positions(0),
                  "positions made in the graph: Range(past, past + S) (optimum's form), no position_ids input"),
                m(base, short, "range-delta-value-int", "constant-form", EQUIVALENT,
                  range_positions(0, delta_form=_value_int), "Range(past, past + S, Constant(value_int=1))")]
        for form_name, form in OFFSET_FORMS.items():
            out.append(m(base, short, f"range-minus5-{form_name}", "constant-form", REFUSE,
                         range_positions(-5, form),
                         f"Range(past - 5, ...): negative positions, the -5 as {form_name}; a table lookup wraps them "
                         "to the table's end"))
        for form_name in ("value-int", "initializer", "cast-float"):
            out.append(m(base, short, f"range-plus300-{form_name}", "position-arithmetic", EQUIVALENT,
                         range_positions(300, OFFSET_FORMS[form_name]),
                         f"Range(past + 300, ...) (300 as {form_name}): every position the graph makes is >= 300, "
                         "past a 256-row table"))
        for start_name, (start_form, why, expect) in RANGE_STARTS.items():
            mutant = m(base, short, f"range-start-{start_name}", "position-arithmetic", expect,
                       range_positions(0, start_form=start_form), f"Range(start, start + S): {why}")
            out.append(dataclasses.replace(mutant, calls=mutant.calls + EDGE_CALLS))
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
    # LongRoPE frozen at export (TorchScript phi3_longrope: the short factors for every call) with its config.json
    # beside it: the config says the long factors past position 63, the graph does not. Without --hf-config the
    # output must compute what the input computes (the reference: onnxruntime CPU of the input), past the switch too
    crossing = ((0, 8, 1), (60, 8, 1), (100, 4, 1), (37, 8, 1))
    for name, edit_config, why in (
            ("frozen-longrope-config-beside", None, "its own config.json"),
            ("frozen-longrope-config-theta-differs", lambda c: c.update(rope_theta=20000.0),
             "a config.json whose theta differs from the graph's")):
        out.append(WithConfig(f"precompute-tf4-{name}", "switch", PASS, "torch/tf4/torchscript/phi3_longrope/decode.onnx",
                              EQUIVALENT, _unchanged, f"LongRoPE frozen at export with {why} beside it: a config "
                              "found beside the graph never changes what it computes (a repair needs --hf-config)",
                              target="exporter", options={"max_positions": 256}, reference="ort", calls=crossing,
                              config="tf4/phi3_longrope", config_edit=edit_config))
    return out
