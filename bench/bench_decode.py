"""Decode-step latency on onnxruntime-webgpu: original vs rope-passes output, measured in one run.

For each model: optimize it (``--target`` preset, default webgpu-graph, ``text_only`` on), then time single-token
decode steps of the original and the rewritten graph on the WebGPU EP, interleaved A/B/A/B so machine noise hits
both alike, and print medians and the ratio. Absolute times on a software adapter (lavapipe) mean little; the ratio
measured in one run is the claim (see docs/performance.md).

    .venv/bin/python bench/bench_decode.py                      # the embedded tiny decoder
    .venv/bin/python bench/bench_decode.py ../shared/corpus/genai/legacy/qwen35/cpu_fp32_text --steps 40
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import rope_passes
from rope_passes.check.decode import DecoderSpec, step_feeds, token_ids
from rope_passes.io import load_bundle
from rope_passes.runtime.sessions import create_session


def step_timer(model_dir: Path, prefill: int, ep: str):
    bundle = load_bundle(model_dir)
    sess = create_session(str(bundle.model_path), ep)
    spec = DecoderSpec.from_session(sess, bundle.genai_config)
    tokens = token_ids(prefill + 1)
    outs = dict(zip(spec.outputs, sess.run(spec.outputs, step_feeds(spec, tokens[:, :prefill], 0))))
    past = {p: outs[spec.present_name(p)] for p in spec.past_names}
    feeds = step_feeds(spec, tokens[:, prefill:], prefill, past)

    def once() -> float:
        start = time.perf_counter()
        sess.run(spec.outputs, feeds)
        return time.perf_counter() - start

    return once


def bench(model_dir: Path, target: str, steps: int, ep: str, prefill: int) -> tuple[float, float, str]:
    out = Path(tempfile.mkdtemp(prefix="rope-bench-")) / "out"
    report = rope_passes.optimize(str(model_dir), str(out), preset=target, options={"text_only": True})
    changed = ", ".join(p.pass_name for p in report.passes if p.modified) or "nothing"
    a, b = step_timer(model_dir, prefill, ep), step_timer(out, prefill, ep)
    for _ in range(3):  # warm-up
        a(), b()
    ta, tb = [], []
    for _ in range(steps):
        ta.append(a())
        tb.append(b())
    return statistics.median(ta) * 1e3, statistics.median(tb) * 1e3, changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help="model folders (default: the embedded tiny decoder)")
    ap.add_argument("--target", default="webgpu-graph")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--ep", default="webgpu", choices=["webgpu", "cpu"])
    ap.add_argument("--prefill", type=int, default=8)
    args = ap.parse_args(argv)
    models = [Path(m) for m in args.models]
    if not models:
        from rope_passes.demo import build_tiny_decoder

        models = [build_tiny_decoder(Path(tempfile.mkdtemp(prefix="rope-bench-")) / "tiny")]
    print(f"decode step on {args.ep}, median of {args.steps} interleaved A/B runs, prefill {args.prefill}")
    print(f"{'model':<48} {'original ms':>12} {'rewritten ms':>13} {'ratio':>7}  passes that changed it")
    for m in models:
        ta, tb, changed = bench(m, args.target, args.steps, args.ep, args.prefill)
        print(f"{str(m)[-48:]:<48} {ta:12.3f} {tb:13.3f} {ta / tb:6.2f}x  {changed}")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
