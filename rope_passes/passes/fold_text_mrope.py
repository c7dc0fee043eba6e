"""``fold-text-mrope``: fold text-only multimodal RoPE into GroupQueryAttention's own rotation.

**Rewrites.** For every ``com.microsoft::GroupQueryAttention`` with ``do_rotary=0`` whose q and k inputs are
produced by a rotation (through layout ops and casts, :func:`rope_passes.analysis.mrope.trace_rotation`):

* ``com.microsoft::MRotaryEmbedding`` (builder 0.18: sections and layout read from its attributes), or
* ``com.microsoft::RotaryEmbedding`` reading per-token cos/sin tables built by a manual mRoPE subgraph and the
  token index ``Range(0, batch*seq)`` as positions (builder 0.15.2: the Qwen2.5-VL inv_freq → sectioned flatten
  form and the Qwen3.5 cos/sin-cache + h/w masks + Where form; ``lower-mrope``'s output),

the pass sets ``do_rotary=1``, ``rotary_interleaved`` from the rotation's *pairing* (its ``interleaved``
attribute; the mRoPE section layout is a different thing), adds 2D ``cos_cache``/``sin_cache`` initializers
(GQA inputs 7/8, in the query dtype, ``rotary_dim/2`` columns, partial rotary kept; one pair per distinct table),
feeds GQA the unrotated q/k (the value before the rotation, through copies of the ops after it that nothing before
it undoes, e.g. a Cast to float16; a new Concat for packed QKV), then removes every node and initializer only the
old path needed, and the position input when nothing else reads it (``genai_config.json``'s
``model.decoder.inputs`` follows).

**The proof, before any number.** MRotaryEmbedding copies cache rows, so its position input must be the caller's
positions exactly: the ``[3, B, S]`` graph input itself or the exact in-graph tile of a 2D input, with only
Identity / Cast-to-the-same-integer-type between (:func:`rope_passes.analysis.positions.exact_positions`); q and k
must read the same position input. The manual form's tables are proved one row per token by exact cone accounting
from the position input (:mod:`rope_passes.proofs.mrope_cone`: an allow-list of per-token ops; Shape/Size of a
position-derived value, Reduce*, CumSum, any op reading across tokens or another graph input is refused naming
the node). Refusals that need no numbers (``--text-only`` missing, GQA's rotary limits) come first.

**The numbers.** MRotaryEmbedding: its cos/sin caches (times its ``scale``). Manual form: the cone is extracted and
run on onnxruntime CPU **once per distinct cone** (layers whose cones are structurally identical share the
evaluation and the table) on positions ``0..max_pos-1`` in chunks (``max_pos`` = rows of the cache it gathers
from, else ``model.context_length``), then on probe calls differing in length, batch, past and minimum whose rows
must be the table's rows (the table itself computed with onnxruntime's kernels on only the elements that reach it,
:mod:`rope_passes.runtime.rows`; :mod:`rope_passes.proofs.mrope_cone` says why that is the same table).
``FoldTextMRoPEPass.evaluations`` counts the evaluations of the last run.

**Exact when** the three position axes are equal (text) *and* contiguous: with equal axes every section reads
the same row, so mRoPE is plain RoPE with those tables; fused GQA derives token s's position as
``seqlens_k + 1 - S + s`` (WebGPU ignores GQA's position_ids), which equals the fed positions only when they are
``past .. past+S-1`` — what onnxruntime-genai feeds for text, unpadded or left-padded (a left-padded row's
positions start at 0 on its first real token, and so does ``seqlens_k + 1 - S + s``). A right-padded batch is
outside: its shorter rows' positions are not ``seqlens_k + 1 - S + s`` (measured on WebGPU: 0.72 off the
original's row); onnxruntime-genai never pads right, and the report's ``exact_when`` says so. The fold is applied automatically when the graph
proves text-only (a 2D position input); when 3D positions come from outside (vision-language graphs) only with
``text_only=True`` (``--text-only``), and then the output serves text prompts only: a report note, a
``rope_passes.text_only`` metadata entry and a ``model.decoder.session_options["rope_passes.text_only"]`` marker
in genai_config.json say so. A rotation computed in float whose output is cast to float16 GQA (Qwen3-VL fp16) is
not bit-exact: GQA rotates the float16 value (rounded before, not after) with float16 cos/sin in float16, so each
rotated element agrees within 4 float16 ulps of the largest |q| / |k| element of its head row (the rounding of x,
cos, sin and of the result; measured 1-2 ulps on CPU, tests/test_fold_qwen3_vl.py); the finding's ``rounding``
detail says so.

**Refuses** (graph unchanged at that GQA, reason naming the node that breaks the proof): computed positions
before an MRotaryEmbedding; a cos/sin cone that is not per token; probe rows that are not the table's; 3D
positions from outside without ``text_only``; q and k rotated differently or with different tables or positions;
casts around the rotation other than float → float16; ``rotary_dim/2`` not a multiple of 8 or above
``head_size/2`` (GQA's limits); query dtype other than float/float16. Anything it does not understand is "not
matched" with the reason, and the model is left bit-identical.
"""
from __future__ import annotations

