"""The cos/sin a graph computes against what its Hugging Face ``config.json`` says (``precompute-cos-sin`` and the
RP4xx lint rules).

A chain (positions → cos or sin, as ``precompute-cos-sin`` matches it) is evaluated on onnxruntime CPU for one call
of positions ``0..rows-1``; LongRoPE configs also for a call of ``0..original-1`` (transformers picks the short
factors while the call's largest position + 1 <= original, the long ones after). The rows are compared with
:meth:`rope_passes.hf_config.Rope.tables` (tolerance :data:`TOL`: float32 tables differ from transformers' by an ulp
or two), and a mismatch is explained: the first wrong position and the likely cause (LongRoPE frozen at export,
theta differs, scaling ignored, attention scaling differs, rotary width differs).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from rope_passes.errors import ModelLoadError
from rope_passes.hf_config import HFConfig, Rope
from rope_passes.proofs.chain import Chain
from rope_passes.proofs.constants import constant
from rope_passes.report import MatchFailure, PassReport
from rope_passes.runtime.evaluate import evaluate_subgraph, subgraph_runner

UNKNOWN_SIZE = ("table size unknown: give max_positions (or model.context_length in genai_config.json, or "
                "max_position_embeddings in the config.json beside the model)")

#: max |graph - config| for a row to count as right (float32); float16 chains get :data:`TOL_FP16`
TOL, TOL_FP16 = 1e-5, 4e-3


@dataclasses.dataclass
class Verdict:
    """One chain against one rope of the config."""

    rope: Rope
    ok: bool
    first_wrong: int | None = None  # the first position at which the graph is wrong
    worst: float = 0.0
    cause: str = ""
    frozen: str | None = None  # LongRoPE frozen at export: "short" or "long" (the factors the graph always uses)

    def message(self, what: str) -> str:
        return (f"{what} differs from config.json ({self.rope.describe()}) from position {self.first_wrong} on "
                f"(by up to {self.worst:.3g}): {self.cause}")


def calls(dtype: ir.DataType, rank: int, rows: int) -> np.ndarray:
    """One call of positions ``0..rows-1`` in the position input's layout (``[1, rows]`` or ``[3, 1, rows]``)."""
    call = np.arange(rows)[None, :] if rank > 1 else np.arange(rows)  # rank 1: a Range source
    if rank == 3:
        call = np.stack([call] * 3)
    return call.astype(np.int64 if dtype == ir.DataType.INT64 else np.int32)


def shape_feeds(shape_inputs: Sequence[ir.Value], positions_shape: Sequence, call: np.ndarray) -> list[np.ndarray]:
    """Zeros for the inputs a chain reads only the shape of: a dim named like one of the positions' takes its
    extent in ``call``, the other symbolic dims 1."""
    named = {str(d): call.shape[k] for k, d in enumerate(positions_shape) if not isinstance(d, int)}
    return [np.zeros([d if isinstance(d, int) else named.get(str(d), 1) for d in v.shape],
                     dtype=v.dtype.numpy()) for v in shape_inputs]


def rows_of(model: ir.Model, chain: Chain, rows: int, inv_freq: tuple[ir.Value, np.ndarray] | None = None,
            end: ir.Value | None = None) -> np.ndarray:
    """The chain end's rows ``[rows, D]`` for one call of positions ``0..rows-1`` (``inv_freq``: a value replaced by
    an array, fed in its place; the model is not changed)."""
    call = calls(chain.positions_dtype, len(chain.positions_shape), rows)
    feeds = [call, *shape_feeds(chain.shape_inputs, chain.positions_shape, call)]
    inputs = [chain.positions, *chain.shape_inputs]
    if inv_freq is not None:
        value, array = inv_freq
        inputs.append(value)
        feeds.append(array)
    try:
        (result,) = evaluate_subgraph(model, inputs, [end if end is not None else chain.end], feeds)
    except Exception as exc:  # noqa: BLE001 - any failure is a reason in a report
        raise MatchFailure.absent(f"cannot evaluate the cos/sin subgraph on onnxruntime CPU "
                                  f"({type(exc).__name__}: {str(exc).splitlines()[0][:160]})") from exc
    return result.reshape(-1, rows, result.shape[-1])[0]  # [1, rows, D] or [3, 1, rows, D]: first rows


