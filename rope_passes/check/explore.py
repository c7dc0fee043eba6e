"""``check --budget 60s --seed N`` (docs/checker.md): after the check's own runs, random schedules
(:func:`.schedules.random_schedule`) on both graphs, in sessions of this process, on every EP each fits, compared as
the schedules are (:func:`.evidence.schedules.compare_calls`), until the budget is spent; the first that differs is
shrunk (:func:`.schedules.shrink`) and printed as a command line that reruns it (``--schedule``). Only where the
check's runtime is this process's own: another interpreter's, or a backend's (the browser), draws nothing and says
so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import time
from typing import Any

import numpy as np

from rope_passes.check.compare import Comparison, OutputDiff, Tolerance
from rope_passes.check.decode import DecoderSpec
from rope_passes.check.evidence import concat_offset
from rope_passes.check.evidence.schedules import compare_calls, padded_rows_kept
from rope_passes.check.models import ModelInfo
from rope_passes.check.plan import CheckOptions, CheckPlan
from rope_passes.check.schedule_runs import AGAIN, ROW, run_reference, run_schedule
from rope_passes.check.schedules import Schedule, fits, random_schedule, shrink
from rope_passes.check.spec import ORIGINAL, REWRITTEN, RunKey


@dataclasses.dataclass
class Exploration:
    """What ``--budget`` did: how many schedules it drew, and the first that differs, shrunk."""

    seed: int
    budget_s: float
    pairs: list[str]  # "<rewritten run> vs <original run>" per EP (RunKey labels)
    drawn: int = 0
    wall_s: float = 0.0
    found: Schedule | None = None  # the first drawn schedule that differs
    shrunk: Schedule | None = None  # the smallest one reached from it that still differs
    pair: str = ""  # where it differs
    diff: OutputDiff | None = None  # the first differing output of ``shrunk``
    tries: int = 0  # schedules run while shrinking
    command: str = ""  # reruns ``shrunk``
    reason: str = ""  # why nothing was explored

    def comparison(self, tolerance: Tolerance) -> Comparison:
        actual, _, reference = (self.pair or (self.pairs[0] if self.pairs else "rewritten vs original")).partition(
            " vs ")
        c = Comparison(actual, reference or "original", tolerance, True, kind="random")
        if self.reason:
            c.status, c.reason = "skipped", self.reason
            return c
        what = f"--budget {self.budget_s:g}s --seed {self.seed}: {self.drawn} random schedule(s) in {self.wall_s:.1f} s"
        if self.diff is None:
            c.reason = what + ", none differs"
            c.diffs.append(OutputDiff(0, "(all)", 0.0, 0.0, True, schedule="random"))
        else:
            assert self.found is not None and self.shrunk is not None
            c.diffs.append(self.diff)
            c.reason = (f"{what}; {self.found.name} differs, shrunk in {self.tries} tries to "
                        f"{self.shrunk.summary()}; rerun: {self.command}")
        return c

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "budget_s": self.budget_s, "pairs": self.pairs, "drawn": self.drawn,
                "wall_s": round(self.wall_s, 3), "reason": self.reason,
                "found": self.found.to_dict() if self.found else None,
                "shrunk": self.shrunk.to_dict() if self.shrunk else None, "pair": self.pair,
                "difference": self.diff.to_dict() if self.diff else None, "tries": self.tries,
                "command": self.command}


def command_line(original: Any, rewritten: Any, opts: CheckOptions, schedule: Schedule) -> str:
    """``rope-passes check`` with the options that change what runs, and ``--schedule``."""
    args = ["rope-passes", "check", str(original), str(rewritten)]
    if opts.ep != "webgpu":
        args += ["--ep", opts.ep]
    if opts.layers is not None:
        args += ["--layers", str(opts.layers)]
    for name, size in (opts.dims or {}).items():
        args += ["--dim", f"{name}={size}"]
    if opts.embeddings:
        args += ["--embeddings", opts.embeddings]
    for name, value in (opts.tolerance or {}).items():
        args += [f"--{name}", f"{value:g}"]
    args += ["--schedule", schedule.text()]
    return shlex.join(args)


def _sessions(orig: ModelInfo, rew: ModelInfo, emb_orig: str | None, emb_rew: str | None, opts: CheckOptions
              ) -> list[tuple[str, tuple[Any, DecoderSpec, Any, DecoderSpec]]]:
    from rope_passes.runtime.sessions import create_session

    pairs = []
    for ep in ["cpu"] + (["webgpu"] if opts.ep == "webgpu" else []):
        sides = []
        for info, emb in ((rew, emb_rew), (orig, emb_orig)):
            sess = create_session(str(info.path), ep, webgpu_options=dict(info.webgpu_options) if ep == "webgpu"
                                  else {})
            table = np.load(emb) if emb else None
            sides.append((sess, DecoderSpec.from_session(sess, info.genai_config, dims=dict(opts.dims or {}),
                                                         embedding_table=table)))
        pairs.append((f"{RunKey(REWRITTEN, ep)} vs {RunKey(ORIGINAL, ep)}",
                      (sides[0][0], sides[0][1], sides[1][0], sides[1][1])))
    return pairs


def differs(schedule: Schedule, pair: tuple[Any, DecoderSpec, Any, DecoderSpec], tolerance: Tolerance,
            vocab: int) -> OutputDiff | None:
    """The first output that differs on ``schedule`` between the two sessions of ``pair`` ((actual session, spec,
    reference session, spec); the reference run twice and row by row, as the check's reference runs are); a call
    that raises on the actual side only is a difference."""
    sa, da, sb, db = pair
    made: dict[str, list[dict[str, np.ndarray]]] = {}
    with contextlib.suppress(Exception):  # the reference cannot run it all: compare the calls before
        run_reference(sb, db, schedule, vocab, made)
    ref = made.get(schedule.name, [])
    rows = padded_rows_kept(schedule, ref, {b: made.get(f"{schedule.name}{ROW}{b}", [])
                                            for b in range(schedule.batch)}, tolerance)
    got: list[dict[str, np.ndarray]] = []
    try:
        run_schedule(sa, da, schedule, got)
    except Exception as exc:  # noqa: BLE001 - a call that raises only on the actual side is a difference
        if len(got) < len(ref):
            return OutputDiff.failed(len(got), " ".join(str(exc).split())[:300], schedule=schedule.name)
    c = Comparison("actual", "reference", tolerance, True, kind="schedule")
    compare_calls(schedule, got, ref, c, again=made.get(schedule.name + AGAIN, []), rows=rows)
    return c.first_failure


def explore(orig: ModelInfo, rew: ModelInfo, plan: CheckPlan, opts: CheckOptions, original: Any,
            rewritten: Any, runtime: str | None = None, elsewhere: str | None = None) -> Exploration:
    """Random schedules for ``opts.budget`` seconds (module docstring) on ``runtime``, which runs in this process
    unless ``elsewhere`` names why not."""
    start = time.perf_counter()
    out = Exploration(opts.seed, opts.budget, [])
    if elsewhere:
        out.reason = f"--budget draws in this process, and {runtime} {elsewhere}: nothing explored"
        return out
    if plan.facts is None:
        out.reason = "no schedule facts (not a decoder)"
        return out
    try:
        pairs = _sessions(orig, rew, *plan.embeddings, opts)
    except Exception as exc:  # noqa: BLE001 - a graph that does not load here: the check's runs say so
        out.reason = f"the graphs do not both load here ({' '.join(str(exc).split())[:200]})"
        return out
    if not all(p[1][1].is_decoder and p[1][3].is_decoder for p in pairs):
        out.reason = "not decoders: no schedules to draw"
        return out
    out.pairs = [name for name, _ in pairs]
    offset = concat_offset(orig, rew)

    def usable(s: Schedule, name: str) -> bool:
        if RunKey.parse(name.partition(" vs ")[0]).ep == "webgpu":
            return fits(s, plan.max_call)
        return not offset or s.width + sum(s.then) <= offset  # CPU: no concat offset

    rng = np.random.RandomState(opts.seed)
    facts = plan.facts
    while time.perf_counter() - start < opts.budget:
        s = random_schedule(rng, facts, name=f"random-{out.drawn}")
        out.drawn += 1
        opts.say("random schedules", out.drawn - 1, out.drawn)
        for name, pair in pairs:
            if not usable(s, name):
                continue
            d = differs(s, pair, plan.tolerance, facts.vocab)
            if d is None:
                continue
            out.found, out.pair = s, name

            def still(c: Schedule, pair: Any = pair, name: str = name) -> bool:
                return usable(c, name) and differs(c, pair, plan.tolerance, facts.vocab) is not None

            out.shrunk, out.tries = shrink(s, still)
            out.diff = differs(out.shrunk, pair, plan.tolerance, facts.vocab) or d
            out.diff.schedule = out.shrunk.name
            out.command = command_line(original, rewritten, opts, dataclasses.replace(out.shrunk))
            out.wall_s = time.perf_counter() - start
            return out
    out.wall_s = time.perf_counter() - start
    return out


__all__ = ["Exploration", "command_line", "explore"]
