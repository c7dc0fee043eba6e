"""``rope-passes optimize IN -o OUT``: load → passes → save, with a per-pass summary."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from rope_passes.cli import output_console
from rope_passes.errors import UsageError
from rope_passes.pipeline import PRESETS, optimize
from rope_passes.report import PipelineReport


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("optimize", help="rewrite a model (file or genai folder) for a target")
    p.add_argument("input", help="model.onnx or a model folder (model + genai_config.json + tokenizer files)")
    p.add_argument("-o", "--output", help="output .onnx path or folder (a folder input always gives a folder)")
    p.add_argument("--target", default="webgpu", choices=sorted(PRESETS), help="pass preset (default: webgpu)")
    p.add_argument("--passes", help="comma-separated pass names, run in this order instead of the preset")
    p.add_argument("--text-only", action="store_true",
                   help="the model will only see text prompts: allows folding mRoPE of 3D-position graphs")
    p.add_argument("--max-positions", type=int, metavar="N",
                   help="rows of precomputed cos/sin tables (precompute-cos-sin; default: genai_config context_length)")
    p.add_argument("--dry-run", action="store_true", help="run the passes and report, write nothing")
    p.add_argument("--in-place", action="store_true", help="overwrite the input (atomically)")
    p.add_argument("--report", metavar="FILE", help="write the report as JSON to FILE")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    passes = args.passes.split(",") if args.passes is not None else None
    if args.max_positions is not None and args.max_positions < 1:
        raise UsageError(f"--max-positions must be a positive number of rows, got {args.max_positions}")
    status = console.status("loading", spinner="dots") if console.is_terminal else None

    def progress(name: str, index: int, total: int) -> None:
        if status is not None:
            status.update(f"pass {index + 1}/{total}: {name}")

    if status is not None:
        status.start()
    try:
        report = optimize(
            args.input,
            args.output,
            target=args.target,
            passes=passes,
            options={"text_only": args.text_only,
                     **({"max_positions": args.max_positions} if args.max_positions is not None else {})},
            dry_run=args.dry_run,
            in_place=args.in_place,
            progress=progress,
        )
    finally:
        if status is not None:
            status.stop()
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report.to_dict(), f, indent=2)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        render(report, output_console())
    return 0


def render(report: PipelineReport, console: Console) -> None:
    table = Table(title=f"rope-passes optimize ({report.target or 'custom passes'})", title_justify="left")
    for col in ("pass", "matched", "rewritten", "refused", "nodes −/+", "status"):
        table.add_column(col)
    for p in report.passes:
        d = p.to_dict()
        status = p.status if len(p.status) <= 70 else p.status[:67] + "..."
        table.add_row(p.pass_name, str(d["matched"]), str(d["rewritten"]), str(d["refused"]),
                      f"{p.nodes_removed}/{p.nodes_added}", status)
    console.print(table)
    for p in report.passes:
        grouped: dict[tuple[str, str], list[str]] = {}
        for f in p.findings:
            if str(f.outcome) in ("refused", "note"):
                grouped.setdefault((str(f.outcome), f.reason), []).append(f.target)
        for (outcome, reason), targets in grouped.items():
            where = targets[0] if len(targets) == 1 else f"{len(targets)} places ({targets[0]}, ...)"
            console.print(f"  {p.pass_name}: {outcome} at {where}: {reason}", highlight=False)
    for r in report.remaining:
        where = r["target"] if r["count"] == 1 else f"{r['count']} places ({r['target']}, ...)"
        console.print(f"  output still has {r['code']} {r['severity']} at {where}: {r['message']}", highlight=False)
    if report.dry_run:
        console.print("dry run: nothing written")
    elif report.output_path:
        if report.modified:
            what = "rewritten"
        elif report.copied_verbatim:
            what = "unchanged (input copied byte for byte)"
        else:
            what = "graph unchanged (re-saved with IR version ≤ 13 so onnxruntime 1.27 loads it)"
        console.print(f"{what} → {report.output_path}")
    sys.stdout.flush()
