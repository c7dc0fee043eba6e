"""Measure what one WebGPU onnxruntime build accepts and write it as a JSON runtime table.

Run it with the interpreter of the runtime to measure (each runtime lives in its own venv):

    .venv/bin/python tools/probe_runtime.py --runtime onnxruntime-webgpu \
        -o rope_passes/runtime_tables/onnxruntime-webgpu.json
    .venv-plugin/bin/python tools/probe_runtime.py --runtime onnxruntime-ep-webgpu \
        -o rope_passes/runtime_tables/onnxruntime-ep-webgpu.json

Every entry comes from a probe this script runs (sessions on the WebGPU EP with verbose logging, in subprocesses of
the same interpreter); nothing is copied from documentation. Dependencies: onnxruntime (either runtime), onnx, numpy.

JSON schema (``schema_version`` 1)
----------------------------------
{
  "schema_version": 1,
  "runtime": "onnxruntime-webgpu" | "onnxruntime-ep-webgpu",
  "onnxruntime_version": "1.27.0", "plugin_version": "0.4.0" | null, "onnx_version": ..., "python": ...,
  "date": ISO-8601 UTC, "command": the command line that produced the file, "probe_seconds": wall time,
  "adapter": {"vulkan_devices": [...], "ep_device": {...} | null, "env": {...}},
  "max_ir_version": int,  "ir_versions": {"10": null | "error", ...},     # Add model, IR 10..14
  "max_onnx_opset": int,  "onnx_opsets": {"21": null | "error", ...},    # Add model, opset 21..30
  "opsets": {"": 21, "com.microsoft": 1},   # opset imports of every probe model
  "probe_types": [...],                       # element types tried for each type constraint
  "kernels": {
    "<domain>::<op_type>": {                  # domain "" is the ONNX domain; only ops with >= 1 WebGPU kernel
      "domain": str, "op_type": str, "since_version": int,   # schema version selected by "opsets"
      "type_params": [constraint names, in signature order],
      "signatures": [                         # every probed type combination that loaded on WebGPU
        {"types": {"T": "FLOAT", ...},        # type-constraint binding
         "inputs": ["FLOAT", "INT64", ...],   # element type of each input of the probe node ("" = omitted optional)
         "outputs": ["FLOAT", ...],           # element types onnxruntime inferred for the outputs (null: unknown)
         "key": "FLOAT",                      # placement.py's type key: input-0 dtype (Where: input 1,
                                              #   ConstantOfShape: output 0; Cast: "FROM->TO")
         "modes": ["off", "on"]}              # graph capture modes in which the node was placed on WebGPU
      ],
      "no_kernel": [ {"types": ..., "key": ...} ]   # probed combinations that went to CPU in both modes
    }
  },
  "kernels_newer_opset": {"opset": max_onnx_opset, "kernels": {...}, "no_webgpu_kernel": {...}, "unprobed": {...}},
                              # same format, ONNX ops whose schema changed after the base opset (RotaryEmbedding-23...)
  "no_webgpu_kernel": {"<domain>::<op>": "reason"},   # ops probed with no WebGPU kernel for any combination
  "unprobed": {"<domain>::<op>": "reason"},           # ops (or all their combinations) a probe could not be built for
  "registry": {...} | null,   # the plugin's own kernel-def listing (get_registered_ep_kernel_defs), null for 1.27,
                              #   with "disagreements" against the probe (capture-off mode)
  "op_limits": {
    "GroupQueryAttention": {"max_inputs_schema": int, "input_counts": {"7": {"loads": bool, "ep": ..,
                            "error": ..}, ... "16": ...}, "accepted_input_counts": [..]},
    "<op>": {"registered": bool, "loads_on_webgpu": bool, "error": str | null}   # MRotaryEmbedding, ...
  },
  "capture_blockers": {"if_node": {...}, "shape_to_expand": {...}},  # session errors with enableGraphCapture=1
  "options_read": {"multiRotaryCacheConcatOffset": {...}, "enableGraphCapture": {...}}
}

A static predictor loads it with:

    t = json.load(open(path))
    kern = {(k["domain"], k["op_type"], s["key"]): set(s["modes"])
            for k in t["kernels"].values() for s in k["signatures"]}
"""

from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MS = "com.microsoft"
WEBGPU = "WebGpuExecutionProvider"
MARK = "PROBE_RUNTIME_RESULT "
PROBE_TYPES = ("FLOAT", "FLOAT16", "BFLOAT16", "DOUBLE", "INT8", "UINT8", "INT16", "UINT16", "INT32", "UINT32",
               "INT64", "UINT64", "BOOL")
#: ops not worth a one-node probe; the reason goes into "unprobed"
SKIP = {
    ("", "Constant"): "folded into an initializer at load; never placed",
    ("", "Loop"): "needs a loop-body subgraph; not built",
    ("", "Scan"): "needs a scan-body subgraph; not built",
    ("", "SequenceMap"): "needs a subgraph; not built",
}
#: required attribute values that make a valid one-node model (others: generic defaults by attribute type)
ATTRS: dict[tuple[str, str], dict[str, Any]] = {
    ("", "Concat"): {"axis": 0},
    ("", "Split"): {"axis": 0, "num_outputs": 2},
    ("", "Transpose"): {"perm": [1, 0]},
    ("", "Gather"): {"axis": 0},
    ("", "GatherElements"): {"axis": 0},
    ("", "ReduceSum"): {"keepdims": 0}, ("", "ReduceMax"): {"keepdims": 0}, ("", "ReduceMin"): {"keepdims": 0},
    ("", "ReduceProd"): {"keepdims": 0}, ("", "ReduceMean"): {"keepdims": 0},
    ("", "Flatten"): {"axis": 1},
    ("", "DepthToSpace"): {"blocksize": 2}, ("", "SpaceToDepth"): {"blocksize": 2},
    ("", "Einsum"): {"equation": "ij,jk->ik"},
    ("", "LpNormalization"): {"axis": -1},
    ("", "Resize"): {"mode": "nearest"},
    (MS, "GroupQueryAttention"): {"num_heads": 2, "kv_num_heads": 2},
    (MS, "MatMulNBits"): {"K": 32, "N": 32, "bits": 4, "block_size": 32},
    (MS, "MultiHeadAttention"): {"num_heads": 2},
    (MS, "Attention"): {"num_heads": 2},
    (MS, "MRotaryEmbedding"): {"mrope_section": [2, 2, 4], "num_heads": 2},
    (MS, "GatherBlockQuantized"): {"bits": 4, "block_size": 32},
    ("", "GRU"): {"hidden_size": 4}, ("", "LSTM"): {"hidden_size": 4}, ("", "RNN"): {"hidden_size": 4},
    (MS, "NGramHashMapping"): {"max_ngram_size": 2},
}
ATTR_DEFAULTS_BY_NAME = {"num_heads": 2, "kv_num_heads": 2, "block_size": 32, "bits": 4, "K": 32, "N": 32,
                         "axis": 0, "epsilon": 1e-5}
