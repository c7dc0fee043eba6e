"""From the comparisons (:mod:`.evidence`) to a verdict with its one-line reason, the notes the runs leave, and the
reference the rewritten graph was compared with, in one line (:func:`decide`).

When the original does not load on onnxruntime-webgpu 1.27 but on the second WebGPU runtime (onnxruntime + the
``onnxruntime-ep-webgpu`` plugin EP, run in its own interpreter: :mod:`rope_passes.runtimes.installed`), its runs
there (``original@webgpu:plugin``, ``original@cpu:plugin``) are the references.
"""

from __future__ import annotations

from rope_passes.check.compare import Comparison
from rope_passes.check.evidence import Evidence, ran
from rope_passes.check.report import COULD_NOT_RUN, EQUIVALENT, EQUIVALENT_TABLES_ONLY, NOT_EQUIVALENT
from rope_passes.check.spec import CRASHED, NOT_RUN, NOT_STARTED, OK, ORIGINAL, REWRITTEN, RUN_FAILED, TIMED_OUT, RunKey


def _short(reason: str) -> str:
    text = reason.split("failed:", 1)[1].strip() if "failed:" in reason else reason
    return text if len(text) <= 200 else text[:197] + "..."


def _capture_note(ev: Evidence) -> None:
    """With ``--graph-capture``: the one home's static capture verdict of the rewritten graph
    (:func:`rope_passes.analysis.placement.capture_verdict`, what optimize, inspect and lint say) beside what the
    captured run did, and loudly where the two disagree (a bug in the static rules: please report it)."""
    run = ev.by.get(ev.captured_key)
    if run is None or ev.rew.model is None or not (run.runtime or "").startswith("onnxruntime "):
        return
    from rope_passes.analysis.placement import capture_verdict
    from rope_passes.runtimes.installed import RUNTIMES
    from rope_passes.runtimes.probed import probed_runtime

    name = next((r for r in RUNTIMES if r != RUNTIMES[0] and r in run.runtime), RUNTIMES[0])
    static = capture_verdict(ev.rew.model, probed_runtime(name))
    ev.notes.append(f"static capture verdict ({name}): {static.verdict()}")
    refused = run.status == "load-failed"  # onnxruntime would not create the capture session
    if run.status != NOT_RUN and static.state in ("ready", "blocked") and (static.state == "ready") == refused:
        ev.notes.append(f"the static capture verdict ({static.state}) disagrees with the captured run ({run.status}): "
                        "the runtime is right; please report this graph")


def _run_notes(ev: Evidence) -> None:
    _capture_note(ev)
    primary = [r for r in ev.runs if r.key.original and not r.key.elsewhere]
    for r in ev.runs:
        if r.ok or (r in primary and not any(o.ok for o in primary)):  # summarised below
            continue
        if r.key.capture and r.status == "load-failed":
            ev.notes.append(f"graph capture is not available for the rewritten graph: onnxruntime says: {r.reason}")
        else:
            ev.notes.append(f"{r.label}: {r.status}: {r.reason}")
    for r in ev.runs:
        if r.sweep_errors and not r.key.capture:
            first = min(r.sweep_errors)
            ev.notes.append(f"{r.label}: {len(r.sweep_errors)} sweep position(s) raised, the first {first}: "
                            f"{r.sweep_errors[first]}")
    if primary and not any(o.ok for o in primary):
        where = ev.opts.reference_python or primary[0].runtime or "this onnxruntime"
        line = f"the original does not run here ({where}): {primary[0].reason}"
        fallback_ok = [r for r in ev.runs if r.key.elsewhere and ran(r)]
        if fallback_ok:
            line += f"; it ran on {fallback_ok[0].runtime} ({ev.fallback_python}) instead"
        elif ev.reference_logits is None:
            line += "; give --reference-logits FILE.npy to check the rewritten graph"
            if ev.fallback_wanted is None and not ev.opts.reference_python:
                line += ", or set up the second runtime (scripts/setup-plugin-runtime.sh)"
        ev.notes.append(line)


