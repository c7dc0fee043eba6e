"""Measure a JavaScript runtime (onnxruntime-web's WebGPU EP in headless Chromium, or onnxruntime-node's) and write
its JSON runtime table.

    .venv/bin/python tools/probe_web_runtime.py -o rope_passes/runtime_tables/onnxruntime-web.json
    .venv/bin/python tools/probe_web_runtime.py --host onnxruntime-node -o rope_passes/runtime_tables/onnxruntime-node.json
    .venv/bin/python tools/probe_web_runtime.py --host dawn --facts -o rope_passes/runtime_tables/onnxruntime-web.dawn.json

``--host``: where the probes run (:mod:`rope_passes.runtime.web`): ``chromium`` (the browser), ``onnxruntime-node``
(onnxruntime-node's native WebGPU EP: its log is read from the driver's stderr, not the console), ``dawn``
(onnxruntime-web's bundle on Dawn for Node). ``--facts``: the adapter, fp16, capture-replay and option probes only
(no kernel table), for a host of a runtime whose kernels are probed on another host (Dawn runs the browser's
kernels).

The same probes and the same table schema as tools/probe_runtime.py (whose functions this script runs), with every
WebGPU session created in the page of :mod:`rope_passes.runtime.web` instead of a Python onnxruntime: placements,
Memcpy and "kernel not found" lines are read from the page's console (onnxruntime-web's verbose log), errors are
onnxruntime-web's. What stays in Python: the probe models (op schemas of this interpreter's onnx/onnxruntime) and
the CPU-validity check of each one-node model (onnxruntime's CPU EP here). Added for the browser:

* ``"runtime": "onnxruntime-web"``, ``onnxruntime_version``: onnxruntime-web's npm version, ``bundle``;
* ``"adapter"``: the browser's WebGPU adapter (``requestAdapter().info``, features, limits: ``shader-f16`` is the
  fp16 question) and Chromium's version;
* ``"capture_replay"``: y = Add(x, w) under ``enableGraphCapture``, three runs on fixed GPU buffers, once on
  buffers the page creates (``device.createBuffer``) and once on onnxruntime's own buffers (outputs of a one-node
  Identity session): the replay defect of docs/runtimes.md and its route around;
* ``"fp16"``: whether a float16 Add runs on WebGPU (a graph that needs ``shader-f16`` on an adapter without it).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import probe_runtime as P  # noqa: E402 - the probes this script runs in the browser

from rope_passes.runtime import web  # noqa: E402
from rope_passes.runtime.web.install import HOSTS  # noqa: E402

RUNTIME = "onnxruntime-web"
_TYPES = {"float32": "tensor(float)", "float16": "tensor(float16)", "int64": "tensor(int64)",
          "int32": "tensor(int32)", "bool": "tensor(bool)", "uint8": "tensor(uint8)", "int8": "tensor(int8)",
          "float64": "tensor(double)", "uint32": "tensor(uint32)", "int16": "tensor(int16)",
          "uint16": "tensor(uint16)", "uint64": "tensor(uint64)", "bfloat16": "tensor(bfloat16)"}
_python_make_session = P.make_session
#: the ops whose kernels are probed by default: every op of the genai and torch corpus graphs (and their rewrites),
#: plus the attention and normalization ops of these models' families. In the browser every op the wasm build has no
#: kernel for costs one session of the whole batch (onnxruntime-web names one such node per error), so a probe of
#: every op of the opset takes hours on 2 cores; these take minutes
CORPUS_OPS = (
    "Abs,Add,And,Attention,Cast,Clip,Concat,Constant,ConstantOfShape,Cos,CumSum,Div,Equal,Erf,Exp,Expand,FastGelu,"
    "Flatten,Gather,GatherND,Gelu,Greater,GreaterOrEqual,GroupQueryAttention,Identity,If,IsNaN,LayerNormalization,"
    "Less,LessOrEqual,Log,MRotaryEmbedding,MatMul,MatMulNBits,Max,Min,Mul,MultiHeadAttention,Neg,Not,Or,Pow,"
    "QuickGelu,RMSNormalization,Range,Reciprocal,ReduceMax,ReduceMean,ReduceSum,Relu,Reshape,RotaryEmbedding,"
    "ScatterND,Shape,Sigmoid,SimplifiedLayerNormalization,Sin,SkipLayerNormalization,SkipSimplifiedLayerNormalization,"
    "Slice,Softmax,Split,Sqrt,Squeeze,Sub,Tanh,Tile,TopK,Transpose,Trilu,Unsqueeze,Where")
_TMP: list[Path] = []


HOST = ["chromium"]


def _browser() -> web.Browser:
    return web.browser(host=HOST[0])


def _serve(model: bytes | str) -> tuple[str, Path]:
    if isinstance(model, str):
        return _browser().serve(Path(model)), Path(model).resolve()
    folder = _TMP[0]
    path = folder / f"m{time.monotonic_ns()}.onnx"
    path.write_bytes(model)
    return _browser().serve(path), path


class _Session:
    """What tools/probe_runtime.py uses of a WebGPU session (``get_providers``, ``run(None, feeds)``)."""

    def __init__(self, model: bytes | str, options: dict[str, str]) -> None:
        options = dict(options)
        capture = options.pop("enableGraphCapture", "0") == "1"
        path = Path(model) if isinstance(model, str) else None
        if path is None:
            path = _TMP[0] / f"s{time.monotonic_ns()}.onnx"
            path.write_bytes(model)  # type: ignore[arg-type]
        try:
            self.session = web.WebSession(_browser(), path, "webgpu", webgpu_options=options, graph_capture=capture)
        except web.WebError as exc:
            raise RuntimeError(str(exc)) from None

    def get_providers(self) -> list[str]:
        return [P.WEBGPU, "CPUExecutionProvider"]

    def run(self, names: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        try:
            return self.session.run(names, feeds)
        except web.WebError as exc:
            raise RuntimeError(str(exc)) from None


def make_session(model: bytes | str, options: dict[str, str], *, verbose: bool = False, cpu_only: bool = False,
                 optimize: bool = True) -> Any:
    if cpu_only:  # the probe models' CPU-validity check: onnxruntime's CPU EP in Python
        return _python_make_session(model, options, verbose=verbose, cpu_only=True, optimize=optimize)
    return _Session(model, options)


def run_child(model: bytes, options: dict[str, str], tmp: Path, timeout: float = 300,
              optimize: bool = True) -> dict[str, Any]:
    """tools/probe_runtime.py's run_child, in the page: a verbose session, its error, placements and Memcpy lines."""
    b = _browser()
    options = dict(options)
    capture = options.pop("enableGraphCapture", "0") == "1"
    url, path = _serve(model)
    mark, err_mark = len(b.events), b.stderr_mark()
    crashed = False
    try:
        value = b.call("probeCreate", {"url": url, "file": str(path), "webgpuOptions": options, "capture": capture,
                                       "optimize": optimize}, timeout=timeout)
    except web.WebError as exc:
        value, crashed = {"error": str(exc)}, True
    log = b.console_since(mark) if not crashed else []
    if b.host == "onnxruntime-node":  # its native log goes to the process's stderr
        log = b.stderr_since(err_mark)
    if crashed or b.crashed_since(mark) is not None or "Aborted" in (value.get("error") or ""):
        crashed = True
        b.reload()
    del b.events[mark:]
    error = value.get("error")
    info: dict[str, Any] = {"error": P._strip(error) if error else None, "crashed": crashed,
                            "providers": None if error else [P.WEBGPU, "CPUExecutionProvider"],
                            "outputs": {n: _TYPES.get(t or "", "") for n, t in (value.get("outputs") or {}).items()}}
    placed: dict[str, str] = {}
    ep = None
    info["all_placed"] = None
    info["not_found"] = sorted({m.group(2).strip() for m in map(P._NOT_FOUND.search, log) if m})
    for line in log:
        m = P._ALL_PLACED.search(line)
        if m:
            info["all_placed"] = m.group(1)
            continue
        m = P._PLACED.search(line)
        if m:
            ep = m.group(1)
            continue
        m = P._PLACED_NODE.search(line)
        if m and ep:
            placed[m.group(2)] = ep
    info["placed"] = placed
    info["memcpy"] = sorted({f"{a} {c.strip()}" for a, c in P._MEMCPY.findall("\n".join(log))})
    return info


