"""LongRoPE: the one detector of its three forms (the census, lint, check and the passes all read it here).

LongRoPE (Phi-3/Phi-4 long-context) rotates positions below the original context with *short* factors and the
rest with *long* ones. Graphs spell the choice three ways:

* ``if``: ``If(Greater(total_length, original))`` whose branches return the long (then) or short (else) constant
  cos/sin tables (onnxruntime-genai's builder);
* ``concat``: one table ``[short[:original]; long]`` that GroupQueryAttention reads at an offset (WebGPU's
  ``multiRotaryCacheConcatOffset``; the builder's ``enable_webgpu_graph`` variant, or ``longrope-concat``'s output);
* ``where``: ``Where(Greater(max_position + 1, original), long_inv_freq, short_inv_freq)`` before an inv_freq
  product (transformers 5 exports): chosen per call from the largest position; or ``Where(Greater(total_length,
  original), long_table, short_table)`` over two whole cos/sin tables of one shape GroupQueryAttention reads (the
  ``If`` without control flow, :func:`table_where`).

The condition is matched with :class:`~rope_passes.analysis.patterns.LongRoPESwitchCondition` (structure, for the
census); :func:`rope_passes.analysis.longrope_switch.switch_offset` proves what it computes before a pass rewrites on it, by evaluating it over every
total length. Only tensor metadata and small constants are read: the tables' values are left to the passes that
rewrite them.

The concatenated table is only read at its offset on GroupQueryAttention's packed-QKV path (WebGPU kernel: key and
value inputs empty); :attr:`ConcatCache.ignoring_offset` names the readers with separate Q/K/V, which read row
``position`` of the concatenation whatever the offset (wrong past it).

**The offset is one value for the whole session.** onnxruntime's WebGPU EP holds ``multiRotaryCacheConcatOffset`` as
a provider option (``WebGpuExecutionProviderConfig``) and every GroupQueryAttention of the session reads it
(``context.MultiRotaryCacheConcatOffset()``) on its packed-QKV rotary paths (``SplitPackedQKVWithRotaryEmbedding``
and the flash-attention split/rotary/copy-KV program): row ``(total > offset ? offset : 0) + position`` of *its own*
cos/sin cache. The separate-Q/K/V rotary path (``FusedQKRotaryEmbedding``) and ``do_rotary=0`` never read it.
:mod:`rope_passes.proofs.concat_offset` lists those nodes and proves one offset for all of them (or refuses naming
the one that breaks it); the table fit that says whether a table is a ``[short; long]`` pair lives there too.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

import onnx_ir as ir

from rope_passes.analysis.attention import total_seq_description
from rope_passes.analysis.caches import FoundCache, find_caches, switched_head
from rope_passes.analysis.graph import (
    MS_DOMAIN,
    ancestors,
    attr,
    const_array,
    const_tensor,
    flag,
    is_vector,
    iter_nodes,
    nodes_of,
    table_like,
)
from rope_passes.report import MatchFailure, name_of

if TYPE_CHECKING:
    from rope_passes.analysis.patterns import LongRoPESwitchCondition, ValueMatch


@functools.cache
def _greater() -> LongRoPESwitchCondition:
    """The switch condition's pattern: onnxscript's rewriter, imported only when a graph has an If/Where to match
    (linting or inspecting any other graph never imports it)."""
    from rope_passes.interrupts import held_interrupts

    with held_interrupts():  # a first import of onnxscript is not safe to interrupt (rope_passes.interrupts)
        from rope_passes.analysis.patterns import LongRoPESwitchCondition

    return LongRoPESwitchCondition()


@dataclasses.dataclass
class SwitchCondition:
    """The condition of an If/Where LongRoPE switch."""

    match: ValueMatch | None  # LongRoPESwitchCondition on the condition; None when the node has no condition
    threshold: int | None  # Greater's constant (the original context) when the pattern matched
    description: str  # "If(Greater(total_sequence_length, 32))"
    negated: bool = False  # the pattern matched under a Not: the condition is true for totals up to the threshold


def separate_qkv(gqa: ir.Node) -> bool:
    """GroupQueryAttention fed separate query/key/value (inputs 1/2 set): its WebGPU kernel ignores
    ``multiRotaryCacheConcatOffset`` there (the offset acts on the packed-QKV path only)."""
    return any(len(gqa.inputs) > i and gqa.inputs[i] is not None for i in (1, 2))


@dataclasses.dataclass
class ConcatCache:
    """A ``[short; long]`` cos/sin table pair GroupQueryAttention reads at an offset."""

    gqa: ir.Node  # the first GroupQueryAttention (do_rotary=1) reading it
    cos: ir.Value
    sin: ir.Value
    rows: int
    offset: int  # rows of the short part: where the long table starts
    context_length: int | None
    readers: list[ir.Node] = dataclasses.field(default_factory=list)  # every GQA (do_rotary=1) reading ``cos``

    @property
    def ignoring_offset(self) -> list[ir.Node]:
        """The readers that take separate Q/K/V: WebGPU reads row ``position`` there, the offset is ignored."""
        return [g for g in self.readers if separate_qkv(g)]


@dataclasses.dataclass(frozen=True)
class LongRoPESwitch:
    """Where a model switches from the short to the long table, as a caller sees it (the checker's record): ``kind``
    ``"if"`` (the graph picks by total length: long for totals above ``switch``) or ``"concat"`` (a ``[short; long]``
    table read at offset ``switch`` by WebGPU's ``multiRotaryCacheConcatOffset``; the CPU EP has no such option);
    ``offset_ignored_by``: the GroupQueryAttention nodes with separate Q/K/V, where onnxruntime ignores the offset."""

    kind: str  # "if" | "concat"
    switch: int  # the original context: totals above it read the long table
    offset_ignored_by: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "switch": self.switch, "offset_ignored_by": list(self.offset_ignored_by)}


@dataclasses.dataclass
class LongRoPE:
    """LongRoPE as found in a graph."""

    kind: str  # "if", "concat" or "where"
    original: int | None  # the switch point: the condition's threshold, or the concat offset
    node: ir.Node | None = None  # the If or Where switch (None for concat)
    condition: SwitchCondition | None = None
    then_tables: list[ir.Value] = dataclasses.field(default_factory=list)  # if: the branches' outputs, in order
    else_tables: list[ir.Value] = dataclasses.field(default_factory=list)
    #: the If's then-branch is the shorter table: ``then_tables`` hold its else-branch's outputs (taken where the
    #: condition is false) and ``else_tables`` its then-branch's, so ``then_tables`` is the long side either way; the
    #: switch is proved on the negated condition (:func:`~rope_passes.analysis.longrope_switch.switch_offset`)
    negated: bool = False
    short: list[ir.Value] = dataclasses.field(default_factory=list)  # if: short branch; where: short inv_freq
    long: list[ir.Value] = dataclasses.field(default_factory=list)
    short_rows: int | None = None
    long_rows: int | None = None
    concat: ConcatCache | None = None

    @property
    def switch(self) -> str | None:
        """The condition in one line, e.g. ``If(Greater(total_sequence_length, 32))``; None for concat."""
        return self.condition.description if self.condition is not None else None

    @property
    def switch_node(self) -> str | None:
        return self.node.name if self.node is not None else None

    @property
    def threshold(self) -> int | None:
        return self.condition.threshold if self.condition is not None else None

    def variant(self, table: ir.Value) -> str | None:
        """``"short"``/``"long"`` for an If branch's table, ``"concat (short+long)"`` for the concatenated one; None
        for any other value."""
        if self.concat is not None and any(table is t for t in (self.concat.cos, self.concat.sin)):
            return "concat (short+long)"
        if self.kind != "if":
            return None
        if any(table is t for t in self.long):
            return "long"
        if any(table is t for t in self.short):
            return "short"
        return None


# ------------------------------------------------------------------------------------------------------------
# The switch: If or Where on Greater(length, original)
# ------------------------------------------------------------------------------------------------------------


def switch_condition(node: ir.Node, model: ir.Model, cond: ir.Value | None = None) -> SwitchCondition:
    """The condition of the If/Where ``node`` (or ``cond``, a value under its Not): matched against
    ``Greater(length, constant)``, or ``Not`` of that (``negated``), and described."""
    cond = cond if cond is not None else node.inputs[0] if node.inputs else None
    producer = cond.producer() if cond is not None else None
    if producer is not None and producer.op_type == "Not" and producer.domain in ("", "ai.onnx") and producer.inputs \
            and producer.inputs[0] is not None:
        inner = switch_condition(node, model, producer.inputs[0])
        words = inner.description.replace(f"{node.op_type}(", f"{node.op_type}(Not(", 1) + ")"
        return SwitchCondition(inner.match, inner.threshold, words, not inner.negated)
    match = _greater().match_value(model, cond, f"the {node.op_type} condition") if cond is not None else None
    threshold = None
    if match is not None and match.ok:
        threshold = int(const_array(match.bindings["original"]).reshape(-1)[0])
    if producer is None or len(producer.inputs) != 2:
        return SwitchCondition(match, threshold, f"{node.op_type}({cond.name if cond is not None else '?'})")
    a, b = producer.inputs
    lhs = name_of(a) or "?"
    desc, from_shape = total_seq_description(a, model)
    if from_shape or (desc and "attention_mask" in desc):
        lhs = "total_sequence_length"
    elif desc:
        lhs = desc
    rhs = str(threshold) if threshold is not None else (name_of(b) or "?")
    return SwitchCondition(match, threshold, f"{node.op_type}({producer.op_type}({lhs}, {rhs}))")


def _rows(tables: list[ir.Value]) -> int | None:
    """The row count the constant tables ``tables`` share (None when none is a table, or they differ)."""
    rows = {t.shape[0] for v in tables if table_like(t := const_tensor(v)) and isinstance(t.shape[0], int)}
    return rows.pop() if len(rows) == 1 else None


def if_switch(model: ir.Model, node: ir.Node) -> LongRoPE:
    """The If ``node`` read as a LongRoPE switch: its condition and each branch's outputs.

    ``short``/``long`` (and their rows) are filled when both branches return constant tables of different lengths;
    where the then-branch is the shorter one, the two sides are swapped and ``negated`` says so (``then_tables`` is
    the long side, taken where the condition is false).
    """
    found = LongRoPE("if", None, node=node, condition=switch_condition(node, model))
    for branch, tables in (("then_branch", found.then_tables), ("else_branch", found.else_tables)):
        graph = attr(node, branch)
        if graph is not None:
            tables.extend(graph.outputs)
    then_rows, else_rows = _rows(found.then_tables), _rows(found.else_tables)
    if then_rows is not None and else_rows is not None and then_rows != else_rows:
        if then_rows < else_rows:  # If(Not(total > o)) with the short table first: the long side leads
            found.then_tables, found.else_tables, found.negated = found.else_tables, found.then_tables, True
        found.long, found.short = found.then_tables, found.else_tables
        found.short_rows, found.long_rows = min(then_rows, else_rows), max(then_rows, else_rows)
    if found.condition is not None and found.condition.negated != found.negated:  # the long table is not read past
        found.condition = dataclasses.replace(found.condition, threshold=None)  # the threshold: it is no switch point
    found.original = found.threshold if found.threshold is not None else found.short_rows
    return found


def where_switch(model: ir.Model, node: ir.Node) -> LongRoPE:
    """A ``Where(condition, a, b)`` read as a LongRoPE switch of whole tables (no control flow): ``a`` is what the
    then-branch of an If would return, ``b`` the else-branch; the same proof applies (``longrope-concat``), once the
    condition is proved one element (it selects a whole table). ``Where(Not(total > c), short, long)`` (the tables
    are of one shape: no row count says which is long) is read the other way round, ``negated`` as for an If: the
    proof then shows ``long`` is taken exactly past the offset, or refuses."""
    condition = switch_condition(node, model)
    sides = [node.inputs[1]], [node.inputs[2]]
    if condition.negated:
        sides = sides[::-1]
    return LongRoPE("where", None, node=node, condition=condition, then_tables=sides[0], else_tables=sides[1],
                    negated=condition.negated)


def table_where(model: ir.Model) -> LongRoPE | None:
    """``Where(condition, long, short)`` over two constant tables of one shape (the short one padded) that
    GroupQueryAttention reads as its cos cache: the ``If`` switch without control flow (the fuzzer's ``switch-where``;
    ``longrope-concat`` proves and replaces it). Where the condition matched ``Greater(length, constant)`` (the
    threshold is the switch) the long side is the first, under a ``Not`` the second (:func:`where_switch`); otherwise
    the sides are left unlabelled."""
    for gqa in nodes_of(model, "GroupQueryAttention", MS_DOMAIN):
        node = gqa.inputs[7].producer() if len(gqa.inputs) > 8 and gqa.inputs[7] is not None else None
        if node is None or node.op_type != "Where" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 3:
            continue
        a, b = (const_tensor(v) for v in node.inputs[1:])
        if not (table_like(a) and table_like(b)) or a.shape != b.shape:
            continue
        found = where_switch(model, node)
        found.original = found.threshold
        if found.threshold is not None:
            found.long, found.short = found.then_tables, found.else_tables
        return found
    return None


def longrope_where(model: ir.Model) -> LongRoPE | None:
    """``Where(cond, long_inv_freq, short_inv_freq)`` feeding a Cos: LongRoPE chosen per call on the frequencies."""
    for cos in iter_nodes(model):
        if cos.op_type != "Cos":
            continue
        for node in ancestors(cos.inputs):
            if node.op_type != "Where" or len(node.inputs) != 3:
                continue
            a, b = (const_tensor(v) for v in node.inputs[1:])
            if a is None or b is None or a.shape != b.shape or not a.dtype.is_floating_point() or not is_vector(
                    a.shape):
                continue
            condition = switch_condition(node, model)
            return LongRoPE("where", condition.threshold, node=node, condition=condition, long=[node.inputs[1]],
                            short=[node.inputs[2]])
    return None


# ------------------------------------------------------------------------------------------------------------
# The concatenated table
# ------------------------------------------------------------------------------------------------------------


def concat_cache(model: ir.Model, *, context_length: int | None, offset: int | None = None) -> ConcatCache:
    """The ``[short; long]`` cos/sin tables GroupQueryAttention reads, of ``offset + context_length`` rows.

    ``offset`` is the short part's length where it is known (configured, or LongRoPE's original context); without
    it, a table longer than ``context_length`` is read as the concatenation and the offset is what is left over.
    Raises ``MatchFailure.absent`` when no such table is there (``refuse`` when neither length is known).
    """
    gqas = [n for n in nodes_of(model, "GroupQueryAttention", MS_DOMAIN)
            if flag(n, "do_rotary") and len(n.inputs) > 8 and n.inputs[7] is not None]
    if not gqas:
        raise MatchFailure.absent("no GroupQueryAttention with do_rotary=1 and a cos_cache")
    gqa = gqas[0]
    cos, sin = gqa.inputs[7], gqa.inputs[8]
    place = cos
    switched = switched_head(cos)
    if switched is not None:  # longrope-concat's batch form: the split is the head's rows
        rows, original = switched.rows, switched.offset
        sin_switched = switched_head(sin)
        if sin_switched is None or sin_switched.rows != rows:
            raise MatchFailure.absent("sin_cache is not switched like cos_cache", place)
        readers = [g for g in gqas if g.inputs[7] is cos]
        return ConcatCache(gqa, cos, sin, rows, original, context_length, readers)
    cos_t = const_tensor(cos)
    if not table_like(cos_t) or not isinstance(cos_t.shape[0], int):
        raise MatchFailure.absent("cos_cache is not a constant table", place)
    if context_length is None and offset is None:
        raise MatchFailure.refuse("no context_length in genai_config.json to split the cache by")
    rows = cos_t.shape[0]
    original = offset if offset is not None else rows - context_length
    if rows <= original or original <= 1 or (context_length is not None and rows != original + context_length):
        raise MatchFailure.absent(f"cos_cache has {rows} rows, not original + context {context_length} (not a "
                                  "concatenated cache)", place)
    sin_t = const_tensor(sin)
    if sin_t is None or sin_t.shape != cos_t.shape:
        raise MatchFailure.absent("sin_cache is not a constant table shaped like cos_cache", place)
    readers = [g for g in gqas if g.inputs[7] is cos]
    return ConcatCache(gqa, cos, sin, rows, original, context_length, readers)


# ------------------------------------------------------------------------------------------------------------
# The detector
# ------------------------------------------------------------------------------------------------------------


def find_longrope(
    model: ir.Model,
    *,
    context_length: int | None = None,
    concat_offset: int | None = None,
    caches: tuple[list[FoundCache], list[ir.Node]] | None = None,
) -> LongRoPE | None:
    """The graph's LongRoPE, if any: an If between tables of different lengths (the first If a cos/sin input is
    computed through), else the concatenated table read at ``concat_offset`` (the configured
    ``multiRotaryCacheConcatOffset``: without one there is no offset to read it at), else a Where of two whole tables
    GroupQueryAttention reads (:func:`table_where`), else a Where on inv_freq.

    ``caches``: :func:`~rope_passes.analysis.caches.find_caches`'s answer, when the caller has it already.
    """
    _, if_nodes = caches if caches is not None else find_caches(model)
    if if_nodes:
        found = if_switch(model, if_nodes[0])
        if found.long:
            return found
    if concat_offset is not None:
        try:
            table = concat_cache(model, context_length=context_length, offset=concat_offset)
        except MatchFailure:
            pass
        else:
            return LongRoPE("concat", table.offset, short_rows=table.offset, long_rows=table.rows - table.offset,
                            concat=table)
    return table_where(model) or longrope_where(model)
