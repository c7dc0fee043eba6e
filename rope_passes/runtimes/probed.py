"""A runtime as its probed table describes it: what one WebGPU onnxruntime build loads, runs on WebGPU and reads.

Two runtimes give Python a WebGPU EP, and they accept different graphs:

============================  ============================================================================
``onnxruntime-webgpu``        PyPI ``onnxruntime-webgpu`` (1.27): the ``onnxruntime`` module with WebGPU built in
``onnxruntime-ep-webgpu``     PyPI ``onnxruntime`` (≥ 1.31) + ``onnxruntime-ep-webgpu`` (the WebGPU plugin EP library)
============================  ============================================================================

Every fact of a :class:`ProbedRuntime` comes from ``rope_passes/runtime_tables/<name>.json``, written by
``tools/probe_runtime.py`` running that runtime (sessions on its WebGPU EP; nothing copied from documentation; see
docs/runtimes.md for how to re-probe)::

    runtime = probed_runtime("onnxruntime-webgpu")
    runtime.max_ir_version, runtime.gqa_inputs          # 13, (7, ..., 14)
    runtime.loads_op("com.microsoft", "MRotaryEmbedding")  # False
    runtime.load_problems(model)                          # why it would not load, node by node
    runtime.needs("unfuse-gqa-qk-norm")                   # the reason this runtime needs that downlevel pass, or None
    runtime.kernels                                       # the kernel table the static placement prediction reads

*Downlevel passes* (:data:`DOWNLEVEL`) rewrite what one runtime cannot load into what it can (``lower-mrope``,
``unfuse-gqa-qk-norm``); the presets run them only for a runtime that needs them (:meth:`ProbedRuntime.needs`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any

import onnx_ir as ir

import rope_passes.graph_walk as graph_walk
from rope_passes.errors import UsageError
from rope_passes.runtimes.descriptors import WEB, with_tables
from rope_passes.runtimes.installed import DISTRIBUTIONS
from rope_passes.webgpu_kernels import KernelTable, Op

MS = "com.microsoft"
#: the probed domains: an op of these domains that the table does not list is unknown to that onnxruntime
_PROBED_DOMAINS = ("", MS)


@dataclasses.dataclass(frozen=True)
class LoadProblem:
    """One reason a runtime refuses to load a graph at all (no session on any EP)."""

    kind: str  # "ir-version" | "gqa-inputs" | "unregistered-op" | "unknown-attribute"
    place: str  # node name, or "<model>"
    op: str  # "<domain>::<op>" ("" for the IR version)
    message: str  # onnxruntime's own wording where the probe recorded it

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ProbedRuntime:
    """One WebGPU runtime, as its probed table describes it (see the module docstring)."""

    name: str
    onnxruntime_version: str
    plugin_version: str | None
    date: str  # when the table was probed
    command: str  # the command that probed it
    adapter: str  # the WebGPU adapter of the probe
    max_ir_version: int
    #: GroupQueryAttention input counts that load (7..14 for 1.27, 7..16 with the plugin)
    gqa_inputs: tuple[int, ...]
    #: ops the runtime's onnxruntime knows (any schema, any kernel), per probed domain
    known_ops: frozenset[Op]
    #: op -> (loads on WebGPU, onnxruntime's error) for the ops the probe loaded one by one (MRotaryEmbedding, ...)
    op_loads: Mapping[Op, tuple[bool, str | None]]
    #: capture blockers the probe confirmed: name -> the session error with enableGraphCapture=1
    capture_blockers: Mapping[str, str]
    #: WebGPU provider options the probe showed are read: key -> True
    options_read: Mapping[str, bool]
    kernels: KernelTable = dataclasses.field(repr=False)
    table: Mapping[str, Any] = dataclasses.field(repr=False, compare=False)
    #: the runtime's own op schemas: op -> ((since_version, attribute names), ...) ascending
    #: (``runtime_tables/<runtime>.schemas.json``, ``tools/probe_schemas.py``; empty: attributes not checked)
    op_attributes: Mapping[Op, tuple[tuple[int, frozenset[str]], ...]] = dataclasses.field(
        default_factory=dict, repr=False, compare=False)

    # -- identity ----------------------------------------------------------------------------------------------
    @property
    def label(self) -> str:
        """``onnxruntime-webgpu 1.27.0`` / ``onnxruntime 1.31.1 + onnxruntime-ep-webgpu 0.4.0`` (as probed)."""
        if self.plugin_version:
            return f"onnxruntime {self.onnxruntime_version} + {self.name} {self.plugin_version}"
        return f"{self.name} {self.onnxruntime_version}"

    @property
    def distributions(self) -> tuple[str, ...]:
        return DISTRIBUTIONS[self.name]

    # -- what loads ----------------------------------------------------------------------------------------------
    def knows_op(self, domain: str, op: str) -> bool | None:
        """Whether this onnxruntime has a schema for ``op`` (None: a domain the probe does not cover)."""
        domain = "" if domain == "ai.onnx" else domain
        if domain not in _PROBED_DOMAINS:
            return None
        return (domain, op) in self.known_ops

    def loads_op(self, domain: str, op: str) -> bool:
        """Whether a graph with this op can load at all (the probe's one-node model for it, where there is one)."""
        domain = "" if domain == "ai.onnx" else domain
        probed = self.op_loads.get((domain, op))
        if probed is not None:
            return probed[0]
        return self.knows_op(domain, op) is not False

    def op_error(self, domain: str, op: str) -> str:
        """onnxruntime's load error for an op this runtime does not register."""
        probed = self.op_loads.get((domain, op))
        if probed is not None and probed[1]:
            return probed[1]
        return f"Fatal error: {domain or 'ai.onnx'}:{op}(-1) is not a registered function/op"

    @property
    def gqa_range(self) -> tuple[int, int]:
        return min(self.gqa_inputs), max(self.gqa_inputs)

    def load_problems(self, model: ir.Model, *, ir_version: bool = True) -> list[LoadProblem]:
        """Every reason this runtime would refuse to load ``model``: its IR version (``ir_version=False``: not
        checked, for a graph rope-passes will save with a capped IR version), ops it does not register,
        GroupQueryAttention input counts outside :attr:`gqa_inputs`."""
        problems = []
        if ir_version and (model.ir_version or 0) > self.max_ir_version:
            problems.append(LoadProblem("ir-version", "<model>", "", (
                f"Unsupported model IR version: {model.ir_version}, max supported IR version: {self.max_ir_version}")))
        low, high = self.gqa_range
        for node in graph_walk.nodes(model.graph):
            domain = "" if node.domain in ("", "ai.onnx") else node.domain
            name = node.name or node.op_type
            if not self.loads_op(domain, node.op_type):
                problems.append(LoadProblem("unregistered-op", name, f"{domain}::{node.op_type}",
                                            self.op_error(domain, node.op_type)))
            elif (domain, node.op_type) == (MS, "GroupQueryAttention") and len(node.inputs) not in self.gqa_inputs:
                problems.append(LoadProblem("gqa-inputs", name, f"{MS}::GroupQueryAttention", (
                    f"This is an invalid model. In Node {name!r} (GroupQueryAttention): input size "
                    f"{len(node.inputs)} not in range [min={low}, max={high}]")))
            else:
                unknown = self.unknown_attributes(node, model.opset_imports)
                if unknown:
                    problems.append(LoadProblem("unknown-attribute", name, f"{domain}::{node.op_type}", (
                        f"This is an invalid model. In Node {name!r} ({node.op_type}): Unrecognized attribute: "
                        f"{unknown[0]} for operator {node.op_type}")))
        return problems

    def unknown_attributes(self, node: ir.Node, opsets: Mapping[str, int]) -> list[str]:
        """The attributes of ``node`` its schema in this runtime does not declare (onnxruntime refuses the model:
        "Unrecognized attribute"), for the schema version the model's opset selects; [] where the probe has no
        schema for the op."""
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        versions = self.op_attributes.get((domain, node.op_type))
        if not versions:
            return []
        opset = opsets.get(domain, opsets.get("ai.onnx", 1) if domain == "" else 1)
        chosen = [attrs for since, attrs in versions if since <= opset]
        if not chosen:
            return []
        return sorted(a for a in node.attributes if a not in chosen[-1])

    # -- what it reads -------------------------------------------------------------------------------------------
    def reads_option(self, key: str) -> bool:
        """Whether the probe showed that this runtime's WebGPU EP reads provider option ``key``."""
        return bool(self.options_read.get(key))

    # -- downlevel passes ----------------------------------------------------------------------------------------
    def needs(self, pass_name: str) -> str | None:
        """Why this runtime needs downlevel pass ``pass_name`` (None: it does not; any other pass: None)."""
        rule = DOWNLEVEL.get(pass_name)
        return rule.needed(self) if rule is not None else None

    def downlevel_for(self, model: ir.Model) -> dict[str, str]:
        """The downlevel passes that remove ``model``'s load problems on this runtime: pass name -> the problem."""
        out: dict[str, str] = {}
        for problem in self.load_problems(model):
            for rule in DOWNLEVEL.values():
                if rule.fixes(problem) and rule.needed(self) is not None:
                    out.setdefault(rule.pass_name, problem.message)
        return out

    def skip_reason(self, pass_name: str) -> str | None:
        """Why a preset leaves pass ``pass_name`` out for this runtime (None: it runs): a downlevel pass it does not
        need, a pass whose rewrite only holds with a session option this runtime does not read
        (:data:`OPTION_PASSES`), or one measured not exact on it (:data:`INEXACT_PASSES`)."""
        option = OPTION_PASSES.get(pass_name)
        if option is not None and not self.reads_option(option):
            return (f"not run: {self.label} does not read {option} (probed): a concatenated LongRoPE cache would be "
                    "read from its short rows past the switch")
        inexact = INEXACT_PASSES.get(self.name, {}).get(pass_name)
        if inexact is not None:
            return f"not run: not exact on {self.label}: {inexact}"
        rule = DOWNLEVEL.get(pass_name)
        if rule is None or rule.needed(self) is not None:
            return None
        return rule.not_needed(self)

    def summary(self) -> str:
        low, high = self.gqa_range
        mrope = "loads" if self.loads_op(MS, "MRotaryEmbedding") else "not registered"
        return (f"{self.label}: IR ≤ {self.max_ir_version}, GroupQueryAttention {low}..{high} inputs, "
                f"MRotaryEmbedding {mrope}; probed {self.date}")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "label": self.label, "onnxruntime_version": self.onnxruntime_version,
                "plugin_version": self.plugin_version, "probed": self.date, "max_ir_version": self.max_ir_version,
                "gqa_inputs": list(self.gqa_inputs),
                "mrotary_embedding_loads": self.loads_op(MS, "MRotaryEmbedding"),
                "capture_blockers": dict(self.capture_blockers), "options_read": dict(self.options_read),
                "downlevel_passes": {p: self.needs(p) for p in DOWNLEVEL}}


