"""``rope_passes.check(original, rewritten)``: is the rewritten graph the same function as the original, on WebGPU?

Three parts, each a module: what to run (:mod:`.plan`: the options, the decode, the sweep positions, the schedules
of :mod:`.schedules`), the runs (:mod:`.runs`: each in its own subprocess unless ``isolate=False``), and the
comparisons and verdict (:mod:`.verdict`, :mod:`.comparisons`). The runs:

1. ``original@cpu``: the reference (onnxruntime's CPU EP is the best-tested implementation of these ops);
2. ``original@webgpu``: the same graph on WebGPU, the baseline error of the EP itself;
3. ``rewritten@webgpu``: the graph under test, and ``rewritten@cpu``: the same on CPU;
4. ``rewritten@webgpu+capture`` with ``graph_capture=True``: the rewritten graph under ``enableGraphCapture=1``,
   captured on its first step and replayed after (see :mod:`.capture`).

Every run but the captured one makes the decode (a prefill and single-token steps, :mod:`.decode`) and the schedules
(:mod:`.schedules`: batches with left and right padding, a one-token prompt, a long prompt past every switch,
multi-token calls after a past, ids at both ends of the vocabulary); each graph's schedules are compared with the
original's on the same EP. ``budget``: random schedules after that (:mod:`.explore`), the first that differs
shrunk to the smallest that still does.

Besides the decode, every run but the captured one makes a *position sweep* (:mod:`.sweep`): single steps at
positions spread over the whole table (its switches, its end, log-spaced ones in between), each after a random past
of that length. And before anything runs, the cos/sin rows both graphs read at every position are compared at the
tables' precision (:mod:`.tables`, :mod:`.table_diff`).

Comparisons that decide the verdict (:mod:`.verdict`): rewritten@webgpu vs original@webgpu (same EP, so only the
rewrite differs), rewritten@webgpu vs original@cpu (not for int4), the same two for the sweep, the captured run vs
the plain one, the rewritten run vs ``reference_logits`` when given, and the rotation tables. original@webgpu vs
original@cpu is shown, not counted: it is the EP's error, not the rewrite's.

Where the original cannot load (an op onnxruntime-webgpu 1.27 lacks, e.g. ``MRotaryEmbedding``), the report says so
and the rewritten graph is compared with what is left: the original's CPU run, else the original on the second
WebGPU runtime (onnxruntime + the plugin EP, in its own interpreter: runs ``original@webgpu:plugin`` and
``original@cpu:plugin``), else the rotation tables alone; ``report.reference`` says which. With no reference at all
the result is "could not run" (exit 2), with the reason in ``report.reason``.

``runtime`` (``--runtime``, :mod:`.runtimes`): the WebGPU runtime every run uses, the other one's in subprocesses of
its own interpreter; :func:`check_runtimes` checks on several (``"all"``), one report each.

``layers=N`` (``--layers N``): both graphs are first cut after decoder layer N (:mod:`.layers`: outputs
``hidden_states.N`` and the KV caches of layers < N, weights referenced, not copied) and the cut graphs are compared
as above: a real-size model checks in the time and memory of N layers; later layers and logits are not compared.

Schedule adjustments (software adapter, LongRoPE), each recorded in ``report.notes``: see :mod:`.plan`. WebGPU
sessions get the genai_config's WebGPU provider options (``multiRotaryCacheConcatOffset`` among them) as session
config entries.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from rope_passes.check.comparisons import cpu_comparisons, schedule_comparisons
from rope_passes.check.constants import compare_constants
from rope_passes.check.explore import command_line, explore
from rope_passes.check.fit import runtime_fit
from rope_passes.check.layers import cut_pair, default_sweep, describe
from rope_passes.check.models import ModelInfo, embedding_for, load_reference, read_model, rotation_tables_of
from rope_passes.check.plan import (
    MAX_CROSSING_STEPS,
    PAST_SWITCH,
    CheckOptions,
    graph_facts,
    make_plan,
    with_schedules,
)
from rope_passes.check.report import COULD_NOT_RUN, EQUIVALENT, EXIT_CODES, NOT_EQUIVALENT, EquivalenceReport
from rope_passes.check.runs import all_runs
from rope_passes.check.runtimes import fallback_interpreter, interpreter, resolve, runtime_of, runtimes_for
from rope_passes.check.table_diff import TableComparison, compare_tables
from rope_passes.check.verdict import Evidence, compare_all, decide
from rope_passes.runtime.adapter import adapter_info

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
    config_capture = None
    # the output's config turns capture on where the original's did not (optimize does so when capture is ready):
    # onnxruntime-genai creates its session so, and a session that refuses capture does not load
    capture_required = (opts.ep == "webgpu" and runtime_of(runtime).genai and rew.capture_on
                        and not orig.capture_on)
    if capture_required and not opts.graph_capture:
        # onnxruntime-genai runs the output as its config says: a capture it turns on is part of what is checked
        opts = dataclasses.replace(opts, graph_capture=True)
        config_capture = ("the rewritten genai_config.json turns graph capture on (enableGraphCapture=1): the "
                          "captured run is checked as onnxruntime-genai makes it, --graph-capture or not")
    ref_logits = None if opts.reference_logits is None else load_reference(opts.reference_logits)
    adapter = adapter_info() if opts.ep == "webgpu" else None
    plan = make_plan(orig, rew, opts, adapter, sweep)
    if config_capture:
        plan.notes.append(config_capture)
    fallback = fallback_interpreter(runtime) if opts.fallback_python == "auto" else opts.fallback_python
    with tempfile.TemporaryDirectory(prefix="rope-check-") as tmpdir:
        emb_orig, emb_rew = _embeddings(orig, rew, opts.embeddings, Path(tmpdir))
        rows = [np.load(e, mmap_mode="r").shape[0] for e in {emb_orig, emb_rew} if e]
        plan = with_schedules(plan, graph_facts(orig, rew, plan, rows), opts.schedules)
        runs, fallback_used = all_runs(orig, rew, emb_orig, emb_rew, plan, opts, adapter, here, runtime, fallback)
        exploration = None
        if opts.budget > 0:
            exploration = explore(orig, rew, emb_orig, emb_rew, plan, opts, original, rewritten)
    if opts.reference_python:
        versions = sorted({r.runtime for r in runs if r.label.startswith("original@") and r.runtime})
        plan.notes.append(f"the original ran under {opts.reference_python} "
                          f"({', '.join(versions) or 'no onnxruntime result'})")

    evidence = Evidence(runs=runs, ep=opts.ep, orig=orig, rew=rew, prefill=plan.prefill, steps=plan.steps,
                        tolerance=plan.tolerance, graph_capture=opts.graph_capture, reference_logits=ref_logits,
                        positions=plan.positions, tables=plan.tables, reference_python=opts.reference_python,
                        fallback_python=fallback_used, fallback_wanted=fallback, notes=plan.notes,
                        capture_required=capture_required)
    comparisons = (compare_all(evidence) + cpu_comparisons(evidence) + schedule_comparisons(evidence, plan)
                   + ([compare_constants(orig, rew)] if opts.tables else []))  # tables=False: what runs only
    if exploration is not None:
        comparisons.append(exploration.comparison(plan.tolerance))
    verdict, reason, reference = decide(evidence, comparisons)
    if any(c.kind == "schedule" and c.status == "compared" for c in comparisons):
        reference += ("; schedules: " + ", ".join(f"{c.actual} vs {c.reference}" for c in comparisons
                                                   if c.kind == "schedule" and c.status == "compared"))
    return EquivalenceReport(verdict, orig, rew, opts.ep, plan.prefill, plan.steps, runs, comparisons, plan.notes,
                             adapter, time.perf_counter() - start, tables=plan.tables,
                             sweep_positions=plan.positions, reference=reference, reason=reason, runtime=runtime,
                             schedules=plan.schedules, exploration=exploration,
                             fix=runtime_fit(original, orig, rew, runtime) or "")


def _embeddings(orig: ModelInfo, rew: ModelInfo, option: str | None, tmp: Path) -> tuple[str | None, str | None]:
    """The embedding table files of the two graphs (inputs_embeds graphs only; one graph's serves both)."""
    emb_orig = embedding_for(orig, rew, option, tmp)
    emb_rew = embedding_for(rew, orig, option, tmp)
    if emb_orig and not emb_rew and rew.takes_embeds:
        emb_rew = emb_orig
    if emb_rew and not emb_orig and orig.takes_embeds:
        emb_orig = emb_rew
    return emb_orig, emb_rew


def check_runtimes(original: str | Path, rewritten: str | Path, runtime: str | None = "all",
                   **options: Any) -> list[EquivalenceReport]:
    """:func:`check` once per runtime of ``runtime`` (``"all"``: both WebGPU runtimes, :mod:`.runtimes`), each on its
    own interpreter; every interpreter is looked up before the first check runs. Exit code: the worst verdict's
    (:func:`.runtimes.worst`)."""
    names = runtimes_for(runtime)
    for name in names:
        interpreter(name)
    return [check(original, rewritten, runtime=name, **options) for name in names]
