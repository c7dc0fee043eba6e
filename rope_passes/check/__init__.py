"""Equivalence checking on onnxruntime (CPU reference, WebGPU, graph capture).

    report = rope_passes.check("original_dir", "rewritten_dir", ep="webgpu", graph_capture=True)
    report.verdict, report.exit_code, report.first_failure

Modules: :mod:`.decode` (decoder inputs), :mod:`.sweep` (single steps after a random past, over the whole table),
:mod:`.runner` (one run, optionally in a subprocess or another interpreter), :mod:`.runtimes` (which WebGPU
runtime the runs use: ``--runtime``), :mod:`.compare` (tolerances, step-by-step diffs), :mod:`.tables` / :mod:`.table_diff` (the cos/sin rows
every position reads, compared at table precision), :mod:`.capture` (graph capture driver), :mod:`.models` (what is
read before running), :mod:`.verdict` (comparisons, reference, verdict), :mod:`.report`, :mod:`.core` (``check``).
Sessions come from :mod:`rope_passes.runtime` (software adapter probe, sessions that really run where they claim,
on either WebGPU runtime; the interpreter of each runtime); nothing here creates one.
"""

from __future__ import annotations

import sys
import types
from typing import Any


def __getattr__(name: str) -> Any:  # lazy: importing rope_passes.check.runtime must not pull in the whole checker
    if name in ("check", "check_runtimes", "EquivalenceReport"):
        from rope_passes.check import core

        return getattr(core, name)
    raise AttributeError(name)


class _CallableModule(types.ModuleType):
    """``rope_passes.check(original, rewritten, **options)`` calls :func:`.core.check`, while
    ``rope_passes.check.runtime`` and friends stay importable submodules."""

    def __call__(self, original: Any, rewritten: Any, **options: Any) -> Any:
        from rope_passes.check.core import check

        return check(original, rewritten, **options)


sys.modules[__name__].__class__ = _CallableModule