def _want(rope: Rope, rows: int, role: str, width: int, long: bool) -> np.ndarray | None:
    cos, sin = rope.tables(rows, long)
    table = cos if role == "cos" else sin
    if width == table.shape[1]:
        return table
    if 2 * width == table.shape[1]:  # mRoPE per-axis tables: the frequencies before the Concat(f, f)
        return table[:, :width]
    return None


def _first_wrong(got: np.ndarray, want: np.ndarray, tol: float) -> tuple[int | None, float]:
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64)).max(axis=1)
    bad = np.flatnonzero(diff > tol)
    return (int(bad[0]) if bad.size else None), float(diff.max())


def judge(rope: Rope, role: str, long_rows: np.ndarray, short_rows: np.ndarray | None, tol: float = TOL) -> Verdict:
    """``long_rows``: the chain's rows for the call ``0..N-1``; ``short_rows``: for ``0..original-1`` (LongRoPE)."""
    rows, width = long_rows.shape
    want = _want(rope, rows, role, width, long=True)
    if want is None:
        return Verdict(rope, False, 0, math.inf, f"the graph rotates {width} channels, config.json's rotary dimension "
                                                 f"is {rope.rotary_dim} (head_dim {rope.head_dim} × "
                                                 f"partial_rotary_factor {rope.partial_rotary_factor:g})")
    first, worst = _first_wrong(long_rows, want, tol)
    if rope.switches:
        orig = rope.original_max or rows
        short_want = _want(rope, rows, role, width, long=False)
        frozen_short = _first_wrong(long_rows, short_want, tol)[0] is None
        short_ok = short_rows is None or _first_wrong(short_rows, short_want[:len(short_rows)], tol)[0] is None
        if first is None and short_ok:
            return Verdict(rope, True, worst=worst)
        if frozen_short:
            return Verdict(rope, False, orig, worst, f"LongRoPE frozen at export: the graph uses the short factors "
                                                     f"past position {orig - 1} (transformers switches to the long "
                                                     f"factors once a call reaches position {orig})", "short")
        if first is None:
            s_first, s_worst = _first_wrong(short_rows, short_want[:len(short_rows)], tol)
            return Verdict(rope, False, s_first, s_worst, f"LongRoPE frozen at export: the graph uses the long factors "
                                                         f"also in calls below position {orig}", "long")
        return Verdict(rope, False, first, worst, _cause(rope, role, long_rows, want))
    if first is None:
        return Verdict(rope, True, worst=worst)
    return Verdict(rope, False, first, worst, _cause(rope, role, long_rows, want))


def _frequencies(role: str, rows: np.ndarray) -> tuple[np.ndarray, float] | None:
    """(inverse frequencies, amplitude) read back from a cos table (row ``p`` holds ``cos(p × inv_freq) × scale``):
    per frequency from the row whose angle is near 1 radian, where arccos is well conditioned."""
    if role != "cos" or rows.shape[0] < 2:
        return None
    scale = float(rows[0, 0])
    if scale <= 0:
        return None
    table = np.clip(rows.astype(np.float64) / scale, -1, 1)
    half = table.shape[1] // 2
    inv = np.empty(half)
    for j in range(half):
        coarse = float(np.arccos(table[1, j]))
        p = int(min(table.shape[0] - 1, max(1, 1.0 / max(coarse, 1e-12))))
        inv[j] = float(np.arccos(table[p, j])) / p
    return inv, scale


