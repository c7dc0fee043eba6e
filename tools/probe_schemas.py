"""Dump the op schemas (attributes per schema version) of the onnxruntime this interpreter runs.

onnxruntime refuses to create a session for a node with an attribute its schema does not declare ("Unrecognized
attribute: rotary_embedding_dim for operator GroupQueryAttention"), on every EP. ``rope_passes.runtimes.probed`` reads the
output, ``rope_passes/runtime_tables/<runtime>.schemas.json``, to predict that refusal: the runtime's own schemas,
not our reading of them. Run it with each runtime's interpreter::

    .venv/bin/python tools/probe_schemas.py -o rope_passes/runtime_tables/onnxruntime-webgpu.schemas.json
    .venv-plugin/bin/python tools/probe_schemas.py -o rope_passes/runtime_tables/onnxruntime-ep-webgpu.schemas.json
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

#: the domains onnxruntime's RoPE graphs use (ONNX and Microsoft's contrib ops)
DOMAINS = ("", "com.microsoft")


def schemas() -> dict[str, list[list]]:
    """``"<domain>::<op>"`` -> ``[[since_version, [attribute, ...]], ...]`` (ascending since_version)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    out: dict[str, list[list]] = {}
    for s in C.get_all_operator_schema():
        domain = "" if s.domain == "ai.onnx" else s.domain
        if domain not in DOMAINS or s.deprecated:
            continue
        out.setdefault(f"{domain}::{s.name}", []).append([int(s.since_version), sorted(s.attributes)])
    return {k: sorted(v) for k, v in sorted(out.items())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)
    import onnxruntime as ort

    data = {"schema_version": 1, "onnxruntime_version": ort.__version__,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([Path(sys.executable).name, *sys.argv]), "domains": list(DOMAINS),
            "schemas": schemas()}
    head = {k: v for k, v in data.items() if k != "schemas"}
    lines = [json.dumps(head)[:-1] + ', "schemas": {']
    lines += [f"  {json.dumps(op)}: {json.dumps(versions)}," for op, versions in data["schemas"].items()]
    lines[-1] = lines[-1].rstrip(",")
    Path(args.output).write_text("\n".join(lines) + "\n}}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