def _reference(ev: Evidence) -> str:
    by = ev.by
    parts: list[str] = []
    keys = [RunKey(ORIGINAL, e) for e in (("webgpu", "cpu") if ev.ep == "webgpu" else ("cpu",))]
    here = [k for k in keys if ran(by.get(k))]
    there = [k2 for k in keys if ev.fallback_runtime and ran(by.get(k2 := RunKey(ORIGINAL, k.ep,
                                                                                    ev.fallback_runtime)))]
    failed = next((by[k] for k in keys if k in by and not ran(by[k])), None)
    if here:
        line = f"the original on {by[here[0]].runtime} ({', '.join(k.ep for k in here)})"
        if ev.opts.reference_python:
            line += f" under {ev.opts.reference_python}"
        if failed is not None:
            line += f"; it does not run on {failed.key.ep} here: {_short(failed.reason)}"
        parts.append(line)
    elif there:
        parts.append(f"the original on {by[there[0]].runtime} "
                     f"({', '.join(k.ep for k in there)}, {ev.fallback_python}), since "
                     f"{by[keys[0]].runtime or 'this onnxruntime'} cannot load it: "
                     f"{_short(failed.reason) if failed else '?'}")
    if ev.reference_logits is not None:
        parts.append("the given reference logits")
    tables = ev.plan.tables
    if tables is not None and tables.status == "compared":
        what = f"the rotation tables of both graphs (every position 0..{tables.positions - 1})"
        if not here and not there:
            why = _short(failed.reason) if failed is not None else "no run of the original"
            what = (f"the rotation tables alone (every position 0..{tables.positions - 1}; the original's cos/sin "
                    f"rows read as data): the original runs nowhere here ({why})")
        parts.append(what)
    return "; ".join(parts) or "none"


def reference_failure(ev: Evidence) -> str | None:
    """The first run of the original that loaded but did not run what the checker fed it, in one line (None: every
    reference run ran): a call that raised (decode, a schedule, a sweep position), a crash, a timeout. The inputs are
    the model's own contract (:mod:`rope_passes.analysis.genai_contract`), so such a run is a reference missing, never a comparison to skip."""
    for r in ev.runs:
        if not r.key.original or (r.key.elsewhere and not ev.fallback_python):
            continue
        if r.status in (RUN_FAILED, CRASHED, TIMED_OUT):
            at = f" at step {r.failed_step}" if r.status == RUN_FAILED and r.failed_step is not None else ""
            return f"the reference run {r.label} failed{at} ({r.status}): {_short(r.reason)}"
        if r.status != OK:
            continue
        if r.schedule_errors:
            name, why = next(iter(r.schedule_errors.items()))
            return f"the reference run {r.label} raised on schedule {name}: {_short(why)}"
        if r.sweep_errors:
            p = min(r.sweep_errors)
            return f"the reference run {r.label} raised at sweep position {p}: {_short(r.sweep_errors[p])}"
    return None


def _config_mismatch(ev: Evidence) -> str | None:
    """What the rewritten genai_config.json says of its graph that onnxruntime-genai would bind wrong, where the
    original's describes its own graph (:func:`rope_passes.analysis.genai_contract.config_mismatches`)."""
    from rope_passes.analysis.genai_contract import config_mismatches

    old = config_mismatches(ev.orig.model, ev.orig.genai_config)
    new = [m for m in config_mismatches(ev.rew.model, ev.rew.genai_config) if m not in old]
    return f"the rewritten genai_config.json does not describe its graph: {new[0]}" if new else None


