"""``precompute-cos-sin``: read cos/sin from precomputed tables instead of computing them on every call.

**Rewrites.** Torch exporters compute the rotary cos/sin per call from the positions (census flavour
``inv-freq-matmul``):

* transformers 5 dynamo: ``position_ids → Unsqueeze → Cast → Mul(inv_freq) → Concat(f, f) → Cos | Sin →
  [Mul(attention_scaling)]``;
* transformers 4 TorchScript: ``Expand(inv_freq[1,D/2,1], Shape(position_ids)…) → Cast → MatMul(Unsqueeze(
  position_ids) → Cast) → Transpose → Concat → Cos | Sin → Mul(scale) → Cast``;
* mRoPE (``position_ids [3,B,S]``): the same, per axis, up to the per-axis ``[3,B,S,D/2]`` Cos | Sin.

For each Cos/Sin node of the main graph whose input is positions × an ``inv_freq`` vector
(:func:`rope_passes.analysis.census.inv_freq_product`) the pass takes the chain's *end*: the Cos/Sin output
followed down through single-consumer Cast / Identity / Neg and Mul/Div/Add/Sub-by-a-scalar-constant nodes (the
attention scaling, yarn's factor). That end is replaced by ``Gather(table, position_ids, axis=0)`` from a new
``[max_positions, D]`` initializer (``rope_passes.cos_table`` / ``rope_passes.sin_table``, the end's dtype, shared
when equal), and every node only the old chain used is removed (Shape/Expand/MatMul/Cos/Sin …). What reads the
end (``Unsqueeze(1)``, mRoPE's Split/Gather sections, the rotations) is left as it was, with the same shape.

The tables are not re-derived from formulas: the graph's own subgraph from the position input to the chain ends is
evaluated on onnxruntime CPU (:func:`rope_passes.runtime.evaluate.evaluate_subgraph`, as ``fold-text-mrope`` does) on
positions ``0..max_positions-1``, so linear/llama3/yarn/partial-rotary factors and attention scaling are whatever
the graph computes. ``max_positions``: the ``max_positions`` option, else ``model.context_length`` from
genai_config.json; without either the chain is refused ("table size unknown: give max_positions").

**Exact when** each output row is a function of its own position alone (no reduction over the positions of a
call, no dependence on batch or sequence length beyond shape plumbing) and every position is in
``[0, max_positions)``. The pass proves the first condition before rewriting, by exact cone accounting
(:class:`rope_passes.passes._cos_sin_cone.Cone`: an allow-list of per-token ops from the position input to the chain
end; any op reading across tokens, and any value computed from the call's shape that reaches the arithmetic,
refuses naming the node), then checks it numerically: the subgraph evaluated on calls differing in what callers
vary (:func:`._cos_sin_positions.probes`: one token at the smallest and largest positions, two tokens, batch 1..3, the whole table
permuted, windows across every power of two; ``[3,B,S]`` inputs also with differing axes) must give exactly the
table's rows at those positions. Then the rewrite is exact under
ONNX semantics, and in float32 bit-identical on onnxruntime (the tables come from the same kernels on the same
values; all 58 corpus graphs). A chain ending in a float16 Cast gets a float16 table; onnxruntime CPU runs float16
Mul/Add through float32 casts that skip the original's rounding to float16, so there the two may differ by an
fp16 ulp. The second condition cannot be checked in the graph. A position ``>= max_positions`` makes onnxruntime 1.27's Gather fail on CPU ("indices element out of
data bounds") and read zeros on WebGPU, silently (cos = sin = 0: the rotated q/k become 0); a negative one wraps
around to the end of the table (Gather's negative indices) where the original computed cos(-p·f). So
``max_positions`` must cover every position the model will be run at; it is written to the model's
``metadata_props["rope_passes.cos_sin_max_positions"]`` and to the report (a note).

**Positions made in the graph** (optimum's Gemma exports: ``Range(past, past + length, 1)`` from tensor shapes, no
``position_ids`` input): the Range output is the chain's position source (:mod:`._cos_sin_positions`: its values are
never negative); the tables are gathered by it, exact while ``past + length <= max_positions``.

**With a Hugging Face config** beside the model (or the ``hf_config`` option; :mod:`rope_passes.hf_config`): the
table size defaults to ``max_position_embeddings``, each chain is compared with what the config computes, LongRoPE
frozen at export is rebuilt as two tables and transformers' switch (:mod:`._cos_sin_config`), and a dynamic NTK
config is refused.

**Refuses** (graph unchanged at that chain, reason in the report): LongRoPE chosen per call
(``Where(ReduceMax(position_ids)+1 > original_max, long_inv_freq, short_inv_freq)``, census ``longrope-where``);
any other op mixing the positions of a call (dynamic NTK spelled out in the graph); rows that do not permute
with the positions; an unknown table size. **Not matched**: Cos/Sin not computed from positions × inv_freq;
chains depending on another graph input, on no graph input, or on a position input that is not an integer
``[B,S]`` / ``[3,B,S]``; chains whose end is a graph output. Dynamic NTK and transformers-4 LongRoPE *exported by
TorchScript* froze their frequencies at the sample input: they look like default RoPE, are rewritten, and stay
exactly as (in)correct as the exported graph — nothing in the graph says otherwise.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import ancestors, const_tensor
from rope_passes.analysis.inv_freq import inv_freq_product
from rope_passes.analysis.longrope import LongRoPE, longrope_where
from rope_passes.hf_config import HFConfig
from rope_passes.passes._cos_sin_cone import Cone, Val
from rope_passes.passes._cos_sin_config import (
    UNKNOWN_SIZE,
    against_config,
    emit_switch,
    find_ropes,
    per_call_tables,
    shape_feeds,
)
from rope_passes.passes._cos_sin_known import const
from rope_passes.passes._cos_sin_positions import probes, range_source, typed
from rope_passes.passes._rewrite import NodeTape, add_initializer, remove_dead
from rope_passes.passes.base import RopePass, option
from rope_passes.report import MatchFailure, PassReport
from rope_passes.runtime.evaluate import evaluate_subgraph

MAX_POSITIONS_KEY = "rope_passes.cos_sin_max_positions"

#: Ops followed down from Cos/Sin into the chain's end: unary, or binary with a scalar constant.
_UNARY = ("Cast", "Identity", "Neg")
_SCALAR_BINARY = ("Mul", "Div", "Add", "Sub")


@dataclasses.dataclass
class _Chain:
    """One per-call cos or sin computation: Cos/Sin node, the value consumers read, its inputs."""

    trig: ir.Node
    end: ir.Value  # replaced by the Gather
    positions: ir.Value  # the position graph input
    product: ir.Node  # the positions × inv_freq MatMul/Mul
    inv_freq: ir.Value
    nodes: list[ir.Node]  # the chain's nodes (ancestors of ``end``)
    #: other graph inputs the chain reads only the shape of (the batch from Shape(past_key_values.0.value))
    shape_inputs: list[ir.Value] = dataclasses.field(default_factory=list)
    #: positions made in the graph: the Range whose output is ``positions`` (None: a graph input)
    source: ir.Node | None = None
    #: axes of ``end`` of extent 1 besides the positions' (a Range source's ``Unsqueeze(0)``)
    unit_axes: list[int] = dataclasses.field(default_factory=list)
    #: LongRoPE chosen per call in the graph (analysis.longrope's ``where`` form): tables only with a config
    per_call: LongRoPE | None = None
    #: LongRoPE frozen at export, rebuilt from config.json: (short table, long table, original_max_position_embeddings)
    switch: tuple[np.ndarray, np.ndarray, int] | None = None

    @property
    def role(self) -> str:
        return self.trig.op_type.lower()


def _is_scalar_const(value: ir.Value | None) -> bool:
    tensor = const_tensor(value)
    return tensor is not None and tensor.size == 1


def chain_end(value: ir.Value) -> ir.Value:
    """Follow ``value`` down through single-consumer unary ops and binary ops with a scalar constant."""
    while not value.is_graph_output():
        uses = list(value.uses())
        if len(uses) != 1:
            return value
        user, index = uses[0]
        if user.domain not in ("", "ai.onnx") or len(user.outputs) != 1:
            return value
        if user.op_type in _UNARY:
            pass
        elif user.op_type in _SCALAR_BINARY and len(user.inputs) == 2:
            if not _is_scalar_const(user.inputs[1 - index]):
                return value
        else:
            return value
        value = user.outputs[0]
    return value


def _graph_inputs(nodes: list[ir.Node], end: ir.Value) -> list[ir.Value]:
    found: dict[int, ir.Value] = {}
    for v in [end, *(i for n in nodes for i in n.inputs)]:
        if v is not None and v.is_graph_input():
            found[id(v)] = v
    return list(found.values())


def find_chain(model: ir.Model, trig: ir.Node) -> _Chain:
    """The per-call chain ending at ``trig`` (not yet proved per-token); MatchFailure.absent if it is not this form."""
    found = inv_freq_product(trig, model)
    if found is None:
        raise MatchFailure.absent(f"{trig.op_type} does not read positions × an inv_freq vector", trig.name)
    product, inv_freq = found
    end = chain_end(trig.outputs[0])
    if end.is_graph_output():
        raise MatchFailure.absent(f"the chain's end {end.name!r} is a graph output", trig.name)
    nodes = ancestors([end])
    inputs = _graph_inputs(nodes, end)
    in_chain = {id(n) for n in nodes}
    shape_only = [v for v in inputs if all(u.op_type in ("Shape", "Size") for u, _ in v.uses() if id(u) in in_chain)]
    read = [v for v in inputs if all(v is not s for s in shape_only)]
    by_value = {id(i) for n in ancestors(product.inputs, stop=("Shape", "Size")) if n.op_type not in ("Shape",
                "Size") for i in n.inputs if i is not None}
    if len(read) != 1 or id(read[0]) not in by_value:
        source = range_source(product)
        if source is not None:
            return _range_chain(trig, end, product, inv_freq, source)
        names = ", ".join(sorted(repr(v.name) for v in inputs)) or "none"
        if len(read) != 1:
            raise MatchFailure.absent(f"{trig.op_type} depends on {len(inputs)} graph inputs ({names}), not on one "
                                      "position input", trig.name)
        raise MatchFailure.absent(f"{trig.op_type} reads no position input: its positions are made in the graph "
                                  f"from the shapes of {names}, not by a Range this pass knows", trig.name)
    (positions,) = read
    shape = positions.shape
    if positions.dtype not in (ir.DataType.INT64, ir.DataType.INT32) or shape is None or not (
            len(shape) == 2 or (len(shape) == 3 and shape[0] == 3)):
        raise MatchFailure.absent(f"position input {positions.name!r} is {positions.dtype} {shape}, not an "
                                  "integer [batch, seq] or [3, batch, seq] tensor", trig.name)
    return _Chain(trig, end, positions, product, inv_freq, nodes, shape_inputs=shape_only)


def _range_chain(trig: ir.Node, end: ir.Value, product: ir.Node, inv_freq: ir.Value, source: ir.Node) -> _Chain:
    """The chain from a Range position source (positions made in the graph) to ``end``."""
    positions = source.outputs[0]
    nodes: dict[int, ir.Node] = {}
    stack = [end.producer()]
    while stack:
        node = stack.pop()
        if node is None or id(node) in nodes:
            continue
        nodes[id(node)] = node
        stack.extend(i.producer() for i in node.inputs if i is not None and i is not positions)
    inputs = _graph_inputs(list(nodes.values()), end)
    shape_only = [v for v in inputs if all(u.op_type in ("Shape", "Size") for u, _ in v.uses() if id(u) in nodes)]
    if len(shape_only) != len(inputs):
        names = ", ".join(sorted(repr(v.name) for v in inputs if all(v is not s for s in shape_only)))
        raise MatchFailure.absent(f"{trig.op_type} reads {names} besides its positions ({source.op_type} "
                                  f"{source.name!r})", trig.name)
    return _Chain(trig, end, positions, product, inv_freq, list(nodes.values()), shape_inputs=shape_only,
                  source=source)


@dataclasses.dataclass(frozen=True)
class PrecomputeCosSinOptions:
    max_positions: int | None = option(None, "rows of the precomputed tables (default: genai_config context_length, "
                                             "else config.json's max_position_embeddings)", positive=True)
    hf_config: str | None = option(None, "the model's Hugging Face config.json (or its folder): table size, rope type "
                                         "and scaling (default: config.json / model_config.json beside the model)")


class PrecomputeCosSinPass(RopePass):
    name = "precompute-cos-sin"
    summary = "replace cos/sin computed per call from inv_freq by Gather from precomputed max_positions × D tables"
    options_type = PrecomputeCosSinOptions
    options: PrecomputeCosSinOptions

    def apply(self, model: ir.Model, report: PassReport) -> None:
        trig = [n for n in model.graph if n.op_type in ("Cos", "Sin") and n.domain in ("", "ai.onnx")]
        if not trig:
            raise MatchFailure.absent("no Cos/Sin node in the main graph (nothing computed per call)")
        with contextlib.ExitStack() as typing:  # Range position sources get a type while the pass works with them
            chains: list[_Chain] = []
            for node in trig:
                try:
                    chain = find_chain(model, node)
                    typing.enter_context(typed(chain.source))
                    self._check_static(model, chain)
                    chains.append(chain)
                except MatchFailure as failure:
                    report.record(failure, node.name)
            if chains:
                self._apply(model, chains, report)

    def _apply(self, model: ir.Model, chains: list[_Chain], report: PassReport) -> None:
        graph = model.graph
        hf, ropes = find_ropes(self.context.model_path, self.options.hf_config)
        if isinstance(ropes, MatchFailure):
            for c in chains:
                report.record(ropes, c.trig.name)
            return
        max_positions = self._max_positions(hf)
        if max_positions is None:
            for c in chains:
                report.refused(c.trig.name, UNKNOWN_SIZE)
            return
        done_per_call: list[_Chain] = []
        tables: dict[int, np.ndarray] = {}
        for c in [c for c in chains if c.per_call is not None]:
            chains.remove(c)
            lr = c.per_call
            try:
                if not any(r.switches for r in ropes):
                    raise MatchFailure.refuse(
                        f"LongRoPE chosen per call: {lr.switch} (node {lr.switch_node!r}) picks the long or short "
                        "inv_freq from the largest position of the call, so a row depends on the other positions "
                        "(dynamic: no single table; a LongRoPE config.json beside the model gives two tables and the "
                        "switch)", c.trig.name, inv_freq=c.inv_freq.name)
                c.switch = per_call_tables(model, c, ropes, max_positions, lr)
                tables[id(c.end)] = c.switch[0]
                done_per_call.append(c)
            except MatchFailure as failure:
                report.record(failure, c.trig.name)
        by_positions: dict[int, list[_Chain]] = {}
        for c in chains:
            by_positions.setdefault(id(c.positions), []).append(c)
        for group in by_positions.values():
            tables.update(self._tables(model, group, max_positions, report))
        if ropes:
            against_config(model, [c for c in chains if id(c.end) in tables], tables, ropes, report)
        done = [c for c in chains if id(c.end) in tables] + done_per_call
        if not done:
            return
        self._rewrite(graph, done, tables, max_positions, report)
        model.metadata_props[MAX_POSITIONS_KEY] = str(max_positions)
        report.metadata_changes.append(f"metadata_props[{MAX_POSITIONS_KEY!r}] = '{max_positions}'")
        names = ", ".join(sorted({repr(c.positions.name) for c in done}))
        report.note(
            "<model>",
            f"cos/sin tables hold positions 0..{max_positions - 1}: a position >= {max_positions} in {names} makes "
            "Gather fail on onnxruntime CPU and read zeros on WebGPU (silently wrong); a negative one wraps around",
            max_positions=max_positions,
        )

    # -- options ----------------------------------------------------------------------------------------------
    def _max_positions(self, hf: HFConfig | None) -> int | None:
        if self.options.max_positions is not None:
            return self.options.max_positions
        if self.genai_config.context_length is not None:
            return self.genai_config.context_length
        return hf.max_position_embeddings if hf is not None else None

    # -- matching ---------------------------------------------------------------------------------------------
    @staticmethod
    def _check_static(model: ir.Model, chain: _Chain) -> None:
        """MatchFailure.refuse unless the cone accounting proves each row a function of its own position."""
        lr = longrope_where(model)
        assume: dict[int, Val] = {}
        if lr is not None and any(n is lr.node for n in chain.nodes):  # per call: proved with the branch as a constant
            chain.per_call = lr
            assume = {id(lr.node.outputs[0]): const(const_tensor(lr.long[0]))}
        opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 18))
        try:
            cone = Cone(chain.positions, opset, chain.shape_inputs, assume)
            cone.prove(chain.end, chain.trig, unit_axes=chain.source is not None)
            chain.unit_axes = cone.unit_axes
        except MatchFailure as failure:
            raise MatchFailure.refuse(failure.reason, chain.trig.name, inv_freq=chain.inv_freq.name,
                                      node=failure.target) from None

    # -- evaluating -------------------------------------------------------------------------------------------
    def _tables(self, model: ir.Model, chains: list[_Chain], rows: int, report: PassReport) -> dict[int, np.ndarray]:
        """Tables ``[rows, D]`` per chain end (``id(end)``), from the graph's own subgraph; failed ones recorded."""
        try:
            shape_inputs = list({id(v): v for c in chains for v in c.shape_inputs}.values())
            probes, labels, results = _evaluate(model, chains[0].positions, [c.end for c in chains], rows, shape_inputs)
        except MatchFailure as failure:
            for c in chains:
                report.record(failure, c.trig.name)
            return {}
        out: dict[int, np.ndarray] = {}
        for i, c in enumerate(chains):
            try:
                out[id(c.end)] = _table(c, probes, labels, [r[i] for r in results])
            except MatchFailure as failure:
                report.record(failure, c.trig.name)
        return out

    # -- rewriting --------------------------------------------------------------------------------------------
    def _rewrite(self, graph: ir.Graph, chains: list[_Chain], tables: dict[int, np.ndarray], rows: int,
                 report: PassReport) -> None:
        shared: dict[tuple, ir.Value] = {}
        old: list[ir.Value] = []
        for n, c in enumerate(chains):
            table = tables[id(c.end)]

            def initializer(array: np.ndarray, suffix: str = "", role: str = c.role) -> ir.Value:
                key = (role, suffix, array.dtype.str, array.shape, array.tobytes())
                if key not in shared:
                    shared[key] = add_initializer(graph, f"rope_passes.{role}_table{suffix}", array)
                return shared[key]

            tape = NodeTape()
            if c.switch is not None:
                short, long, original = c.switch
                init, long_init = initializer(short, "_short"), initializer(long, "_long")
                rows_value = emit_switch(tape, c.positions, init, long_init, original, f"{c.role}_{n}")
            else:
                init = initializer(table)
                rows_value = tape.op("Gather", [init, c.positions], {"axis": 0},
                                     name=f"rope_passes/{c.role}_gather_{n}", output=f"rope_passes.{c.role}_rows_{n}",
                                     dtype=ir.DataType.from_numpy(table.dtype),
                                     shape=[*c.positions.shape, table.shape[-1]])
            if c.unit_axes:  # a Range source [S]: the end was [1, S, D]
                axes = tape.op("Constant", [], {"value": ir.tensor(np.array(c.unit_axes, np.int64))},
                               name=f"rope_passes/{c.role}_axes_{n}", output=f"rope_passes.{c.role}_axes_{n}")
                rows_value = tape.op("Unsqueeze", [rows_value, axes], name=f"rope_passes/{c.role}_unsqueeze_{n}",
                                     output=f"rope_passes.{c.role}_rows_{n}_unsqueezed", dtype=rows_value.dtype)
            producer = c.end.producer()
            assert producer is not None  # a chain end is computed from the positions
            tape.insert_after(graph, producer)
            c.end.replace_all_uses_with(rows_value)
            old.append(c.end)
            what = (f"Gather({init.name} {list(table.shape)} {table.dtype}, {c.positions.name})" if c.switch is None
                    else f"Where(max({c.positions.name}) + 1 > {c.switch[2]}, Gather({long_init.name}), "
                         f"Gather({init.name})) [{table.shape[0]}, {table.shape[-1]}] {table.dtype} " + (
                             "(LongRoPE frozen at export, rebuilt from config.json: both tables and transformers' "
                             "switch)" if c.per_call is None else "(LongRoPE chosen per call: a table for each of the "
                             "graph's two inv_freq branches, checked against config.json, and its switch)"))
            report.rewritten(
                c.trig.name,
                f"{c.trig.op_type} of positions × {c.inv_freq.name!r} ({c.product.op_type}) → {what}",
                table=init.name, rows=rows, columns=int(table.shape[-1]), dtype=str(table.dtype),
                table_bytes=int(table.nbytes), inv_freq=c.inv_freq.name, replaced=c.end.name,
                positions=c.positions.name, chain_nodes=len(c.nodes),
                exact_when=f"every position in [0, {rows})" + ("" if c.source is None else
                                                               f" (made by {c.source.name!r}: past + length <= {rows})"),
            )
        remove_dead(graph, old)


