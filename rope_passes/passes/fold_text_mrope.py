"""``fold-text-mrope``: fold text-only multimodal RoPE into GroupQueryAttention's own rotation.

**Rewrites.** For every ``com.microsoft::GroupQueryAttention`` with ``do_rotary=0`` whose q and k inputs are
produced by a rotation (through Cast/Reshape/Transpose adapters that are undone after it):

* ``com.microsoft::MRotaryEmbedding`` (builder 0.18: sections and layout read from its attributes), or
* ``com.microsoft::RotaryEmbedding`` reading per-token cos/sin tables built by a manual mRoPE subgraph and the
  token index ``Range(0, batch*seq)`` as positions (builder 0.15.2: the Qwen2.5-VL inv_freq → sectioned flatten
  form and the Qwen3.5 cos/sin-cache + h/w masks + Where form),

the pass sets ``do_rotary=1``, ``rotary_interleaved`` from the rotation's *pairing* (its ``interleaved``
attribute; the mRoPE section layout is a different thing), adds 2D ``cos_cache``/``sin_cache`` initializers
(GQA inputs 7/8, in the query dtype, ``rotary_dim/2`` columns, partial rotary kept), feeds GQA the pre-rotation
q/k (a new Concat for packed QKV), then removes every node and initializer only the old path needed, and the
position input when nothing else reads it (``genai_config.json``'s ``model.decoder.inputs`` follows).

The 1D tables come from the graph's own constants: for MRotaryEmbedding they are its cos/sin caches (times its
``scale``); for the manual form the graph's cos/sin subgraph is evaluated on onnxruntime CPU with the three axes
all ``0..max_pos-1`` (``max_pos`` = rows of the cache it gathers from, else ``model.context_length``), and a run
with permuted positions proves each row depends on its own token's position only.

**Exact when** the three position axes are equal (text) *and* contiguous: with equal axes every section reads
the same row, so mRoPE is plain RoPE with those tables; fused GQA derives token s's position as
``seqlens_k + 1 - S + s`` (WebGPU ignores GQA's position_ids), which equals the fed positions only when they are
``past .. past+S-1`` — what onnxruntime-genai feeds for text. The fold is applied automatically when the graph
proves text-only (a 2D position input tiled/expanded to 3 identical axes in-graph); when 3D positions come
from outside (vision-language graphs) only with ``text_only=True`` (``--text-only``), and then the output serves
text prompts only: a report note, a ``rope_passes.text_only`` metadata entry and a
``model.decoder.session_options["rope_passes.text_only"]`` marker in genai_config.json say so.

**Refuses** (graph unchanged at that GQA, reason in the report): 3D positions from outside without
``text_only``; q and k rotated differently; ``rotary_dim/2`` not a multiple of 8 or above ``head_size/2``
(GQA's limits); query dtype other than float/float16. Anything it does not understand is "not matched" with the
reason, and the model is left bit-identical.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import MS_DOMAIN, attr, nodes_of
from rope_passes.analysis.mrope import PositionSource, Rotation, TextTables, text_tables, trace_rotation
from rope_passes.passes._rewrite import NodeTape, add_initializer, drop_unused_input, remove_dead
from rope_passes.passes.base import RopePass, option
from rope_passes.report import MatchFailure, PassReport
from rope_passes.runtime.evaluate import evaluate_subgraph

TEXT_ONLY_KEY = "rope_passes.text_only"
_NP_DTYPES = {ir.DataType.FLOAT: np.float32, ir.DataType.FLOAT16: np.float16}


def _query_dtype(gqa: ir.Node) -> ir.DataType | None:
    """GQA's T: query's dtype, else the KV cache's or the output's (graphs built without type info)."""
    for v in (gqa.inputs[0], gqa.inputs[3] if len(gqa.inputs) > 3 else None, gqa.outputs[0]):
        if v is not None and v.dtype is not None:
            return v.dtype
    return None


class _Site:
    """One GroupQueryAttention with its q and k rotations, checked and ready to fold."""

    def __init__(self, gqa: ir.Node, q: Rotation, k: Rotation, packed: ir.Node | None, tables: TextTables):
        self.gqa, self.q, self.k, self.packed, self.tables = gqa, q, k, packed, tables


@dataclasses.dataclass(frozen=True)
class FoldTextMRoPEOptions:
    text_only: bool = option(False, "fold 3D positions that come from outside too (the output then serves text "
                                    "prompts only; marked in metadata and genai_config)")
    max_positions: int | None = option(None, "rows of the 1D tables built from a manual mRoPE subgraph "
                                             "(default: rows of the cache it gathers from, else context_length)",
                                       positive=True)


class FoldTextMRoPEPass(RopePass):
    name = "fold-text-mrope"
    summary = "fold text-only mRoPE (MRotaryEmbedding or the manual subgraph) into GQA do_rotary=1 with 2D caches"
    options_type = FoldTextMRoPEOptions
    options: FoldTextMRoPEOptions

    def apply(self, model: ir.Model, report: PassReport) -> None:
        graph = model.graph
        text_only = self.options.text_only
        max_positions = self.options.max_positions or self.genai_config.context_length
        gqas = nodes_of(graph, "GroupQueryAttention", MS_DOMAIN)
        if not gqas:
            raise MatchFailure.absent("no com.microsoft::GroupQueryAttention node")
        table_cache: dict[tuple, TextTables] = {}
        sites: list[_Site] = []
        for gqa in gqas:
            try:
                site = self._match(model, gqa, table_cache, max_positions)
                if not (site.tables.positions.text_only or text_only):
                    raise MatchFailure.refuse(
                        f"positions come from outside: {site.tables.positions.how}; folding into GQA is exact only "
                        "for text prompts (all three axes equal); pass --text-only to fold for text-only use",
                        gqa.name,
                    )
            except MatchFailure as failure:
                report.record(failure, gqa.name)
                continue
            sites.append(site)
        if not sites:
            return

        # Rewrite: caches shared across layers when their values are equal.
        cache_values: dict[tuple, tuple[ir.Value, ir.Value]] = {}
        old_values: list[ir.Value] = []
        positions: dict[int, PositionSource] = {}
        for site in sites:
            old_values += self._rewrite(graph, site, cache_values)
            positions[id(site.tables.positions.graph_input)] = site.tables.positions
            report.rewritten(
                site.gqa.name,
                f"folded {site.q.kind} into GQA do_rotary=1 (rotary_dim {site.q.rotary_dim}, "
                f"{'interleaved' if site.q.interleaved else 'rotate-half'} pairs)",
                rotation=site.q.kind,
                tables=site.tables.source,
                positions=site.tables.positions.how,
                exact_when="all three position axes equal and contiguous (past .. past+S-1)",
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

    # -- matching ---------------------------------------------------------------------------------------------
    def _head_size(self, past_key: ir.Value | None) -> int | None:
        """Head size from the KV cache input's static last dim, else genai_config's (:attr:`GenaiConfig.head_size`)."""
        shape = past_key.shape if past_key is not None else None
        if shape is not None and len(shape) == 4 and isinstance(shape[3], int):
            return shape[3]
        return self.genai_config.head_size

    def _match(self, model: ir.Model, gqa: ir.Node, table_cache: dict[tuple, TextTables],
               max_positions: int | None) -> _Site:
        """The GQA's q/k rotations and their text tables, checked; MatchFailure (absent/refused) otherwise."""
        if int(attr(gqa, "do_rotary", 0) or 0):
            raise MatchFailure.absent("GroupQueryAttention already rotates (do_rotary=1)", gqa.name)
        inputs = list(gqa.inputs) + [None] * max(0, 9 - len(gqa.inputs))
        if any(v is not None and v.name for v in inputs[7:9]):
            raise MatchFailure.absent("GroupQueryAttention has cos_cache/sin_cache inputs but do_rotary=0", gqa.name)
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
        q_tables = self._tables(model, q_rot, table_cache, max_positions)
        k_tables = self._tables(model, k_rot, table_cache, max_positions)
        self._check(gqa, q_rot, k_rot, q_tables, k_tables)
        return _Site(gqa, q_rot, k_rot, packed, q_tables)

    def _tables(self, model: ir.Model, rotation: Rotation, cache: dict[tuple, TextTables],
                max_positions: int | None) -> TextTables:
        node = rotation.node
        key = tuple(id(v) for v in node.inputs[1:4]) + (float(attr(node, "scale", 1.0) or 1.0),)
        if key not in cache:
            cache[key] = text_tables(model, rotation, max_positions, evaluate_subgraph)
        return cache[key]

    @staticmethod
    def _check(gqa: ir.Node, q: Rotation, k: Rotation, qt: TextTables, kt: TextTables) -> None:
        """The conditions of the fold's exactness (and of GQA's fused rotary); MatchFailure.refuse naming the
        GQA when one fails."""
        def refuse(reason: str) -> MatchFailure:
            return MatchFailure.refuse(reason, gqa.name)

        if q.interleaved != k.interleaved or q.rotary_dim != k.rotary_dim:
            raise refuse(
                f"q and k are rotated differently (interleaved {q.interleaved}/{k.interleaved}, "
                f"dim {q.rotary_dim}/{k.rotary_dim})"
            )
        if not (np.array_equal(qt.cos, kt.cos) and np.array_equal(qt.sin, kt.sin)):
            raise refuse("q and k use different cos/sin tables")
        if qt.positions.graph_input is not kt.positions.graph_input:
            raise refuse("q and k read different position inputs")
        half = qt.cos.shape[1]
        if 2 * half != q.rotary_dim:
            raise refuse(f"cos/sin tables have {half} columns but the rotation covers {q.rotary_dim} dims")
        if half % 8:
            raise refuse(f"rotary_dim/2 = {half} is not a multiple of 8 "
                         "(GroupQueryAttention's fused rotary needs that)")
        if q.rotary_dim > q.head_size:
            raise refuse(f"rotary_dim {q.rotary_dim} exceeds head_size {q.head_size}")
        if _query_dtype(gqa) not in _NP_DTYPES:
            raise refuse(f"query dtype {_query_dtype(gqa)} is not float or float16")

    # -- rewriting --------------------------------------------------------------------------------------------
    def _rewrite(self, graph: ir.Graph, site: _Site,
                 cache_values: dict[tuple, tuple[ir.Value, ir.Value]]) -> list[ir.Value]:
        gqa = site.gqa
        np_dtype = _NP_DTYPES[_query_dtype(gqa)]
        cos = site.tables.cos.astype(np_dtype)
        sin = site.tables.sin.astype(np_dtype)
        key = (cos.dtype.str, cos.shape, cos.tobytes(), sin.tobytes())
        if key not in cache_values:
            cache_values[key] = (
                add_initializer(graph, "rope_passes.text_mrope.cos_cache", cos),
                add_initializer(graph, "rope_passes.text_mrope.sin_cache", sin),
            )
        cos_v, sin_v = cache_values[key]
        old = [gqa.inputs[0], gqa.inputs[1]]
        if site.packed is not None:
            concat = site.packed
            tape = NodeTape()
            unrotated = tape.op("Concat", [site.q.pre, site.k.pre, concat.inputs[2]],
                                {"axis": int(attr(concat, "axis", -1))}, name=f"{concat.name}/unrotated")
            unrotated.dtype, unrotated.shape = concat.outputs[0].dtype, concat.outputs[0].shape
            tape.insert_before(graph, gqa)
            gqa.replace_input_with(0, unrotated)
        else:
            gqa.replace_input_with(0, site.q.pre)
            gqa.replace_input_with(1, site.k.pre)
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
