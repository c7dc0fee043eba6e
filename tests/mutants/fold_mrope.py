"""Mutants attacking ``fold-text-mrope``: what sits between the position input and the rotation.

Builder 0.18 graphs (``current/qwen25_vl``, ``current/qwen35``) rotate with ``com.microsoft::MRotaryEmbedding``, whose
cache rows the fold copies into GQA: any arithmetic on the positions before the rotation, on all axes or one, for q
or k only, makes that copy wrong. The builder 0.15.2 graphs (``legacy/*``) spell mRoPE out; the fold evaluates their
cos/sin subgraph on positions ``0..N-1`` (plus a permutation), so per-token arithmetic is absorbed into the tables,
but anything depending on the call (its minimum, maximum, length or batch) is not.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from . import EQUIVALENT, REFUSE, Mutant, Work
from . import transforms as t
from .edit import Chain, gqa_of, graph_input, splice

PASS = "fold-text-mrope"
CUR_QWEN25 = "genai/current/qwen25_vl/cpu_fp32"
CUR_QWEN35 = "genai/current/qwen35/webgpu_fp32"
LEG_QWEN25 = "genai/legacy/qwen25_vl/cpu_fp32"
LEG_QWEN35 = "genai/legacy/qwen35/cpu_fp32"
LEG_QWEN35_TEXT = "genai/legacy/qwen35/cpu_fp32_text"
TEXT_ONLY = {"text_only": True}


def _three_axis(graph: ir.Graph) -> ir.Value:
    """The [3, B, S] positions the rotations read: the input itself, or the in-graph tile of a 2D input."""
    pos = graph_input(graph, "position_ids")
    if len(pos.shape) == 3:
        return pos
    for user, _ in pos.uses():
        if user.op_type == "Unsqueeze":
            for tile, _ in user.outputs[0].uses():
                if tile.op_type in ("Tile", "Expand", "Concat"):
                    return tile.outputs[0]
    raise AssertionError("no tile of the 2D position input")


def _gqas_reading(graph: ir.Graph, readers: list[ir.Node]) -> list[str]:
    """GroupQueryAttention nodes downstream of any of ``readers``."""
    reader_ids = {id(r) for r in readers}
    names = []
    for gqa in (n for n in graph if n.op_type == "GroupQueryAttention"):
        stack, seen = [gqa], set()
        while stack:
            node = stack.pop()
            if id(node) in reader_ids:
                names.append(gqa.name)
                break
            for inp in node.inputs:
                p = inp.producer() if inp is not None else None
                if p is not None and id(p) not in seen:
                    seen.add(id(p))
                    stack.append(p)
    return names


def positions(transform, keep: Callable[[ir.Node], bool] | None = None, *, before_tile: bool = False):
    """Edit: ``transform`` spliced between the [3, B, S] positions (or the 2D input, ``before_tile``) and what
    reads them (the readers ``keep`` accepts)."""
    def edit(work: Work) -> list[str]:
        value = graph_input(work.graph, "position_ids") if before_tile else _three_axis(work.graph)
        readers = splice(work.graph, value, transform, "positions", keep)
        if any(r.op_type == "MRotaryEmbedding" for r in readers):
            return sorted({gqa_of(r).name for r in readers})
        return _gqas_reading(work.graph, readers)
    return edit


def tiled_2d(kind: str = "Tile", then=None):
    """Edit: the [3, B, S] input becomes a 2D ``[B, S]`` input tiled to 3 axes in-graph (the provably text-only
    form), optionally followed by ``then`` on the tile's output."""
    def edit(work: Work) -> list[str]:
        graph = work.graph
        old = graph_input(graph, "position_ids")
        readers = list(old.uses())
        new = ir.Value(name="position_ids", shape=ir.Shape([old.shape[1], old.shape[2]]),
                       type=ir.TensorType(ir.DataType.INT64))
        old.name = "position_ids_3d_before_mutation"
        graph.inputs[graph.inputs.index(old)] = new
        chain = Chain(graph, "tile2d")
        unsq = chain.op("Unsqueeze", new, chain.i64(0))
        tiled = chain.op(kind, unsq, chain.i64(3, 1, 1), shape=old.shape)
        chain.insert([u for u, _ in readers])
        for user, index in readers:
            user.replace_input_with(index, tiled)
        graph.sort()
        if then is not None:
            splice(graph, tiled, then, "after_tile")
        return sorted({gqa_of(u).name for u, _ in readers if u.op_type == "MRotaryEmbedding"})
    return edit


def _q(node: ir.Node) -> bool:
    return "q_rotary" in (node.name or "")


def _k(node: ir.Node) -> bool:
    return "k_rotary" in (node.name or "")


def _layer0(node: ir.Node) -> bool:
    return "layers.0/" in (node.name or "")