#: inputs that must be present although the schema calls them optional (how the kernels are used)
EXTRA_INPUTS: dict[tuple[str, str], int] = {(MS, "GroupQueryAttention"): 7, ("", "Split"): 1, ("", "Resize"): 3}
#: output-only type constraints set through an attribute: (domain, op) -> (constraint, attribute)
OUT_ATTR = {("", "Cast"): ("T2", "to"), ("", "ConstantOfShape"): ("T2", "value"), ("", "EyeLike"): ("T2", "dtype"),
            ("", "RandomNormalLike"): ("T2", "dtype"), ("", "RandomUniformLike"): ("T2", "dtype"),
            ("", "Bernoulli"): ("T2", "dtype"), ("", "Multinomial"): ("T2", "dtype")}
MAX_COMBOS = 200


# ----------------------------------------------------------------------------------------------------------------
# Sessions (both runtimes)
# ----------------------------------------------------------------------------------------------------------------

def _ort():
    import onnxruntime as ort

    return ort


_PLUGIN_DEVICE = None


def plugin_device():
    """Register the plugin EP once per process and return its WebGPU OrtEpDevice (None for onnxruntime-webgpu)."""
    global _PLUGIN_DEVICE
    ort = _ort()
    if _PLUGIN_DEVICE is None and os.environ.get("PROBE_RUNTIME") == "onnxruntime-ep-webgpu":
        import onnxruntime_ep_webgpu

        ort.register_execution_provider_library("webgpu", onnxruntime_ep_webgpu.get_library_path())
        devs = [d for d in ort.get_ep_devices() if d.ep_name == WEBGPU]
        if not devs:
            raise RuntimeError("the WebGPU plugin lists no device (ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1? driver?)")
        _PLUGIN_DEVICE = devs[0]
    return _PLUGIN_DEVICE


def make_session(model: bytes | str, options: dict[str, str], *, verbose: bool = False, cpu_only: bool = False,
                 optimize: bool = True):
    ort = _ort()
    so = ort.SessionOptions()
    if verbose:
        ort.set_default_logger_severity(0)
        so.log_severity_level = 0
    else:
        so.log_severity_level = 3
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if cpu_only:
        return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    dev = plugin_device()
    if dev is not None:
        so.add_provider_for_devices([dev], {k: str(v) for k, v in options.items()})
        return ort.InferenceSession(model, so)
    for key, value in options.items():
        so.add_session_config_entry(f"ep.webgpuexecutionprovider.{key}", str(value))
    return ort.InferenceSession(model, so, providers=[WEBGPU, "CPUExecutionProvider"])


def _strip(msg: str) -> str:
    msg = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", str(msg)).strip()
    return " ".join(msg.split())[:600]


def child(model_path: str, options: dict[str, str], optimize: bool = True) -> None:
    """Subprocess body: verbose session creation; prints one JSON line (error, providers, output types)."""
    out: dict[str, Any] = {"error": None, "providers": None, "outputs": {}}
    try:
        sess = make_session(model_path, options, verbose=True, optimize=optimize)
        out["providers"] = sess.get_providers()
        out["outputs"] = {o.name: o.type for o in sess.get_outputs()}
    except Exception as exc:  # noqa: BLE001 - the message is the result
        out["error"] = _strip(str(exc))
    sys.stderr.flush()
    print(MARK + json.dumps(out), flush=True)


_PLACED = re.compile(r"Node\(s\) placed on \[(\w+)\]")
_PLACED_NODE = re.compile(r"VerifyEachNodeIsAssignedToAnEp\]\s+(\S+) \((.*)\)\s*$")
_ALL_PLACED = re.compile(r"All nodes placed on \[(\w+)\]")
_NOT_FOUND = re.compile(r"webgpu kernel not found in registries for Op type: (\S+) node name: (.*)$")
_MEMCPY = re.compile(r"Add (MemcpyFromHost|MemcpyToHost) (?:after|before) (.*) for WebGpuExecutionProvider")


def run_child(model: bytes, options: dict[str, str], tmp: Path, timeout: float = 300,
              optimize: bool = True) -> dict[str, Any]:
    """Create a WebGPU session in a subprocess with verbose logging; its error, placements and Memcpy lines."""
    path = tmp / f"m{time.monotonic_ns()}.onnx"
    path.write_bytes(model)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", str(path), "--options", json.dumps(options)]
    if not optimize:
        cmd.append("--no-opt")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        log, rc = proc.stdout + "\n" + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired:
        log, rc = "", -9
    path.unlink(missing_ok=True)
    marker = next((ln for ln in log.splitlines() if ln.startswith(MARK)), None)
    if marker is None:
        tail = " ".join(log.strip().splitlines()[-3:])[-300:]
        return {"error": f"probe process crashed (exit code {rc}): {tail}", "crashed": True, "placed": {},
                "memcpy": [], "providers": None, "outputs": {}, "all_placed": None, "not_found": []}
    info = json.loads(marker[len(MARK):])
    placed: dict[str, str] = {}
    ep = None
    info["all_placed"] = None
    info["not_found"] = sorted({m.group(2).strip() for m in map(_NOT_FOUND.search, log.splitlines()) if m})
    for line in log.splitlines():
        m = _ALL_PLACED.search(line)
        if m:
            info["all_placed"] = m.group(1)
            continue
        m = _PLACED.search(line)
        if m:
            ep = m.group(1)
            continue
        m = _PLACED_NODE.search(line)
        if m and ep:
            placed[m.group(2)] = ep
    info["placed"] = placed
    info["memcpy"] = sorted({f"{a} {b.strip()}" for a, b in _MEMCPY.findall(log)})
    info["crashed"] = False
    return info


# ----------------------------------------------------------------------------------------------------------------
# Probe models from schemas
# ----------------------------------------------------------------------------------------------------------------

