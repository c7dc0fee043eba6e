"""The checker's answer: runs, comparisons (decode steps, sweep positions), the rotation-table comparison, the
reference used, the WebGPU runtime it is for, and the verdict (exit code 0 equivalent / 1 not equivalent / 2 could
not run / 3 equivalent on the rotation tables alone; :data:`EXIT_CODES`, JSON ``evidence``: full | tables-only)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from rope_passes.analysis.table_diff import TableComparison
from rope_passes.check.compare import Comparison, OutputDiff
from rope_passes.check.models import ModelInfo
from rope_passes.check.schedules import Schedule
from rope_passes.check.spec import REWRITTEN, RunKey, RunResult
from rope_passes.runtime.adapter import AdapterInfo

EQUIVALENT, NOT_EQUIVALENT, COULD_NOT_RUN = "equivalent", "not equivalent", "could not run"
#: equivalent on the evidence of the rotation tables alone: no run of the original anywhere to compare outputs with
EQUIVALENT_TABLES_ONLY = "equivalent (rotation tables only: the original runs nowhere here)"
#: 0 equivalent (outputs compared), 1 not equivalent, 2 could not run, 3 equivalent on the rotation tables alone (a
#: weaker tier: a script tells it from a full check by the exit code, or the JSON's ``evidence``)
EXIT_CODES = {EQUIVALENT: 0, EQUIVALENT_TABLES_ONLY: 3, NOT_EQUIVALENT: 1, COULD_NOT_RUN: 2}
#: the JSON's ``evidence`` per verdict: what an equivalence rests on
EVIDENCE = {EQUIVALENT: "full", EQUIVALENT_TABLES_ONLY: "tables-only"}


@dataclasses.dataclass
class EquivalenceReport:
    verdict: str
    original: ModelInfo
    rewritten: ModelInfo
    ep: str
    prefill: int
    steps: int
    runs: list[RunResult]
    comparisons: list[Comparison]
    notes: list[str]
    adapter: AdapterInfo | None
    wall_s: float
    tables: TableComparison | None = None  # the rotation-level comparison (None: not asked for)
    sweep_positions: list[int] = dataclasses.field(default_factory=list)
    reference: str = ""  # what the rewritten graph was compared with, in one line
    reason: str = ""  # could not run, or not equivalent with no failing comparison: why, in one line
    runtime: str = ""  # the WebGPU runtime the runs used (rope_passes.runtimes name: "onnxruntime-webgpu", ...)
    schedules: list[Schedule] = dataclasses.field(default_factory=list)  # what the runs fed besides the decode
    exploration: Any = None  # .explore.Exploration with --budget
    fix: str = ""  # the rewritten model is built for another runtime: the optimize command that fits (.fit)

    @property
    def equivalent(self) -> bool:
        return self.verdict in (EQUIVALENT, EQUIVALENT_TABLES_ONLY)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def _first(self, kind: str) -> tuple[Comparison, OutputDiff] | None:
        best = None
        for c in self.comparisons:
            d = c.first_failure if c.counts and c.status == "compared" and c.kind == kind else None
            if d is not None and (best is None or d.step < best[1].step):
                best = (c, d)
        return best

    @property
    def first_failure(self) -> tuple[Comparison, OutputDiff] | None:
        """(comparison, OutputDiff) of the earliest failing decode step among the comparisons that count."""
        return self._first("decode")

    @property
    def first_sweep_failure(self) -> tuple[Comparison, OutputDiff] | None:
        """(comparison, OutputDiff) of the lowest failing sweep position (``OutputDiff.step`` is the position)."""
        return self._first("sweep")

    @property
    def first_schedule_failure(self) -> tuple[Comparison, OutputDiff] | None:
        """(comparison, OutputDiff) of the first failing schedule call (``OutputDiff.schedule`` names it, ``step`` is
        the call), random schedules (``--budget``) after the fixed ones."""
        return self._first("schedule") or self._first("random")

    def schedule(self, name: str) -> Schedule | None:
        found = next((s for s in self.schedules if s.name == name), None)
        if found is None and self.exploration is not None and self.exploration.shrunk is not None:
            found = self.exploration.shrunk if self.exploration.shrunk.name == name else None
        return found

    def first_differences(self) -> list[str]:
        """One line per kind of evidence that failed: decode step, sweep position, table row."""
        lines = []
        for label, found in (("decode step", self.first_failure), ("sweep position", self.first_sweep_failure)):
            if found is not None:
                c, d = found
                lines.append(f"{label} {d.step}, output {d.output}, {c.name}: max abs {d.max_abs:.3g}"
                             + (f" ({d.reason})" if d.reason else ""))
        found = self.first_schedule_failure
        if found is not None:
            c, d = found
            s = self.schedule(d.schedule)
            lines.append(f"schedule {s.summary() if s else d.schedule}: call {d.step}, output {d.output}, {c.name}: "
                         f"max abs {d.max_abs:.3g}" + (f" ({d.reason})" if d.reason else "")
                         + (f"; rerun: --schedule '{s.text()}'" if s else ""))
        found = self._first("constants")
        if found is not None:
            lines.append(f"constant {found[1].output}: {found[1].reason}")
        if self.tables is not None and self.tables.status == "compared" and not self.tables.ok:
            lines.append(f"rotation tables: {self.tables.diffs[0].line()}")  # not ok: there is a first
        from rope_passes.check.evidence import kinds

        lines += [line for kind in kinds() if hasattr(kind, "failure_line") for c in self.comparisons
                  if (line := kind.failure_line(c))]
        return lines

    @property
    def runtime_label(self) -> str:
        """The runtime with its versions, as the rewritten graph's run reported it (``onnxruntime 1.27.0``,
        ``onnxruntime 1.31.1 + onnxruntime-ep-webgpu 0.4.0``); the runtime's name when that run said none."""
        run = self.run(str(RunKey(REWRITTEN, self.ep)))
        return run.runtime if run is not None and run.runtime else self.runtime

    def run(self, label: str) -> RunResult | None:
        return next((r for r in self.runs if r.label == label), None)

    def comparison(self, actual: str, reference: str, kind: str = "decode") -> Comparison | None:
        return next((c for c in self.comparisons if c.actual == actual and c.reference == reference
                     and c.kind == kind), None)

    def to_dict(self) -> dict[str, Any]:
        first = self.first_failure or next(((c, c.first_failure) for c in self.comparisons
                                            if c.counts and c.status == "compared" and c.first_failure), None)
        return {
            "verdict": self.verdict, "exit_code": self.exit_code, "evidence": EVIDENCE.get(self.verdict),
            "fix": self.fix or None, "ep": self.ep, "runtime": self.runtime,
            "runtime_label": self.runtime_label, "reference": self.reference,
            "reason": self.reason,
            "schedule": {"prefill": self.prefill, "steps": self.steps, "total_tokens": self.prefill + self.steps,
                         "sweep_positions": self.sweep_positions,
                         "schedules": [s.to_dict() for s in self.schedules]},
            "exploration": self.exploration.to_dict() if self.exploration is not None else None,
            "original": self.original.to_dict(), "rewritten": self.rewritten.to_dict(),
            "adapter": self.adapter.summary if self.adapter else None,
            "runs": [r.to_dict() for r in self.runs],
            "comparisons": [c.to_dict() for c in self.comparisons],
            "tables": self.tables.to_dict() if self.tables is not None else None,
            "first_failure": None if first is None else {"comparison": first[0].name, "kind": first[0].kind,
                                                         **first[1].to_dict()},
            "first_differences": self.first_differences(),
            "notes": self.notes, "wall_s": round(self.wall_s, 3),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)


def worst(reports: Sequence[EquivalenceReport]) -> str:
    """The worst verdict (``check --runtime all``'s exit): not equivalent (found a difference), else could not run,
    else equivalent on the tables alone, else equivalent."""
    order = (NOT_EQUIVALENT, COULD_NOT_RUN, EQUIVALENT_TABLES_ONLY, EQUIVALENT)
    return min((r.verdict for r in reports), key=order.index)
