"""The measured WebGPU kernel facts of onnxruntime-webgpu 1.27 that :mod:`.placement` predicts from.

The data lives in ``webgpu_kernels.json`` next to this module (package data), with its provenance (runtime version,
adapter, date, the command that measured it, the source of each hand-measured section) in :data:`PROVENANCE`.
onnxruntime has no Python API that lists an EP's kernels: the ``kernels`` section is measured by
``tools/derive_kernel_table.py`` (one probe node per (op, type), a WebGPU session with capture off and one with capture
on, onnxruntime's ``webgpu kernel not found`` log lines), which rewrites that section of the JSON.

JSON sections (op keys are ``"<domain>::<op_type>"``, domain ``""`` = ONNX):

* ``kernels``: ``{op: {type key: capture modes with a WebGPU kernel}}``; modes ``"off"``/``"on"`` (capture on also
  registers the int64 kernels); ``[]`` = probed, no kernel; a type key absent = unknown. The type key is
  :func:`type_key`'s: the dtype of the type-selecting input, for ``Cast`` ``"FROM->TO"``.
* ``cpu_inputs``: inputs a WebGPU kernel reads from CPU memory (``InputMemoryType(OrtMemTypeCPU, i)``);
  ``cpu_inputs_without_capture``: the same, only when graph capture is off.
* ``cpu_outputs``: outputs a WebGPU kernel writes to CPU memory (``OutputMemoryType(OrtMemTypeCPU, i)``).
* ``unregistered_ops``: ops onnxruntime cannot load at all, with its message; ``max_inputs``: input-count limits of
  contrib schemas.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

Op = tuple[str, str]  # (domain, op_type), domain "" for ONNX


def _op(key: str) -> Op:
    domain, sep, op = key.partition("::")
    if not sep:
        raise ValueError(f"webgpu_kernels.json: op key {key!r} is not '<domain>::<op_type>'")
    return domain, op


def _indices(section: Mapping[str, list[int]]) -> dict[Op, frozenset[int]]:
    return {_op(k): frozenset(v) for k, v in section.items()}


def _load() -> dict[str, Any]:
    return json.loads(resources.files(__package__).joinpath("webgpu_kernels.json").read_text(encoding="utf-8"))


_DATA = _load()

#: where the data comes from: runtime, version, adapter, date, command, and the source of each hand-measured section
PROVENANCE: dict[str, Any] = {k: v for k, v in _DATA.items() if not isinstance(v, dict) or k == "sources"}
#: (domain, op, type key) -> capture modes with a WebGPU kernel ("off", "on"); frozenset() = probed, no kernel
WEBGPU_KERNELS: dict[tuple[str, str, str], frozenset[str]] = {
    (*_op(op), key): frozenset(modes) for op, keys in _DATA["kernels"].items() for key, modes in keys.items()
}
#: inputs a WebGPU kernel reads from CPU memory: a CPU tensor read there needs no Memcpy, a GPU one a MemcpyToHost
CPU_INPUTS: dict[Op, frozenset[int]] = _indices(_DATA["cpu_inputs"])
#: CPU-memory inputs only without graph capture (GroupQueryAttention's total_sequence_length)
CPU_INPUTS_WITHOUT_CAPTURE: dict[Op, frozenset[int]] = _indices(_DATA["cpu_inputs_without_capture"])
#: outputs a WebGPU kernel writes to CPU memory (Shape's result)
CPU_OUTPUTS: dict[Op, frozenset[int]] = _indices(_DATA["cpu_outputs"])
#: ops onnxruntime cannot load at all, with its message
UNREGISTERED_OPS: dict[Op, str] = {_op(k): v for k, v in _DATA["unregistered_ops"].items()}
#: input-count limits of contrib schemas that the corpus exceeds
MAX_INPUTS: dict[Op, int] = {_op(k): v for k, v in _DATA["max_inputs"].items()}


def type_key(domain: str, op: str, in_types: list[str | None], out_types: list[str | None]) -> str:
    """The key that selects a kernel: the dtype of the type-constrained input (``Where``: input 1;
    ``ConstantOfShape``/``Constant``: the output), for ``Cast`` ``"FROM->TO"``."""
    if (domain, op) == ("", "Cast"):
        return f"{in_types[0] if in_types else None}->{out_types[0] if out_types else None}"
    if (domain, op) in (("", "ConstantOfShape"), ("", "Constant")):
        return str(out_types[0] if out_types else None)
    index = 1 if (domain, op) == ("", "Where") else 0
    return str(in_types[index] if index < len(in_types) else None)
