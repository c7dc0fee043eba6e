"""Equivalence checking on onnxruntime (CPU reference, WebGPU, graph capture).

    report = rope_passes.check("original_dir", "rewritten_dir", ep="webgpu", graph_capture=True)
    report.verdict, report.exit_code, report.first_failure

Modules: :mod:`.decode` (decoder inputs), :mod:`.runner` (one run, optionally in a subprocess), :mod:`.compare`
(tolerances, step-by-step diffs), :mod:`.capture` (graph capture driver), :mod:`.adapter` (software adapter probe),
:mod:`.core` (the three runs and the verdict), :mod:`.runtime` (sessions that really run where they claim).
"""

from __future__ import annotations

import sys
import types
from typing import Any


def __getattr__(name: str) -> Any:  # lazy: importing rope_passes.check.runtime must not pull in the whole checker
    if name in ("check", "EquivalenceReport"):
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
