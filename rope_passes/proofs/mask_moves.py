"""The steps of :class:`rope_passes.proofs.mask_walk.Walk` that move a view of the mask without changing its elements
(or, for ``CumSum``/``Gather``, turn them into running sums and read the one column that is each row's sum).

Each works on the view's axes (``"b"`` the batch, ``"t"`` the columns, ``1`` unit axes, in memory order) and their
extents (``Dim(0)`` the mask's batch, ``Dim(1)`` its width, ints, OPAQUE), and raises
:class:`~rope_passes.proofs.mask_values.Unfollowed` where the step is not exact for every mask:

* ``Transpose``: the axes permuted (the elements of a row stay a row's, along wherever ``"t"`` went);
* ``Reshape``: each target entry resolved to an axis (``1``; ``0`` copies the input's extent at that place; a
  symbol that *is* the batch or the width, e.g. ``Shape(mask)``; ``-1`` the one axis the others leave), and the batch
  and columns must keep their order: a reshape that only adds or drops unit axes. ``-1`` beside a batch of 0 is
  refused by onnxruntime itself (it cannot infer it), so the original fails where this reads the lengths;
* ``Flatten``/``Squeeze``/``Unsqueeze``: unit axes added or dropped, never the batch merged with the columns;
* ``Expand``: to 1 or to the axis's own extent on every axis (``Expand(mask, Shape(mask))``), new leading unit
  axes; ``Tile``: by repeats of 1;
* ``CumSum`` along the columns, not exclusive: running sums (``reverse``: from the end); its last column (the first
  for ``reverse``) is each row's sum, read by ``Gather`` at index -1 (0), or at ``width - 1``. A mask of width 0 has
  no such column: onnxruntime's Gather refuses the index there, so the original fails where this reads 0.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rope_passes.proofs.dims import Dim, affine
from rope_passes.proofs.mask_values import MaskRows, RowSums, Unfollowed, Val, say


def _int(e: object) -> int | None:
    return int(e) if isinstance(e, (int, np.integer)) and not isinstance(e, (bool, np.bool_)) else None


def _axes(axes: tuple) -> str:
    return "[" + ", ".join({"b": "batch", "t": "columns"}.get(a, "1") for a in axes) + "]"


def _entries(entries: list) -> str:
    return "[" + ", ".join(say(e) for e in entries) + "]"


def transpose(axes: tuple, perm: list[int] | None) -> tuple:
    order = list(range(len(axes)))[::-1] if perm is None else [p % len(axes) for p in perm]
    if sorted(order) != list(range(len(axes))):
        raise Unfollowed(f"permutes by {perm}: not a permutation of {len(axes)} axes")
    return tuple(axes[p] for p in order)


def reshape(axes: tuple, extents: tuple, entries: list, allowzero: bool) -> tuple:
    """The axes after ``Reshape(x, entries)``: every entry resolved to an axis of ``x``, the non-unit axes in order."""
    out: list = []
    hole = None
    for i, e in enumerate(entries):
        k = _int(e)
        if k == 0 and not allowzero and i < len(axes):
            out.append(axes[i])
        elif k == 1:
            out.append(1)
        elif k == -1 and hole is None:
            hole = len(out)
            out.append(None)
        elif isinstance(e, Dim) and any(a != 1 and x == e for a, x in zip(axes, extents, strict=True)):
            out.append(next(a for a, x in zip(axes, extents, strict=True) if a != 1 and x == e))
        else:
            raise Unfollowed(f"reshapes to extent {say(e)}: not known to be the mask's batch or width for every call")
    big = [a for a in axes if a != 1]
    if hole is not None:
        rest = list(big)
        for a in out:
            if a not in (1, None):
                if a not in rest:
                    raise Unfollowed(f"reshapes {_axes(axes)} to {_entries(entries)}: not only unit axes moved")
                rest.remove(a)
        if len(rest) > 1:
            raise Unfollowed(f"reshapes {_axes(axes)} to {_entries(entries)}: its -1 merges the batch with the columns")
        out[hole] = rest[0] if rest else 1
    if [a for a in out if a != 1] != big:
        raise Unfollowed(f"reshapes {_axes(axes)} to {_entries(entries)}: not only unit axes moved (the batch and the "
                         "columns would mix)")
    return tuple(out)


def unit_moves(op: str, axes: tuple, given: list[int] | None, flatten_axis: int = 1) -> tuple:
    """``Unsqueeze`` (``given``: the new axes), ``Squeeze`` (the dropped axes), ``Flatten`` (at ``flatten_axis``)."""
    out = list(axes)
    if op == "Unsqueeze":
        rank = len(out) + len(given or [])
        for a in sorted(a % rank for a in given or []):
            out.insert(a, 1)
        return tuple(out)
    if op == "Squeeze":
        if given is None:
            raise Unfollowed("has no axes: it squeezes the batch too when the batch is 1")
        drop = {a % len(out) for a in given}
        if any(out[a] != 1 for a in drop):
            raise Unfollowed("squeezes an axis that is not a unit axis")
        return tuple(a for i, a in enumerate(out) if i not in drop)
    cut = flatten_axis % (len(out) + 1)
    groups = [out[:cut], out[cut:]]
    if any(len([a for a in g if a != 1]) > 1 for g in groups):
        raise Unfollowed("flattens the batch with the columns")
    return tuple(next((a for a in g if a != 1), 1) for g in groups)


def expand(axes: tuple, extents: tuple, entries: list) -> tuple:
    """``Expand(x, entries)`` where it copies nothing: every entry 1 or the axis's own extent."""
    rank = max(len(axes), len(entries))
    full = [1] * (rank - len(axes)) + list(axes)
    exts = [1] * (rank - len(extents)) + list(extents)
    for a, x, e in zip(full, exts, [1] * (rank - len(entries)) + list(entries), strict=True):
        if _int(e) != 1 and not (a != 1 and isinstance(e, Dim) and e == x):
            raise Unfollowed(f"expands an axis of extent {say(x)} to {say(e)}: it copies the mask's elements")
    return tuple(full)


