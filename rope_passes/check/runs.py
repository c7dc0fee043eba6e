"""The runs of a check (docs/checker.md, "What runs"), each a :class:`.spec.RunSpec` in its own subprocess unless
``isolate=False``: ``original@cpu`` (the reference), ``original@webgpu``, ``rewritten@webgpu`` (``ep="cpu"``:
``rewritten@cpu`` only), ``rewritten@cpu``, and ``rewritten@webgpu+capture`` when the plan makes the captured run.
Every run but the captured one makes the decode, the schedules its EP takes (:meth:`.plan.CheckPlan.for_ep`) and
the sweep. When the original loads nowhere here and the rewritten graph runs, the original runs on the runtime's
fallback (``original@webgpu:plugin``, ``original@cpu:plugin``).
"""

from __future__ import annotations

from rope_passes.check.backends import backend_for
from rope_passes.check.client_schedules import for_graph
from rope_passes.check.evidence import parts
from rope_passes.check.models import ModelInfo
from rope_passes.check.plan import CheckOptions, CheckPlan
from rope_passes.check.runner import execute_run, run_isolated
from rope_passes.check.spec import LOAD_FAILED, ORIGINAL, REWRITTEN, RunKey, RunResult, RunSpec
from rope_passes.runtime.adapter import AdapterInfo
from rope_passes.runtime.sessions import ALLOW_SOFTWARE_ADAPTER
from rope_passes.runtimes import descriptor


def run_spec(key: RunKey, info: ModelInfo, emb: str | None, plan: CheckPlan, opts: CheckOptions) -> RunSpec:
    """What one run makes: the decode, the schedules its EP takes, the sweep, and every kind of evidence's part
    (:mod:`.evidence`)."""
    ep, capture = key.ep, key.capture
    spec = RunSpec(label=str(key), model=str(info.path), ep=ep, prefill=plan.prefill, steps=plan.steps,
                   genai_config=info.genai_config.data,
                   webgpu_options=dict(info.webgpu_options) if ep == "webgpu" else {},
                   graph_capture=capture, max_length=plan.prefill + plan.steps, dims=dict(opts.dims or {}),
                   embedding=emb, sweep=[] if capture else list(plan.positions),
                   schedules=[] if capture else [for_graph(s, info.loop).spec() for s in plan.for_ep(ep)],
                   schedules_twice=plan.facts.vocab if plan.facts is not None and key.original else 0,
                   vocab=plan.facts.vocab if plan.facts is not None else None)
    spec.parts = parts(plan, spec, info)
    return spec


def execute(spec: RunSpec, opts: CheckOptions, adapter: AdapterInfo | None, python: str | None,
            runtime: str | None = None) -> RunResult:
    """One run, isolated unless ``opts.isolate`` is off (another interpreter always is), with progress."""
    sizes = {"step": spec.steps + 1, "sweep": len(spec.sweep), "schedules": len(spec.schedules)}

    def progress(what: str, k: int) -> None:
        opts.say(spec.label if what == "step" else f"{spec.label} {what}", k, sizes[what])

    progress("step", -1)
    backend = backend_for(runtime, spec)  # a run this process drives (the browser's WebGPU runs: .backends)
    if backend is not None:
        return execute_run(spec, backend, progress)
    if opts.isolate or python:
        env = {ALLOW_SOFTWARE_ADAPTER: "1"} if python and adapter is not None and adapter.software else {}
        return run_isolated(spec, progress, opts.timeout, python=python, env_extra=env, runtime=runtime)
    return execute_run(spec, None, progress)


def all_runs(orig: ModelInfo, rew: ModelInfo, plan: CheckPlan, opts: CheckOptions, adapter: AdapterInfo | None,
             here: str | None, runtime: str, fallback: str | None) -> tuple[list[RunResult], str | None]:
    """Every run (module docstring) and the second runtime's interpreter when the original ran there."""
    ep = opts.ep
    emb_orig, emb_rew = plan.embeddings
    specs = [run_spec(RunKey(ORIGINAL, "cpu"), orig, emb_orig, plan, opts)]
    if ep == "webgpu":
        specs.append(run_spec(RunKey(ORIGINAL, "webgpu"), orig, emb_orig, plan, opts))
    specs.append(run_spec(RunKey(REWRITTEN, ep), rew, emb_rew, plan, opts))
    if ep == "webgpu":
        specs.append(run_spec(RunKey(REWRITTEN, "cpu"), rew, emb_rew, plan, opts))
    if plan.graph_capture:
        specs.append(run_spec(RunKey(REWRITTEN, "webgpu", capture=True), rew, emb_rew, plan, opts))
    runs = []
    for s in specs:
        if opts.reference_python and s.key.original:
            runs.append(execute(s, opts, adapter, opts.reference_python))
        else:
            runs.append(execute(s, opts, adapter, here, runtime))
    by = {r.key: r for r in runs}
    originals = [r for r in runs if r.key.original]
    found = descriptor(runtime)
    other = found.fallback if found is not None else None
    if (not opts.reference_python and fallback and other and not any(r.ok for r in originals)
            and all(r.status == LOAD_FAILED for r in originals) and by[RunKey(REWRITTEN, ep)].ok):
        # the original does not load on this runtime, the rewritten graph does: run it on the runtime's fallback
        eps = ("webgpu", "cpu") if ep == "webgpu" else ("cpu",)
        for e in eps:
            runs.append(execute(run_spec(RunKey(ORIGINAL, e, other), orig, emb_orig, plan, opts), opts, adapter,
                                fallback, other))
        return runs, fallback
    return runs, None


__all__ = ["all_runs", "execute", "run_spec"]
