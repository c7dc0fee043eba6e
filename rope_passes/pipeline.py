"""Explicit pass order, and the named presets per target and runtime.

Order matters and is written down here, not left to rule discovery: each preset is a list, run first to last,
and ``tests/test_pipeline.py`` pins it. Passes that a preset names but this installation lacks are an error,
not a silent skip.

Presets are per runtime (:mod:`rope_passes.targets`): a *downlevel* pass (:data:`rope_passes.targets.DOWNLEVEL`:
``unfuse-gqa-qk-norm``, ``lower-mrope``) only makes a graph loadable on a runtime that lacks something, so the
preset for a runtime that has it leaves the pass out, and the report says why (:func:`presets_for`,
``PipelineReport.skipped``). :data:`PRESETS` lists every pass a preset may run.

This module runs passes on a loaded bundle; loading, linting the result and saving is :func:`rope_passes.api.optimize`
(a layer above both this module and :mod:`rope_passes.lint`, which runs passes itself in ``fix_bundle``).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import onnx_ir as ir

import rope_passes.graph_walk as graph_walk
from rope_passes.errors import UsageError
from rope_passes.io import ModelBundle
from rope_passes.passes import ALL_PASSES, PassContext, RopePass, RopePassResult
from rope_passes.report import PassReport, PipelineReport
from rope_passes.targets import RUNTIMES, RuntimeTarget, resolve_target

if TYPE_CHECKING:
    from rope_passes.analysis.placement import Placement

#: Target presets, every pass they may run. Later entries may rely on what earlier ones established (documented per
#: pass). Downlevel passes run only for a runtime that needs them: :func:`presets_for`.
PRESETS: dict[str, list[str]] = {
    # unfuse-gqa-qk-norm first: the passes after it read GroupQueryAttention in its standard (<= 14 inputs) form
    # annotate-cache-offset in both: the cache concat offset is one value for the whole session, so one no layer
    # honours is removed (and a concatenated cache without one gets it) whatever the target
    "webgpu": ["unfuse-gqa-qk-norm", "fold-text-mrope", "lower-mrope", "annotate-cache-offset", "cleanup"],
    # narrow-int64 right after total-seq-on-gpu: it reads the placement of the graph the passes before it left
    "webgpu-graph": ["unfuse-gqa-qk-norm", "fold-text-mrope", "lower-mrope", "longrope-concat",
                     "annotate-cache-offset", "total-seq-on-gpu", "narrow-int64", "cleanup"],
    # torch/optimum exports that recompute cos/sin on every call; needs a table size (--max-positions or
    # genai_config model.context_length)
    "exporter": ["precompute-cos-sin", "cleanup"],
}


def skipped_for(target: str, runtime: RuntimeTarget | str | None = None) -> dict[str, str]:
    """The passes of preset ``target`` that ``runtime`` (default: the one installed here) does not need, with why."""
    rt = resolve_target(runtime)
    return {n: why for n in PRESETS.get(target, ()) if (why := rt.skip_reason(n)) is not None}


def presets_for(runtime: RuntimeTarget | str | None = None) -> dict[str, list[str]]:
    """The presets for one runtime: :data:`PRESETS` without the downlevel passes it does not need."""
    rt = resolve_target(runtime)
    return {target: [n for n in names if rt.skip_reason(n) is None] for target, names in PRESETS.items()}


def runtime_presets() -> dict[str, dict[str, list[str]]]:
    """runtime -> target -> ordered pass names, for every runtime with a probed table (``rope-passes passes``)."""
    return {name: presets_for(name) for name in RUNTIMES}


def pass_names_for(target: str | None, passes: Sequence[str] | None,
                   runtime: RuntimeTarget | str | None = None) -> list[str]:
    """Resolve ``--target``/``--passes`` to an ordered list of registered pass names; a preset is the one for
    ``runtime`` (default: the one installed here); ``--passes`` runs exactly what it names."""
    if passes is not None:
        names = [p.strip() for p in passes]
        if not names or "" in names:
            raise UsageError("--passes needs comma-separated pass names, none empty (see: rope-passes passes)")
    else:
        target = target or "webgpu"
        if target not in PRESETS:
            raise UsageError(f"unknown target {target!r} (choose from: {', '.join(PRESETS)})")
        names = presets_for(runtime)[target]
    unknown = [n for n in names if n not in ALL_PASSES]
    if unknown:
        raise UsageError(f"unknown pass {unknown[0]!r} (available: {', '.join(sorted(ALL_PASSES))})")
    return names


def build_passes(names: Sequence[str], context: PassContext, options: dict[str, Any] | None = None,
                 skipped: Sequence[str] = ()) -> list[RopePass]:
    """The pass objects of one run, sharing ``context``; each gets the options it declares.

    An option that no pass of the run takes is a UsageError (a misspelt or misplaced option is never dropped), unless
    a pass of the preset that the runtime leaves out (``skipped``, said in the report) takes it: ``--text-only`` is
    the right option for ``webgpu-graph`` whatever runtime the output is for.
    """
    options = dict(options or {})
    taken = set().union(*(ALL_PASSES[n].option_names() for n in [*names, *skipped])) if names or skipped else set()
    for key in options:
        if key not in taken:
            raise UsageError(f"option {key!r} is not taken by any pass of this run ({', '.join(names)}); "
                             "see: rope-passes passes")
    out = []
    for name in names:
        cls = ALL_PASSES[name]
        out.append(cls(context, **{k: v for k, v in options.items() if k in cls.option_names()}))
    return out


def run_pipeline(
    bundle: ModelBundle,
    *,
    target: str | None = None,
    passes: Sequence[str] | None = None,
    options: dict[str, Any] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    runtime: RuntimeTarget | str | None = None,
) -> PipelineReport:
    """Run the passes on ``bundle.model`` in place; ``bundle.genai_config`` is updated by passes that need to.

    ``runtime``: the WebGPU runtime the output is for (default: the one installed here); it picks the preset's
    passes (:func:`presets_for`) and what the passes predict placement with. ``progress(pass_name, index, total)``
    is called before each pass.
    """
    from rope_passes.analysis.placement import capture_verdict

    rt = resolve_target(runtime)
    names = pass_names_for(target, passes, rt)
    report = PipelineReport(str(bundle.model_path), None, None if passes is not None else (target or "webgpu"))
    report.runtime = rt.name
    if passes is None:
        report.skipped = skipped_for(target or "webgpu", rt)
    context = PassContext(bundle.genai_config, model_path=bundle.model_path, runtime=rt.name)
    pass_objects = build_passes(names, context, options, skipped=list(report.skipped or {}))
    # One capture verdict per graph state: the graph's now, and after each pass that changed it (a pass that changed
    # nothing leaves it as it was). A pass may read the current one once (PassContext.take_verdict); the last one is
    # the output's (PipelineReport.verdict_of).
    verdict = capture_verdict(bundle.model, rt)
    before = PlacementCount.of(verdict)
    # The graph before the next pass, serialized only when a pass is about to run on a state no snapshot holds yet:
    # a pass that changed nothing leaves the graph the snapshot holds.
    snapshot: _Snapshot | None = None
    for index, pass_ in enumerate(pass_objects):
        if progress is not None:
            progress(pass_.name, index, len(pass_objects))
        start = time.perf_counter()
        if snapshot is None:
            snapshot = _Snapshot(bundle.model)
        config_before = copy.deepcopy(bundle.genai_config.data)
        context.verdict = (bundle.model, rt.name, verdict)
        try:
            result = pass_(bundle.model)
        finally:
            context.verdict = None
        bundle.model = result.model
        assert isinstance(result, RopePassResult) and result.report is not None
        pass_report = result.report
        # result.modified: the report says so, or the set of nodes or initializers changed
        if pass_report.modified or result.modified:
            after_verdict = capture_verdict(bundle.model, rt)
            after = PlacementCount.of(after_verdict)
            worse = after.worse_than(before)
            if worse:
                bundle.model = snapshot.restore()
                _restore_config(bundle.genai_config.data, config_before)
                pass_report = _refused_for_placement(pass_report, worse)
                snapshot = None  # the restored model shares the snapshot's protos: a fresh one before the next pass
            else:
                before, verdict, snapshot = after, after_verdict, None
        pass_report.duration_s = time.perf_counter() - start
        report.passes.append(pass_report)
    report.verdict = (bundle.model, rt.name, verdict)
    return report


# ----------------------------------------------------------------------------------------------------------------
# No pass makes placement worse
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PlacementCount:
    """What placement a graph has on one runtime with graph capture on (the static prediction,
    :func:`rope_passes.analysis.placement.capture_verdict`): Memcpy nodes, CPU nodes, nodes it cannot place."""

    loads: bool
    memcpy: tuple[str, ...]
    cpu_nodes: tuple[str, ...]
    unknown: frozenset[str]

    def worse_than(self, before: PlacementCount) -> str | None:
        """Why this placement is worse than ``before`` (more Memcpy or more CPU nodes), or None. Counts are compared
        only where they are exact: both graphs load and the static rules place every node of both (with nodes they
        cannot place, the counts are lower bounds: a pass that makes a node placeable can raise them while onnxruntime
        counts fewer, as precompute-cos-sin on the torch exports does)."""
        if not (self.loads and before.loads) or self.unknown or before.unknown:
            return None
        parts = []
        if len(self.memcpy) > len(before.memcpy):
            new = sorted(set(self.memcpy) - set(before.memcpy))
            parts.append(f"Memcpy {len(before.memcpy)}→{len(self.memcpy)}" + (f" (new: {', '.join(new[:3])})"
                                                                            if new else ""))
        if len(self.cpu_nodes) > len(before.cpu_nodes):
            new = sorted(set(self.cpu_nodes) - set(before.cpu_nodes))
            parts.append(f"CPU nodes {len(before.cpu_nodes)}→{len(self.cpu_nodes)}"
                         + (f" (new: {', '.join(new[:3])})" if new else ""))
        return "; ".join(parts) or None

    @classmethod
    def of(cls, p: Placement) -> PlacementCount:
        """The counts of a :func:`~rope_passes.analysis.placement.capture_verdict`."""
        return cls(p.loads, tuple(f"{m.kind} on {m.tensor!r}" for m in p.memcpy), tuple(p.cpu_nodes),
                   frozenset(p.unknown))


def placement_count(model: ir.Model, runtime: RuntimeTarget) -> PlacementCount:
    """The :class:`PlacementCount` of ``model`` on ``runtime`` (capture on: the setting ``webgpu-graph`` is for)."""
    from rope_passes.analysis.placement import capture_verdict

    return PlacementCount.of(capture_verdict(model, runtime))


class _Snapshot:
    """The graph before a pass, to roll the pass back: its structure serialized, every tensor by reference. External
    weights are references already; in-memory initializers (the tables passes add, ~16-50 MB) are held as the same
    objects, not copied into the proto (a pass makes new tensors, it never writes into one)."""

    def __init__(self, model: ir.Model) -> None:
        self.base_dirs = {name: v.const_value.base_dir for name, v in model.graph.initializers.items()
                          if isinstance(v.const_value, ir.ExternalTensor)}
        #: (index of the graph in graph_walk.graphs order, initializer name, its tensor) for each one held
        self.held: list[tuple[int, str, ir.TensorProtocol]] = []
        placed: list[tuple[ir.Value, ir.TensorProtocol]] = []
        for index, graph in enumerate(graph_walk.graphs(model)):
            for name, value in graph.initializers.items():
                tensor = value.const_value
                if tensor is None or isinstance(tensor, ir.ExternalTensor) or tensor.dtype == ir.DataType.STRING:
                    continue
                self.held.append((index, name, tensor))
                placed.append((value, tensor))
                # in the proto: a reference that names no file (never read; restore() puts the tensor back)
                value.const_value = ir.ExternalTensor(_HELD, offset=0, length=tensor.nbytes, dtype=tensor.dtype,
                                                      shape=ir.Shape(tensor.shape.numpy()), name=name)
        try:
            self.proto = ir.serde.serialize_model(model)
        finally:
            for value, tensor in placed:
                value.const_value = tensor

    def restore(self) -> ir.Model:
        """The model as it was (a new object; in-memory initializers: the objects it had)."""
        model = ir.serde.deserialize_model(self.proto)
        dirs = set(self.base_dirs.values())
        if len(dirs) == 1:  # every tensor, subgraphs and attributes included
            ir.external_data.set_base_dir(model.graph, dirs.pop())
        for name, v in model.graph.initializers.items():
            if isinstance(v.const_value, ir.ExternalTensor) and name in self.base_dirs:
                v.const_value.base_dir = self.base_dirs[name]
        graphs = list(graph_walk.graphs(model))
        for index, name, tensor in self.held:
            value = graphs[index].initializers[name]
            assert isinstance(value.const_value, ir.ExternalTensor) and str(value.const_value.location) == _HELD
            value.const_value = tensor
        return model


#: the location of a held tensor's stand-in in a snapshot's proto
_HELD = "rope-passes-snapshot-held-tensor"


def _restore_config(config: dict[str, Any] | None, saved: dict[str, Any] | None) -> None:
    """Put the shared genai_config dict back as it was before a pass (in place: every pass holds it)."""
    if config is not None and saved is not None:
        config.clear()
        config.update(saved)


def _refused_for_placement(done: PassReport, why: str) -> PassReport:
    """The report of a pass rolled back because it made placement worse: one refusal with the reason."""
    out = PassReport(done.pass_name)
    out.refused("<model>", f"refused for this model: its rewrite makes WebGPU placement worse ({why}); its changes "
                "were rolled back", rolled_back=[f"{f.outcome} {f.target}" for f in done.findings
                                                 if str(f.outcome) in ("rewritten", "repaired")][:10])
    return out
