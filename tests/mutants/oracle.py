"""References the mutation suite compares rewritten models against, written here independently of the passes.

* :func:`lower_mrotary`: ``com.microsoft::MRotaryEmbedding`` (which onnxruntime 1.27 cannot load) replaced by its
  definition in standard ONNX ops (per-column axis choice by a one-hot mask, then rotate-half or interleaved pairs);
  ``tests/test_mutants.py`` checks it against the NumPy mRoPE oracle.
* :class:`Runner`: a CPU session, optionally emulating WebGPU's ``multiRotaryCacheConcatOffset`` (GroupQueryAttention
  with packed QKV reads cos/sin row ``(total > offset ? offset : 0) + position``, docs/webgpu-on-cpu.md trap 6) by
  running a second session whose GQA caches start at row ``offset``. ``total`` is each row's own ``seqlens_k + 1``,
  as the kernel computes it (onnxruntime ``split_packed_qkv_with_rotary_embedding.wgsl.template``: ``total_seqlen =
  seqlens[b] + 1``), read from the graph's own ``seqlens_k`` value, not the mask's width: a graph whose seqlens_k is
  not the row sums - 1 is judged as WebGPU runs it.
* :func:`call_feeds` / :func:`compare`: one call per (past length, call length, batch), random past KV, the same
  feeds for both models (a rewrite may drop an input), every common output compared.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

MS = "com.microsoft"


# ------------------------------------------------------------------------------------------------------------
# Models in memory
# ------------------------------------------------------------------------------------------------------------
def load_in_memory(path: Path) -> ir.Model:
    """The model with every external tensor read into memory (so it can be serialized to bytes)."""
    model = ir.load(path)
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if isinstance(tensor, ir.ExternalTensor):
                value.const_value = ir.tensor(np.array(tensor.numpy()), name=value.name)
    return model


def to_bytes(model: ir.Model) -> bytes:
    model.ir_version = min(model.ir_version or 10, 10)
    return ir.serde.serialize_model(model).SerializeToString()


def session(model: bytes | Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])


# ------------------------------------------------------------------------------------------------------------
# MRotaryEmbedding in standard ops
# ------------------------------------------------------------------------------------------------------------
def axis_of_columns(sections: Sequence[int], layout: int, half: int) -> np.ndarray:
    """onnxruntime's ComputeDimAssignments: the position axis (0 t, 1 h, 2 w) of each cos/sin column."""
    out = np.zeros(half, dtype=np.int64)
    if layout == 0:
        out[:] = np.repeat([0, 1, 2], sections)[:half]
    elif layout == 1:
        for axis in (1, 2):
            out[axis:min(int(sections[axis]) * 3, half):3] = axis
    else:
        raise ValueError(f"mrope_layout {layout}")
    return out


class _Ops:
    def __init__(self, graph: ir.Graph, prefix: str):
        self.graph, self.prefix, self.nodes, self.k = graph, prefix, [], 0

    def const(self, array) -> ir.Value:
        self.k += 1
        arr = np.asarray(array)
        name = f"{self.prefix}/c{self.k}"
        value = ir.Value(name=name, shape=ir.Shape(arr.shape), type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)),
                         const_value=ir.tensor(arr, name=name))
        self.graph.register_initializer(value)
        return value

    def __call__(self, op: str, *inputs, **attrs) -> ir.Value:
        self.k += 1
        node = ir.node(op, list(inputs), attributes=attrs or None, name=f"{self.prefix}/{op}{self.k}")
        node.outputs[0].name = f"{node.name}/out"
        self.nodes.append(node)
        return node.outputs[0]


def lower_mrotary(model: ir.Model) -> int:
    """Replace every MRotaryEmbedding(x [B,S,H*D], positions [3,B,S], cos [P,half], sin) in place; returns how many."""
    graph = model.graph
    nodes = [n for n in graph if n.op_type == "MRotaryEmbedding" and n.domain == MS]
    for n, node in enumerate(nodes):
        _lower_one(graph, node, _Ops(graph, f"/oracle/mrotary{n}"))
    return len(nodes)