def _cause(rope: Rope, role: str, got: np.ndarray, want: np.ndarray) -> str:
    found = _frequencies(role, got)
    if found is None:
        return "the frequencies differ from config.json's"
    inv, scale = found
    expected = rope.inv_freq(long=rope.switches).astype(np.float64)[: len(inv)]
    plain = dataclasses.replace(rope, kind="default").inv_freq().astype(np.float64)[: len(inv)]
    if not math.isclose(scale, rope.attention_scaling, rel_tol=1e-4) and np.allclose(inv, expected, rtol=1e-3,
                                                                                      atol=1e-7):
        return f"attention scaling differs: the graph multiplies cos/sin by {scale:.6g}, config.json by " \
                   f"{rope.attention_scaling:.6g}"
    if rope.kind != "default" and np.allclose(inv, plain, rtol=1e-3, atol=1e-7):
        return f"scaling ignored: the graph computes plain (unscaled) frequencies, config.json says {rope.kind}"
    if len(inv) > 1 and 0 < inv[1] < 1:
        theta = float(inv[1] ** (-len(inv)))  # inv[j] = theta ** (-j / half)
        fitted = theta ** (-np.arange(len(inv)) / len(inv))
        if np.allclose(inv, fitted, rtol=1e-3, atol=1e-7) and not math.isclose(theta, rope.theta, rel_tol=1e-2):
            return f"theta differs: the graph uses theta ≈ {theta:.6g}, config.json {rope.theta:g}"
    ratio = inv[1:] / expected[1:] if len(inv) > 1 else np.array([])
    if ratio.size and np.allclose(ratio, ratio[0], rtol=1e-3) and not math.isclose(ratio[0], 1, rel_tol=1e-3):
        return f"the frequencies are config.json's scaled by {ratio[0]:.6g} (a linear factor differs)"
    return "the frequencies differ from config.json's"


# -- precompute-cos-sin: finding the config, checking its chains, rebuilding frozen LongRoPE --------------------------
def find_ropes(model_path, explicit: str | None) -> tuple[HFConfig | None, list[Rope] | MatchFailure]:
    """The config (explicit, else beside the model) and its ropes; a MatchFailure (refuse) for dynamic types;
    ModelLoadError (one line, exit 2) for a config whose rope cannot be computed (:func:`check_rope`)."""
    hf = HFConfig.find(model_path, explicit)
    if hf is None:
        return None, []
    try:
        ropes = [hf.rope(layer_type) for layer_type in hf.layer_types()]
    except MatchFailure as failure:
        return hf, failure
    for rope in ropes:
        check_rope(hf, rope)
    return hf, ropes


def check_rope(hf: HFConfig, rope: Rope) -> None:
    """ModelLoadError unless the config's rope computes: positive finite theta and head size, a rotary width of at
    least 2, and per-frequency numbers (LongRoPE's ``short_factor`` / ``long_factor``) one per frequency, finite and
    positive. A malformed config is the user's input, said in one line, never an internal error."""
    where = f"{hf.path}" + (f" ({rope.layer_type})" if rope.layer_type else "")
    half = rope.rotary_dim // 2
    if not (math.isfinite(rope.theta) and rope.theta > 0) or rope.head_dim <= 0 or half < 1:
        raise ModelLoadError(f"{where}: malformed rope: theta {rope.theta!r}, head_dim {rope.head_dim!r}, "
                             f"partial_rotary_factor {rope.partial_rotary_factor!r} (rotary dim {rope.rotary_dim})")
    if rope.kind == "longrope":
        for key in ("short_factor", "long_factor"):
            factors = rope.params.get(key)
            try:
                array = np.asarray(factors, dtype=np.float64).reshape(-1)
            except (TypeError, ValueError):
                array = None
            if array is None or array.size != half or not np.all(np.isfinite(array)) or np.any(array <= 0):
                size = "missing" if factors is None else (f"{array.size} numbers" if array is not None else
                                                          "not numbers")
                raise ModelLoadError(f"{where}: malformed LongRoPE {key}: {size}, but rotary dim {rope.rotary_dim} "
                                     f"needs {half} positive numbers (one per frequency)")
    try:
        arrays = [rope.inv_freq(), *([rope.inv_freq(long=True)] if rope.switches else [])]
        scaling = rope.attention_scaling
    except (ArithmeticError, KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"{where}: malformed {rope.kind} rope parameters ({type(exc).__name__}: {exc})") from None
    if any(a.shape != (half,) or not np.all(np.isfinite(a)) for a in arrays) or not math.isfinite(scaling):
        raise ModelLoadError(f"{where}: malformed {rope.kind} rope parameters: the frequencies they give are not "
                             f"{half} finite numbers")


