"""mRoPE spelled out as a subgraph (no MRotaryEmbedding op), and the [t, h, w] sections read from its constants.

Two forms: *chunked* (a per-axis cos/sin table Split by the sections, chunk ``i`` gathered at position axis ``i``;
builder 0.15 and torch exports) and *masked* (a cache read per axis, then ``Where(h_mask, …, Where(w_mask, …))``
over its columns; builder 0.15's interleaved Qwen3.5 form).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import ancestors, attr, const_tensor, ints, iter_nodes, small_const, table_like
from rope_passes.analysis.ops import rope_sinks
from rope_passes.analysis.schema import InvFreqMatMul, ManualMRope
from rope_passes.report import name_of


def _gather_axis(value: ir.Value) -> int | None:
    """The position axis (0=t, 1=h, 2=w) a gathered table row comes from: Gather(positions, const k)."""
    for node in ancestors([value]):
        if node.op_type == "Gather" and len(node.inputs) == 2 and const_tensor(node.inputs[0]) is None:
            index = ints(small_const(node.inputs[1]))
            if index is not None and len(index) == 1 and attr(node, "axis", 0) == 0:
                data = node.inputs[0]
                if data is not None and (data.shape is None or len(data.shape) == 3):
                    return index[0]
    return None


def _sections_from_masks(masks: dict[int, np.ndarray]) -> tuple[list[int] | None, int | None]:
    """[t, h, w] sections and layout from the h (axis 1) and w (axis 2) column masks."""
    if set(masks) != {1, 2}:
        return None, None
    half = masks[1].size
    cols = {axis: np.flatnonzero(m).tolist() for axis, m in masks.items()}
    counts = {axis: len(c) for axis, c in cols.items()}
    interleaved = all(cols[a] == list(range(a, 3 * counts[a], 3))[: counts[a]] for a in (1, 2))
    if interleaved:
        return [half - counts[1] - counts[2], counts[1], counts[2]], 1
    t = half - counts[1] - counts[2]
    if cols[1] == list(range(t, t + counts[1])) and cols[2] == list(range(t + counts[1], half)):
        return [t, counts[1], counts[2]], 0
    return None, None


def _chunked_sections(node: ir.Node) -> list[int] | None:
    """[t, h, w] when ``node`` splits a per-axis cos/sin table by mRoPE sections: output ``i`` gathered at position
    axis ``i % 3`` (3 outputs, or 6 when the table is rotate-half's doubled ``[f, f]``, as torch exporters emit)."""
    if node.op_type != "Split" or len(node.outputs) not in (3, 6):
        return None
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        sizes = ints(small_const(node.inputs[1]))
    else:
        sizes = ints(np.array(attr(node, "split"))) if attr(node, "split") is not None else None
    if sizes is None or len(sizes) != len(node.outputs) or (len(sizes) == 6 and sizes[:3] != sizes[3:]):
        return None
    for i, out in enumerate(node.outputs):
        gathers = [u for u, _ in out.uses() if u.op_type == "Gather" and len(u.inputs) > 1]
        if not gathers or ints(small_const(gathers[0].inputs[1])) != [i % 3]:
            return None
    return sizes[:3]


def manual_mrope(model: ir.Model, inv: list[InvFreqMatMul]) -> list[ManualMRope]:
    found: dict[tuple, ManualMRope] = {}
    # chunked: Split(per-axis table, sections), chunk i from position axis i, concatenated back (anywhere in the
    # graph: torch exports rotate with Mul/Add, not a rotary op)
    chunked: dict[int, ManualMRope] = {}
    for node in iter_nodes(model):
        sections = _chunked_sections(node)
        if sections is None:
            continue
        nodes = ancestors(node.inputs[:1])
        if not any(n.op_type in ("Cos", "Sin") for n in nodes) and not any(
                table_like(const_tensor(v)) for n in nodes for v in n.inputs if v is not None):
            continue  # not a cos/sin table
        table = _table_source(nodes, inv)
        rec = found.setdefault(("chunked", tuple(sections), table),
                               ManualMRope("chunked", sections, 0, table, [], [], []))
        rec.section_nodes.append(name_of(node))
        if len(node.inputs) > 1 and node.inputs[1] is not None and node.inputs[1].name not in rec.section_constants:
            rec.section_constants.append(name_of(node.inputs[1]))
        chunked[id(node)] = rec
    for node, role, value in rope_sinks(model):
        if role != "cos" or node.op_type == "MRotaryEmbedding":
            continue
        nodes = ancestors([value])
        feeding = {id(rec): rec for n in nodes if (rec := chunked.get(id(n))) is not None}
        for rec in feeding.values():
            rec.feeds.append(name_of(node))
        if feeding:
            continue
        # masked: Where(mask_h, from axis 1, Where(mask_w, from axis 2, from axis 0)) over cache rows
        wheres = [n for n in nodes if n.op_type == "Where" and small_const(n.inputs[0]) is not None
                  and const_tensor(n.inputs[0]) is not None and const_tensor(n.inputs[0]).dtype == ir.DataType.BOOL]
        if wheres:
            masks, mask_names = {}, []
            for w in wheres:
                axis = _gather_axis(w.inputs[1])
                if axis in (1, 2):
                    masks[axis] = np.asarray(small_const(w.inputs[0])).reshape(-1)
                    if w.inputs[0].name not in mask_names:
                        mask_names.append(name_of(w.inputs[0]))
            sections, layout = _sections_from_masks(masks)
            table = _table_source(nodes, inv)
            key = ("masked", tuple(sections or ()), table)
            rec = found.setdefault(key, ManualMRope("masked", sections, layout, table, [], [], []))
            rec.section_nodes.extend(name_of(w) for w in wheres if w.name not in rec.section_nodes)
            rec.section_constants.extend(n for n in mask_names if n not in rec.section_constants)
            rec.feeds.append(name_of(node))
    return list(found.values())


def _table_source(nodes: list[ir.Node], inv: list[InvFreqMatMul]) -> str:
    products = {n.name: n.op_type for n in nodes if n.op_type in ("MatMul", "Einsum", "Mul")}
    for record in inv:
        hit = next((name for name in record.matmuls if name in products), None)
        if hit is not None:
            return f"inv_freq {products[hit]} ({record.inv_freq} {record.inv_freq_shape})"
    tables = []
    for n in nodes:
        for v in n.inputs:
            t = const_tensor(v) if v is not None else None
            if table_like(t) and v.name not in tables:
                tables.append(v.name)
    return "caches " + ", ".join(tables) if tables else "computed"