def _lower_one(graph: ir.Graph, node: ir.Node, op: _Ops) -> None:
    x, pos, cos_cache, sin_cache = node.inputs[:4]
    attrs = {k: a.value for k, a in node.attributes.items()}
    heads = int(attrs["num_heads"])
    cos_arr = cos_cache.const_value.numpy()
    half = cos_arr.shape[1]
    head = x.shape[2] // heads
    rot = int(attrs.get("rotary_embedding_dim", 0) or 0) or head
    if rot != 2 * half:
        raise ValueError(f"{node.name}: rotary_dim {rot} but the cache has {half} columns")
    scale = float(attrs.get("scale", 1.0) or 1.0)
    axis = axis_of_columns(list(attrs["mrope_section"]), int(attrs.get("mrope_layout", 0)), half)
    mask = op.const((np.arange(3)[:, None] == axis[None, :]).astype(cos_arr.dtype).reshape(3, 1, 1, half))

    def ints(*values: int) -> ir.Value:
        return op.const(np.array(values, np.int64))

    def per_token(cache: ir.Value) -> ir.Value:
        rows = op("Gather", cache, pos, axis=0)  # [3, B, S, half]
        picked = op("ReduceSum", op("Mul", rows, mask), ints(0), keepdims=0)  # each column from its own axis
        if scale != 1.0:
            picked = op("Mul", picked, op.const(np.array(scale, cos_arr.dtype)))
        return op("Unsqueeze", picked, ints(2))  # [B, S, 1, half]

    c, s = per_token(cos_cache), per_token(sin_cache)
    xh = op("Reshape", x, ints(0, 0, heads, head))

    def part(start: int, end: int) -> ir.Value:
        return op("Slice", xh, ints(start), ints(end), ints(3))

    if int(attrs.get("interleaved", 0)):
        pairs = op("Reshape", part(0, rot), ints(0, 0, heads, half, 2))
        x1 = op("Gather", pairs, op.const(np.array(0, np.int64)), axis=4)
        x2 = op("Gather", pairs, op.const(np.array(1, np.int64)), axis=4)
        o1 = op("Sub", op("Mul", x1, c), op("Mul", x2, s))
        o2 = op("Add", op("Mul", x2, c), op("Mul", x1, s))
        both = op("Concat", op("Unsqueeze", o1, ints(4)), op("Unsqueeze", o2, ints(4)), axis=4)
        rotated = [op("Reshape", both, ints(0, 0, heads, rot))]
    else:
        x1, x2 = part(0, half), part(half, rot)
        rotated = [op("Sub", op("Mul", x1, c), op("Mul", x2, s)), op("Add", op("Mul", x2, c), op("Mul", x1, s))]
    if rot < head:
        rotated.append(part(rot, head))
    out = op("Reshape", op("Concat", *rotated, axis=3), ints(0, 0, heads * head))
    graph.insert_before(node, op.nodes)
    node.outputs[0].replace_all_uses_with(out, replace_graph_outputs=True)
    graph.remove(node, safe=True)


# ------------------------------------------------------------------------------------------------------------
# Sessions, with multiRotaryCacheConcatOffset emulated
# ------------------------------------------------------------------------------------------------------------
def _packed_gqa_caches(model: ir.Model) -> list[ir.Node]:
    """Every packed-QKV GroupQueryAttention with a cos cache, in every graph (an If body's too: WebGPU applies the
    session's offset to those as well), main-graph ones first."""
    return [n for n in ir.traversal.RecursiveGraphIterator(model.graph) if n.op_type == "GroupQueryAttention"
            and len(n.inputs) > 8 and n.inputs[7] is not None
            and (len(n.inputs) < 2 or n.inputs[1] is None or not n.inputs[1].name)]


#: the graph output the emulation adds: the seqlens_k the first packed-QKV GroupQueryAttention reads
_SEQLENS = "oracle/emulated_offset/seqlens_k"


