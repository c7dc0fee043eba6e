"""The base of every rope-passes pass: the context it reads, its typed options, and its report.

A pass is an ``onnx_ir.passes.InPlacePass`` (drop it into any onnx_ir ``PassManager``) that also fills a
:class:`~rope_passes.report.PassReport`: what it matched, rewrote and refused, and why. Subclasses implement
:meth:`RopePass.apply`; counting nodes/initializers added and removed is done here, once, for all of them.

**Context.** What travels with the model (its ``genai_config.json``, as a typed :class:`~rope_passes.config.GenaiConfig`)
reaches a pass through one :class:`PassContext` object given to its constructor. Passes of one run share the same
context, so a change one pass makes to the config is what the next pass reads, inside our pipeline and inside a
plain onnx_ir ``PassManager`` alike::

    ctx = PassContext.for_model("model_dir")          # reads model_dir/genai_config.json if present
    manager = ir.passes.PassManager([FoldTextMRoPEPass(ctx, text_only=True), CleanupPass(ctx)])
    manager(model); ctx.genai_config.dumps()

**Options.** A pass declares its options as a frozen dataclass (``options_type``): names, types, defaults and a
one-line help each (``rope-passes passes`` prints them). ``MyPass(ctx, text_only=True)`` validates them: an unknown
name or a wrong type is a :class:`~rope_passes.errors.UsageError` naming the pass.

**Contracts.** Every pass carries its post-conditions (:mod:`rope_passes.passes._contracts`): its output is a valid
model where its input was one (IR version and opsets kept, every added node within its schema at the model's opsets,
onnxruntime CPU loads it wherever it loaded the input) and its WebGPU placement is not worse. :meth:`RopePass.call`
checks them after :meth:`RopePass.apply`; when one does not hold, the model and ``genai_config.json`` are put back as
the pass received them and the report holds one refusal with the reason. They run in :meth:`RopePass.call`, so a plain
onnx_ir ``PassManager`` gets them as our pipeline does.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import time
import types
import typing
from pathlib import Path
from typing import Any, ClassVar

import onnx_ir as ir

import rope_passes.graph_walk as graph_walk
from rope_passes.config import GenaiConfig
from rope_passes.errors import UsageError
from rope_passes.passes._contracts import PlacementCount, refused_for_invalid, refused_for_placement
from rope_passes.passes._snapshot import Snapshot
from rope_passes.proofs.validity import Baseline, validity_errors
from rope_passes.report import MatchFailure, PassReport
from rope_passes.runtime.loads import cpu_load_error
from rope_passes.runtimes.choose import resolve
from rope_passes.runtimes.probed import ProbedRuntime


@dataclasses.dataclass
class PassContext:
    """What the passes of one run read and write besides the model itself."""

    genai_config: GenaiConfig = dataclasses.field(default_factory=GenaiConfig)
    #: the model file (or folder) the model was read from, when known: what else travels beside it (config.json)
    model_path: Path | None = None
    #: the WebGPU runtime the output is for (:mod:`rope_passes.runtimes`; by default the one installed here: a run
    #: of our pipeline gives its plan's, :attr:`rope_passes.plan.RunPlan.runtime`)
    runtime: ProbedRuntime = dataclasses.field(default_factory=resolve)
    #: (model, runtime name, its capture verdict): set by the pipeline just before a pass runs, from the verdict it
    #: already computed for that graph state; read it with :meth:`take_verdict`
    verdict: tuple[ir.Model, str, Any] | None = dataclasses.field(default=None, repr=False, compare=False)
    #: (model, a snapshot of it as it is now): set by the pipeline just before a pass runs when it holds one of this
    #: graph state (a pass that changed nothing leaves the snapshot taken before it valid); taken by the pass
    snapshot: tuple[ir.Model, Snapshot] | None = dataclasses.field(default=None, repr=False, compare=False)

    @classmethod
    def for_model(cls, path: str | os.PathLike) -> PassContext:
        """The context of a model file or folder: the ``genai_config.json`` beside it, if any."""
        p = Path(path)
        return cls(GenaiConfig.load(p if p.is_dir() else p.parent), model_path=p)

    def take_verdict(self, model: ir.Model, runtime: str) -> Any:
        """The pipeline's capture verdict (:func:`rope_passes.analysis.placement.capture_verdict`) of ``model`` as
        the pass received it, or None (outside the pipeline, another model or runtime, or already taken). Taken
        once: after the pass changes the graph it no longer holds, so a second call is None."""
        held, self.verdict = self.verdict, None
        if held is not None and held[0] is model and held[1] == runtime:
            return held[2]
        return None

    def peek_verdict(self, model: ir.Model, runtime: str) -> Any:
        """The pipeline's capture verdict of ``model`` as the pass received it, without taking it (the contracts
        read it; the pass itself may still take it)."""
        held = self.verdict
        return held[2] if held is not None and held[0] is model and held[1] == runtime else None

    def take_snapshot(self, model: ir.Model) -> Snapshot | None:
        """The pipeline's snapshot of ``model`` as it is now, or None; taken once."""
        held, self.snapshot = self.snapshot, None
        return held[1] if held is not None and held[0] is model else None


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """A pass without options."""


