"""Small mRoPE graphs built in code, and a minimal decoder driver, for the mRoPE pass tests.

Graphs: one attention block ``x → q/k/v MatMul → rotation → GroupQueryAttention(do_rotary=0) → output`` with the
rotation written as

* ``MRotaryEmbedding`` (builder 0.18 form) with any sections / layout / partial rotary / pairing, fp32 or fp16
  (fp16 as the builder writes it: Cast to fp32 around the op), packed or unpacked QKV; with ``qk_norm`` the
  builder 0.18 Qwen3-VL form: ``Reshape [0, -1, head]`` → (fp16: Cast to fp32) → per-head norm (a Mul here) →
  ``Reshape [0, -1, heads*head]`` → MRotaryEmbedding in fp32 → (fp16: Cast to fp16) → GQA;
* the builder 0.15.2 manual form: per-token cos/sin gathered per axis from a cache, combined per column with
  ``Where`` masks, fed to ``RotaryEmbedding`` with the token index ``Range(0, B*S)`` as positions; its 3D
  positions either a graph input or a 2D input tiled in-graph (text only).

:func:`mrotary_graph` is a lone MRotaryEmbedding (``x, position_ids → y``) for lowering tests; :func:`run_attention`
drives an attention graph through a prefill and decode steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.mrope import axis_of_columns

MS = "com.microsoft"


def rope_tables(max_pos: int, half: int, theta: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    inv_freq = 1.0 / theta ** (np.arange(half, dtype=np.float64) * 2 / (2 * half))
    angles = np.arange(max_pos, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _init(graph_inits: list[ir.Value], name: str, array: np.ndarray) -> ir.Value:
    v = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype)))
    v.const_value = ir.tensor(array, name=name)
    graph_inits.append(v)
    return v


class _Builder:
    def __init__(self):
        self.nodes: list[ir.Node] = []
        self.inits: list[ir.Value] = []
        self.n = 0

    def op(self, op_type, inputs, attrs=None, domain="", num_outputs=1, dtype=None):
        self.n += 1
        node = ir.node(op_type, inputs, attrs or {}, domain=domain, num_outputs=num_outputs, name=f"{op_type}_{self.n}")
        if dtype is None:  # enough type inference for these graphs (the passes read dtypes, as builder graphs have)
            if op_type == "Cast":
                dtype = ir.DataType(attrs["to"])
            elif op_type == "Shape":
                dtype = ir.DataType.INT64
            elif op_type == "Where":
                dtype = inputs[1].dtype
            elif inputs and inputs[0] is not None:
                dtype = inputs[0].dtype
        for i, out in enumerate(node.outputs):
            out.name = f"{op_type}_{self.n}_out{i}"
            if dtype is not None:
                out.dtype = dtype
        self.nodes.append(node)
        return node.outputs[0] if num_outputs == 1 else node.outputs

    def const(self, name, array):
        return _init(self.inits, name, np.asarray(array))


def attention_graph(
    *,
    form: str = "mrotary",  # "mrotary" | "manual"
    sections: Sequence[int] = (16, 24, 24),
    layout: int = 0,
    head: int = 128,
    rotary_dim: int | None = None,
    heads: int = 2,
    kv_heads: int = 1,
    interleaved: bool = False,
    dtype: str = "float32",
    packed: bool = False,
    positions: str = "3d",  # "3d" graph input [3,B,S] | "tiled" 2D input tiled in-graph
    max_pos: int = 64,
    seed: int = 0,
    qk_norm: bool = False,
) -> ir.Model:
    """One decoder attention block with mRoPE before GroupQueryAttention(do_rotary=0)."""
    rng = np.random.RandomState(seed)
    half = sum(sections)
    rot = rotary_dim or head
    assert 2 * half == rot
    hidden = 64
    np_dt = np.float16 if dtype == "float16" else np.float32
    ir_dt = ir.DataType.FLOAT16 if dtype == "float16" else ir.DataType.FLOAT
    b = _Builder()
    x = ir.Value(name="x", shape=ir.Shape(["batch", "seq", hidden]), type=ir.TensorType(ir_dt))
    mask = ir.Value(name="attention_mask", shape=ir.Shape(["batch", "total"]), type=ir.TensorType(ir.DataType.INT64))
    past_k = ir.Value(name="past_key", shape=ir.Shape(["batch", kv_heads, "past", head]), type=ir.TensorType(ir_dt))
    past_v = ir.Value(name="past_value", shape=ir.Shape(["batch", kv_heads, "past", head]), type=ir.TensorType(ir_dt))
    if positions == "3d":
        pos_in = ir.Value(name="position_ids", shape=ir.Shape([3, "batch", "seq"]), type=ir.TensorType(ir.DataType.INT64))
        pos3 = pos_in
    else:
        pos_in = ir.Value(name="position_ids", shape=ir.Shape(["batch", "seq"]), type=ir.TensorType(ir.DataType.INT64))
        unsq = b.op("Unsqueeze", [pos_in, b.const("axes0", np.array([0], np.int64))])
        pos3 = b.op("Tile", [unsq, b.const("reps", np.array([3, 1, 1], np.int64))])

    wq = b.const("wq", (rng.randn(hidden, heads * head) * 0.2).astype(np_dt))
    wk = b.const("wk", (rng.randn(hidden, kv_heads * head) * 0.2).astype(np_dt))
    wv = b.const("wv", (rng.randn(hidden, kv_heads * head) * 0.2).astype(np_dt))
    q, k, v = b.op("MatMul", [x, wq]), b.op("MatMul", [x, wk]), b.op("MatMul", [x, wv])
    for t, n in ((q, heads), (k, kv_heads), (v, kv_heads)):
        t.shape = ir.Shape(["batch", "seq", n * head])
    cos, sin = rope_tables(max_pos, half)
    cos_c, sin_c = b.const("cos_cache", cos), b.const("sin_cache", sin)

    if form == "mrotary":

        def rotate(t, n):
            if qk_norm:  # Qwen3-VL: per-head norm in fp32 between two reshapes, rotation in fp32, Cast after
                t = b.op("Reshape", [t, b.const(f"to_heads_{b.n}", np.array([0, -1, head], np.int64))])
            if dtype == "float16":
                t = b.op("Cast", [t], {"to": ir.DataType.FLOAT})
            if qk_norm:
                weight = (1.0 + 0.1 * rng.randn(head)).astype(np.float32)
                t = b.op("Mul", [t, b.const(f"norm_w_{b.n}", weight)])
                t = b.op("Reshape", [t, b.const(f"to_hidden_{b.n}", np.array([0, -1, n * head], np.int64))])
            attrs = {
                "interleaved": int(interleaved),
                "rotary_embedding_dim": 0 if rotary_dim is None else rot,
                "num_heads": n,
                "mrope_section": list(sections),
                "mrope_layout": layout,
            }
            out = b.op("MRotaryEmbedding", [t, pos3, cos_c, sin_c], attrs, domain=MS)
            if dtype == "float16":
                out = b.op("Cast", [out], {"to": ir.DataType.FLOAT16})
            return out

    else:  # manual: per-axis Gather + Where masks → flat per-token tables → RotaryEmbedding with token index
        axis = axis_of_columns(sections, layout, half)
        h_mask, w_mask = b.const("h_mask", axis == 1), b.const("w_mask", axis == 2)

        def table(cache):
            per_axis = []
            for a in range(3):
                p = b.op("Gather", [pos3, b.const(f"ax{a}_{b.n}", np.array(a, np.int64))], {"axis": 0})
                per_axis.append(b.op("Gather", [cache, p], {"axis": 0}))
            t = b.op("Where", [w_mask, per_axis[2], per_axis[0]])
            t = b.op("Where", [h_mask, per_axis[1], t])
            return b.op("Reshape", [t, b.const(f"flat_{b.n}", np.array([-1, half], np.int64))])

        cos_flat, sin_flat = table(cos_c), table(sin_c)
        shape = b.op("Shape", [x])
        bs = b.op("Slice", [shape, b.const("s0", np.array([0], np.int64)), b.const("s2", np.array([2], np.int64))])
        total = b.op("ReduceProd", [bs], {"keepdims": 0})
        rng_ = b.op("Range", [b.const("zero", np.array(0, np.int64)), total, b.const("one", np.array(1, np.int64))])
        token_index = b.op("Reshape", [rng_, bs])

        def rotate(t, n):
            t4 = b.op("Reshape", [t, b.const(f"to4_{b.n}", np.array([0, 0, n, head], np.int64))])
            t4 = b.op("Transpose", [t4], {"perm": [0, 2, 1, 3]})
            if dtype == "float16":
                t4 = b.op("Cast", [t4], {"to": ir.DataType.FLOAT})
            attrs = {"interleaved": int(interleaved), "num_heads": n, "rotary_embedding_dim": rot}
            out = b.op("RotaryEmbedding", [t4, token_index, cos_flat, sin_flat], attrs, domain=MS)
            if dtype == "float16":
                out = b.op("Cast", [out], {"to": ir.DataType.FLOAT16})
            out = b.op("Transpose", [out], {"perm": [0, 2, 1, 3]})
            return b.op("Reshape", [out, b.const(f"to3_{b.n}", np.array([0, 0, n * head], np.int64))])

    q_rot, k_rot = rotate(q, heads), rotate(k, kv_heads)
    one = b.const("one_i64", np.array([1], np.int64))
    seqlens = b.op("Cast", [b.op("Sub", [b.op("ReduceSum", [mask, one], {"keepdims": 0}), one])], {"to": ir.DataType.INT32})
    total_len = b.op(
        "Cast", [b.op("Gather", [b.op("Shape", [mask]), b.const("idx1", np.array(1, np.int64))], {"axis": 0})], {"to": ir.DataType.INT32}
    )
    gqa_attrs = {"num_heads": heads, "kv_num_heads": kv_heads, "do_rotary": 0, "rotary_interleaved": 0}
    if packed:
        qkv = b.op("Concat", [q_rot, k_rot, v], {"axis": -1})
        qkv_inputs = [qkv, None, None]
    else:
        qkv_inputs = [q_rot, k_rot, v]
    out, present_k, present_v = b.op(
        "GroupQueryAttention", [*qkv_inputs, past_k, past_v, seqlens, total_len], gqa_attrs, domain=MS, num_outputs=3
    )
    out.name, present_k.name, present_v.name = "output", "present_key", "present_value"
    for o in (out, present_k, present_v):
        o.dtype = ir_dt
    out.shape = ir.Shape(["batch", "seq", heads * head])
    graph = ir.Graph(
        inputs=[x, mask, pos_in, past_k, past_v],
        outputs=[out, present_k, present_v],
        nodes=b.nodes,
        initializers=b.inits,
        opset_imports={"": 21, MS: 1},
        name="mrope_attention",
    )
    return ir.Model(graph, ir_version=10)


def mrotary_graph(
    *,
    sections: Sequence[int],
    layout: int,
    head: int,
    heads: int = 2,
    rotary_dim: int | None = None,
    interleaved: bool = False,
    scale: float | None = None,
    max_pos: int = 64,
    rank4: bool = False,
    dtype: str = "float32",
) -> tuple[ir.Model, np.ndarray, np.ndarray]:
    """``y = MRotaryEmbedding(x, position_ids, cos, sin)``; returns (model, cos, sin)."""
    half = sum(sections)
    np_dt = np.float16 if dtype == "float16" else np.float32
    ir_dt = ir.DataType.FLOAT16 if dtype == "float16" else ir.DataType.FLOAT
    b = _Builder()
    shape = ["batch", heads, "seq", head] if rank4 else ["batch", "seq", heads * head]
    x = ir.Value(name="x", shape=ir.Shape(shape), type=ir.TensorType(ir_dt))
    pos = ir.Value(name="position_ids", shape=ir.Shape([3, "batch", "seq"]), type=ir.TensorType(ir.DataType.INT64))
    cos, sin = rope_tables(max_pos, half)
    cos, sin = cos.astype(np_dt), sin.astype(np_dt)
    attrs = {"interleaved": int(interleaved), "num_heads": heads, "mrope_section": list(sections), "mrope_layout": layout}
    if rotary_dim:
        attrs["rotary_embedding_dim"] = rotary_dim
    if scale is not None:
        attrs["scale"] = float(scale)
    y = b.op("MRotaryEmbedding", [x, pos, b.const("cos_cache", cos), b.const("sin_cache", sin)], attrs, domain=MS)
    y.name, y.dtype, y.shape = "y", ir_dt, ir.Shape(shape)
    graph = ir.Graph(inputs=[x, pos], outputs=[y], nodes=b.nodes, initializers=b.inits,
                     opset_imports={"": 21, MS: 1}, name="mrotary")
    return ir.Model(graph, ir_version=10), cos, sin


def run_attention(model_bytes: bytes, ep: str, *, positions: str, steps: int = 3, seed: int = 3, batch: int = 1,
                  present: bool = False) -> list:
    """Prefill 5 tokens then ``steps`` single-token steps; the output of every call (``present``: with the call's
    ``present_key``, as ``(output, present_key)`` pairs)."""
    from rope_passes.runtime.sessions import create_session

    sess = create_session(model_bytes, ep)
    ins = {i.name: i for i in sess.get_inputs()}
    dt = np.float16 if ins["x"].type == "tensor(float16)" else np.float32
    kv_heads, head = ins["past_key"].shape[1], ins["past_key"].shape[3]
    rng = np.random.RandomState(seed)
    past = {"past_key": np.zeros((batch, kv_heads, 0, head), dt), "past_value": np.zeros((batch, kv_heads, 0, head), dt)}
    outs, done = [], 0
    for s in [5] + [1] * steps:
        feeds = dict(past, x=rng.randn(batch, s, 64).astype(dt), attention_mask=np.ones((batch, done + s), np.int64))
        if "position_ids" in ins:
            pos = np.tile(np.arange(done, done + s, dtype=np.int64), (batch, 1))
            feeds["position_ids"] = np.tile(pos[None], (3, 1, 1)) if positions == "3d" else pos
        out, pk, pv = sess.run(None, feeds)
        outs.append((out.astype(np.float32), pk) if present else out.astype(np.float32))
        past, done = {"past_key": pk, "past_value": pv}, done + s
    return outs