def _add(dtype: Any, opsets: dict[str, int]) -> bytes:
    from onnx import helper, numpy_helper

    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return P._model([helper.make_node("Add", ["x", "w"], ["y"])], [helper.make_tensor_value_info("x", t, [4])],
                    [helper.make_tensor_value_info("y", t, [4])], opsets,
                    inits=[numpy_helper.from_array(np.arange(4).astype(dtype), "w")])


#: the replay repro's opset imports (docs/runtimes.md). What a released handle's slot holds when a replay reads it
#: depends on everything the page created before (measured: the same graph importing com.microsoft too replayed
#: right), so the repro is this exact graph
REPRO_OPSETS = {"": 17}


def probe_capture_replay() -> dict[str, Any]:
    """y = Add(x, w) captured on run 0 and replayed on runs 1 and 2, on page buffers and on onnxruntime's own."""
    b = _browser()
    path = _TMP[0] / "add.onnx"
    path.write_bytes(_add(np.float32, REPRO_OPSETS))
    res: dict[str, Any] = {"setup": "y = Add(x, w) (opset 17), w = [0, 1, 2, 3], enableGraphCapture, x = 0, 10, 20 in "
                                    "the same GPU buffer, y read back from its bound buffer, a fresh page each"}
    for name, own in (("page_buffers", True), ("onnxruntime_buffers", False)):
        b.reload()
        session = web.WebSession(b, path, "webgpu", graph_capture=True)
        try:
            b.call("gpuAlloc", {"buffers": [{"key": k, "dtype": "float32", "dims": [4]} for k in ("x", "y")],
                                "allocators": None if own else b.allocators()})
        except web.WebError as exc:  # onnxruntime-node: no GPU-buffer tensors, nothing to bind
            res[name] = {"runs": [f"error: {exc}"], "replays_right": False}
            continue
        runs: list[Any] = []
        for k in range(3):
            try:
                _, got = b.exchange("runBound", {"session": session.id, "inputs": {"x": "x"}, "outputs": {"y": "y"},
                                                 "read": ["y"]}, {"x": np.full(4, 10.0 * k, np.float32)})
                runs.append(got["y"].tolist())
            except web.WebError as exc:
                runs.append(f"error: {exc}")
        b.call("gpuFree", {})
        session.release()
        res[name] = {"runs": runs, "replays_right": runs == [[10.0 * k + i for i in range(4)] for k in range(3)]}
    b.reload()
    return res


