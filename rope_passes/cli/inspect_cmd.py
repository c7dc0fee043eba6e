"""``rope-passes inspect MODEL [MODEL ...] [--json]``: the RoPE census of each model (file or genai folder)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from rope_passes.analysis.census import census, render
from rope_passes.cli import output_console
from rope_passes.io import load_bundle


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="RoPE census of a model: attention op, caches, flavour, positions")
    p.add_argument("models", nargs="+", metavar="MODEL",
                   help="model.onnx or a model folder (model + genai_config.json); several give a census each")
    p.add_argument("--json", action="store_true",
                   help="print JSON: one object for one model, a list of objects for several")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    results = []
    for path in args.models:
        bundle = load_bundle(path)
        results.append(census(bundle.model, bundle.genai_config, source=str(path)))
    try:
        if args.json:
            data = [r.to_dict() for r in results]
            print(json.dumps(data[0] if len(data) == 1 else data, indent=2))
            return 0
        console = output_console()
        for i, result in enumerate(results):
            if i:
                console.print()
            render(result, console)
        sys.stdout.flush()
    except BrokenPipeError:  # `rope-passes inspect ... | head`: the reader left, which is fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