def decide(ev: Evidence, comparisons: list[Comparison]) -> tuple[str, str, str]:
    """(verdict, its reason in one line (could not run, or not equivalent where no comparison failed: the config,
    a run the original makes and the rewritten graph does not), the reference in one line); adds the run notes to
    ``ev.notes``."""
    _run_notes(ev)
    by, ep, rew_key = ev.by, ev.ep, ev.rewritten_key
    rew = by[rew_key]
    counted = [c for c in comparisons if c.counts and c.status == "compared"]
    originals = [r for r in ev.runs if r.key.original]
    tables = ev.plan.tables if ev.plan.tables is not None and ev.plan.tables.status == "compared" else None
    capture = by.get(ev.captured_key) if ev.plan.graph_capture else None
    reason = ""
    if any(not c.ok for c in counted) or (tables is not None and not tables.ok):
        verdict = NOT_EQUIVALENT
    elif (wrong := _config_mismatch(ev)) is not None:
        # onnxruntime-genai binds the KV cache and sizes its buffers from genai_config.json: a config that no longer
        # describes the graph breaks every real call, however the graph computes
        verdict, reason = NOT_EQUIVALENT, wrong
        ev.notes.append(f"WARNING: {wrong}")
    elif rew.status == NOT_RUN or (capture is not None and capture.status == NOT_RUN):
        # the checker could not drive a run it needed (exit 2): nothing about the graph was learnt there
        run = rew if rew.status == NOT_RUN else capture
        assert run is not None
        verdict = COULD_NOT_RUN
        reason = f"{run.label} could not run: {_short(run.reason)}"
    elif (failed := reference_failure(ev)) is not None:
        # a reference that raised on the checker's inputs (or crashed) is never skipped into a pass (issue 26)
        verdict, reason = COULD_NOT_RUN, failed
    elif not rew.ok and (original := by.get(RunKey(ORIGINAL, ep))) is not None and original.ok:
        verdict, reason = NOT_EQUIVALENT, f"the original runs on {ep} but the rewritten graph does not"
        ev.notes.append(reason)
    elif ev.plan.capture_required and rew.ok and by[ev.captured_key].status == "load-failed":
        # the output's config turns capture on (the original's did not): onnxruntime-genai cannot create its session
        verdict, reason = NOT_EQUIVALENT, ("the rewritten genai_config.json sets enableGraphCapture=1 but onnxruntime "
                                           "refuses graph capture for the rewritten graph: "
                                           f"{_short(by[ev.captured_key].reason)}")
        ev.notes.append(reason)
    elif ev.plan.graph_capture and rew.ok and by[ev.captured_key].status not in ("ok", "load-failed"):
        # only when the plain run ran: a capture run that fails as the plain one does says nothing about capture
        verdict, reason = NOT_EQUIVALENT, "the rewritten graph's session accepts graph capture but does not run under it"
        ev.notes.append(reason)
    elif not rew.ok and not any(c.kind == "decode" and c.actual == str(rew_key) for c in counted):
        # the rewritten graph did not run on the EP asked for: CPU comparisons alone do not make it equivalent there
        verdict = COULD_NOT_RUN
        reason = f"the rewritten graph does not run on {ep} here ({rew.status}: {_short(rew.reason)})"
        ev.notes.append("nothing to compare: the rewritten graph did not run")
    elif not counted and (tables is None or any(r.reason.startswith(NOT_STARTED) for r in originals)):
        verdict = COULD_NOT_RUN
        if tables is not None:  # the runtime asked for did not start: whether the original loads is unknown
            reason = f"no reference: {next(r.reason for r in originals if r.reason.startswith(NOT_STARTED))}"
        else:
            why_tables = ev.plan.tables.reason if ev.plan.tables is not None else "not compared (tables=False)"
            reason = (f"no reference: the original runs nowhere here and its rotation tables are not comparable "
                      f"({why_tables})")
    elif all(RunKey.parse(c.reference).graph == REWRITTEN for c in counted):
        # only the tables (and the rewritten graph against itself) were compared: say so in the verdict itself
        verdict = EQUIVALENT_TABLES_ONLY
    else:
        verdict = EQUIVALENT
    if verdict == NOT_EQUIVALENT and reason and counted and all(c.ok for c in counted):
        # a reason decided it (the config, capture, a run the rewritten graph does not make): say that no output
        # differed, so the verdict is not read as a numeric difference found
        ev.notes.append(f"every output comparison made passed ({len(counted)}): the verdict is this reason, not a "
                        f"difference in values: {reason}")
    return verdict, reason, _reference(ev)


__all__ = ["decide", "reference_failure"]
