"""Kinds of evidence, each one module that plans its parts, runs them through the run's backend, and compares them
(review 5, step 1). :data:`KINDS` names them in order; nothing else in ``check/`` names a kind.

A kind is a module with

* ``NAME``: the comparison kind (``Comparison.kind``) and the key of its parts in ``RunSpec.parts`` /
  ``RunResult.parts``;
* ``parts(plan, spec) -> data | None``: what the run ``spec`` (a :class:`~rope_passes.check.spec.RunSpec`, its
  :class:`~rope_passes.check.spec.RunKey` at ``spec.key``) makes of this kind, as JSON data (None: nothing);
* ``run(backend, spec, table, data) -> list[dict[str, ndarray]]``: in the run's own process, after the run's decode,
  on the same backend (:class:`~rope_passes.check.backends.RunBackend`); what it returns travels back as
  ``RunResult.parts[NAME]`` (npz files across the subprocess boundary, like every other output); an exception is
  ``RunResult.part_errors[NAME]``;
* ``compare(runs, tolerance) -> list[Comparison]``: ``runs`` maps each :class:`~rope_passes.check.spec.RunKey` to
  its :class:`~rope_passes.check.spec.RunResult`;
* ``failure_line(comparison) -> str | None``: the kind's line in the report's first failures (its own verdict
  line).

The decode, the sweep, the schedules (client, random, exploration) and the tables are still run and compared where
they were (:mod:`rope_passes.check.runner`, :mod:`rope_passes.check.verdict`, :mod:`rope_passes.check.comparisons`);
they move here one by one.
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: every kind of evidence run through the kinds' loop, in order
KINDS = ("rope_passes.check.evidence.capture_ab",)


def kinds() -> list[ModuleType]:
    """The kind modules of :data:`KINDS`, imported."""
    return [importlib.import_module(name) for name in KINDS]


def kind(name: str) -> ModuleType:
    """The kind whose ``NAME`` is ``name`` (KeyError: none)."""
    found = next((k for k in kinds() if name == k.NAME), None)
    if found is None:
        raise KeyError(name)
    return found


__all__ = ["KINDS", "kind", "kinds"]
