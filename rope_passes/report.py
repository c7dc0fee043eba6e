"""Structured pass reports: what a pass matched, what it rewrote and what it refused, and why.

Reports are data, printed by the CLI and serialised to JSON; nothing here is parsed from logs.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Protocol, runtime_checkable


class Outcome(str, enum.Enum):
    REWRITTEN = "rewritten"  # matched and rewritten
    REFUSED = "refused"  # matched, but a soundness condition failed: graph left as it was there
    NOT_MATCHED = "not matched"  # the pattern is absent (or not understood)
    NOTE = "note"  # information (e.g. "output serves text prompts only")
    #: rewritten to compute something else than the input did, because the user asked (a config it must follow):
    #: never an ordinary rewrite, never without the request (precompute-cos-sin with --hf-config)
    REPAIRED = "repaired"

    def __str__(self) -> str:
        return self.value


@runtime_checkable
class Named(Protocol):
    """An ``onnx_ir`` node or value, as a finding names it (no onnx_ir import here: reports are light)."""

    @property
    def name(self) -> str | None: ...


#: where a finding is: an IR node or value (named once, by :func:`place_of`), a name already spelled, or None (the
#: model)
Place = Named | str | None


def place_of(target: Place) -> str:
    """The one spelling of a finding's place: a node's name, else its op type; a value's name, else ``"<value>"``;
    ``"<model>"`` for None; a string as it is."""
    if target is None:
        return "<model>"
    if isinstance(target, str):
        return target
    return target.name or getattr(target, "op_type", None) or "<value>"


def name_of(obj: Named | None) -> str:
    """An IR object's own name, ``""`` when it has none: a key or a record's field. A finding's place (a failure's,
    a report's) is the object itself, spelled by :func:`place_of`; never a name spelled beforehand."""
    return (obj.name if obj is not None else None) or ""


class MatchFailure(Exception):
    """Why a pass does not rewrite at one place: the one failure type of every match and every proof.

    Raised by analysis and passes, recorded by :meth:`PassReport.record` (the one place that maps it to an outcome):

    * ``MatchFailure.absent(reason, target)``: the form the pass rewrites is not there (or not understood):
      *not matched*, nothing about the graph is wrong;
    * ``MatchFailure.refuse(reason, target)``: the form is there, but a condition of the proof that the rewrite is
      exact does not hold: *refused*, with the node or value that broke the proof as ``target``.

    In the spirit of onnxscript's ``MatchResult.fail(reason, value)``: ``target`` may be the IR node or value itself
    (kept as :attr:`source`; its name is spelled once, by :func:`place_of`, as :attr:`place`); ``details`` travel
    into the report.
    """

    def __init__(self, outcome: Outcome, reason: str, target: Place = "<model>", **details: Any) -> None:
        super().__init__(reason)
        self.outcome = outcome
        self.reason = reason
        #: the node or value that broke the proof (None where the failure names a place by its name only)
        self.source = None if target is None or isinstance(target, str) else target
        self.place = place_of(target)
        self.details = details

    @classmethod
    def absent(cls, reason: str, target: Place = "<model>", **details: Any) -> MatchFailure:
        return cls(Outcome.NOT_MATCHED, reason, target, **details)

    @classmethod
    def refuse(cls, reason: str, target: Place = "<model>", **details: Any) -> MatchFailure:
        return cls(Outcome.REFUSED, reason, target, **details)

    @property
    def refused(self) -> bool:
        return self.outcome is Outcome.REFUSED


@dataclasses.dataclass
class Finding:
    """One match attempt of a pass at one place of the graph."""

    outcome: Outcome
    place: str  # node name, value name or "<model>" (:func:`place_of`)
    reason: str  # why (for refusals / non-matches) or what was done (for rewrites)
    details: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"outcome": str(self.outcome), "place": self.place, "reason": self.reason, "details": self.details}