def repair_words(verdict: Verdict, role: str, config: str) -> str:
    """The one sentence a repair of LongRoPE frozen at export is reported in (precompute-cos-sin) and announced in
    (lint RP401): what the input computed, what the output computes, and what the config says."""
    rope = verdict.rope
    orig = rope.original_max
    frozen = verdict.frozen or "short"
    return (f"the input computed {role} with LongRoPE's {frozen} factors for every call (frozen at export), the output "
            f"computes them with the short factors while the call's largest position + 1 <= {orig} and the long "
            f"factors after (two tables and transformers' switch), because {config} says {rope.describe()}")


def best_verdict(model: ir.Model, chain: Chain, long_rows: np.ndarray, ropes: Sequence[Rope]) -> Verdict:
    """The chain against every rope of the config (Gemma3: one per layer type): a right one, else the likeliest."""
    tol = TOL_FP16 if long_rows.dtype == np.float16 else TOL
    verdicts = []
    for rope in ropes:
        short = None
        if rope.switches and rope.original_max and rope.original_max < len(long_rows):
            short = rows_of(model, chain, rope.original_max)
        verdicts.append(judge(rope, chain.role, long_rows, short, tol))
    return min(verdicts, key=lambda v: (not v.ok, v.frozen is None, -(v.first_wrong or 0), v.worst))


def against_config(model: ir.Model, chains: Sequence[Chain], tables: dict[int, np.ndarray], ropes: Sequence[Rope],
                   report: PassReport, repair: str | None = None) -> None:
    """Check each chain's table with the config: right (nothing to do), wrong (a note: the tables keep what the graph
    computes), or LongRoPE frozen at export. ``repair``: the config the user asked the output to follow (its path;
    None: a config found beside the model, which never changes what the model computes): then a frozen chain gets
    ``switch`` (the other table evaluated with the config's other inv_freq in the graph's own chain) and ``repaired``
    (what the report says)."""
    for c in chains:
        table = tables[id(c.end)]
        try:
            verdict = best_verdict(model, c, table, ropes)
            if verdict.ok:
                continue
            what = f"{c.trig.op_type} ({c.role} table)"
            if verdict.frozen is None or len(c.positions_shape) != 2:
                report.note(c.trig.name, verdict.message(what) + "; the tables keep what the graph computes "
                            "(rope-passes lint: RP401)", first_wrong=verdict.first_wrong)
                continue
            if repair is None:
                report.note(c.trig.name, verdict.message(what) + "; the tables keep what the graph computes. Changing "
                            "that is a repair, done only on request: give this config with --hf-config (rope-passes "
                            "lint: RP401)", first_wrong=verdict.first_wrong)
                continue
            c.switch = _rebuild(model, c, table, verdict.rope, verdict.frozen)
            c.repaired = "repaired: " + repair_words(verdict, c.role, repair)
        except MatchFailure as failure:
            report.record(failure, c.trig)
            tables.pop(id(c.end), None)


def _rebuild(model: ir.Model, c: Chain, table: np.ndarray, rope: Rope, frozen: str) -> tuple[np.ndarray, np.ndarray,
                                                                                                 int]:
    """(short, long, original): the graph's own table for the factors it froze, its own chain with the config's other
    inv_freq for the rest; refused unless the graph's inv_freq constant is the config's frozen one."""
    current = constant(c.inv_freq)  # its value, however the graph spells it
    frozen_inv = rope.inv_freq(long=frozen == "long")
    if current is None or current.size != frozen_inv.size or current.dtype.kind != "f" or not np.allclose(
            current.reshape(-1), frozen_inv, rtol=1e-6, atol=0):
        raise MatchFailure.refuse(f"LongRoPE frozen at export, but {c.inv_freq.name!r} is not config.json's "
                                  f"{frozen} inv_freq: not rebuilt", c.trig)
    replaced = rope.inv_freq(long=frozen == "short").astype(current.dtype).reshape(current.shape)
    other = rows_of(model, c, len(table), (c.inv_freq, replaced))
    short, long = (table, other) if frozen == "short" else (other, table)
    return np.ascontiguousarray(short), np.ascontiguousarray(long), int(rope.original_max or len(table))


