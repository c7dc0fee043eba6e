"""Where rotary positions come from: the position inputs, and the in-graph tile of a 2D input to three mRoPE axes.

The "2D positions tiled to 3 identical axes" test lives here once (:func:`tiled_from_2d`): the census reports it
(``tiled_to_3d``), and :func:`exact_positions` (what an ``MRotaryEmbedding`` must read for ``fold-text-mrope``) and
:func:`position_source` (the looser census / check view) build on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import ancestors, attr, graph_inputs_of, ints, small_const, through
from rope_passes.analysis.schema import PositionInput, dtype_name, shape_list
from rope_passes.config import GenaiConfig
from rope_passes.report import MatchFailure, name_of


def layout(shape: ir.Shape | None) -> str:
    """``"[B,S]"``, ``"[3,B,S]"`` (mRoPE's three axes) or ``"other"``."""
    if shape is None:
        return "other"
    if len(shape) == 2:
        return "[B,S]"
    if len(shape) == 3 and shape[0] == 3:
        return "[3,B,S]"
    return "other"


# ------------------------------------------------------------------------------------------------------------
# 2D positions tiled to three identical axes
# ------------------------------------------------------------------------------------------------------------


def tiled_from_2d(value: ir.Value) -> ir.Value | None:
    """The 2D graph input ``p`` when ``value`` holds three identical copies of it made in-graph:
    ``Tile(Unsqueeze(p, [0]), [3, 1, 1])``, ``Expand(Unsqueeze(p, [0]), [3, 1, 1])`` or ``Concat([u, u, u], axis=0)``
    of ``u = Unsqueeze(p, [0])``. None for anything else."""
    node = value.producer()
    if node is None:
        return None
    if node.op_type == "Concat" and len(node.inputs) == 3 and attr(node, "axis") == 0:
        if len({id(i) for i in node.inputs}) != 1:
            return None
    elif node.op_type in ("Tile", "Expand"):
        if len(node.inputs) < 2 or ints(small_const(node.inputs[1])) != [3, 1, 1]:
            return None
    else:
        return None
    unsq = node.inputs[0]
    u = unsq.producer() if unsq is not None else None
    if u is None or u.op_type != "Unsqueeze":
        return None
    axes = small_const(u.inputs[1]) if len(u.inputs) > 1 else attr(u, "axes")
    if axes is None or ints(np.asarray(axes)) != [0]:
        return None
    src = u.inputs[0]
    if src is None or not src.is_graph_input() or src.shape is None or len(src.shape) != 2:
        return None
    return src


def tile_to_3d(value: ir.Value) -> ir.Node | None:
    """The node expanding the 2D graph input ``value`` to three identical axes (see :func:`tiled_from_2d`)."""
    for user, _ in value.uses():
        if user.op_type != "Unsqueeze":
            continue
        for nxt, _ in user.outputs[0].uses():
            if tiled_from_2d(nxt.outputs[0]) is value:
                return nxt
    return None


# ------------------------------------------------------------------------------------------------------------
# The census: position inputs and what a rotary op reads
# ------------------------------------------------------------------------------------------------------------


def position_inputs(model: ir.Model, genai_config: GenaiConfig) -> list[PositionInput]:
    """The graph's position inputs (genai_config's ``position_ids`` input, or any input named like one)."""
    wanted = genai_config.decoder_inputs.get("position_ids")
    out = []
    for value in model.graph.inputs:
        if value.name != wanted and "position" not in name_of(value):
            continue
        tile = tile_to_3d(value) if value.shape is not None and len(value.shape) == 2 else None
        out.append(PositionInput(
            name=name_of(value), shape=shape_list(value.shape), dtype=dtype_name(value.dtype),
            rank=len(value.shape) if value.shape is not None else None, layout=layout(value.shape),
            tiled_to_3d=tile is not None, tile_node=tile.name if tile is not None else None,
        ))
    return out


def position_input(model: ir.Model, name: str | None = None) -> ir.Value | None:
    """The graph's integer position input, or None: the one named ``name`` (genai_config's ``position_ids`` input: the
    rotation tables' position cone, :mod:`rope_passes.analysis.rotation_tables`), else the first whose name says
    position (``position_ids``, ``input_positions``...: what the rotation probe feeds, :mod:`rope_passes.proofs.
    rotation`)."""
    for v in model.graph.inputs:
        if (v.name == name if name is not None else "position" in name_of(v)) and v.dtype in (
                ir.DataType.INT64, ir.DataType.INT32):
            return v
    return None


def describe_position_source(value: ir.Value | None, model: ir.Model) -> str | None:
    """One line on where the positions ``value`` come from: a graph input, a synthetic Range, or computed."""
    if value is None:
        return None
    inputs = {id(v): v for v in model.graph.inputs}
    base = through(value)
    if id(base) in inputs:
        return f"graph input {base.name} {layout(base.shape)}"
    nodes = ancestors([value], stop={"Shape"})
    ops = {n.op_type for n in nodes}
    srcs = graph_inputs_of(nodes, model)
    if "Range" in ops:
        shapes = sorted({n.inputs[0].name for n in nodes if n.op_type == "Shape" and n.inputs[0] is not None})
        via = f" from Shape({', '.join(shapes)})" if shapes else ""
        return f"Range: synthetic positions 0..B*S-1{via}"
    if srcs:
        return f"computed from {', '.join(srcs)}"
    return "computed"


# ------------------------------------------------------------------------------------------------------------
# The proof: the one position tensor a rotation reads
# ------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class PositionSource:
    """The 3-axis position tensor a rotation reads, and how the graph obtains it."""

    graph_input: ir.Value  # the position_ids graph input
    three_axis: ir.Value  # the [3, B, S] value (the input itself, or the in-graph tile of a 2D input)
    text_only: bool  # True when the graph itself makes the three axes identical (2D input tiled to 3)
    how: str  # one line for reports


def position_source(values: Iterable[ir.Value]) -> PositionSource:
    """Trace the positions ``values`` (cos/sin tables or a position input) depend on, or raise MatchFailure."""
    values = [v for v in values if v is not None]
    graph_inputs: dict[int, ir.Value] = {}
    for v in values:
        if v.is_graph_input():
            graph_inputs[id(v)] = v
    nodes = ancestors(values)
    for node in nodes:
        for inp in node.inputs:
            if inp is not None and inp.is_graph_input():
                graph_inputs[id(inp)] = inp
    if len(graph_inputs) != 1:
        names = sorted(v.name for v in graph_inputs.values())
        raise MatchFailure.absent(f"positions depend on {len(graph_inputs)} graph inputs ({', '.join(names) or 'none'}), not 1")
    (pos,) = graph_inputs.values()
    if pos.dtype not in (ir.DataType.INT64, ir.DataType.INT32):
        raise MatchFailure.absent(f"position input {pos.name!r} is {pos.dtype}, not an integer tensor")
    rank = len(pos.shape) if pos.shape is not None else None
    if rank == 3 and pos.shape[0] == 3:
        how = f"{pos.name!r} is a [3, batch, seq] graph input (positions set by the caller)"
        return PositionSource(pos, pos, False, how)
    if rank == 2:
        # Every use of the 2D input on the way to the tables must go through one Tile/Expand to 3 identical axes.
        node_ids = {id(n) for n in nodes}
        tiles = []
        for user, _ in pos.uses():
            if id(user) not in node_ids:
                continue
            unsq_out = user.outputs[0]
            readers = [u for u, _ in unsq_out.uses() if id(u) in node_ids]
            if user.op_type != "Unsqueeze" or not readers:
                raise MatchFailure.absent(
                    f"2D {pos.name!r} reaches the rotary tables through {user.op_type} {user.name!r}, "
                    "not a tile to 3 axes"
                )
            for reader in readers:
                if tiled_from_2d(reader.outputs[0]) is not pos:
                    raise MatchFailure.absent(
                        f"2D {pos.name!r} is unsqueezed into {reader.op_type} {reader.name!r}, "
                        "not a tile to 3 identical axes"
                    )
                tiles.append(reader.outputs[0])
        if len({id(t) for t in tiles}) != 1:
            raise MatchFailure.absent(f"2D {pos.name!r} is tiled to 3 axes in {len(tiles)} places")
        how = f"2D {pos.name!r} is tiled to 3 identical axes in the graph (text only)"
        return PositionSource(pos, tiles[0], True, how)
    raise MatchFailure.absent(f"position input {pos.name!r} has shape {pos.shape}, neither [3, batch, seq] nor [batch, seq]")


#: Integer types a position input may have.
_INT_POSITIONS = (ir.DataType.INT64, ir.DataType.INT32)


def _copies(node: ir.Node) -> bool:
    """Identity, or a Cast to the type its input already has: the output is the input, bit for bit."""
    if node.domain not in ("", "ai.onnx") or not node.inputs or node.inputs[0] is None:
        return False
    if node.op_type == "Identity":
        return True
    to = attr(node, "to")
    return node.op_type == "Cast" and to is not None and node.inputs[0].dtype is not None and (
        ir.DataType(to) == node.inputs[0].dtype and node.inputs[0].dtype in _INT_POSITIONS)


def exact_positions(value: ir.Value, reader: ir.Node) -> PositionSource:
    """The position graph input ``value`` *is*: the ``[3, B, S]`` input itself, or the exact in-graph tile of a 2D
    input (:func:`tiled_from_2d`), through Identity / Cast-to-the-same-integer-type only.

    Anything else between the input and ``reader`` (arithmetic, Slice/Concat, a reduction, a Shape-derived value,
    a tile followed by an edit) is a :class:`MatchFailure` *refuse* naming that node: ``reader`` would then read
    positions the caller did not pass, and a table indexed by the caller's positions is not what it computes.
    """
    v = value
    while not v.is_graph_input():
        node = v.producer()
        if node is None:
            raise MatchFailure.refuse(f"{reader.op_type} {reader.name!r} reads positions {v.name!r}, a constant, "
                                      "not the position input", reader)
        if _copies(node):
            v = node.inputs[0]
            continue
        src = tiled_from_2d(v)
        if src is not None:
            if src.dtype not in _INT_POSITIONS:
                raise MatchFailure.refuse(f"position input {src.name!r} is {src.dtype}, not an integer tensor",
                                          src)
            how = f"2D {src.name!r} is tiled to 3 identical axes by {node.op_type} {node.name!r} (text only)"
            return PositionSource(src, v, True, how)
        ins = ", ".join(repr(i.name) for i in node.inputs if i is not None)
        raise MatchFailure.refuse(
            f"{node.op_type} {node.name!r} ({ins}) sits between the position input and {reader.op_type} "
            f"{reader.name!r}: the rotation reads positions computed in the graph, not the caller's, so its cache "
            "rows are not the rows GroupQueryAttention would read", node)
    if v.dtype not in _INT_POSITIONS:
        raise MatchFailure.refuse(f"position input {v.name!r} is {v.dtype}, not an integer tensor", v)
    shape = v.shape
    if shape is None or len(shape) != 3 or shape[0] != 3:
        raise MatchFailure.refuse(f"{reader.op_type} {reader.name!r} reads graph input {v.name!r} of shape {shape} "
                                  "as its positions, not a [3, batch, seq] input", reader)
    how = f"{v.name!r} is a [3, batch, seq] graph input (positions set by the caller)"
    return PositionSource(v, v, False, how)