def _tname(type_str: str) -> str | None:
    m = re.fullmatch(r"tensor\((\w+)\)", type_str)
    if not m:
        return None
    return {"float": "FLOAT", "float16": "FLOAT16", "bfloat16": "BFLOAT16", "double": "DOUBLE", "int8": "INT8",
            "uint8": "UINT8", "int16": "INT16", "uint16": "UINT16", "int32": "INT32", "uint32": "UINT32",
            "int64": "INT64", "uint64": "UINT64", "bool": "BOOL", "string": "STRING"}.get(m.group(1), m.group(1).upper())


def select_schemas(opsets: dict[str, int]) -> dict[tuple[str, str], Any]:
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    best: dict[tuple[str, str], Any] = {}
    for s in C.get_all_operator_schema():
        if s.domain not in opsets or s.since_version > opsets[s.domain]:
            continue
        key = (s.domain, s.name)
        if key not in best or s.since_version > best[key].since_version:
            best[key] = s
    return best


def _attr_value(domain: str, op: str, name: str, attr, types: dict[str, str]):
    from onnx import TensorProto, helper

    if (domain, op) in OUT_ATTR and OUT_ATTR[(domain, op)][1] == name:
        dt = getattr(TensorProto, types[OUT_ATTR[(domain, op)][0]])
        return helper.make_tensor("v", dt, [1], [0]) if name == "value" else dt
    fixed = ATTRS.get((domain, op), {})
    if name in fixed:
        return fixed[name]
    if not attr.required:
        return None
    if name in ATTR_DEFAULTS_BY_NAME:
        return ATTR_DEFAULTS_BY_NAME[name]
    t = str(attr.type).split(".")[-1]
    return {"INT": 1, "INTS": [1], "FLOAT": 1.0, "FLOATS": [1.0], "STRING": "", "STRINGS": [""],
            "TENSOR": helper.make_tensor("v", TensorProto.FLOAT, [1], [0.0])}.get(t, KeyError(t))


def input_plan(schema, domain: str, op: str) -> list[tuple[str, bool]]:
    """[(typeStr, present)] for the probe node's inputs."""
    extra = EXTRA_INPUTS.get((domain, op), 0)
    need = max(schema.min_input, extra)
    plan: list[tuple[str, bool]] = []
    for i, p in enumerate(schema.inputs):
        opt = str(p.option).split(".")[-1]
        if opt == "Variadic":
            plan.extend([(p.typeStr, True)] * max(2, need - i))
            break
        if i >= need:
            break
        plan.append((p.typeStr, opt == "Single" or i < extra))
    while plan and not plan[-1][1]:
        plan.pop()
    return plan


def output_count(schema, domain: str, op: str) -> int:
    if (domain, op) == ("", "Split"):
        return 2
    n = 0
    for p in schema.outputs:
        opt = str(p.option).split(".")[-1]
        if opt == "Variadic":
            return n + 1
        if opt == "Optional" and n >= schema.min_output:
            break
        n += 1
    return max(n, schema.min_output, 1)


def combos(schema, domain: str, op: str, types: tuple[str, ...]) -> tuple[list[dict[str, str]], str | None]:
    """Type bindings to probe for this schema, or ([], reason)."""
    plan = input_plan(schema, domain, op)
    used_in = {t for t, present in plan if present}
    params: dict[str, list[str]] = {}
    for tc in schema.type_constraints:
        allowed = [_tname(a) for a in tc.allowed_type_strs]
        allowed = [a for a in allowed if a in types]
        if tc.type_param_str in used_in or (domain, op) in OUT_ATTR and OUT_ATTR[(domain, op)][0] == tc.type_param_str:
            if not allowed:
                return [], f"type constraint {tc.type_param_str} allows none of the probed tensor types"
            params[tc.type_param_str] = allowed
    for t in used_in:
        if t not in params and _tname(t) is None:
            return [], f"input type {t} is not a tensor type"
    names = sorted(params)
    total = 1
    for n in names:
        total *= len(params[n])
    if total <= MAX_COMBOS:
        return [dict(zip(names, vals)) for vals in itertools.product(*(params[n] for n in names))], None
    # too many: vary one constraint at a time, the others at their first allowed type (FLOAT when allowed)
    base = {n: ("FLOAT" if "FLOAT" in params[n] else params[n][0]) for n in names}
    out, seen = [], set()
    for n in names:
        for v in params[n]:
            c = dict(base, **{n: v})
            k = tuple(sorted(c.items()))
            if k not in seen:
                seen.add(k)
                out.append(c)
    return out, None


def type_key(domain: str, op: str, ins: list[str], outs: list[str | None]) -> str:
    if (domain, op) == ("", "Cast"):
        return f"{ins[0]}->{outs[0]}"
    if (domain, op) == ("", "Where"):
        return ins[1]
    if (domain, op) in (("", "ConstantOfShape"), ("", "EyeLike")) or not ins:
        return str(outs[0] if outs else None)
    return ins[0] or "None"


class Entry:
    def __init__(self, domain, op, schema, binding):
        self.domain, self.op, self.schema, self.types = domain, op, schema, binding
        self.plan = input_plan(schema, domain, op)
        self.ins = [(binding.get(t) or _tname(t) or "?") if present else "" for t, present in self.plan]
        self.n_out = output_count(schema, domain, op)
        self.attrs: dict[str, Any] = {}
        for name, attr in schema.attributes.items():
            if (domain, op) == ("", "If"):
                continue  # branches built in nodes()
            v = _attr_value(domain, op, name, attr, binding)
            if isinstance(v, Exception):
                raise ValueError(f"required attribute {name!r} of type {v} has no default")
            if v is not None:
                self.attrs[name] = v
        out_t = None
        if (domain, op) in OUT_ATTR:
            out_t = binding.get(OUT_ATTR[(domain, op)][0])
        self.outs: list[str | None] = [out_t] + [None] * (self.n_out - 1)
        self.modes: set[str] = set()
        self.nowhere: set[str] = set()  # modes in which no EP had a kernel
        self.unmeasured: dict[str, str] = {}  # mode -> why the placement could not be read
        self.via_not_found: set[str] = set()  # modes read from the EP's "kernel not found" lines
        self.cpu = "?"
        self.error: str | None = None

    def nodes(self, i: int):
        """(node, graph inputs) for this entry as node number i."""
        from onnx import TensorProto, helper

        inputs, names = [], []
        for j, t in enumerate(self.ins):
            if not t:
                names.append("")
                continue
            name = f"n{i}_in{j}"
            inputs.append(helper.make_tensor_value_info(name, getattr(TensorProto, t), None))
            names.append(name)
        attrs = dict(self.attrs)
        if (self.domain, self.op) == ("", "If"):
            attrs = {"then_branch": _branch("then", f"n{i}_x"), "else_branch": _branch("else", f"n{i}_x")}
            inputs.append(helper.make_tensor_value_info(f"n{i}_x", getattr(TensorProto, self.types.get("V", "FLOAT")),
                                                        None))
        outs = [f"n{i}_out{j}" for j in range(self.n_out)]
        node = helper.make_node(self.op, names, outs, name=f"probe{i}", domain=self.domain, **attrs)
        return node, inputs, outs


