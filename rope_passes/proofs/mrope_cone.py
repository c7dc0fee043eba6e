"""The manual (builder 0.15.2) mRoPE form for ``fold-text-mrope``: proof that its per-token cos/sin tables are one
1D table read at each token's own position, and that table.

The form: ``RotaryEmbedding(x, token_index, cos_flat, sin_flat)`` where ``token_index = Reshape(Range(0, B*S, 1),
[B, S])`` (token ``(b, s)`` reads row ``b*S + s``) and ``cos_flat`` / ``sin_flat`` are ``[B*S, half]`` rows
computed in the graph from the position input (Qwen2.5-VL: ``inv_freq`` MatMul, Cos/Sin, Split by sections,
Gather per axis, Concat, Reshape; Qwen3.5: cache Gather per axis, ``Where`` over h/w column masks, Reshape; the
``lower-mrope`` output: Gather/Transpose of the positions, Reshape, ``GatherElements`` of the caches).

**Static proof** (no numbers): exact cone accounting with the allow-list of
:class:`rope_passes.proofs.cone.Cone` (elementwise ops with constant operands, Gather of a constant table
by the positions, Slice / Split / Concat / Squeeze / Unsqueeze / Reshape / Transpose / Expand / Tile on feature
axes, MatMul with constant ``inv_freq``, Cos/Sin, ``Where`` with per-token or constant conditions, plus
``GatherElements`` of a constant table here) from the position input to the flatten ``Reshape(…, [-1, half])``,
then from the flattened ``[tokens, half]`` rows to the rotation's inputs. A ``[3, B, S]`` input counts as three
*equal* axes (a feature axis of extent 3): that is the text-only assumption ``--text-only`` states; a 2D input
needs none. Any Shape / Size of a position-derived value reaching the arithmetic, any op reading across tokens
(Reduce*, CumSum, TopK, ArgMax, GlobalMaxPool, a Slice / Gather / Einsum over the token axes), another graph input
or a custom op is a :class:`~rope_passes.report.MatchFailure` *refuse* naming the node.

**Numeric evidence**: the cone is extracted (never the model's weights) and evaluated once per *distinct* cone
(:class:`ConeKeys`: same nodes, attributes and constants, compared structurally, so the layers of a model share one
evaluation and one table): positions ``0..N-1`` in chunks of :data:`CHUNK` (memory independent of ``N``), then
:func:`probes` (one token at the first, middle and last position, three tokens after a past, batch 2, a window
ending at ``N-1``, random positions) run on the whole cone on onnxruntime CPU, whose rows must equal the table's
rows at their positions bit for bit.

The table itself comes from :class:`rope_passes.runtime.rows.RowEvaluator` where it can run the cone: the same
nodes, NumPy moving the data (exact copies) and onnxruntime's own kernels computing every number, elementwise ops
only on the elements that reach the table (a Qwen2.5-VL cone computes Cos/Sin on ``[3, 1, N, 128]`` to keep
``[N, 64]``): 0.2 s of CPU instead of 0.9 s for 128,000 positions. Why that covers every position a caller can
send: the static proof above makes each row a call-independent function of its own position; the evaluator computes
that function at *every* position ``0..N-1`` with the same kernels on the same element values (data movement and
elementwise ops commute), and a mistake of its own in moving data would be the same at every position (the index
mapping is static), which the probes, compared bit for bit with the whole cone on onnxruntime, would show. When the
probes disagree or the evaluator cannot run an op, the table is built on the whole cone on onnxruntime (as before)
and the probes judge that one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import ancestors, attr, const_tensor, table_like
from rope_passes.analysis.mrope import TextTables, is_token_index
from rope_passes.analysis.positions import PositionSource, tiled_from_2d
from rope_passes.proofs.cone import Cone, Label, Token, refuse
from rope_passes.proofs.constants import constant
from rope_passes.proofs.known import OPAQUE, SMALL, UNKNOWN_VARYING, Known, known_values
from rope_passes.report import MatchFailure, name_of

#: positions per evaluation call while building a table (bounds the memory of an evaluation, not its result; 4096
#: keeps the intermediates of a Qwen2.5-VL cone within a few MB, faster than 8192 or 16384 here)
CHUNK = 4096
Run = Callable[[list[np.ndarray]], list[np.ndarray]]


class _MRopeCone(Cone):
    """:class:`Cone` plus the two per-token ops of mRoPE graphs: Tile on feature axes and GatherElements of a
    constant table by per-token indices."""

    def _token_op(self, node: ir.Node, ins: list) -> list:
        x = ins[0]
        if node.op_type == "Tile" and isinstance(x, Token):
            reps = known_values(ins[1]) if len(ins) > 1 else None
            if reps is None or reps.dtype == object or reps.size != len(x.axes):
                raise refuse(node, "tiles by repeats not known before the call")
            out: list = []
            for a, r in zip(x.axes, reps.reshape(-1).tolist(), strict=True):
                if isinstance(a, Label):
                    if r != 1:
                        raise refuse(node, f"repeats position axis {a.axis}: rows would repeat a token")
                    out.append(a)
                elif isinstance(a, int):
                    out.append(a * int(r))
                else:
                    out.append(a if r == 1 else OPAQUE)
            return [Token(tuple(out))]
        if node.op_type == "GatherElements" and isinstance(x, Known) and isinstance(ins[1], Token):
            idx: Token = ins[1]
            if x.varies or x.shape is None or len(x.shape) != 2 or int(attr(node, "axis", 0) or 0) != 0:
                raise refuse(node, "gathers elements from a table that is not a constant [rows, columns] table")
            if len(idx.axes) != 2 or not isinstance(idx.axes[0], Label) or idx.axes[1] != x.shape[1]:
                raise refuse(node, "gathers elements by indices that are not one [columns] row per token")
            return [Token(idx.axes)]
        return super()._token_op(node, ins)


# ------------------------------------------------------------------------------------------------------------
# Structural identity of cones
# ------------------------------------------------------------------------------------------------------------
class ConeKeys:
    """Structural keys of values (hash-consed): equal keys = the same nodes, attributes and constants (small
    constants by value, large ones by identity) from the same graph inputs, so the same function."""

    def __init__(self) -> None:
        self._ids: dict[tuple, int] = {}
        self._memo: dict[int, int] = {}

    def _intern(self, key: tuple) -> int:
        return self._ids.setdefault(key, len(self._ids))

    def of(self, root: ir.Value) -> int:
        stack: list[tuple[ir.Value, bool]] = [(root, False)]
        while stack:
            v, ready = stack.pop()
            if id(v) in self._memo:
                continue
            node = v.producer()
            if node is None:
                self._memo[id(v)] = self._intern(self._leaf(v))
                continue
            if not ready:
                stack.append((v, True))
                stack.extend((i, False) for i in node.inputs if i is not None and id(i) not in self._memo)
                continue
            ins = tuple(-1 if i is None else self._memo[id(i)] for i in node.inputs)
            attrs = tuple(sorted((name, _attr_key(a)) for name, a in node.attributes.items()))
            node_key = self._intern(("node", node.domain or "", node.op_type, attrs, ins, len(node.outputs)))
            for index, out in enumerate(node.outputs):
                self._memo[id(out)] = self._intern(("out", node_key, index))
        return self._memo[id(root)]

    @staticmethod
    def _leaf(v: ir.Value) -> tuple:
        tensor = const_tensor(v)
        if tensor is not None and tensor.size <= SMALL:
            array = tensor.numpy()
            return ("const", array.dtype.str, array.shape, array.tobytes())
        return ("value", id(v))


def _attr_key(a: ir.Attr) -> object:
    value = a.value
    if a.type == ir.AttributeType.TENSOR:
        return ("tensor", value.numpy().dtype.str, tuple(value.shape), value.numpy().tobytes()) if value.size <= SMALL \
            else ("tensor-id", id(value))
    if isinstance(value, (list, tuple)):
        return tuple(_attr_key_item(x) for x in value)
    return _attr_key_item(value)


def _attr_key_item(x: object) -> object:
    return x if isinstance(x, (int, float, str, bytes, type(None))) else ("object", id(x))


# ------------------------------------------------------------------------------------------------------------
# The match and the static proof
# ------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class ManualCone:
    """The cos/sin subgraph a manual-mRoPE RotaryEmbedding reads, statically proved per token."""

    rotation: ir.Node
    positions: PositionSource
    cos: ir.Value  # the [tokens, half] rows the rotation reads
    sin: ir.Value
    rows: int  # rows of the 1D table (cache rows, else max_positions)
    half: int


def _position_input(node: ir.Node, nodes: list[ir.Node], preferred: str | None) -> ir.Value:
    found: dict[int, ir.Value] = {}
    for n in nodes:
        for v in n.inputs:
            if v is not None and v.is_graph_input():
                found[id(v)] = v
    candidates = [v for v in found.values() if v.dtype in (ir.DataType.INT64, ir.DataType.INT32)
                  and v.shape is not None and (len(v.shape) == 2 or (len(v.shape) == 3 and v.shape[0] == 3))]
    named = [v for v in candidates if v.name == preferred] or [v for v in candidates if "position" in name_of(v)]
    pick = named or candidates
    if len(pick) != 1:
        names = ", ".join(sorted(repr(v.name) for v in found.values())) or "none"
        raise MatchFailure.absent(f"{node.name!r}: the cos/sin tables depend on graph inputs {names}, not on one "
                                  "integer [3, batch, seq] or [batch, seq] position input")
    return pick[0]


def manual_cone(model: ir.Model, node: ir.Node, max_positions: int | None, preferred: str | None) -> ManualCone:
    """``node`` = RotaryEmbedding(x, token_index, cos_flat, sin_flat): the statically proved cone, or MatchFailure
    (absent: not this form; refuse naming the node that breaks the per-token proof)."""
    if not is_token_index(node.inputs[1]):
        raise MatchFailure.absent(
            f"{node.name!r}: position_ids is not the token index Range(0, batch*seq) "
            "(plain RoPE, not per-token mRoPE tables)"
        )
    if float(attr(node, "scale", 1.0)) != 1.0:
        raise MatchFailure.absent(f"{node.name!r}: RotaryEmbedding scale != 1 is not supported")
    cos_v, sin_v = node.inputs[2], node.inputs[3]
    nodes = ancestors([cos_v, sin_v])
    pos = _position_input(node, nodes, preferred)
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 18))
    first = _stage_one(pos, nodes, opset)
    half = 0
    for end in (cos_v, sin_v):
        half = _stage_two(end, pos, first, opset)
    rows = [n.inputs[0].shape[0] for n in nodes if n.op_type in ("Gather", "GatherElements")
            and table_like(const_tensor(n.inputs[0])) and int(attr(n, "axis", 0) or 0) == 0
            and isinstance(n.inputs[0].shape[0], int)]
    count = min(rows) if rows else max_positions
    if not count:
        raise MatchFailure.absent(
            f"{node.name!r}: the tables are computed from inv_freq with no cache size; set model.context_length in "
            "genai_config.json or pass max_positions"
        )
    if len(pos.shape) == 2:
        tile = next((n.outputs[0] for n in nodes if n.outputs and tiled_from_2d(n.outputs[0]) is pos), None)
        three = tile if tile is not None else pos
        source = PositionSource(pos, three, True, f"2D {pos.name!r}: every row is a function of the token's own "
                                                  "position (text only by construction)")
    else:
        source = PositionSource(pos, pos, False, f"{pos.name!r} is a [3, batch, seq] graph input (positions set by "
                                                 "the caller)")
    return ManualCone(node, source, cos_v, sin_v, int(count), half)


def _flatten_points(nodes: list[ir.Node]) -> list[ir.Node]:
    """``Reshape(x, [-1, F])`` nodes: where ``[B, S, F]`` per-token rows become the ``[B*S, F]`` table rows."""
    out = []
    for n in nodes:
        if n.op_type != "Reshape" or attr(n, "allowzero", 0):
            continue
        target = constant(n.inputs[1]) if len(n.inputs) > 1 else None  # its value, however it is spelled
        if target is not None and target.size == 2 and target.dtype.kind == "i" and int(target.reshape(-1)[0]) == -1:
            out.append(n)
    return out


def _stage_one(pos: ir.Value, nodes: list[ir.Node], opset: int) -> dict[int, int]:
    """Prove each flatten point's input one row per token ``[B, S, F]``: ``{id(flatten output): F}``."""
    shape = pos.shape
    if len(shape) == 3:  # three equal axes (the text assumption): a feature axis of extent 3
        synthetic = ir.Value(name=f"{pos.name}[t]", shape=ir.Shape(list(shape)[1:]), type=pos.type)
        cone = _MRopeCone(synthetic, opset)
        cone.vals[id(pos)] = Token((3, Label(0), Label(1)))
    else:
        cone = _MRopeCone(pos, opset)
    out: dict[int, int] = {}
    for flat in _flatten_points(nodes):
        val = cone.value(flat.inputs[0])
        if isinstance(val, Known):
            continue  # a constant reshaped: not a flatten of per-token rows
        width = int(constant(flat.inputs[1]).reshape(-1)[1])
        if not (isinstance(val, Token) and val.axes == (Label(0), Label(1), width)):
            raise MatchFailure.refuse(f"Reshape {flat.name!r} flattens {val} in the cone accounting, not one "
                                      f"[{width}] row per token (batch, seq)", flat)
        out[id(flat.outputs[0])] = width
    return out


