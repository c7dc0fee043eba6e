"""Lint rules: each has a code, a name, a message, an explanation and (where one exists) a fix.

A rule is a function from a :class:`LintContext` to diagnostics, registered with :func:`rule`. A fix is the name of
a rope-passes pass: ``rope-passes lint --fix`` runs the passes that fix what was found, in pipeline order, and
lints again.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import onnx_ir as ir

from rope_passes.config import GenaiConfig
from rope_passes.report import Place, place_of
from rope_passes.runtimes.probed import LoadProblem, ProbedRuntime

T = TypeVar("T")

if TYPE_CHECKING:
    from rope_passes.analysis.census import RopeCensus


class Severity(str, enum.Enum):
    ERROR = "error"  # the model will not load or computes wrong results on the target
    WARNING = "warning"  # it runs, but a documented target feature (graph capture) is blocked or degraded
    NOTE = "note"  # something a user should know (e.g. WebGPU-only output)

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass
class Diagnostic:
    code: str
    severity: Severity
    message: str
    target: str  # node or value name, or "<model>"
    fix: str | None = None  # pass name that fixes it
    #: the option that pass needs to fix it, as the command line spells it ("--text-only"), or ""
    fix_flag: str = ""

    @property
    def fix_command(self) -> str:
        """``fold-text-mrope --text-only``: the pass and the option it needs (``""`` without a fix)."""
        return f"{self.fix} {self.fix_flag}".strip() if self.fix else ""

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "severity": str(self.severity), "message": self.message, "target": self.target,
                "fix": self.fix, "fix_flag": self.fix_flag}


@dataclasses.dataclass
class LintContext:
    model: ir.Model
    genai_config: GenaiConfig
    census: RopeCensus | None
    path: str
    #: the WebGPU runtime the model is linted for (the plan's, :attr:`rope_passes.plan.RunPlan.runtime`)
    runtime: ProbedRuntime
    #: the Hugging Face config.json the user named (``--hf-config``; None: the one beside the model)
    hf_config: str | None = None
    #: evidence several rules share, computed once per context (:meth:`memo`)
    _memo: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def memo(self, key: str, compute: Callable[[], T]) -> T:
        """``compute()``, once per context for ``key``: the evidence rules that word it differently share (RP401-RP403
        one config evaluation, RP208/RP209 one session proof, RP405/RP406 one rotation probe)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    @functools.cached_property
    def load_problems(self) -> list[LoadProblem]:
        """The runtime's load problems with this model (one graph walk for the four rules that read them)."""
        return self.runtime.load_problems(self.model)


@dataclasses.dataclass(frozen=True)
class Rule:
    code: str
    name: str
    severity: Severity
    summary: str
    explanation: str
    fix: str | None
    #: yields (target, message): the target a node or value (named once, by rope_passes.report.place_of) or a name
    check: Callable[[LintContext], Iterable[tuple[Place, str]]]
    #: the option of the ``fix`` pass without which it does not fix this finding (``text_only``: the fold of 3-D
    #: positions is the user's decision); ``lint --fix`` runs the pass for it only when the option is given
    fix_option: str | None = None

    @property
    def fix_flag(self) -> str:
        return f"--{self.fix_option.replace('_', '-')}" if self.fix_option else ""


RULES: dict[str, Rule] = {}


def rule(code: str, name: str, severity: Severity, summary: str, explanation: str, fix: str | None = None,
         fix_option: str | None = None):
    """Register ``check(ctx) -> Iterable[(target, message)]`` as a lint rule (``fix``: the pass that fixes it;
    ``fix_option``: the option that pass needs for it, see :attr:`Rule.fix_option`)."""

    def register(check: Callable[[LintContext], Iterable[tuple[Place, str]]]):
        if code in RULES:
            raise ValueError(f"duplicate lint rule code {code}")
        RULES[code] = Rule(code, name, severity, summary, " ".join(explanation.split()), fix, check, fix_option)
        return check

    return register


def run_rules(ctx: LintContext, select: Iterable[str] | None = None, ignore: Iterable[str] = ()) -> list[Diagnostic]:
    selected = set(select) if select else set(RULES)
    out = []
    for code in sorted(RULES):
        r = RULES[code]
        if code not in selected or code in set(ignore):
            continue
        for target, message in r.check(ctx):
            out.append(Diagnostic(code, r.severity, message, place_of(target), r.fix, r.fix_flag))
    return out