def _branch(name: str, outer: str):
    from onnx import helper

    return helper.make_graph([helper.make_node("Identity", [outer], [f"{name}_y"])], name, [],
                             [helper.make_empty_tensor_value_info(f"{name}_y")])


def build_model(entries: list[Entry], opsets: dict[str, int], ir_version: int = 10) -> tuple[bytes, dict[str, int]]:
    from onnx import helper

    nodes, inputs, outputs, names = [], [], [], {}
    for i, e in enumerate(entries):
        node, ins, outs = e.nodes(i)
        nodes.append(node)
        inputs.extend(ins)
        outputs.extend(helper.make_empty_tensor_value_info(o) for o in outs)
        names[f"probe{i}"] = i
    graph = helper.make_graph(nodes, "runtime_probe", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    model.ir_version = ir_version
    return model.SerializeToString(), names


# ----------------------------------------------------------------------------------------------------------------
# Kernel probe
# ----------------------------------------------------------------------------------------------------------------

def _cpu_result(path: str) -> str:
    """'ok', 'no-cpu-kernel', or the error: whether a one-node model is valid (CPU-only session)."""
    try:
        make_session(path, {}, cpu_only=True, optimize=False)
        return "ok"
    except Exception as exc:  # noqa: BLE001 - the message is the result
        msg = _strip(str(exc))
        if "Could not find an implementation" in msg or "NOT_IMPLEMENTED" in str(exc):
            return "no-cpu-kernel"
        return msg


def cpu_child(folder: str, start: int, count: int) -> None:
    """Subprocess body: CPU-check models folder/{i}.onnx for i in [start, count), one JSON line each."""
    for i in range(start, count):
        print(MARK + json.dumps([i, _cpu_result(os.path.join(folder, f"{i}.onnx"))]), flush=True)


def cpu_check_all(entries: list[Entry], opsets, tmp: Path) -> None:
    """Set entry.cpu for every entry, in subprocesses (some schemas abort onnxruntime's shape inference)."""
    folder = tmp / "cpu"
    folder.mkdir(exist_ok=True)
    for i, e in enumerate(entries):
        (folder / f"{i}.onnx").write_bytes(build_model([e], opsets)[0])
    start = 0
    while start < len(entries):
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--cpu-child", str(folder), str(start),
                               str(len(entries))], capture_output=True, text=True, check=False)
        done = start
        for line in proc.stdout.splitlines():
            if line.startswith(MARK):
                i, r = json.loads(line[len(MARK):])
                entries[i].cpu = r
                done = i + 1
        if done < len(entries) and proc.returncode != 0:
            tail = " ".join(proc.stderr.strip().splitlines()[-1:])[-300:]
            entries[done].cpu = f"onnxruntime crashed loading the one-node model (exit code {proc.returncode}): {tail}"
            done += 1
        start = done


def probe_batch(entries: list[Entry], mode: str, opsets, tmp: Path, log: list[str]) -> None:
    """Place every entry in WebGPU sessions; failing nodes are dropped (and their error kept) until it loads."""
    todo = list(entries)
    options = {"enableGraphCapture": "1"} if mode == "on" else {}
    while todo:
        data, _ = build_model(todo, opsets)
        info = run_child(data, options, tmp, optimize=False)  # no fusions: every probe node keeps its name
        err = info["error"] or ""
        capture_refusal = "graph capture" in err
        if (err and not capture_refusal) or info["crashed"]:
            refused = set(info["not_found"])
            doomed = [e for i, e in enumerate(todo) if e.cpu == "no-cpu-kernel" and f"probe{i}" in refused]
            if doomed:  # no kernel in any EP: they make the session fail; WebGPU's log names them
                for e in doomed:
                    e.nowhere.add(mode)
                todo = [e for e in todo if e not in doomed]
                continue
            m = re.search(r"probe(\d+)", err)
            if m and int(m.group(1)) < len(todo):
                bad = todo.pop(int(m.group(1)))
                bad.error = bad.error or err
                continue
            if len(todo) == 1:
                todo[0].error = todo[0].error or err
                return
            half = len(todo) // 2
            log.append(f"bisect ({mode}): {len(todo)} nodes: {err[:120]}")
            probe_batch(todo[:half], mode, opsets, tmp, log)
            probe_batch(todo[half:], mode, opsets, tmp, log)
            return
        if info["providers"] is not None and info["providers"][0] != WEBGPU:
            raise RuntimeError("WebGPU session fell back to CPU: no adapter")
        outs = info.get("outputs", {})
        refused = set(info["not_found"])
        if not info["placed"] and info["all_placed"] is None:
            if capture_refusal and "partitioned" in err:
                # capture refused (CPU nodes) before onnxruntime logged placements: read the EP's own
                # "webgpu kernel not found" lines instead (checked against the placements in the other mode)
                for i, e in enumerate(todo):
                    if f"probe{i}" not in refused:
                        e.modes.add(mode)
                    e.via_not_found.add(mode)
                return
            for e in todo:  # refused before onnxruntime logged anything (control flow under capture)
                e.unmeasured[mode] = err or "no placement lines in the log"
            return
        mismatch = [f"probe{i}" for i in range(len(todo))
                    if (info["placed"].get(f"probe{i}", info["all_placed"]) == WEBGPU) == (f"probe{i}" in refused)]
        if mismatch:
            log.append(f"{mode}: {len(mismatch)} node(s) where the placement and the not-found lines disagree: "
                       + ", ".join(f"{todo[int(m[5:])].op}{todo[int(m[5:])].types}" for m in mismatch[:10]))
        for i, e in enumerate(todo):
            if info["placed"].get(f"probe{i}", info["all_placed"]) == WEBGPU:
                e.modes.add(mode)
            for j in range(e.n_out):
                t = outs.get(f"n{i}_out{j}")
                if t and e.outs[j] is None:
                    e.outs[j] = _tname(t)
        return


