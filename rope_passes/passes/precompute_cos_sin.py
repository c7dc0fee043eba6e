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
(:class:`rope_passes.proofs.cone.Cone`: an allow-list of per-token ops from the position input to the chain
end; any op reading across tokens, and any value computed from the call's shape that reaches the arithmetic,
refuses naming the node), then checks it numerically: the subgraph evaluated on calls differing in what callers
vary (:func:`rope_passes.proofs.positions.probes`: one token at the smallest and largest positions, two tokens, batch 1..3, the whole table
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
``position_ids`` input): the Range output is the chain's position source (:mod:`rope_passes.proofs.positions`: its
start proved never negative by value, and its start and limit proved, as exact sums of the call's dimensions, to be
``past + k`` and ``past + k + length`` with ``k >= 0`` a constant, ``past`` a ``past…`` KV cache input's axis 2 and
``length`` ``input_ids`` / ``inputs_embeds``' axis 1; any other Range is refused); the tables are gathered by it, with
``max_positions + k`` rows: exact while ``past + length <= max_positions``.

**With a Hugging Face config** beside the model (or the ``hf_config`` option; :mod:`rope_passes.hf_config`): the
table size defaults to ``max_position_embeddings``, each chain is compared with what the config says (a mismatch is a
note: the tables keep what the graph computes), and a dynamic NTK config is refused. A config whose rope cannot be
computed is a ModelLoadError (one line, exit 2). **Repair, on request only**: with the config given explicitly
(``hf_config`` / ``--hf-config``), LongRoPE frozen at export is rebuilt as two tables and transformers' switch
(:mod:`rope_passes.proofs.config`), reported as ``repaired`` ("the input computed X, the output computes Y, because
<config> says Z"), never as an ordinary rewrite.

**Refuses** (graph unchanged at that chain, reason in the report): LongRoPE chosen per call
(``Where(ReduceMax(position_ids)+1 > original_max, long_inv_freq, short_inv_freq)``, census ``longrope-where``);
any other op mixing the positions of a call (dynamic NTK spelled out in the graph); rows that do not permute
with the positions; a Range position source whose start is not proved never negative, or not proved
``Range(past + k, past + k + length, 1)``; an unknown table size.
**Not matched**: Cos/Sin not computed from positions × inv_freq;
chains depending on another graph input, on no graph input, or on a position input that is not an integer
``[B,S]`` / ``[3,B,S]``; chains whose end is a graph output. Dynamic NTK and transformers-4 LongRoPE *exported by
TorchScript* froze their frequencies at the sample input: they look like default RoPE, are rewritten, and stay
exactly as (in)correct as the exported graph — nothing in the graph says otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.longrope import longrope_where
from rope_passes.hf_config import HFConfig
from rope_passes.passes._rewrite import NodeTape, add_initializer, opset_of, remove_dead
from rope_passes.passes.base import PassContext, RopePass, option
from rope_passes.proofs.chain import Chain, find_chain
from rope_passes.proofs.cone import Cone, Val
from rope_passes.proofs.config import UNKNOWN_SIZE, against_config, find_ropes, per_call_tables, shape_feeds
from rope_passes.proofs.constants import constant
from rope_passes.proofs.known import Known
from rope_passes.proofs.positions import probes
from rope_passes.report import MatchFailure, PassReport
from rope_passes.runtime.evaluate import evaluate_subgraph

MAX_POSITIONS_KEY = "rope_passes.cos_sin_max_positions"

@dataclasses.dataclass(frozen=True)
class PrecomputeCosSinOptions:
    max_positions: int | None = option(None, "rows of the precomputed tables (default: genai_config context_length, "
                                             "else config.json's max_position_embeddings)", positive=True)
    hf_config: str | None = option(None, "the model's Hugging Face config.json (or its folder): table size, rope type "
                                         "and scaling (default: config.json / model_config.json beside the model). "
                                         "Given explicitly, it is also a request to repair: LongRoPE frozen at "
                                         "export is rebuilt to compute what this config says (reported as repaired)")


class PrecomputeCosSinPass(RopePass):
    name = "precompute-cos-sin"
    summary = "replace cos/sin computed per call from inv_freq by Gather from precomputed max_positions × D tables"
    options_type = PrecomputeCosSinOptions
    options: PrecomputeCosSinOptions

    def __init__(self, context: PassContext | None = None, *, max_positions: int | None = None,
                 hf_config: str | None = None) -> None:
        super().__init__(context)
        self.options = self.make_options(max_positions=max_positions, hf_config=hf_config)

    def apply(self, model: ir.Model, report: PassReport) -> None:
        trig = [n for n in model.graph if n.op_type in ("Cos", "Sin") and n.domain in ("", "ai.onnx")]
        if not trig:
            raise MatchFailure.absent("no Cos/Sin node in the main graph (nothing computed per call)")
        chains: list[Chain] = []
        for node in trig:
            try:
                chain = find_chain(model, node)
                self._check_static(model, chain)
                chains.append(chain)
            except MatchFailure as failure:
                report.record(failure, node)
        if chains:
            self._apply(model, chains, report)

    def _apply(self, model: ir.Model, chains: list[Chain], report: PassReport) -> None:
        graph = model.graph
        hf, ropes = find_ropes(self.context.model_path, self.options.hf_config)
        if isinstance(ropes, MatchFailure):
            for c in chains:
                report.record(ropes, c.trig)
            return
        max_positions = self._max_positions(hf)
        if max_positions is None:
            for c in chains:
                report.refused(c.trig.name, UNKNOWN_SIZE)
            return
        done_per_call: list[Chain] = []
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
                report.record(failure, c.trig)
        by_positions: dict[int, list[Chain]] = {}
        for c in chains:
            by_positions.setdefault(id(c.positions), []).append(c)
        for group in by_positions.values():  # a Range source past + c .. past + c + length - 1: c more rows
            source = group[0].source
            wraps = source.overflow(max_positions) if source is not None else None
            if wraps is not None:
                for c in group:
                    report.record(wraps, c.trig)
                continue
            excess = source.excess if source is not None else 0
            tables.update(self._tables(model, group, max_positions + excess, report))
        if ropes and hf is not None:  # a repair only when the user gave the config (--hf-config)
            asked = self.options.hf_config is not None
            against_config(model, [c for c in chains if id(c.end) in tables], tables, ropes, report,
                           repair=str(hf.path) if asked else None)
        done = [c for c in chains if id(c.end) in tables] + done_per_call
        if not done:
            return
        self._rewrite(graph, done, tables, report)
        model.metadata_props[MAX_POSITIONS_KEY] = str(max_positions)
        report.metadata_changes.append(f"metadata_props[{MAX_POSITIONS_KEY!r}] = '{max_positions}'")
        for source in {id(c.source.node): c.source for c in done if c.source is not None and c.source.excess}.values():
            report.note(source.node, f"Range {source.node.name!r} makes positions past + "
                        f"{source.excess} .. past + {source.excess} + length - 1 (past = {source.past}, length = "
                        f"{source.length}): its tables hold max_positions + {source.excess} = "
                        f"{max_positions + source.excess} rows, so every call with past + length <= {max_positions} "
                        "reads inside them", excess=source.excess)
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
    def _check_static(model: ir.Model, chain: Chain) -> None:
        """MatchFailure.refuse unless the cone accounting proves each row a function of its own position."""
        lr = longrope_where(model)
        assume: dict[int, Val] = {}
        if lr is not None and any(n is lr.node for n in chain.nodes):  # per call: proved with the branch as a constant
            chain.per_call = lr
            long = constant(lr.long[0])
            if long is None:
                raise MatchFailure.refuse(f"LongRoPE chosen per call: its long inv_freq {lr.long[0].name!r} is not a "
                                          "constant", chain.trig)
            assume = {id(lr.node.outputs[0]): Known.of(long)}
        opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 18))
        try:
            cone = Cone(chain.positions, opset, chain.shape_inputs, assume, shape=chain.positions_shape)
            cone.prove(chain.end, chain.trig, unit_axes=chain.source is not None)
            chain.unit_axes = cone.unit_axes
        except MatchFailure as failure:
            raise MatchFailure.refuse(failure.reason, chain.trig.name, inv_freq=chain.inv_freq.name,
                                      node=failure.place) from None

    # -- evaluating -------------------------------------------------------------------------------------------
    def _tables(self, model: ir.Model, chains: list[Chain], rows: int, report: PassReport) -> dict[int, np.ndarray]:
        """Tables ``[rows, D]`` per chain end (``id(end)``), from the graph's own subgraph; failed ones recorded."""
        try:
            shape_inputs = list({id(v): v for c in chains for v in c.shape_inputs}.values())
            probes, labels, results = _evaluate(model, chains[0], [c.end for c in chains], rows, shape_inputs)
        except MatchFailure as failure:
            for c in chains:
                report.record(failure, c.trig)
            return {}
        out: dict[int, np.ndarray] = {}
        for i, c in enumerate(chains):
            try:
                out[id(c.end)] = _table(c, probes, labels, [r[i] for r in results])
            except MatchFailure as failure:
                report.record(failure, c.trig)
        return out

    # -- rewriting --------------------------------------------------------------------------------------------
    def _rewrite(self, graph: ir.Graph, chains: list[Chain], tables: dict[int, np.ndarray],
                 report: PassReport) -> None:
        shared: dict[tuple, ir.Value] = {}
        old: list[ir.Value] = []
        for n, c in enumerate(chains):
            table = tables[id(c.end)]
            rows = int(table.shape[0])
            if c.source is not None:  # the Gather reads the Range output: it gets its type now (a rewrite)
                c.positions.dtype = c.source.dtype
                if c.positions.shape is None:
                    c.positions.shape = ir.Shape(c.source.shape)

            def initializer(array: np.ndarray, suffix: str = "", role: str = c.role) -> ir.Value:
                key = (role, suffix, array.dtype.str, array.shape, array.tobytes())
                if key not in shared:
                    shared[key] = add_initializer(graph, f"rope_passes.{role}_table{suffix}", array)
                return shared[key]

            tape = NodeTape(opset_of(graph))
            if c.switch is not None:
                short, long, original = c.switch
                init, long_init = initializer(short, "_short"), initializer(long, "_long")
                rows_value = _emit_switch(tape, c.positions, init, long_init, original, f"{c.role}_{n}")
            else:
                init = initializer(table)
                rows_value = tape.op("Gather", [init, c.positions], {"axis": 0},
                                     name=f"rope_passes/{c.role}_gather_{n}", output=f"rope_passes.{c.role}_rows_{n}",
                                     dtype=ir.DataType.from_numpy(table.dtype),
                                     shape=[*c.positions_shape, table.shape[-1]])
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
            record = report.rewritten if c.repaired is None else report.repaired
            record(
                c.trig.name,
                f"{c.trig.op_type} of positions × {c.inv_freq.name!r} ({c.product.op_type}) → {what}"
                if c.repaired is None else f"{c.repaired} ({c.trig.op_type} → {what})",
                table=init.name, rows=rows, columns=int(table.shape[-1]), dtype=str(table.dtype),
                table_bytes=int(table.nbytes), inv_freq=c.inv_freq.name, replaced=c.end.name,
                positions=c.positions.name, chain_nodes=len(c.nodes),
                exact_when=f"every position in [0, {rows})" + ("" if c.source is None else
                                                               f" (made by {c.source.node.name!r}: past + "
                                                               f"{c.source.excess} .. past + {c.source.excess} + "
                                                               "length - 1, proved: every call with past + length "
                                                               f"<= {rows - c.source.excess}, past = "
                                                               f"{c.source.past}, length = {c.source.length})"),
            )
        remove_dead(graph, old)


