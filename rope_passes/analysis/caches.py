"""The constant cos/sin tables a rotation reads: found from the cos/sin inputs of attention and rotary ops.

Only tensor metadata is read (shape, dtype): the tables' values never are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import onnx_ir as ir

from rope_passes.analysis.graph import ancestors, attr, const_tensor, table_like
from rope_passes.analysis.ops import rope_sinks
from rope_passes.analysis.schema import CosSinCache, dtype_name, shape_list
from rope_passes.report import name_of


@dataclasses.dataclass(frozen=True)
class SwitchedHead:
    """``longrope-concat``'s cache for batches of rows of different lengths: ``Concat(Where(c, long[:o], short[:o]),
    long, axis=0)``, ``c`` the batch's longest row past ``o``. WebGPU reads row ``(row total > o ? o : 0) +
    position``: a row past ``o`` reads ``long``, a shorter one the head, which is the long table's head when the batch
    is past ``o`` (the ``If``'s whole-batch choice) and the short one's otherwise. For rows of one length it reads what
    the constant ``[short[:o]; long]`` gives."""

    concat: ir.Node
    where: ir.Node
    head_long: ir.Value
    head_short: ir.Value
    long: ir.Value
    offset: int  # o: the head's rows
    rows: int  # o + the long table's rows
    dtype: ir.DataType

    @property
    def tables(self) -> tuple[ir.Value, ir.Value, ir.Value]:
        return self.head_long, self.head_short, self.long

    @property
    def shape(self) -> ir.Shape:
        """The concatenation's shape (what a census reads of a table: shape and dtype)."""
        return ir.Shape([self.rows, self.long.shape[1] if self.long.shape is not None else None])


def switched_head(value: ir.Value | None) -> SwitchedHead | None:
    """``value`` as a :class:`SwitchedHead` (structure and shapes: constant 2-D tables of one width and dtype, the
    heads of one shape), or None. The values are not read (:func:`rope_passes.proofs.concat_offset.cache_table`
    reads and proves them)."""
    concat = value.producer() if value is not None else None
    if (concat is None or concat.op_type != "Concat" or concat.domain not in ("", "ai.onnx")
            or len(concat.inputs) != 2 or attr(concat, "axis") not in (0, -2)):
        return None
    head, long = concat.inputs
    where = head.producer() if head is not None else None
    if where is None or where.op_type != "Where" or where.domain not in ("", "ai.onnx") or len(where.inputs) != 3:
        return None
    a, b, rest = const_tensor(where.inputs[1]), const_tensor(where.inputs[2]), const_tensor(long)
    if a is None or b is None or rest is None or not (table_like(a) and table_like(b) and table_like(rest)):
        return None
    head_rows, rest_rows = a.shape[0], rest.shape[0]
    if a.shape != b.shape or len({a.dtype, b.dtype, rest.dtype}) != 1 or a.shape[1] != rest.shape[1] or not (
            isinstance(head_rows, int) and isinstance(rest_rows, int)):
        return None
    assert long is not None and where.inputs[1] is not None and where.inputs[2] is not None
    return SwitchedHead(concat, where, where.inputs[1], where.inputs[2], long, head_rows, head_rows + rest_rows,
                        a.dtype)


@dataclasses.dataclass
class FoundCache:
    """A constant 2D float table reached from a cos/sin input."""

    value: ir.Value
    role: str  # "cos" or "sin"
    source: str  # "initializer", "Constant", "If.then_branch", "If.else_branch", "batch switch"
    tensor: ir.TensorProtocol | SwitchedHead  # metadata only: shape and dtype
    if_node: ir.Node | None  # the If whose branch returns it


def _on_path(value: ir.Value) -> set[int]:
    """ids of ``value`` and of every value its ancestors read: the values ``value`` is computed from."""
    out = {id(value)}
    for node in ancestors([value]):
        out.update(id(v) for v in node.inputs if v is not None)
    return out


def find_caches(model: ir.Model) -> tuple[list[FoundCache], list[ir.Node]]:
    """Constant 2D float tables reached from cos/sin inputs, and the If nodes choosing between tables."""
    found: dict[int, FoundCache] = {}
    if_nodes: dict[int, ir.Node] = {}

    def add(value: ir.Value, role: str, source: str, if_node: ir.Node | None = None) -> None:
        tensor = const_tensor(value)
        if table_like(tensor) and id(value) not in found:
            found[id(value)] = FoundCache(value, role, source, tensor, if_node)

    for _node, role, value in rope_sinks(model):
        if role == "position_ids":
            continue
        switched = switched_head(value)
        if switched is not None:  # one table, computed per call from three constant ones
            if id(value) not in found:
                found[id(value)] = FoundCache(value, role, "batch switch", switched, None)
            continue
        candidates = [value]
        for anc in ancestors([value]):
            candidates.extend(v for v in anc.inputs if v is not None)
            if anc.op_type == "If":
                if_nodes[id(anc)] = anc
                on_path = _on_path(value)
                index = next((i for i, o in enumerate(anc.outputs) if id(o) in on_path), None)
                for branch in ("then_branch", "else_branch"):
                    g = attr(anc, branch)
                    if g is None:
                        continue
                    outs = list(g.outputs) if index is None else [g.outputs[index]]
                    for out in outs:
                        add(out, role, f"If.{branch}", anc)
        for cand in candidates:
            src = "initializer" if cand.const_value is not None else "Constant"
            add(cand, role, src)
    return list(found.values()), list(if_nodes.values())


def cache_records(
    caches: list[FoundCache],
    context_length: int | None,
    variant: Callable[[ir.Value], str | None] = lambda _: None,
    concat_offset: int | None = None,
) -> list[CosSinCache]:
    """The census records of ``caches``: rows against the context length, and each one's LongRoPE part.

    ``variant``: a table's LongRoPE part (``LongRoPE.variant``); ``concat_offset``: the offset a concatenated table
    is read at (its rows past the offset are what covers the context).
    """
    offset = concat_offset
    records = []
    for cache in caches:
        value, tensor, source = cache.value, cache.tensor, cache.source
        rows = tensor.shape[0] if isinstance(tensor.shape[0], int) else None
        cols = tensor.shape[1] if isinstance(tensor.shape[1], int) else None
        part = variant(value)
        effective = rows
        if part == "concat (short+long)" and rows is not None and offset is not None:
            effective = rows - offset  # the long part is what covers the context
        versus = None
        if context_length is not None and effective is not None:
            versus = ("=" if effective == context_length else "<" if effective < context_length else ">")
            versus += " context_length" if effective == rows else f" context_length + offset {offset}"
        read_by = sorted({u.op_type for u, _ in value.uses()} | ({"If"} if source.startswith("If.") else set()))
        records.append(CosSinCache(
            name=name_of(value), role=cache.role, shape=shape_list(tensor.shape) or [],
            dtype=dtype_name(tensor.dtype) or "?", rows=rows, columns=cols, source=source, variant=part,
            read_by=read_by, rows_vs_context=versus,
        ))
    records.sort(key=lambda c: (c.variant or "", c.role, c.name))
    return records