def _current(base: str, short: str, full: bool) -> list[Mutant]:
    """MRotaryEmbedding graphs: the fold copies the cache rows, so only harmless edits may be rewritten."""
    opts = TEXT_ONLY

    def m(name, cls, expect, edit, why, options=opts):
        return Mutant(f"fold-{short}-{name}", cls, PASS, base, expect, edit, why, target="webgpu", options=options,
                      reference="mrotary-oracle")

    arith = "the rotation reads transformed positions; the fold's tables read row = raw position"
    out = [
        m("pos-mul2", "position-arithmetic", REFUSE, positions(t.mul(2)), f"positions * 2: {arith}"),
        m("q-only-mul2", "position-arithmetic", REFUSE, positions(t.mul(2), _q),
          f"q reads positions * 2, k reads them raw: {arith}"),
        m("k-only-add3", "position-arithmetic", REFUSE, positions(t.add(3), _k),
          f"k reads positions + 3, q raw (present.* keys shift): {arith}"),
        m("axis1-add1", "position-arithmetic", REFUSE, positions(t.axis_add(1, 1)),
          "Slice/Add/Concat: the h axis is positions + 1, so the axes differ even for text callers"),
        m("minus-min", "per-call", REFUSE, positions(t.minus_min),
          "positions - ReduceMin(positions): every call starts at 0"),
        m("max-switch-halve", "per-call", REFUSE, positions(t.max_switch_halve),
          f"positions halved when ReduceMax(positions) > {t.SWITCH_AT}"),
        m("plus-call-length", "per-call", REFUSE, positions(t.plus_call_length), "positions + call length"),
        m("plus-batch", "per-call", REFUSE, positions(t.plus_batch_minus_one), "positions + (batch - 1)"),
        m("tile2d-axis1-add1", "tile-edit", REFUSE, tiled_2d("Tile", t.axis_add(1, 1)),
          "2D input tiled to 3 axes, then axis h + 1: provably-text form, but the rotation does not read the tile",
          options={}),
        m("identity", "harmless", EQUIVALENT, positions(t.identity), "Identity on the positions"),
        m("cast-same", "harmless", EQUIVALENT, positions(t.cast_same), "Cast int64 -> int64 on the positions"),
        m("tile2d", "harmless", EQUIVALENT, tiled_2d("Tile"), "2D input tiled to 3 identical axes (auto text-only)",
          options={}),
        m("axes-permuted", "harmless", EQUIVALENT, positions(t.axes_permuted),
          "axes reordered (h, w, t): the same values for text callers, who pass 3 equal axes"),
    ]
    if full:
        out += [
            m("pos-add1", "position-arithmetic", REFUSE, positions(t.add(1)),
              f"positions + 1 (attention scores unchanged, present.* keys are not): {arith}"),
            m("pos-sub1", "position-arithmetic", REFUSE, positions(t.add(-1)), f"positions - 1: {arith}"),
            m("pos-neg", "position-arithmetic", REFUSE, positions(t.neg), f"-positions: {arith}"),
            m("pos-div2", "position-arithmetic", REFUSE, positions(t.div(2)), f"positions / 2: {arith}"),
            m("layer0-mul2", "position-arithmetic", REFUSE, positions(t.mul(2), _layer0),
              f"layer 0 reads positions * 2, layer 1 raw: {arith}"),
            m("axis0-add1", "position-arithmetic", REFUSE, positions(t.axis_add(0, 1)), "the t axis is positions + 1"),
            m("axis2-mul2", "position-arithmetic", REFUSE, positions(t.axis_mul(2, 2)), "the w axis is positions * 2"),
            m("max-switch-shift", "per-call", REFUSE, positions(t.max_switch_shift),
              f"Where(ReduceMax(positions) > {t.SWITCH_AT}, positions, positions + 1)"),
            m("plus-decode-flag", "per-call", REFUSE, positions(t.plus_decode_flag),
              "positions + 1 in single-token calls only"),
            m("plus-past-from-mask", "per-call", REFUSE, positions(t.plus_past_from_mask("attention_mask")),
              "positions + (mask width - call length): reads the attention mask too"),
            m("tile2d-mul2", "tile-edit", REFUSE, tiled_2d("Tile", t.mul(2)),
              "2D input tiled to 3 axes, then * 2 on all of them", options={}),
            m("tile2d-expand", "harmless", EQUIVALENT, tiled_2d("Expand"),
              "2D input expanded to 3 identical axes (Expand instead of Tile)", options={}),
            m("mul1", "harmless", EQUIVALENT, positions(t.mul(1)), "positions * 1"),
            m("add0", "harmless", EQUIVALENT, positions(t.add(0)), "positions + 0"),
        ]
    return out


