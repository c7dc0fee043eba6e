#!/usr/bin/env python
"""SHA-256 of every file `rope-passes optimize` writes, for every shared-corpus model and preset.

Used to show that a restructuring changes no output byte: run it before and after, diff the two JSON files.

    python tools/output_digests.py OUT.json [--shared ../shared] [--jobs 2]
    python tools/output_digests.py --compare BEFORE.json AFTER.json

Each ``.onnx`` file also gets a ``normalized`` digest: the model proto with the metadata entry
``rope_passes.runtime`` (which runtime an output is for, added with the runtime targets) removed, re-serialized.
Comparing those shows what changed besides that one entry. Runs ``--weights rewrite`` when the CLI has the flag
(every tensor re-serialized into one data file: the layout before ``--weights`` existed).
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


NORMALIZED_AWAY = "rope_passes.runtime"


def _normalized(path: Path) -> str:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    keep = [p for p in proto.metadata_props if p.key != NORMALIZED_AWAY]
    del proto.metadata_props[:]
    proto.metadata_props.extend(keep)
    return hashlib.sha256(proto.SerializeToString(deterministic=True)).hexdigest()


def digests(folder: Path) -> dict[str, str]:
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and ".rope-passes-" not in str(p):
            out[str(p.relative_to(folder))] = hashlib.sha256(p.read_bytes()).hexdigest()
            if p.suffix == ".onnx":
                out[str(p.relative_to(folder)) + "#normalized"] = _normalized(p)
    return out


def _has_weights_flag(cli: str) -> bool:
    return "--weights" in subprocess.run([cli, "optimize", "--help"], capture_output=True, text=True).stdout


def one(cli: str, model: Path, label: str, args: list[str]) -> tuple[str, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / ("out" if model.is_dir() else "out.onnx")
        # --weights rewrite: every tensor re-serialized into one data file, the layout the digests were taken with
        weights = ["--weights", "rewrite"] if WEIGHTS_FLAG else []
        r = subprocess.run([cli, "optimize", str(model), "-o", str(out), *weights, *args],
                           capture_output=True, text=True)
        result: dict = {"rc": r.returncode}
        if r.returncode == 0:
            result["files"] = digests(out if out.is_dir() else Path(tmp))
        else:
            result["stderr"] = r.stderr.strip().splitlines()[-1:] if r.stderr else []
        return f"{model}::{label}", result


WEIGHTS_FLAG = False


def compare(before_path: str, after_path: str) -> int:
    """Print every run whose files differ: raw bytes, and the normalized .onnx digests."""
    before, after = json.loads(Path(before_path).read_text()), json.loads(Path(after_path).read_text())
    raw_same = normalized_same = 0
    for key in sorted(set(before) | set(after)):
        b, a = before.get(key, {}), after.get(key, {})
        if b.get("rc") != a.get("rc"):
            print(f"{key}: exit {b.get('rc')} -> {a.get('rc')} {a.get('stderr', '')}")
            continue
        bf, af = b.get("files", {}), a.get("files", {})
        raw = {k: v for k, v in bf.items() if not k.endswith("#normalized")}
        if raw == {k: v for k, v in af.items() if not k.endswith("#normalized")}:
            raw_same += 1
            normalized_same += 1
            continue
        changed = sorted(k for k in set(bf) | set(af) if k.endswith("#normalized") and bf.get(k) != af.get(k))
        others = sorted(k for k in set(raw) | {k for k in af if not k.endswith("#normalized")}
                        if not k.endswith(".onnx") and bf.get(k) != af.get(k))
        if not changed and not others:
            normalized_same += 1
        else:
            print(f"{key}: differs beyond {NORMALIZED_AWAY}: {', '.join(changed + others)}")
    print(f"{len(set(before) | set(after))} runs: {raw_same} byte-identical, {normalized_same} identical except the "
          f"{NORMALIZED_AWAY} metadata entry")
    return 0


def main() -> int:
    global WEIGHTS_FLAG
    if len(sys.argv) == 4 and sys.argv[1] == "--compare":
        return compare(sys.argv[2], sys.argv[3])
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shared", default=str(Path(__file__).resolve().parents[1].parent / "shared"))
    ap.add_argument("--cli", default=str(Path(sys.executable).parent / "rope-passes"))
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    WEIGHTS_FLAG = _has_weights_flag(a.cli)
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
