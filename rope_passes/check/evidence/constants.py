"""The constants both graphs keep under one name, compared at their own precision (no session).

A rewrite that keeps an initializer's name, type and shape but changes its values (a weight or a table it touched)
is a difference when any element moves by more than 1 ulp of the stored type: a 1 % change to one fp16 row moves
the logits by ~0.03, under the end-to-end fp16 tolerance (0.1), so the decode alone would not see it. Integer
constants must be equal. Initializers of another type or shape under the same name (a pass that narrows or
re-lays a tensor), and ones only one graph has, are left to the runs; initializers over :data:`MAX_BYTES` are not
read (real-size weights: the runs compare what they compute).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rope_passes.check.compare import Comparison, OutputDiff, Tolerance
from rope_passes.check.evidence import Evidence

NAME = "constants"
#: the largest initializer read for the comparison (bytes)
MAX_BYTES = 64 << 20
#: the tolerance the comparison prints: ulps of the stored type
ULPS = 1.0


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| in ulps of ``b``'s stored float type (at least the smallest subnormal's spacing)."""
    spacing = np.abs(np.spacing(b.astype(b.dtype))).astype(np.float64)
    return np.abs(a.astype(np.float64) - b.astype(np.float64)) / np.maximum(spacing, np.finfo(b.dtype).smallest_subnormal)


def compare(ev: Evidence) -> list[Comparison]:
    """``constants: rewritten vs original`` (``tables=False``: none): one :class:`OutputDiff` per shared initializer
    whose values differ (``max_abs`` the largest difference, ``max_rel`` the largest in ulps); skipped when nothing is
    shared."""
    if not ev.opts.tables:
        return []
    c = Comparison("rewritten", "original", Tolerance(0.0, 0.0, f"stored type, <= {ULPS:g} ulp"), True, kind=NAME)
    if ev.orig.model is None or ev.rew.model is None:
        c.status, c.reason = "skipped", "a model was not read"
        return [c]
    a, b = ev.orig.model.graph.initializers, ev.rew.model.graph.initializers
    shared, large = 0, 0
    for name in sorted(set(a) & set(b)):
        va, vb = a[name].const_value, b[name].const_value
        if va is None or vb is None or va.dtype != vb.dtype or tuple(va.shape) != tuple(vb.shape):
            continue
        if va.nbytes > MAX_BYTES:
            large += 1
            continue
        shared += 1
        x, y = np.asarray(vb.numpy()), np.asarray(va.numpy())  # actual (rewritten), reference (original)
        if x.tobytes() == y.tobytes():
            continue
        c.diffs.append(_diff(name, x, y))
    c.reason = f"{shared} initializer(s) of the same name, type and shape compared" + (
        f"; {large} over {MAX_BYTES >> 20} MB not read" if large else "")
    if not shared:
        c.status = "skipped"
    c.counts = not c.ok  # a changed constant is a difference; equal constants vouch for nothing the runs did not
    return [c]


def _diff(name: str, x: np.ndarray, y: np.ndarray) -> OutputDiff:
    kind: Any = y.dtype.kind
    if kind == "f" or y.dtype.name == "bfloat16":
        ref = y.astype(np.float32) if y.dtype.name == "bfloat16" else y
        got = x.astype(np.float32) if x.dtype.name == "bfloat16" else x
        ulps = _ulps(got, ref)
        nan = np.isnan(got.astype(np.float64)) & np.isnan(ref.astype(np.float64))
        ulps[nan] = 0
        worst = int(np.argmax(ulps))
        idx = np.unravel_index(worst, y.shape) if y.ndim else ()
        err = float(np.abs(got.astype(np.float64) - ref.astype(np.float64)).ravel()[worst])
        ok = bool(ulps.max() <= ULPS)
        return OutputDiff(0, name, err, float(ulps.max()), ok,
                          "" if ok else f"{int((ulps > ULPS).sum())} element(s) over {ULPS:g} ulp; the largest at "
                          f"{list(map(int, idx))}: original {float(ref.ravel()[worst]):.6g}, rewritten "
                          f"{float(got.ravel()[worst]):.6g} ({float(ulps.max()):.3g} ulp of {y.dtype})")
    changed = x != y
    first = np.unravel_index(int(np.argmax(changed)), y.shape) if y.ndim else ()
    return OutputDiff(0, name, float(np.abs(x.astype(np.float64) - y.astype(np.float64)).max()), float("inf"),
                      False, f"{int(changed.sum())} element(s) differ; the first at {list(map(int, first))}")


__all__ = ["MAX_BYTES", "NAME", "ULPS", "compare"]
