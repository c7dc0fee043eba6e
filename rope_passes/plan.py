"""The run, resolved once at the edge: a frozen :class:`RunPlan` built by :func:`make_plan`, handed down unchanged.

A run is a *preset* (an ordered pass list, :data:`PRESETS`) or an explicit pass list, for one WebGPU *runtime*
(:class:`rope_passes.runtimes.probed.ProbedRuntime`), with each pass's typed options and the Hugging Face config the user
named (``--hf-config``). The command line validates its arguments by building the plan (one usage error, before any
model is read); :func:`rope_passes.api.optimize`, :func:`rope_passes.pipeline.run_pipeline` and
:func:`rope_passes.lint.fix_bundle` take the plan and never decide a runtime, a preset or an option again::

    plan = make_plan(preset="webgpu-graph", options={"text_only": True}, runtime="onnxruntime-webgpu")
    plan.passes        # ('unfuse-gqa-qk-norm', 'fold-text-mrope', ...): the preset for that runtime
    plan.skipped       # preset passes the runtime does not need, with why
    plan.options       # {'fold-text-mrope': FoldTextMRoPEOptions(text_only=True, max_positions=None)}

Order matters and is written down here, not left to rule discovery: each preset is a list, run first to last,
and ``tests/test_pipeline.py`` pins it. Presets are per runtime: a *downlevel* pass (:data:`rope_passes.runtimes.probed.DOWNLEVEL`)
only makes a graph loadable on a runtime that lacks something, so the preset for a runtime that has it leaves the
pass out, and the report says why (:func:`presets_for`). :data:`PRESETS` lists every pass a preset may run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rope_passes.errors import UsageError
from rope_passes.runtimes.choose import resolve
from rope_passes.runtimes.installed import RUNTIMES
from rope_passes.runtimes.probed import ProbedRuntime

if TYPE_CHECKING:
    from rope_passes.passes import PassContext, RopePass

# The pass registry (rope_passes.passes: onnxscript, the proofs) is imported only to plan passes: a lint run without
# --fix plans none, and imports what linting needs only (tests/test_startup.py).

#: Presets, every pass they may run. Later entries may rely on what earlier ones established (documented per pass).
#: Downlevel passes run only for a runtime that needs them: :func:`presets_for`.
PRESETS: dict[str, list[str]] = {
    # unfuse-gqa-qk-norm first: the passes after it read GroupQueryAttention in its standard (<= 14 inputs) form
    # annotate-cache-offset in both: the cache concat offset is one value for the whole session, so one no layer
    # honours is removed (and a concatenated cache without one gets it) whatever the preset
    "webgpu": ["unfuse-gqa-qk-norm", "fold-text-mrope", "lower-mrope", "annotate-cache-offset", "cleanup"],
    # narrow-int64 right after total-seq-on-gpu: it reads the placement of the graph the passes before it left
    "webgpu-graph": ["unfuse-gqa-qk-norm", "fold-text-mrope", "lower-mrope", "longrope-concat",
                     "annotate-cache-offset", "total-seq-on-gpu", "narrow-int64", "cleanup"],
    # torch/optimum exports that recompute cos/sin on every call; needs a table size (--max-positions or
    # genai_config model.context_length)
    "exporter": ["precompute-cos-sin", "cleanup"],
}
#: the preset of a run that names neither a preset nor passes
DEFAULT_PRESET = "webgpu"


def pass_order() -> tuple[str, ...]:
    """Every registered pass, in the order passes are applied when a run picks them by need (``lint --fix``):
    the registry's (:data:`rope_passes.passes.ALL_PASSES`), which is the ``webgpu-graph`` order with
    ``precompute-cos-sin`` before ``cleanup``, which always comes last (tests/test_pipeline.py)."""
    from rope_passes.passes import ALL_PASSES

    return tuple(ALL_PASSES)


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """One run, resolved: see the module docstring. Build it with :func:`make_plan`."""

    #: the preset the passes come from (None: an explicit pass list)
    preset: str | None
    #: the WebGPU runtime the output is for
    runtime: ProbedRuntime
    #: the passes, in order
    passes: tuple[str, ...]
    #: pass name -> its validated options (an instance of the pass's ``options_type``), for every pass of the run
    options: Mapping[str, Any]
    #: preset passes this runtime leaves out: pass name -> why (empty for an explicit pass list)
    skipped: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: the Hugging Face config.json the user named (``--hf-config``; None: the one beside each model)
    hf_config: str | None = None
    #: whether the caller named the runtime (else it is the one installed here)
    runtime_given: bool = False

    def build(self, context: PassContext) -> list[RopePass]:
        """The pass objects of the run, sharing ``context``, each with its options."""
        from rope_passes.passes import ALL_PASSES

        return [ALL_PASSES[name].with_options(context, self.options[name]) for name in self.passes]

    def only(self, names: set[str] | frozenset[str]) -> RunPlan:
        """The same run with only the plan's passes that are in ``names``, in the plan's order: what ``lint --fix``
        runs for the findings of one model. Options and runtime are the plan's; nothing is resolved again."""
        kept = tuple(n for n in self.passes if n in names)
        return dataclasses.replace(self, preset=None, passes=kept, skipped={},
                                   options={n: self.options[n] for n in kept})


