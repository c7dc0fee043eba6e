"""Graph lint: rules with a code, message, explanation and fix (``rope-passes lint``).

    from rope_passes.lint import lint_bundle
    for d in lint_bundle("model_dir"):                   # for the runtime installed here
        print(d.code, d.message)
    lint_bundle("model_dir", lint_plan(runtime="onnxruntime-ep-webgpu", hf_config="config.json"))

What a lint run is for (the runtime, the Hugging Face config of the RP4xx rules, and for ``--fix`` the passes' order
and options) is a :class:`rope_passes.plan.RunPlan`, resolved once by the caller (``rope-passes lint`` builds
:func:`rope_passes.plan.lint_plan`). Layering: lint sits above :mod:`rope_passes.pipeline` (``fix_bundle`` runs the
fixing passes) and below :mod:`rope_passes.api` (``optimize`` reports :func:`remaining_problems` of its output).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from rope_passes.analysis.census import census
from rope_passes.io import ModelBundle, load_bundle
from rope_passes.lint import rules as _rules  # noqa: F401  (registers the rules)
from rope_passes.lint import rules_clients as _rules_clients  # noqa: F401  (RP5xx: what stops transformers.js)
from rope_passes.lint import rules_config as _rules_config  # noqa: F401  (RP4xx: graph vs config.json)
from rope_passes.lint import rules_container as _rules_container  # noqa: F401  (RP005, RP006: the model as a file)
from rope_passes.lint import rules_longrope as _rules_longrope  # noqa: F401  (RP206, RP207)
from rope_passes.lint import rules_rotation as _rules_rotation  # noqa: F401  (RP405, RP406: rotation probed)
from rope_passes.lint.core import RULES, Diagnostic, LintContext, Rule, Severity, run_rules
from rope_passes.plan import RunPlan, lint_plan

# The passes and the pipeline (onnxscript's rewriter, onnxruntime for the numeric proofs) are imported by
# ``fix_bundle`` only: linting itself needs onnx_ir and the rules (tests/test_startup.py).


def _context(bundle: ModelBundle, plan: RunPlan) -> LintContext:
    facts = census(bundle.model, bundle.genai_config)
    return LintContext(bundle.model, bundle.genai_config, facts, str(bundle.model_path), plan.runtime, plan.hf_config)


def lint_bundle(path_or_bundle: Any, plan: RunPlan | None = None, select: Iterable[str] | None = None,
                ignore: Iterable[str] = ()) -> list[Diagnostic]:
    """Lint a model file/folder (or a loaded ModelBundle) for ``plan``'s WebGPU runtime (default
    :func:`~rope_passes.plan.lint_plan`: the runtime installed here, the config.json beside the model)."""
    bundle = path_or_bundle if isinstance(path_or_bundle, ModelBundle) else load_bundle(path_or_bundle)
    return run_rules(_context(bundle, plan or lint_plan()), select, ignore)


#: lint findings about the output worth printing after optimize: it will not load / run right, or runs on WebGPU only
AFTER_OPTIMIZE = ("RP002", "RP005", "RP006", "RP101", "RP203", "RP206", "RP301", "RP204", "RP501")


def remaining_problems(bundle: ModelBundle, plan: RunPlan) -> list[dict[str, Any]]:
    """Lint errors (and the WebGPU-only note) the optimized model still has on ``plan``'s runtime, one entry per
    code."""
    seen: dict[str, dict[str, Any]] = {}
    for d in lint_bundle(bundle, plan, select=AFTER_OPTIMIZE):
        entry = seen.setdefault(d.code, {**d.to_dict(), "count": 0})
        entry["count"] += 1
    return list(seen.values())


#: findings ``lint --fix`` fixes in genai_config.json, not with a pass: ``enableGraphCapture`` made to agree with the
#: graph's capture verdict (:func:`rope_passes.pipeline.capture_config`, the ``webgpu-graph`` preset's last step)
CONFIG_FIXES = ("RP221", "RP222")


def _fixes(diagnostics: Iterable[Diagnostic], plan: RunPlan) -> set[str]:
    """The passes of ``plan`` that fix some of ``diagnostics`` with the plan's options (a rule whose fix needs an
    option, RP103's ``--text-only``, counts only where the plan's options for that pass give it)."""
    wanted = set()
    for d in diagnostics:
        if d.fix is None or d.fix not in plan.options:
            continue
        option = RULES[d.code].fix_option if d.code in RULES else None
        if option is None or getattr(plan.options[d.fix], option, False):
            wanted.add(d.fix)
    return wanted


def fix_bundle(path: str, plan: RunPlan | None = None, *, select: Iterable[str] | None = None,
               ignore: Iterable[str] = (), log: Callable[[str], None] = print) -> list[str]:
    """Rewrite ``path`` in place with the passes of ``plan`` (default: ``lint_plan(fix=True)``) that fix its
    diagnostics on the plan's runtime, in the plan's order, then ``cleanup``; returns the passes run.

    Each pass is chosen on the graph the passes before it left, as ``optimize`` runs them: the model is linted again
    after a pass that changed it, so a finding that only the rewritten graph has (RP205's Memcpy once
    ``lower-mrope`` made MRotaryEmbedding loadable) is fixed in the same run, and a second ``--fix`` finds nothing
    more to do (tests/test_lint_fix.py: every corpus folder, bytes compared). Last, as ``optimize --preset
    webgpu-graph`` does, genai_config.json's ``enableGraphCapture`` is made to agree with the graph (RP221, RP222)."""
    from rope_passes.io import write_bundle
    from rope_passes.io.files import describe_files
    from rope_passes.pipeline import capture_config, run_pipeline

    plan = plan or lint_plan(fix=True)
    bundle = load_bundle(path)
    found = run_rules(_context(bundle, plan), select, ignore)
    needs_save = any(d.code == "RP001" for d in found)  # saving is RP001's fix (IR version capped)
    wants_cleanup = "cleanup" in _fixes(found, plan)
    fixing = [n for n in plan.passes if n != "cleanup"]
    ran: list[str] = []
    modified = False
    for index, name in enumerate(fixing):
        if name not in _fixes(found, plan):
            continue
        report = run_pipeline(bundle, plan.only({name}))
        ran.append(name)
        for p in report.passes:
            log(f"{path}: {p.pass_name}: {p.status}")
        if report.modified:
            modified = True
            later = {code for code, r in RULES.items() if r.fix in fixing[index + 1:]}
            chosen = later & set(select) if select else later
            found = run_rules(_context(bundle, plan), chosen, ignore) if chosen else []
    if (ran or wants_cleanup) and "cleanup" in plan.passes:
        report = run_pipeline(bundle, plan.only({"cleanup"}))
        ran.append("cleanup")
        for p in report.passes:
            log(f"{path}: {p.pass_name}: {p.status}")
        modified = modified or report.modified
    config_codes = {code for code in CONFIG_FIXES if (not select or code in set(select)) and code not in set(ignore)}
    if config_codes and run_rules(_context(bundle, plan), config_codes, ignore):
        capture = capture_config(bundle, plan.runtime)
        log(f"{path}: genai_config.json: {capture['config']}")
    if modified or needs_save or bundle.genai_config_changed:
        saved = write_bundle(bundle, None, in_place=True, graph_modified=modified or needs_save)
        log(f"{path}: files: {describe_files(saved.files)}")
    return ran


__all__ = ["AFTER_OPTIMIZE", "RULES", "Diagnostic", "LintContext", "Rule", "Severity", "fix_bundle", "lint_bundle",
           "remaining_problems", "run_rules"]