import dataclasses
from typing import Union

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import MS_DOMAIN, attr, flag, nodes_of
from rope_passes.analysis.mrope import (
    PositionSource,
    Rotation,
    TextTables,
    mrotary_key,
    mrotary_positions,
    mrotary_tables,
    trace_rotation,
)
from rope_passes.passes._rewrite import NodeTape, add_initializer, drop_unused_input, opset_of, remove_dead
from rope_passes.passes.base import PassContext, RopePass, option
from rope_passes.proofs.mrope_cone import ConeKeys, ManualCone, evaluate_tables, manual_cone
from rope_passes.report import MatchFailure, PassReport
from rope_passes.runtime.evaluate import subgraph_runner
from rope_passes.runtime.rows import RowEvaluator, Unsupported

TEXT_ONLY_KEY = "rope_passes.text_only"
_NP_DTYPES = {ir.DataType.FLOAT: np.float32, ir.DataType.FLOAT16: np.float16}
#: what a rotation's 1D table is: an MRotaryEmbedding's caches, or a manual cone (by structural key)
_Source = Union[ir.Node, ManualCone]  # noqa: UP007


def _query_dtype(gqa: ir.Node) -> ir.DataType | None:
    """GQA's T: query's dtype, else the KV cache's or the output's (graphs built without type info)."""
    for v in (gqa.inputs[0], gqa.inputs[3] if len(gqa.inputs) > 3 else None, gqa.outputs[0]):
        if v is not None and v.dtype is not None:
            return v.dtype
    return None


def _record(report: PassReport, failure: MatchFailure, gqa: ir.Node) -> None:
    """Record ``failure`` at the GQA (the place), keeping the node that broke the proof as ``node``."""
    if failure.place not in ("<model>", gqa.name):
        failure = MatchFailure(failure.outcome, failure.reason, gqa.name, **{"node": failure.place, **failure.details})
    report.record(failure, gqa)


@dataclasses.dataclass
class _Site:
    """One GroupQueryAttention with its q and k rotations, statically checked; ``tables`` once evaluated."""

    gqa: ir.Node
    q: Rotation
    k: Rotation
    packed: ir.Node | None
    keys: tuple[tuple, tuple]  # (q's table key, k's table key)
    positions: PositionSource
    tables: TextTables | None = None


@dataclasses.dataclass(frozen=True)
class FoldTextMRoPEOptions:
    text_only: bool = option(False, "fold 3D positions that come from outside too (the output then serves text "
                                    "prompts only; marked in metadata and genai_config)")
    max_positions: int | None = option(None, "rows of the 1D tables built from a manual mRoPE subgraph "
                                             "(default: rows of the cache it gathers from, else context_length)",
                                       positive=True)