def option(default: Any, help: str, *, positive: bool = False) -> Any:
    """A pass option: its default and one line of help (shown by ``rope-passes passes``).

    ``positive``: a number that must be > 0 when given.
    """
    return dataclasses.field(default=default, metadata={"help": help, "positive": positive})


@dataclasses.dataclass(frozen=True)
class OptionInfo:
    name: str
    type: str
    default: Any
    help: str


def _type_ok(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, annotation) if isinstance(annotation, type) else True


def _type_name(annotation: Any) -> str:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(annotation))
    return "None" if annotation is type(None) else getattr(annotation, "__name__", str(annotation))


@dataclasses.dataclass
class RopePassResult(ir.passes.PassResult):
    """``PassResult`` plus the pass's report."""

    report: PassReport | None = None
    #: the capture verdict of the output on the run's runtime, when the placement contract computed it
    verdict: Any = None
    #: a snapshot of the output, when the one taken before the pass still holds (the pass changed nothing)
    snapshot: Snapshot | None = None


class RopePass(ir.passes.InPlacePass):
    #: The name used on the command line (``--passes fold-text-mrope``).
    name: ClassVar[str] = ""
    #: One line for ``rope-passes passes`` and the docs.
    summary: ClassVar[str] = ""
    #: The pass's options (a frozen dataclass whose fields are made with :func:`option`).
    options_type: ClassVar[type] = NoOptions

    #: the pass's validated options (an ``options_type`` instance)
    options: Any

    def __init__(self, context: PassContext | None = None) -> None:
        """A pass with options declares its own typed keywords (``FoldTextMRoPEPass(ctx, text_only=True)``, checked
        by mypy at the call site) and sets :attr:`options` with :meth:`make_options`; their names, types and
        defaults are its ``options_type``'s (tests/test_registry.py)."""
        super().__init__()
        self.context = context if context is not None else PassContext()
        self.options = self.make_options()
        self.report = PassReport(self.name)

    @classmethod
    def with_options(cls, context: PassContext, options: Any) -> RopePass:
        """The pass with an already validated ``options_type`` instance (a :class:`rope_passes.plan.RunPlan`'s)."""
        if not isinstance(options, cls.options_type):
            raise TypeError(f"{cls.name}: options must be a {cls.options_type.__name__}, not {options!r}")
        made = cls(context)
        made.options = options
        return made

    # -- options ---------------------------------------------------------------------------------------------
    @classmethod
    def option_infos(cls) -> list[OptionInfo]:
        hints = typing.get_type_hints(cls.options_type)
        return [OptionInfo(f.name, _type_name(hints[f.name]), f.default, f.metadata.get("help", ""))
                for f in dataclasses.fields(cls.options_type)]

    @classmethod
    def option_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls.options_type)}

    @classmethod
    def make_options(cls, **options: Any) -> Any:
        """The validated options object; UsageError naming the pass for an unknown name or a wrong type."""
        known = cls.option_names()
        for key in options:
            if key not in known:
                takes = ", ".join(sorted(known)) or "no options"
                raise UsageError(f"{cls.name}: unknown option {key!r} (it takes: {takes})")
        hints = typing.get_type_hints(cls.options_type)
        fields = {f.name: f for f in dataclasses.fields(cls.options_type)}
        for key, value in options.items():
            positive = fields[key].metadata.get("positive")
            if not _type_ok(value, hints[key]) or (positive and value is not None and value <= 0):
                what = "a positive integer" if positive else _type_name(hints[key])
                raise UsageError(f"{cls.name}: {key} must be {what}, not {value!r}")
        return cls.options_type(**options)

    # -- running ---------------------------------------------------------------------------------------------
    @property
    def genai_config(self) -> GenaiConfig:
        return self.context.genai_config

    def apply(self, model: ir.Model, report: PassReport) -> None:
        """Match and rewrite ``model`` in place, recording every match, rewrite and refusal in ``report``.

        A :class:`~rope_passes.report.MatchFailure` escaping ``apply`` is recorded for the whole model.
        """
        raise NotImplementedError

    def call(self, model: ir.Model) -> RopePassResult:
        report = PassReport(self.name)
        self.report = report
        nodes_before = _node_ids(model)
        inits_before = set(model.graph.initializers)
        snapshot = self.context.take_snapshot(model) or Snapshot(model)
        config_before = copy.deepcopy(self.context.genai_config.data)
        runtime = resolve(self.context.runtime)
        verdict = self.context.peek_verdict(model, runtime.name)
        baseline = Baseline.of(model, lambda: cpu_load_error(snapshot.proto))
        start = time.perf_counter()
        escaped = None
        rolled = False
        kept: Snapshot | None = None
        try:
            self.apply(model, report)
        except MatchFailure as failure:
            escaped = failure
        changed = _node_ids(model) != nodes_before or set(model.graph.initializers) != inits_before
        if escaped is not None:  # a refusal leaves the model as the pass received it, whatever it had begun
            if changed or report.modified:
                self._roll_back(model, snapshot, config_before)
                rolled = True
                report = _only_refusal(report)
            report.record(escaped)
        elif report.modified or changed:
            # the output's snapshot: what the load contract loads, and the next pass's roll-back point
            output = Snapshot(model)
            problems = validity_errors(model, baseline, lambda: cpu_load_error(output.proto))
            if problems:
                self._roll_back(model, snapshot, config_before)
                rolled = True
                report = refused_for_invalid(report, problems)
            else:
                from rope_passes.analysis.placement import capture_verdict

                if verdict is None:
                    verdict = capture_verdict(snapshot.restore(), runtime)
                after = capture_verdict(model, runtime)
                worse = PlacementCount.of(after).worse_than(PlacementCount.of(verdict))
                if worse:
                    self._roll_back(model, snapshot, config_before)
                    rolled = True
                    report = refused_for_placement(report, worse)
                else:
                    verdict, kept = after, output
        self.report = report
        report.duration_s = time.perf_counter() - start
        if rolled:  # the same graph as before (new objects): nothing added or removed
            modified = False
        else:
            nodes_after = _node_ids(model)
            inits_after = set(model.graph.initializers)
            report.nodes_removed = len(nodes_before - nodes_after)
            report.nodes_added = len(nodes_after - nodes_before)
            report.initializers_removed = len(inits_before - inits_after)
            report.initializers_added = len(inits_after - inits_before)
            modified = report.modified or nodes_before != nodes_after or inits_before != inits_after
        if not modified and not rolled:
            kept = snapshot
        return RopePassResult(model, modified, report, verdict, kept)

    def _roll_back(self, model: ir.Model, snapshot: Snapshot, config: dict[str, Any] | None) -> None:
        """Put the model and the shared genai_config dict back as the pass received them (in place: the caller holds
        both objects)."""
        snapshot.restore_into(model)
        data = self.context.genai_config.data
        if data is not None and config is not None:
            data.clear()
            data.update(config)


def _only_refusal(done: PassReport) -> PassReport:
    """A report rolled back to its findings that changed nothing (the refusal that escaped is recorded after)."""
    out = PassReport(done.pass_name)
    out.findings = [f for f in done.findings if str(f.outcome) not in ("rewritten", "repaired")]
    return out


def _node_ids(model: ir.Model) -> set[int]:
    return {id(node) for node in graph_walk.nodes(model.graph)}
