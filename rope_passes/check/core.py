"""``rope_passes.check(original, rewritten)``: is the rewritten graph the same function as the original, on WebGPU?

Runs (each in its own subprocess unless ``isolate=False``), all on one decode schedule (:mod:`.decode`):

1. ``original@cpu``: the reference (onnxruntime's CPU EP is the best-tested implementation of these ops);
2. ``original@webgpu``: the same graph on WebGPU, the baseline error of the EP itself;
3. ``rewritten@webgpu``: the graph under test;
4. ``rewritten@webgpu+capture`` with ``graph_capture=True``: the rewritten graph under ``enableGraphCapture=1``,
   captured on its first step and replayed after (see :mod:`.capture`).

Comparisons that decide the verdict: rewritten@webgpu vs original@webgpu (same EP, so only the rewrite differs),
rewritten@webgpu vs original@cpu (not for int4: quantised graphs are compared with their own original only), the
captured run vs the plain one, and the rewritten run vs ``reference_logits`` when given. original@webgpu vs
original@cpu is shown, not counted: it is the EP's error, not the rewrite's.

Where the original cannot load (an op onnxruntime-webgpu 1.27 lacks, e.g. ``MRotaryEmbedding``), the report says
so and the rewritten graph is compared with whatever reference is left (CPU, or ``reference_logits``); with no
reference at all the result is "could not run" (exit code 2).

Schedule adjustments, each recorded in ``report.notes``:
* software WebGPU adapter (lavapipe): prefill capped at :func:`.adapter.max_webgpu_prefill` tokens, the rest of the
  prompt fed by single-token steps (WebGPU GQA prefill is wrong for query rows >= 8 there);
* LongRoPE (an ``If`` between two cos/sin tables, or a concatenated table with ``multiRotaryCacheConcatOffset``):
  the decode runs past the switch point (original context + 4 tokens); WebGPU sessions get the genai_config's
  WebGPU provider options (the offset among them) as session config entries. A concatenated table is wrong on
  onnxruntime's CPU EP past the offset (it has no such option), so CPU comparisons stop at the offset there.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rope_passes.check.compare import (
    TOLERANCES,
    Comparison,
    OutputDiff,
    Tolerance,
    compare_reference_logits,
    compare_steps,
    precision_of,
)
from rope_passes.check.decode import embedding_table
from rope_passes.check.runner import RunResult, RunSpec, execute_run, run_isolated
from rope_passes.config import GenaiConfig
from rope_passes.errors import UsageError
from rope_passes.io import load_model, resolve_model_path
from rope_passes.runtime.adapter import AdapterInfo, adapter_info, max_webgpu_prefill

EQUIVALENT, NOT_EQUIVALENT, COULD_NOT_RUN = "equivalent", "not equivalent", "could not run"
EXIT_CODES = {EQUIVALENT: 0, NOT_EQUIVALENT: 1, COULD_NOT_RUN: 2}
#: decode steps past a LongRoPE switch point
PAST_SWITCH = 4


@dataclasses.dataclass
class ModelInfo:
    path: Path
    genai_config: dict | None
    precision: str
    webgpu_options: dict[str, str]
    longrope: dict[str, Any] | None  # {"kind": "if"|"concat", "switch": int}
    takes_embeds: bool

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "precision": self.precision, "webgpu_options": self.webgpu_options,
                "longrope": self.longrope}


def _read_model(path: str | Path) -> ModelInfo:
    import onnx

    model_path, folder = resolve_model_path(path)
    config = GenaiConfig.load(folder or model_path.parent)
    webgpu = config.provider_options("webgpu")
    # the checker decides capture itself: a plain run under enableGraphCapture=1 silently returns zeros
    webgpu.pop("enableGraphCapture", None)
    load_model(model_path)  # one-line errors for a non-ONNX or truncated file, or missing/short external data
    proto = onnx.load(str(model_path), load_external_data=False)
    return ModelInfo(model_path, config.data, precision_of(str(model_path)), webgpu,
                     _longrope(proto, webgpu), any(i.name == "inputs_embeds" for i in proto.graph.input))


def _load_reference(reference: str | Path | np.ndarray) -> np.ndarray:
    """``[rows, vocab]`` float logits (a leading batch axis of 1 is dropped)."""
    if isinstance(reference, np.ndarray):
        ref = reference
    else:
        try:
            ref = np.load(reference, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise UsageError(f"{reference}: cannot read reference logits ({type(exc).__name__}: {exc})") from None
    if ref.ndim == 3 and ref.shape[0] == 1:
        ref = ref[0]
    if ref.ndim != 2 or ref.dtype.kind != "f":
        raise UsageError(f"reference logits must be a float [rows, vocab] array, got {ref.dtype} {list(ref.shape)}")
    return ref


def _longrope(proto: Any, webgpu: Mapping[str, str]) -> dict[str, Any] | None:
    """A LongRoPE cache and its switch point: ``If(Greater(total_len, C))`` picking cos/sin tables (read by the
    LongRoPE detector, :func:`rope_passes.analysis.longrope.find_longrope`), or a concatenated table whose offset is
    in ``multiRotaryCacheConcatOffset`` (the offset onnxruntime will apply, whatever the table)."""
    offset = int(webgpu.get("multiRotaryCacheConcatOffset", "0") or 0)
    if offset > 0:
        return {"kind": "concat", "switch": offset}
    import onnx_ir as ir

    from rope_passes.analysis.longrope import find_longrope

    found = find_longrope(ir.serde.deserialize_model(proto))  # weights stay unread: only the threshold is
    if found is not None and found.kind == "if" and found.threshold is not None:
        return {"kind": "if", "switch": found.threshold}
    return None


@dataclasses.dataclass
class EquivalenceReport:
    verdict: str
    original: ModelInfo
    rewritten: ModelInfo
    ep: str
    prefill: int
    steps: int
    runs: list[RunResult]
    comparisons: list[Comparison]
    notes: list[str]
    adapter: AdapterInfo | None
    wall_s: float

    @property
    def equivalent(self) -> bool:
        return self.verdict == EQUIVALENT

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    @property
    def first_failure(self) -> tuple[Comparison, Any] | None:
        """(comparison, OutputDiff) of the earliest failing step among the comparisons that count."""
        best = None
        for c in self.comparisons:
            d = c.first_failure if c.counts and c.status == "compared" else None
            if d is not None and (best is None or d.step < best[1].step):
                best = (c, d)
        return best

    def run(self, label: str) -> RunResult | None:
        return next((r for r in self.runs if r.label == label), None)

    def comparison(self, actual: str, reference: str) -> Comparison | None:
        return next((c for c in self.comparisons if c.actual == actual and c.reference == reference), None)

    def to_dict(self) -> dict[str, Any]:
        first = self.first_failure
        return {
            "verdict": self.verdict, "exit_code": self.exit_code, "ep": self.ep,
            "schedule": {"prefill": self.prefill, "steps": self.steps, "total_tokens": self.prefill + self.steps},
            "original": self.original.to_dict(), "rewritten": self.rewritten.to_dict(),
            "adapter": self.adapter.summary if self.adapter else None,
            "runs": [r.to_dict() for r in self.runs],
            "comparisons": [c.to_dict() for c in self.comparisons],
            "first_failure": None if first is None else {"comparison": first[0].name, **first[1].to_dict()},
            "notes": self.notes, "wall_s": round(self.wall_s, 3),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)


def _embedding_for(info: ModelInfo, other: ModelInfo, option: str | None, tmp: Path) -> str | None:
    """Embedding table file for an inputs_embeds graph: the user's, else the other graph's own, else None (the
    fixed-seed default table)."""
    if not info.takes_embeds:
        return None
    table = None
    if option:
        table = embedding_table(option)
        if table is None:
            raise UsageError(f"{option}: no Gather(table, input_ids) to take token embeddings from")
    elif not other.takes_embeds:
        table = embedding_table(other.path)
    if table is None:
        return None
    path = tmp / f"embeddings_{abs(hash(str(info.path)))}.npy"
    np.save(path, table)
    return str(path)


def check(
    original: str | Path,
    rewritten: str | Path,
    *,
    ep: str = "webgpu",
    prefill: int = 8,
    steps: int = 4,
    graph_capture: bool = False,
    reference_logits: str | Path | np.ndarray | None = None,
    dims: Mapping[str, int] | None = None,
    embeddings: str | None = None,
    tolerance: Mapping[str, float] | None = None,
    isolate: bool = True,
    timeout: float = 300,
    reference_python: str | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> EquivalenceReport:
    """Compare ``rewritten`` with ``original`` step by step on ``ep`` (see the module docstring).

    ``tolerance`` overrides ``atol``/``rtol`` of the dtype default; ``progress(label, step, n_steps)`` is called
    after each decode step of each run. ``reference_python``: run the original with this Python interpreter (another
    onnxruntime installation, e.g. one that has an op this one lacks), in a subprocess.
    """
    start = time.perf_counter()
    if ep not in ("webgpu", "cpu"):
        raise UsageError(f"unknown execution provider {ep!r} (choose webgpu or cpu)")
    if prefill < 1 or steps < 0:
        raise UsageError("--prefill must be >= 1 and --steps >= 0")
    if graph_capture and ep != "webgpu":
        raise UsageError("--graph-capture needs --ep webgpu")
    orig, rew = _read_model(original), _read_model(rewritten)
    ref_logits = None if reference_logits is None else _load_reference(reference_logits)
    notes: list[str] = []
    adapter = adapter_info() if ep == "webgpu" else None

    # --- the schedule every run shares ---
    switch = max((m.longrope["switch"] for m in (orig, rew) if m.longrope), default=None)
    if switch is not None and prefill + steps < switch + PAST_SWITCH:
        steps = switch + PAST_SWITCH - prefill
        notes.append(f"LongRoPE cache switching after {switch} tokens: decoding {prefill + steps} tokens in all to "
                     f"cross it")
    limit = max_webgpu_prefill(adapter) if adapter else None
    if limit is not None and prefill > limit:
        notes.append(f"software WebGPU adapter ({adapter.summary}): WebGPU GroupQueryAttention prefill is wrong for "
                     f"query rows >= 8 there, so the prefill is {limit} tokens and the other {prefill - limit} come "
                     f"as single-token decode steps")
        steps += prefill - limit
        prefill = limit
    elif adapter is not None and adapter.software:
        notes.append(f"software WebGPU adapter ({adapter.summary}): prefills kept at <= {limit} tokens")
    if orig.longrope and orig.longrope["kind"] == "concat":
        notes.append(f"{orig.path.name}: concatenated LongRoPE cache with offset {orig.longrope['switch']}: the CPU "
                     f"EP has no multiRotaryCacheConcatOffset, so comparisons with original@cpu stop at "
                     f"{orig.longrope['switch']} tokens")

    if ep == "webgpu" and rew.longrope and rew.longrope["kind"] == "concat" and not (
            orig.longrope and orig.longrope["kind"] == "concat"):
        notes.append(f"{rew.path.name}: concatenated LongRoPE cache (offset {rew.longrope['switch']}): WebGPU-only "
                     f"output; on the CPU EP it is wrong past {rew.longrope['switch']} tokens")
    if ep == "cpu" and rew.longrope and rew.longrope["kind"] == "concat":
        notes.append(f"{rew.path.name}: concatenated LongRoPE cache: it needs multiRotaryCacheConcatOffset, which the "
                     f"CPU EP lacks, so on CPU it is wrong past {rew.longrope['switch']} tokens")
    tol = dict(dataclasses.asdict(TOLERANCES[orig.precision]))
    tol.update(tolerance or {})
    tolerance_used = Tolerance(float(tol["atol"]), float(tol["rtol"]), orig.precision)
    ref_tol = tolerance_used if orig.precision != "int4" else TOLERANCES["fp16"]

    with tempfile.TemporaryDirectory(prefix="rope-check-") as tmpdir:
        tmp = Path(tmpdir)
        emb_orig = _embedding_for(orig, rew, embeddings, tmp)
        emb_rew = _embedding_for(rew, orig, embeddings, tmp)
        if emb_orig and not emb_rew and rew.takes_embeds:
            emb_rew = emb_orig
        if emb_rew and not emb_orig and orig.takes_embeds:
            emb_orig = emb_rew

        def spec(label: str, info: ModelInfo, run_ep: str, emb: str | None, capture: bool = False) -> RunSpec:
            return RunSpec(label=label, model=str(info.path), ep=run_ep, prefill=prefill, steps=steps,
                           genai_config=info.genai_config,
                           webgpu_options=dict(info.webgpu_options) if run_ep == "webgpu" else {},
                           graph_capture=capture, max_length=prefill + steps, dims=dict(dims or {}), embedding=emb)

        specs = [spec("original@cpu", orig, "cpu", emb_orig)]
        if ep == "webgpu":
            specs.append(spec("original@webgpu", orig, "webgpu", emb_orig))
        specs.append(spec(f"rewritten@{ep}", rew, ep, emb_rew))
        if graph_capture:
            specs.append(spec("rewritten@webgpu+capture", rew, "webgpu", emb_rew, capture=True))

        runs: list[RunResult] = []
        for s in specs:
            def on_step(k: int, _label: str = s.label) -> None:
                if progress is not None:
                    progress(_label, k, steps + 1)

            python = reference_python if s.label.startswith("original@") else None
            if isolate or python:
                runs.append(run_isolated(s, on_step, timeout, python=python))
            else:
                runs.append(execute_run(s, on_step))
    if reference_python:
        versions = sorted({r.runtime for r in runs if r.label.startswith("original@") and r.runtime})
        notes.append(f"the original ran under {reference_python} ({', '.join(versions) or 'no onnxruntime result'})")
    by = {r.label: r for r in runs}
    originals = [r for r in runs if r.label.startswith("original@")]
    for r in runs:
        if r.ok or (r in originals and not any(o.ok for o in originals)):  # summarised below
            continue
        if r.label.endswith("+capture") and r.status == "load-failed":
            notes.append(f"graph capture is not available for the rewritten graph: onnxruntime says: {r.reason}")
        else:
            notes.append(f"{r.label}: {r.status}: {r.reason}")

    # --- comparisons ---
    comparisons: list[Comparison] = []
    rew_label = f"rewritten@{ep}"
    cpu_steps = None
    if orig.longrope and orig.longrope["kind"] == "concat":
        cpu_steps = [k for k in range(steps + 1) if prefill + k <= orig.longrope["switch"]]

    def add(actual: str, reference: str, counts: bool, tol_: Tolerance, only: list[int] | None = None,
            why_not: str = "") -> None:
        c = Comparison(actual, reference, tol_, counts)
        a, b = by.get(actual), by.get(reference)
        if why_not:
            c.status, c.reason = "skipped", why_not
        elif a is None or b is None or not (a.ok or a.steps) or not (b.ok or b.steps):
            bad = next(r for r in (a, b) if r is None or not (r.ok or r.steps))
            c.status, c.reason = "skipped", f"{bad.label if bad else actual} did not run" + (
                f" ({bad.status})" if bad else "")
        else:
            compare_steps(a.steps, b.steps, c, only)
            if a.failed_step is not None and a.failed_step < len(b.steps) and (only is None or a.failed_step in only):
                c.diffs.append(OutputDiff(a.failed_step, "(run)", float("inf"), float("inf"), False,
                                          f"{actual} failed at this step: {a.reason}"))
            if b.failed_step is not None:
                c.reason = f"{reference} failed at step {b.failed_step}: compared the steps before it"
            if only is not None:
                c.reason = (c.reason + "; " if c.reason else "") + f"steps {only[0]}..{only[-1]} only" if only else \
                    "no step before the LongRoPE offset"
                if not only:
                    c.status = "skipped"
        comparisons.append(c)

    if ep == "webgpu":
        add(rew_label, "original@webgpu", True, tolerance_used)
        add(rew_label, "original@cpu", orig.precision != "int4", ref_tol, cpu_steps,
            "" if orig.precision != "int4" else "int4: compared with its own original on the same EP only")
        add("original@webgpu", "original@cpu", False, ref_tol, cpu_steps)
    else:
        add(rew_label, "original@cpu", True, tolerance_used)
    if graph_capture:
        add("rewritten@webgpu+capture", rew_label, True, tolerance_used)
    if ref_logits is not None:
        ref = ref_logits
        c = Comparison(rew_label, "reference-logits", ref_tol if orig.precision != "fp32" else TOLERANCES["fp32"],
                       True)
        r = by[rew_label]
        if r.ok:
            compare_reference_logits(r.steps, ref, prefill, c)
        else:
            c.status, c.reason = "skipped", f"{rew_label} did not run ({r.status})"
        comparisons.append(c)

    if not any(r.ok for r in originals):
        import onnxruntime

        where = reference_python or f"onnxruntime {onnxruntime.__version__}"
        notes.append(f"the original does not run here ({where}): "
                     f"{originals[0].reason}" + ("" if reference_logits is not None else
                                                 "; give --reference-logits FILE.npy to check the rewritten graph"))

    # --- verdict ---
    counted = [c for c in comparisons if c.counts and c.status == "compared"]
    if any(not c.ok for c in counted):
        verdict = NOT_EQUIVALENT
    elif not by[rew_label].ok and any(by[lab].ok for lab in ("original@webgpu", "original@cpu") if lab in by
                                        and lab.endswith(ep)):
        verdict = NOT_EQUIVALENT
        notes.append(f"the original runs on {ep} but the rewritten graph does not")
    elif graph_capture and by["rewritten@webgpu+capture"].status not in ("ok", "load-failed"):
        verdict = NOT_EQUIVALENT
        notes.append("the rewritten graph's session accepts graph capture but does not run under it")
    elif not counted:
        verdict = COULD_NOT_RUN
        if not by[rew_label].ok:
            notes.append("nothing to compare: the rewritten graph did not run")
    else:
        verdict = EQUIVALENT
    return EquivalenceReport(verdict, orig, rew, ep, prefill, steps, runs, comparisons, notes, adapter,
                             time.perf_counter() - start)