def _stage_two(end: ir.Value, pos: ir.Value, flat: dict[int, int], opset: int) -> int:
    """Prove ``end`` one ``[half]`` row per flattened token; the half width."""
    tokens = ir.Value(name="tokens", shape=ir.Shape(["tokens"]), type=pos.type)
    cone = _MRopeCone(tokens, opset)
    cone.vals[id(pos)] = UNKNOWN_VARYING  # the positions are read only through a flatten point
    for key, width in flat.items():
        cone.vals[key] = Token((Label(0), width))
    val = cone.value(end)
    if not (isinstance(val, Token) and len(val.axes) == 2 and val.axes[0] == Label(0)
            and isinstance(val.axes[1], int)):
        producer = end.producer()
        raise MatchFailure.refuse(f"{end.name!r} is {val} in the cone accounting, not one [half] row per token "
                                  "b*S + s", (producer.name if producer is not None else end.name) or "<model>")
    return int(val.axes[1])


# ------------------------------------------------------------------------------------------------------------
# Numbers: the table, and the evidence over several calls
# ------------------------------------------------------------------------------------------------------------
def probes(rows: int) -> list[tuple[str, np.ndarray]]:
    """``[B, S]`` positions of calls differing in length, batch, past and minimum."""
    last = rows - 1
    rng = np.random.RandomState(0)
    win = np.arange(max(0, rows - 8), rows)
    return [
        ("one token at position 0", np.array([[0]])),
        (f"one token at position {last}", np.array([[last]])),
        (f"one token at position {rows // 2}", np.array([[rows // 2]])),
        ("three tokens after a past of 5", np.clip(np.array([[5, 6, 7]]), 0, last)),
        ("batch 2, three tokens each at different offsets", np.clip(np.array([[0, 1, 2], [9, 10, 11]]), 0, last)),
        ("batch 2, one token each", np.array([[last], [min(3, last)]])),
        (f"a window ending at {last}", win[None, :]),
        ("random positions, batch 2", rng.randint(0, rows, size=(2, 64))),
    ]


def evaluate_tables(cone: ManualCone, run: Run, fast: Run | None = None) -> TextTables:
    """The ``[rows, half]`` float32 tables of ``cone`` (``run``: its extracted subgraph on onnxruntime), checked on
    :func:`probes`; MatchFailure naming the rotation otherwise.

    ``fast`` (:class:`rope_passes.runtime.rows.RowEvaluator`: the same nodes, NumPy moving the data and onnxruntime
    computing each number on the elements that reach the output) builds the table when given; the probe calls
    still run on ``run`` (the whole cone, as the graph says) and must give the table's rows bit for bit, else (or
    when ``fast`` cannot run the cone) the table is built on ``run`` as well and the probes judge that one."""
    pos = cone.positions.graph_input
    dtype = np.int64 if pos.dtype == ir.DataType.INT64 else np.int32
    three = len(pos.shape) == 3

    def call(p: np.ndarray, runner: Run = run) -> tuple[np.ndarray, np.ndarray]:
        feed = np.stack([p, p, p]) if three else p
        try:
            cos, sin = runner([feed.astype(dtype)])
        except Exception as exc:  # noqa: BLE001 - onnxruntime failures become a reason
            if runner is not run:
                raise _FastFailed from None
            raise MatchFailure.absent(f"{cone.rotation.name!r}: cannot evaluate the cos/sin subgraph "
                                      f"({type(exc).__name__})") from None
        if cos.shape != (p.size, cone.half) or sin.shape != cos.shape:
            if runner is not run:
                raise _FastFailed
            raise MatchFailure.absent(f"{cone.rotation.name!r}: cos/sin subgraph gives shape {list(cos.shape)} for "
                                      f"{p.size} tokens, not [tokens, {cone.half}]")
        return cos, sin

    def table(runner: Run) -> tuple[np.ndarray, np.ndarray]:
        cos = np.empty((cone.rows, cone.half), np.float32)
        sin = np.empty((cone.rows, cone.half), np.float32)
        for lo in range(0, cone.rows, CHUNK):
            hi = min(lo + CHUNK, cone.rows)
            cos[lo:hi], sin[lo:hi] = call(np.arange(lo, hi)[None, :], runner)
        return cos, sin

    def mismatch(cos: np.ndarray, sin: np.ndarray) -> str | None:
        for label, p in probes(cone.rows):
            got_cos, got_sin = call(p)
            flat = p.reshape(-1)
            if not (np.array_equal(got_cos.astype(np.float32), cos[flat])
                    and np.array_equal(got_sin.astype(np.float32), sin[flat])):
                return label
        return None

    if fast is not None:
        try:
            cos, sin = table(fast)
        except _FastFailed:
            pass
        else:
            if mismatch(cos, sin) is None:
                return TextTables(cos, sin, f"evaluated from the graph's cos/sin subgraph ({cone.rows} positions)",
                                  cone.positions)
    cos, sin = table(run)
    label = mismatch(cos, sin)
    if label is not None:
        raise MatchFailure.refuse(f"{cone.rotation.name!r}: with {label} the cos/sin rows are not the table's "
                                  "rows at those positions: a row depends on more than its own position",
                                  cone.rotation)
    source = f"evaluated from the graph's cos/sin subgraph ({cone.rows} positions)"
    return TextTables(cos, sin, source, cone.positions)


class _FastFailed(Exception):
    """The fast evaluator could not build the table: build it on the whole cone instead."""


__all__ = ["CHUNK", "ConeKeys", "ManualCone", "evaluate_tables", "manual_cone", "probes"]
