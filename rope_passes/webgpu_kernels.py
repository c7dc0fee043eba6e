"""The WebGPU kernel facts :mod:`rope_passes.analysis.placement` predicts from (beside :mod:`rope_passes.runtimes`,
which holds one per runtime): which (op, type) has a WebGPU kernel, per runtime, and where a kernel reads or writes CPU
memory.

Two homes, one per kind of fact, nothing in both:

* **which kernels exist** — :class:`KernelTable`, built from one runtime's probed table
  (``rope_passes/runtime_tables/<runtime>.json``, written by ``tools/probe_runtime.py``; the runtime's
  :class:`rope_passes.runtimes.probed.ProbedRuntime` holds it as ``target.kernels``). One probe node per (op, type binding),
  a WebGPU session with capture off and one with ``enableGraphCapture=1``, onnxruntime's own placement lines;
* **memory types** — ``webgpu_kernels.json`` next to this module: inputs a WebGPU kernel reads from CPU memory
  (``InputMemoryType(OrtMemTypeCPU, i)``), outputs it writes there (``Shape``), which the runtime probe does not
  measure. They come from the kernel registrations (the same source in onnxruntime-webgpu 1.27 and the plugin EP) and
  are checked against the ``transformer_memcpy`` lines of every genai corpus model and the builder fixtures on both
  runtimes (tests/test_placement.py). Provenance in :data:`PROVENANCE`.

The type key of a node is :func:`type_key`'s: the dtype of the type-selecting input (``Where``: input 1;
``ConstantOfShape``/``EyeLike``: the output), for ``Cast`` ``"FROM->TO"`` — the probe's ``key`` field.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

Op = tuple[str, str]  # (domain, op_type), domain "" for ONNX
KernelKey = tuple[str, str, str]  # (domain, op_type, type key)
#: graph capture modes of the probe: "off" (enableGraphCapture=0), "on" (=1, also registers the int64 kernels)
MODES = ("off", "on")


def _op(key: str) -> Op:
    domain, sep, op = key.partition("::")
    if not sep:
        raise ValueError(f"op key {key!r} is not '<domain>::<op_type>'")
    return domain, op


def _indices(section: Mapping[str, list[int]]) -> dict[Op, frozenset[int]]:
    return {_op(k): frozenset(v) for k, v in section.items()}


def _load() -> dict[str, Any]:
    return json.loads(resources.files(__package__).joinpath("webgpu_kernels.json").read_text(encoding="utf-8"))


_DATA = _load()

#: where the memory-type facts come from
PROVENANCE: dict[str, Any] = {k: v for k, v in _DATA.items() if not isinstance(v, dict) or k == "sources"}
#: inputs a WebGPU kernel reads from CPU memory: a CPU tensor read there needs no Memcpy, a GPU one a MemcpyToHost
CPU_INPUTS: dict[Op, frozenset[int]] = _indices(_DATA["cpu_inputs"])
#: CPU-memory inputs only without graph capture (GroupQueryAttention's total_sequence_length)
CPU_INPUTS_WITHOUT_CAPTURE: dict[Op, frozenset[int]] = _indices(_DATA["cpu_inputs_without_capture"])
#: outputs a WebGPU kernel writes to CPU memory (Shape's result)
CPU_OUTPUTS: dict[Op, frozenset[int]] = _indices(_DATA["cpu_outputs"])


def type_key(domain: str, op: str, in_types: list[str | None], out_types: list[str | None]) -> str:
    """The key that selects a kernel: the dtype of the type-constrained input (``Where``: input 1;
    ``ConstantOfShape``/``EyeLike``/``Constant``: the output), for ``Cast`` ``"FROM->TO"``."""
    if (domain, op) == ("", "Cast"):
        return f"{in_types[0] if in_types else None}->{out_types[0] if out_types else None}"
    if (domain, op) in (("", "ConstantOfShape"), ("", "Constant"), ("", "EyeLike")):
        return str(out_types[0] if out_types else None)
    index = 1 if (domain, op) == ("", "Where") else 0
    return str(in_types[index] if index < len(in_types) else None)


def _section(kernels: Mapping[str, Any]) -> tuple[dict[KernelKey, frozenset[str]], dict[Op, int]]:
    """(domain, op, key) -> modes of one ``kernels`` section, and each op's schema ``since_version``.

    Bindings that share a key are merged (a kernel for any of them counts); a mode the probe could not measure
    (``unmeasured``: ``If`` under capture, where the session is refused for control flow before anything is placed)
    takes the answer of the measured mode; keys only under ``no_kernel`` map to ``frozenset()`` (probed, none).
    """
    table: dict[KernelKey, set[str]] = {}
    since: dict[Op, int] = {}
    for entry in kernels.values():
        op: Op = (entry["domain"], entry["op_type"])
        since[op] = int(entry["since_version"])
        for sig in entry["signatures"]:
            modes = set(sig["modes"])
            if modes and sig.get("unmeasured"):
                modes |= set(sig["unmeasured"])
            table.setdefault((*op, sig["key"]), set()).update(modes)
        for sig in entry.get("no_kernel", ()):
            table.setdefault((*op, sig["key"]), set())
    return {k: frozenset(v) for k, v in table.items()}, since


@dataclasses.dataclass(frozen=True)
class KernelTable:
    """Which (op, type key) has a WebGPU kernel in one runtime, in which capture modes; read with :meth:`modes`.

    The base section was probed at ``base_opset``; ONNX ops whose schema changed up to ``newer_opset`` were probed
    again there (``newer``, with their newer ``since_version``): a model whose opset selects that newer schema reads
    ``newer``. Only kernels *found* at the newer opset are used: the table's ``no_webgpu_kernel`` list at that opset
    contradicts the plugin's own kernel listing (``Cos``, ``Transpose``...) and is not read.
    """

    runtime: str
    base_opset: int
    base: Mapping[KernelKey, frozenset[str]]
    base_since: Mapping[Op, int]
    #: ops probed at the base opset with no WebGPU kernel for any binding
    no_kernel_ops: frozenset[Op]
    newer_opset: int | None = None
    newer: Mapping[KernelKey, frozenset[str]] = dataclasses.field(default_factory=dict)
    newer_since: Mapping[Op, int] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_runtime_table(cls, table: Mapping[str, Any]) -> KernelTable:
        """The kernel table of one probed runtime table (``tools/probe_runtime.py``'s JSON, schema version 1)."""
        if table.get("schema_version") != 1:
            raise ValueError(f"runtime table schema_version {table.get('schema_version')!r}: this reader knows 1")
        base, base_since = _section(table["kernels"])
        newer_part = table.get("kernels_newer_opset") or {}
        newer, newer_since = _section(newer_part.get("kernels", {}))
        return cls(table["runtime"], int(table["opsets"][""]), base, base_since,
                   frozenset(_op(k) for k in table.get("no_webgpu_kernel", {})),
                   newer_part.get("opset"), newer, newer_since)

    def _uses_newer(self, op: Op, opset: int | None) -> bool:
        since = self.newer_since.get(op)
        if since is None:
            return False
        if op not in self.base_since:  # only at the newer opset (RotaryEmbedding-23, RMSNormalization-23)
            return opset is None or opset >= since
        return opset is not None and opset >= since

    def modes(self, domain: str, op: str, key: str, opset: int | None = None) -> frozenset[str] | None:
        """Capture modes (``"off"``, ``"on"``) in which ``op`` with type key ``key`` has a WebGPU kernel, for a model
        whose ONNX opset is ``opset``; ``frozenset()``: probed, no kernel; None: not probed (unknown)."""
        domain = "" if domain == "ai.onnx" else domain
        if self._uses_newer((domain, op), opset if domain == "" else None):
            return self.newer.get((domain, op, key), frozenset())
        found = self.base.get((domain, op, key))
        if found is None and (domain, op) in self.no_kernel_ops:
            return frozenset()
        return found