@dataclasses.dataclass
class PassReport:
    """Everything one pass did to one model."""

    pass_name: str
    findings: list[Finding] = dataclasses.field(default_factory=list)
    nodes_removed: int = 0
    nodes_added: int = 0
    initializers_removed: int = 0
    initializers_added: int = 0
    genai_config_changes: list[str] = dataclasses.field(default_factory=list)
    metadata_changes: list[str] = dataclasses.field(default_factory=list)
    duration_s: float = 0.0

    # -- recording -------------------------------------------------------------------------------------------
    def rewritten(self, target: Place, what: str, **details: Any) -> None:
        self.findings.append(Finding(Outcome.REWRITTEN, place_of(target), what, details))

    def repaired(self, target: Place, what: str, **details: Any) -> None:
        """The output computes something else than the input, on request: ``what`` says "repaired: the input
        computed X, the output computes Y, because <config> says Z"."""
        self.findings.append(Finding(Outcome.REPAIRED, place_of(target), what, details))

    def refused(self, target: Place, reason: str, **details: Any) -> None:
        self.findings.append(Finding(Outcome.REFUSED, place_of(target), reason, details))

    def not_matched(self, target: Place, reason: str, **details: Any) -> None:
        self.findings.append(Finding(Outcome.NOT_MATCHED, place_of(target), reason, details))

    def note(self, target: Place, text: str, **details: Any) -> None:
        self.findings.append(Finding(Outcome.NOTE, place_of(target), text, details))

    def record(self, failure: MatchFailure, target: Place = None) -> None:
        """Record a :class:`MatchFailure` as refused / not matched (``target`` overrides the failure's own)."""
        place = place_of(target) if target else failure.place
        self.findings.append(Finding(failure.outcome, place, failure.reason, dict(failure.details)))

    # -- reading ---------------------------------------------------------------------------------------------
    def count(self, outcome: Outcome) -> int:
        return sum(1 for f in self.findings if f.outcome is outcome)

    @property
    def matched(self) -> int:
        """Places where the pattern was found (rewritten, repaired or refused)."""
        return self.count(Outcome.REWRITTEN) + self.count(Outcome.REPAIRED) + self.count(Outcome.REFUSED)

    @property
    def modified(self) -> bool:
        return (self.count(Outcome.REWRITTEN) + self.count(Outcome.REPAIRED) > 0 or bool(self.genai_config_changes)
                or bool(self.metadata_changes))

    @property
    def status(self) -> str:
        """One line: ``rewritten 4``, ``rewritten 2, repaired 2``, ``refused: <reason>``, ``not matched: <reason>``."""
        rewritten, refused = self.count(Outcome.REWRITTEN), self.count(Outcome.REFUSED)
        repaired = self.count(Outcome.REPAIRED)
        if rewritten or repaired:
            parts = ([f"rewritten {rewritten}"] if rewritten else []) + ([f"repaired {repaired}"] if repaired else [])
            extra = f", refused {refused}" if refused else ""
            return ", ".join(parts) + extra
        if refused:
            first = next(f for f in self.findings if f.outcome is Outcome.REFUSED)
            return f"refused: {first.reason}"
        if self.genai_config_changes or self.metadata_changes:
            return "updated: " + "; ".join(self.genai_config_changes + self.metadata_changes)
        misses = [f for f in self.findings if f.outcome is Outcome.NOT_MATCHED]
        if misses:
            return f"not matched: {misses[0].reason}"
        return "not matched: nothing to do"

    def to_dict(self) -> dict[str, Any]:
        return {
            "pass": self.pass_name,
            "status": self.status,
            "matched": self.matched,
            "rewritten": self.count(Outcome.REWRITTEN),
            "repaired": self.count(Outcome.REPAIRED),
            "refused": self.count(Outcome.REFUSED),
            "modified": self.modified,
            "nodes_removed": self.nodes_removed,
            "nodes_added": self.nodes_added,
            "initializers_removed": self.initializers_removed,
            "initializers_added": self.initializers_added,
            "genai_config_changes": self.genai_config_changes,
            "metadata_changes": self.metadata_changes,
            "duration_s": round(self.duration_s, 4),
            "findings": [f.to_dict() for f in self.findings],
        }


@dataclasses.dataclass
class PipelineReport:
    """The reports of every pass of one pipeline run, in order."""

    input_path: str
    output_path: str | None
    #: the preset the passes came from (None: an explicit pass list)
    preset: str | None
    passes: list[PassReport] = dataclasses.field(default_factory=list)
    dry_run: bool = False
    #: the output is a byte-for-byte copy of the input (nothing changed, nothing re-serialized)
    copied_verbatim: bool = False
    #: how the input's weights reached the output: "reflink", "link", "copy", "rewrite" (None: none travelled)
    weights: str | None = None
    #: each file of the output against the input's, by bytes: path -> "changed" | "same" | "new" | "removed"
    #: (:attr:`rope_passes.io.SaveResult.files`; {} when nothing was written)
    files: dict[str, str] = dataclasses.field(default_factory=dict)
    #: lint findings the output still has (``rope_passes.lint.remaining_problems``)
    remaining: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: the WebGPU runtime the output is for (``rope_passes.runtimes``), e.g. "onnxruntime-webgpu"
    runtime: str | None = None
    #: preset passes left out because that runtime does not need them: pass name -> why
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    #: ``webgpu-graph``: the output's graph-capture verdict and what genai_config.json got for it
    #: (:func:`rope_passes.pipeline.capture_config`: state, verdict, blockers [{node, why}], config)
    capture: dict[str, Any] | None = None
    #: (model, runtime name, its capture verdict) of the graph the pipeline left, computed there for the placement
    #: guard; not part of the report's output (read it with :meth:`verdict_of`)
    verdict: tuple[Any, str, Any] | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def modified(self) -> bool:
        return any(p.modified for p in self.passes)

    def verdict_of(self, model: Any, runtime: str) -> Any:
        """The pipeline's capture verdict of ``model`` on ``runtime`` if ``model`` is the graph it left (and nothing
        changed it since: the caller's word), else None."""
        if self.verdict is not None and self.verdict[0] is model and self.verdict[1] == runtime:
            return self.verdict[2]
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "input": self.input_path,
            "output": self.output_path,
            "preset": self.preset,
            "runtime": self.runtime,
            "skipped": self.skipped,
            "dry_run": self.dry_run,
            "modified": self.modified,
            "copied_verbatim": self.copied_verbatim,
            "weights": self.weights,
            "files": self.files,
            "remaining": self.remaining,
            "capture": self.capture,
            "passes": [p.to_dict() for p in self.passes],
        }