# ----------------------------------------------------------------------------------------------------------------
# Downlevel passes: each needed by the runtimes that cannot load what it rewrites
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Downlevel:
    """A pass that only makes a graph loadable on a runtime that lacks something; ``needed(t)`` says why, or None."""

    pass_name: str
    needed: Callable[[ProbedRuntime], str | None]
    not_needed: Callable[[ProbedRuntime], str]
    fixes: Callable[[LoadProblem], bool]  # the load problems its rewrite removes


def _mrope_needed(t: ProbedRuntime) -> str | None:
    if t.loads_op(MS, "MRotaryEmbedding"):
        return None
    return f"{MS}::MRotaryEmbedding is not registered in {t.label}"


def _qk_norm_needed(t: ProbedRuntime) -> str | None:
    if 16 in t.gqa_inputs:
        return None
    low, high = t.gqa_range
    return f"{t.label} loads GroupQueryAttention with {low}..{high} inputs only; fused q/k-norm has 16"


DOWNLEVEL: dict[str, Downlevel] = {
    "lower-mrope": Downlevel(
        "lower-mrope", _mrope_needed,
        lambda t: f"not needed: {t.label} loads {MS}::MRotaryEmbedding on WebGPU (probed)",
        lambda p: p.op == f"{MS}::MRotaryEmbedding"),
    "unfuse-gqa-qk-norm": Downlevel(
        "unfuse-gqa-qk-norm", _qk_norm_needed,
        lambda t: (f"not needed: {t.label} loads GroupQueryAttention with {t.gqa_range[0]}..{t.gqa_range[1]} inputs "
                   "(fused q/k-norm left fused; probed)"),
        lambda p: p.kind == "gqa-inputs"),
}