def probe_fp16(opsets: dict[str, int]) -> dict[str, Any]:
    """Whether a float16 Add runs on WebGPU here (it needs the adapter's shader-f16), and whether a bfloat16 one
    loads at all."""
    res: dict[str, Any] = {}
    try:
        sess = _Session(_add(np.float16, opsets), {})
        out = sess.run(None, {"x": np.ones(4, np.float16)})[0]
        res["float16"] = {"runs": True, "error": None, "result": out.astype(float).tolist()}
    except Exception as exc:  # noqa: BLE001 - the message is the result
        res["float16"] = {"runs": False, "error": P._strip(str(exc))}
    from onnx import TensorProto, helper

    bf16 = P._model([helper.make_node("Add", ["x", "x"], ["y"])],
                    [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [4])],
                    [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [4])], opsets)
    info = run_child(bf16, {}, _TMP[0])
    res["bfloat16"] = {"loads": info["error"] is None, "error": info["error"]}
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--bundle", choices=web.BUNDLES, default="webgpu")
    ap.add_argument("--host", choices=HOSTS, default="chromium", help="where the probes run (module docstring)")
    ap.add_argument("--facts", action="store_true",
                    help="the adapter, fp16, capture-replay and option probes only (no kernel table)")
    ap.add_argument("--opset", type=int, default=21)
    # bfloat16: onnxruntime-web refuses a model with a bfloat16 tensor at session creation ("unsupported data type:
    # 16"), so every kernel probe batch with one would bisect down to it (thousands of sessions): probed once instead
    ap.add_argument("--types", default=",".join(t for t in P.PROBE_TYPES if t != "BFLOAT16"))
    ap.add_argument("--batch", type=int, default=1500)
    ap.add_argument("--only", default=CORPUS_OPS,
                    help="comma-separated op types whose kernels are probed (default: the ops of the genai and torch "
                         "corpus graphs and their rewrites; '' for every op); the others are listed as unprobed")
    args = ap.parse_args(argv)
    HOST[0] = args.host
    why = web.missing(args.host)
    if why is not None:
        ap.error(f"the {args.host} host is not set up: {why}")
    runtime = "onnxruntime-node" if args.host == "onnxruntime-node" else RUNTIME
    P.make_session, P.run_child = make_session, run_child  # every WebGPU session of the probes: in the page
    t0 = time.time()
    import onnx

    b = web.browser(args.bundle, args.host)
    opsets = {"": args.opset, P.MS: 1}
    types = tuple(t.strip().upper() for t in args.types.split(",") if t.strip())
    if args.only:
        only = set(args.only.split(","))
        P.SKIP = dict(P.SKIP)
        for (d, o), _s in P.select_schemas(opsets).items():
            if o not in only:
                P.SKIP[(d, o)] = "--only"
    log: list[str] = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        _TMP[:] = [tmp]
        table: dict[str, Any] = {
            "schema_version": 1, "runtime": runtime, "onnxruntime_version": web.package_version(runtime),
            "plugin_version": None, "host": args.host, "label": b.label,
            "bundle": args.bundle if runtime == RUNTIME else None, "onnx_version": onnx.__version__,
            "python": sys.version.split()[0],
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([os.path.relpath(sys.executable), *sys.argv]),
            "adapter": _adapter(b),
        }
        if args.facts:
            table["options_read"] = P.probe_options(opsets)
            table["capture_replay"] = probe_capture_replay()
            table["fp16"] = probe_fp16(opsets)
            table["probe_seconds"] = round(time.time() - t0, 1)
            return _write(args.output, table, "facts only")
        table.update(P.probe_ir_versions(opsets))
        table["opsets"] = opsets
        table["probe_types"] = list(types)
        t1 = time.time()
        kernels, nokernel, unprobed = P.probe_kernels(opsets, types, tmp, log, args.batch)
        if args.only:  # kept, so the table knows these ops exist; their WebGPU kernels are unknown
            unprobed = {k: ("not probed in the browser (--only: the kernel probe covers the ops of the corpus graphs)"
                            if v == "--only" else v) for k, v in unprobed.items()}
        table["kernel_probe_seconds"] = round(time.time() - t1, 1)
        table["kernels"], table["no_webgpu_kernel"], table["unprobed"] = kernels, nokernel, unprobed
        table.update(P.probe_max_opset())
        newer = table["max_onnx_opset"]
        if newer and newer > args.opset and not args.only:
            base, top = P.select_schemas(opsets), P.select_schemas({"": newer})
            changed = {k for k, sch in top.items() if k not in base or base[k].since_version != sch.since_version}
            t2 = time.time()
            k2, n2, u2 = P.probe_kernels({"": newer, P.MS: 1}, types, tmp, log, args.batch, only=changed)
            table["kernels_newer_opset"] = {
                "opset": newer, "seconds": round(time.time() - t2, 1),
                "note": "ONNX-domain ops whose schema at this opset differs from (or is absent at) the base opset; "
                        "same format as kernels",
                "kernels": k2, "no_webgpu_kernel": n2, "unprobed": u2}
        table["registry"] = {"available": False, "why": "onnxruntime-web lists no kernel registry"}
        table["op_limits"] = P.probe_op_limits(opsets, tmp)
        table["capture_blockers"] = P.probe_capture_blockers(opsets, tmp)
        table["options_read"] = P.probe_options(opsets)
        table["capture_replay"] = probe_capture_replay()
        table["fp16"] = probe_fp16(opsets)
        table["probe_log"] = log
        table["probe_seconds"] = round(time.time() - t0, 1)
    return _write(args.output, table, f"{len(kernels)} ops with WebGPU kernels, {len(nokernel)} without, "
                                      f"{len(unprobed)} unprobed")


def _adapter(b: web.Browser) -> dict[str, Any]:
    """The host and its WebGPU adapter (``requestAdapter().info``, features, limits: ``shader-f16`` is the fp16
    question). onnxruntime-node picks its adapter in its own Dawn: the one Dawn for Node finds is the same Vulkan
    device list's."""
    if b.host == "chromium":
        return {"browser": f"Chromium {b.chromium_version}", "webgpu": b.adapter,
                "playwright_core": web.package_version("playwright-core"), "chromium_args": list(web.CHROMIUM_ARGS)}
    out: dict[str, Any] = {"node": b.chromium_version, "webgpu": b.adapter,
                           "webgpu_package": web.package_version("webgpu")}
    if b.host == "onnxruntime-node":
        out["note"] = ("onnxruntime-node's own Dawn picks the adapter; webgpu is what Dawn for Node (the webgpu npm "
                       "package) finds on the same Vulkan devices")
    return out


def _write(output: str, table: dict[str, Any], what: str) -> int:
    web.shutdown()
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    Path(output).write_text(json.dumps(table, indent=1, sort_keys=False) + "\n")
    print(f"{output}: {what}; {table['probe_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
