"""``rope-passes optimize IN -o OUT [--runtime R]``: load → passes → save, with a per-pass summary."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from rope_passes.cli import add_command, add_preset_argument, add_runtime_argument, output_console
from rope_passes.errors import RopePassesError, UsageError

if TYPE_CHECKING:  # the work imports onnx_ir, the passes, rich: only when the command runs (not for --help)
    from rich.console import Console

    from rope_passes.io import ModelJob
    from rope_passes.plan import RunPlan
    from rope_passes.report import PipelineReport

#: :data:`rope_passes.io.WEIGHT_MODES`, spelled out so that the parser imports nothing heavy (tests/test_startup.py
#: checks they agree)
WEIGHT_MODES = ("reflink", "copy", "link", "rewrite")
#: the most rows --max-positions may ask for (a position past int32 cannot be fed to GroupQueryAttention)
MAX_POSITIONS = 2**31 - 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "optimize", help="rewrite a model (file or genai folder) with a preset's passes",
        description="Loads a model (file, genai folder, or folder of model folders), runs the --preset's passes "
        "(or --passes) for the WebGPU runtime it is for, and writes the result with a per-pass summary: what "
        "each pass rewrote, refused (and why, naming the node) or did not find, and which files differ from the "
        "input. The input's weights are carried as they are, not rewritten, unless --weights rewrite. The summary "
        "ends with the lint findings the output still has.",
        exits=("0  written (or --dry-run): every model rewritten or unchanged",
               "2  usage error, or a model could not be read or written (a folder of models: the others are "
               "written, the failed ones listed)"))
    p.add_argument("input", help="model.onnx, a model folder (model + genai_config.json + tokenizer files), or a folder "
                                  "of model folders (each written to the same relative path under -o)")
    p.add_argument("-o", "--output", help="output .onnx path or folder (a folder input always gives a folder)")
    add_preset_argument(p, "the passes to run, in order (default: webgpu; rope-passes passes lists what each runs)")
    p.add_argument("--passes", help="comma-separated pass names, run in this order instead of the preset")
    add_runtime_argument(p, "the WebGPU runtime the output is for: the preset runs the downlevel passes it needs "
                            "(unfuse-gqa-qk-norm, lower-mrope) and no others; onnxruntime-web (the browser) "
                            "reads no multiRotaryCacheConcatOffset, so longrope-concat does not run for it",
                         browser=True)
    p.add_argument("--text-only", action="store_true",
                   help="the model will only see text prompts: allows folding mRoPE of 3D-position graphs")
    p.add_argument("--max-positions", type=int, metavar="N",
                   help="rows of precomputed cos/sin tables (precompute-cos-sin; default: genai_config context_length)")
    p.add_argument("--hf-config", metavar="PATH",
                   help="the model's Hugging Face config.json (or its folder): table size, rope type, scaling "
                        "(precompute-cos-sin; default: config.json beside the model)")
    p.add_argument("--dry-run", action="store_true", help="run the passes and report, write nothing")
    p.add_argument("--in-place", action="store_true",
                   help="overwrite the input (atomically): the model file, genai_config.json where a pass changed "
                        "it, and <model>.rope.data where new tensors are too large to go into the model file; the "
                        "weights file stays as it is; read-only files are refused. The summary lists the files "
                        "that differ")
    p.add_argument("--weights", default="reflink", choices=WEIGHT_MODES,
                   help="how the input's weights (external data) reach the output, unchanged: reflink (default: a "
                        "copy-on-write clone where the filesystem has them, else a copy), copy, link (a hard link: "
                        "no space, no time, but editing one file edits both), or rewrite (everything re-serialized "
                        "into one data file, as earlier versions did). New tensors go into the model file while small (1 MiB "
                        "each, 8 MiB in all), larger ones into <model>.rope.data (all into the model file for a "
                        "model without external data or in a transformers.js folder)")
    p.add_argument("--report", metavar="FILE", help="write the report as JSON to FILE")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    p.add_argument("--explain", action="store_true",
                   help="list every match attempt of every pass (rewritten, refused, not matched, notes) with its "
                        "reason and details, for a pass that did not do what you expected")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rope_passes.io import check_report_path, plan_outputs

    plan = _plan(args)  # the run, resolved once: a bad --preset/--passes/option is one error, not one per model
    if args.report:  # an unwritable --report path fails before any work
        check_report_path(args.report)
    jobs = plan_outputs(args.input, args.output, in_place=args.in_place, dry_run=args.dry_run)
    if len(jobs) == 1 and jobs[0].relative is None:
        return _run_one(args, plan, jobs[0])
    return _run_tree(args, plan, jobs)


def _plan(args: argparse.Namespace) -> RunPlan:
    """The :class:`~rope_passes.plan.RunPlan` of the command line (a UsageError for any argument it refuses)."""
    from rope_passes.plan import make_plan

    if args.max_positions is not None and args.max_positions < 1:
        raise UsageError(f"--max-positions must be a positive number of rows, got {args.max_positions}")
    if args.max_positions is not None and args.max_positions > MAX_POSITIONS:
        raise UsageError(f"--max-positions {args.max_positions} is more rows than a table can have (at most "
                         f"{MAX_POSITIONS}: a position past int32 cannot be indexed)")
    options: dict = {"text_only": True} if args.text_only else {}
    if args.max_positions is not None:
        options["max_positions"] = args.max_positions
    if args.hf_config is not None:
        options["hf_config"] = args.hf_config
    passes = args.passes.split(",") if args.passes is not None else None
    return make_plan(args.preset, passes, options=options, runtime=args.runtime)


def _optimize(args: argparse.Namespace, plan: RunPlan, job: ModelJob, progress=None) -> PipelineReport:
    from rope_passes.api import optimize

    return optimize(job.input, job.output, plan, dry_run=args.dry_run, in_place=args.in_place, weights=args.weights,
                    progress=progress)


def _run_tree(args: argparse.Namespace, plan: RunPlan, jobs: list[ModelJob]) -> int:
    """A folder of model folders: one line per model, then a tally; a broken model is reported, the others written."""
    from rope_passes.io import write_report
    from rope_passes.io.files import changed_files

    reports: list[dict] = []
    tally = {"rewritten": 0, "unchanged": 0, "failed": 0}
    _say(runtime_line(plan.runtime.label, plan.runtime_given, plan.skipped))
    for i, job in enumerate(jobs, 1):
        try:
            report = _optimize(args, plan, job)
        except RopePassesError as exc:
            tally["failed"] += 1
            _say(f"[{i}/{len(jobs)}] {job.relative}: error: {exc}")
            reports.append({"input": str(job.input), "error": str(exc)})
            continue
        state = "rewritten" if report.modified else "unchanged"
        tally[state] += 1
        differ = changed_files(report.files)
        refused = sum(p.to_dict()["refused"] for p in report.passes)
        remaining = ", ".join(r["code"] for r in report.remaining)
        capture = report.capture
        blockers = capture["blockers"] if capture else []
        _say(f"[{i}/{len(jobs)}] {job.relative}: {state}"
             + (f" ({', '.join(differ)} not the input's bytes)" if differ else
                " (every file the input's bytes)" if report.files else "")
             + (f"; refused {refused} (see --report)" if refused else "")
             + (f"; output still has {remaining}" if remaining else "")
             + (f"; capture {capture['state']}" if capture else "")
             + (f" by {len(blockers)} ({blockers[0]['node']}, ...)" if blockers else "")
             + (" (predicted)" if capture else ""))
        reports.append(report.to_dict())
        if args.explain:
            explain(report, output_console(), indent="    ")
    if args.report:
        write_report(args.report, json.dumps(reports, indent=2))
    if args.json:
        print(json.dumps(reports, indent=2))
    _say(f"{len(jobs)} models: {tally['rewritten']} rewritten, {tally['unchanged']} unchanged, "
         f"{tally['failed']} failed" + (" (dry run: nothing written)" if args.dry_run else ""))
    return 2 if tally["failed"] else 0


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _run_one(args: argparse.Namespace, plan: RunPlan, job: ModelJob) -> int:
    from rich.console import Console

    from rope_passes.io import write_report

    console = Console(stderr=True)
    status = console.status("loading", spinner="dots") if console.is_terminal else None

    def progress(name: str, index: int, total: int) -> None:
        if status is not None:
            status.update(f"pass {index + 1}/{total}: {name}")

    if status is not None:
        status.start()
    try:
        report = _optimize(args, plan, job, progress)
    finally:
        if status is not None:
            status.stop()
    if args.report:
        write_report(args.report, json.dumps(report.to_dict(), indent=2))
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        render(report, output_console(), plan)
        if args.explain:
            explain(report, output_console())
    return 0


def runtime_line(label: str, explicit: bool, skipped: Mapping[str, str]) -> str:
    """``output for onnxruntime-webgpu 1.27.0 (...)``, then the preset passes that runtime does not need, and why."""
    how = "--runtime" if explicit else "the runtime installed here; --runtime to choose another"
    lines = [f"output for {label} ({how})"]
    lines += [f"  {name} skipped: {why}" for name, why in skipped.items()]
    return "\n".join(lines)


def capture_lines(report: PipelineReport) -> list[str]:
    """``webgpu-graph``: the output's capture verdict, each blocker with its node, and what genai_config.json got."""
    capture = report.capture
    if not capture:
        return []
    lines = [f"graph capture, predicted: {capture['verdict']}"]  # the probed table's static placement, not a session
    lines += [f"  blocker at {b['node']}: {b['why']}" for b in capture["blockers"]]
    lines.append(f"  {capture['config']}")
    return lines


