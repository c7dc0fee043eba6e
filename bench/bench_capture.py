"""Decode-step latency on onnxruntime-webgpu: graph capture vs none, for a rope-passes `webgpu-graph` output.

Two ways to drive the same rewritten model, interleaved step by step so machine noise hits both alike:

* ``numpy``   - ``session.run`` with NumPy inputs and outputs, presents fed back as pasts (what most scripts do);
* ``capture`` - fixed WebGPU buffers (static KV cache shared by past/present, mask at max length) with
  ``enableGraphCapture=1``: decode step 1 captured, later steps replayed; only the logits are read back.

(Fixed GPU buffers *without* capture are not an option for these graphs: GroupQueryAttention reads
total_sequence_length from CPU memory unless capture is on, and gets 0.) The last step's logits of both ways must
agree within fp32/fp16 tolerance. Prints medians and the ratio measured in one run.

    .venv/bin/python bench/bench_capture.py                     # embedded tiny decoder, optimized first
    .venv/bin/python bench/bench_capture.py OUT_DIR --steps 64  # a folder already optimized for webgpu-graph
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

import rope_passes
from rope_passes.check.capture import WebGPUBuffers
from rope_passes.check.decode import DecoderSpec, step_feeds, token_ids
from rope_passes.io import load_bundle
from rope_passes.runtime.sessions import create_session, session_options


class NumpyLoop:
    def __init__(self, model: Path, config: dict | None, tokens: np.ndarray, prefill: int):
        self.sess = create_session(str(model), "webgpu")
        self.spec = DecoderSpec.from_session(self.sess, config)
        self.tokens, self.past_len, self.past = tokens, 0, None
        self._run(prefill)

    def _run(self, seq: int) -> np.ndarray:
        spec = self.spec
        feeds = step_feeds(spec, self.tokens[:, self.past_len:self.past_len + seq], self.past_len, self.past)
        outs = dict(zip(spec.outputs, self.sess.run(spec.outputs, feeds)))
        self.past = {p: outs[spec.present_name(p)] for p in spec.past_names}
        self.past_len += seq
        return outs["logits"]

    def step(self) -> np.ndarray:
        return self._run(1)


class BoundLoop:
    """Fixed WebGPU buffers; ``capture`` turns on enableGraphCapture (first decode step captured)."""

    def __init__(self, model: Path, config: dict | None, tokens: np.ndarray, prefill: int, max_len: int,
                 capture: bool):
        so = session_options("webgpu", graph_capture=capture)
        self.sess = create_session(str(model), "webgpu", so=so)
        spec = self.spec = DecoderSpec.from_session(self.sess, config)
        buf = self.buf = WebGPUBuffers()
        self.tokens, self.max_len, self.past_len = tokens, max_len, 0
        empty = step_feeds(spec, tokens[:, :prefill], 0, None)
        self.kv = {n: buf.new((1, empty[n].shape[1], max_len, empty[n].shape[3]), empty[n].dtype)
                   for n in spec.past_names}
        self.mask_host = np.zeros((1, max_len), spec.input("attention_mask").dtype)
        self.mask = buf.new(self.mask_host.shape, self.mask_host.dtype)
        outputs = {o.name: o for o in self.sess.get_outputs()}
        vocab = outputs["logits"].shape[-1]

        def bind(seq: int):
            feeds = step_feeds(spec, tokens[:, :seq], 0, None)
            ins = {n: buf.new(v.shape, v.dtype) for n, v in feeds.items()
                   if n != "attention_mask" and not n.startswith("past_key_values.")}
            logits = buf.new((1, seq, vocab), np.float16 if "float16" in outputs["logits"].type else np.float32)
            io = self.sess.io_binding()
            io.bind_ortvalue_input("attention_mask", self.mask)
            for n, v in ins.items():
                io.bind_ortvalue_input(n, v)
            for n, v in self.kv.items():
                io.bind_ortvalue_input(n, v)
                io.bind_ortvalue_output(spec.present_name(n), v)
            io.bind_ortvalue_output("logits", logits)
            return io, ins, logits

        pre = bind(prefill)
        self.decode = bind(1)
        no_capture = ort.RunOptions()
        no_capture.add_run_config_entry("gpu_graph_id", "-1")
        self._run(prefill, pre, no_capture)

    def _run(self, seq: int, bound, run_options=None) -> np.ndarray:
        io, ins, logits = bound
        chunk = self.tokens[:, self.past_len:self.past_len + seq]
        feeds = step_feeds(self.spec, chunk, self.past_len, {n: np.zeros(0) for n in self.kv})
        self.mask_host[:, :self.past_len + seq] = 1
        self.buf.fill(self.mask, self.mask_host)
        for n, v in ins.items():
            self.buf.fill(v, feeds[n])
        self.sess.run_with_iobinding(io, run_options)
        self.past_len += seq
        return logits.numpy()

    def step(self) -> np.ndarray:
        return self._run(1, self.decode)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", help="a model folder optimized for webgpu-graph (default: tiny decoder)")
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--prefill", type=int, default=8)
    args = ap.parse_args(argv)
    if args.model:
        folder = Path(args.model)
    else:
        from rope_passes.demo import build_tiny_decoder

        tmp = Path(tempfile.mkdtemp(prefix="rope-bench-"))
        folder = tmp / "out"
        rope_passes.optimize(str(build_tiny_decoder(tmp / "tiny")), str(folder), preset="webgpu-graph")
    bundle = load_bundle(folder)
    max_len = args.prefill + args.steps + 1
    tokens = token_ids(max_len)
    loops = {
        "numpy": NumpyLoop(bundle.model_path, bundle.genai_config, tokens, args.prefill),
        "capture": BoundLoop(bundle.model_path, bundle.genai_config, tokens, args.prefill, max_len, capture=True),
    }
    times: dict[str, list[float]] = {k: [] for k in loops}
    last: dict[str, np.ndarray] = {}
    for _ in range(args.steps):
        for name, loop in loops.items():
            start = time.perf_counter()
            out = loop.step()
            times[name].append(time.perf_counter() - start)
            last[name] = out
    # the captured replays compute what plain runs compute (logits of the last step; fp16 graphs get fp16 slack)
    tol = 1e-4 if last["numpy"].dtype == np.float32 else 0.1
    np.testing.assert_allclose(last["capture"].astype(np.float32), last["numpy"].astype(np.float32), atol=tol, rtol=tol)
    med = {k: statistics.median(v[2:]) * 1e3 for k, v in times.items()}  # skip the capture step and a warm-up
    print(f"{folder}: {args.steps} decode steps after a {args.prefill}-token prefill, WebGPU, median ms/step")
    for name in loops:
        print(f"  {name:<8} {med[name]:8.3f} ms")
    print(f"  capture speed-up: numpy/capture = {med['numpy'] / med['capture']:.2f}x (last logits agree within {tol})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
