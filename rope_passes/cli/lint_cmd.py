"""``rope-passes lint MODEL... [--runtime R] [--format text|json|github|sarif] [--fix] [--select/--ignore CODES]``.

The load and placement rules (RP001-RP003, RP101, RP205) are for one WebGPU runtime: ``--runtime`` (default: the one
installed here).

Exit 0: no problem at or above ``--fail-on`` (default: warning); 1: problems found; 2: a model could not be read.
``--fix`` rewrites each model in place (atomically) with the passes that fix what was found, then lints again and
reports what is left.

Only argparse-level names at the top: the linting imports (onnx_ir, the rules) happen in :func:`run`, so ``--help``
and usage errors import nothing heavy.
"""

from __future__ import annotations

import argparse
import sys

from rope_passes.cli import add_command, add_preset_argument, add_runtime_argument

#: :data:`rope_passes.lint.formats.FORMATS` and :class:`rope_passes.lint.core.Severity`, spelled out so that the parser
#: imports nothing heavy (tests/test_startup.py checks they agree)
FORMAT_NAMES = ("github", "json", "sarif", "text")
SEVERITIES = ("error", "warning", "note")
ORDER = {"note": 0, "warning": 1, "error": 2}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "lint", help="lint models for WebGPU RoPE problems (rule codes, --fix, CI formats)",
        description="Lints each model (file, folder, or folder of model folders) for what keeps it from loading, "
        "running right or being captured on a WebGPU runtime: rule codes RP001-RP4xx (--list-rules), each with "
        "the pass that fixes it. Weight matrices are never read (cos/sin tables are, where RP4xx compares them "
        "with config.json). --fix rewrites each model in place with those passes, then lints again and reports "
        "what is left.",
        exits=("0  no finding at or above --fail-on", "1  findings at or above --fail-on",
               "2  a model could not be read, or a usage error"))
    p.add_argument("models", nargs="*", help="model files, model folders, or folders of model folders; a model's "
                                             "genai_config.json or data file stands for its model (what a "
                                             "pre-commit hook passes)")
    p.add_argument("--format", default="text", choices=FORMAT_NAMES,
                   help="text (default), json, github (workflow annotations) or sarif (code scanning)")
    add_runtime_argument(p, "the WebGPU runtime to lint for: what it loads (RP001-RP003, RP101) and where it places "
                            "nodes (RP205); --fix runs the passes that runtime needs")
    p.add_argument("--output", "-o", help="write the report to this file instead of stdout")
    p.add_argument("--fix", action="store_true", help="apply the fixing passes in place, then lint again")
    add_preset_argument(p, "with --fix: only this preset's passes may fix (default: every pass, in the webgpu-graph "
                           "order; what optimize --preset runs, chosen by the findings)")
    p.add_argument("--text-only", action="store_true",
                   help="with --fix: fold 3D-position mRoPE into GroupQueryAttention (RP103), as optimize "
                        "--text-only does")
    p.add_argument("--select", help="comma-separated rule codes to run (default: all)")
    p.add_argument("--ignore", help="comma-separated rule codes to skip")
    p.add_argument("--fail-on", default="warning", choices=SEVERITIES,
                   help="lowest severity that makes the exit code 1 (default: warning)")
    p.add_argument("--hf-config", metavar="PATH",
                   help="the models' Hugging Face config.json for the RP4xx rules (default: the one beside each)")
    p.add_argument("--list-rules", action="store_true", help="print the rules and exit")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rope_passes.io import check_report_path, lint_targets, write_report
    from rope_passes.lint import fix_bundle, lint_bundle
    from rope_passes.lint.core import RULES
    from rope_passes.lint.formats import FORMATS
    from rope_passes.plan import lint_plan

    if args.list_rules:
        for r in sorted(RULES.values(), key=lambda r: r.code):
            fix = f" [fix: {r.fix} {r.fix_flag}".rstrip() + "]" if r.fix else ""
            print(f"{r.code} {r.name} ({r.severity}){fix}\n    {r.summary}\n    {r.explanation}")
        return 0
    if not args.models:
        from rope_passes.errors import UsageError

        raise UsageError("no model given (rope-passes lint MODEL...)")
    if args.output:  # a folder or unwritable path fails before any work
        check_report_path(args.output)
    select = args.select.split(",") if args.select else None
    ignore = args.ignore.split(",") if args.ignore else ()
    paths = [str(m) for m in lint_targets(args.models)]  # genai_config.json, a data file: the model they belong to
    # the run, resolved once: the runtime, the config.json the RP4xx rules (and --fix) read, the fixing passes
    plan = lint_plan(fix=args.fix, options={"text_only": True} if args.text_only else {}, runtime=args.runtime,
                     hf_config=args.hf_config, preset=args.preset)
    results = {}
    for path in paths:
        if args.fix:
            fix_bundle(path, plan, select=select, ignore=ignore, log=lambda m: print(m, file=sys.stderr))
        results[path] = lint_bundle(path, plan, select=select, ignore=ignore)
    text = FORMATS[args.format](results)
    if args.output:
        write_report(args.output, text + "\n")
    elif text:
        print(text)
    threshold = ORDER[args.fail_on]
    failing = any(ORDER[d.severity.value] >= threshold for diags in results.values() for d in diags)
    return 1 if failing else 0
