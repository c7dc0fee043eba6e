"""Per-layer rotation conformance (RP405 error, RP406 note): the rotation each attention layer applies, probed.

RP401-RP404 compare cos/sin *tables* (chains, caches) with config.json; they cannot see a layer whose rotation itself
is wrong: ``rotate_half`` reversed (a rotation by -angle), two layers reading each other's chain (Gemma 3 sliding
and full), a layer's private chain, or query and key gathered at different positions. This module probes the rotation
numerically:

* **Sites.** The torch exporters' form ``Add(Mul(x, cos'), Mul(rotate_half(x), sin'))`` (``cos'``/``sin'`` computed
  from a ``Cos``/``Sin`` node, ``rotate_half(x)`` made of Slice/Neg/Concat of ``x``; partial rotary: ``x`` a Slice of
  the head and the result concatenated with the head's other Slice), and RotaryEmbedding nodes (ONNX and
  com.microsoft: mobius). The site is the rotated value; the layer and whether it is the query or the key come from
  the attention node it reaches (MatMul or a fused attention op; input 0: query, 1: key), the ``present.N`` /
  ``key_values.layers.N`` output the key reaches or a ``layers.N`` name (else the order of the attention nodes).
* **Probe.** The subgraph from ``x`` and ``position_ids`` (and inputs read for their shape only) to the rotated values
  is extracted and run on onnxruntime CPU (sites grouped into few sessions), with ``x`` replaced by the head's basis
  vectors spread over heads and batch rows, at a handful of positions (0, 1, 2, 7, 100, max - 1): column ``b`` of
  the result is column ``b`` of the layer's ``head_dim x head_dim`` rotation matrix ``R(p)``. LongRoPE: a second call
  with the positions below ``original_max_position_embeddings`` alone (the short factors).
* **Expected.** ``HFConfig.layer_rope(layer)`` (the layer's type for Gemma 3) gives the angles
  (:meth:`rope_passes.hf_config.Rope.angles`), the attention scaling and the pair layout.

A site whose matrix is not block-diagonal on the config's pairs (nor on the other layout's), or a graph whose structure
is not understood (positions made in the graph, other graph inputs read for their values, shapes that do not
broadcast, a dynamic rope), is skipped silently. Query and key shifted by the same constant number of positions
compute the same attention (RoPE is relative): a note (RP406), not an error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.positions import position_input
from rope_passes.analysis.rotation_sites import Site, graph_inputs_needed
from rope_passes.analysis.rotation_sites import sites as find_sites
from rope_passes.errors import ModelLoadError
from rope_passes.hf_config import INV_FREQ_ULPS, VALUE_ULPS, HFConfig, Rope
from rope_passes.lint.core import LintContext, Severity, rule
from rope_passes.proofs.rotation import PROBE, probe_rotations
from rope_passes.report import MatchFailure


def _expected(rope: Rope, positions: np.ndarray, head_dim: int, long: bool = False) -> np.ndarray | None:
    """``[P, D, D]``: the rotation config.json's rope applies at ``positions`` (pass-through past the rotary dim)."""
    half = rope.rotary_dim // 2
    if rope.rotary_dim > head_dim or half == 0:
        return None
    angles = rope.angles(positions, long).astype(np.float64)
    scale = float(rope.attention_scaling)
    c, s = np.cos(angles) * scale, np.sin(angles) * scale
    out = np.zeros((len(positions), head_dim, head_dim))
    for d in range(rope.rotary_dim, head_dim):
        out[:, d, d] = 1.0
    for j in range(half):
        a, b = (2 * j, 2 * j + 1) if rope.interleaved else (j, j + half)
        out[:, a, a], out[:, b, b], out[:, a, b], out[:, b, a] = c[:, j], c[:, j], -s[:, j], s[:, j]
    return out


def _tolerance(rope: Rope, positions: np.ndarray, fp16: bool, long: bool = False) -> np.ndarray:
    """``[P]``: what float32 (float16) rounding lets a correct producer differ by (:meth:`Rope.tolerance`'s terms at
    these positions), plus the rotation's own products."""
    inv = rope.inv_freq(long).astype(np.float64)
    angles = np.abs(rope.angles(positions, long))
    angle_err = positions.astype(np.float64)[:, None] * INV_FREQ_ULPS * np.spacing(inv.astype(np.float32)) \
        + np.spacing(angles).astype(np.float64)
    scale = max(abs(float(rope.attention_scaling)), 1.0)
    tol = scale * (angle_err.max(axis=1) + VALUE_ULPS * float(np.spacing(np.float32(1))))
    return 2 * tol + (4e-3 if fp16 else 1e-5) * scale


