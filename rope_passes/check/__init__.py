"""Equivalence checking on onnxruntime (CPU reference, WebGPU, graph capture).

    report = rope_passes.check("original_dir", "rewritten_dir", ep="webgpu", graph_capture=True)
    report.verdict, report.exit_code, report.first_failure

``rope_passes.check`` is the function :func:`.core.check` (bound in ``rope_passes/__init__.py``); this package holds
its parts. Modules: :mod:`.plan` (the options, what to run), :mod:`.schedules` (the calls callers make: batches,
padding, prompt lengths, calls after a past, ids; random ones and shrinking), :mod:`.client_schedules` (the real
client's call pattern and the graph's thresholds), :mod:`.fit` (an output built for another runtime), :mod:`.schedule_runs` (running them,
what a caller reads of them compared), :mod:`.decode` (decoder inputs),
:mod:`.sweep` (single steps after a random past, over the whole table), :mod:`.runs` (which runs),
:mod:`.runner` (one run, optionally in a subprocess or another interpreter), :mod:`.runtimes` (which WebGPU
runtime the runs use: ``--runtime``), :mod:`.compare` (tolerances, step-by-step diffs), :mod:`.comparisons`
(schedules and the CPU runs of the rewritten graph), :mod:`.table_diff` (the cos/sin rows every position reads,
:mod:`rope_passes.analysis.rotation_tables`, compared at table precision), :mod:`.capture` (graph capture driver), :mod:`.models` (what is read
before running), :mod:`.explore` (``--budget``: random schedules), :mod:`.verdict` (comparisons, reference,
verdict), :mod:`.report`, :mod:`.core` (``check``). Sessions come from :mod:`rope_passes.runtime` (software adapter
probe, sessions that really run where they claim, on either WebGPU runtime; the interpreter of each runtime);
nothing here creates one.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:  # lazy: importing rope_passes.check.runtimes must not pull in the whole checker
    if name in ("check", "check_runtimes", "EquivalenceReport", "CheckOptions"):
        from rope_passes.check import core

        return getattr(core, name)
    raise AttributeError(name)
