"""``rope_passes.check(original, rewritten)``: is the rewritten graph the same function as the original, on WebGPU?

Runs (each in its own subprocess unless ``isolate=False``), all on one decode schedule (:mod:`.decode`):

1. ``original@cpu``: the reference (onnxruntime's CPU EP is the best-tested implementation of these ops);
2. ``original@webgpu``: the same graph on WebGPU, the baseline error of the EP itself;
3. ``rewritten@webgpu``: the graph under test;
4. ``rewritten@webgpu+capture`` with ``graph_capture=True``: the rewritten graph under ``enableGraphCapture=1``,
   captured on its first step and replayed after (see :mod:`.capture`).

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

Schedule adjustments, each recorded in ``report.notes``:
* software WebGPU adapter (lavapipe): prefill capped at :func:`.adapter.max_webgpu_prefill` tokens, the rest of the
  prompt fed by single-token steps (WebGPU GQA prefill is wrong for query rows >= 8 there);
* LongRoPE (an ``If`` between two cos/sin tables, or a concatenated table with ``multiRotaryCacheConcatOffset``):
  the decode runs past the switch point (original context + 4 tokens) when that is at most
  :data:`MAX_CROSSING_STEPS` steps, else the sweep gets single steps at the switch's two sides (after a random
  past; any ``--sweep``, even 0); WebGPU sessions get the genai_config's
  WebGPU provider options (the offset among them) as session config entries. A concatenated table is wrong on
  onnxruntime's CPU EP past the offset (it has no such option), so CPU comparisons stop at the offset there.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rope_passes.check.compare import TOLERANCES, Tolerance
from rope_passes.check.layers import cut_pair, default_sweep, describe
from rope_passes.check.models import ModelInfo, embedding_for, load_reference, read_model
from rope_passes.check.report import COULD_NOT_RUN, EQUIVALENT, EXIT_CODES, NOT_EQUIVALENT, EquivalenceReport
from rope_passes.check.runner import LOAD_FAILED, RunResult, RunSpec, execute_run, run_isolated
from rope_passes.check.runtimes import fallback_interpreter, interpreter, resolve, runtimes_for
from rope_passes.check.sweep import DEFAULT_SWEEP, sweep_positions
from rope_passes.check.table_diff import TableComparison, compare_tables
from rope_passes.check.tables import GraphTables, graph_tables
from rope_passes.check.verdict import PLUGIN, Evidence, compare_all, decide
from rope_passes.errors import UsageError
from rope_passes.runtime.adapter import adapter_info, max_webgpu_prefill
from rope_passes.runtime.sessions import ALLOW_SOFTWARE_ADAPTER
from rope_passes.targets import WEBGPU_PLUGIN

__all__ = ["COULD_NOT_RUN", "EQUIVALENT", "EXIT_CODES", "MAX_CROSSING_STEPS", "NOT_EQUIVALENT", "PAST_SWITCH",
           "EquivalenceReport", "ModelInfo", "check", "check_runtimes", "rotation_tables"]

#: decode steps past a LongRoPE switch point
PAST_SWITCH = 4
#: the most decode steps spent to reach a LongRoPE switch by decoding; a later switch is checked by sweep steps after
#: a random past at its two sides (a step is equal on both graphs given the same past, so a decode of equal steps is
#: equal: the steps are what a crossing adds). Real size: 4096 single steps of real layers per run are hours on a
#: software adapter (a 2-layer Phi-3-128k run here: 5 minutes per WebGPU run, and the process tree grew to 23 GB).
MAX_CROSSING_STEPS = 256


def _graph_tables(info: ModelInfo, ep: str) -> GraphTables:
    try:
        return graph_tables(info.model, info.genai_config, ep=ep)
    except Exception as exc:  # noqa: BLE001 - a graph the reader trips on is reported, not a crash of the checker
        return GraphTables(unavailable=f"reading its rotations failed ({type(exc).__name__}: "
                                       f"{' '.join(str(exc).split())[:200]})")


def rotation_tables(original: str | Path | ModelInfo, rewritten: str | Path | ModelInfo, *, ep: str = "webgpu",
                    ulps: float = 1.0) -> TableComparison:
    """The rotation-level comparison alone (no session): the cos/sin rows both graphs read at every position
    ``0..context_length-1``, compared at the tables' precision; ``.ok``, ``.first`` (the first differing row,
    value and input), ``.summary()``."""
    orig = original if isinstance(original, ModelInfo) else read_model(original)
    rew = rewritten if isinstance(rewritten, ModelInfo) else read_model(rewritten)
    return compare_tables(_graph_tables(orig, ep), _graph_tables(rew, ep), orig.context_length, ulps)


def check(
    original: str | Path,
    rewritten: str | Path,
    *,
    ep: str = "webgpu",
    prefill: int = 8,
    steps: int = 4,
    graph_capture: bool = False,
    reference_logits: str | Path | np.ndarray | None = None,
    dims: Mapping[str, int] | None = None,
    embeddings: str | None = None,
    tolerance: Mapping[str, float] | None = None,
    isolate: bool = True,
    timeout: float = 300,
    reference_python: str | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    sweep: int | None = None,
    fallback_python: str | None = "auto",
    tables: bool = True,
    layers: int | None = None,
    runtime: str | None = None,
) -> EquivalenceReport:
    """Compare ``rewritten`` with ``original`` step by step on ``ep`` (see the module docstring).

    ``tolerance`` overrides ``atol``/``rtol`` of the dtype default; ``progress(label, step, n_steps)`` is called
    after each decode step of each run (label ``"<run> sweep"`` for sweep positions). ``reference_python``: run the
    original with this Python interpreter (another onnxruntime installation), in a subprocess. ``sweep``: number of
    sweep positions (0: no sweep; default 32, with ``layers`` :func:`.layers.default_sweep`).
    ``fallback_python``: the second runtime for an original that does not load here (``"auto"``:
    :func:`.runtimes.fallback_interpreter`; None: none). ``tables``: compare the rotation tables.
    ``runtime``: the WebGPU runtime every run uses (:mod:`.runtimes`; default: the one installed here).
    ``layers``: compare the first ``layers`` decoder layers only (see the module docstring). ``progress`` is also
    called with step -1 when a run (or the cut) starts.
    """
    start = time.perf_counter()
    if ep not in ("webgpu", "cpu"):
        raise UsageError(f"unknown execution provider {ep!r} (choose webgpu or cpu)")
    sweep_note = ""
    if sweep is None:  # real size: every call costs N real layers (seconds each on a software adapter)
        sweep, sweep_note = default_sweep(ep) if layers is not None else (DEFAULT_SWEEP, "")
    if prefill < 1 or steps < 0 or sweep < 0:
        raise UsageError("--prefill must be >= 1, --steps and --sweep >= 0")
    if graph_capture and ep != "webgpu":
        raise UsageError("--graph-capture needs --ep webgpu")
    if layers is not None:
        if reference_logits is not None:
            raise UsageError("--reference-logits compares logits, which --layers cuts off")
        if progress is not None:
            progress(f"cut after layer {layers}", -1, 1)
        with cut_pair(original, rewritten, layers) as cuts:
            if progress is not None:
                progress(f"cut after layer {layers}", 0, 1)
            report = check(cuts[0].model, cuts[1].model, ep=ep, prefill=prefill, steps=steps,
                           graph_capture=graph_capture, dims=dims, embeddings=embeddings, tolerance=tolerance,
                           isolate=isolate, timeout=timeout, reference_python=reference_python, progress=progress,
                           sweep=sweep, fallback_python=fallback_python, tables=tables, runtime=runtime)
        report.notes[:0] = describe(cuts) + ([sweep_note] if sweep_note else [])
        report.original.path, report.rewritten.path = cuts[0].source, cuts[1].source
        report.wall_s = time.perf_counter() - start
        return report
    runtime = resolve(runtime)
    here = interpreter(runtime)  # None: this process's runtime
    orig, rew = read_model(original), read_model(rewritten)
    ref_logits = None if reference_logits is None else load_reference(reference_logits)
    notes: list[str] = []
    adapter = adapter_info() if ep == "webgpu" else None

    # --- the rotation tables (no session) and the sweep positions ---
    orig_t, rew_t = (_graph_tables(orig, ep), _graph_tables(rew, ep)) if tables or sweep else (None, None)
    table_cmp = (compare_tables(orig_t, rew_t, orig.context_length)
                 if tables and orig_t is not None and rew_t is not None else None)  # tables: both were read
    end = table_cmp.positions if table_cmp is not None and table_cmp.status == "compared" else (
        (orig_t.covers if orig_t is not None and not orig_t.unavailable else None) or orig.context_length)
    switches = set(orig_t.switches if orig_t else []) | set(rew_t.switches if rew_t else [])
    switches |= {m.longrope["switch"] for m in (orig, rew) if m.longrope}
    positions = sweep_positions(end, switches, sweep) if sweep and end else []
    if sweep and not end:
        notes.append("no position sweep: the table length is unknown (no context_length in genai_config.json, and "
                     "the rotation tables were not read)")

    # --- the schedule every run shares ---
    switch = max((m.longrope["switch"] for m in (orig, rew) if m.longrope), default=None)
    if switch is not None and prefill + steps < switch + PAST_SWITCH:
        if switch + PAST_SWITCH - prefill <= MAX_CROSSING_STEPS:
            steps = switch + PAST_SWITCH - prefill
            notes.append(f"LongRoPE cache switching after {switch} tokens: decoding {prefill + steps} tokens in all "
                         f"to cross it")
        else:  # real size (Phi-3-128k: 4096): the switch's two sides as sweep steps after a random past
            sides = [p for p in range(switch - 2, switch + 2) if p > 0 and (not end or p < end)]
            positions = sorted(set(positions) | set(sides))
            notes.append(f"LongRoPE cache switching after {switch} tokens: crossing it by decoding would take "
                         f"{switch + PAST_SWITCH - prefill} steps (more than {MAX_CROSSING_STEPS}); positions "
                         f"{', '.join(map(str, sides))} are single steps after a random past instead (the step at "
                         f"each side of the switch, the same past for both graphs)")
    limit = max_webgpu_prefill(adapter) if adapter else None
    if adapter is not None and limit is not None and prefill > limit:  # a limit comes from an adapter
        notes.append(f"software WebGPU adapter ({adapter.summary}): WebGPU GroupQueryAttention prefill is wrong for "
                     f"query rows >= 8 there, so the prefill is {limit} tokens and the other {prefill - limit} come "
                     f"as single-token decode steps")
        steps += prefill - limit
        prefill = limit
    elif adapter is not None and adapter.software:
        notes.append(f"software WebGPU adapter ({adapter.summary}): prefills kept at <= {limit} tokens")
    for info in (orig, rew):
        lr = info.longrope or {}
        ignored_by = lr.get("offset_ignored_by") or []
        if ignored_by:
            notes.append(f"WARNING {info.path}: multiRotaryCacheConcatOffset={lr['switch']} is IGNORED by "
                         f"{len(ignored_by)} GroupQueryAttention node(s) with separate Q/K/V ({ignored_by[0]!r}…): "
                         "onnxruntime applies the offset to packed QKV only, so on WebGPU a position p reads row p of "
                         f"the [short; long] cache: past {lr['switch']} tokens the short rows (wrong); "
                         "lint RP206; fix: rope-passes optimize --target webgpu-graph packs Q/K/V")
    if orig.longrope and orig.longrope["kind"] == "concat":
        notes.append(f"{orig.path.name}: concatenated LongRoPE cache with offset {orig.longrope['switch']}: the CPU "
                     f"EP has no multiRotaryCacheConcatOffset, so comparisons with original@cpu stop at "
                     f"{orig.longrope['switch']} tokens")
    if ep == "webgpu" and rew.longrope and rew.longrope["kind"] == "concat" and not (
            orig.longrope and orig.longrope["kind"] == "concat"):
        notes.append(f"{rew.path.name}: concatenated LongRoPE cache (offset {rew.longrope['switch']}): WebGPU-only "
                     f"output; on the CPU EP it is wrong past {rew.longrope['switch']} tokens")
    if ep == "cpu" and rew.longrope and rew.longrope["kind"] == "concat":
        notes.append(f"{rew.path.name}: concatenated LongRoPE cache: it needs multiRotaryCacheConcatOffset, which the "
                     f"CPU EP lacks, so on CPU it is wrong past {rew.longrope['switch']} tokens")
    tol = dict(dataclasses.asdict(TOLERANCES[orig.precision]))
    tol.update(tolerance or {})
    tolerance_used = Tolerance(float(tol["atol"]), float(tol["rtol"]), orig.precision)

    fallback = fallback_interpreter(runtime) if fallback_python == "auto" else fallback_python
    with tempfile.TemporaryDirectory(prefix="rope-check-") as tmpdir:
        tmp = Path(tmpdir)
        emb_orig = embedding_for(orig, rew, embeddings, tmp)
        emb_rew = embedding_for(rew, orig, embeddings, tmp)
        if emb_orig and not emb_rew and rew.takes_embeds:
            emb_rew = emb_orig
        if emb_rew and not emb_orig and orig.takes_embeds:
            emb_orig = emb_rew

        def spec(label: str, info: ModelInfo, run_ep: str, emb: str | None, capture: bool = False) -> RunSpec:
            return RunSpec(label=label, model=str(info.path), ep=run_ep, prefill=prefill, steps=steps,
                           genai_config=info.genai_config,
                           webgpu_options=dict(info.webgpu_options) if run_ep == "webgpu" else {},
                           graph_capture=capture, max_length=prefill + steps, dims=dict(dims or {}), embedding=emb,
                           sweep=[] if capture else list(positions))

        def execute(s: RunSpec, python: str | None, run_runtime: str | None = None) -> RunResult:
            def on_step(k: int) -> None:
                if progress is not None:
                    progress(s.label, k, steps + 1)

            def on_sweep(k: int) -> None:
                if progress is not None:
                    progress(f"{s.label} sweep", k, len(s.sweep))

            if isolate or python:
                env = {ALLOW_SOFTWARE_ADAPTER: "1"} if python and adapter is not None and adapter.software else {}
                return run_isolated(s, on_step, timeout, python=python, on_sweep=on_sweep, env_extra=env,
                                    runtime=run_runtime)
            return execute_run(s, on_step, on_sweep=on_sweep)

        specs = [spec("original@cpu", orig, "cpu", emb_orig)]
        if ep == "webgpu":
            specs.append(spec("original@webgpu", orig, "webgpu", emb_orig))
        specs.append(spec(f"rewritten@{ep}", rew, ep, emb_rew))
        if graph_capture:
            specs.append(spec("rewritten@webgpu+capture", rew, "webgpu", emb_rew, capture=True))
        runs = []
        for s in specs:
            if progress is not None:
                progress(s.label, -1, steps + 1)
            if reference_python and s.label.startswith("original@"):
                runs.append(execute(s, reference_python))
            else:
                runs.append(execute(s, here, runtime))
        by = {r.label: r for r in runs}
        originals = [r for r in runs if r.label.startswith("original@")]
        fallback_used = None
        if (not reference_python and fallback and not any(r.ok for r in originals)
                and all(r.status == LOAD_FAILED for r in originals) and by[f"rewritten@{ep}"].ok):
            # the original does not load on this runtime, the rewritten graph does: run the original on the other
            extra = [spec(f"original@webgpu{PLUGIN}", orig, "webgpu", emb_orig)] if ep == "webgpu" else []
            extra.append(spec(f"original@cpu{PLUGIN}", orig, "cpu", emb_orig))
            for s in extra:
                if progress is not None:
                    progress(s.label, -1, steps + 1)
                runs.append(execute(s, fallback, WEBGPU_PLUGIN))
            fallback_used = fallback
    if reference_python:
        versions = sorted({r.runtime for r in runs if r.label.startswith("original@") and r.runtime})
        notes.append(f"the original ran under {reference_python} ({', '.join(versions) or 'no onnxruntime result'})")

    evidence = Evidence(runs=runs, ep=ep, orig=orig, rew=rew, prefill=prefill, steps=steps,
                        tolerance=tolerance_used, graph_capture=graph_capture, reference_logits=ref_logits,
                        positions=positions, tables=table_cmp, reference_python=reference_python,
                        fallback_python=fallback_used, fallback_wanted=fallback, notes=notes)
    comparisons = compare_all(evidence)
    verdict, reason, reference = decide(evidence, comparisons)
    return EquivalenceReport(verdict, orig, rew, ep, prefill, steps, runs, comparisons, notes, adapter,
                             time.perf_counter() - start, tables=table_cmp, sweep_positions=positions,
                             reference=reference, reason=reason, runtime=runtime)


def check_runtimes(original: str | Path, rewritten: str | Path, runtime: str | None = "all",
                   **options: Any) -> list[EquivalenceReport]:
    """:func:`check` once per runtime of ``runtime`` (``"all"``: both WebGPU runtimes, :mod:`.runtimes`), each on its
    own interpreter; every interpreter is looked up before the first check runs. Exit code: the worst verdict's
    (:func:`.runtimes.worst`)."""
    names = runtimes_for(runtime)
    for name in names:
        interpreter(name)
    return [check(original, rewritten, runtime=name, **options) for name in names]
