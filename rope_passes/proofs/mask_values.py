"""The abstract values of :mod:`rope_passes.proofs.mask_lengths` (the elements of a rank-2 integer graph input, its
row sums, a comparison of them, a tensor of its shape whose elements are no longer its own, a step the proof cannot
follow) and the one test of which graph input is the attention mask.

Row sums are affine forms ``scale * s + offset`` of ``s``, the sum of a row's columns (all of them, or a range
``cols``). Integer ``Add``/``Sub``/``Mul``/``Neg`` keep such a form exactly modulo 2^32 (a ring), which is all
GroupQueryAttention reads (an int32 ``seqlens_k``). Rules that need the number itself (a comparison, a ``Div``) take
``s`` between 0 and :data:`S_MAX` (a mask of 0s and 1s, what every client sends, at most 2^31 - 1 wide) and hold a form
``exact`` only while every number it takes there fits int32 (so no step on the way wrapped, whatever its type)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Union

import onnx_ir as ir

from rope_passes.proofs.dims import Affine, Foreign, Quot
from rope_passes.proofs.known import OPAQUE, Dim, Known, known_values

#: the attention mask's graph input name where no genai_config names it
MASK_INPUT = "attention_mask"
#: the integer types a mask (and a Cast of its values that keeps them) may have
INT_TYPES = (ir.DataType.INT64, ir.DataType.INT32)
#: the largest row sum (a 0/1 mask at most 2^31 - 1 wide: :data:`rope_passes.proofs.dims.DIM_MAX`)
S_MAX = (1 << 31) - 1
_INT32 = (-(1 << 31), (1 << 31) - 1)
#: a ``Slice`` end past every column (``cols``)
END = "end"


@dataclasses.dataclass(frozen=True)
class MaskRows:
    source: ir.Value  # the rank-2 integer graph input whose elements these are
    axes: tuple  # "b" | "t" | 1 per axis
    width: object  # extent of the "t" axis: Dim(1) (the input's own) or OPAQUE (padded, sliced)
    extra: int = 0  # added to each row's sum by Pad columns
    running: int = 0  # 1: each element is the sum of its row up to it (CumSum); -1: from it to the row's end
    scale: int = 1  # each element is the mask's times this (Mul, Neg)
    cols: tuple | None = None  # (start, end) of a Slice of the columns (a number, a symbol, 0, END); None: all


@dataclasses.dataclass(frozen=True)
class RowSums:
    source: ir.Value
    axes: tuple  # "b" | 1 per axis
    offset: int  # the value is scale * sum(row's cols) + offset
    scale: int = 1
    cols: tuple | None = None  # the columns summed (:class:`MaskRows`), None: all
    exact: bool = True  # every value the form takes for 0 <= s <= S_MAX is its number (nothing wrapped on the way)

    @property
    def form(self) -> tuple:
        """What the value is of the sums (not where it sits): for the node that last changed it."""
        return self.scale, self.offset, self.cols

    def span(self) -> tuple[int, int]:
        ends = (self.offset, self.scale * S_MAX + self.offset)
        return min(ends), max(ends)

    def moved(self, scale: int, offset: int, exact: bool = True) -> RowSums:
        """``scale * s + offset`` of the same sums, exact where this one is and every number it takes fits int32."""
        out = dataclasses.replace(self, scale=scale, offset=offset)
        lo, hi = out.span()
        return dataclasses.replace(out, exact=self.exact and exact and _INT32[0] <= lo and hi <= _INT32[1])

    def words(self, name: str) -> str:
        if (self.scale, self.cols) == (1, None):
            return f"the row sums of {name} {self.offset:+d}"
        cols = "" if self.cols is None else f" over columns [{say(self.cols[0])}, {say(self.cols[1])})"
        scale = {1: "", -1: "-"}.get(self.scale, f"{self.scale} * ")
        return f"{scale}(the row sums of {name}{cols}) {self.offset:+d}"


@dataclasses.dataclass(frozen=True)
class RowTest:
    """A comparison of row sums: true where ``s`` (the sum of the row's ``cols``) lies in one of ``truth``'s closed
    ranges (``s`` between 0 and :data:`S_MAX`)."""

    source: ir.Value
    axes: tuple
    cols: tuple | None
    truth: tuple[tuple[int, int], ...]

    def negated(self) -> RowTest:
        out, start = [], 0
        for lo, hi in self.truth:
            if lo > start:
                out.append((start, lo - 1))
            start = hi + 1
        if start <= S_MAX:
            out.append((start, S_MAX))
        return dataclasses.replace(self, truth=tuple(out))


@dataclasses.dataclass(frozen=True)
class MaskShape(Known):
    """A tensor whose extents are the mask's (or computed from them) but whose elements are no longer its values (a
    ``Cast`` to float, a ``Concat``): ``Shape`` reads it; a value read from it carries ``why``."""

    why: Broken | None = None


@dataclasses.dataclass(frozen=True)
class Broken:
    reason: str
    node: ir.Node | None = None


Val = Union[MaskRows, RowSums, RowTest, Known, Broken]  # noqa: UP007


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
    if isinstance(x, Quot):
        return f"({say(x.num, name)}) / {x.k}"
    if x == END:
        return "the end"
    return repr(x) if isinstance(x, Foreign) else "a number set per call" if x is OPAQUE or isinstance(x, type(
        OPAQUE)) else str(x)


def show(val: Val, mask: ir.Value | None) -> str:
    name = repr(mask.name) if mask is not None else "the mask"
    if isinstance(val, MaskRows):
        return f"elements of {name}"
    if isinstance(val, RowSums):
        return f"{val.words(name).removeprefix('the ')} shaped {val.axes}"
    if isinstance(val, RowTest):
        return f"a comparison of the row sums of {name}"
    if isinstance(val, Known):
        values = known_values(val)
        if values is not None and values.size <= 8:
            words = [say(x, name) for x in values.reshape(-1).tolist()]
            return f"[{', '.join(words)}]"
        return "a value not read from the mask's width"
    return str(val)


__all__ = ["END", "INT_TYPES", "MASK_INPUT", "S_MAX", "Broken", "MaskRows", "MaskShape", "RowSums", "RowTest",
           "Unfollowed", "Val", "broken",
           "mask_like", "mask_problem", "opset_in", "say", "show"]
