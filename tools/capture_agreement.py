"""Does the static capture verdict agree with onnxruntime on every graph we can build? (issue 19)

For every graph of the shared genai corpus, tests/fixtures (builder, olive, optimum, torch exports, mobius-onnx) and
the demo model, and for each one's ``optimize --target webgpu-graph`` output (``--text-only`` too), compares the one
home's verdict (:func:`rope_passes.analysis.placement.capture_verdict`) with a real WebGPU session created with
``enableGraphCapture=1`` (:func:`rope_passes.runtime.placement_probe.probe_placement`) on one runtime:

* no node unknown to the static rules: same load verdict, same capture verdict, same Memcpy set;
* some node unknown (shape math onnxruntime may fold): the capture verdict is "unknown" or the runtime's, and every
  Memcpy it claims is one onnxruntime inserts.

    .venv/bin/python tools/capture_agreement.py [--runtime onnxruntime-ep-webgpu] [--only corpus,mobius] [-v]

Exit 1 when a graph disagrees. About 10 minutes per runtime on 2 cores (one session per graph).
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "corpus" / "genai"
FIXTURES = REPO / "tests" / "fixtures"


def inputs() -> dict[str, Path]:
    """name -> model folder (genai) or .onnx file (exports)."""
    out = {f"corpus/{p.parent.relative_to(SHARED)}": p.parent for p in sorted(SHARED.glob("*/*/*/model.onnx"))}
    for p in sorted(FIXTURES.glob("**/model.onnx")):
        out[f"fx/{p.parent.relative_to(FIXTURES)}"] = p.parent
    for p in sorted(FIXTURES.glob("torch/**/decode.onnx")):
        out[f"fx/{p.parent.relative_to(FIXTURES)}"] = p
    return out


def main(argv: list[str] | None = None) -> int:
    import rope_passes
    from rope_passes.analysis.placement import capture_verdict
    from rope_passes.demo import build_tiny_decoder
    from rope_passes.runtime.placement_probe import probe_placement
    from rope_passes.runtimes.descriptors import WEBGPU_127

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runtime", default=WEBGPU_127)
    ap.add_argument("--only", default="", help="comma-separated name fragments (corpus, mobius, optimum, demo, ...)")
    ap.add_argument("-v", action="store_true", help="print every graph, not only disagreements")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="capture-agreement-"))
    # the outputs hard-link the corpus's weights (--weights link), and onnx refuses to load a file with several
    # links: the folder must not outlive the run
    atexit.register(shutil.rmtree, work, True)
    sources = inputs()
    sources["demo"] = build_tiny_decoder(work / "demo-src")  # not work / "demo": that is its output
    if args.only:
        sources = {k: v for k, v in sources.items() if any(o in k for o in args.only.split(","))}
    models: dict[str, Path] = {}
    for name, src in sources.items():
        models[name] = src / "model.onnx" if src.is_dir() else src
        for text in (False, True):
            out = work / (name.replace("/", "_") + ("_text" if text else ""))
            out = out if src.is_dir() else out.with_suffix(".onnx")
            try:
                rope_passes.optimize(src, out, preset="webgpu-graph", runtime=args.runtime, weights="link",
                                     options={"text_only": True} if text else None)
            except Exception as exc:  # noqa: BLE001 - a graph optimize refuses is reported, not fatal
                print(f"optimize failed: {name}{' --text-only' if text else ''}: {exc}")
                continue
            models[f"{name} -> webgpu-graph{' --text-only' if text else ''}"] = out / "model.onnx" if src.is_dir() else out

    def one(item: tuple[str, Path]):
        name, path = item
        return name, capture_verdict(path, args.runtime), probe_placement(path, graph_capture=True,
                                                                          runtime=args.runtime)

    bad = unknown = 0
    with ThreadPoolExecutor(2) as pool:
        for name, s, p in pool.map(one, models.items()):
            if s.unknown:
                unknown += 1
                claimed = set().union(*[m.names for m in p.memcpy]) if p.memcpy else set()
                ok = s.loads == p.loads and all(m.names & claimed for m in s.memcpy) and (
                    s.capture_ok is None or s.capture_ok == p.capture_ok)
            else:
                ok = s.loads == p.loads and s.capture_ok == p.capture_ok and s.same_memcpy(p)
            bad += not ok
            if not ok or args.v:
                print(f"{'ok ' if ok else 'BAD'} {name}\n    static:  {s.summary()[:160]}\n    runtime: "
                      f"{p.summary()[:160]}", flush=True)
    print(f"{args.runtime}: {len(models)} graphs, {bad} disagree, {unknown} with nodes the static rules cannot place")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
