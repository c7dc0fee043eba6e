"""``rope_passes.check(original, rewritten)``: is the rewritten graph the same function as the original, on WebGPU?
(docs/checker.md says what runs, what is compared and what decides the verdict.)

One pass, each stage once: read both models (:func:`.models.read_model`), build the frozen plan
(:func:`.plan.plan_check`), make the runs (:func:`.runs.all_runs`), explore (``budget``, :mod:`.explore`), compare
(each kind of :mod:`.evidence`), decide (:func:`.verdict.decide`). ``runtime`` (``--runtime``): the WebGPU runtime
every run uses; :func:`check_runtimes` checks on several (``"all"``), one report each. ``layers=N``: both graphs are
first cut after decoder layer N (:mod:`rope_passes.cut`) and the cut graphs are compared as above.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rope_passes.analysis.table_diff import TableComparison, compare_tables
from rope_passes.check.evidence import Evidence, compare_all
from rope_passes.check.explore import command_line, explore
from rope_passes.check.models import ModelInfo, load_reference, read_model, rotation_tables_of
from rope_passes.check.plan import MAX_CROSSING_STEPS, PAST_SWITCH, CheckOptions, plan_check
from rope_passes.check.report import COULD_NOT_RUN, EQUIVALENT, EXIT_CODES, NOT_EQUIVALENT, EquivalenceReport
from rope_passes.check.runs import all_runs
from rope_passes.check.verdict import decide
from rope_passes.cut import cut_pair, describe
from rope_passes.errors import UsageError
from rope_passes.runtime.adapter import adapter_info
from rope_passes.runtimes import NATIVE_BACKEND
from rope_passes.runtimes.choose import fallback_interpreter, runtime_of, runtimes_for
from rope_passes.runtimes.fit import runtime_fit
from rope_passes.runtimes.installed import python_for

__all__ = ["COULD_NOT_RUN", "EQUIVALENT", "EXIT_CODES", "MAX_CROSSING_STEPS", "NOT_EQUIVALENT", "PAST_SWITCH",
           "CheckOptions", "EquivalenceReport", "ModelInfo", "check", "check_runtimes", "interpreter", "rotation_tables"]


#: default sweep positions with --layers: at real size every call runs N real layers, and a 128k table's last
#: positions attend over a random past of 128k tokens; 4 keep a LongRoPE switch's two sides and the table's last row
#: (the rotation tables themselves are still compared at every position). On a software WebGPU adapter: none (below)
LAYERS_SWEEP = 4


def default_sweep(ep: str) -> tuple[int, str]:
    """The sweep size ``check(layers=...)`` uses when none is given, and the note that says why when it is 0.

    A software adapter (lavapipe) runs a single-token step of 2 real 7B layers in 4-15 s and a step after a 128k
    past in over a minute: the sweep's far positions alone would take minutes per WebGPU run."""
    adapter = adapter_info() if ep == "webgpu" else None
    if adapter is not None and adapter.software:
        return 0, ("--layers on a software WebGPU adapter: no position sweep by default (a step after a long past "
                   "takes minutes at real width there; --sweep N adds one); rows past the decode are checked by the "
                   "rotation tables (every position), when both graphs' tables are read")
    return LAYERS_SWEEP, ""


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
    desc = runtime_of(opts.runtime)
    runtime, here = desc.name, interpreter(desc.name)  # here None: this process's runtime
    elsewhere = f"runs in its own interpreter ({here})" if here else (
        f"runs through its backend ({desc.backend})" if desc.backend != NATIVE_BACKEND else None)
    orig, rew = read_model(original), read_model(rewritten)
    ref_logits = None if opts.reference_logits is None else load_reference(opts.reference_logits)
    adapter = adapter_info() if opts.ep == "webgpu" else None
    fallback = fallback_interpreter(runtime) if opts.fallback_python == "auto" else opts.fallback_python
    with tempfile.TemporaryDirectory(prefix="rope-check-") as tmpdir:
        plan = plan_check(orig, rew, opts, adapter, sweep, Path(tmpdir), desc.genai)
        runs, fallback_used = all_runs(orig, rew, plan, opts, adapter, here, runtime, fallback)
        exploration = explore(orig, rew, plan, opts, original, rewritten, runtime, elsewhere) if opts.budget > 0 \
            else None
    notes = list(plan.notes)  # the plan's, then what the runs and comparisons say
    if opts.reference_python:
        versions = sorted({r.runtime for r in runs if r.key.original and r.runtime})
        notes.append(f"the original ran under {opts.reference_python} "
                     f"({', '.join(versions) or 'no onnxruntime result'})")

    evidence = Evidence(plan, opts, orig, rew, runs, notes, ref_logits, fallback_used, fallback)
    comparisons = compare_all(evidence)
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


def interpreter(runtime: str) -> str | None:
    """The interpreter that runs ``runtime``'s sessions: None for this one (the runtime installed here), else the
    path of the other runtime's. Raises UsageError, saying how to set it up, when there is none (for a runtime that
    is no Python installation, the browser: when its backend says it is not set up; its CPU runs use this
    interpreter)."""
    desc = runtime_of(runtime)
    if desc.python is None:
        from rope_passes.check.backends import backend_module

        why = backend_module(desc).missing()
        if why is not None:
            raise UsageError(f"{backend_module(desc).WHAT} is not set up here: {why}")
        return None
    python = python_for(desc.name)
    if python is None:
        raise UsageError(f"no Python interpreter with {desc.name} here: run {desc.python.setup} (makes "
                         f"{desc.python.venv}/), or set ${desc.python.variable} to one")
    same = Path(python).absolute() == Path(sys.executable).absolute()
    return None if same else python


def check_runtimes(original: str | Path, rewritten: str | Path, runtime: str | None = "all",
                   **options: Any) -> list[EquivalenceReport]:
    """:func:`check` once per runtime of ``runtime`` (``"all"``: both WebGPU runtimes), each on its own interpreter;
    every interpreter is looked up before the first check runs. Exit code: the worst verdict's
    (:func:`.report.worst`)."""
    names = runtimes_for(runtime)
    for name in names:
        interpreter(name)
    return [check(original, rewritten, runtime=name, **options) for name in names]
