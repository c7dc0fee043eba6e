"""What a check will run, decided once before anything runs (:func:`plan_check` builds the frozen
:class:`CheckPlan`): the options (:class:`CheckOptions`), the decode (prefill and steps, adjusted for LongRoPE and a
software adapter), the sweep positions, the schedules (:mod:`.schedules`), the embedding tables fed, whether the
captured run is made, the tolerance, and the rotation-table comparison (no session). Every adjustment is a note.

* software WebGPU adapter (lavapipe): prefill capped at :func:`rope_passes.runtime.adapter.max_webgpu_prefill`
  tokens, the rest of the prompt fed by single-token steps (WebGPU GQA prefill is wrong for query rows >= 8 there);
  WebGPU runs take only the schedules whose calls fit the cap (a long prompt goes chunked), CPU runs take them all;
* LongRoPE (:class:`rope_passes.analysis.longrope.LongRoPESwitch`): the decode runs past the switch point (original
  context + :data:`PAST_SWITCH` tokens) when that is at most :data:`MAX_CROSSING_STEPS` steps, else the sweep gets
  single steps at the switch's two sides (after a random past; any ``--sweep``, even 0). A concatenated table is
  wrong on onnxruntime's CPU EP past the offset (it has no such option), so CPU comparisons stop at the offset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from rope_passes.analysis.genai_contract import caller_positions
from rope_passes.analysis.table_diff import TableComparison, compare_tables
from rope_passes.check.client_schedules import BOUNDARY_MAX, CAPTURE_TOTAL, client_schedules, unreached
from rope_passes.check.compare import TOLERANCES, Tolerance
from rope_passes.check.decode import TOKEN_HIGH
from rope_passes.check.models import ModelInfo, attention_layout, embedding_for, rotation_tables_of
from rope_passes.check.schedules import DENSE_DECODE, GraphFacts, Schedule, default_schedules, runs_on
from rope_passes.check.spec import ORIGINAL, REWRITTEN, RunKey
from rope_passes.check.sweep import default_positions, sweep_positions
from rope_passes.errors import UsageError
from rope_passes.runtime.adapter import AdapterInfo, max_webgpu_prefill

#: decode steps past a LongRoPE switch point
PAST_SWITCH = 4
#: the most decode steps spent to reach a LongRoPE switch by decoding; a later switch is checked by sweep steps after
#: a random past at its two sides (a step is equal on both graphs given the same past, so a decode of equal steps is
#: equal: the steps are what a crossing adds). Real size: 4096 single steps of real layers per run are hours on a
#: software adapter (a 2-layer Phi-3-128k run here: 5 minutes per WebGPU run, and the process tree grew to 23 GB).
MAX_CROSSING_STEPS = 256


@dataclasses.dataclass
class CheckOptions:
    """Everything :func:`rope_passes.check.core.check` takes besides the two models (docs/checker.md)."""

    ep: str = "webgpu"  # the rewritten graph's EP: webgpu | cpu
    prefill: int = 8
    steps: int = 4
    graph_capture: bool = False
    reference_logits: str | Path | np.ndarray | None = None
    dims: Mapping[str, int] | None = None  # sizes of symbolic dims (--dim)
    embeddings: str | None = None  # token embeddings for inputs_embeds graphs
    tolerance: Mapping[str, float] | None = None  # atol/rtol overrides
    isolate: bool = True  # every run in its own subprocess
    timeout: float = 300  # seconds per run
    reference_python: str | None = None  # run the original with this interpreter
    progress: Callable[[str, int, int], None] | None = None  # (label, step, n_steps); step -1: a run starts
    sweep: int | None = None  # sweep positions (None: 32, with layers default_sweep)
    fallback_python: str | None = "auto"  # the second runtime for an original that does not load here
    tables: bool = True  # compare the rotation tables and the constants (no session)
    layers: int | None = None  # compare the first N decoder layers only
    runtime: str | None = None  # the WebGPU runtime every run uses
    schedules: Sequence[Schedule] | None = None  # None: the default set (.schedules.default_schedules); [] none
    #: the call grid (.evidence.calls, CPU EP): None every shape where the sweep takes every position, else a stated
    #: sample; True every shape (--calls); False none (--no-calls)
    calls: bool | None = None
    budget: float = 0.0  # seconds of random schedules after the check (check --budget)
    seed: int = 0  # the random schedules' seed (check --seed)

    def validate(self) -> None:
        if self.ep not in ("webgpu", "cpu"):
            raise UsageError(f"unknown execution provider {self.ep!r} (choose webgpu or cpu)")
        if self.prefill < 1 or self.steps < 0 or (self.sweep is not None and self.sweep < 0):
            raise UsageError("--prefill must be >= 1, --steps and --sweep >= 0")
        if self.graph_capture and self.ep != "webgpu":
            raise UsageError("--graph-capture needs --ep webgpu")
        if self.layers is not None and self.reference_logits is not None:
            raise UsageError("--reference-logits compares logits, which --layers cuts off")
        if self.budget < 0:
            raise UsageError("--budget must be >= 0 seconds")

    def say(self, label: str, step: int, total: int) -> None:
        if self.progress is not None:
            self.progress(label, step, total)


@dataclasses.dataclass(frozen=True)
class CheckPlan:
    """The decode, sweep and schedules every run shares, the embedding tables fed, whether the captured run is made,
    the tolerance, the table comparison, and the notes that say what was adjusted: built once by :func:`plan_check`,
    never changed after."""

    prefill: int
    steps: int
    positions: tuple[int, ...]
    tolerance: Tolerance
    tables: TableComparison | None
    notes: tuple[str, ...]
    switches: frozenset[int]
    max_call: int | None  # WebGPU's longest correct call here (None: no cap)
    schedules: tuple[Schedule, ...] = ()
    facts: GraphFacts | None = None
    embeddings: tuple[str | None, str | None] = (None, None)  # the .npy tables fed (original, rewritten)
    graph_capture: bool = False  # the captured run is made (--graph-capture, or the rewritten config turns it on)
    #: the rewritten genai_config turns capture on and the original's did not (a Python runtime): a captured session
    #: that does not load is a defect of the output
    capture_required: bool = False
    #: the call grid (.evidence.calls, made by the CPU runs): "every" shape, a stated "sample", or "none"
    grid: str = "none"
    seed: int = 0  # the grid's (check --seed)
    cacheless: bool = False  # a graph has no KV cache: the grid's calls are prompts

    def for_ep(self, ep: str) -> list[Schedule]:
        """The schedules a run on ``ep`` makes (:func:`~rope_passes.check.schedules.runs_on`)."""
        facts = dataclasses.replace(self.facts or GraphFacts(vocab=0), max_call=self.max_call)
        return [s for s in self.schedules if runs_on(s, ep, facts)]


def vocabulary(infos: Sequence[ModelInfo], embedding_table_rows: Sequence[int] = ()) -> int:
    """Ids ``0..vocabulary-1`` are valid for every graph of ``infos`` (every vocabulary each states,
    :attr:`.models.ModelInfo.vocab`) and every embedding table fed; none stated: the fixed-seed default table's rows
    (:data:`.decode.TOKEN_HIGH`)."""
    sizes = [n for i in infos for n in i.vocab] + list(embedding_table_rows)
    return min(sizes) if sizes else TOKEN_HIGH


def weight_bytes(*infos: ModelInfo) -> int:
    """The largest graph's initializer bytes (what a single-token call reads once): the sweep's cost per position."""
    sizes = [0]
    for info in infos:
        if info.model is not None:
            sizes.append(sum(int(v.const_value.nbytes) for v in info.model.graph.initializers.values()
                             if v.const_value is not None))
    return max(sizes)


def plan_check(orig: ModelInfo, rew: ModelInfo, opts: CheckOptions, adapter: AdapterInfo | None, sweep: int | None,
               tmp: Path, genai: bool) -> CheckPlan:
    """The plan of a check, built once (module docstring): the decode and sweep (:func:`_decode`), the captured run
    (``genai``: onnxruntime-genai runs on this runtime, so a capture the rewritten config turns on is checked), the
    embedding tables (written to ``tmp``), the schedules from the graph facts, and every note."""
    # the output's config turns capture on: onnxruntime-genai runs its captured loop, so the check does (the same
    # decode as --graph-capture); where the original's did not (optimize turns it on when capture is ready), a
    # session that refuses capture does not load
    config = opts.ep == "webgpu" and genai and rew.capture_on
    required = config and not orig.capture_on
    capture = opts.graph_capture or config
    plan = _decode(orig, rew, opts, adapter, sweep, capture)
    if config and not opts.graph_capture:
        plan = dataclasses.replace(plan, notes=(*plan.notes, (
            "the rewritten genai_config.json turns graph capture on (enableGraphCapture=1): the captured run is "
            "checked as onnxruntime-genai makes it, --graph-capture or not")))
    emb_orig, emb_rew = _embeddings(orig, rew, opts.embeddings, tmp)
    rows = [np.load(e, mmap_mode="r").shape[0] for e in {emb_orig, emb_rew} if e]
    plan = with_schedules(plan, graph_facts(orig, rew, plan, rows), opts.schedules)
    facts = plan.facts
    every = opts.calls is True or (facts is not None and facts.context is not None
                                   and facts.decode_to == facts.context)
    cacheless = not all(m.model is not None and any(v.name.startswith("past_key_values")
                                                    for v in m.model.graph.inputs) for m in (orig, rew))
    return dataclasses.replace(plan, embeddings=(emb_orig, emb_rew), graph_capture=capture,
                               capture_required=required, seed=opts.seed, cacheless=cacheless,
                               grid="none" if opts.calls is False else "every" if every else "sample")


def _embeddings(orig: ModelInfo, rew: ModelInfo, option: str | None, tmp: Path) -> tuple[str | None, str | None]:
    """The embedding table files of the two graphs (inputs_embeds graphs only; one graph's serves both)."""
    emb_orig = embedding_for(orig, rew, option, tmp)
    emb_rew = embedding_for(rew, orig, option, tmp)
    if emb_orig and not emb_rew and rew.takes_embeds:
        emb_rew = emb_orig
    if emb_rew and not emb_orig and orig.takes_embeds:
        emb_orig = emb_rew
    return emb_orig, emb_rew


def _decode(orig: ModelInfo, rew: ModelInfo, opts: CheckOptions, adapter: AdapterInfo | None,
            sweep: int | None, capture: bool = False) -> CheckPlan:
    """The decode, the sweep positions (``sweep`` None: :func:`.sweep.default_positions`, every position where the
    CPU reference can afford it), the table comparison and the tolerance."""
    ep, prefill, steps = opts.ep, opts.prefill, opts.steps
    notes: list[str] = []
    orig_t, rew_t = (rotation_tables_of(orig, ep), rotation_tables_of(rew, ep)) if opts.tables or sweep else (None, None)
    table_cmp = (compare_tables(orig_t, rew_t, orig.context_length)
                 if opts.tables and orig_t is not None and rew_t is not None else None)  # tables: both were read
    end = table_cmp.positions if table_cmp is not None and table_cmp.status == "compared" else (
        (orig_t.covers if orig_t is not None and not orig_t.unavailable else None) or orig.context_length)
    switches = set(orig_t.switches if orig_t else []) | set(rew_t.switches if rew_t else [])
    switches |= {m.longrope.switch for m in (orig, rew) if m.longrope is not None}
    if sweep is None and end:
        positions, rule = default_positions(end, switches, weight_bytes(orig, rew), opts.seed)
        notes.append(rule)
    else:
        positions = sweep_positions(end, switches, sweep) if sweep and end else []
    if sweep != 0 and not end:
        notes.append("no position sweep: the table length is unknown (no context_length in genai_config.json, and "
                     "the rotation tables were not read)")

    switch = max((m.longrope.switch for m in (orig, rew) if m.longrope is not None), default=None)
    if switch is not None and prefill + steps < switch + PAST_SWITCH:
        if switch + PAST_SWITCH - prefill <= MAX_CROSSING_STEPS:
            steps = switch + PAST_SWITCH - prefill
            notes.append(f"LongRoPE cache switching after {switch} tokens: decoding {prefill + steps} tokens in all "
                         f"to cross it")
        else:  # real size (Phi-3-128k: 4096): the switch's two sides as sweep steps after a random past
            sides = [p for p in range(switch - 2, switch + 2) if p > 0 and (not end or p < end)]
            positions = sorted(set(positions) | set(sides))
            notes.append(f"LongRoPE cache switching after {switch} tokens: crossing it by decoding would take "
                         f"{switch + PAST_SWITCH - prefill} steps (more than {MAX_CROSSING_STEPS}); positions "
                         f"{', '.join(map(str, sides))} are single steps after a random past instead (the step at "
                         f"each side of the switch, the same past for both graphs)")
    if capture and end and prefill + steps < min(CAPTURE_TOTAL, end):
        # the captured decode replays one graph at every total: reach CAPTURE_TOTAL, each step against it uncaptured
        steps = min(CAPTURE_TOTAL, end) - prefill
        notes.append(f"graph capture: decoding {prefill + steps} tokens in all, so the captured replays run at every "
                     f"total up to {prefill + steps} (the capture loop's mask, ones then zeros), each step compared")
    limit = max_webgpu_prefill(adapter) if adapter else None
    if adapter is not None and limit is not None and prefill > limit:  # a limit comes from an adapter
        notes.append(f"software WebGPU adapter ({adapter.summary}): WebGPU GroupQueryAttention prefill is wrong for "
                     f"query rows >= 8 there, so the prefill is {limit} tokens and the other {prefill - limit} come "
                     f"as single-token decode steps; WebGPU runs take the schedules whose calls are at most {limit} "
                     f"tokens (longer ones run on CPU)")
        steps += prefill - limit
        prefill = limit
    elif adapter is not None and adapter.software:
        notes.append(f"software WebGPU adapter ({adapter.summary}): prefills and WebGPU schedule calls kept at <= "
                     f"{limit} tokens")
    notes += _longrope_notes(orig, rew, ep)
    tol = dict(dataclasses.asdict(TOLERANCES[orig.precision]))
    tol.update(opts.tolerance or {})
    tolerance = Tolerance(float(tol["atol"]), float(tol["rtol"]), orig.precision)
    return CheckPlan(prefill, steps, tuple(positions), tolerance, table_cmp, tuple(notes), frozenset(switches),
                     limit if adapter is not None else None)


def _longrope_notes(orig: ModelInfo, rew: ModelInfo, ep: str) -> list[str]:
    notes = []
    for info in (orig, rew):
        lr = info.longrope
        if lr is not None and lr.offset_ignored_by:
            notes.append(f"WARNING {info.path}: multiRotaryCacheConcatOffset={lr.switch} is IGNORED by "
                         f"{len(lr.offset_ignored_by)} GroupQueryAttention node(s) with separate Q/K/V "
                         f"({lr.offset_ignored_by[0]!r}…): onnxruntime applies the offset to packed QKV only, so on "
                         f"WebGPU a position p reads row p of the [short; long] cache: past {lr.switch} tokens the "
                         "short rows (wrong); lint RP206; fix: rope-passes optimize --preset webgpu-graph packs Q/K/V")
    o, r = orig.longrope, rew.longrope
    if o is not None and o.kind == "concat":
        notes.append(f"{orig.path.name}: concatenated LongRoPE cache with offset {o.switch}: the CPU EP has no "
                     f"multiRotaryCacheConcatOffset, so comparisons with {RunKey(ORIGINAL, 'cpu')} stop at {o.switch} "
                     "tokens")
    if r is not None and r.kind == "concat":
        if ep == "webgpu" and not (o is not None and o.kind == "concat"):
            notes.append(f"{rew.path.name}: concatenated LongRoPE cache (offset {r.switch}): WebGPU-only output; on "
                         f"the CPU EP it is wrong past {r.switch} tokens, so {RunKey(REWRITTEN, 'cpu')} is compared up to "
                         "there")
        if ep == "cpu":
            notes.append(f"{rew.path.name}: concatenated LongRoPE cache: it needs multiRotaryCacheConcatOffset, which "
                         f"the CPU EP lacks, so on CPU it is wrong past {r.switch} tokens")
    return notes


def _windows(info: ModelInfo) -> list[int]:
    """Fixed windows: GroupQueryAttention ``local_window_size`` > 0."""
    out: list[int] = []
    if info.model is None:
        return out
    import onnx_ir as ir

    for node in ir.traversal.RecursiveGraphIterator(info.model.graph):
        if node.op_type == "GroupQueryAttention":
            a = node.attributes.get("local_window_size")
            if a is not None and int(a.as_int()) > 0:
                out.append(int(a.as_int()))
    return out


def _no_right_padding(*infos: ModelInfo) -> str | None:
    """Why these graphs take no right-padded batch (see :class:`GraphFacts`), or None."""
    import onnx_ir as ir

    from rope_passes.analysis.graph import flag

    for which, info in zip(("original", "rewritten"), infos):
        if info.model is None:
            continue
        for node in ir.traversal.RecursiveGraphIterator(info.model.graph):
            if node.op_type == "GroupQueryAttention" and flag(node, "do_rotary"):
                return (f"the {which} graph's GroupQueryAttention {node.name!r} rotates inside (do_rotary=1): on "
                        "WebGPU it derives positions from seqlens_k as left padding lays them out (onnxruntime-genai "
                        "pads left), so there a right-padded batch is not a call it takes")
    return None


def graph_facts(orig: ModelInfo, rew: ModelInfo, plan: CheckPlan, embedding_rows: Sequence[int]) -> GraphFacts:
    """What the schedules are built from: ids valid for both graphs (every stated vocabulary, every embedding table
    fed), genai's pad id, the switches, the windows, WebGPU's call cap and the context."""
    rows = list(embedding_rows)
    if not rows and (orig.takes_embeds or rew.takes_embeds):
        rows = [TOKEN_HIGH]  # the fixed-seed default table's rows (.decode.default_embedding_table)
    vocab = vocabulary((orig, rew), rows)  # the model's contract (analysis.genai_contract): no id past a table
    # the context: genai_config's, else the rows of the tables both graphs read (no call runs past either)
    table_end = plan.tables.positions if plan.tables is not None and plan.tables.status == "compared" else None
    context = [c for c in (orig.context_length, table_end) if c]
    loops = [orig.loop, rew.loop]
    shared = [lp.max_length for lp in loops if lp.share_buffer and lp.max_length]
    end = context[0] if context else None
    return GraphFacts(vocab=vocab, pad=orig.genai_config.pad_token_id,
                      switches=tuple(sorted(plan.switches)), windows=tuple(sorted(set(_windows(orig) + _windows(rew)))),
                      max_call=plan.max_call, context=end, no_right_padding=_no_right_padding(orig, rew),
                      max_length=min(shared) if shared else None, static_mask=any(lp.static_mask for lp in loops),
                      takes_positions=caller_positions(orig.model) and caller_positions(rew.model),
                      ends=tuple(sorted({c for c in context if end is None or c <= end})),
                      same_kernels=attention_layout(orig) is not None
                      and attention_layout(orig) == attention_layout(rew),
                      # where the CPU reference affords every position, every one is a decode step after a real past
                      decode_to=end if end and set(range(end)) <= set(plan.positions) else DENSE_DECODE)


def with_schedules(plan: CheckPlan, facts: GraphFacts, given: Sequence[Schedule] | None) -> CheckPlan:
    """``plan`` with its schedules: the given ones, else the default set; a note when a default long prompt cannot
    pass a switch in one call (the sweep stands in there)."""
    schedules = list(given) if given is not None else default_schedules(facts) + client_schedules(facts)
    notes: list[str] = []
    if given is None:
        far = unreached(facts)
        if far:
            notes.append(f"schedules: threshold(s) {', '.join(map(str, far))} are past {BOUNDARY_MAX} tokens: "
                              "the sweep's single steps after a random past stand in for calls at them")
        if facts.no_right_padding is not None:
            notes.append(f"schedules: the right-padded batch on the CPU EP only: {facts.no_right_padding}")
        n, why = facts.long_prompt()
        missed = [c for c in facts.switches if c + 1 > n] + [w for w in facts.windows if w + 1 > n]
        if missed:
            notes.append(f"schedules: the long prompt is {n} tokens ({why}); it does not pass "
                         f"{', '.join(map(str, missed))}: the sweep's steps after a random past cover that")
    return dataclasses.replace(plan, facts=facts, schedules=tuple(schedules), notes=(*plan.notes, *notes))


__all__ = ["MAX_CROSSING_STEPS", "PAST_SWITCH", "CheckOptions", "CheckPlan", "graph_facts", "plan_check",
           "weight_bytes", "with_schedules"]