def probe_kernels(opsets, types, tmp: Path, log: list[str], batch: int,
                  only: set[tuple[str, str]] | None = None) -> tuple[dict, dict, dict]:
    schemas = select_schemas(opsets)
    if only is not None:
        schemas = {k: v for k, v in schemas.items() if k in only}
    unprobed: dict[str, str] = {}
    entries: list[Entry] = []
    candidates: list[tuple[str, list[Entry]]] = []
    for (domain, op), schema in sorted(schemas.items()):
        key = f"{domain}::{op}"
        if (domain, op) in SKIP:
            unprobed[key] = SKIP[(domain, op)]
            continue
        if schema.deprecated:
            unprobed[key] = "deprecated in the selected opset"
            continue
        if any(str(a.type).endswith(("GRAPH", "GRAPHS")) and a.required for a in schema.attributes.values()) \
                and op != "If":
            unprobed[key] = "required subgraph attribute; not built"
            continue
        bindings, why = combos(schema, domain, op, types)
        if not bindings:
            unprobed[key] = why or "no type combination"
            continue
        mine = []
        try:
            for b in bindings:
                mine.append(Entry(domain, op, schema, b))
        except ValueError as exc:
            unprobed[key] = str(exc)
            continue
        candidates.append((key, mine))
    cpu_check_all([e for _, mine in candidates for e in mine], opsets, tmp)
    for key, mine in candidates:
        valid = [e for e in mine if e.cpu in ("ok", "no-cpu-kernel")]
        if not valid:
            unprobed[key] = f"no valid one-node model ({len(mine)} combinations): {mine[0].cpu}"
            continue
        entries.extend(valid)
    log.append(f"{len(entries)} probe nodes for {len({(e.domain, e.op) for e in entries})} ops")
    control = [e for e in entries if e.op in ("If", "Loop", "Scan")]  # capture refuses them before placement
    rest = [e for e in entries if e not in control]
    for mode in ("off", "on"):
        for start in range(0, len(rest), batch):
            probe_batch(rest[start:start + batch], mode, opsets, tmp, log)
        if control:
            probe_batch(control, mode, opsets, tmp, log)
    kernels: dict[str, Any] = {}
    nokernel: dict[str, str] = {}
    by_op: dict[tuple[str, str], list[Entry]] = {}
    for e in entries:
        by_op.setdefault((e.domain, e.op), []).append(e)
    for (domain, op), es in sorted(by_op.items()):
        key = f"{domain}::{op}"
        sigs, no = [], []
        for e in es:
            rec = {"types": e.types, "inputs": e.ins, "outputs": e.outs,
                   "key": type_key(domain, op, e.ins, e.outs)}
            if e.cpu == "no-cpu-kernel":
                rec["cpu_kernel"] = False
            if e.unmeasured:
                rec["unmeasured"] = e.unmeasured
            if e.via_not_found:
                rec["read_from"] = {m: "kernel-not-found lines" for m in sorted(e.via_not_found)}
            if e.modes:
                sigs.append(dict(rec, modes=sorted(e.modes)))
            elif e.error and not e.error.startswith("Could not find an implementation"):
                no.append(dict(rec, error=e.error))
            else:
                no.append(rec)
        if sigs:
            kernels[key] = {"domain": domain, "op_type": op, "since_version": es[0].schema.since_version,
                            "type_params": sorted(es[0].types), "signatures": sigs, "no_kernel": no}
        else:
            errs = [n["error"] for n in no if "error" in n]
            if errs and len(errs) == len(no):
                unprobed[key] = f"every combination failed session creation: {errs[0]}"
            else:
                errs = sorted({n["error"][:300] for n in no if "error" in n})
                nokernel[key] = (f"{len(no)} combination(s) probed, none placed on WebGPU"
                                 + (f"; session errors: {' | '.join(errs[:2])}" if errs else ""))
    return kernels, nokernel, unprobed


