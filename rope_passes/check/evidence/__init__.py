"""Kinds of evidence, each one module that compares its part of every run over one :class:`Evidence`; :data:`KINDS`
names them in order. A kind is a module with ``NAME`` (its comparisons' ``Comparison.kind``), ``compare(ev) ->
list[Comparison]``, optionally ``failure_line(comparison) -> str | None`` (its own line in the report's first
failures) and, for calls of its own (:mod:`.capture_ab`, :mod:`.calls`), ``parts(plan, spec, info)`` (what the run
``spec`` of the graph ``info`` makes of it, as JSON data; None: nothing) and ``run(backend, spec, table, data,
session, dspec) -> list[dict[str, ndarray]]`` (in the run's own process after its decode, on its backend, with its
session and decoder spec: ``RunResult.parts[NAME]``, an exception ``RunResult.part_errors[NAME]``).
The run loop (:func:`rope_passes.check.runner.execute_run`) makes the decode, the schedules and the sweep itself.
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any

from rope_passes.check.spec import ORIGINAL, REWRITTEN, RunKey, RunResult, RunSpec

if TYPE_CHECKING:
    from rope_passes.check.compare import Comparison
    from rope_passes.check.models import ModelInfo
    from rope_passes.check.plan import CheckOptions, CheckPlan

#: every kind of evidence, in the order of the report
KINDS = tuple(f"rope_passes.check.evidence.{m}"
              for m in ("decode", "sweep", "schedules", "calls", "constants", "capture_ab"))


@dataclasses.dataclass
class Evidence:
    """What every kind compares and the verdict reads: the frozen plan, the options, both models, every run, and
    the notes so far (the plan's, then what the comparisons and the verdict add)."""

    plan: CheckPlan
    opts: CheckOptions
    orig: ModelInfo
    rew: ModelInfo
    runs: list[RunResult]
    notes: list[str] = dataclasses.field(default_factory=list)
    reference_logits: Any = None  # --reference-logits, read (a [rows, vocab] array)
    fallback_python: str | None = None  # the second runtime's interpreter, when the original ran there
    fallback_wanted: str | None = None  # the one that would have been used

    @property
    def by(self) -> dict[RunKey, RunResult]:
        return {r.key: r for r in self.runs}

    @property
    def ep(self) -> str:
        return self.opts.ep

    @property
    def rewritten_key(self) -> RunKey:
        return RunKey(REWRITTEN, self.ep)

    @property
    def captured_key(self) -> RunKey:
        return RunKey(REWRITTEN, "webgpu", capture=True)

    @property
    def fallback_runtime(self) -> str | None:
        """The runtime the original ran on instead (the check runtime's fallback), when it did."""
        return next((r.key.runtime for r in self.runs if r.key.elsewhere), None) if self.fallback_python else None

    @property
    def runtimes(self) -> list[str | None]:
        """The runtimes the original's runs are references on: the check's (None), then the fallback's."""
        return [None] + ([self.fallback_runtime] if self.fallback_runtime else [])

    def original(self, ep: str) -> RunResult | None:
        """The original's run on ``ep`` a rewritten run there is compared with, where it ran: here, else on the
        fallback."""
        keys = (RunKey(ORIGINAL, ep), RunKey(ORIGINAL, ep, self.fallback_runtime))
        return next((self.by[k] for k in keys if ran(self.by.get(k))), None)


def ran(run: RunResult | None) -> bool:
    """The run made calls to compare (all of them, or the steps before one that raised)."""
    return run is not None and (run.ok or bool(run.steps))


def concat_offset(*infos: ModelInfo) -> int | None:
    """The smallest concatenated LongRoPE offset of ``infos`` (None: none): the CPU EP is wrong past it."""
    offsets = [m.longrope.switch for m in infos if m.longrope is not None and m.longrope.kind == "concat"]
    return min(offsets) if offsets else None


def kinds() -> list[ModuleType]:
    """The kind modules of :data:`KINDS`, imported."""
    return [importlib.import_module(name) for name in KINDS]


def kind(name: str) -> ModuleType:
    """The kind whose ``NAME`` is ``name`` (KeyError: none)."""
    found = next((k for k in kinds() if name == k.NAME), None)
    if found is None:
        raise KeyError(name)
    return found


def parts(plan: CheckPlan | None, spec: RunSpec, info: ModelInfo) -> dict[str, Any]:
    """What the run ``spec`` of the graph ``info`` makes of each kind that makes calls of its own
    (``RunSpec.parts``)."""
    return {k.NAME: data for k in kinds() if hasattr(k, "parts") and (data := k.parts(plan, spec, info)) is not None}


def compare_all(ev: Evidence) -> list[Comparison]:
    """Every kind's comparisons, in :data:`KINDS` order."""
    return [c for k in kinds() for c in k.compare(ev)]


__all__ = ["KINDS", "Evidence", "compare_all", "concat_offset", "kind", "kinds", "parts", "ran"]
