"""Where onnxruntime-webgpu really runs each node: the runtime truth that the static prediction
(:func:`rope_passes.analysis.placement.predict_placement`) is checked against.

:func:`probe_placement` creates a WebGPU session in a subprocess with verbose logging (``log_severity_level=0``; a
crash there is a result, not the caller's crash) and reads onnxruntime's ``webgpu kernel not found`` and ``Node
placements`` lines, the ``transformer_memcpy`` lines and the session creation error, if any
(:func:`parse_probe_log`). The child imports onnxruntime and :mod:`.sessions` only: the graph side (onnx_ir, the
analysis) is imported where it is used, in the parent (a probe's child spent about 2 s of CPU importing it).

    python -m rope_passes.runtime.placement_probe model.onnx --probe       # static prediction, then the probe
    python -m rope_passes.runtime.placement_probe model.onnx --capture 0   # static prediction without capture
    python -m rope_passes.runtime.placement_probe model.onnx --probe --runtime onnxruntime-ep-webgpu

``runtime=`` probes another WebGPU runtime than the one installed here: the child runs on that runtime's
interpreter (:mod:`.interpreters`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx_ir as ir

    from rope_passes.analysis.placement import Placement

_NOT_FOUND = re.compile(r"webgpu kernel not found in registries for Op type: (\S+) node name: (.*)$")
_MEMCPY = re.compile(r"transformer_memcpy\.cc:\d+ \w+\] Add (MemcpyFromHost|MemcpyToHost) (?:after|before) (.*) "
                     r"for WebGpuExecutionProvider")
_PLACED = re.compile(r"Node\(s\) placed on \[(\w+)\]")
_PLACED_NODE = re.compile(r"VerifyEachNodeIsAssignedToAnEp\]\s+(\S+) \((.*)\)$")
_MARKER = "ROPE_PASSES_PROBE "


def _probe_child(model_path: str, capture: bool, options: Mapping[str, str]) -> None:
    """Runs in the subprocess: create the session, print a JSON line with the error; the log goes to stderr."""
    import onnxruntime as ort

    from rope_passes.runtime.sessions import open_session, session_options

    ort.set_default_logger_severity(0)
    so = session_options("webgpu", graph_capture=capture, webgpu_options=options, log_severity=0)
    out: dict[str, Any] = {"error": None, "providers": None}
    try:
        # not create_session: a fallback to CPU is recorded here, not raised
        sess = open_session(model_path, so, "webgpu")
        out["providers"] = sess.get_providers()
    except Exception as exc:  # noqa: BLE001 - the message is the result
        out["error"] = str(exc)
    sys.stderr.flush()
    print(_MARKER + json.dumps(out), flush=True)


def probe_placement(model_path: str | os.PathLike, *, graph_capture: bool = True,
                    webgpu_options: Mapping[str, str] | None = None, timeout: float = 120,
                    runtime: str | None = None) -> Placement:
    """The runtime truth: a WebGPU session in a subprocess with verbose logging (see the module docstring), on
    ``runtime``'s interpreter (default: the runtime installed here)."""
    from rope_passes.runtimes.installed import child_env, default_runtime, python_for

    python = python_for(runtime)
    if python is None:
        raise RuntimeError(f"no interpreter for runtime {runtime!r} (scripts/setup.sh --with-plugin-runtime)")
    cmd = [python, "-m", "rope_passes.runtime.placement_probe", "--probe-child", str(model_path),
           "--capture", "1" if graph_capture else "0", "--options", json.dumps(dict(webgpu_options or {}))]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,  # exit code is data
                          env=child_env(runtime))
    result = parse_probe_log(str(model_path), graph_capture, proc.stdout + "\n" + proc.stderr, proc.returncode)
    result.runtime = runtime or default_runtime()
    return result