def _row_evaluator(model: ir.Model, source: ManualCone) -> RowEvaluator | None:
    """The fast evaluator of the cone's table (NumPy moves the data, onnxruntime computes each number on the
    elements that reach the table), or None when it cannot run this cone (the table is then built on the whole
    cone)."""
    try:
        return RowEvaluator(model, [source.positions.graph_input], [source.cos, source.sin])
    except Unsupported:
        return None


class FoldTextMRoPEPass(RopePass):
    name = "fold-text-mrope"
    summary = "fold text-only mRoPE (MRotaryEmbedding or the manual subgraph) into GQA do_rotary=1 with 2D caches"
    options_type = FoldTextMRoPEOptions
    options: FoldTextMRoPEOptions

    def __init__(self, context: PassContext | None = None, *, text_only: bool = False,
                 max_positions: int | None = None) -> None:
        super().__init__(context)
        self.options = self.make_options(text_only=text_only, max_positions=max_positions)

    #: table evaluations of the last apply (one per distinct cone): what tests/test_fold_speed.py counts
    evaluations: int = 0

    def apply(self, model: ir.Model, report: PassReport) -> None:
        graph = model.graph
        gqas = nodes_of(graph, "GroupQueryAttention", MS_DOMAIN)
        if not gqas:
            raise MatchFailure.absent("no com.microsoft::GroupQueryAttention node")
        self.evaluations = 0
        self._keys = ConeKeys()
        self._sources: dict[tuple, _Source] = {}
        # 1. everything decided without numbers, for every GQA
        candidates: list[_Site] = []
        for gqa in gqas:
            try:
                candidates.append(self._match(model, gqa))
            except MatchFailure as failure:
                _record(report, failure, gqa)
        # 2. one table per distinct cone / cache pair
        tables: dict[tuple, TextTables | MatchFailure] = {}
        sites: list[_Site] = []
        for site in candidates:
            try:
                site.tables = self._site_tables(model, site, tables)
            except MatchFailure as failure:
                _record(report, failure, site.gqa)
                continue
            sites.append(site)
        if not sites:
            return
        self._rewrite_all(model, sites, report)

    # -- matching (static) ------------------------------------------------------------------------------------
    def _head_size(self, past_key: ir.Value | None) -> int | None:
        """Head size from the KV cache input's static last dim, else genai_config's (:attr:`GenaiConfig.head_size`)."""
        shape = past_key.shape if past_key is not None else None
        if shape is not None and len(shape) == 4 and isinstance(shape[3], int):
            return shape[3]
        return self.genai_config.head_size

    def _match(self, model: ir.Model, gqa: ir.Node) -> _Site:
        """The GQA's q/k rotations and the proofs that need no numbers; MatchFailure (absent/refused) otherwise."""
        if flag(gqa, "do_rotary"):
            raise MatchFailure.absent("GroupQueryAttention already rotates (do_rotary=1)", gqa)
        inputs = list(gqa.inputs) + [None] * max(0, 9 - len(gqa.inputs))
        if any(v is not None and v.name for v in inputs[7:9]):
            raise MatchFailure.absent("GroupQueryAttention has cos_cache/sin_cache inputs but do_rotary=0", gqa)
        query, key = inputs[0], inputs[1]
        heads, kv_heads = int(attr(gqa, "num_heads", 0)), int(attr(gqa, "kv_num_heads", 0))
        hint = self._head_size(inputs[3])
        packed = None
        if key is None or not key.name:
            packed = query.producer()
            if packed is None or packed.op_type != "Concat" or len(packed.inputs) != 3:
                raise MatchFailure.absent(f"packed QKV {query.name!r} is not a Concat of rotated q, rotated k and v")
            axis = int(attr(packed, "axis", -1))
            if axis not in (-1, 2):
                raise MatchFailure.absent(f"packed QKV Concat {packed.name!r} is on axis {axis}, not the hidden axis")
            q_rot = trace_rotation(packed.inputs[0], heads, hint)
            k_rot = trace_rotation(packed.inputs[1], kv_heads, hint)
        else:
            q_rot, k_rot = trace_rotation(query, heads, hint), trace_rotation(key, kv_heads, hint)
        if q_rot.kind != k_rot.kind or q_rot.interleaved != k_rot.interleaved or q_rot.rotary_dim != k_rot.rotary_dim:
            raise MatchFailure.refuse(
                f"q and k are rotated differently ({q_rot.kind} {q_rot.node.name!r} / {k_rot.kind} "
                f"{k_rot.node.name!r}: interleaved {q_rot.interleaved}/{k_rot.interleaved}, "
                f"dim {q_rot.rotary_dim}/{k_rot.rotary_dim})", gqa)
        (q_key, q_pos, q_half), (k_key, k_pos, k_half) = (self._static(model, r) for r in (q_rot, k_rot))
        if q_pos.graph_input is not k_pos.graph_input:
            raise MatchFailure.refuse(f"q and k read different position inputs ({q_pos.graph_input.name!r} / "
                                      f"{k_pos.graph_input.name!r})", gqa)
        self._check(gqa, q_rot, q_half if q_half == k_half else -1)
        site = _Site(gqa, q_rot, k_rot, packed, (q_key, k_key), q_pos)
        if not (q_pos.text_only and k_pos.text_only) and not self.options.text_only:
            raise MatchFailure.refuse(
                f"positions come from outside: {q_pos.how}; folding into GQA is exact only "
                "for text prompts (all three axes equal); pass --text-only to fold for text-only use",
                gqa.name,
            )
        return site

    def _static(self, model: ir.Model, rot: Rotation) -> tuple[tuple, PositionSource, int]:
        """(table key, positions, table columns) of one rotation, proved without numbers, once per distinct cone
        (a failed proof is redone per rotation, so each reason names that rotation's own node)."""
        node = rot.node
        if rot.kind == "MRotaryEmbedding":
            key = ("mrotary", *mrotary_key(node))
            positions = mrotary_positions(node)  # per node: q and k may read different values
            shape = node.inputs[2].shape
            half = shape[1] if shape is not None and len(shape) == 2 and isinstance(shape[1], int) else -1
            self._sources.setdefault(key, node)
            return key, positions, half
        key = ("manual", self._keys.of(node.inputs[2]), self._keys.of(node.inputs[3]))
        if key not in self._sources:
            max_positions = self.options.max_positions or self.genai_config.context_length
            preferred = self.genai_config.decoder_inputs.get("position_ids")
            self._sources[key] = manual_cone(model, node, max_positions, preferred)
        found = self._sources[key]
        assert isinstance(found, ManualCone)
        return key, found.positions, found.half

    @staticmethod
    def _check(gqa: ir.Node, q: Rotation, half: int) -> None:
        """GQA's fused rotary limits (and q/k table widths); MatchFailure.refuse naming the GQA when one fails."""
        def refuse(reason: str) -> MatchFailure:
            return MatchFailure.refuse(reason, gqa)

        if half < 0:
            raise refuse("q and k use cos/sin tables of different or unknown widths")
        if 2 * half != q.rotary_dim:
            raise refuse(f"cos/sin tables have {half} columns but the rotation covers {q.rotary_dim} dims")
        if half % 8:
            raise refuse(f"rotary_dim/2 = {half} is not a multiple of 8 "
                         "(GroupQueryAttention's fused rotary needs that)")
        if q.rotary_dim > q.head_size:
            raise refuse(f"rotary_dim {q.rotary_dim} exceeds head_size {q.head_size}")
        if _query_dtype(gqa) not in _NP_DTYPES:
            raise refuse(f"query dtype {_query_dtype(gqa)} is not float or float16")

    # -- tables (numbers) ---------------------------------------------------------------------------------------
    def _table(self, model: ir.Model, key: tuple, tables: dict[tuple, TextTables | MatchFailure]) -> TextTables:
        if key not in tables:
            source = self._sources[key]
            try:
                if isinstance(source, ManualCone):
                    self.evaluations += 1
                    try:
                        run = subgraph_runner(model, [source.positions.graph_input], [source.cos, source.sin])
                    except ValueError as exc:  # extract(): not bounded by the positions
                        raise MatchFailure.absent(f"{source.rotation.name!r}: cos/sin subgraph is not a function of "
                                                  f"the positions alone ({exc})") from None
                    except Exception as exc:  # noqa: BLE001 - onnxruntime failures become a reason
                        raise MatchFailure.absent(f"{source.rotation.name!r}: cannot evaluate the cos/sin subgraph "
                                                  f"({type(exc).__name__})") from None
                    tables[key] = evaluate_tables(source, run, _row_evaluator(model, source))
                else:
                    assert isinstance(source, ir.Node)
                    tables[key] = mrotary_tables(source)
            except MatchFailure as failure:
                tables[key] = failure
        found = tables[key]
        if isinstance(found, MatchFailure):
            raise found
        return found

    def _site_tables(self, model: ir.Model, site: _Site, tables: dict[tuple, TextTables | MatchFailure]) -> TextTables:
        q_key, k_key = site.keys
        qt = self._table(model, q_key, tables)
        kt = qt if k_key == q_key else self._table(model, k_key, tables)
        if kt is not qt and not (np.array_equal(qt.cos, kt.cos) and np.array_equal(qt.sin, kt.sin)):
            raise MatchFailure.refuse(f"q and k use different cos/sin tables ({site.q.node.name!r} / "
                                      f"{site.k.node.name!r})", site.gqa)
        if 2 * qt.cos.shape[1] != site.q.rotary_dim:
            raise MatchFailure.refuse(f"cos/sin tables have {qt.cos.shape[1]} columns but the rotation covers "
                                      f"{site.q.rotary_dim} dims", site.gqa)
        return qt

    # -- rewriting --------------------------------------------------------------------------------------------
    def _rewrite_all(self, model: ir.Model, sites: list[_Site], report: PassReport) -> None:
        graph = model.graph
        caches: dict[tuple[int, str], tuple[ir.Value, ir.Value]] = {}  # (id(tables), dtype) -> GQA caches
        old_values: list[ir.Value] = []
        positions: dict[int, PositionSource] = {}
        for site in sites:
            assert site.tables is not None
            old_values += self._rewrite(graph, site, site.tables, caches)
            positions[id(site.positions.graph_input)] = site.positions
            rounding = site.q.rounding or site.k.rounding
            report.rewritten(
                site.gqa.name,
                f"folded {site.q.kind} into GQA do_rotary=1 (rotary_dim {site.q.rotary_dim}, "
                f"{'interleaved' if site.q.interleaved else 'rotate-half'} pairs)",
                rotation=site.q.kind,
                tables=site.tables.source,
                positions=site.positions.how,
                exact_when="all three position axes equal and contiguous (past .. past+S-1): unpadded or "
                           "left-padded calls, as onnxruntime-genai sends them (a right-padded batch is outside)",
                **({"rounding": rounding} if rounding else {}),
            )
        remove_dead(graph, old_values)
        for source in positions.values():
            graph_changes, config_changes = drop_unused_input(graph, source.graph_input, self.genai_config)
            for change in graph_changes:
                report.note(source.graph_input.name, change)
            report.genai_config_changes.extend(config_changes)
        external = [s for s in positions.values() if not s.text_only]
        if external:
            self._mark_text_only(model, report, external)

    def _cache_pair(self, graph: ir.Graph, tables: TextTables, np_dtype: type,
                    caches: dict[tuple[int, str], tuple[ir.Value, ir.Value]]) -> tuple[ir.Value, ir.Value]:
        """GQA's cos/sin cache initializers for ``tables`` in ``np_dtype``: one pair per distinct table (equal
        tables from different cones share theirs; compared only when their shapes agree)."""
        key = (id(tables), np.dtype(np_dtype).str)
        if key not in caches:
            cos: np.ndarray = tables.cos.astype(np_dtype)
            sin: np.ndarray = tables.sin.astype(np_dtype)
            for (_, dt), (c, s) in caches.items():
                if dt == key[1] and tuple(c.shape) == cos.shape and np.array_equal(c.const_value.numpy(), cos) \
                        and np.array_equal(s.const_value.numpy(), sin):
                    caches[key] = (c, s)
                    break
            else:
                caches[key] = (add_initializer(graph, "rope_passes.text_mrope.cos_cache", cos),
                               add_initializer(graph, "rope_passes.text_mrope.sin_cache", sin))
        return caches[key]

    @staticmethod
    def _unrotated(graph: ir.Graph, rot: Rotation, gqa: ir.Node, role: str) -> ir.Value:
        """What GQA reads instead of ``rot.rotated``: ``rot.pre``, through copies of the ops after the rotation that
        nothing before it undoes (a Cast to float16, a reshape)."""
        value = rot.pre
        if not rot.relayout:
            return value
        tape = NodeTape(opset_of(graph))
        for i, node in enumerate(rot.relayout):
            out = node.outputs[0]
            attrs = {name: ir.Attr(name, a.type, a.value) for name, a in node.attributes.items()}
            step = f"{gqa.name}/{role}_unrotated/{node.op_type}_{i}"
            value = tape.op(node.op_type, [value, *node.inputs[1:]], attrs, name=step, output=f"{step}/output_0",
                            dtype=out.dtype, shape=out.shape.copy() if out.shape is not None else None)
        tape.insert_before(graph, gqa)
        return value

    def _rewrite(self, graph: ir.Graph, site: _Site, tables: TextTables,
                 caches: dict[tuple[int, str], tuple[ir.Value, ir.Value]]) -> list[ir.Value]:
        gqa = site.gqa
        cos_v, sin_v = self._cache_pair(graph, tables, _NP_DTYPES[_query_dtype(gqa)], caches)
        old = [gqa.inputs[0], gqa.inputs[1]]
        q_pre, k_pre = self._unrotated(graph, site.q, gqa, "q"), self._unrotated(graph, site.k, gqa, "k")
        if site.packed is not None:
            concat = site.packed
            tape = NodeTape(opset_of(graph))
            unrotated = tape.op("Concat", [q_pre, k_pre, concat.inputs[2]],
                                {"axis": int(attr(concat, "axis", -1))}, name=f"{concat.name}/unrotated")
            unrotated.dtype, unrotated.shape = concat.outputs[0].dtype, concat.outputs[0].shape
            tape.insert_before(graph, gqa)
            gqa.replace_input_with(0, unrotated)
        else:
            gqa.replace_input_with(0, q_pre)
            gqa.replace_input_with(1, k_pre)
        if len(gqa.inputs) < 9:
            gqa.resize_inputs(9)
        gqa.replace_input_with(7, cos_v)
        gqa.replace_input_with(8, sin_v)
        gqa.attributes["do_rotary"] = ir.AttrInt64("do_rotary", 1)
        gqa.attributes["rotary_interleaved"] = ir.AttrInt64("rotary_interleaved", int(site.q.interleaved))
        return old

    def _mark_text_only(self, model: ir.Model, report: PassReport, sources: list[PositionSource]) -> None:
        names = ", ".join(repr(s.graph_input.name) for s in sources)
        text = (
            f"folded with --text-only: the 3D position input ({names}) was dropped and every token now uses plain "
            "1D RoPE; this model serves text prompts only (no image/video positions)"
        )
        report.note("<model>", text)
        model.metadata_props[TEXT_ONLY_KEY] = "true"
        report.metadata_changes.append(f"metadata_props[{TEXT_ONLY_KEY!r}] = 'true'")
        # onnxruntime-genai turns unknown session_options strings into session config entries, which
        # onnxruntime ignores: the one place in genai_config.json a marker cannot break loading.
        change = self.genai_config.set_session_option(TEXT_ONLY_KEY, "1", "text prompts only")
        if change:
            report.genai_config_changes.append(change)
