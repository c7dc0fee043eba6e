"""Exporter output → rope-passes ``--preset exporter`` → onnxscript's ORT fusions, measured on WebGPU.

    python examples/exporter_then_ort_fusions.py [EXPORT_DIR] [--steps N] [--out DIR]

EXPORT_DIR holds the exported graph (``model.onnx``) and the model's ``config.json``, as optimum and transformers'
exporter leave them; without it the example uses the transformers-5 (``OnnxExporter``) Llama fixture of this
repository with its config. Four variants of the graph are written to DIR (default: a temporary folder, removed at
the end) and run as decode steps (batch 1, one new token, past 0..N-1) on onnxruntime's WebGPU EP and on CPU:

* ``original``: the export as it is;
* ``exporter``: ``rope_passes.optimize(..., preset="exporter")``: cos/sin read from tables (sized by config.json);
* ``original+fusions`` / ``exporter+fusions``: then ``onnxscript.rewriter.ort_fusions.optimize_for_ort`` (RMSNorm,
  SkipRMSNorm, RotaryEmbedding + cos/sin cache, SDPA/GQA/MHA fusions where its patterns match).

It prints, per variant: nodes, com.microsoft nodes, the fusion counts, nodes WebGPU leaves on CPU (the session's
placement), the median WebGPU decode-step time, and the largest difference from the original on CPU. Timings on a
machine without a GPU come from Mesa lavapipe (WebGPU on the CPU): compare them with each other, not with a GPU.
"""

from __future__ import annotations

import collections
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx_ir as ir

import rope_passes
from rope_passes.io import MAX_IR_VERSION
from rope_passes.runtime.sessions import WEBGPU, create_session

REPO = Path(__file__).resolve().parents[1]
DEFAULT = REPO / "tests" / "fixtures" / "torch" / "tf5" / "hf_onnx" / "llama" / "decode.onnx"
DEFAULT_CONFIG = REPO / "tests" / "fixtures" / "hf_rope" / "tf5" / "llama" / "config.json"


def _save(model: ir.Model, path: Path) -> Path:
    proto = ir.serde.serialize_model(model)
    proto.ir_version = min(proto.ir_version, MAX_IR_VERSION)
    path.write_bytes(proto.SerializeToString())
    return path


def _fused(src: Path, dst: Path) -> dict[str, int]:
    from onnxscript.rewriter import ort_fusions

    model = ir.load(src)
    model, counts = ort_fusions.optimize_for_ort(model)
    _save(model, dst)
    return {k: v for k, v in counts.items() if v}


def _feeds(sess, past: int, rng: np.random.RandomState) -> dict[str, np.ndarray]:
    feeds = {}
    for i in sess.get_inputs():
        if i.name == "input_ids":
            feeds[i.name] = rng.randint(0, 256, (1, 1)).astype(np.int64)
        elif i.name == "attention_mask":
            feeds[i.name] = np.ones((1, past + 1), np.int64)
        elif i.name == "position_ids":
            feeds[i.name] = np.full((3, 1, 1) if len(i.shape) == 3 else (1, 1), past, np.int64)
        else:  # the KV cache
            feeds[i.name] = (0.5 * rng.randn(1, i.shape[1], past, i.shape[3])).astype(np.float32)
    return feeds


def _measure(path: Path, steps: int, reference: list[list[np.ndarray]] | None, rounds: int = 5):
    """(CPU outputs per step, median WebGPU ms per step (best of ``rounds``), max |WebGPU - reference|)."""
    cpu, gpu = create_session(str(path), "cpu"), create_session(str(path), "webgpu")
    assert gpu.get_providers()[0] == WEBGPU, gpu.get_providers()
    calls = [_feeds(cpu, past, np.random.RandomState(past)) for past in range(steps)]
    outputs = [cpu.run(None, feeds) for feeds in calls]
    worst = 0.0
    for past, feeds in enumerate(calls):
        got = gpu.run(None, feeds)  # also warms the pipelines for this shape
        base = reference[past] if reference is not None else outputs[past]
        worst = max(worst, max(float(np.abs(g - r).max()) for g, r in zip(got, base, strict=True)))
    medians = []
    for _ in range(rounds):
        times = []
        for feeds in calls:
            start = time.perf_counter()
            gpu.run(None, feeds)
            times.append(time.perf_counter() - start)
        medians.append(statistics.median(times))
    return outputs, min(medians) * 1e3, worst


def main(argv: list[str]) -> int:
    options = ("--steps", "--out")
    steps = int(argv[argv.index("--steps") + 1]) if "--steps" in argv else 16
    out = argv[argv.index("--out") + 1] if "--out" in argv else None
    args = [a for i, a in enumerate(argv) if a not in options and (i == 0 or argv[i - 1] not in options)]
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        return run(Path(out), args, steps, kept=True)
    with tempfile.TemporaryDirectory(prefix="rope-exporter-fusions-") as tmp:  # removed afterwards
        return run(Path(tmp), args, steps, kept=False)


def run(work: Path, args: list[str], steps: int, kept: bool) -> int:
    src = work / "export"
    if args:
        shutil.copytree(args[0], src)
    else:
        src.mkdir()
        shutil.copy(DEFAULT, src / "model.onnx")
        shutil.copy(DEFAULT_CONFIG, src / "config.json")
    report = rope_passes.optimize(str(src), str(work / "exporter"), preset="exporter")
    for p in report.passes:
        print(f"rope-passes {p.pass_name}: {p.status}")
    variants = {"original": src / "model.onnx", "exporter": work / "exporter" / "model.onnx"}
    counts = {"original": {}, "exporter": {}}
    for name in ("original", "exporter"):
        fused = work / f"{name}+fusions.onnx"
        counts[f"{name}+fusions"] = _fused(variants[name], fused)
        variants[f"{name}+fusions"] = fused
    reference = None
    print(f"\n{'variant':<18} {'nodes':>5} {'ms':>3} {'CPU/Memcpy':>10} {'WebGPU ms/step':>14} "
          f"{'max |Δ| vs original':>20}  fusions")
    for name, path in variants.items():
        model = ir.load(path)
        ops = collections.Counter((n.domain or "", n.op_type) for n in ir.traversal.RecursiveGraphIterator(model.graph))
        ms_nodes = sum(v for (d, _), v in ops.items() if d == "com.microsoft")
        on_cpu = _placement(path)
        outputs, ms, worst = _measure(path, steps, reference)
        if reference is None:
            reference = outputs
        print(f"{name:<18} {sum(ops.values()):>5} {ms_nodes:>3} {on_cpu:>10} {ms:>14.3f} {worst:>20.2e}  "
              f"{counts[name] or '-'}")
    where = f"outputs in {work}" if kept else "outputs removed: --out DIR keeps them"
    print(f"\n(decode steps: batch 1, one token, past 0..{steps - 1}; ms = com.microsoft nodes; CPU/Memcpy = nodes "
          f"onnxruntime's WebGPU session places on CPU / Memcpy nodes it inserts; {where})")
    return 0


def _placement(path: Path) -> str:
    """Nodes onnxruntime's WebGPU session places on CPU, and the Memcpy nodes it inserts (verbose-log probe)."""
    from rope_passes.runtime.placement_probe import probe_placement

    try:
        placement = probe_placement(path, graph_capture=False)
    except Exception as exc:  # noqa: BLE001 - the probe is informative only here
        return f"? ({type(exc).__name__})"
    return f"{len(placement.cpu_nodes)}/{len(placement.memcpy)}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
