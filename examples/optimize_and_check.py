"""Library use: optimize a genai model folder for WebGPU graph capture, print what each pass did, check the result.

    python examples/optimize_and_check.py MODEL_DIR OUT_DIR [--text-only]

Without arguments it builds the embedded tiny decoder first, so it runs anywhere.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import rope_passes
from rope_passes.demo import build_tiny_decoder


def main(argv: list[str]) -> int:
    text_only = "--text-only" in argv
    args = [a for a in argv if a != "--text-only"]
    if len(args) >= 2:
        return optimize_and_check(Path(args[0]), Path(args[1]), text_only)
    with tempfile.TemporaryDirectory(prefix="rope-example-") as tmp:  # removed afterwards: nothing left behind
        src = build_tiny_decoder(Path(tmp) / "tiny")
        return optimize_and_check(src, Path(tmp) / "tiny-webgpu-graph", text_only)


def optimize_and_check(src: Path, out: Path, text_only: bool) -> int:
    report = rope_passes.optimize(str(src), str(out), preset="webgpu-graph", options={"text_only": text_only})
    for p in report.passes:
        print(f"{p.pass_name:>22}: {p.status}")
    result = rope_passes.check(str(src), str(out), steps=4)
    print("equivalent" if result.exit_code == 0 else f"NOT equivalent / could not run (exit {result.exit_code})")
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