def make_plan(preset: str | None = None, passes: Sequence[str] | None = None, *,
              options: Mapping[str, Any] | None = None, runtime: ProbedRuntime | str | None = None,
              hf_config: str | None = None) -> RunPlan:
    """The one place a run is resolved: ``preset`` (default :data:`DEFAULT_PRESET`) or ``passes`` (run exactly as
    named), for ``runtime`` (a name; None: the one installed here), with ``options`` (option name -> value, each
    given to every pass of the run that takes it) and ``hf_config`` (``--hf-config``: given to the passes that take
    it, and read by lint's RP4xx rules).

    UsageError (one line) for an unknown preset or pass, an empty pass name, an option no pass of the run takes
    (unless a preset pass the runtime leaves out takes it: ``--text-only`` is right for ``webgpu-graph`` whatever
    runtime the output is for), or an option of the wrong type.
    """
    from rope_passes.passes import ALL_PASSES

    target = resolve(runtime)
    if passes is not None:
        names = [p.strip() for p in passes]
        if not names or "" in names:
            raise UsageError("--passes needs comma-separated pass names, none empty (see: rope-passes passes)")
        preset = None
        skipped: dict[str, str] = {}
    else:
        preset = preset or DEFAULT_PRESET
        if preset not in PRESETS:
            raise UsageError(f"unknown preset {preset!r} (choose from: {', '.join(PRESETS)})")
        skipped = {n: why for n in PRESETS[preset] if (why := target.skip_reason(n)) is not None}
        names = [n for n in PRESETS[preset] if n not in skipped]
    unknown = [n for n in names if n not in ALL_PASSES]
    if unknown:
        raise UsageError(f"unknown pass {unknown[0]!r} (available: {', '.join(sorted(ALL_PASSES))})")
    given = dict(options or {})
    if hf_config is not None:
        given["hf_config"] = str(hf_config)
    explicit_hf = given.get("hf_config")
    taken = set().union(*(ALL_PASSES[n].option_names() for n in [*names, *skipped]))
    for key in given:
        if key not in taken:
            raise UsageError(f"option {key!r} is not taken by any pass of this run ({', '.join(names)}); "
                             "see: rope-passes passes")
    typed = {}
    for name in names:
        cls = ALL_PASSES[name]
        typed[name] = cls.make_options(**{k: v for k, v in given.items() if k in cls.option_names()})
    return RunPlan(preset, target, tuple(names), typed, skipped,
                   None if explicit_hf is None else str(explicit_hf), runtime is not None)


def lint_plan(*, fix: bool = False, options: Mapping[str, Any] | None = None,
              runtime: ProbedRuntime | str | None = None, hf_config: str | None = None,
              preset: str | None = None) -> RunPlan:
    """The plan of ``rope-passes lint``: the runtime it lints for and the config its RP4xx rules read; with ``fix``,
    every pass in :func:`pass_order` (or ``preset``'s, for that runtime) with its ``options``, of which
    ``fix_bundle`` runs the ones a model's findings name (:meth:`RunPlan.only`). Without ``fix`` no pass is planned
    (``options`` and ``preset`` are not read)."""
    if fix and preset is not None:
        return make_plan(preset, options=options, runtime=runtime, hf_config=hf_config)
    if fix:
        return make_plan(passes=pass_order(), options=options, runtime=runtime, hf_config=hf_config)
    return RunPlan(None, resolve(runtime), (), {}, {}, None if hf_config is None else str(hf_config),
                   runtime is not None)


def presets_for(runtime: ProbedRuntime | str | None = None) -> dict[str, list[str]]:
    """The presets for one runtime: :data:`PRESETS` without the passes it leaves out (``rope-passes passes``)."""
    target = resolve(runtime)
    return {preset: [n for n in names if target.skip_reason(n) is None] for preset, names in PRESETS.items()}


def skipped_for(preset: str, runtime: ProbedRuntime | str | None = None) -> dict[str, str]:
    """The passes of ``preset`` that ``runtime`` leaves out, with why (``rope-passes passes``)."""
    target = resolve(runtime)
    return {n: why for n in PRESETS.get(preset, ()) if (why := target.skip_reason(n)) is not None}


def runtime_presets() -> dict[str, dict[str, list[str]]]:
    """runtime -> preset -> ordered pass names, for every runtime with a probed table (``rope-passes passes``)."""
    return {name: presets_for(name) for name in RUNTIMES}


__all__ = ["DEFAULT_PRESET", "PRESETS", "RunPlan", "lint_plan", "make_plan", "pass_order", "presets_for",
           "runtime_presets", "skipped_for"]
