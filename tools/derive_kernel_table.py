"""Measure onnxruntime-webgpu's WebGPU kernel registry and write the ``kernels`` section of
``rope_passes/analysis/webgpu_kernels.json`` (the table the static placement prediction reads).

    .venv/bin/python tools/derive_kernel_table.py                 # rewrite the package's JSON in place
    .venv/bin/python tools/derive_kernel_table.py -o /tmp/k.json  # write elsewhere (e.g. to diff against it)

onnxruntime has no Python API that lists an EP's kernels. For each (op, type) below that the ONNX schema accepts, one
probe node with every input a graph input goes into one model; a WebGPU session is created with capture off and one
with capture on (log severity 0, in a subprocess: :func:`rope_passes.runtime.placement_probe.probe_placement`), and
the EP's ``webgpu kernel not found in registries for Op type: X node name: N`` lines say which nodes have no kernel.
A probe node that no EP at all can run makes the session fail: it is dropped and the model retried.

The other sections of the JSON (CPU-memory inputs/outputs, unloadable ops, input limits) and the kernel entries of ops
this script does not probe (``If``: needs subgraphs) are kept as they are; the provenance fields (runtime version,
adapter, date, command) are replaced.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "rope_passes" / "analysis" / "webgpu_kernels.json"
MS_DOMAIN = "com.microsoft"

Key = tuple[str, str, str]  # (domain, op, type key)

#: element types tried for each "T" input
PROBE_DTYPES = ("FLOAT", "FLOAT16", "INT32", "INT64", "UINT32", "BOOL")
#: (domain, op, attrs, inputs ("T" or a fixed dtype), n_outputs)
PROBE_OPS: list[tuple[str, str, dict[str, Any], list[str], int]] = [
    ("", "Add", {}, ["T", "T"], 1), ("", "Sub", {}, ["T", "T"], 1), ("", "Mul", {}, ["T", "T"], 1),
    ("", "Div", {}, ["T", "T"], 1), ("", "Equal", {}, ["T", "T"], 1), ("", "Greater", {}, ["T", "T"], 1),
    ("", "Less", {}, ["T", "T"], 1), ("", "GreaterOrEqual", {}, ["T", "T"], 1), ("", "Max", {}, ["T", "T"], 1),
    ("", "Min", {}, ["T", "T"], 1), ("", "Neg", {}, ["T"], 1), ("", "Relu", {}, ["T"], 1), ("", "Abs", {}, ["T"], 1),
    ("", "Cos", {}, ["T"], 1), ("", "Sin", {}, ["T"], 1),
    ("", "Sigmoid", {}, ["T"], 1), ("", "Identity", {}, ["T"], 1), ("", "Transpose", {"perm": [1, 0]}, ["T"], 1),
    ("", "Shape", {}, ["T"], 1), ("", "Size", {}, ["T"], 1), ("", "Gather", {"axis": 0}, ["T", "INT64"], 1),
    ("", "GatherElements", {"axis": 0}, ["T", "INT64"], 1), ("", "Reshape", {}, ["T", "INT64"], 1),
    ("", "Expand", {}, ["T", "INT64"], 1), ("", "Slice", {}, ["T", "INT64", "INT64", "INT64", "INT64"], 1),
    ("", "Squeeze", {}, ["T", "INT64"], 1), ("", "Unsqueeze", {}, ["T", "INT64"], 1),
    ("", "Split", {"axis": 0}, ["T", "INT64"], 2), ("", "Tile", {}, ["T", "INT64"], 1),
    ("", "Concat", {"axis": 0}, ["T", "T"], 1), ("", "Range", {}, ["T", "T", "T"], 1),
    ("", "ReduceSum", {"keepdims": 0}, ["T", "INT64"], 1), ("", "ReduceMax", {"keepdims": 0}, ["T", "INT64"], 1),
    ("", "ReduceMin", {"keepdims": 0}, ["T", "INT64"], 1), ("", "ReduceProd", {"keepdims": 0}, ["T", "INT64"], 1),
    ("", "Where", {}, ["BOOL", "T", "T"], 1), ("", "MatMul", {}, ["T", "T"], 1), ("", "CumSum", {}, ["T", "INT64"], 1),
    ("", "Trilu", {}, ["T"], 1), ("", "Softmax", {}, ["T"], 1),
    ("", "SimplifiedLayerNormalization", {}, ["T", "T"], 1),
    (MS_DOMAIN, "SkipSimplifiedLayerNormalization", {}, ["T", "T", "T"], 1),
    (MS_DOMAIN, "RotaryEmbedding", {}, ["T", "INT64", "T", "T"], 1),
    (MS_DOMAIN, "GroupQueryAttention", {"num_heads": 2, "kv_num_heads": 2},
     ["T", "T", "T", "T", "T", "INT32", "INT32"], 3),
    (MS_DOMAIN, "MatMulNBits", {"K": 32, "N": 32, "bits": 4, "block_size": 32}, ["T", "UINT8", "T"], 1),
]

Entry = tuple[Key, tuple[str, str, dict[str, Any], list[str], int]]


def probe_nodes() -> list[Entry]:
    """Every probed (key, node template): PROBE_OPS x PROBE_DTYPES, Cast between every pair, ConstantOfShape."""
    from onnx import TensorProto, helper

    out: list[Entry] = []
    for domain, op, attrs, inputs, n_out in PROBE_OPS:
        for dtype in PROBE_DTYPES:
            out.append(((domain, op, dtype), (domain, op, attrs, [dtype if t == "T" else t for t in inputs], n_out)))
    for src in PROBE_DTYPES:
        for dst in PROBE_DTYPES:
            if src != dst:
                out.append((("", "Cast", f"{src}->{dst}"), ("", "Cast", {"to": getattr(TensorProto, dst)}, [src], 1)))
    for dst in PROBE_DTYPES:
        value = helper.make_tensor("v", getattr(TensorProto, dst), [1], [0])
        out.append((("", "ConstantOfShape", dst), ("", "ConstantOfShape", {"value": value}, ["INT64"], 1)))
    return out


def probe_model_bytes(entries: list[Entry]) -> tuple[bytes, dict[str, Key]]:
    """One model with a node ``probe<i>`` per entry, every input a graph input; and node name -> key."""
    from onnx import TensorProto, helper

    nodes, inputs, outputs, names = [], [], [], {}
    for i, (key, (domain, op, attrs, in_types, n_out)) in enumerate(entries):
        node_inputs = []
        for j, t in enumerate(in_types):
            name = f"n{i}_in{j}"
            inputs.append(helper.make_tensor_value_info(name, getattr(TensorProto, t), None))
            node_inputs.append(name)
        outs = [f"n{i}_out{j}" for j in range(n_out)]
        outputs.extend(helper.make_empty_tensor_value_info(o) for o in outs)
        nodes.append(helper.make_node(op, node_inputs, outs, name=f"probe{i}", domain=domain, **attrs))
        names[f"probe{i}"] = key
    graph = helper.make_graph(nodes, "kernel_probe", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS_DOMAIN, 1)])
    model.ir_version = 10
    return model.SerializeToString(), names


def well_typed(entry: Entry) -> bool:
    """Whether the ONNX schema accepts this (op, types) at all (contrib ops: float types only)."""
    import onnx

    (domain, op, dtype) = entry[0]
    if domain == MS_DOMAIN or not onnx.defs.has(op, domain):
        return dtype in ("FLOAT", "FLOAT16")
    data, _ = probe_model_bytes([entry])
    try:
        onnx.shape_inference.infer_shapes(onnx.load_from_string(data), check_type=True, strict_mode=True)
    except Exception:  # noqa: BLE001 - a type error is the answer
        return False
    return True


def derive_kernel_table() -> dict[Key, frozenset[str]]:
    """Measure the WebGPU kernel registry: {(domain, op, type key): capture modes with a kernel}.

    Only (op, type) pairs the ONNX schema accepts are probed; the others are absent from the result.
    """
    from rope_passes.runtime.placement_probe import probe_placement

    entries = [e for e in probe_nodes() if well_typed(e)]
    table: dict[Key, set[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "probe.onnx"
        for capture in (False, True):
            todo = list(entries)
            while True:
                data, names = probe_model_bytes(todo)
                path.write_bytes(data)
                placement = probe_placement(path, graph_capture=capture)
                if placement.loads and (placement.capture_ok is not False or "graph capture" in
                                        (placement.capture_error or "")):
                    break
                # a (op, type) no EP at all can run makes the whole session fail: drop it and retry
                bad = re.search(r"probe(\d+)", placement.load_error or "")
                if bad is None:
                    raise RuntimeError(f"kernel probe model did not load: {placement.load_error}")
                del todo[int(bad.group(1))]
            missing = set(placement.cpu_nodes)
            for node_name, key in names.items():
                table.setdefault(key, set())
                if node_name not in missing:
                    table[key].add("on" if capture else "off")
    return {k: frozenset(v) for k, v in table.items()}


def kernels_section(table: dict[Key, frozenset[str]], old: dict[str, dict[str, list[str]]]) -> dict[str, Any]:
    """The JSON ``kernels`` section: the measured kernels, ``[]`` ("probed, no kernel") for every type of the probed
    ops and every Cast pair, and the old entries of ops this script does not probe."""
    known: dict[Key, frozenset[str]] = {k: v for k, v in table.items() if v}
    for domain, op, _attrs, _inputs, _n in PROBE_OPS:
        for dtype in PROBE_DTYPES:
            known.setdefault((domain, op, dtype), frozenset())
    for src in PROBE_DTYPES:
        for dst in PROBE_DTYPES:
            known.setdefault(("", "Cast", f"{src}->{dst}"), frozenset())
    section: dict[str, dict[str, list[str]]] = {}
    for domain, op, _key in table:  # probed ops without any kernel keep an (empty) entry
        section.setdefault(f"{domain}::{op}", {})
    for (domain, op, key), modes in known.items():
        section.setdefault(f"{domain}::{op}", {})[key] = sorted(modes)
    for op, keys in old.items():
        section.setdefault(op, keys)
    return {op: dict(sorted(keys.items())) for op, keys in sorted(section.items())}


def dumps(data: dict[str, Any]) -> str:
    """JSON with one line per op in the op-keyed sections (reviewable diffs)."""
    lines = ["{"]
    items = list(data.items())
    for i, (name, value) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        if isinstance(value, dict) and name != "sources" and value:
            lines.append(f"  {json.dumps(name)}: {{")
            entries = list(value.items())
            for j, (key, sub) in enumerate(entries):
                lines.append(f"    {json.dumps(key)}: {json.dumps(sub)}{',' if j < len(entries) - 1 else ''}")
            lines.append(f"  }}{comma}")
        else:
            lines.append(f"  {json.dumps(name)}: {json.dumps(value, indent=2).replace(chr(10), chr(10) + '  ')}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _installed(distribution: str) -> bool:
    from importlib import metadata

    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", type=Path, default=TABLE, help=f"JSON to write (default: {TABLE})")
    args = parser.parse_args(argv)
    import onnxruntime as ort

    from rope_passes.runtime.adapter import adapter_info

    old = json.loads(TABLE.read_text(encoding="utf-8"))
    table = derive_kernel_table()
    data = dict(old)
    data.update({
        "runtime": next((d for d in ("onnxruntime-webgpu", "onnxruntime") if _installed(d)), "?"),
        "onnxruntime_version": ort.__version__,
        "adapter": adapter_info().summary,
        "date": datetime.date.today().isoformat(),
        "command": shlex.join(["python", "tools/derive_kernel_table.py", *(sys.argv[1:] if argv is None else argv)]),
        "kernels": kernels_section(table, old["kernels"]),
    })
    args.output.write_text(dumps(data), encoding="utf-8")
    print(f"wrote {args.output}: {sum(len(v) for v in data['kernels'].values())} (op, type) entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