def tile(repeats: list[int]) -> None:
    if any(r != 1 for r in repeats):
        raise Unfollowed(f"tiles by {repeats}: it copies the mask's elements")


def cumsum(x: MaskRows | RowSums, axis: int, exclusive: bool, reverse: bool) -> Val:
    along = x.axes[axis % len(x.axes)]
    if exclusive:
        raise Unfollowed("is exclusive: no column of it is a row's whole sum (the last leaves out the last element)")
    if along == 1:
        return x  # a running sum along a unit axis: each element itself
    if along != "t" or not isinstance(x, MaskRows):
        raise Unfollowed("runs along the batch: its sums mix rows")
    if x.running:
        raise Unfollowed("sums running sums again")
    if x.cols is not None:
        raise Unfollowed("runs along a slice of the columns: the proof follows running sums of whole rows")
    return dataclasses.replace(x, running=-1 if reverse else 1)


def gather(x: MaskRows | RowSums, index: np.ndarray, axis: int) -> Val:
    """``Gather(x, index, axis)``: a unit axis read at 0/-1, or the column of a running sum that is the row's sum."""
    ax = axis % len(x.axes)
    along = x.axes[ax]
    axes = (*x.axes[:ax], *(1,) * index.ndim, *x.axes[ax + 1:])
    picked = set(index.reshape(-1).tolist())
    if index.size != 1:  # several indices: the picked elements repeated along a new axis of that extent
        raise Unfollowed(f"reads {index.size} elements along axis {axis}: copies, not one row value each")
    if along == 1 and picked <= {0, -1}:
        return dataclasses.replace(x, axes=axes)
    if along == "t" and isinstance(x, MaskRows) and x.running:
        ends = {-1, affine(x.width, 1, -1)} if x.running == 1 and isinstance(x.width, Dim) else \
            {-1} if x.running == 1 else {0}
        if picked and picked <= ends:
            return RowSums(x.source, axes, 0).moved(x.scale, x.extra)
        raise Unfollowed(f"reads column {_entries(sorted(picked, key=str))} of running sums: not the one that sums the whole "
                         f"row ({'the last' if x.running == 1 else 'the first, for reverse=1'})")
    what = "rows of the batch" if along == "b" else "single columns of the mask"
    raise Unfollowed(f"reads {what} (indices {_entries(sorted(picked, key=str))} along axis {axis})")


__all__ = ["cumsum", "expand", "gather", "reshape", "tile", "transpose", "unit_moves"]
