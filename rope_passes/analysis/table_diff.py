"""Compare the cos/sin rows two graphs read at every position, at the tables' own precision.

For each rotation site (:mod:`rope_passes.analysis.rotation_tables`) the totals are cut where either graph switches tables, and in each such
range every position ``0..T-1`` is compared row by row. An element passes when it differs by at most ``ulps``
units in the last place of the coarser of the two table types (both rounded to it first): an fp16 table must be
exact or 1 ulp off (~5e-4 at 1.0), an fp32 one within ~1.2e-7, far below the end-to-end logits tolerance, so a
single cos/sin value off by 1e-2 anywhere in the table is a failure that names its row.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from rope_passes.analysis.rotation_tables import GraphTables, Regime, SiteRows

#: significand bits and smallest normal exponent per table type
_FLOATS = {"float16": (10, -14), "bfloat16": (7, -126), "float32": (23, -126), "float64": (52, -1022)}


def _coarser(a: str, b: str) -> str:
    return min((a, b), key=lambda d: _FLOATS.get(d, (23, 0))[0])


def ulp(x: np.ndarray, dtype: str) -> np.ndarray:
    """One unit in the last place of ``dtype`` at the magnitudes ``x`` (float64 in and out)."""
    nmant, minexp = _FLOATS.get(dtype, _FLOATS["float32"])
    mag = np.abs(np.asarray(x, np.float64))
    exp = np.floor(np.log2(np.where(mag > 0, mag, 1.0)))
    exp = np.where(mag > 0, np.maximum(exp, minexp), minexp)
    return np.exp2(exp - nmant)


def _rounded(array: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        import ml_dtypes

        return np.asarray(array, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    return np.asarray(array, np.float32 if dtype == "float32" else np.float64).astype(dtype).astype(np.float64)


@dataclasses.dataclass
class TableDiff:
    """The first differing row of one site (or a structural difference: pairing, width, coverage)."""

    site: str
    position: int
    totals: tuple[int, int]  # the totals over which this position reads the differing row
    table: str = ""  # "cos" | "sin" ("" for a structural difference)
    column: int = -1
    original: float = float("nan")
    rewritten: float = float("nan")
    ulps: float = float("inf")
    original_row: str = ""  # "row 48 of 'cos_cache'/'sin_cache' (...)"
    rewritten_row: str = ""
    reason: str = ""

    def line(self) -> str:
        where = f"{self.site}, position {self.position} (totals {self.totals[0]}..{self.totals[1]})"
        if self.reason:
            return f"{where}: {self.reason}"
        return (f"{where}: {self.table} column {self.column}: original {self.original:.6g} ({self.original_row}), "
                f"rewritten {self.rewritten:.6g} ({self.rewritten_row}), {self.ulps:.3g} ulp")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["totals"] = list(self.totals)
        for key in ("original", "rewritten", "ulps"):
            out[key] = out[key] if np.isfinite(out[key]) else None
        out["line"] = self.line()
        return out


@dataclasses.dataclass
class TableComparison:
    """Every site's rows at every position, original vs rewritten."""

    status: str = "compared"  # compared | skipped
    reason: str = ""  # why skipped
    positions: int = 0  # positions 0..positions-1 compared
    sites: int = 0
    precision: str = ""  # e.g. "float16 (<= 1 ulp)"
    max_ulps: float = 0.0
    diffs: list[TableDiff] = dataclasses.field(default_factory=list)  # the first per site, earliest first
    original_semantics: list[str] = dataclasses.field(default_factory=list)
    rewritten_semantics: list[str] = dataclasses.field(default_factory=list)
    form: str = ""  # "rotations" | "position cone"

    counts = True

    @property
    def ok(self) -> bool:
        return self.status == "compared" and not self.diffs

    @property
    def first(self) -> TableDiff | None:
        return self.diffs[0] if self.diffs else None

    def summary(self) -> str:
        if self.status != "compared":
            return f"not compared: {self.reason}"
        head = (f"{self.sites} {'sites' if self.form == 'rotations' else 'position tables'}, positions "
                f"0..{self.positions - 1}, {self.precision}")
        if self.ok:
            return f"equal ({head}; largest difference {self.max_ulps:.3g} ulp)"
        return f"DIFFERENT ({head}): first: {self.diffs[0].line()}"  # not ok: there is a first

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason, "ok": self.ok, "form": self.form,
                "positions": self.positions, "sites": self.sites, "precision": self.precision,
                "max_ulps": self.max_ulps if np.isfinite(self.max_ulps) else None,
                "first_difference": self.first.to_dict() if self.first else None,
                "differences": [d.to_dict() for d in self.diffs],
                "original_semantics": self.original_semantics, "rewritten_semantics": self.rewritten_semantics,
                "summary": self.summary()}


def _row(regime: Regime, position: int, table: str) -> str:
    return f"row {regime.offset + position} of {regime.at(table)}"