def parse_probe_log(model: str, graph_capture: bool, log: str, returncode: int = 0) -> Placement:
    """The placement a probe's log (stdout + stderr of the child) shows."""
    from rope_passes.analysis.placement import Memcpy, Placement

    result = Placement(model, graph_capture, "probe")
    marker = next((ln for ln in log.splitlines() if ln.startswith(_MARKER)), None)
    if marker is None:
        tail = " ".join(log.strip().splitlines()[-3:])[-300:]
        result.loads = False
        result.load_error = f"probe crashed (exit code {returncode}): {tail}"
        return result
    info = json.loads(marker.split(" ", 1)[1])
    error = info["error"]
    if error and "graph capture" not in error:
        result.loads = False
        result.load_error = _strip_ort(error)
    if info["providers"] is not None and info["providers"][0] != "WebGpuExecutionProvider":
        result.loads = False
        result.load_error = "WebGPU session fell back to CPU (no WebGPU adapter?)"
    placed: str | None = None
    for line in log.splitlines():
        m = _NOT_FOUND.search(line)
        if m:
            result.cpu_nodes.setdefault(m.group(2).strip(), f"no WebGPU kernel for {m.group(1)} (onnxruntime log)")
            continue
        m = _MEMCPY.search(line)
        if m:
            result.memcpy.append(Memcpy(m.group(1), m.group(2).strip()))
            continue
        m = _PLACED.search(line)
        if m:
            placed = m.group(1)
            continue
        m = _PLACED_NODE.search(line)
        if m and placed == "CPUExecutionProvider":
            result.cpu_nodes.setdefault(m.group(2), "placed on CPU (onnxruntime log)")
    result.memcpy = sorted(set(result.memcpy))
    if graph_capture:
        result.capture_ok = error is None and result.loads
        result.capture_error = _strip_ort(error) if error else None
    if not result.loads:
        result.capture_ok = False if graph_capture else None
    return result


def _strip_ort(message: str) -> str:
    return re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", message).strip()


def annotate(placement: Placement, model: ir.Model) -> Placement:
    """Fill producer/consumer names of a probe's Memcpy entries (the log names only the tensor) from the graph."""
    import onnx_ir as ir

    from rope_passes.analysis.placement import Memcpy

    values: dict[str, ir.Value] = {}
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        for v in list(node.inputs) + list(node.outputs):
            if v is not None and v.name:
                values.setdefault(v.name, v)
    for v in model.graph.inputs:
        values.setdefault(v.name or "", v)
    out = []
    for m in placement.memcpy:
        v = values.get(m.tensor)
        if v is None:
            out.append(m)
            continue
        producer = v.producer()
        users = tuple(u.name or u.op_type for u, _ in v.uses())
        out.append(Memcpy(m.kind, m.tensor, (producer.name or producer.op_type) if producer else "graph input", users))
    placement.memcpy = out
    return placement


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rope_passes.runtime.placement_probe")
    parser.add_argument("model", nargs="?")
    parser.add_argument("--probe-child", metavar="MODEL", help=argparse.SUPPRESS)
    parser.add_argument("--capture", default="1", help="1 (default): enableGraphCapture=1; 0: without capture")
    parser.add_argument("--options", default="{}", help="WebGPU provider options as JSON (session config entries)")
    parser.add_argument("--probe", action="store_true", help="also run the runtime probe")
    parser.add_argument("--runtime", help="the WebGPU runtime (default: the one installed here)")
    args = parser.parse_args(argv)
    if args.probe_child:
        _probe_child(args.probe_child, args.capture == "1", json.loads(args.options))
        return 0
    if not args.model:
        parser.error("give a model path")
    from rope_passes.analysis.placement import predict_placement

    capture = args.capture == "1"
    static = predict_placement(args.model, graph_capture=capture, runtime=args.runtime)
    print("static:", static.summary())
    for m in static.memcpy:
        print("  ", m)
    if args.probe:
        probe = probe_placement(args.model, graph_capture=capture, webgpu_options=json.loads(args.options),
                                runtime=args.runtime)
        from rope_passes.io.load import load_model

        probe = annotate(probe, load_model(args.model))
        print("probe: ", probe.summary())
        for m in probe.memcpy:
            print("  ", m)
    return 0


if __name__ == "__main__":
    sys.exit(main())
