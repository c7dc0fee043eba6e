"""The form fuzzer (issue 32): the values the passes read, rewritten into other node forms, must give the same rewrite.

A :class:`Case` takes a tiny onnxruntime-genai builder graph from the shared corpus, rewrites the values a pass reads
into other forms (:mod:`mutants.forms`: each default-domain opset's spelling of the mask chain, constant-foldable
producers, a model-local function with its own opset import), runs ``optimize --target webgpu-graph`` and judges:

* a form of the builder's value (``Case.same``): the same passes rewrite as on the plain graph, the static capture
  verdict is ready (0 Memcpy), and the variant itself computes what the plain graph computes (onnxruntime CPU: the
  form really is the same value; not for tables rounded on the way, ``Case.exact``);
* a lookalike (its value differs): the pass refuses (or, for a value that reads no shape, does not match), naming
  the node of the graph that breaks the proof, and changes nothing;
* either way the output loads and equals its input on an independent onnxruntime CPU run (fp32, 1e-5) over calls
  varying past length, call length and batch (:data:`mutants.CALLS`; LongRoPE's cross its switch), with WebGPU's
  concatenated-cache offset emulated where the output sets one.

:func:`judge` returns a :class:`Verdict` the tests assert on, and :func:`count` the tallies the report quotes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

from mutants import CALLS, CORPUS, Work, oracle
from mutants.plugin import LeftPaddedMask

import rope_passes
import rope_passes.graph_walk as graph_walk
from rope_passes.analysis.placement import predict_placement
from rope_passes.passes.longrope_concat import OFFSET_KEY
from rope_passes.report import Outcome, PipelineReport

PRESET = "webgpu-graph"
TOLERANCE = 1e-5  # fp32: the rewrites under test move no float math (lengths and tables only)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    base: str  # corpus-relative folder
    edit: Callable[[Work], list[str]]
    pass_name: str
    same: bool  # the pass's value in another form (else a lookalike)
    calls: tuple = CALLS
    #: the form's values are the plain graph's (else rounded on the way: int8 codes, bf16): then the variant is checked
    #: against the plain graph too
    exact: bool = True
    #: optimize's options (``{"text_only": True}``: ``--text-only``), for the variant and the plain graph alike
    options: tuple = ()


@dataclasses.dataclass
class Verdict:
    ok: bool
    outcome: str  # rewritten | refused | WRONG
    detail: str
    passes: dict[str, str] = dataclasses.field(default_factory=dict)


def _write(case: Case, dest: Path, edit: bool) -> Path:
    bundle = rope_passes.load_bundle(CORPUS / case.base)
    config = bundle.genai_config.data
    if edit:
        case.edit(Work(bundle.model, config))
    dest.mkdir(parents=True, exist_ok=True)
    rope_passes.save_bundle(bundle, dest)
    if config is not None:
        (dest / "genai_config.json").write_text(json.dumps(config, indent=4) + "\n")
    return dest


def _offset(folder: Path) -> int:
    """The concatenated-cache offset the output's genai_config gives WebGPU (0: none)."""
    config = json.loads((folder / "genai_config.json").read_text())
    for entry in config["model"]["decoder"].get("session_options", {}).get("provider_options", []):
        if OFFSET_KEY in entry.get("webgpu", {}):
            return int(entry["webgpu"][OFFSET_KEY])
    return 0


def _compare(reference: Path, candidate: Path, calls) -> oracle.Comparison:
    """Every call with a mask of ones, then again with left-padded masks (no row all ones: the width is not the
    largest row sum, and every row's sum differs from the width). The candidate runs with WebGPU's
    ``multiRotaryCacheConcatOffset`` emulated where its genai_config sets one (the CPU EP has no such option)."""
    offset = _offset(candidate.parent)
    ref, cand = oracle.Runner(reference), oracle.Runner(candidate, offset=offset)
    head = json.loads((reference.parent / "genai_config.json").read_text())["model"]["decoder"].get("head_size")
    ones = oracle.compare(ref, cand, calls, head_size=head, atol=TOLERANCE, rtol=TOLERANCE)
    if not ones.ok:
        return ones
    # With an offset the oracle emulates WebGPU's kernel per row (each row on its own seqlens_k + 1); the If
    # switches the whole batch on the width, longrope-concat's head switch on the batch's longest row (Hugging Face's
    # switch): the same wherever a row is unpadded, as every client pads (to the longest prompt). Past the offset,
    # batches keep row 0 unpadded (docs/passes/longrope-concat.md#batches-left-padding).
    early = [c for c in calls if c[0] and (not offset or c[0] + c[1] <= offset)]
    late = [c for c in calls if c[0] and offset and c[0] + c[1] > offset]
    padded = oracle.compare(LeftPaddedMask(ref), LeftPaddedMask(cand), early, head_size=head, atol=TOLERANCE,
                            rtol=TOLERANCE)
    if padded.ok and late:
        longest = oracle.compare(LeftPaddedMask(ref, unpadded=1), LeftPaddedMask(cand, unpadded=1), late,
                                 head_size=head, atol=TOLERANCE, rtol=TOLERANCE)
        padded = dataclasses.replace(longest, detail=f"{padded.detail}; past the offset, row 0 unpadded: "
                                     f"{longest.detail}", calls_run=padded.calls_run + longest.calls_run)
    return dataclasses.replace(padded, detail=f"{ones.detail}; left-padded: {padded.detail}",
                               calls_run=ones.calls_run + padded.calls_run) if padded.ok else padded