def _evaluate(model: ir.Model, positions: ir.Value, ends: list[ir.Value], rows: int,
              shape_inputs: Sequence[ir.Value] = ()) -> tuple[list[np.ndarray], list[str], list[list[np.ndarray]]]:
    """(probes, their labels, the ends' values per probe): the subgraph from ``positions`` to ``ends`` run on
    onnxruntime CPU on the :func:`._cos_sin_positions.probes` calls; MatchFailure.absent if it cannot be."""
    dtype = np.int64 if positions.dtype == ir.DataType.INT64 else np.int32
    calls = probes(rows, len(positions.shape) == 3)
    if len(positions.shape) == 1:  # a Range source: the same calls, one row each
        calls = [(label, p.reshape(-1)) for label, p in calls]
    try:
        results = [evaluate_subgraph(model, [positions, *shape_inputs], ends,
                                     [p.astype(dtype), *shape_feeds(shape_inputs, positions, p)]) for _, p in calls]
    except ValueError as exc:  # extract(): the ends are not bounded by the positions
        raise MatchFailure.absent(f"the chain is not a function of {positions.name!r} alone ({exc})") from exc
    except Exception as exc:  # noqa: BLE001 - any onnxruntime failure becomes a reason in the report
        raise MatchFailure.absent(f"cannot evaluate the cos/sin subgraph on onnxruntime CPU "
                                  f"({type(exc).__name__}: {str(exc).splitlines()[0][:160]})") from exc
    return [p for _, p in calls], [label for label, _ in calls], results


