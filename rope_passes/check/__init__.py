"""Equivalence checking on onnxruntime (CPU reference, WebGPU, graph capture).

    report = rope_passes.check("original_dir", "rewritten_dir", ep="webgpu", graph_capture=True)
    report.verdict, report.exit_code, report.first_failure

``rope_passes.check`` is the function :func:`.core.check` (bound in ``rope_passes/__init__.py``); this package holds
its parts: :mod:`.plan` (the options and the frozen plan), :mod:`.runs` / :mod:`.runner` (the runs, each a
:class:`.spec.RunKey`), :mod:`.evidence` (the comparisons, one module per kind of evidence), :mod:`.verdict` /
:mod:`.report`. Sessions come from :mod:`rope_passes.runtime`; nothing here creates one.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:  # lazy: importing a part must not pull in the whole checker
    if name in ("check", "check_runtimes", "EquivalenceReport", "CheckOptions"):
        from rope_passes.check import core

        return getattr(core, name)
    raise AttributeError(name)
