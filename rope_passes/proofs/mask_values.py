"""The abstract values of :mod:`rope_passes.proofs.mask_lengths` (the elements of a rank-2 integer graph input, its
row sums, a step the proof cannot follow) and the one test of which graph input is the attention mask."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Union

import onnx_ir as ir

from rope_passes.proofs.dims import Affine, Foreign
from rope_passes.proofs.known import OPAQUE, Dim, Known, known_values

#: the attention mask's graph input name where no genai_config names it
MASK_INPUT = "attention_mask"
#: the integer types a mask (and a Cast of its values that keeps them) may have
INT_TYPES = (ir.DataType.INT64, ir.DataType.INT32)


@dataclasses.dataclass(frozen=True)
class MaskRows:
    source: ir.Value  # the rank-2 integer graph input whose elements these are
    axes: tuple  # "b" | "t" | 1 per axis
    width: object  # extent of the "t" axis: Dim(1) (the input's own) or OPAQUE (padded)
    extra: int = 0  # added to each row's sum by Pad columns
    running: int = 0  # 1: each element is the sum of its row up to it (CumSum); -1: from it to the row's end


@dataclasses.dataclass(frozen=True)
class RowSums:
    source: ir.Value
    axes: tuple  # "b" | 1 per axis
    offset: int  # the value is sum(row) + offset


@dataclasses.dataclass(frozen=True)
class Broken:
    reason: str
    node: ir.Node | None = None


Val = Union[MaskRows, RowSums, Known, Broken]  # noqa: UP007


class Unfollowed(Exception):
    """A step the proof does not follow (the message says why; the walk adds the node)."""


def mask_problem(mask: ir.Value, names: Collection[str]) -> str | None:
    """Why ``mask`` is not the attention mask: a rank-2 integer graph input named as genai_config's
    ``attention_mask`` input (``names``). A rank-2 integer input alone proves nothing: ``input_ids`` has that look."""
    if not mask.is_graph_input():
        return f"{mask.name!r} is not a graph input (the attention mask is expected as one)"
    if mask.name not in names:
        return (f"{mask.name!r} is not the attention mask (the graph input {' / '.join(map(repr, sorted(names)))}, "
                "genai_config's decoder input attention_mask)")
    if mask.dtype not in INT_TYPES:
        return f"mask {mask.name!r} has dtype {mask.dtype}, expected int64/int32"
    if mask.shape is not None and len(mask.shape) != 2:
        return f"mask {mask.name!r} has rank {len(mask.shape)}, expected [batch, total_sequence_length]"
    return None


def opset_in(imports, default: int) -> int:
    return int(imports.get("", imports.get("ai.onnx", default)))


def mask_like(v: ir.Value) -> bool:
    return v.is_graph_input() and v.dtype in INT_TYPES and v.shape is not None and len(v.shape) == 2


def broken(node: ir.Node, why: str) -> Broken:
    return Broken(f"{node.op_type} {node.name!r} {why}", node)


def say(x: object, name: str = "the mask") -> str:
    """One element of a shape value in words (the mask's dimensions as the mask's, not as positions')."""
    if isinstance(x, Dim):
        return f"dimension {x.axis} of {name}"
    if isinstance(x, Affine):
        return f"{x.scale} * dimension {x.dim.axis} of {name} {x.offset:+d}".removeprefix("1 * ")
    return repr(x) if isinstance(x, Foreign) else "a number set per call" if x is OPAQUE or isinstance(x, type(
        OPAQUE)) else str(x)


def show(val: Val, mask: ir.Value | None) -> str:
    name = repr(mask.name) if mask is not None else "the mask"
    if isinstance(val, MaskRows):
        return f"elements of {name}"
    if isinstance(val, RowSums):
        return f"row sums of {name} {val.offset:+d} shaped {val.axes}"
    if isinstance(val, Known):
        values = known_values(val)
        if values is not None and values.size <= 8:
            words = [say(x, name) for x in values.reshape(-1).tolist()]
            return f"[{', '.join(words)}]"
        return "a value not read from the mask's width"
    return str(val)


__all__ = ["INT_TYPES", "MASK_INPUT", "Broken", "MaskRows", "RowSums", "Unfollowed", "Val", "broken",
           "mask_like", "mask_problem", "opset_in", "say", "show"]
