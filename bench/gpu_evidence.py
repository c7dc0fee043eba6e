"""The GPU evidence of issue 31 in one run: onnxruntime-genai's loop, original vs rewritten + capture, and costs.

Run through ``bench/gpu.sh`` (it installs the carried wheels on a GPU machine first). What it measures, per model
(``bench/realsize.py`` folders: real shapes, zero weights; ``--tiny``: the corpus's tiny configs with random
weights, on whatever WebGPU adapter there is, lavapipe in CI):

1. **genai loop**: onnxruntime-genai's own generate loop (bench/genai_loop.py) on the original as users have it
   (``enableGraphCapture=0``: it cannot be captured) and on ``optimize --preset webgpu-graph``'s output as written
   (``enableGraphCapture=1``), each prompt length of the plan: prefill tokens/s (the prompt in one call) and decode
   tokens/s (median step after the capture step), and whether both gave the same greedy tokens. The tiny corpus llama and
   Phi-3 (real weights; zero weights give degenerate tokens) run through the same loop, Phi-3 crossing its LongRoPE
   switch (32 rows in its tiny build) while decoding.
2. **rewrite cost**: the decode step with capture OFF on both sides, for the original, each preset prefix that
   changed the graph (optimize with the first k passes) and the full output: what our rewrites add or save as
   graph work, capture aside.
3. **floor**: the decode step vs the weight-bandwidth floor: bytes of the weights a decode step reads (every
   initializer but the embedding table and the cos/sin caches, of which a step reads rows) over the copy bandwidth
   measured on the same adapter (an fp16 ``Mul`` over a large device buffer: bytes read + written / time).

Writes to ``--out``: ``gpu-evidence.md`` (the tables docs/performance.md shows), ``gpu-evidence.json`` (every
number), ``gpu-evidence.csv`` (the genai rows), and ``decode-vs-context.png`` when matplotlib is importable.
Exit 0 when every compared pair gave the same tokens, 1 otherwise (the files are written either way).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import genai_loop  # noqa: E402  (bench/ is not a package)
import realsize  # noqa: E402

GENAI_HEADER = ("| model | weights | context | original prefill tok/s | original decode tok/s | rewritten + capture "
                "prefill tok/s | rewritten + capture decode tok/s | decode speed-up | same tokens |")
COST_HEADER = "| model | graph | decode ms/token, capture off | vs original |"
FLOOR_HEADER = ("| model | weights read per step (MB) | copy GB/s | floor ms | rewritten + capture decode ms | "
                "floor / decode |")
CSV_FIELDS = ["model", "weights", "context", "side", "prefill_tok_s", "decode_tok_s", "decode_ms", "same_tokens"]
#: tiny corpus models with real weights (real tokens), and the (prompt, new) they run with: None is the plan's
#: prompts up to the model's 256 rows; Phi-3's tiny build switches to its long factors at 32, crossed while decoding
REAL_TOKENS = {"current/llama/webgpu_fp16": None, "current/phi3_mini_128k/webgpu_fp16_graph": (8, 32)}
REAL_CONTEXT = 256


@dataclasses.dataclass(frozen=True)
class Plan:
    models: tuple[str, ...]  # realsize.MODELS names
    contexts: tuple[int, ...]  # prompt lengths
    new: int  # tokens decoded after each prompt
    per_pass: tuple[str, ...]  # models whose rewrite cost is measured pass by pass
    bandwidth_mb: int
    tiny: bool


PLANS = {
    # a real GPU: real shapes (zero weights, sparse), 3 contexts; 4080 + 32 decoded crosses Phi-3's switch at 4096
    "gpu": Plan(models=("llama3-8b", "llama3-8b-int4", "phi3-mini-128k-graph", "phi3-mini-128k-graph-int4",
                        "qwen25vl-3b", "qwen25vl-3b-int4"),
                contexts=(128, 1024, 4080), new=32, per_pass=("llama3-8b-int4", "qwen25vl-3b-int4"),
                bandwidth_mb=1024, tiny=False),
    # the CPU adapter (CI): the corpus's tiny configs, random weights, prompts <= 8 (lavapipe's GQA prefill is wrong
    # past 8 query rows: docs webgpu-on-cpu trap 7)
    "tiny": Plan(models=("llama3-8b-int4", "phi3-mini-128k-graph-int4"), contexts=(4, 8), new=16,
                 per_pass=("llama3-8b-int4",), bandwidth_mb=16, tiny=True),
}


def environment() -> dict[str, Any]:
    import onnxruntime as ort

    from rope_passes.runtime.adapter import adapter_info
    try:
        import onnxruntime_genai as og
        genai = getattr(og, "__version__", "?")
    except ImportError as exc:  # the loop rows then say why they did not run
        genai = f"not importable: {exc}"
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "adapter": adapter_info().summary, "onnxruntime": ort.__version__, "onnxruntime_genai": genai,
            "python": platform.python_version()}


def copy_bandwidth(mb: int) -> float:
    """GB/s of an fp16 ``Mul`` over an ``mb`` MiB device buffer on the WebGPU EP (bytes read + written / time),
    measured in a child process (onnxruntime 1.27 can crash tearing down device buffers at exit)."""
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--bandwidth", str(mb)],
                          capture_output=True, text=True, timeout=300, check=False)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("BANDWIDTH ")), None)
    if line is None:
        raise RuntimeError(f"copy bandwidth: exit {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return float(line.split()[1])


def _measure_bandwidth(mb: int, repeats: int = 20) -> float:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    from rope_passes.check.capture import WebGPUBuffers
    from rope_passes.runtime.sessions import create_session

    n = mb * (1 << 20) // 2
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "half"], ["y"]),
         helper.make_node("Slice", ["y", "zero", "one"], ["probe"])], "bandwidth",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [n]),
         helper.make_tensor_value_info("probe", TensorProto.FLOAT16, [1])],
        [onnx.numpy_helper.from_array(np.array(0.5, np.float16), "half"),
         onnx.numpy_helper.from_array(np.array([0], np.int64), "zero"),
         onnx.numpy_helper.from_array(np.array([1], np.int64), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    buf = WebGPUBuffers()  # the buffers before the session: the other order crashes onnxruntime 1.27 here
    x, y = buf.new((n,), np.float16), buf.new((n,), np.float16)
    sess = create_session(model.SerializeToString(), "webgpu")
    io = sess.io_binding()
    io.bind_ortvalue_input("x", x)
    io.bind_ortvalue_output("y", y)
    io.bind_output("probe", "cpu")  # read back: the run has finished when it returns
    sess.run_with_iobinding(io)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sess.run_with_iobinding(io)
        io.copy_outputs_to_cpu()
        times.append(time.perf_counter() - start)
    _KEEP.extend([buf, x, y, io, sess])  # freed by os._exit: freeing them crashes onnxruntime 1.27 here
    return 2 * n * 2 / statistics.median(times) / 1e9


_KEEP: list[Any] = []


def weight_bytes_per_step(model_path: Path) -> int:
    import onnx

    m = onnx.load(str(model_path), load_external_data=False)
    total = 0
    for t in m.graph.initializer:
        if "embed_tokens" in t.name or "cos_cache" in t.name or "sin_cache" in t.name:
            continue
        ext = {e.key: e.value for e in t.external_data}
        total += int(ext["length"]) if "length" in ext else len(t.raw_data)
    return total


def decode_stats(run: dict[str, Any]) -> dict[str, float]:
    steps = run["decode_s"][2:] or run["decode_s"]  # the first call samples the prefill's logits, the next captures
    ms = statistics.median(steps) * 1e3
    return {"prefill_tok_s": run["prompt"] / run["prefill_s"], "decode_ms": ms, "decode_tok_s": 1e3 / ms}


def loop(folder: Path, mode: str, plan: Plan, contexts: tuple[int, ...] | None = None,
         new: int | None = None) -> dict[str, Any]:
    try:
        return genai_loop.run_child(folder, mode, list(contexts or plan.contexts), new or plan.new, warm=True,
                                    timeout=120 if plan.tiny else 300)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return {"error": (str(exc).strip().splitlines() or ["?"])[-1][:300]}


def source(plan: Plan, name: str, folder: Path) -> Path:
    """A fresh realsize folder of ``name`` (sparse, < 1 s). Every optimize reads its own: the outputs hard-link
    the weights (``--weights link``: no copy of 2-16 GB), and onnx_ir reads no tensor of a file with two links."""
    if plan.tiny:
        spec = realsize.MODELS[name]
        cfg = dataclasses.replace(realsize.tiny_config(realsize.CORPUS / spec.source), layers=2)
        return realsize.build(name, folder, config=cfg, seed=0)
    return realsize.build(name, folder)


def build_models(plan: Plan, work: Path) -> dict[str, dict[str, Any]]:
    import rope_passes

    built = {}
    for name in plan.models:
        options = {"text_only": True} if "qwen" in name else None
        try:
            src = source(plan, name, work / name)
            report = rope_passes.optimize(src, work / f"{name}.opt", preset="webgpu-graph", options=options,
                                          weights="link")
        except Exception as exc:  # noqa: BLE001  (one model's failure must not cost the others' numbers)
            print(f"gpu_evidence: {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        changed = [p.pass_name for p in report.passes if p.modified]
        built[name] = {"source": src, "output": work / f"{name}.opt", "changed": changed, "options": options,
                       "passes": [p.pass_name for p in report.passes], "capture": (report.capture or {}).get("state"),
                       "weights": "int4" if realsize.MODELS[name].int4 else "fp16"}
    return built


def genai_rows(name: str, weights: str, original: dict, rewritten: dict) -> list[dict[str, Any]]:
    rows = []
    for i, ctx in enumerate(r["prompt"] for r in rewritten.get("runs", [])):
        row: dict[str, Any] = {"model": name, "weights": weights, "context": ctx, "new": rewritten["runs"][i]["new"],
                               "rewritten": decode_stats(rewritten["runs"][i])}
        if "runs" in original:
            row["original"] = decode_stats(original["runs"][i])
            row["same_tokens"] = original["runs"][i]["tokens"] == rewritten["runs"][i]["tokens"]
            row["speedup"] = row["original"]["decode_ms"] / row["rewritten"]["decode_ms"]
        else:
            row["original_error"] = original.get("error", "did not run")
        rows.append(row)
    if "error" in rewritten:
        rows.append({"model": name, "weights": weights, "context": None, "rewritten_error": rewritten["error"]})
    return rows


def pass_costs(name: str, info: dict, plan: Plan, work: Path) -> list[dict[str, Any]]:
    import rope_passes

    ctx = (plan.contexts[0],)
    graphs = [("original", info["source"])]
    names = info["passes"]
    for k, pass_name in enumerate(names):
        if pass_name in info["changed"] and pass_name != "cleanup":
            out = work / f"{name}.upto{k + 1}"
            fresh = source(plan, name, work / f"{name}.upto{k + 1}.src")
            rope_passes.optimize(fresh, out, passes=names[:k + 1], options=info["options"], weights="link")
            graphs.append((f"+ {pass_name}", out))
    graphs.append(("rewritten (all passes)", info["output"]))
    rows = []
    for label, folder in graphs:
        result = loop(folder, "webgpu0", plan, ctx)
        row: dict[str, Any] = {"model": name, "graph": label}
        if "runs" in result:
            row["decode_ms"] = decode_stats(result["runs"][0])["decode_ms"]
        else:
            row["error"] = result["error"]
        rows.append(row)
    base = rows[0].get("decode_ms")
    for row in rows:
        if base and "decode_ms" in row:
            row["vs_original"] = row["decode_ms"] / base
    return rows


def _f(value: Any, fmt: str = "{:.1f}") -> str:
    return "–" if value is None else fmt.format(value)


def _cell(text: str) -> str:
    """An error in a table cell: one short line (the JSON keeps it whole)."""
    return "failed: " + text.replace("|", "/")[-90:]


def _rule(header: str) -> str:
    return "|" + "---|" * (header.count("|") - 1)


def render(result: dict[str, Any]) -> str:
    env = result["environment"]
    lines = [f"GPU evidence ({result['plan']} plan): {env['adapter']}; onnxruntime {env['onnxruntime']}, "
             f"onnxruntime-genai {env['onnxruntime_genai']}, Python {env['python']}; {env['date']}; "
             f"{result['wall_s']:.0f} s", "", GENAI_HEADER, _rule(GENAI_HEADER)]
    for r in result["genai"]:
        if r.get("context") is None:
            lines.append(f"| {r['model']} | {r['weights']} | – | – | – | {_cell(r['rewritten_error'])} | – | – | – |")
            continue
        o, w = r.get("original", {}), r["rewritten"]
        same = {True: "yes", False: "NO"}.get(r.get("same_tokens"), "–")
        orig = [_f(o.get("prefill_tok_s")), _f(o.get("decode_tok_s"))] if o else [_cell(r["original_error"]), "–"]
        lines.append(f"| {r['model']} | {r['weights']} | {r['context']} | {orig[0]} | {orig[1]} | "
                     f"{_f(w['prefill_tok_s'])} | {_f(w['decode_tok_s'])} | {_f(r.get('speedup'), '{:.2f}x')} | "
                     f"{same} |")
    lines += ["", COST_HEADER, _rule(COST_HEADER)]
    for r in result["cost"]:
        lines.append(f"| {r['model']} | {r['graph']} | {_f(r.get('decode_ms'), '{:.2f}') if 'error' not in r else _cell(r['error'])}"
                     f" | {_f(r.get('vs_original'), '{:.2f}x')} |")
    lines += ["", FLOOR_HEADER, _rule(FLOOR_HEADER)]
    for r in result["floor"]:
        lines.append(f"| {r['model']} | {r['weight_bytes'] / 1e6:.1f} | {_f(r['copy_gb_s'])} | {_f(r['floor_ms'], '{:.3f}')} | "
                     f"{_f(r.get('decode_ms'), '{:.3f}')} | {_f(r.get('floor_over_decode'), '{:.2f}')} |")
    return "\n".join(lines) + "\n"


def write_outputs(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu-evidence.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (out / "gpu-evidence.md").write_text(render(result))
    with open(out / "gpu-evidence.csv", "w", newline="") as f:
        w = csv.DictWriter(f, CSV_FIELDS)
        w.writeheader()
        for r in result["genai"]:
            for side in ("original", "rewritten"):
                if r.get(side):
                    w.writerow({"model": r["model"], "weights": r["weights"], "context": r["context"], "side": side,
                                "prefill_tok_s": round(r[side]["prefill_tok_s"], 3),
                                "decode_tok_s": round(r[side]["decode_tok_s"], 3),
                                "decode_ms": round(r[side]["decode_ms"], 4), "same_tokens": r.get("same_tokens")})
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        result["picture"] = "skipped: matplotlib is not importable"
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for model in dict.fromkeys(r["model"] for r in result["genai"] if r.get("context")):
        rows = [r for r in result["genai"] if r["model"] == model and r.get("context")]
        for side, style in (("original", "--"), ("rewritten", "-")):
            pts = [(r["context"], r[side]["decode_ms"]) for r in rows if r.get(side)]
            if pts:
                ax.plot(*zip(*pts), style, marker="o", label=f"{model} {side}")
    ax.set_xlabel("context (prompt tokens)")
    ax.set_ylabel("decode ms/token")
    ax.set_title(f"onnxruntime-genai decode, {result['environment']['adapter'][:60]}", fontsize=8)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out / "decode-vs-context.png", dpi=110)
    result["picture"] = "decode-vs-context.png"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="folder for the tables and the picture")
    ap.add_argument("--tiny", action="store_true", help="the CPU-adapter plan (CI): tiny configs, short prompts")
    ap.add_argument("--work", help="folder for the built models (default: <out>/../gpu-work)")
    ap.add_argument("--budget", type=float, default=450, help="seconds; later measurements are skipped past it")
    ap.add_argument("--models", help="comma-separated subset of the plan's models")
    ap.add_argument("--bandwidth", type=int, metavar="MB", help=argparse.SUPPRESS)  # the child of copy_bandwidth
    if "--bandwidth" in (argv if argv is not None else sys.argv):
        args = argparse.Namespace(bandwidth=int((argv or sys.argv)[-1]))
        print(f"BANDWIDTH {_measure_bandwidth(args.bandwidth)}", flush=True)
        os._exit(0)
    ap.add_argument("--render", metavar="JSON", help="print the tables of a gpu-evidence.json and exit")
    args = ap.parse_args(argv)
    if args.render:
        print(render(json.loads(Path(args.render).read_text())), end="")
        return 0
    start = time.perf_counter()
    if not args.out:
        ap.error("--out is required")
    plan = PLANS["tiny" if args.tiny else "gpu"]
    if args.models:
        plan = dataclasses.replace(plan, models=tuple(args.models.split(",")))
    out = Path(args.out)
    work = Path(args.work) if args.work else out.parent / "gpu-work"
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"plan": "tiny" if plan.tiny else "gpu", "environment": environment(),
                              "contexts": plan.contexts, "new": plan.new, "genai": [], "cost": [], "floor": [],
                              "skipped": []}
    say = print
    try:
        result["copy_gb_s"] = copy_bandwidth(plan.bandwidth_mb)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        result["copy_gb_s"], result["copy_error"] = None, str(exc)[-500:]
    say(f"copy bandwidth {result['copy_gb_s']} GB/s; building {len(plan.models)} models", flush=True)
    built = build_models(plan, work)
    result["models"] = {k: {f: v[f] for f in ("weights", "passes", "changed", "capture")} for k, v in built.items()}
    result["skipped"] += [f"{name}: did not build or optimize (see the log)" for name in plan.models if name not in built]

    def over() -> bool:
        return time.perf_counter() - start > args.budget

    jobs: list[tuple[str, str, Path, Path, tuple[int, ...] | None, int | None]] = [
        (name, info["weights"], info["source"], info["output"], None, None) for name, info in built.items()]
    for i, (rel, calls) in enumerate(REAL_TOKENS.items()):
        real = realsize.CORPUS / rel
        if not real.is_dir():
            result["skipped"].append(f"real tokens: no {real}")
            continue
        import rope_passes
        rope_passes.optimize(real, work / f"real-tokens-{i}.opt", preset="webgpu-graph")
        prompts, new = ((calls[0],), calls[1]) if calls else (
            tuple(c for c in plan.contexts if c + plan.new <= REAL_CONTEXT) or (REAL_CONTEXT // 2,), None)
        jobs.append((f"tiny corpus {rel} (real weights)", "fp16", real, work / f"real-tokens-{i}.opt", prompts, new))
    for name, weights, src, dst, prompts, new in jobs:
        if over():
            result["skipped"].append(f"genai loop {name}")
            continue
        original, rewritten = loop(src, "webgpu0", plan, prompts, new), loop(dst, "config", plan, prompts, new)
        result["genai"] += genai_rows(name, weights, original, rewritten)
        say(f"genai loop {name}: {time.perf_counter() - start:.0f} s", flush=True)
    for name in plan.per_pass:
        if name not in built or over():
            result["skipped"].append(f"rewrite cost {name}")
            continue
        try:
            result["cost"] += pass_costs(name, built[name], plan, work)
        except Exception as exc:  # noqa: BLE001
            result["skipped"].append(f"rewrite cost {name}: {type(exc).__name__}: {exc}"[:300])
        say(f"rewrite cost {name}: {time.perf_counter() - start:.0f} s", flush=True)
    for name, info in built.items():
        rows = [r for r in result["genai"] if r["model"] == name and r.get("rewritten")]
        nbytes = weight_bytes_per_step(info["output"] / "model.onnx")
        floor_ms = nbytes / (result["copy_gb_s"] * 1e9) * 1e3 if result["copy_gb_s"] else None
        decode = rows[0]["rewritten"]["decode_ms"] if rows else None
        result["floor"].append({"model": name, "weight_bytes": nbytes, "copy_gb_s": result["copy_gb_s"],
                                "floor_ms": floor_ms, "decode_ms": decode,
                                "floor_over_decode": floor_ms / decode if decode and floor_ms else None})
    result["wall_s"] = time.perf_counter() - start
    write_outputs(result, out)
    (out / "gpu-evidence.json").write_text(json.dumps(result, indent=1, default=str) + "\n")  # with the picture
    print(render(result))
    differ = [f"{r['model']} @ {r['context']}" for r in result["genai"] if r.get("same_tokens") is False]
    if differ:
        print(f"gpu_evidence: different greedy tokens: {', '.join(differ)}", file=sys.stderr)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
