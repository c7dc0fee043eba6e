"""Graph vs Hugging Face config lint rules (RP4xx): does the graph rotate by what ``config.json`` says?

The config is the one beside the model (``config.json`` / ``model_config.json``) or ``--hf-config PATH``
(``LintContext.hf_config``, from the run plan); without one these rules say nothing. What the config says is computed
with NumPy (:meth:`rope_passes.hf_config.Rope.tables`: inv_freq with its scaling, LongRoPE's short/long factors and
their switch, attention scaling, partial rotary); what the graph computes is read from its cos/sin chains (evaluated
on onnxruntime CPU for a call of positions ``0..N-1``, LongRoPE also ``0..original-1``) or from GroupQueryAttention's
cos/sin caches. See :mod:`rope_passes.proofs.config` for the comparison and the causes it names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import MS_DOMAIN, attr, const_tensor, flag, nodes_of
from rope_passes.analysis.layers import layer_of
from rope_passes.errors import ModelLoadError
from rope_passes.hf_config import HFConfig, Rope
from rope_passes.lint.core import LintContext, Severity, rule
from rope_passes.proofs.chain import find_chain
from rope_passes.proofs.config import TOL, TOL_FP16, Verdict, best_verdict, check_rope, judge, repair_words, rows_of
from rope_passes.proofs.longrope_tables import longrope_fault
from rope_passes.report import MatchFailure, Place

Found = Iterator[tuple[Place, str]]


@dataclasses.dataclass
class _Checked:
    target: str
    what: str
    verdict: Verdict | None  # None: the config's rope could not be computed (``refusal``)
    refusal: str = ""
    role: str = ""  # cos | sin


def _config(ctx: LintContext) -> tuple[HFConfig | None, list[Rope], str]:
    try:
        hf = HFConfig.find(ctx.path, ctx.hf_config)
    except Exception as exc:  # noqa: BLE001 - a broken config is a finding, not a crash of lint
        return None, [], f"the Hugging Face config cannot be read: {exc}"
    if hf is None:
        return None, [], ""
    try:
        ropes = [hf.rope(t) for t in hf.layer_types()]
        for rope in ropes:
            check_rope(hf, rope)
        return hf, ropes, ""
    except MatchFailure as failure:
        if failure.details.get("rope_type") == "dynamic" and hf.max_position_embeddings:
            return hf, [], (f"{failure.reason}: calls up to max_position_embeddings {hf.max_position_embeddings} "
                            "rotate by the default frequencies (RP404 compares each layer's table with them), longer "
                            "calls by a base rescaled per call, which no static table holds")
        return hf, [], failure.reason
    except ModelLoadError as exc:
        return hf, [], str(exc)


def _chains(ctx: LintContext, ropes: list[Rope], rows: int) -> Iterator[_Checked]:
    for node in ctx.model.graph:
        if node.op_type not in ("Cos", "Sin") or node.domain not in ("", "ai.onnx"):
            continue
        try:
            chain = find_chain(ctx.model, node)  # read only: a Range source is typed by the feeds, not retyped
            table = rows_of(ctx.model, chain, rows)
            verdict = _rounding_verdict(best_verdict(ctx.model, chain, table, ropes), chain.role, table)
        except MatchFailure:
            continue
        if not verdict.ok and verdict.frozen is None and _shifted(verdict.rope, chain.role, table):
            continue  # every row is the config's row k positions on: RP405/RP406 judge query and key together
        yield _Checked(node.name or node.op_type,
                       f"{node.op_type} ({chain.role} computed from {chain.positions.name!r})", verdict, role=chain.role)


#: the largest uniform position shift a computed chain is tested for (:func:`_shifted`)
MAX_SHIFT = 8


def _shifted(rope: Rope, role: str, table: np.ndarray) -> int | None:
    """``k`` when row ``p`` of a computed ``table`` is the config's row ``p + k`` for every ``p`` (``1 <= k <=
    MAX_SHIFT``, within float32 rounding): a chain that reads ``position_ids + k``. Place query and key both read it,
    attention is unchanged (RoPE is relative), so it is not a table error; RP405/RP406 (the per-layer rotation
    probe) say which it is. None otherwise (and for LongRoPE, whose switch a shift moves)."""
    rows, width = table.shape
    if rope.switches or rows <= MAX_SHIFT + 1:
        return None
    layout = "cache" if width == rope.rotary_dim // 2 else None
    for k in range(1, MAX_SHIFT + 1):
        cos, sin = rope.tables(k, layout=layout)
        head = cos if role == "cos" else sin
        if head.shape[1] != width:
            return None
        probe = np.concatenate([head.astype(table.dtype), table[:-k]])
        if rope.first_beyond_rounding(role, probe)[0] is None:
            return k
    return None


def _rounding_verdict(verdict: Verdict, role: str, table: np.ndarray) -> Verdict:
    """A fixed-table mismatch judged again with :meth:`Rope.tolerance` (a flat 1e-5 calls a correct YaRN table wrong
    past position ~1050: torch's float32 pow is an ulp off the correctly rounded one in some dimensions)."""
    if verdict.ok or verdict.frozen is not None or verdict.rope.switches:
        return verdict
    first, worst = verdict.rope.first_beyond_rounding(role, table)
    if first is None and np.isfinite(worst):
        return Verdict(verdict.rope, True, worst=worst)
    return dataclasses.replace(verdict, first_wrong=first) if first is not None else verdict


def _caches(ctx: LintContext, ropes: list[Rope]) -> Iterator[_Checked]:
    """GroupQueryAttention's cos/sin caches (builder graphs): ``[N, rotary_dim / 2]`` tables of one rope; LongRoPE's
    short and long tables (an If switch, or one ``[short; long]`` concatenation) part by part (:func:`longrope_fault`)."""
    seen: set[int] = set()
    cache_ropes = [dataclasses.replace(r, table_interleaved=False) for r in ropes if not r.switches]  # one column
    long_ropes = [dataclasses.replace(r, table_interleaved=False) for r in ropes if r.switches]       # per frequency
    for gqa in nodes_of(ctx.model, "GroupQueryAttention", MS_DOMAIN):
        if not flag(gqa, "do_rotary") or len(gqa.inputs) < 9:
            continue
        if long_ropes and gqa.inputs[7] is not None and gqa.inputs[8] is not None and id(gqa.inputs[7]) not in seen:
            seen.add(id(gqa.inputs[7]))
            faults = [longrope_fault(ctx.model, ctx.genai_config, r, gqa.inputs[7], gqa.inputs[8]) for r in long_ropes]
            if any(f is None or f.row is None for f in faults):
                continue  # not a LongRoPE form (a plain table: RP401/RP203), or it conforms
            found = [f for f in faults if f is not None and f.row is not None]
            fault = max(found, key=lambda f: f.row or 0)
            verdict = Verdict(fault.rope, False, fault.position or 0, fault.worst, fault.cause)
            yield _Checked(fault.name, f"GroupQueryAttention's {fault.role}_cache {fault.name!r} "
                                       f"({fault.what})", verdict, role=fault.role)
            continue
        for role, value in (("cos", gqa.inputs[7]), ("sin", gqa.inputs[8])):
            tensor = const_tensor(value)
            if value is None or tensor is None or id(value) in seen or len(tensor.shape) != 2:
                continue
            seen.add(id(value))
            table = tensor.numpy()
            tol = TOL_FP16 if table.dtype == np.float16 else TOL
            verdicts = [_rounding_verdict(judge(r, role, table, None, tol), role, table) for r in cache_ropes]
            if verdicts:
                yield _Checked(value.name or role, f"GroupQueryAttention's {role}_cache {value.name!r}",
                               min(verdicts, key=lambda v: (not v.ok, -(v.first_wrong or 0))))


def _checked(ctx: LintContext) -> list[_Checked]:
    """The chains and caches checked against config.json: one evaluation the three rules share."""
    return ctx.memo("RP401-RP403", lambda: _evaluate(ctx))[0]


def _config_path(ctx: LintContext) -> str:
    """The config.json the RP401-RP403 evaluation read (the words of a repair name it)."""
    return ctx.memo("RP401-RP403", lambda: _evaluate(ctx))[1]


def _evaluate(ctx: LintContext) -> tuple[list[_Checked], str]:
    hf, ropes, refusal = _config(ctx)
    out: list[_Checked] = []
    if refusal:
        out.append(_Checked("<model>", str(hf.path if hf else "config"), None, refusal))
    elif ropes and hf is not None:  # ropes come from hf
        rows = hf.max_position_embeddings or 0
        if rows:
            out += list(_chains(ctx, ropes, rows)) + list(_caches(ctx, ropes))
    return out, str(hf.path) if hf is not None else "config.json"


@rule("RP401", "longrope-frozen-at-export", Severity.ERROR,
      "LongRoPE frozen at export: the graph uses one set of factors for every call",
      """transformers' LongRoPE (Phi-3/Phi-4 long context) rotates with the short factors while the call's largest
      position + 1 <= original_max_position_embeddings and with the long ones after. TorchScript exports
      (optimum, transformers 4) trace that choice at the sample input and keep one set for every call: the graph is
      right below the switch and wrong after it (or the reverse). `precompute-cos-sin` given the config with
      --hf-config repairs it: rebuilds both tables and the switch, reported as "repaired" (a config merely found
      beside the model never changes what the model computes).""",
      fix="precompute-cos-sin")
def longrope_frozen(ctx: LintContext) -> Found:
    for c in _checked(ctx):
        if c.verdict is not None and not c.verdict.ok and c.verdict.frozen is not None:
            config = _config_path(ctx)
            yield c.target, (c.verdict.message(c.what) + f"; precompute-cos-sin with --hf-config repairs it "
                             f"(repaired: {repair_words(c.verdict, c.role, config)})")


@rule("RP402", "rope-differs-from-config", Severity.ERROR,
      "The graph's rotation differs from what config.json says",
      """The cos/sin the graph computes (or holds in its caches) are compared row by row with the config's RoPE
      (theta, linear/llama3/yarn scaling, attention scaling, partial rotary factor). LongRoPE caches part by part:
      the short table on its first original_max_position_embeddings rows, the long one on all, whether an If
      switch picks them or one [short; long] concatenation holds them (split at multiRotaryCacheConcatOffset, else at
      the original context). The message names the first wrong position and the likely cause: theta differs,
      scaling ignored, attention scaling differs, rotary width differs, a long table holding the short factors.
      Re-export, or fix the config if the graph is the truth.""")
def rope_differs(ctx: LintContext) -> Found:
    for c in _checked(ctx):
        if c.verdict is not None and not c.verdict.ok and c.verdict.frozen is None:
            yield c.target, c.verdict.message(c.what)


@rule("RP403", "rope-config-dynamic", Severity.WARNING,
      "config.json asks for a RoPE no fixed table computes (dynamic NTK), or cannot be read",
      """Dynamic NTK rescales the frequencies from the call's largest position once it passes
      max_position_embeddings: an exported graph holds the frequencies of its sample input, and precompute-cos-sin
      refuses to make a table of it. Calls up to max_position_embeddings rotate by the default frequencies: RP404
      compares each layer's table rows below max_position_embeddings with them (an error per layer where they
      differ, e.g. a table with the NTK-scaled base at every length); this warning is for the longer calls, which
      no static table serves.""")
def rope_dynamic(ctx: LintContext) -> Found:
    for c in _checked(ctx):
        if c.verdict is None:
            yield c.target, c.refusal


# -- RP404: per-layer conformance ---------------------------------------------------------------------------------


@dataclasses.dataclass
class _Rotation:
    """What one attention layer's rotary op applies."""

    layer: int
    node: ir.Node
    rotates: bool
    interleaved: bool
    cos: ir.Value | None = None  # the [N, rotary_dim / 2] table (an initializer), None where not a constant
    sin: ir.Value | None = None
    positions: str = ""  # where the rows are read: the past length (GQA) or a graph value


def _gathered_table(value: ir.Value | None) -> tuple[ir.Value | None, str]:
    """A RotaryEmbedding cos/sin input: the constant itself, or ``Gather(table, positions)`` of one."""
    if value is None:
        return None, ""
    if const_tensor(value) is not None:
        return value, ""
    node = value.producer()
    if node is not None and node.op_type == "Gather" and attr(node, "axis", 0) == 0 and \
            const_tensor(node.inputs[0]) is not None:
        index = node.inputs[1]
        return node.inputs[0], (index.name or "") if index is not None else ""
    return None, ""


def _rotations(model: ir.Model) -> list[_Rotation]:
    """One entry per layer: its GroupQueryAttention (rotating itself, or not) or the RotaryEmbedding on its key."""
    out: dict[int, _Rotation] = {}
    gqas = nodes_of(model, "GroupQueryAttention", MS_DOMAIN)
    for order, gqa in enumerate(gqas):
        layer = layer_of(gqa, order)
        rotates = flag(gqa, "do_rotary")
        cos = gqa.inputs[7] if rotates and len(gqa.inputs) > 8 else None
        sin = gqa.inputs[8] if rotates and len(gqa.inputs) > 8 else None
        out[layer] = _Rotation(layer, gqa, rotates, flag(gqa, "rotary_interleaved"), cos, sin, "past length")
    ropes = [n for n in model.graph if n.op_type == "RotaryEmbedding"]
    for order, node in enumerate(ropes):
        if node.domain == MS_DOMAIN:  # (input, position_ids, cos_cache, sin_cache)
            cos, sin = node.inputs[2] if len(node.inputs) > 2 else None, node.inputs[3] if len(node.inputs) > 3 else None
            positions = (node.inputs[1].name or "") if len(node.inputs) > 1 and node.inputs[1] is not None else ""
        else:  # ONNX opset 23: (X, cos_cache, sin_cache[, position_ids])
            cos, positions = _gathered_table(node.inputs[1] if len(node.inputs) > 1 else None)
            sin, _ = _gathered_table(node.inputs[2] if len(node.inputs) > 2 else None)
            if len(node.inputs) > 3 and node.inputs[3] is not None:
                cos, sin, positions = node.inputs[1], node.inputs[2], node.inputs[3].name or ""
        layer = layer_of(node, order // 2)  # query and key each
        if layer not in out or not out[layer].rotates:
            out[layer] = _Rotation(layer, node, True, flag(node, "interleaved"), cos, sin, positions)
    return [out[k] for k in sorted(out)]


def _explicit(hf: HFConfig) -> bool:
    """The config names its rope itself (theta and type given, a model type): then a difference is the graph's."""
    params = hf.data.get("rope_parameters") or hf.data.get("rope_scaling") or {}
    return bool(hf.model_type) and (hf._first("rope_theta") is not None or "rope_theta" in str(params) or
                                    hf.model_type in ("gptj", "codegen"))


def _dynamic_rope(hf: HFConfig, layer: int) -> Rope | None:
    """Layer ``layer``'s dynamic NTK rope (``kind == "dynamic"``), None where its rope is not dynamic or cannot be
    read (RP403 says why). Its :meth:`Rope.tables` are the default frequencies: what transformers rotates by in
    every call up to ``max_position_embeddings`` (``dynamic_rope_update`` rescales only past it)."""
    try:
        if not hf.uses_rope(layer):
            return None
        rope = hf.rope(hf.layer_type_of(layer), dynamic=True)
    except (MatchFailure, ModelLoadError):
        return None
    return rope if rope.kind == "dynamic" else None


def _ntk_cause(rope: Rope, role: str, table: np.ndarray) -> str:
    """Why a dynamic NTK layer's table differs within ``max_position_embeddings``: the NTK-scaled base
    ``theta × factor ** (d / (d - 2))`` baked into every row (mobius-onnx), or frequencies of its own."""
    factor = float(rope.params.get("factor") or 1.0)
    dim = rope.rotary_dim
    scaled_theta = rope.theta * factor ** (dim / (dim - 2)) if dim > 2 else rope.theta
    scaled = dataclasses.replace(rope, kind="default", theta=scaled_theta)
    cos, sin = scaled.tables(table.shape[0], layout="cache")
    near = float(np.abs(table.astype(np.float64) - (cos if role == "cos" else sin)).max()) if table.size else 0.0
    fallback = 10 * scaled.tolerance(table.shape[0], dtype=table.dtype).max() if table.size else 0.0
    default = (f"config.json's dynamic rope uses the default frequencies (theta {rope.theta:g}) up to "
               f"max_position_embeddings {rope.max_position_embeddings}")
    if scaled.first_beyond_rounding(role, table)[0] is None or near <= fallback:
        return (f"the table uses the NTK-scaled base (theta {rope.theta:g} × factor {factor:g} ** ({dim}/{dim - 2}) "
                f"= {scaled_theta:.6g}) at every length; {default}")
    return f"the table is not the default frequencies' table; {default}"


def _conformance(ctx: LintContext) -> Iterator[tuple[str, str]]:
    try:
        hf = HFConfig.find(ctx.path, ctx.hf_config)
    except Exception:  # noqa: BLE001 - RP403 says why the config cannot be read
        return
    if hf is None or hf.num_layers is None:
        return
    rotations = _rotations(ctx.model)
    if not rotations:
        return
    # "does not rotate" only where nothing else in the graph rotates (no Cos/Sin, no rotary op besides GQA's own)
    manual = any(n.op_type in ("Cos", "Sin", "MRotaryEmbedding") for n in ctx.model.graph)
    any_rotates = any(r.rotates for r in rotations) and not manual
    blame = "the graph is wrong (config.json is unambiguous)" if _explicit(hf) else         "the graph or config.json is wrong"
    for rot in rotations:
        where = f"layer {rot.layer} ({rot.node.op_type} {rot.node.name!r})"
        try:
            want = hf.layer_rope(rot.layer)
        except (MatchFailure, ModelLoadError):  # malformed / unknown types: RP403 says why
            want = _dynamic_rope(hf, rot.layer)  # dynamic NTK: its calls up to max_position_embeddings
            if want is None:
                continue
        if want is None:
            if rot.rotates:
                yield rot.node.name or rot.node.op_type, (
                    f"{where} rotates its query and key, but config.json runs layer {rot.layer} without RoPE "
                    f"(no_rope_layers[{rot.layer}] = 0): {blame}")
            continue
        if not rot.rotates:
            if any_rotates and rot.node.op_type == "GroupQueryAttention":
                yield rot.node.name or rot.node.op_type, (
                    f"{where} does not rotate (do_rotary=0, no rotary op on its query and key), but config.json "
                    f"says layer {rot.layer} rotates by {want.describe()}: {blame}")
            continue
        if rot.interleaved != want.interleaved:
            flag_name = "rotary_interleaved" if rot.node.op_type == "GroupQueryAttention" else "interleaved"
            said = "interleaved pairs (2i, 2i+1)" if want.interleaved else "halves (i, i + d/2)"
            yield rot.node.name or rot.node.op_type, (
                f"{where} rotates {'interleaved pairs' if rot.interleaved else 'halves'} ({flag_name}="
                f"{int(rot.interleaved)}), but transformers' {hf.model_type or 'model'} rotates {said}: every "
                f"position but 0 is rotated wrong; {blame}")
        if want.switches:
            if rot.cos is not None and rot.sin is not None and rot.node.op_type == "GroupQueryAttention":
                fault = longrope_fault(ctx.model, ctx.genai_config, want, rot.cos, rot.sin)
                if fault is not None and fault.row is not None:
                    yield rot.node.name or rot.node.op_type, (
                        f"{where} reads {fault.role} table {fault.name!r} (rows by {rot.positions}) whose "
                        f"{fault.what} differs from config.json's {want.describe()} from {fault.part_words} on "
                        f"(by up to {fault.worst:.3g}): {fault.cause}; {blame}")
            continue  # a plain table (frozen LongRoPE): RP401/RP203
        for role, value in (("cos", rot.cos), ("sin", rot.sin)):
            tensor = const_tensor(value)
            if value is None or tensor is None or len(tensor.shape) != 2:
                continue
            table = tensor.numpy()
            cache_rope = dataclasses.replace(want, table_interleaved=False)
            dynamic = want.kind == "dynamic"
            if dynamic:  # the rows calls up to max_position_embeddings read; longer calls: RP403
                table = table[:want.max_position_embeddings]
            if table.shape[1] * 2 != want.rotary_dim:
                yield rot.node.name or rot.node.op_type, (
                    f"{where} reads {role} table {value.name!r} of width {table.shape[1]} (rotary dim "
                    f"{2 * table.shape[1]}), config.json's rotary dim is {want.rotary_dim} (head_dim "
                    f"{want.head_dim} × partial_rotary_factor {want.partial_rotary_factor:g}): {blame}")
                break
            first, worst = cache_rope.first_beyond_rounding(role, table)
            if first is None:
                continue
            cos_want, sin_want = cache_rope.tables(table.shape[0], layout="cache")
            row = np.abs(table[first].astype(np.float64) - (cos_want if role == "cos" else sin_want)[first]).max()
            other = ""
            if dynamic:
                yield rot.node.name or rot.node.op_type, (
                    f"{where} reads {role} table {value.name!r} (rows by {rot.positions}) that differs from "
                    f"config.json's {want.describe()}, factor {want.params.get('factor', 1):g} (dynamic NTK) from "
                    f"position {first} on, in calls up to max_position_embeddings {want.max_position_embeddings} "
                    f"(by {row:.3g} there, up to {worst:.3g}): {_ntk_cause(cache_rope, role, table)}; {blame}")
                break
            for layer_type in hf.layer_types():
                if layer_type is not None and layer_type != want.layer_type:
                    try:
                        alt = dataclasses.replace(hf.rope(layer_type), table_interleaved=False)
                    except (MatchFailure, ModelLoadError):
                        continue
                    if alt.rotary_dim == want.rotary_dim and alt.first_beyond_rounding(role, table)[0] is None:
                        other = f"; it is the {layer_type} table ({alt.describe()})"
            yield rot.node.name or rot.node.op_type, (
                f"{where} reads {role} table {value.name!r} (rows by {rot.positions}) that differs from config.json's "
                f"{want.describe()} from position {first} on (by {row:.3g} there, up to {worst:.3g}){other}: {blame}")
            break  # the sin table says the same


@rule("RP404", "rope-layer-conformance", Severity.ERROR,
      "An attention layer rotates by something other than what config.json says for that layer",
      """Per attention layer (GroupQueryAttention, or RotaryEmbedding on its query and key): its effective rotation -
      whether it rotates at all, the layout flag (rotary_interleaved / interleaved), the rotary width and its cos/sin
      table - against what config.json says that layer computes (rope_passes.hf_config.HFConfig.layer_rope: its layer
      type's rope, NoPE layers, the family's pair layout; LongRoPE's short and long tables as RP402 reads them;
      dynamic NTK's default frequencies on the rows below max_position_embeddings, what transformers rotates by in
      every call up to that length), within float32 rounding (Rope.tolerance). The finding
      names the layer, the node, the first differing position and the size of the difference, and says the graph is
      wrong when the config names its rope explicitly.""")
def rope_layer_conformance(ctx: LintContext) -> Found:
    yield from _conformance(ctx)


__all__ = ["longrope_frozen", "rope_differs", "rope_dynamic", "rope_layer_conformance"]
