"""``rope-passes check ORIGINAL REWRITTEN``: same function, step by step, on CPU and WebGPU (exit 0 / 1 / 2).

``--runtime onnxruntime-webgpu|onnxruntime-ep-webgpu|all`` (:mod:`rope_passes.runtimes.choose`): the WebGPU runtime
the runs use, each in its own interpreter; ``all``: one check and one verdict per runtime, exit the worst."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from rope_passes.cli import add_command, output_console
from rope_passes.errors import UsageError
from rope_passes.runtimes import check_names

if TYPE_CHECKING:  # rich and the checker: imported when the command runs (``--help`` imports nothing heavy)
    from rich.console import Console
    from rich.progress import TaskID

#: :data:`rope_passes.runtimes.choose.CHOICES`: every runtime descriptor's names (rope_passes.runtimes imports nothing
#: heavy), then all
RUNTIME_CHOICES = (*check_names(), "all")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "check",
        help="check that a rewritten model computes what the original does (CPU reference, WebGPU, capture)",
        description="Runs the original on CPU (reference) and on WebGPU, and the rewritten model on WebGPU, through "
        "a real prefill + decode, and compares every output at every step.",
        exits=("0  equivalent: outputs of both models compared on every run reported (JSON evidence: full)",
               "1  not equivalent (the first failing step and output are printed)",
               "2  could not run (a model did not load, a run failed or hung, a reference run raised on the model's "
               "own inputs), or a usage error",
               "3  equivalent on the rotation tables alone: the original runs nowhere here, no output was compared "
               "(JSON evidence: tables-only)"),
    )
    p.add_argument("original", help="original model: .onnx file or model folder (model + genai_config.json)")
    p.add_argument("rewritten", help="rewritten model: .onnx file or model folder")
    p.add_argument("--ep", default="webgpu", choices=("webgpu", "cpu"), help="EP of the rewritten run (default webgpu)")
    p.add_argument("--prefill", type=int, default=8, help="prompt tokens of the first call (default 8)")
    p.add_argument("--steps", type=int, default=4, help="single-token decode steps after it (default 4)")
    p.add_argument("--graph-capture", action="store_true",
                   help="also run the rewritten model under enableGraphCapture=1 (capture, then replay) and compare")
    p.add_argument("--reference-logits", metavar="FILE.npy",
                   help="[rows, vocab] logits to compare with (rows = positions, or one per call)")
    p.add_argument("--reference-python", metavar="PYTHON",
                   help="run the original with this Python interpreter (another onnxruntime installation), "
                   "in a subprocess")
    p.add_argument("--embeddings", metavar="FILE",
                   help="token embeddings for inputs_embeds graphs: a [vocab, hidden] .npy or a model that embeds "
                   "its own input_ids (default: the other model's table, else a fixed-seed table)")
    p.add_argument("--dim", action="append", metavar="NAME=VALUE", help="size of a symbolic dimension (repeatable)")
    p.add_argument("--atol", type=float, help="absolute tolerance (default: by dtype, printed)")
    p.add_argument("--rtol", type=float, help="relative tolerance (default: by dtype, printed)")
    p.add_argument("--in-process", action="store_true",
                   help="run the sessions in this process (faster; an EP crash then ends the checker)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per run before it counts as hung (default 300)")
    p.add_argument("--sweep", type=int, metavar="N",
                   help="single decode steps at N positions spread over the whole cos/sin table, each after a random "
                   "past (default: every position where the CPU reference can afford it, else a stated sample; "
                   "with --layers 4, none on a software WebGPU adapter)")
    p.add_argument("--no-sweep", dest="sweep", action="store_const", const=0, help="no position sweep")
    p.add_argument("--calls", dest="calls", action="store_const", const=True, default=None,
                   help="the call grid in full (prompts of every length, calls after a past, identical, padded and "
                        "bigger batches, genai's shared buffers; CPU EP; each family every shape or every 2nd..8th "
                        "from a seeded offset, as the report's note states) whatever the sweep (default: so where the "
                        "sweep takes every position, else about 256 calls)")
    p.add_argument("--no-calls", dest="calls", action="store_const", const=False, help="no call grid")
    p.add_argument("--fallback-python", default="auto", metavar="PYTHON",
                   help="second onnxruntime (the WebGPU plugin venv) for an original that does not load here "
                   "(default: $ROPE_PASSES_PLUGIN_PYTHON, else .venv-plugin/bin/python if present; none: off)")
    p.add_argument("--layers", type=int, metavar="N",
                   help="compare the first N decoder layers only: both graphs cut after layer N (outputs "
                   "hidden_states.N and present.0..N-1; weights referenced, not copied); for real-size models. "
                   "Later layers and logits are not compared")
    p.add_argument("--runtime", choices=RUNTIME_CHOICES, default=None,
                   help="WebGPU runtime every run uses, in its own interpreter (the plugin's: .venv-plugin or "
                   "$ROPE_PASSES_PLUGIN_PYTHON); all: one verdict per runtime, exit the worst "
                   "(default: the one installed here; see docs/runtimes.md)")
    p.add_argument("--budget", metavar="TIME", default="0",
                   help="after the check, draw random schedules (batch, padding, lengths, calls, ids) for TIME "
                   "(60s, 2m; default 0: none); the first that differs is shrunk and printed as a --schedule command")
    p.add_argument("--seed", type=int, default=0, help="seed of --budget's random schedules (default 0)")
    p.add_argument("--schedule", action="append", metavar="SCHEDULE",
                   help="run this schedule instead of the default ones (as a report or --budget prints it, e.g. "
                   "'left rows 3,1 then 1 pad 0 ids 5.7.9.4/2.8'; repeatable)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print every run, schedule, comparison table and note (default: the verdict, the worst "
                   "difference with its call, and what was not run)")
    p.add_argument("--json", action="store_true",
                   help="print the report as JSON (--runtime all: {verdict, exit_code, reports: [...]})")
    p.add_argument("--progress", action="store_true",
                   help="progress on stderr even when it is not a terminal: one line per run start and step")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rope_passes.check.core import check, interpreter
    from rope_passes.check.decode import parse_dims
    from rope_passes.check.report import EXIT_CODES, worst
    from rope_passes.check.schedules import parse
    from rope_passes.runtimes.choose import runtimes_for

    tolerance = {k: v for k, v in (("atol", args.atol), ("rtol", args.rtol)) if v is not None}
    if any(v < 0 for v in tolerance.values()):
        raise UsageError("--atol and --rtol must be >= 0")
    console = Console(stderr=True)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console, transient=True, disable=not console.is_terminal or args.json)
    tasks: dict[str, TaskID] = {}
    # a terminal gets a live bar; a log or a pipe (CI, a wrapper reading stderr) gets nothing unless --progress asks
    # for one line per run start and step
    lines = not console.is_terminal and args.progress
    start = time.perf_counter()

    runtimes = runtimes_for(args.runtime)
    for name in runtimes:  # a runtime without an interpreter is refused before anything runs
        interpreter(name)
    several = len(runtimes) > 1
    current = [runtimes[0]]  # the runtime being checked, for the progress labels of --runtime all

    def on_step(label: str, step: int, total: int) -> None:
        if not lines and progress.disable:
            return
        if several:
            label = f"{current[0]}: {label}"
        if lines:
            every = max(1, total // 8)  # long sweeps: about 8 lines, not one per position
            if 0 <= step < total - 1 and (step + 1) % every:
                return
            what = "started" if step < 0 else f"{step + 1}/{total}"
            print(f"[{time.perf_counter() - start:7.1f} s] {label}: {what}", file=sys.stderr, flush=True)
            return
        if label not in tasks:
            tasks[label] = progress.add_task(label, total=total)
        progress.update(tasks[label], completed=step + 1)

    reports = []
    with progress:
        for name in runtimes:
            current[0] = name
            reports.append(check(
                args.original, args.rewritten, ep=args.ep, prefill=args.prefill, steps=args.steps,
                graph_capture=args.graph_capture, reference_logits=args.reference_logits, dims=parse_dims(args.dim),
                embeddings=args.embeddings, tolerance=tolerance, isolate=not args.in_process, timeout=args.timeout,
                reference_python=args.reference_python, progress=on_step, sweep=args.sweep, calls=args.calls,
                fallback_python=None if args.fallback_python.lower() == "none" else args.fallback_python,
                layers=args.layers, runtime=name, budget=_seconds(args.budget), seed=args.seed,
                schedules=None if not args.schedule else [parse(t, f"given-{i}") for i, t in enumerate(args.schedule)]))
    verdict = worst(reports)
    if args.json:
        if several:
            print(json.dumps({"verdict": verdict, "exit_code": EXIT_CODES[verdict],
                              "reports": [r.to_dict() for r in reports]}, indent=1))
        else:
            print(reports[0].to_json())
        return EXIT_CODES[verdict]
    out = output_console()
    for i, report in enumerate(reports):
        if several:
            out.print(("\n" if i else "") + f"[bold]== {escape(report.runtime_label)} ({report.runtime}) ==[/bold]")
        render(report, out, verbose=args.verbose)
    if several:
        out.print("verdicts: " + "; ".join(f"{r.runtime}: {r.verdict} (exit {r.exit_code})" for r in reports)
                  + f"; exit {EXIT_CODES[verdict]} (the worst)")
    return EXIT_CODES[verdict]


def _seconds(text: str) -> float:
    """``60``, ``60s``, ``2m``, ``1.5h`` -> seconds (``--budget``)."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*", text)
    if m is None:
        raise UsageError(f"--budget takes a time like 60s or 2m, got {text!r}")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2) or "s"]


