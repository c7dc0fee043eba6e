"""``rope_passes.check(original, rewritten)``: is the rewritten graph the same function as the original, on WebGPU?
(docs/checker.md says what runs, what is compared and what decides the verdict.)

One pass, each stage once: read both models (:func:`.models.read_model`), build the frozen plan
(:func:`.plan.plan_check`: decode, sweep, schedules, embeddings, the captured run, notes), make the runs
(:func:`.runs.all_runs`: the original on CPU and WebGPU, the rewritten graph on both, the captured run; each a
:class:`.spec.RunKey`, in its own subprocess unless ``isolate=False``; the original on the runtime's fallback where
it loads nowhere here), explore (``budget``, :mod:`.explore`), compare (:mod:`.verdict`, :mod:`.comparisons`, the
kinds of :mod:`.evidence`), decide (:func:`.verdict.decide`).

``runtime`` (``--runtime``, :mod:`.runtimes`): the WebGPU runtime every run uses; :func:`check_runtimes` checks on
several (``"all"``), one report each. ``layers=N`` (``--layers N``): both graphs are first cut after decoder layer N
(:mod:`.layers`) and the cut graphs are compared as above.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Any

from rope_passes.check.comparisons import cpu_comparisons, schedule_comparisons
from rope_passes.check.constants import compare_constants
from rope_passes.check.evidence import kinds
from rope_passes.check.explore import command_line, explore
from rope_passes.check.fit import runtime_fit
from rope_passes.check.layers import cut_pair, default_sweep, describe
from rope_passes.check.models import ModelInfo, load_reference, read_model, rotation_tables_of
from rope_passes.check.plan import MAX_CROSSING_STEPS, PAST_SWITCH, CheckOptions, plan_check
from rope_passes.check.report import COULD_NOT_RUN, EQUIVALENT, EXIT_CODES, NOT_EQUIVALENT, EquivalenceReport
from rope_passes.check.runs import all_runs
from rope_passes.check.runtimes import fallback_interpreter, interpreter, resolve, runtime_of, runtimes_for
from rope_passes.check.table_diff import TableComparison, compare_tables
from rope_passes.check.verdict import Evidence, compare_all, decide
from rope_passes.runtime.adapter import adapter_info
from rope_passes.runtimes import NATIVE_BACKEND, descriptor

__all__ = ["COULD_NOT_RUN", "EQUIVALENT", "EXIT_CODES", "MAX_CROSSING_STEPS", "NOT_EQUIVALENT", "PAST_SWITCH",
           "CheckOptions", "EquivalenceReport", "ModelInfo", "check", "check_runtimes", "rotation_tables"]


def rotation_tables(original: str | Path | ModelInfo, rewritten: str | Path | ModelInfo, *, ep: str = "webgpu",
                    ulps: float = 1.0) -> TableComparison:
    """The rotation-level comparison alone (no session): the cos/sin rows both graphs read at every position
    ``0..context_length-1``, compared at the tables' precision; ``.ok``, ``.first`` (the first differing row,
    value and input), ``.summary()``."""
    orig = original if isinstance(original, ModelInfo) else read_model(original)
    rew = rewritten if isinstance(rewritten, ModelInfo) else read_model(rewritten)
    return compare_tables(rotation_tables_of(orig, ep), rotation_tables_of(rew, ep), orig.context_length, ulps)


def check(original: str | Path, rewritten: str | Path, options: CheckOptions | None = None,
          **overrides: Any) -> EquivalenceReport:
    """Compare ``rewritten`` with ``original`` (see the module docstring); ``options`` and ``overrides`` are
    :class:`.plan.CheckOptions` (``check(a, b, ep="cpu", steps=2)``).

    ``progress(label, step, n_steps)`` is called after each decode step of each run (label ``"<run> sweep"`` for
    sweep positions, ``"<run> schedules"`` for schedules), with step -1 when a run (or the cut) starts."""
    opts = dataclasses.replace(options or CheckOptions(), **overrides)
    opts.validate()
    start = time.perf_counter()
    sweep, sweep_note = (opts.sweep, "") if opts.sweep is not None else (
        default_sweep(opts.ep) if opts.layers is not None else (None, ""))  # None: .sweep.default_positions
    if opts.layers is not None:  # real size: every call costs N real layers (seconds each on a software adapter)
        opts.say(f"cut after layer {opts.layers}", -1, 1)
        with cut_pair(original, rewritten, opts.layers) as cuts:
            opts.say(f"cut after layer {opts.layers}", 0, 1)
            report = check(cuts[0].model, cuts[1].model, opts, layers=None, sweep=sweep)
        report.notes[:0] = describe(cuts) + ([sweep_note] if sweep_note else [])
        report.original.path, report.rewritten.path = cuts[0].source, cuts[1].source
        found = report.exploration
        if found is not None and found.shrunk is not None:  # rerun on the user's models, not the deleted cuts
            old, found.command = found.command, command_line(original, rewritten, opts, found.shrunk)
            for c in report.comparisons:
                c.reason = c.reason.replace(old, found.command)
        report.wall_s = time.perf_counter() - start
        return report
    runtime = resolve(opts.runtime)
    here = interpreter(runtime)  # None: this process's runtime
    orig, rew = read_model(original), read_model(rewritten)
    ref_logits = None if opts.reference_logits is None else load_reference(opts.reference_logits)
    adapter = adapter_info() if opts.ep == "webgpu" else None
    fallback = fallback_interpreter(runtime) if opts.fallback_python == "auto" else opts.fallback_python
    with tempfile.TemporaryDirectory(prefix="rope-check-") as tmpdir:
        plan = plan_check(orig, rew, opts, adapter, sweep, Path(tmpdir), runtime_of(runtime).genai)
        runs, fallback_used = all_runs(orig, rew, plan, opts, adapter, here, runtime, fallback)
        exploration = None
        if opts.budget > 0:
            exploration = explore(orig, rew, plan, opts, original, rewritten, runtime, _not_here(runtime, here))
    notes = list(plan.notes)  # the plan's, then what the runs and comparisons say
    if opts.reference_python:
        versions = sorted({r.runtime for r in runs if r.key.original and r.runtime})
        notes.append(f"the original ran under {opts.reference_python} "
                     f"({', '.join(versions) or 'no onnxruntime result'})")

    evidence = Evidence(runs=runs, ep=opts.ep, orig=orig, rew=rew, prefill=plan.prefill, steps=plan.steps,
                        tolerance=plan.tolerance, graph_capture=plan.graph_capture, reference_logits=ref_logits,
                        positions=list(plan.positions), tables=plan.tables, reference_python=opts.reference_python,
                        fallback_python=fallback_used, fallback_wanted=fallback, notes=notes,
                        capture_required=plan.capture_required,
                        fallback_runtime=runtime_of(runtime).fallback if fallback_used else None)
    comparisons = (compare_all(evidence) + cpu_comparisons(evidence) + schedule_comparisons(evidence, plan)
                   + ([compare_constants(orig, rew)] if opts.tables else []))  # tables=False: what runs only
    by_key = {r.key: r for r in runs}
    comparisons += [c for kind in kinds() for c in kind.compare(by_key, plan.tolerance)]
    if exploration is not None:
        comparisons.append(exploration.comparison(plan.tolerance))
    verdict, reason, reference = decide(evidence, comparisons)
    if any(c.kind == "schedule" and c.status == "compared" for c in comparisons):
        reference += ("; schedules: " + ", ".join(f"{c.actual} vs {c.reference}" for c in comparisons
                                                   if c.kind == "schedule" and c.status == "compared"))
    return EquivalenceReport(verdict, orig, rew, opts.ep, plan.prefill, plan.steps, runs, comparisons, notes,
                             adapter, time.perf_counter() - start, tables=plan.tables,
                             sweep_positions=list(plan.positions), reference=reference, reason=reason,
                             runtime=runtime, schedules=list(plan.schedules), exploration=exploration,
                             fix=runtime_fit(original, orig, rew, runtime) or "")


def _not_here(runtime: str, here: str | None) -> str | None:
    """Why ``runtime``'s sessions are not this process's (None: they are): another interpreter, or a backend."""
    if here is not None:
        return f"runs in its own interpreter ({here})"
    found = descriptor(runtime)
    if found is not None and found.backend != NATIVE_BACKEND:
        return f"runs through its backend ({found.backend})"
    return None


def check_runtimes(original: str | Path, rewritten: str | Path, runtime: str | None = "all",
                   **options: Any) -> list[EquivalenceReport]:
    """:func:`check` once per runtime of ``runtime`` (``"all"``: both WebGPU runtimes, :mod:`.runtimes`), each on its
    own interpreter; every interpreter is looked up before the first check runs. Exit code: the worst verdict's
    (:func:`.runtimes.worst`)."""
    names = runtimes_for(runtime)
    for name in names:
        interpreter(name)
    return [check(original, rewritten, runtime=name, **options) for name in names]
