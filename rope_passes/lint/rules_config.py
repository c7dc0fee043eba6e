"""Graph vs Hugging Face config lint rules (RP4xx): does the graph rotate by what ``config.json`` says?

The config is the one beside the model (``config.json`` / ``model_config.json``) or ``--hf-config PATH``
(:func:`rope_passes.hf_config.use_hf_config`); without one these rules say nothing. What the config says is computed
with NumPy (:meth:`rope_passes.hf_config.Rope.tables`: inv_freq with its scaling, LongRoPE's short/long factors and
their switch, attention scaling, partial rotary); what the graph computes is read from its cos/sin chains (evaluated
on onnxruntime CPU for a call of positions ``0..N-1``, LongRoPE also ``0..original-1``) or from GroupQueryAttention's
cos/sin caches. See :mod:`rope_passes.proofs.config` for the comparison and the causes it names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from rope_passes.analysis.graph import MS_DOMAIN, const_tensor, flag, nodes_of
from rope_passes.errors import ModelLoadError
from rope_passes.hf_config import HFConfig, Rope
from rope_passes.lint.core import LintContext, Severity, rule
from rope_passes.proofs.chain import find_chain
from rope_passes.proofs.config import TOL, TOL_FP16, Verdict, best_verdict, check_rope, judge, repair_words, rows_of
from rope_passes.report import MatchFailure

Found = Iterator[tuple[str, str]]


@dataclasses.dataclass
class _Checked:
    target: str
    what: str
    verdict: Verdict | None  # None: the config's rope could not be computed (``refusal``)
    refusal: str = ""
    role: str = ""  # cos | sin


def _config(ctx: LintContext) -> tuple[HFConfig | None, list[Rope], str]:
    try:
        hf = HFConfig.find(ctx.path)
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
            verdict = best_verdict(ctx.model, chain, table, ropes)
        except MatchFailure:
            continue
        yield _Checked(node.name or node.op_type,
                       f"{node.op_type} ({chain.role} computed from {chain.positions.name!r})", verdict, role=chain.role)


def _caches(ctx: LintContext, ropes: list[Rope]) -> Iterator[_Checked]:
    """GroupQueryAttention's cos/sin caches (builder graphs): ``[N, rotary_dim / 2]`` tables of one rope."""
    seen: set[int] = set()
    for gqa in nodes_of(ctx.model, "GroupQueryAttention", MS_DOMAIN):
        if not flag(gqa, "do_rotary") or len(gqa.inputs) < 9:
            continue
        for role, value in (("cos", gqa.inputs[7]), ("sin", gqa.inputs[8])):
            tensor = const_tensor(value)
            if value is None or tensor is None or id(value) in seen or len(tensor.shape) != 2:
                continue
            seen.add(id(value))
            table = tensor.numpy()
            tol = TOL_FP16 if table.dtype == np.float16 else TOL
            verdicts = [judge(r, role, table, None, tol) for r in ropes if not r.switches]
            if verdicts:
                yield _Checked(value.name or role, f"GroupQueryAttention's {role}_cache {value.name!r}",
                               min(verdicts, key=lambda v: (not v.ok, -(v.first_wrong or 0))))


def _checked(ctx: LintContext) -> list[_Checked]:
    cached = getattr(ctx, "_rp4xx", None)
    if cached is not None:
        return cached
    hf, ropes, refusal = _config(ctx)
    out: list[_Checked] = []
    if refusal:
        out.append(_Checked("<model>", str(hf.path if hf else "config"), None, refusal))
    elif ropes and hf is not None:  # ropes come from hf
        rows = hf.max_position_embeddings or 0
        if rows:
            out += list(_chains(ctx, ropes, rows)) + list(_caches(ctx, ropes))
    ctx._rp4xx = out  # type: ignore[attr-defined]  # the three rules share one evaluation
    ctx._rp4xx_config = str(hf.path) if hf is not None else "config.json"  # type: ignore[attr-defined]
    return out


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
            config = getattr(ctx, "_rp4xx_config", "config.json")
            yield c.target, (c.verdict.message(c.what) + f"; precompute-cos-sin with --hf-config repairs it "
                             f"(repaired: {repair_words(c.verdict, c.role, config)})")


@rule("RP402", "rope-differs-from-config", Severity.ERROR,
      "The graph's rotation differs from what config.json says",
      """The cos/sin the graph computes (or holds in its caches) are compared row by row with the config's RoPE
      (theta, linear/llama3/yarn scaling, attention scaling, partial rotary factor). The message names the first
      wrong position and the likely cause: theta differs, scaling ignored, attention scaling differs, rotary width
      differs. Re-export, or fix the config if the graph is the truth.""")
def rope_differs(ctx: LintContext) -> Found:
    for c in _checked(ctx):
        if c.verdict is not None and not c.verdict.ok and c.verdict.frozen is None:
            yield c.target, c.verdict.message(c.what)


@rule("RP403", "rope-config-dynamic", Severity.WARNING,
      "config.json asks for a RoPE no fixed table computes (dynamic NTK), or cannot be read",
      """Dynamic NTK rescales the frequencies from the call's largest position: an exported graph holds the
      frequencies of its sample input (right up to max_position_embeddings, wrong after), and precompute-cos-sin
      refuses to make a table of it.""")
def rope_dynamic(ctx: LintContext) -> Found:
    for c in _checked(ctx):
        if c.verdict is None:
            yield c.target, c.refusal


__all__ = ["longrope_frozen", "rope_differs", "rope_dynamic"]