def _at(d) -> str:
    """Where a difference is: the step or position, or a schedule's call."""
    return f"{d.schedule} call {d.step}" if d.schedule else str(d.step)


def _fmt(x: float) -> str:
    return "-" if x != x else ("inf" if x == float("inf") else f"{x:.3g}")


def render(report, console: Console, verbose: bool = True) -> None:
    """The report: every detail with ``verbose`` (:func:`render_details`), else a few lines (:func:`render_brief`);
    both end with the first failures, the ``optimize`` command that fits the runtime, and the verdict."""
    if verbose:
        render_details(report, console)
    else:
        render_brief(report, console)
    render_end(report, console)


def _worst(report):
    """(comparison, OutputDiff) with the largest difference among the comparisons that count, or None."""
    best = None
    for c in report.comparisons:
        if not c.counts or c.status != "compared":
            continue
        for d in c.diffs:
            if d.max_abs == d.max_abs and (best is None or d.max_abs > best[1].max_abs):
                best = (c, d)
    return best


def render_brief(report, console: Console) -> None:
    """The models, the reference, the runs in one line, the worst difference with its call and tolerance, the
    table comparison, and what was not run."""
    from rich.markup import escape

    console.print(f"{escape(str(report.original.path))} ({report.original.precision}) -> "
                  f"{escape(str(report.rewritten.path))} ({report.rewritten.precision}) on "
                  f"{escape(report.runtime_label)}")
    console.print(f"reference: {escape(report.reference)}")
    console.print("runs: " + ", ".join(f"{r.label} {r.status}" + (f" ({escape(r.reason[:120])})" if r.reason else "")
                                       for r in report.runs))
    counted = [c for c in report.comparisons if c.counts and c.status == "compared"]
    calls = sum(len(c.diffs) for c in counted)
    console.print(f"compared: {len(counted)} comparisons, {calls} outputs (decode {report.prefill}+{report.steps} "
                  f"tokens, {len(report.sweep_positions)} sweep positions, {len(report.schedules)} schedules)")
    worst = _worst(report)
    if worst is not None:
        c, d = worst
        where = _at(d) if d.schedule else f"{'position' if c.kind == 'sweep' else 'step'} {d.step}"
        console.print(f"worst difference: {_fmt(d.max_abs)} in {d.output} at {escape(where)}, {escape(c.name)} "
                      f"({c.tolerance})")
    if report.tables is not None:
        console.print(f"rotation tables: {escape(report.tables.summary())}")
    skipped = [c for c in report.comparisons if c.counts and c.status != "compared"]
    cpu_only = [s.name for s in report.schedules
                if not any(c.kind == "schedule" and c.actual.endswith("@webgpu") and any(d.schedule == s.name
                                                                                           for d in c.diffs)
                           for c in counted)]
    if skipped:
        console.print("not run: " + "; ".join(f"{escape(c.name)}: {escape(c.reason)}" for c in skipped))
    if cpu_only and report.ep == "webgpu":
        console.print(f"not run on WebGPU (CPU EP only): schedules {escape(', '.join(cpu_only))}")
    warnings = [n for n in report.notes if n.startswith("WARNING")]
    for note in warnings:
        console.print(f"note: {escape(note)}")
    if len(report.notes) > len(warnings):
        console.print(f"{len(report.notes) - len(warnings)} more note(s), every run and comparison: --verbose")