class Runner:
    """A model on onnxruntime CPU; ``offset`` > 0 emulates WebGPU's concatenated-cache offset (packed-QKV GQA only),
    row by row on ``seqlens_k[b] + 1``."""

    def __init__(self, model: Path | ir.Model, offset: int = 0):
        self.offset = offset
        base = model if isinstance(model, ir.Model) else load_in_memory(model)
        gqas = _packed_gqa_caches(base)
        if offset and gqas:  # the kernel's per-row total, read off the graph (an Identity: a graph output of its own)
            seqlens = next((g for g in gqas if g.graph is base.graph), gqas[0]).inputs[5]
            exposed = ir.node("Identity", [seqlens], outputs=[ir.Value(name=_SEQLENS)])
            base.graph.append(exposed)
            exposed.outputs[0].dtype, exposed.outputs[0].shape = seqlens.dtype, seqlens.shape
            base.graph.outputs.append(exposed.outputs[0])
        self.session = session(to_bytes(base))
        self.shifted = None
        if offset and gqas:  # the caches read from row ``offset`` on: a Slice of whatever computes them
            bounds = [ir.val(f"oracle/emulated_offset/{k}", const_value=ir.tensor(np.array([v], np.int64), name=
                      f"oracle/emulated_offset/{k}")) for k, v in (("starts", offset), ("ends", 1 << 62), ("axes", 0))]
            for b in bounds:
                base.graph.register_initializer(b)
            sliced: dict[int, ir.Value] = {}
            for gqa in gqas:
                for index in (7, 8):
                    value = gqa.inputs[index]
                    if id(value) not in sliced:  # in the main graph, where the table is known
                        node = ir.node("Slice", [value, *bounds], outputs=[ir.Value(
                            name=f"{value.name}/emulated_offset")])
                        producer = value.producer()
                        if producer is not None and producer.graph is base.graph:
                            base.graph.insert_after(producer, node)
                        else:
                            base.graph.insert_before(next(iter(base.graph)), node)
                        node.outputs[0].dtype = value.dtype
                        sliced[id(value)] = node.outputs[0]
                    gqa.replace_input_with(index, sliced[id(value)])
            self.shifted = session(to_bytes(base))

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.session.get_inputs()]

    @staticmethod
    def _run(sess: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [o.name for o in sess.get_outputs()]
        mine = {i.name for i in sess.get_inputs()}
        return dict(zip(names, sess.run(names, {k: v for k, v in feeds.items() if k in mine})))

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = self._run(self.session, feeds)
        if self.shifted is None:
            return out
        late = out.pop(_SEQLENS).reshape(-1).astype(np.int64) + 1 > self.offset  # per row, as the kernel decides
        if not late.any():
            return out
        shifted = self._run(self.shifted, feeds)
        shifted.pop(_SEQLENS)
        if late.all():
            return shifted
        return {name: np.where(late.reshape((-1,) + (1,) * (value.ndim - 1)), shifted[name], value)
                if value.ndim and value.shape[0] == late.size else value for name, value in out.items()}


# ------------------------------------------------------------------------------------------------------------
# Calls
# ------------------------------------------------------------------------------------------------------------
def call_feeds(sessions: Sequence[ort.InferenceSession], head_size: int | None, call: tuple[int, int, int],
               seed: int = 0) -> dict[str, np.ndarray]:
    """Feeds for every input any of ``sessions`` declares: ``batch`` rows of ``seq`` new tokens after ``past``
    cached ones (random past KV, mask of ones, positions past..past+seq-1 on every axis)."""
    try:
        from rope_passes.check.decode import DecoderSpec, step_feeds
    except ImportError:  # pragma: no cover - moved
        from rope_passes.runtime.decode import DecoderSpec, step_feeds  # type: ignore[no-redef]

    past, seq, batch = call
    tokens = np.random.RandomState(seed).randint(4, 250, size=(batch, seq)).astype(np.int64)
    feeds: dict[str, np.ndarray] = {}
    for sess in sessions:
        spec = DecoderSpec.from_session(sess)
        spec.head_size = head_size
        cache = None
        if past:
            cache = {}
            for name in spec.past_names:
                i = spec.input(name)
                kv = i.shape[1]
                head = i.shape[3] if isinstance(i.shape[3], int) else head_size
                rng = np.random.RandomState(zlib.crc32(f"{name}/{past}/{batch}".encode()) & 0x7FFFFFFF)
                cache[name] = (rng.standard_normal((batch, kv, past, head)) * 0.5).astype(i.dtype)
        for name, value in step_feeds(spec, tokens, past, cache).items():
            feeds.setdefault(name, value)
    return feeds


@dataclasses.dataclass
class Comparison:
    ok: bool
    worst: float  # largest |a - b| over the compared outputs and calls
    detail: str
    calls_run: int


def compare(reference: Runner, candidate: Runner, calls: Sequence[tuple[int, int, int]], *, head_size: int | None,
            atol: float, rtol: float) -> Comparison:
    """Run both on every call; a call the reference itself cannot run is skipped (no contract there)."""
    worst, run, skipped, first_bad = 0.0, 0, [], None
    for call in calls:
        feeds = call_feeds([reference.session, candidate.session], head_size, call)
        try:
            ref = reference.run(feeds)
        except Exception as exc:  # noqa: BLE001 - the mutant may not run for some calls: no contract there
            skipped.append(f"{call}: {type(exc).__name__}")
            continue
        run += 1
        try:
            got = candidate.run(feeds)
        except Exception as exc:  # noqa: BLE001
            return Comparison(False, float("inf"), f"call {call}: the output fails where the mutant runs "
                              f"({str(exc).splitlines()[0][:160]})", run)
        bad = []
        for name in sorted(set(ref) & set(got)):
            a, b = ref[name].astype(np.float64), got[name].astype(np.float64)
            if a.shape != b.shape:
                return Comparison(False, float("inf"), f"call {call}: {name} shape {b.shape} != {a.shape}", run)
            diff = float(np.max(np.abs(a - b))) if a.size else 0.0
            worst = max(worst, diff)
            if not np.allclose(b, a, atol=atol, rtol=rtol):
                bad.append((diff, name))
        if bad and first_bad is None:
            diff, name = max(bad)
            first_bad = (f"call (past, seq, batch) = {call}: {len(bad)} of {len(set(ref) & set(got))} outputs "
                         f"differ, {name} by {diff:.3g}")
    if run == 0:
        return Comparison(True, 0.0, f"the mutant runs on none of the calls ({'; '.join(skipped)})", 0)
    note = f" ({len(skipped)} calls the mutant cannot run skipped)" if skipped else ""
    if first_bad is not None:
        return Comparison(False, worst, first_bad + note, run)
    return Comparison(True, worst, f"equal on {run} calls, worst |diff| {worst:.2g}{note}", run)