def _emit_switch(tape: NodeTape, positions: ir.Value, short: ir.Value, long: ir.Value, original: int,
                tag: str) -> ir.Value:
    """``Where(ReduceMax(positions) + 1 > original, Gather(long, positions), Gather(short, positions))``:
    transformers' LongRoPE choice (the call's largest position, over the whole batch)."""
    dtype = positions.dtype
    np_dtype = np.int64 if dtype == ir.DataType.INT64 else np.int32
    one_c = tape.op("Constant", [], {"value": ir.tensor(np.array(1, np_dtype))}, name=f"rope_passes/{tag}_one",
                    output=f"rope_passes.{tag}_one", dtype=dtype, shape=[])
    orig_c = tape.op("Constant", [], {"value": ir.tensor(np.array(original, np_dtype))},
                     name=f"rope_passes/{tag}_original", output=f"rope_passes.{tag}_original", dtype=dtype, shape=[])
    top = tape.op("ReduceMax", [positions], {"keepdims": 0}, name=f"rope_passes/{tag}_max", dtype=dtype, shape=[])
    size = tape.op("Add", [top, one_c], name=f"rope_passes/{tag}_max_plus_one", dtype=dtype, shape=[])
    cond = tape.op("Greater", [size, orig_c], name=f"rope_passes/{tag}_long", output=f"rope_passes.{tag}_long",
                   dtype=ir.DataType.BOOL, shape=[])
    width = long.shape[-1] if long.shape is not None else None
    rows = []
    for which, table in (("long", long), ("short", short)):
        rows.append(tape.op("Gather", [table, positions], {"axis": 0}, name=f"rope_passes/{tag}_gather_{which}",
                            output=f"rope_passes.{tag}_rows_{which}", dtype=table.dtype,
                            shape=[*positions.shape, width]))
    return tape.op("Where", [cond, *rows], name=f"rope_passes/{tag}_switch", output=f"rope_passes.{tag}_rows",
                   dtype=long.dtype, shape=[*positions.shape, width])