def render_details(report, console: Console) -> None:
    from rich.markup import escape
    from rich.table import Table

    from rope_passes.check.sweep import spans

    console.print(f"original:  {report.original.path} ({report.original.precision})")
    console.print(f"rewritten: {report.rewritten.path} ({report.rewritten.precision})")
    console.print(f"decode: prefill {report.prefill} + {report.steps} single-token steps "
                  f"= {report.prefill + report.steps} tokens")
    if report.sweep_positions:
        console.print(f"sweep: {len(report.sweep_positions)} single steps after a random past, positions "
                      f"{spans(report.sweep_positions)}")
    for s in report.schedules:
        console.print(f"schedule {escape(s.summary())}")
    console.print(f"runtime: {escape(report.runtime_label)} ({escape(report.runtime)})")
    console.print(f"reference: {escape(report.reference)}")
    tolerances = dict.fromkeys(str(c.tolerance) for c in report.comparisons)
    console.print("tolerance (pass when |a - b| <= atol + rtol * |reference|): " + "; ".join(tolerances))
    runs = Table(title="runs", title_justify="left")
    for col in ("run", "status", "providers", "wall s", "detail"):
        runs.add_column(col)
    for r in report.runs:
        runs.add_row(r.label, r.status, ",".join(p.replace("ExecutionProvider", "") for p in r.providers),
                     f"{r.wall_s:.2f}", escape((r.reason or "; ".join(r.notes))[:160]))
    console.print(runs)
    for c in report.comparisons:
        title = f"{c.name}  ({c.tolerance})" + ("" if c.counts else "  (for information: not counted)")
        if c.status != "compared":
            console.print(f"{title}: skipped: {c.reason}")
            continue
        if not c.diffs:  # constants: nothing differs
            console.print(f"{title}: {c.reason}")
            continue
        table = Table(title=title, title_justify="left")
        unit = {"decode": "step", "sweep": "position"}.get(c.kind, "call")
        for col in ("output", "max abs", "max rel", f"worst {unit}", f"first failing {unit}"):
            table.add_column(col)
        firsts: dict[str, str] = {}
        for d in c.diffs:
            if not d.ok and d.output not in firsts:
                firsts[d.output] = _at(d)
        for name, d in c.worst().items():
            first = firsts.get(name)
            table.add_row(name, _fmt(d.max_abs), _fmt(d.max_rel), _at(d),
                          "" if first is None else f"[red]{first}[/red]" + (f" ({d.reason})" if d.reason else ""))
        console.print(table)
        if c.reason:
            console.print(f"  {c.reason}")
    if report.tables is not None:
        console.print(f"rotation tables: {escape(report.tables.summary())}")
    for note in report.notes:
        console.print(f"note: {escape(note)}")


def render_end(report, console: Console) -> None:
    from rich.markup import escape

    colour = {"not equivalent": "red", "could not run": "yellow"}.get(report.verdict, "green")
    first = report.first_failure
    if first is not None:
        c, d = first
        console.print(f"first failure: step {d.step}, output {d.output}, {c.name}: max abs {_fmt(d.max_abs)}"
                      + (f" ({d.reason})" if d.reason else ""))
    for line in report.first_differences()[1 if first is not None else 0:]:
        console.print(f"first failure: {escape(line)}")
    if report.reason:
        console.print(f"{'not equivalent' if report.exit_code == 1 else 'could not run'}: {escape(report.reason)}")
    if report.fix:
        console.print(f"fix: {escape(report.fix)}")
    console.print(f"{escape(report.runtime)}: [{colour}]{report.verdict}[/{colour}] (exit {report.exit_code}) in "
                  f"{report.wall_s:.1f} s")


if __name__ == "__main__":  # pragma: no cover
    from rope_passes.cli import main

    sys.exit(main(["check", *sys.argv[1:]]))
