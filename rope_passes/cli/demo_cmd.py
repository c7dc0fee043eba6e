"""``rope-passes demo``: the main job on the embedded tiny decoder, end to end.

Builds the tiny genai-style decoder in code (no download), prints its RoPE census, optimizes it for WebGPU graph
capture, prints the census again, and checks the rewritten model against the original (CPU reference, WebGPU,
WebGPU with graph capture). Exit code is the checker's.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from rope_passes.cli import add_command, output_console


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "demo", help="build the embedded tiny decoder, optimize it for WebGPU graph capture, check it",
                    description="Builds the embedded tiny genai-style decoder (no download), prints its RoPE census, "
                    "optimizes it with --preset webgpu-graph, prints the census again and checks the rewritten "
                    "model against the original (CPU reference, WebGPU, WebGPU with graph capture).",
                    exits=("0  the rewritten model is equivalent", "1  it is not (the checker's verdict)",
                           "2  something could not run (the checker's or optimize's exit code)"))
    p.add_argument("--out", help="keep the demo models in this folder (default: a temporary folder, removed at the end)")
    p.add_argument("--steps", type=int, default=8, help="decode steps for the check (default 8)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.out:
        return _demo(Path(args.out), args.steps)
    with tempfile.TemporaryDirectory(prefix="rope-passes-demo-") as tmp:  # nothing left behind in the temp dir
        code = _demo(Path(tmp), args.steps)
    output_console().print(f"(the demo models were in {tmp}, removed now: --out DIR keeps them)", highlight=False)
    return code


def _demo(root: Path, steps: int) -> int:
    from rich.rule import Rule

    from rope_passes.cli import main
    from rope_passes.demo import build_tiny_decoder

    console = output_console()
    original = build_tiny_decoder(root / "tiny")
    rewritten = root / "tiny-webgpu-graph"
    console.print(Rule(f"1. embedded tiny decoder → {original}"))
    main(["inspect", str(original)])
    console.print(Rule("2. optimize --preset webgpu-graph"))
    code = main(["optimize", str(original), "-o", str(rewritten), "--preset", "webgpu-graph"])
    if code:
        return code
    console.print(Rule("3. the rewritten model"))
    main(["inspect", str(rewritten)])
    console.print(Rule("4. check: original (CPU, WebGPU) vs rewritten (WebGPU, graph capture)"))
    return main(["check", str(original), str(rewritten), "--steps", str(steps), "--graph-capture"])