def _table(chain: _Chain, probes: list[np.ndarray], labels: list[str], results: list[np.ndarray]) -> np.ndarray:
    """The chain's ``[rows, D]`` table, proved per position on every probe; MatchFailure otherwise."""
    if chain.unit_axes:  # a Range source [S]: the end is [1, S, D]
        results = [np.squeeze(r, axis=tuple(chain.unit_axes)) for r in results]
    first = results[0]
    if first.ndim != probes[0].ndim + 1 or first.shape[:-1] != probes[0].shape:
        raise MatchFailure.absent(f"{chain.end.name!r} has shape {list(first.shape)} for positions of shape "
                                  f"{list(probes[0].shape)}, not positions.shape + [D]", chain.trig.name)
    table = first if probes[0].ndim == 1 else first[0] if probes[0].ndim == 2 else first[0, 0]
    bad = next((label for p, r, label in zip(probes, results, labels, strict=True) if not (
        r.shape == p.shape + table.shape[-1:] and np.array_equal(r, table[p]))), None)
    if bad is not None:
        raise MatchFailure.refuse(f"{chain.end.name!r}: with {bad} the rows are not the table's rows at those "
                                  "positions, so a row depends on more than its own position", chain.trig.name)
    return np.ascontiguousarray(table)


__all__ = ["MAX_POSITIONS_KEY", "PrecomputeCosSinPass", "chain_end", "find_chain"]