def _rewrites(folder: Path, out: Path, options: tuple = ()) -> dict[str, str]:
    report = rope_passes.optimize(str(folder), str(out), preset=PRESET, options=dict(options))
    return {p.pass_name: p.status for p in report.passes}


_PLAIN: dict[tuple[str, tuple], dict[str, str]] = {}


def plain_rewrites(base: str, tmp: Path, options: tuple = ()) -> dict[str, str]:
    """The passes' statuses on the plain corpus graph (memoised per base and options)."""
    if (base, options) not in _PLAIN:
        _PLAIN[(base, options)] = _rewrites(CORPUS / base, tmp / "plain-out", options)
    return _PLAIN[(base, options)]


#: passes that act on what the others leave (dead int64 plumbing, dead nodes): a form may leave other leftovers (a
#: model-local function call read only by a condition longrope-concat made dead), so they are judged through the
#: capture verdict and the outputs, not by whether they ran
_LEFTOVERS = ("cleanup", "narrow-int64")


def _changed(statuses: dict[str, str]) -> set[str]:
    """The passes that rewrote a value."""
    return {name for name, status in statuses.items() if status.startswith(("rewritten", "repaired"))
            and name not in _LEFTOVERS}


def build(case: Case, tmp: Path) -> tuple[Path, Path, PipelineReport]:
    """(the variant's folder, the output's folder, optimize's report)."""
    variant = _write(case, tmp / "variant", edit=True)
    out = tmp / "out"
    return variant, out, rope_passes.optimize(str(variant), str(out), preset=PRESET, options=dict(case.options))


def judge(case: Case, tmp: Path) -> Verdict:
    variant, out, report = build(case, tmp)
    statuses = {p.pass_name: p.status for p in report.passes}
    (mine,) = [p for p in report.passes if p.pass_name == case.pass_name]
    findings = "; ".join(f"{f.outcome}: {f.place}: {f.reason}" for f in mine.findings
                         if f.outcome is not Outcome.NOTE)[:600]
    if case.same:
        plain = plain_rewrites(case.base, tmp, case.options)
        if _changed(statuses) != _changed(plain):
            return Verdict(False, "WRONG", f"passes that changed the graph: {sorted(_changed(statuses))}, on the "
                           f"plain graph {sorted(_changed(plain))}: {findings}", statuses)
        placement = predict_placement(out / "model.onnx")
        if not placement.capture_ok:
            return Verdict(False, "WRONG", f"capture verdict {placement.verdict()}: {placement.memcpy} "
                           f"{placement.unknown}", statuses)
        same_value = _compare(CORPUS / case.base / "model.onnx", variant / "model.onnx", case.calls) if case.exact \
            else None
        if same_value is not None and (not same_value.ok or not same_value.calls_run):
            return Verdict(False, "WRONG", f"the form is not the builder's value on onnxruntime CPU: "
                           f"{same_value.detail}", statuses)
        outcome = "rewritten"
    else:
        model = oracle.load_in_memory(variant / "model.onnx")
        names = {n.name for n in graph_walk.nodes(model.graph)} | {n.name for f in model.functions.values() for n in f}
        declined = [f for f in mine.findings if f.outcome in (Outcome.REFUSED, Outcome.NOT_MATCHED)
                    and any(f"'{n}'" in f.reason for n in names)]
        if mine.modified or not declined:
            return Verdict(False, "WRONG", f"a lookalike was not refused naming a node: {mine.status}: {findings}",
                           statuses)
        outcome = "refused"
    equal = _compare(variant / "model.onnx", out / "model.onnx", case.calls)
    if not equal.ok or not equal.calls_run:
        return Verdict(False, "WRONG", f"output differs from its input on onnxruntime CPU: {equal.detail}", statuses)
    return Verdict(True, outcome, findings, statuses)


__all__ = ["PRESET", "TOLERANCE", "Case", "Verdict", "build", "judge", "plain_rewrites"]
