#!/usr/bin/env python
"""SHA-256 of every file `rope-passes optimize` writes, for every shared-corpus model and preset.

Used to show that a restructuring changes no output byte: run it before and after, diff the two JSON files.

    python tools/output_digests.py OUT.json [--shared ../shared] [--jobs 2]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

RUNS = {  # label -> optimize arguments
    "webgpu": ["--target", "webgpu"],
    "webgpu-text": ["--target", "webgpu", "--text-only"],
    "webgpu-graph": ["--target", "webgpu-graph"],
    "webgpu-graph-text": ["--target", "webgpu-graph", "--text-only"],
}
EXPORTER = {"exporter": ["--target", "exporter", "--max-positions", "512"]}


def digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and ".rope-passes-" not in str(p)}


def one(cli: str, model: Path, label: str, args: list[str]) -> tuple[str, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / ("out" if model.is_dir() else "out.onnx")
        # --weights rewrite: every tensor re-serialized into one data file, the layout the digests were taken with
        r = subprocess.run([cli, "optimize", str(model), "-o", str(out), "--weights", "rewrite", *args],
                           capture_output=True, text=True)
        result: dict = {"rc": r.returncode}
        if r.returncode == 0:
            result["files"] = digests(out if out.is_dir() else Path(tmp))
        else:
            result["stderr"] = r.stderr.strip().splitlines()[-1:] if r.stderr else []
        return f"{model}::{label}", result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shared", default=str(Path(__file__).resolve().parents[1].parent / "shared"))
    ap.add_argument("--cli", default=str(Path(sys.executable).parent / "rope-passes"))
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    corpus = Path(a.shared) / "corpus"
    jobs = [(m.parent, label, args) for m in sorted((corpus / "genai").glob("*/*/*/model.onnx"))
            for label, args in RUNS.items()]
    jobs += [(m, label, args) for m in sorted((corpus / "torch").glob("*/*/*/*.onnx")) for label, args in EXPORTER.items()]
    results = {}
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        for key, res in pool.map(lambda j: one(a.cli, *j), jobs):
            results[key.replace(str(corpus) + "/", "")] = res
    Path(a.out).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print(f"{len(results)} runs, {sum(r['rc'] == 0 for r in results.values())} written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