def _evaluate(model: ir.Model, chain: Chain, ends: list[ir.Value], rows: int,
              shape_inputs: Sequence[ir.Value] = ()) -> tuple[list[np.ndarray], list[str], list[list[np.ndarray]]]:
    """(probes, their labels, the ends' values per probe): the subgraph from the chain's positions to ``ends`` run
    on onnxruntime CPU on the :func:`rope_passes.proofs.positions.probes` calls; MatchFailure.absent if it cannot
    be."""
    positions, shape = chain.positions, chain.positions_shape
    dtype = np.int64 if chain.positions_dtype == ir.DataType.INT64 else np.int32
    calls = probes(rows, len(shape) == 3)
    if len(shape) == 1:  # a Range source: the same calls, one row each
        calls = [(label, p.reshape(-1)) for label, p in calls]
    try:
        results = [evaluate_subgraph(model, [positions, *shape_inputs], ends,
                                     [p.astype(dtype), *shape_feeds(shape_inputs, shape, p)]) for _, p in calls]
    except ValueError as exc:  # extract(): the ends are not bounded by the positions
        raise MatchFailure.absent(f"the chain is not a function of {positions.name!r} alone ({exc})") from exc
    except Exception as exc:  # noqa: BLE001 - any onnxruntime failure becomes a reason in the report
        raise MatchFailure.absent(f"cannot evaluate the cos/sin subgraph on onnxruntime CPU "
                                  f"({type(exc).__name__}: {str(exc).splitlines()[0][:160]})") from exc
    return [p for _, p in calls], [label for label, _ in calls], results