def _compare_rows(site: str, a: Regime, b: Regime, n: int, lo: int, hi: int, dtype: str,
                  ulps: float) -> tuple[TableDiff | None, float]:
    worst = 0.0
    first: TableDiff | None = None
    for name in ("cos", "sin"):
        x = _rounded(getattr(a, name)[a.offset:a.offset + n], dtype)
        y = _rounded(getattr(b, name)[b.offset:b.offset + n], dtype)
        unit = ulp(np.maximum(np.abs(x), np.abs(y)), dtype)
        err = np.abs(x - y) / unit
        err = np.where(np.isnan(err), np.inf, err)
        if err.size:
            worst = max(worst, float(err.max()))
        bad = err > ulps
        if not bad.any():
            continue
        p = int(np.argmax(bad.any(axis=1)))
        if first is not None and first.position <= p:
            continue
        c = int(np.argmax(bad[p]))
        first = TableDiff(site, p, (max(lo, p + 1), hi), name, c, float(x[p, c]), float(y[p, c]), float(err[p, c]),
                          _row(a, p, name), _row(b, p, name))
    return first, worst


def _compare_site(a: SiteRows, b: SiteRows, end: int, ulps: float, memo: dict) -> tuple[TableDiff | None, float, int]:
    """The first difference of one site pair, the largest difference in ulp, positions compared."""
    if a.interleaved is not None and b.interleaved is not None and a.interleaved != b.interleaved:
        pairs = {True: "interleaved pairs", False: "rotate-half pairs"}
        return TableDiff(b.key, 0, (1, end), reason=f"the original rotates {pairs[a.interleaved]}, the rewritten "
                                                    f"{pairs[b.interleaved]}"), float("inf"), 0
    if a.width != b.width:
        return TableDiff(b.key, 0, (1, end), reason=f"the original's tables are {a.width} columns wide "
                                                    f"(rotary_dim {2 * a.width}), the rewritten's {b.width}"), \
            float("inf"), 0
    dtype = _coarser(a.dtype, b.dtype)
    starts = sorted({1} | {r.first for r in a.regimes + b.regimes if r.first <= end})
    worst, compared = 0.0, 0
    for i, lo in enumerate(starts):
        hi = min(end, starts[i + 1] - 1) if i + 1 < len(starts) else end
        ra, rb = a.regime(lo), b.regime(lo)
        na, nb = min(hi, ra.covers), min(hi, rb.covers)
        n = min(na, nb)
        key = (id(ra.cos), id(ra.sin), ra.offset, id(rb.cos), id(rb.sin), rb.offset, n, lo, hi, dtype)
        if key not in memo:
            memo[key] = _compare_rows(b.key, ra, rb, n, lo, hi, dtype, ulps)
        diff, w = memo[key]
        if diff is not None:
            diff = dataclasses.replace(diff, site=b.key)
        worst, compared = max(worst, w), max(compared, n)
        if diff is None and nb < na:
            diff = TableDiff(b.key, nb, (nb + 1, hi), reason=(
                f"the rewritten graph has no row for it: {rb.cos_at} has {rb.cos.shape[0]} rows"
                + (f" read from offset {rb.offset}" if rb.offset else "")
                + f"; the original reads {_row(ra, nb, 'cos')}"))
        if diff is not None:
            return diff, worst, compared
    return None, worst, compared


def compare_tables(original: GraphTables, rewritten: GraphTables, limit: int | None = None,
                   ulps: float = 1.0) -> TableComparison:
    """Compare every site's rows at positions ``0..end-1``: ``end`` is ``limit`` (the context length) or what the
    original's tables cover, whichever is smaller."""
    out = TableComparison(original_semantics=list(original.semantics), rewritten_semantics=list(rewritten.semantics),
                          form=original.kind)
    for what, tables in (("original", original), ("rewritten", rewritten)):
        if tables.unavailable:
            out.status, out.reason = "skipped", f"the {what} graph's rotations are not read: {tables.unavailable}"
            return out
    if original.kind != rewritten.kind:
        out.status, out.reason = "skipped", (f"the original is read as {original.kind}, the rewritten as "
                                             f"{rewritten.kind}: nothing to pair")
        return out
    keys_a, keys_b = [s.key for s in original.sites], [s.key for s in rewritten.sites]
    if keys_a != keys_b:
        out.status, out.reason = "skipped", (f"the graphs rotate at different sites ({len(keys_a)} vs "
                                             f"{len(keys_b)})")
        return out
    covers = original.covers or 0
    end = min(covers, limit) if limit else covers
    dtypes = {s.dtype for s in original.sites} | {s.dtype for s in rewritten.sites}
    coarse = dtypes.pop()
    for d in dtypes:
        coarse = _coarser(coarse, d)
    out.precision = f"{coarse} (<= {ulps:g} ulp)"
    out.sites, out.positions = len(keys_a), end
    memo: dict = {}
    for a, b in zip(original.sites, rewritten.sites, strict=True):
        diff, worst, _ = _compare_site(a, b, end, ulps, memo)
        out.max_ulps = max(out.max_ulps, worst)
        if diff is not None:
            out.diffs.append(diff)
    out.diffs.sort(key=lambda d: d.position)
    return out
