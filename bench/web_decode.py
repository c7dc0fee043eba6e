"""Decode-step latency of examples/web_decode_loop.mjs on onnxruntime-web, two ways of one model in one run (the
two decoders take turns, generation by generation, so machine noise hits both alike):

* default: the embedded tiny decoder optimized ``--runtime onnxruntime-web``, decoded with graph capture and
  without it, on the same static GPU KV buffers;
* ``--longrope FOLDER`` (a Phi-3 128k builder folder, e.g. the corpus's current/phi3_mini_128k/cpu_fp32): what a
  browser user gets for LongRoPE. Optimized ``--runtime onnxruntime-web`` the LongRoPE ``If`` stays, so
  onnxruntime-web refuses the capture and the loop decodes uncaptured; optimized ``--runtime onnxruntime-webgpu``
  (the concatenated cache, capture-ready) it captures, but onnxruntime-web ignores the cache offset: the tokens
  part from the first way's once the sequence passes original_max_position (tests/test_web_decode_loop.py shows
  the first way gives the original's tokens).

The loop runs in onnxruntime-web's own bundle on Dawn for Node by default (``--host chromium``: in headless
Chromium; fp32 graphs only there without a GPU). On a machine without a GPU both adapters are CPU ones (Mesa
lavapipe for Dawn, SwiftShader for Chromium): the numbers say what capture saves there, not what a GPU gets. Prints
the median decode step of each way (each generation's first step left out: it captures, or compiles shaders), the
median prompt run, the ratio and where their tokens part.

    .venv/bin/python bench/web_decode.py                                       # tiny decoder: capture vs none
    .venv/bin/python bench/web_decode.py --layers 8 --hidden 256               # a bigger tiny decoder
    .venv/bin/python bench/web_decode.py --longrope ../shared/corpus/genai/current/phi3_mini_128k/cpu_fp32
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import tempfile
from pathlib import Path
from typing import Any

from rope_passes.cli import main as cli
from rope_passes.demo import TINY, build_tiny_decoder
from rope_passes.runtime import web
from rope_passes.runtime.web.install import CHROMIUM, DAWN


def _optimize(src: Path, out: Path, runtime: str) -> Path:
    with contextlib.redirect_stdout(io.StringIO()):  # optimize's table
        assert cli(["optimize", str(src), "-o", str(out), "--preset", "webgpu-graph", "--runtime", runtime]) == 0
    return out


def _ways(args: argparse.Namespace, work: Path) -> dict[str, tuple[Path, bool | str]]:
    """{label: (folder, capture)}: the two ways to time."""
    if args.longrope:
        src = Path(args.longrope)
        return {"for onnxruntime-web (If kept), uncaptured": (_optimize(src, work / "web", "onnxruntime-web"), "auto"),
                "for onnxruntime-webgpu (concat cache), captured": (
                    _optimize(src, work / "webgpu", "onnxruntime-webgpu"), True)}
    cfg = dict(TINY, layers=args.layers, hidden=args.hidden, heads=args.hidden // 16, kv_heads=max(1, args.hidden // 32))
    out = _optimize(build_tiny_decoder(work / "original", cfg), work / "web", "onnxruntime-web")
    return {"uncaptured": (out, False), "captured": (out, True)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rope-web-bench-") as tmp:
        ways = _ways(args, Path(tmp))
        b = web.Browser(host=args.host)
        try:
            decoders = {w: b.call("loopLoad", {"folder": b.serve_folder(folder), "capture": capture,
                                               "maxLength": args.max_length})
                        for w, (folder, capture) in ways.items()}
            prompt = [5 + (7 * k) % 400 for k in range(args.prompt)]
            steps: dict[str, list[float]] = {w: [] for w in ways}
            prefill: dict[str, list[float]] = {w: [] for w in ways}
            tokens: dict[str, list[int]] = {}
            for _ in range(args.rounds):
                for w, d in decoders.items():
                    got = b.call("loopGenerate", {"decoder": d["id"], "prompt": prompt, "maxNewTokens": args.steps,
                                                  "eosTokenId": -1})
                    steps[w] += got["stepMs"][1:]
                    prefill[w].append(got["prefillMs"])
                    tokens.setdefault(w, got["tokens"])
            for d in decoders.values():
                b.call("loopRelease", {"decoder": d["id"]})
            first, second = (tokens[w] for w in ways)
            part = next((k for k, (x, y) in enumerate(zip(first, second)) if x != y), None)
            return {"runtime": b.label, "adapter": b.adapter_summary, "ways": list(ways),
                    "captured": {w: d["captured"] for w, d in decoders.items()},
                    "step_ms": {w: statistics.median(v) for w, v in steps.items()},
                    "prefill_ms": {w: statistics.median(v) for w, v in prefill.items()},
                    "n": len(steps[next(iter(ways))]), "max_length": decoders[next(iter(ways))]["maxLength"],
                    "tokens_part_at": None if part is None else args.prompt + part}
        finally:
            b.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--longrope", metavar="FOLDER", help="a Phi-3 128k builder folder: the LongRoPE comparison")
    ap.add_argument("--host", choices=[DAWN, CHROMIUM], default=DAWN)
    ap.add_argument("--layers", type=int, default=TINY["layers"])
    ap.add_argument("--hidden", type=int, default=TINY["hidden"])
    ap.add_argument("--prompt", type=int, default=8, help="prompt tokens (default 8)")
    ap.add_argument("--steps", type=int, default=40, help="new tokens per generation (default 40)")
    ap.add_argument("--max-length", type=int, help="tokens the KV buffers (and the captured mask) hold "
                                                   "(default: genai_config's search.max_length)")
    ap.add_argument("--rounds", type=int, default=3, help="generations per way, taking turns (default 3)")
    args = ap.parse_args()
    r = run(args)
    print(f"{r['runtime']}; adapter: {r['adapter']}; KV buffers of {r['max_length']} tokens")
    print(f"| way | captured | decode step, median ms ({r['n']} steps) | prompt of {args.prompt}, median ms |")
    print("|---|---|---|---|")
    for w in r["ways"]:
        print(f"| {w} | {'yes' if r['captured'][w] else 'no'} | {r['step_ms'][w]:.2f} | {r['prefill_ms'][w]:.1f} |")
    a, c = r["ways"]
    part = r["tokens_part_at"]
    print(f"{a} / {c}: {r['step_ms'][a] / r['step_ms'][c]:.2f}x; tokens: "
          + ("the same" if part is None else f"they part at the token predicted from {part} tokens"))


if __name__ == "__main__":
    main()