def per_call_tables(model: ir.Model, c: Chain, ropes: Sequence[Rope], rows: int, lr) -> tuple[np.ndarray,
                                                                                                 np.ndarray, int]:
    """LongRoPE chosen per call in the graph (``Where(ReduceMax(positions) + 1 > original, long, short)``) with a
    LongRoPE config: the two tables are the chain evaluated with each branch fed in place of the Where's output;
    refused unless the branches and the threshold are the config's, and the graph equals the rebuilt switch on calls
    on both sides of it."""
    rope = next((r for r in ropes if r.switches), None)
    if rope is None or lr.threshold != rope.original_max:
        raise MatchFailure.refuse(f"LongRoPE chosen per call: {lr.switch} (node {lr.switch_node!r}) does not switch "
                                  f"where config.json says ({rope.describe() if rope else 'no longrope rope'})",
                                  c.trig)
    branches = []
    for which, value in (("long", lr.long[0]), ("short", lr.short[0])):
        array = constant(value)
        if array is None or array.dtype.kind != "f" or array.size != rope.inv_freq().size or not np.allclose(array.reshape(-1), rope.inv_freq(long=which == "long"), rtol=1e-6, atol=0):
            raise MatchFailure.refuse(f"LongRoPE chosen per call: the {which} inv_freq {value.name!r} is not "
                                      "config.json's", c.trig)
        branches.append(rows_of(model, c, rows, (lr.node.outputs[0], array)))
    long, short = branches
    orig = int(rope.original_max)
    if rows <= orig:
        raise MatchFailure.refuse(f"LongRoPE chosen per call switches at {orig} but the table holds {rows} positions "
                                  "(--max-positions): the long factors would never be used", c.trig)
    cond = lr.node.inputs[0]
    try:  # one session each for the switch and the chain, run on every call below
        switch = subgraph_runner(model, [c.positions], [cond], [(c.positions_dtype, len(c.positions_shape))])
    except ValueError:  # onnx_ir's extract: the condition reads more than the positions
        raise MatchFailure.refuse(f"LongRoPE chosen per call: the switch {cond.name!r} reads more than the "
                                  "positions", c.trig) from None
    chain = subgraph_runner(model, [c.positions, *c.shape_inputs], [c.end],
                            [(c.positions_dtype, len(c.positions_shape))])
    for call in (np.arange(orig)[None], np.arange(rows)[None], np.array([[orig - 2, orig - 1], [0, 5]]),
                 np.array([[orig - 1, orig]]), np.array([[0], [orig]]), np.array([[1], [orig]]),
                 np.array([[orig], [1]]), np.array([[1, 2], [orig - 1, orig]]), np.array([[3], [orig - 1]])):
        call = call.astype(np.int64 if c.positions_dtype == ir.DataType.INT64 else np.int32)
        # the switch itself: one choice for the whole call, from the positions alone (a per-row condition, or one
        # reading the call's shape, is not transformers' switch)
        (choice,) = switch([call])
        if choice.size != 1 or bool(choice.reshape(-1)[0]) != bool(call.max() + 1 > orig):
            raise MatchFailure.refuse(f"LongRoPE chosen per call: with positions {call.tolist()} the switch "
                                      f"{cond.name!r} is {choice.tolist()}, not one choice ReduceMax(positions) + 1 > "
                                      f"{orig} for the whole call", c.trig)
        (got,) = chain([call, *shape_feeds(c.shape_inputs, c.positions_shape, call)])
        want = long[call] if call.max() + 1 > orig else short[call]
        if got.shape != want.shape or not np.array_equal(got, want):
            raise MatchFailure.refuse(f"LongRoPE chosen per call: with positions {call.tolist()} the graph's rows are "
                                      "not the rebuilt switch's", c.trig)
    return np.ascontiguousarray(short), np.ascontiguousarray(long), orig


__all__ = ["TOL", "TOL_FP16", "UNKNOWN_SIZE", "Verdict", "against_config", "best_verdict", "calls",
           "check_rope", "find_ropes", "judge", "repair_words", "per_call_tables", "rows_of", "shape_feeds"]