def _table(chain: Chain, probes: list[np.ndarray], labels: list[str], results: list[np.ndarray]) -> np.ndarray:
    """The chain's ``[rows, D]`` table, proved per position on every probe; MatchFailure otherwise."""
    if chain.unit_axes:  # a Range source [S]: the end is [1, S, D]
        results = [np.squeeze(r, axis=tuple(chain.unit_axes)) for r in results]
    first = results[0]
    if first.ndim != probes[0].ndim + 1 or first.shape[:-1] != probes[0].shape:
        raise MatchFailure.absent(f"{chain.end.name!r} has shape {list(first.shape)} for positions of shape "
                                  f"{list(probes[0].shape)}, not positions.shape + [D]", chain.trig)
    table = first if probes[0].ndim == 1 else first[0] if probes[0].ndim == 2 else first[0, 0]
    bad = next((label for p, r, label in zip(probes, results, labels, strict=True) if not (
        r.shape == p.shape + table.shape[-1:] and np.array_equal(r, table[p]))), None)
    if bad is not None:
        raise MatchFailure.refuse(f"{chain.end.name!r}: with {bad} the rows are not the table's rows at those "
                                  "positions, so a row depends on more than its own position", chain.trig)
    return np.ascontiguousarray(table)


__all__ = ["MAX_POSITIONS_KEY", "PrecomputeCosSinPass"]