@dataclasses.dataclass
class _Verdict:
    ok: bool = False
    shift: int | None = None  # the graph rotates by position + shift everywhere
    first: int | None = None  # the first probed position where it differs
    angle: float = 0.0  # the largest angle error there (radians)
    size: float = 0.0  # the largest |difference| of the matrices there
    cause: str = ""


def _angles_of(m: np.ndarray, rope: Rope) -> np.ndarray:
    half = rope.rotary_dim // 2
    js = np.arange(half)
    a, b = (2 * js, 2 * js + 1) if rope.interleaved else (js, js + half)
    return np.arctan2(m[:, b, a], m[:, a, a])


def _wrap(x: np.ndarray) -> np.ndarray:
    return (x + np.pi) % (2 * np.pi) - np.pi


def _judge(m: np.ndarray, rope: Rope, probe: np.ndarray, head_dim: int, fp16: bool,
           others: list[Rope], long: bool = False) -> _Verdict | None:
    """None: not a rotation on the config's pairs (not understood, skipped)."""
    want = _expected(rope, probe, head_dim, long)
    if want is None:
        return None
    tol = _tolerance(rope, probe, fp16, long)
    mask = (want != 0) | (_expected(rope, probe + 1, head_dim, long) != 0)  # the pairs' blocks
    if np.abs(np.where(mask, 0, m)).max() > 1e-3 + tol.max():
        flipped = dataclasses.replace(rope, interleaved=not rope.interleaved)
        alt = _expected(flipped, probe, head_dim, long)
        if alt is None or not (np.abs(m - alt).max(axis=(1, 2)) <= tol).all():
            return None  # off-block entries: other pairs, or a site not understood
        diff = np.abs(m - want).max(axis=(1, 2))
        first = int(np.flatnonzero(diff > tol)[0])
        return _Verdict(first=int(probe[first]), angle=float(np.abs(rope.angles(probe[first:first + 1], long)).max()),
                        size=float(diff[first]), cause=(
                            f"it rotates {'interleaved pairs (2i, 2i+1)' if flipped.interleaved else 'halves (i, i + d/2)'}"
                            f", config.json's family rotates {'interleaved pairs' if rope.interleaved else 'halves'}"))
    diff = np.abs(m - want).max(axis=(1, 2))
    if (diff <= tol).all():
        return _Verdict(ok=True)
    # q or k at position + shift (the lowest frequency says by how much)
    got = _angles_of(m, rope)
    inv = rope.inv_freq(long).astype(np.float64)
    j = int(np.argmin(inv))
    shift = int(round(float(_wrap(got[0, j] - rope.angles(probe[:1], long).astype(np.float64)[0, j])) / inv[j]))
    if shift:
        moved = _expected(rope, probe + shift, head_dim, long)
        if moved is not None and (np.abs(m - moved).max(axis=(1, 2)) <= _tolerance(rope, probe + abs(shift),
                                                                                     fp16, long)).all():
            return _Verdict(shift=shift)
    bad = np.flatnonzero(diff > tol)
    first = int(bad[0])
    angle_err = np.abs(_wrap(got - rope.angles(probe, long).astype(np.float64)))  # [P, pairs]
    verdict = _Verdict(first=int(probe[first]), angle=float(angle_err.max()), size=float(diff[first]))
    if (np.abs(m - np.transpose(want, (0, 2, 1))).max(axis=(1, 2)) <= tol).all():
        verdict.cause = "it rotates by -angle (rotate_half reversed: the sin term has the wrong sign)"
        return verdict
    if rope.switches:
        frozen = _expected(rope, probe, head_dim, not long)
        if frozen is not None and (np.abs(m - frozen).max(axis=(1, 2)) <= _tolerance(rope, probe, fp16,
                                                                                       not long)).all():
            verdict.cause = (f"it rotates by the {'short' if long else 'long'} factors in a call "
                             f"{'past' if long else 'within'} original_max_position_embeddings {rope.original_max} "
                             f"(LongRoPE frozen)")
            return verdict
    for other in others:
        alt = _expected(other, probe, head_dim, long and other.switches)
        if alt is not None and (np.abs(m - alt).max(axis=(1, 2)) <= _tolerance(other, probe, fp16,
                                                                                 long and other.switches)).all():
            verdict.cause = f"it rotates by the {other.layer_type} rope ({other.describe()})"
            return verdict
    amp = np.hypot(m[first][0, 0], m[first][rope.rotary_dim // 2 if not rope.interleaved else 1, 0])
    if abs(amp - abs(rope.attention_scaling)) > 1e-3:
        verdict.cause = f"its cos/sin are scaled by {amp:.6g}, config.json's attention scaling is " \
                        f"{rope.attention_scaling:.6g}" + (
                            "; its angles differ too" if verdict.angle > 1e-3 + tol.max() else "")
    else:
        verdict.cause = "its angles differ (another theta, scaling or positions)"
    return verdict


def _findings(ctx: LintContext) -> list[tuple[str, str, str]]:
    """(severity: error | note, target, message), computed once for RP405 and RP406."""
    return ctx.memo("RP405-RP406", lambda: _probe_findings(ctx))


def _probe_findings(ctx: LintContext) -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    try:
        hf = HFConfig.find(ctx.path, ctx.hf_config)
    except Exception:  # noqa: BLE001 - RP403 says why
        return out
    if hf is None or not hf.max_position_embeddings or not hf.head_dim:
        return out
    positions = position_input(ctx.model)
    if positions is None:
        return out
    sites = find_sites(ctx.model)
    if not sites:
        return out
    values, shapes, ranged = graph_inputs_needed(ctx.model, sites)
    if values != {positions.name} or ranged:
        return out  # the rotation reads more than the positions, or makes its own: not understood
    extra = [v for v in ctx.model.graph.inputs if v.name in shapes]
    max_pos = hf.max_position_embeddings
    probe = np.asarray(sorted({p for p in (*PROBE, max_pos - 1) if 0 <= p < max_pos}), dtype=np.int64)
    head_dim = int(sites[0].pre.shape[3]) if sites[0].pre.shape is not None and len(sites[0].pre.shape) == 4 and \
        isinstance(sites[0].pre.shape[3], int) else hf.head_dim
    mats = None
    for tried in (probe, probe[probe < max_pos - 8]):  # a table one row short of a shifted read: the others
        try:
            mats = probe_rotations(ctx.model, sites, positions, [int(p) for p in tried], head_dim, extra)
        except Exception:  # noqa: BLE001 - never a crash of lint
            mats = None
        if mats:
            probe = tried
            break
    if not mats:
        return out
    try:
        all_ropes = [hf.rope(t) for t in hf.layer_types()]
    except (MatchFailure, ModelLoadError):
        return out
    layers: dict[int, dict[str, tuple[Site, _Verdict]]] = {}
    short: dict[int, np.ndarray] | None = None  # LongRoPE: a second call within original_max_position_embeddings
    for index, site in enumerate(sites):
        if index not in mats:
            continue
        try:
            rope = hf.layer_rope(site.layer)
        except (MatchFailure, ModelLoadError):
            continue
        if rope is None:
            continue  # NoPE layers (RP404)
        others = [r for r in all_ropes if r.layer_type != rope.layer_type]
        fp16 = site.pre.dtype == ir.DataType.FLOAT16
        if not rope.switches:
            verdict = _judge(mats[index], rope, probe, head_dim, fp16, others)
        else:  # transformers: the long factors when the call's largest position + 1 > original, else the short
            original = rope.original_max or 0
            within = probe[probe < original]
            if short is None and within.size:
                try:
                    short = probe_rotations(ctx.model, sites, positions, [int(p) for p in within], head_dim, extra) or {}
                except Exception:  # noqa: BLE001
                    short = {}
            long = int(probe.max()) + 1 > original
            verdict = _judge(mats[index], rope, probe, head_dim, fp16, others, long)
            calls = [(verdict, probe, long)]
            if within.size and long:
                if not short or index not in short:
                    continue
                calls.insert(0, (_judge(short[index], rope, within, head_dim, fp16, others, False), within, False))
            if any(v is None for v, _, _ in calls):
                continue
            bad = next(((v, p, lg) for v, p, lg in calls if not v.ok), None)  # type: ignore[union-attr]
            if bad is None:
                verdict = calls[0][0]
            elif bad[0].first is None and len({v.shift for v, _, _ in calls}) > 1:  # type: ignore[union-attr]
                continue  # shifted differently in the two calls: not understood
            else:
                verdict = bad[0]
                assert verdict is not None
                verdict.cause = (f"in a call of positions {', '.join(map(str, bad[1]))} ("
                                 f"{'long' if bad[2] else 'short'} factors): ") + verdict.cause
        if verdict is not None:
            layers.setdefault(site.layer, {})[site.role] = (site, verdict)
    for layer in sorted(layers):
        roles = layers[layer]
        rope = hf.layer_rope(layer)
        assert rope is not None
        name = (rope.layer_type + " " if rope.layer_type else "")
        for role in ("q", "k"):
            if role not in roles:
                continue
            site, v = roles[role]
            if v.first is not None:
                word = "query" if role == "q" else "key"
                out.append(("error", site.node.name or site.out.name or "Add", (
                    f"layer {layer} {word} ({role}, rotated value {site.out.name!r}) rotates differently from "
                    f"config.json's {name}rope ({rope.describe()}) from position {v.first} on (matrix entries off by "
                    f"{v.size:.3g} there; angle error up to {v.angle:.3g} rad at the positions probed): {v.cause}")))
        shifts = {r: v.shift or 0 for r, (_, v) in roles.items() if v.first is None}
        if len(shifts) == 2 and shifts["q"] != shifts["k"]:
            site = roles["q"][0]
            out.append(("error", site.node.name or site.out.name or "Add", (
                f"layer {layer} rotates its query at position + {shifts['q']} and its key at position + "
                f"{shifts['k']} (probed at positions {', '.join(map(str, probe))}): query and key are "
                f"{abs(shifts['q'] - shifts['k'])} position(s) apart, so attention differs from config.json's from "
                f"position {int(probe[0])} on")))
        elif len(shifts) == 1 and next(iter(shifts.values())):
            (role, shift), = shifts.items()
            site = roles[role][0]
            out.append(("error", site.node.name or site.out.name or "Add", (
                f"layer {layer} rotates its {'query' if role == 'q' else 'key'} at position + {shift} (the "
                f"{'key' if role == 'q' else 'query'} could not be probed)")))
        elif len(shifts) == 2 and shifts["q"]:
            site = roles["q"][0]
            out.append(("note", site.node.name or site.out.name or "Add", (
                f"layer {layer} rotates query and key both at position + {shifts['q']}: attention is unchanged "
                f"(RoPE is relative), the tables differ from config.json's")))
    return out


@rule("RP405", "rotation-conformance", Severity.ERROR,
      "An attention layer's query or key rotation, probed numerically, differs from what config.json says",
      """Per attention layer, the rotation applied to the query and to the key (torch exports' Mul/Add/Neg/Slice/
      Concat over cos/sin) is evaluated on onnxruntime CPU at a few positions (0, 1, 2, 7, 100, max - 1) with the
      head replaced by basis vectors, and its 2x2 blocks compared with the rotation config.json prescribes for that
      layer (its layer type's rope for Gemma 3, attention scaling, partial rotary, pair layout). Finds what the table
      rules cannot: rotate_half reversed, layers reading each other's (or a private, wrong) cos/sin chain, query and
      key at different positions. The finding names the layer, query or key, the first differing position and the
      angle error. Graphs whose rotation is not understood are skipped.""")
def rotation_conformance(ctx: LintContext) -> Iterator[tuple[str, str]]:
    for severity, target, message in _findings(ctx):
        if severity == "error":
            yield target, message


@rule("RP406", "rotation-shifted", Severity.NOTE,
      "Query and key of a layer are both rotated at position + k: the same attention, other tables",
      """RoPE is relative: a layer whose query and key are both rotated at position + k (the same k) computes the
      attention config.json's rope does, though its cos/sin tables differ (RP402 may say so).""")
def rotation_shifted(ctx: LintContext) -> Iterator[tuple[str, str]]:
    for severity, target, message in _findings(ctx):
        if severity == "note":
            yield target, message


__all__ = ["rotation_conformance", "rotation_shifted"]