#: passes whose rewrite is exact only on a runtime that reads this WebGPU session option (one value for the whole
#: session); a runtime whose probe shows the option has no effect (onnxruntime-web 1.30) gets the graph unchanged
#: passes measured not exact on one runtime (by ``check --runtime web`` on the shared corpus, tests/test_web_runtime.py):
#: runtime -> pass -> what differs. onnxruntime-web 1.30's GroupQueryAttention with do_rotary=1 places a left-padded
#: row's tokens unlike the explicit rotation it replaces (the five corpus mRoPE folds: 0.36-0.49 on logits in a
#: left-padded batch; the Python runtimes agree to 0); without the fold the same folders are equivalent there
INEXACT_PASSES: dict[str, dict[str, str]] = {
    WEB: {"fold-text-mrope": "its GroupQueryAttention (do_rotary=1) rotates a left-padded row's tokens at other "
                             "positions than the explicit rotation it replaces (measured: 0.36-0.49 on logits)"},
}
OPTION_PASSES: dict[str, str] = {"longrope-concat": "multiRotaryCacheConcatOffset",
                                 "annotate-cache-offset": "multiRotaryCacheConcatOffset"}


# ----------------------------------------------------------------------------------------------------------------
# Loading the tables
# ----------------------------------------------------------------------------------------------------------------


