"""The position sweep (:mod:`rope_passes.check.sweep`: single decode steps at positions over the whole table, each
after a random past), compared position by position in the decode's pairs (:func:`.decode.pairs`);
``OutputDiff.step`` is the position. Where the runtime is as far from the CPU EP on the original,
``rewritten@webgpu vs original@cpu`` does not count (:func:`.decode.own_error`)."""

from __future__ import annotations

from rope_passes.check.compare import Comparison, OutputDiff, diff_arrays
from rope_passes.check.evidence import Evidence
from rope_passes.check.evidence.decode import compare_pair, own_error, pairs
from rope_passes.check.spec import LOAD_FAILED, RunResult
from rope_passes.check.sweep import spans

NAME = "sweep"


def compare(ev: Evidence) -> list[Comparison]:
    if not ev.plan.positions:
        return []
    out = [compare_pair(ev, p, NAME, compare_sweep, lambda r: r is not None and r.status != LOAD_FAILED)
           for p in pairs(ev, sweep=True)]
    if ev.ep == "webgpu" and (note := own_error(out, ev.rewritten_key, NAME)):
        ev.notes.append(note)
    return out


def compare_sweep(comparison: Comparison, actual: RunResult, reference: RunResult, offset: int | None = None
                  ) -> Comparison:
    """Fill ``comparison`` from two runs' sweeps. A position where the actual run raised and the reference did not
    is a ``(run)`` failure; positions the reference could not run (or past a concatenated LongRoPE ``offset``) are
    not compared, and the reason says so."""
    skipped_at = []
    for p in sorted(set(actual.sweep) | set(actual.sweep_errors)):
        if offset is not None and p + 1 > offset:
            continue
        if p in reference.sweep_errors or p not in reference.sweep:
            skipped_at.append(p)
        elif p in actual.sweep_errors:
            comparison.diffs.append(OutputDiff.failed(p, f"{actual.label} failed at this position: "
                                                         f"{actual.sweep_errors[p]}"))
        else:
            for name, ref in reference.sweep[p].items():
                got = actual.sweep[p].get(name)
                comparison.diffs.append(diff_arrays(got, ref, comparison.tolerance, p, name) if got is not None else
                                        OutputDiff.failed(p, "output missing from this run", name))
    notes = [f"{reference.label} could not run position(s) {spans(skipped_at)}"
             + (f": {reference.sweep_errors[skipped_at[0]]}" if skipped_at[0] in reference.sweep_errors else "")
             ] if skipped_at else []
    if offset is not None:
        notes.append(f"positions below the LongRoPE offset {offset} only")
    return comparison.settle(notes, "no position to compare")


__all__ = ["NAME", "compare", "compare_sweep"]