def explain(report: PipelineReport, console: Console, indent: str = "") -> None:
    """Every finding of every pass, in pipeline order: what was tried where, and what came of it."""
    for p in report.passes:
        console.print(f"{indent}{p.pass_name}: {p.status}", highlight=False, soft_wrap=True)
        for f in p.findings:
            details = ", ".join(f"{k}={_short(v)}" for k, v in f.details.items())
            console.print(f"{indent}  {f.outcome} {f.place}: {f.reason}" + (f" [{details}]" if details else ""),
                          highlight=False, soft_wrap=True)


def _short(value) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 80 else text[:77] + "..."


def render(report: PipelineReport, console: Console, plan: RunPlan) -> None:
    from rich.markup import escape  # reasons quote graphs ("[1, 3]", "[t]*s0"): text, never markup
    from rich.table import Table

    from rope_passes.io.files import describe_files

    table = Table(title=f"rope-passes optimize ({report.preset or 'custom passes'})", title_justify="left")
    for col in ("pass", "matched", "rewritten", "refused", "nodes −/+"):
        table.add_column(col, no_wrap=True)
    table.add_column("status", overflow="fold")  # wrapped, never cut: the reason is what the user reads this for
    for p in report.passes:
        d = p.to_dict()
        table.add_row(p.pass_name, str(d["matched"]), str(d["rewritten"]), str(d["refused"]),
                      f"{p.nodes_removed}/{p.nodes_added}", escape(p.status))
    console.print(table)
    for p in report.passes:
        grouped: dict[tuple[str, str], list[str]] = {}
        for f in p.findings:
            if str(f.outcome) in ("refused", "note"):
                grouped.setdefault((str(f.outcome), f.reason), []).append(f.place)
        for (outcome, reason), targets in grouped.items():
            where = targets[0] if len(targets) == 1 else f"{len(targets)} places ({targets[0]}, ...)"
            console.print(escape(f"  {p.pass_name}: {outcome} at {where}: {reason}"), highlight=False)
    for r in report.remaining:
        where = r["target"] if r["count"] == 1 else f"{r['count']} places ({r['target']}, ...)"
        console.print(escape(f"  output still has {r['code']} {r['severity']} at {where}: {r['message']}"),
                      highlight=False)
    for line in capture_lines(report):
        console.print(escape(line), highlight=False, soft_wrap=True)
    if report.dry_run:
        console.print("dry run: nothing written")
    elif report.output_path:
        if report.modified:
            what = "rewritten"
        elif report.copied_verbatim:
            what = "unchanged (input copied byte for byte)"
        else:
            what = "graph unchanged (re-saved with IR version ≤ 13 so onnxruntime 1.27 loads it)"
        weights = f" (weights: {report.weights})" if report.weights else ""
        console.print(f"{what} → {report.output_path}{weights}", highlight=False, soft_wrap=True)
        console.print(escape(f"  files: {describe_files(report.files)}"), highlight=False, soft_wrap=True)
    console.print(runtime_line(plan.runtime.label, plan.runtime_given, plan.skipped), highlight=False,
                  soft_wrap=True)
    sys.stdout.flush()