def registry_listing(kernels: dict[str, Any], opsets) -> dict[str, Any] | None:
    """The plugin's own kernel defs (if the runtime lists them) and where they disagree with the probe (off mode)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    if plugin_device() is None or not hasattr(C, "get_registered_ep_kernel_defs"):
        have = hasattr(C, "get_all_opkernel_def")
        provs = sorted({k.provider for k in C.get_all_opkernel_def()}) if have else []
        return {"available": False,
                "why": f"get_all_opkernel_def lists only {provs}; get_registered_ep_kernel_defs needs a plugin EP"}
    defs = C.get_registered_ep_kernel_defs(WEBGPU)
    listed: dict[str, list] = {}
    for k in defs:
        lo, hi = k.version_range
        listed.setdefault(f"{k.domain}::{k.op_name}", []).append(
            {"versions": [lo, hi], "types": {p: [_tname(t) for t in ts] for p, ts in k.type_constraints.items()}})
    disagree = []
    for key, ks in listed.items():
        domain = key.split("::")[0]
        if domain not in opsets:
            continue
        at = [k for k in ks if k["versions"][0] <= opsets[domain] <= k["versions"][1]]
        probed = kernels.get(key)
        if not at:
            continue
        if probed is None:
            disagree.append(f"{key}: listed for opset {opsets[domain]} but no probed signature loaded on WebGPU")
            continue
        for s in probed["signatures"]:
            if "off" not in s["modes"]:
                continue
            if not any(all(v in k["types"].get(p, [v]) for p, v in s["types"].items()) for k in at):
                disagree.append(f"{key} {s['types']}: placed on WebGPU, not in the listing")
        for s in probed["no_kernel"]:
            if any(all(v in k["types"].get(p, []) for p, v in s["types"].items() if p in k["types"])
                   and all(p in k["types"] for p in s["types"]) for k in at):
                disagree.append(f"{key} {s['types']}: in the listing, not placed on WebGPU (capture off)")
    for key in kernels:
        if key not in listed:
            disagree.append(f"{key}: placed on WebGPU, op not in the listing")
    return {"available": True, "source": "onnxruntime_pybind11_state.get_registered_ep_kernel_defs",
            "n_defs": len(defs), "ops": listed, "disagreements": disagree}


# ----------------------------------------------------------------------------------------------------------------
# Targeted probes
# ----------------------------------------------------------------------------------------------------------------

def _model(nodes, inputs, outputs, opsets, ir_version=10, inits=()):
    from onnx import helper

    g = helper.make_graph(nodes, "p", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    m.ir_version = ir_version
    return m.SerializeToString()


def probe_max_opset() -> dict[str, Any]:
    """The highest ONNX-domain opset a WebGPU session accepts (Add models, opset 21..30)."""
    from onnx import TensorProto as TP
    from onnx import helper

    res = {}
    for v in range(21, 31):
        data = _model([helper.make_node("Add", ["x", "x"], ["y"])], [helper.make_tensor_value_info("x", TP.FLOAT, [2])],
                      [helper.make_tensor_value_info("y", TP.FLOAT, [2])], {"": v})
        try:
            make_session(data, {})
            res[str(v)] = None
        except Exception as exc:  # noqa: BLE001
            res[str(v)] = _strip(str(exc))[:300]
    ok = [int(k) for k, e in res.items() if e is None]
    return {"max_onnx_opset": max(ok) if ok else None, "onnx_opsets": res}


def probe_ir_versions(opsets) -> dict[str, Any]:
    from onnx import TensorProto as TP
    from onnx import helper

    res = {}
    for ir in range(10, 15):
        data = _model([helper.make_node("Add", ["x", "x"], ["y"])], [helper.make_tensor_value_info("x", TP.FLOAT, [2])],
                      [helper.make_tensor_value_info("y", TP.FLOAT, [2])], {"": 21}, ir_version=ir)
        try:
            make_session(data, {})
            res[str(ir)] = None
        except Exception as exc:  # noqa: BLE001
            res[str(ir)] = _strip(str(exc))
    ok = [int(k) for k, v in res.items() if v is None]
    return {"max_ir_version": max(ok) if ok else None, "ir_versions": res}


def _load_one(node, inputs, opsets, tmp, options=None) -> dict[str, Any]:
    from onnx import helper

    outs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
    info = run_child(_model([node], inputs, outs, opsets), options or {}, tmp)
    ep = info["placed"].get(node.name, info["all_placed"])
    return {"loads": info["error"] is None and ep == WEBGPU, "ep": ep, "error": info["error"]}


def probe_op_limits(opsets, tmp: Path) -> dict[str, Any]:
    from onnx import TensorProto as TP
    from onnx import helper

    schemas = select_schemas(opsets)
    gqa_types = ["FLOAT", "FLOAT", "FLOAT", "FLOAT", "FLOAT", "INT32", "INT32", "FLOAT", "FLOAT", "INT64", "FLOAT",
                 "FLOAT", "FLOAT", "FLOAT", "FLOAT", "FLOAT"]
    res: dict[str, Any] = {}
    g = schemas.get((MS, "GroupQueryAttention"))
    counts = {}
    for n in range(7, 17):
        ins = [helper.make_tensor_value_info(f"i{j}", getattr(TP, gqa_types[j]), None) for j in range(n)]
        node = helper.make_node("GroupQueryAttention", [f"i{j}" for j in range(n)], ["o0", "o1", "o2"], name="gqa",
                                domain=MS, num_heads=2, kv_num_heads=2)
        counts[str(n)] = _load_one(node, ins, opsets, tmp)
    res["GroupQueryAttention"] = {"max_inputs_schema": g.max_input if g else None,
                                  "input_counts": counts,
                                  "accepted_input_counts": [int(k) for k, v in counts.items() if v["loads"]]}
    f = "FLOAT"
    specs = {
        "MRotaryEmbedding": (MS, [f, "INT64", f, f], {"mrope_section": [2, 2, 4], "num_heads": 2}, 1),
        "RotaryEmbedding": (MS, [f, "INT64", f, f], {}, 1),
        "MultiHeadAttention": (MS, [f, f, f], {"num_heads": 2}, 1),
        "SimplifiedLayerNormalization": ("", [f, f], {}, 1),
        "SkipSimplifiedLayerNormalization": (MS, [f, f, f], {}, 1),
    }
    for op, (domain, types, attrs, n_out) in specs.items():
        op = op.split("@")[0]
        ins = [helper.make_tensor_value_info(f"i{j}", getattr(TP, t), None) for j, t in enumerate(types)]
        node = helper.make_node(op, [f"i{j}" for j in range(len(types))], [f"o{j}" for j in range(n_out)],
                                name="probe_op", domain=domain, **attrs)
        r = _load_one(node, ins, opsets, tmp)
        r["registered"] = (domain, op) in schemas
        r["domain"] = domain
        res[op] = r
    top = select_schemas({"": 30})
    rot = top.get(("", "RotaryEmbedding"))
    if rot is not None:
        ins = [helper.make_tensor_value_info(f"i{j}", getattr(TP, t), None) for j, t in enumerate([f, f, f])]
        node = helper.make_node("RotaryEmbedding", ["i0", "i1", "i2"], ["o0"], name="probe_op", num_heads=2)
        r = _load_one(node, ins, {"": max(23, rot.since_version)}, tmp)
        r.update(registered=True, domain="", opset=max(23, rot.since_version))
        res["RotaryEmbedding(onnx)"] = r
    else:
        res["RotaryEmbedding(onnx)"] = {"registered": False, "loads_on_webgpu": False, "loads": False,
                                        "error": "no ONNX-domain RotaryEmbedding schema in this onnxruntime"}
    return res


def probe_capture_blockers(opsets, tmp: Path) -> dict[str, Any]:
    from onnx import TensorProto as TP
    from onnx import helper

    res = {}
    x = helper.make_tensor_value_info("x", TP.FLOAT, ["a", 4])
    cond = helper.make_tensor_value_info("c", TP.BOOL, [])
    then_g = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TP.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Abs", ["x"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TP.FLOAT, None)])
    if_model = _model([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
                       helper.make_node("Add", ["y", "x"], ["z"])], [cond, x],
                      [helper.make_tensor_value_info("z", TP.FLOAT, None)], opsets)
    idx = helper.make_tensor("idx", TP.INT64, [], [0])
    one = helper.make_tensor("one", TP.INT64, [1], [4])
    ax = helper.make_tensor("ax", TP.INT64, [1], [0])
    shape_model = _model([
        helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "idx"], ["s0"], axis=0),
        helper.make_node("Unsqueeze", ["s0", "ax"], ["s1"]), helper.make_node("Concat", ["s1", "one"], ["shp"], axis=0),
        helper.make_node("Expand", ["b", "shp"], ["be"]), helper.make_node("Add", ["be", "x"], ["z"])],
        [x, helper.make_tensor_value_info("b", TP.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("z", TP.FLOAT, None)], opsets, inits=[idx, one, ax])
    for name, data in (("if_node", if_model), ("shape_to_expand", shape_model)):
        entry = {}
        for mode, opts in (("off", {}), ("on", {"enableGraphCapture": "1"})):
            info = run_child(data, opts, tmp)
            entry[mode] = {"session_error": info["error"], "memcpy": info["memcpy"],
                           "cpu_nodes": sorted(f"{k}" for k, v in info["placed"].items() if v != WEBGPU)}
        entry["blocks_capture"] = entry["on"]["session_error"] is not None and entry["off"]["session_error"] is None
        res[name] = entry
    return res


def _gqa_rotary_model(opsets, rows: int, heads=2, kv=2, head=16):
    from onnx import TensorProto as TP
    from onnx import helper

    d = (heads + 2 * kv) * head
    ins = [helper.make_tensor_value_info("q", TP.FLOAT, [1, 1, d]),
           helper.make_tensor_value_info("pk", TP.FLOAT, [1, kv, "p", head]),
           helper.make_tensor_value_info("pv", TP.FLOAT, [1, kv, "p", head]),
           helper.make_tensor_value_info("sk", TP.INT32, [1]),
           helper.make_tensor_value_info("tl", TP.INT32, []),
           helper.make_tensor_value_info("cos", TP.FLOAT, [rows, head // 2]),
           helper.make_tensor_value_info("sin", TP.FLOAT, [rows, head // 2])]
    node = helper.make_node("GroupQueryAttention", ["q", "", "", "pk", "pv", "sk", "tl", "cos", "sin"],
                            ["out", "pko", "pvo"], domain=MS, num_heads=heads, kv_num_heads=kv, do_rotary=1)
    outs = [helper.make_tensor_value_info(n, TP.FLOAT, None) for n in ("out", "pko", "pvo")]
    return _model([node], ins, outs, opsets)


def probe_options(opsets) -> dict[str, Any]:
    import numpy as np
    from onnx import TensorProto as TP
    from onnx import helper

    res: dict[str, Any] = {}
    # multiRotaryCacheConcatOffset: cache = [short (offset rows); long (max_pos rows)], decode past the offset
    heads, kv, head, offset, max_pos, past = 2, 2, 16, 4, 16, 5
    rng = np.random.default_rng(0)
    short = rng.standard_normal((offset, head // 2)).astype(np.float32)
    long_ = rng.standard_normal((max_pos, head // 2)).astype(np.float32)
    cat_cos, cat_sin = np.concatenate([short, long_]), np.concatenate([short[::-1], long_[::-1]]).copy()
    feeds = {"q": rng.standard_normal((1, 1, (heads + 2 * kv) * head)).astype(np.float32),
             "pk": rng.standard_normal((1, kv, past, head)).astype(np.float32),
             "pv": rng.standard_normal((1, kv, past, head)).astype(np.float32),
             "sk": np.array([past], np.int32), "tl": np.array(past + 1, np.int32)}

    def run(cos, sin, opts):
        sess = make_session(_gqa_rotary_model(opsets, cos.shape[0], heads, kv, head), opts)
        assert sess.get_providers()[0] == WEBGPU, sess.get_providers()
        return sess.run(None, dict(feeds, cos=cos, sin=sin))

    entry: dict[str, Any] = {"setup": f"packed-QKV GQA do_rotary=1, decode at position {past} (total {past + 1}), "
                                      f"cache [short {offset} rows; long {max_pos} rows], option = {offset}"}
    try:
        off = run(cat_cos, cat_sin, {})
        on = run(cat_cos, cat_sin, {"multiRotaryCacheConcatOffset": str(offset)})
        ref = run(long_, long_[::-1].copy(), {})
        d_off_on = float(np.abs(on[0] - off[0]).max())
        d_on_ref = float(np.abs(on[0] - ref[0]).max())
        entry.update({"changes_result": d_off_on > 1e-4, "max_abs_change": d_off_on,
                      "matches_long_cache_reference": d_on_ref < 1e-4, "max_abs_diff_vs_long_cache": d_on_ref})
        # separate Q/K/V inputs: same option, same cache
        entry["error"] = None
    except Exception as exc:  # noqa: BLE001
        entry["error"] = _strip(str(exc))
    res["multiRotaryCacheConcatOffset"] = entry

    # enableGraphCapture: a captured session replays through IOBinding; plain run() on it behaves differently
    x = helper.make_tensor_value_info("x", TP.FLOAT, [4])
    data = _model([helper.make_node("Add", ["x", "x"], ["y"])], [x], [helper.make_tensor_value_info("y", TP.FLOAT, [4])],
                  opsets)
    cap: dict[str, Any] = {}
    xv = np.arange(4, dtype=np.float32)
    for mode, opts in (("0", {}), ("1", {"enableGraphCapture": "1"})):
        try:
            sess = make_session(data, opts)
            outs = [sess.run(None, {"x": xv}) for _ in range(3)]
            cap[f"plain_run_capture_{mode}"] = [[o.tolist() for o in r] for r in outs]
        except Exception as exc:  # noqa: BLE001
            cap[f"plain_run_capture_{mode}"] = f"error: {_strip(str(exc))}"
    cap["honoured"] = cap["plain_run_capture_0"] != cap["plain_run_capture_1"]
    cap["how"] = ("3 plain sess.run() calls on y = x + x with capture off and on; a different behaviour with "
                  "capture on shows the option is read (the if_node capture blocker and the int64 kernel modes are "
                  "further evidence)")
    res["enableGraphCapture"] = cap
    return res


# ----------------------------------------------------------------------------------------------------------------
# Metadata
# ----------------------------------------------------------------------------------------------------------------

def vulkan_devices() -> list[str] | str:
    """Names of the Vulkan physical devices (what Dawn picks its adapter from), via libvulkan and ctypes."""
    import ctypes

    try:
        vk = ctypes.CDLL("libvulkan.so.1")
    except OSError as exc:
        return f"libvulkan not loadable: {exc}"

    class AppInfo(ctypes.Structure):
        _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("pApplicationName", ctypes.c_char_p),
                    ("applicationVersion", ctypes.c_uint32), ("pEngineName", ctypes.c_char_p),
                    ("engineVersion", ctypes.c_uint32), ("apiVersion", ctypes.c_uint32)]

    class CreateInfo(ctypes.Structure):
        _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("flags", ctypes.c_uint32),
                    ("pApplicationInfo", ctypes.POINTER(AppInfo)), ("enabledLayerCount", ctypes.c_uint32),
                    ("ppEnabledLayerNames", ctypes.c_void_p), ("enabledExtensionCount", ctypes.c_uint32),
                    ("ppEnabledExtensionNames", ctypes.c_void_p)]

    app = AppInfo(0, None, b"probe", 0, None, 0, (1 << 22) | (1 << 12))
    ci = CreateInfo(1, None, 0, ctypes.pointer(app), 0, None, 0, None)
    inst = ctypes.c_void_p()
    if vk.vkCreateInstance(ctypes.byref(ci), None, ctypes.byref(inst)) != 0:
        return "vkCreateInstance failed"
    n = ctypes.c_uint32()
    vk.vkEnumeratePhysicalDevices(inst, ctypes.byref(n), None)
    devs = (ctypes.c_void_p * n.value)()
    vk.vkEnumeratePhysicalDevices(inst, ctypes.byref(n), devs)
    names = []
    for d in devs:
        buf = ctypes.create_string_buffer(4096)  # VkPhysicalDeviceProperties: name at offset 20
        vk.vkGetPhysicalDeviceProperties(ctypes.c_void_p(d), buf)
        api = int.from_bytes(buf.raw[0:4], "little")
        kind = int.from_bytes(buf.raw[16:20], "little")
        name = buf.raw[20:276].split(b"\0")[0].decode(errors="replace")
        kinds = {0: "other", 1: "integrated GPU", 2: "discrete GPU", 3: "virtual GPU", 4: "CPU"}
        names.append(f"{name} (Vulkan {api >> 22}.{(api >> 12) & 0x3FF}, {kinds.get(kind, kind)})")
    vk.vkDestroyInstance(inst, None)
    return names


def adapter_info() -> dict[str, Any]:
    info: dict[str, Any] = {"vulkan_devices": vulkan_devices(), "ep_device": None,
                            "env": {k: v for k, v in os.environ.items() if k.startswith(("ORT_WEBGPU", "VK_", "LP_"))}}
    dev = plugin_device()
    if dev is not None:
        info["ep_device"] = {"ep_name": dev.ep_name, "ep_vendor": dev.ep_vendor, "ep_metadata": dict(dev.ep_metadata),
                             "device_type": str(dev.device.type), "device_vendor": dev.device.vendor,
                             "device_id": dev.device.device_id, "device_metadata": dict(dev.device.metadata)}
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runtime", choices=["onnxruntime-webgpu", "onnxruntime-ep-webgpu"])
    ap.add_argument("-o", "--output")
    ap.add_argument("--opset", type=int, default=21, help="ONNX-domain opset of every probe model (default 21)")
    ap.add_argument("--types", default=",".join(PROBE_TYPES), help="element types to try per type constraint")
    ap.add_argument("--batch", type=int, default=1500, help="probe nodes per session")
    ap.add_argument("--only", default="", help="comma-separated op types (debugging)")
    ap.add_argument("--child")
    ap.add_argument("--cpu-child", nargs=3)
    ap.add_argument("--no-opt", action="store_true")
    ap.add_argument("--options", default="{}")
    args = ap.parse_args(argv)
    if args.cpu_child:
        cpu_child(args.cpu_child[0], int(args.cpu_child[1]), int(args.cpu_child[2]))
        return 0
    if args.child:
        child(args.child, json.loads(args.options), optimize=not args.no_opt)
        return 0
    if not args.runtime or not args.output:
        ap.error("--runtime and -o are required")
    os.environ["PROBE_RUNTIME"] = args.runtime
    if args.runtime == "onnxruntime-ep-webgpu":
        os.environ.setdefault("ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER", "1")
    t0 = time.time()
    from importlib.metadata import PackageNotFoundError, version

    import onnx

    ort = _ort()
    try:
        plugin_version = version("onnxruntime-ep-webgpu") if args.runtime == "onnxruntime-ep-webgpu" else None
    except PackageNotFoundError:
        plugin_version = None
    if args.runtime == "onnxruntime-webgpu" and WEBGPU not in ort.get_available_providers():
        ap.error(f"this interpreter's onnxruntime ({ort.__version__}) has no {WEBGPU}")
    opsets = {"": args.opset, MS: 1}
    types = tuple(t.strip().upper() for t in args.types.split(",") if t.strip())
    global SKIP
    if args.only:
        only = set(args.only.split(","))
        SKIP = dict(SKIP)
        for (d, o), _s in select_schemas(opsets).items():
            if o not in only:
                SKIP[(d, o)] = "--only"
    log: list[str] = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        table: dict[str, Any] = {
            "schema_version": 1, "runtime": args.runtime, "onnxruntime_version": ort.__version__,
            "plugin_version": plugin_version, "onnx_version": onnx.__version__,
            "python": sys.version.split()[0],
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([os.path.relpath(sys.executable) if not os.path.isabs(sys.argv[0]) else sys.executable,
                                 *sys.argv]),
            "adapter": adapter_info(),
        }
        table.update(probe_ir_versions(opsets))
        table["opsets"] = opsets
        table["probe_types"] = list(types)
        t1 = time.time()
        kernels, nokernel, unprobed = probe_kernels(opsets, types, tmp, log, args.batch)
        if args.only:
            unprobed = {k: v for k, v in unprobed.items() if v != "--only"}
        table["kernel_probe_seconds"] = round(time.time() - t1, 1)
        table["kernels"] = kernels
        table["no_webgpu_kernel"] = nokernel
        table["unprobed"] = unprobed
        table.update(probe_max_opset())
        newer = table["max_onnx_opset"]
        if newer and newer > args.opset and not args.only:
            base, top = select_schemas(opsets), select_schemas({"": newer})
            changed = {k for k, sch in top.items() if k not in base or base[k].since_version != sch.since_version}
            t2 = time.time()
            k2, n2, u2 = probe_kernels({"": newer, MS: 1}, types, tmp, log, args.batch, only=changed)
            table["kernels_newer_opset"] = {
                "opset": newer, "seconds": round(time.time() - t2, 1),
                "note": "ONNX-domain ops whose schema at this opset differs from (or is absent at) the base opset; "
                        "same format as kernels",
                "kernels": k2, "no_webgpu_kernel": n2, "unprobed": u2}
        table["registry"] = registry_listing(kernels, opsets)
        table["op_limits"] = probe_op_limits(opsets, tmp)
        table["capture_blockers"] = probe_capture_blockers(opsets, tmp)
        table["options_read"] = probe_options(opsets)
        table["probe_log"] = log
        table["probe_seconds"] = round(time.time() - t0, 1)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(table, indent=1, sort_keys=False) + "\n")
    print(f"{args.output}: {len(kernels)} ops with WebGPU kernels, {len(nokernel)} without, {len(unprobed)} unprobed; "
          f"{table['probe_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