def _op_key(key: str) -> Op:
    domain, _, op = key.partition("::")
    return domain, op


def _clean_error(message: str | None) -> str | None:
    """onnxruntime's error without the probe's temporary file name (``Load model from /tmp/... failed:``)."""
    if message is None:
        return None
    return re.sub(r"^Load model from \S+ failed:\s*", "", message).strip()


def from_table(table: Mapping[str, Any], schemas: Mapping[str, Any] | None = None) -> ProbedRuntime:
    """The target a probed runtime table describes (``tools/probe_runtime.py``'s JSON, schema version 1), with the
    runtime's op schemas (``tools/probe_schemas.py``'s JSON) where given."""
    kernels = KernelTable.from_runtime_table(table)
    newer = table.get("kernels_newer_opset") or {}
    known = {_op_key(k) for section in (table, newer) for part in ("kernels", "no_webgpu_kernel", "unprobed")
             for k in section.get(part, {})}
    op_loads: dict[Op, tuple[bool, str | None]] = {}
    gqa_inputs: tuple[int, ...] = ()
    for name, limit in table.get("op_limits", {}).items():
        if name == "GroupQueryAttention":
            gqa_inputs = tuple(sorted(int(n) for n in limit["accepted_input_counts"]))
            continue
        if "domain" not in limit:
            continue
        op = re.sub(r"\(.*\)$", "", name)  # "RotaryEmbedding(onnx)": the ONNX-domain op of opset 23
        if limit["domain"] == "" and "opset" in limit:
            continue  # loads at its own opset only: the kernel table's newer section says the rest
        op_loads[(limit["domain"], op)] = (bool(limit["loads"]), _clean_error(limit.get("error")))
    if not gqa_inputs:
        raise ValueError(f"runtime table {table.get('runtime')!r} has no GroupQueryAttention input counts")
    blockers = {k: v["on"]["session_error"] for k, v in table.get("capture_blockers", {}).items()
                if v.get("blocks_capture")}
    options: dict[str, bool] = {}
    for key, found in table.get("options_read", {}).items():
        options[key] = bool(found.get("honoured") or found.get("matches_long_cache_reference"))
    vulkan = table.get("adapter", {}).get("vulkan_devices") or []
    return ProbedRuntime(
        name=table["runtime"], onnxruntime_version=table["onnxruntime_version"],
        plugin_version=table.get("plugin_version"), date=str(table.get("date", ""))[:10],
        command=table.get("command", ""), adapter=", ".join(vulkan) or "unknown",
        max_ir_version=int(table["max_ir_version"]), gqa_inputs=gqa_inputs, known_ops=frozenset(known),
        op_loads=op_loads, capture_blockers=blockers, options_read=options, kernels=kernels, table=table,
        op_attributes={_op_key(k): tuple((int(since), frozenset(attrs)) for since, attrs in v)
                       for k, v in (schemas or {}).get("schemas", {}).items()})


@functools.cache
def probed_runtime(name: str) -> ProbedRuntime:
    """The target of runtime ``name`` (a runtime with a probed table: :func:`.descriptors.with_tables`); an
    unknown name is a UsageError."""
    if name not in with_tables():
        raise UsageError(f"unknown runtime {name!r} (choose from: {', '.join(with_tables())})")
    tables = resources.files("rope_passes").joinpath("runtime_tables")
    text = tables.joinpath(f"{name}.json").read_text(encoding="utf-8")
    schemas = tables.joinpath(f"{name}.schemas.json")
    return from_table(json.loads(text), json.loads(schemas.read_text(encoding="utf-8")) if schemas.is_file() else None)


__all__ = ["DOWNLEVEL", "INEXACT_PASSES", "MS", "OPTION_PASSES", "Downlevel", "LoadProblem", "ProbedRuntime",
           "from_table", "probed_runtime"]