def _legacy(base: str, short: str, options: dict, cases: list[tuple]) -> list[Mutant]:
    return [Mutant(f"fold-{short}-{name}", cls, PASS, base, expect, edit, why, target="webgpu", options=options,
                   reference="ort") for name, cls, expect, edit, why in cases]


ABSORBED = "per-token, so the evaluated tables absorb it (a rewrite is exact; a refusal is fine)"


def mutants() -> list[Mutant]:
    out = _current(CUR_QWEN25, "cur-qwen25", full=True) + _current(CUR_QWEN35, "cur-qwen35", full=False)
    per_call = [
        ("minus-min", "per-call", REFUSE, positions(t.minus_min),
         "positions - ReduceMin(positions): the probe 0..N-1 and its permutation both have minimum 0"),
        ("max-switch-halve", "per-call", REFUSE, positions(t.max_switch_halve),
         f"positions halved when ReduceMax > {t.SWITCH_AT}: the probes always have the large maximum"),
        ("plus-decode-flag", "per-call", REFUSE, positions(t.plus_decode_flag),
         "positions + 1 in single-token calls: the probes are never one token long"),
        ("plus-batch", "per-call", REFUSE, positions(t.plus_batch_minus_one),
         "positions + (batch - 1): the probes have batch 1"),
    ]
    out += _legacy(LEG_QWEN25, "leg-qwen25", TEXT_ONLY, per_call + [
        ("max-switch-shift", "per-call", REFUSE, positions(t.max_switch_shift),
         f"Where(ReduceMax(positions) > {t.SWITCH_AT}, positions, positions + 1)"),
        ("plus-call-length", "per-call", REFUSE, positions(t.plus_call_length),
         "positions + call length: the probe is N tokens long, calls are 1..8"),
        ("plus-past-from-mask", "per-call", REFUSE, positions(t.plus_past_from_mask("attention_mask")),
         "positions + (mask width - call length): reads the attention mask too"),
        ("pos-mul2", "position-arithmetic", EQUIVALENT, positions(t.mul(2)), f"positions * 2: {ABSORBED}"),
        ("pos-add1", "position-arithmetic", EQUIVALENT, positions(t.add(1)), f"positions + 1: {ABSORBED}"),
        ("axis1-add1", "position-arithmetic", EQUIVALENT, positions(t.axis_add(1, 1)),
         f"h axis + 1 in-graph: {ABSORBED}"),
        ("layer0-mul2", "position-arithmetic", EQUIVALENT, positions(t.mul(2), _layer0),
         f"layer 0 reads positions * 2 (its own tables): {ABSORBED}"),
        ("identity", "harmless", EQUIVALENT, positions(t.identity), "Identity on the positions"),
        ("cast-same", "harmless", EQUIVALENT, positions(t.cast_same), "Cast int64 -> int64 on the positions"),
    ])
    out += _legacy(LEG_QWEN35, "leg-qwen35", TEXT_ONLY, per_call + [
        ("plus-call-length-mod2", "per-call", REFUSE, positions(t.plus_call_length_mod2),
         "positions + (call length mod 2): the probe has an even length"),
        ("pos-neg", "position-arithmetic", EQUIVALENT, positions(t.neg),
         f"-positions (Gather wraps negative rows): {ABSORBED}"),
        ("axis1-sub1", "position-arithmetic", EQUIVALENT, positions(t.axis_add(1, -1)),
         f"h axis - 1 in-graph (row -1 wraps to the last one): {ABSORBED}"),
        ("axis1-add1", "position-arithmetic", EQUIVALENT, positions(t.axis_add(1, 1)),
         "h axis + 1: absorbed where it evaluates; the probe's position 255 + 1 is past the 256-row cache"),
        ("identity", "harmless", EQUIVALENT, positions(t.identity), "Identity on the positions"),
    ])
    out += _legacy(LEG_QWEN35_TEXT, "leg-qwen35text", {}, per_call + [
        ("tile-axis1-add1", "tile-edit", EQUIVALENT, positions(t.axis_add(1, 1)),
         f"the tile's h axis + 1: the tables are evaluated through the edit, {ABSORBED}"),
        ("tile-axis1-sub1", "tile-edit", EQUIVALENT, positions(t.axis_add(1, -1)),
         f"the tile's h axis - 1 (row -1 wraps): the tables are evaluated through the edit, {ABSORBED}"),
        ("tile-axis2-mul2", "tile-edit", EQUIVALENT, positions(t.axis_mul(2, 2)),
         "the tile's w axis * 2: absorbed where it evaluates (the probe's 2 * 255 is past the 256-row cache)"),
        ("mul2-before-tile", "position-arithmetic", EQUIVALENT, positions(t.mul(2), before_tile=True),
         f"the 2D input * 2 before the tile: {ABSORBED}"),
        ("identity", "harmless", EQUIVALENT, positions(t.identity), "Identity after the tile"),
    ])
    return out
