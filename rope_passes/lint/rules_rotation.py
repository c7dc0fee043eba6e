"""Per-layer rotation conformance (RP405 error, RP406 note): the rotation each attention layer applies, probed.

RP401-RP404 compare cos/sin *tables* (chains, caches) with config.json; they cannot see a layer whose rotation itself
is wrong: ``rotate_half`` reversed (a rotation by -angle), two layers reading each other's chain (Gemma 3 sliding
and full), a layer's private chain, or query and key gathered at different positions. This module probes the rotation
numerically:

* **Sites.** The torch exporters' form ``Add(Mul(x, cos'), Mul(rotate_half(x), sin'))`` (``cos'``/``sin'`` computed
  from a ``Cos``/``Sin`` node, ``rotate_half(x)`` made of Slice/Neg/Concat of ``x``; partial rotary: ``x`` a Slice of
  the head and the result concatenated with the head's other Slice), and RotaryEmbedding nodes (ONNX and
  com.microsoft: mobius). The site is the rotated value; the layer and whether it is the query or the key come from
  the attention node it reaches (MatMul or a fused attention op; input 0: query, 1: key), the ``present.N`` /
  ``key_values.layers.N`` output the key reaches or a ``layers.N`` name (else the order of the attention nodes).
* **Probe.** The subgraph from ``x`` and ``position_ids`` (and inputs read for their shape only) to the rotated values
  is extracted and run on onnxruntime CPU (sites grouped into few sessions), with ``x`` replaced by the head's basis
  vectors spread over heads and batch rows, at a handful of positions (0, 1, 2, 7, 100, max - 1): column ``b`` of
  the result is column ``b`` of the layer's ``head_dim x head_dim`` rotation matrix ``R(p)``. LongRoPE: a second call
  with the positions below ``original_max_position_embeddings`` alone (the short factors).
* **Expected.** ``HFConfig.layer_rope(layer)`` (the layer's type for Gemma 3) gives the angles
  (:meth:`rope_passes.hf_config.Rope.angles`), the attention scaling and the pair layout.

A site whose matrix is not block-diagonal on the config's pairs (nor on the other layout's), or a graph whose structure
is not understood (positions made in the graph, other graph inputs read for their values, shapes that do not
broadcast, a dynamic rope), is skipped silently. Query and key shifted by the same constant number of positions
compute the same attention (RoPE is relative): a note (RP406), not an error.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator

import numpy as np
import onnx_ir as ir

from rope_passes.errors import ModelLoadError
from rope_passes.hf_config import INV_FREQ_ULPS, VALUE_ULPS, HFConfig, Rope
from rope_passes.lint.core import LintContext, Severity, rule
from rope_passes.report import MatchFailure

_PRESENT = re.compile(r"(?:present|key_values)[._](?:key_values[._]|layers[._])?(\d+)[._]")
#: ops between a Cos/Sin node and the Mul of the rotation
_TRIG_PATH = {"Unsqueeze", "Squeeze", "Cast", "Mul", "Gather", "Slice", "Expand", "Reshape", "Transpose", "Identity",
              "Concat", "Where", "GatherElements", "Tile", "Div"}
#: ops of rotate_half (and of an interleaved rotate_every_two)
_HALF_PATH = {"Slice", "Neg", "Concat", "Split", "Reshape", "Gather", "Mul", "Unsqueeze", "Squeeze", "Transpose",
              "Identity", "Stack", "Flatten", "Cast"}
_ATTENTION = {"GroupQueryAttention", "MultiHeadAttention", "Attention", "SparseAttention", "PagedAttention"}
_PROBE = (0, 1, 2, 7, 100)


@dataclasses.dataclass
class _Site:
    pre: ir.Value  # the head before the rotation
    out: ir.Value  # the rotated head
    node: ir.Node
    layer: int = -1
    role: str = ""  # q | k
    heads: int = 0  # RotaryEmbedding on [batch, seq, heads * head_dim]: its num_heads (0: [batch, heads, seq, head_dim])


def _trig_of(value: ir.Value | None, depth: int = 10) -> str | None:
    """``Cos`` / ``Sin`` where ``value`` is computed from one of them through shape/scaling ops only."""
    seen = 0
    stack = [(value, 0)]
    while stack:
        v, d = stack.pop()
        node = v.producer() if v is not None else None
        if node is None or d > depth or seen > 64:
            continue
        seen += 1
        if node.op_type in ("Cos", "Sin"):
            return node.op_type
        if node.op_type in _TRIG_PATH:
            stack += [(i, d + 1) for i in node.inputs if i is not None]
    return None


def _reaches(target: ir.Value, value: ir.Value | None, depth: int = 8) -> bool:
    """``value`` computed from ``target`` through rotate_half's ops."""
    stack = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if v is None or d > depth:
            continue
        if v is target:
            return True
        node = v.producer()
        if node is not None and node.op_type in _HALF_PATH:
            stack += [(i, d + 1) for i in node.inputs if i is not None]
    return False


def _rotation(add: ir.Node) -> tuple[ir.Value, ir.Value] | None:
    """(x, rotated) for ``Add(Mul(x, cos'), Mul(rotate_half(x), sin'))``."""
    if len(add.inputs) != 2 or any(i is None or i.producer() is None for i in add.inputs):
        return None
    muls = [p for i in add.inputs if i is not None and (p := i.producer()) is not None]
    if len(muls) != 2 or any(m.op_type != "Mul" or len(m.inputs) != 2 for m in muls):
        return None
    parts: dict[str, ir.Value] = {}
    for m in muls:
        kinds = [_trig_of(i) for i in m.inputs]
        if sum(k is not None for k in kinds) != 1:
            return None
        k = 0 if kinds[0] is not None else 1
        parts[kinds[k]] = m.inputs[1 - k]  # type: ignore[index,assignment]
    if set(parts) != {"Cos", "Sin"}:
        return None
    x, r = parts["Cos"], parts["Sin"]
    if x is r or not _reaches(x, r):
        return None
    return x, add.outputs[0]


def _widen(x: ir.Value, out: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Partial rotary: ``x = Slice(head)``, ``Concat(out, Slice(head))``: the whole head in and out."""
    node = x.producer()
    users = list(out.uses())
    if node is None or node.op_type != "Slice" or len(users) != 1:
        return x, out
    cat = users[0][0]
    if cat.op_type != "Concat" or len(cat.inputs) != 2 or cat.inputs[0] is not out:
        return x, out
    other = cat.inputs[1].producer() if cat.inputs[1] is not None else None
    if other is None or other.op_type != "Slice" or other.inputs[0] is not node.inputs[0]:
        return x, out
    return node.inputs[0], cat.outputs[0]  # type: ignore[return-value]


def _attention_of(value: ir.Value, depth: int = 30) -> tuple[ir.Node, int, int | None] | None:
    """The first attention MatMul (or fused attention op) the rotated value reaches: (node, input index, the N of a
    ``present.N`` output on the way)."""
    frontier, present, seen = [value], None, set()
    for _ in range(depth):
        nxt = []
        for v in frontier:
            if v.is_graph_output():
                found = _PRESENT.search(v.name or "")
                present = int(found.group(1)) if found and present is None else present
            for node, index in v.uses():
                if id(node) in seen:
                    continue
                seen.add(id(node))
                if node.op_type == "MatMul" or node.op_type in _ATTENTION:
                    return node, index, present
                if node.op_type in ("Softmax", "Gemm"):
                    continue
                nxt += list(node.outputs)
        frontier = nxt
        if not frontier:
            break
    return None


_LAYER = re.compile(r"(?:^|[./_])(?:layers|h|blocks?)[./_](\d+)(?:[./_]|$)")


def _sites(model: ir.Model) -> list[_Site]:
    found = []
    for node in model.graph:
        if node.op_type == "RotaryEmbedding" and node.domain in ("", "ai.onnx", "com.microsoft") and node.inputs and \
                node.inputs[0] is not None:
            rank = len(node.inputs[0].shape) if node.inputs[0].shape is not None else None
            heads = int(node.attributes["num_heads"].value) if "num_heads" in node.attributes else 0
            if rank == 3 and heads > 0:
                found.append(_Site(node.inputs[0], node.outputs[0], node, heads=heads))
            elif rank == 4:
                found.append(_Site(node.inputs[0], node.outputs[0], node))
            continue
        if node.op_type != "Add" or node.domain not in ("", "ai.onnx"):
            continue
        rot = _rotation(node)
        if rot is None:
            continue
        pre, out = _widen(*rot)
        found.append(_Site(pre, out, node))
    # layers: the attention node each reaches, in graph order; the present.N its key reaches names it
    order: dict[int, int] = {}
    named: dict[int, int] = {}
    kept = []
    for site in found:
        att = _attention_of(site.out)
        if att is None:
            continue
        node, index, present = att
        if node.op_type == "MatMul":
            if index not in (0, 1):
                continue
            site.role = "q" if index == 0 else "k"
        else:
            if index not in (0, 1):
                continue
            site.role = "q" if index == 0 else "k"
        order.setdefault(id(node), len(order))
        by_name = _LAYER.search(site.node.name or "") or _LAYER.search(node.name or "")
        if present is not None:
            named[id(node)] = present
        elif by_name:
            named[id(node)] = int(by_name.group(1))
        site.layer = id(node)
        kept.append(site)
    for site in kept:
        key = site.layer
        site.layer = named.get(key, order[key])
    return kept


def _position_input(model: ir.Model) -> ir.Value | None:
    for v in model.graph.inputs:
        if "position" in (v.name or "") and v.dtype in (ir.DataType.INT64, ir.DataType.INT32):
            return v
    return None


def _graph_inputs_needed(model: ir.Model, sites: list[_Site]) -> tuple[set[str], set[str], bool]:
    """The graph inputs the rotated values are computed from, besides the heads themselves: (read for their values,
    read for their shape only, a Range on the way: positions made in the graph)."""
    inputs = {id(v): v for v in model.graph.inputs}
    stop = {id(s.pre) for s in sites}
    values: set[str] = set()
    shapes: set[str] = set()
    ranged = False
    seen: set[int] = set()
    stack = [s.out for s in sites]
    while stack:
        v = stack.pop()
        if v is None or id(v) in seen or id(v) in stop:
            continue
        seen.add(id(v))
        node = v.producer()
        if node is None:
            continue
        ranged = ranged or node.op_type == "Range"
        for i in node.inputs:
            if i is not None and id(i) in inputs and id(i) not in stop:
                (shapes if node.op_type == "Shape" else values).add(i.name or "")
        if node.op_type != "Shape":
            stack += [i for i in node.inputs if i is not None]
    return values, shapes - values, ranged


def _shape_feed(value: ir.Value, positions: ir.Value, n: int, count: int) -> np.ndarray | None:
    """A zero tensor of ``value``'s declared shape read only by Shape: batch ``n``, the positions' dims ``count``,
    ``past`` dims 0."""
    if value.shape is None or value.dtype is None:
        return None
    names = [str(d) for d in positions.shape] if positions.shape is not None else []
    dims = []
    for k, d in enumerate(value.shape):
        if isinstance(d, int):
            dims.append(d)
        elif k == 0:
            dims.append(n)
        elif "past" in str(d):
            dims.append(0)
        elif str(d) in names[1:] or "seq" in str(d) or len(value.shape) == 2:
            dims.append(count)
        else:
            return None
    try:
        return np.zeros(dims, dtype=value.dtype.numpy())
    except Exception:  # noqa: BLE001
        return None


def _heads(site: _Site) -> int:
    """The site's static head count (1 where not declared)."""
    if site.heads:
        return site.heads
    shape = site.pre.shape
    return shape[1] if shape is not None and len(shape) == 4 and isinstance(shape[1], int) and shape[1] > 0 else 1


#: the most head elements one probe session is fed (the sites of a graph are probed in groups below it)
_PROBE_ELEMENTS = 1 << 23


def _probe(model: ir.Model, sites: list[_Site], positions: ir.Value, probe: list[int],
           head_dim: int, extra: list[ir.Value]) -> dict[int, np.ndarray] | None:
    """Per site (by index): ``[P, D, D]`` rotation matrices ``R(p)`` (``R[p][row, col]``); None where the graph
    cannot be probed. The ``head_dim`` basis vectors are spread over the heads (head ``h`` of batch row ``r`` holds
    basis vector ``r * heads + h``), so a site costs ``head_dim² × positions`` elements whatever its head count;
    sites with the same number of batch rows share a session, up to :data:`_PROBE_ELEMENTS`."""
    n = head_dim
    groups: dict[int, list[list[int]]] = {}
    for index, site in enumerate(sites):
        rows = -(-n // _heads(site))
        chunks = groups.setdefault(rows, [[]])
        if len(chunks[-1]) * n * n * len(probe) * 2 > _PROBE_ELEMENTS:
            chunks.append([])
        chunks[-1].append(index)
    result: dict[int, np.ndarray] = {}
    for rows, chunks in groups.items():
        for chunk in chunks:
            found = _probe_group(model, [sites[i] for i in chunk], positions, probe, n, rows, extra)
            if found is None:
                return None
            result.update({chunk[k]: m for k, m in found.items()})
    return result


def _probe_group(model: ir.Model, sites: list[_Site], positions: ir.Value, probe: list[int], n: int, rows: int,
                 extra: list[ir.Value]) -> dict[int, np.ndarray] | None:
    from rope_passes.runtime.sessions import create_session, session_options

    needed = [v for v in extra if v.name in _graph_inputs_needed(model, sites)[1]]
    try:
        sub = ir.convenience.extract(model.graph, [*[s.pre for s in sites], positions, *needed],
                                     [s.out for s in sites])
    except Exception:  # noqa: BLE001 - not bounded by the heads and the positions: not understood
        return None
    pos_rank = len(positions.shape) if positions.shape is not None else 2
    for value in sub.inputs[:len(sites) + 1]:
        rank = len(value.shape) if value.shape is not None else (4 if value is not sub.inputs[len(sites)] else 2)
        if value.type is None:
            value.type = ir.TensorType(ir.DataType.FLOAT if value is not sub.inputs[len(sites)] else ir.DataType.INT64)
        value.shape = ir.Shape([f"d{k}_{value.name}" for k in range(rank)])
    for value in sub.outputs:
        value.shape = None
    for value in sub.initializers.values():
        if value.const_value is not None:
            value.const_value = ir.tensor(value.const_value.numpy(), name=value.name)
    try:
        proto = ir.serde.serialize_model(ir.Model(sub, ir_version=min(model.ir_version or 10, 10)))
        so = session_options("cpu")
        so.log_severity_level = 4  # a probe that fails is skipped: no error lines from onnxruntime
        sess = create_session(proto.SerializeToString(), "cpu", so=so)
    except Exception:  # noqa: BLE001
        return None
    count = len(probe)
    pos = np.asarray(probe, dtype=np.int64)
    pos_feed = np.broadcast_to(pos, (rows, count)) if pos_rank == 2 else (pos if pos_rank == 1 else None)
    if pos_feed is None:
        return None
    pos_feed = np.ascontiguousarray(pos_feed).astype(np.int32 if positions.dtype == ir.DataType.INT32 else np.int64)
    feeds: dict[str, np.ndarray] = {}
    heads = []
    for site, value in zip(sites, sub.inputs[:len(sites)], strict=True):
        dtype = np.float16 if site.pre.dtype == ir.DataType.FLOAT16 else np.float32
        if site.pre.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16, None):
            return None
        if not site.heads and site.pre.shape is not None and (
                len(site.pre.shape) != 4 or isinstance(site.pre.shape[3], int) and site.pre.shape[3] != n):
            return None
        h = _heads(site)
        heads.append(h)
        x = np.zeros((rows, h, count, n), dtype=dtype)  # [batch, heads, seq, head_dim]
        for b in range(n):
            x[b // h, b % h, :, b] = 1
        feeds[value.name or ""] = np.ascontiguousarray(np.transpose(x, (0, 2, 1, 3))).reshape(rows, count, h * n) \
            if site.heads else x
    feeds[sub.inputs[len(sites)].name or ""] = pos_feed
    for value, original in zip(sub.inputs[len(sites) + 1:], needed, strict=True):
        feed = _shape_feed(original, positions, rows, count)
        if feed is None:
            return None
        feeds[value.name or ""] = feed
    try:
        outs = sess.run(None, feeds)
    except Exception:  # noqa: BLE001
        return None
    result = {}
    for k, y in enumerate(outs):
        h = heads[k]
        if sites[k].heads and y.shape == (rows, count, h * n):
            y = np.transpose(y.reshape(rows, count, h, n), (0, 2, 1, 3))
        if y.shape != (rows, h, count, n):
            continue  # not [batch, heads, positions, head_dim]: not understood
        cols = np.stack([y[b // h, b % h] for b in range(n)], axis=-1)  # [P, row, col]
        result[k] = cols.astype(np.float64)
    return result


def _expected(rope: Rope, positions: np.ndarray, head_dim: int, long: bool = False) -> np.ndarray | None:
    """``[P, D, D]``: the rotation config.json's rope applies at ``positions`` (pass-through past the rotary dim)."""
    half = rope.rotary_dim // 2
    if rope.rotary_dim > head_dim or half == 0:
        return None
    angles = rope.angles(positions, long).astype(np.float64)
    scale = float(rope.attention_scaling)
    c, s = np.cos(angles) * scale, np.sin(angles) * scale
    out = np.zeros((len(positions), head_dim, head_dim))
    for d in range(rope.rotary_dim, head_dim):
        out[:, d, d] = 1.0
    for j in range(half):
        a, b = (2 * j, 2 * j + 1) if rope.interleaved else (j, j + half)
        out[:, a, a], out[:, b, b], out[:, a, b], out[:, b, a] = c[:, j], c[:, j], -s[:, j], s[:, j]
    return out


def _tolerance(rope: Rope, positions: np.ndarray, fp16: bool, long: bool = False) -> np.ndarray:
    """``[P]``: what float32 (float16) rounding lets a correct producer differ by (:meth:`Rope.tolerance`'s terms at
    these positions), plus the rotation's own products."""
    inv = rope.inv_freq(long).astype(np.float64)
    angles = np.abs(rope.angles(positions, long))
    angle_err = positions.astype(np.float64)[:, None] * INV_FREQ_ULPS * np.spacing(inv.astype(np.float32)) \
        + np.spacing(angles).astype(np.float64)
    scale = max(abs(float(rope.attention_scaling)), 1.0)
    tol = scale * (angle_err.max(axis=1) + VALUE_ULPS * float(np.spacing(np.float32(1))))
    return 2 * tol + (4e-3 if fp16 else 1e-5) * scale


@dataclasses.dataclass
class _Verdict:
    ok: bool = False
    shift: int | None = None  # the graph rotates by position + shift everywhere
    first: int | None = None  # the first probed position where it differs
    angle: float = 0.0  # the largest angle error there (radians)
    size: float = 0.0  # the largest |difference| of the matrices there
    cause: str = ""


def _angles_of(m: np.ndarray, rope: Rope) -> np.ndarray:
    half = rope.rotary_dim // 2
    js = np.arange(half)
    a, b = (2 * js, 2 * js + 1) if rope.interleaved else (js, js + half)
    return np.arctan2(m[:, b, a], m[:, a, a])


def _wrap(x: np.ndarray) -> np.ndarray:
    return (x + np.pi) % (2 * np.pi) - np.pi


def _judge(m: np.ndarray, rope: Rope, probe: np.ndarray, head_dim: int, fp16: bool,
           others: list[Rope], long: bool = False) -> _Verdict | None:
    """None: not a rotation on the config's pairs (not understood, skipped)."""
    want = _expected(rope, probe, head_dim, long)
    if want is None:
        return None
    tol = _tolerance(rope, probe, fp16, long)
    mask = (want != 0) | (_expected(rope, probe + 1, head_dim, long) != 0)  # the pairs' blocks
    if np.abs(np.where(mask, 0, m)).max() > 1e-3 + tol.max():
        flipped = dataclasses.replace(rope, interleaved=not rope.interleaved)
        alt = _expected(flipped, probe, head_dim, long)
        if alt is None or not (np.abs(m - alt).max(axis=(1, 2)) <= tol).all():
            return None  # off-block entries: other pairs, or a site not understood
        diff = np.abs(m - want).max(axis=(1, 2))
        first = int(np.flatnonzero(diff > tol)[0])
        return _Verdict(first=int(probe[first]), angle=float(np.abs(rope.angles(probe[first:first + 1], long)).max()),
                        size=float(diff[first]), cause=(
                            f"it rotates {'interleaved pairs (2i, 2i+1)' if flipped.interleaved else 'halves (i, i + d/2)'}"
                            f", config.json's family rotates {'interleaved pairs' if rope.interleaved else 'halves'}"))
    diff = np.abs(m - want).max(axis=(1, 2))
    if (diff <= tol).all():
        return _Verdict(ok=True)
    # q or k at position + shift (the lowest frequency says by how much)
    got = _angles_of(m, rope)
    inv = rope.inv_freq(long).astype(np.float64)
    j = int(np.argmin(inv))
    shift = int(round(float(_wrap(got[0, j] - rope.angles(probe[:1], long).astype(np.float64)[0, j])) / inv[j]))
    if shift:
        moved = _expected(rope, probe + shift, head_dim, long)
        if moved is not None and (np.abs(m - moved).max(axis=(1, 2)) <= _tolerance(rope, probe + abs(shift),
                                                                                     fp16, long)).all():
            return _Verdict(shift=shift)
    bad = np.flatnonzero(diff > tol)
    first = int(bad[0])
    angle_err = np.abs(_wrap(got - rope.angles(probe, long).astype(np.float64)))  # [P, pairs]
    verdict = _Verdict(first=int(probe[first]), angle=float(angle_err.max()), size=float(diff[first]))
    if (np.abs(m - np.transpose(want, (0, 2, 1))).max(axis=(1, 2)) <= tol).all():
        verdict.cause = "it rotates by -angle (rotate_half reversed: the sin term has the wrong sign)"
        return verdict
    if rope.switches:
        frozen = _expected(rope, probe, head_dim, not long)
        if frozen is not None and (np.abs(m - frozen).max(axis=(1, 2)) <= _tolerance(rope, probe, fp16,
                                                                                       not long)).all():
            verdict.cause = (f"it rotates by the {'short' if long else 'long'} factors in a call "
                             f"{'past' if long else 'within'} original_max_position_embeddings {rope.original_max} "
                             f"(LongRoPE frozen)")
            return verdict
    for other in others:
        alt = _expected(other, probe, head_dim, long and other.switches)
        if alt is not None and (np.abs(m - alt).max(axis=(1, 2)) <= _tolerance(other, probe, fp16,
                                                                                 long and other.switches)).all():
            verdict.cause = f"it rotates by the {other.layer_type} rope ({other.describe()})"
            return verdict
    amp = np.hypot(m[first][0, 0], m[first][rope.rotary_dim // 2 if not rope.interleaved else 1, 0])
    if abs(amp - abs(rope.attention_scaling)) > 1e-3:
        verdict.cause = f"its cos/sin are scaled by {amp:.6g}, config.json's attention scaling is " \
                        f"{rope.attention_scaling:.6g}" + (
                            "; its angles differ too" if verdict.angle > 1e-3 + tol.max() else "")
    else:
        verdict.cause = "its angles differ (another theta, scaling or positions)"
    return verdict


def _findings(ctx: LintContext) -> list[tuple[str, str, str]]:
    """(severity: error | note, target, message), computed once for RP405 and RP406."""
    cached = getattr(ctx, "_rp405", None)
    if cached is not None:
        return cached
    out: list[tuple[str, str, str]] = []
    ctx._rp405 = out  # type: ignore[attr-defined]
    try:
        hf = HFConfig.find(ctx.path)
    except Exception:  # noqa: BLE001 - RP403 says why
        return out
    if hf is None or not hf.max_position_embeddings or not hf.head_dim:
        return out
    positions = _position_input(ctx.model)
    if positions is None:
        return out
    sites = _sites(ctx.model)
    if not sites:
        return out
    values, shapes, ranged = _graph_inputs_needed(ctx.model, sites)
    if values != {positions.name} or ranged:
        return out  # the rotation reads more than the positions, or makes its own: not understood
    extra = [v for v in ctx.model.graph.inputs if v.name in shapes]
    max_pos = hf.max_position_embeddings
    probe = np.asarray(sorted({p for p in (*_PROBE, max_pos - 1) if 0 <= p < max_pos}), dtype=np.int64)
    head_dim = int(sites[0].pre.shape[3]) if sites[0].pre.shape is not None and len(sites[0].pre.shape) == 4 and \
        isinstance(sites[0].pre.shape[3], int) else hf.head_dim
    mats = None
    for tried in (probe, probe[probe < max_pos - 8]):  # a table one row short of a shifted read: the others
        try:
            mats = _probe(ctx.model, sites, positions, [int(p) for p in tried], head_dim, extra)
        except Exception:  # noqa: BLE001 - never a crash of lint
            mats = None
        if mats:
            probe = tried
            break
    if not mats:
        return out
    try:
        all_ropes = [hf.rope(t) for t in hf.layer_types()]
    except (MatchFailure, ModelLoadError):
        return out
    layers: dict[int, dict[str, tuple[_Site, _Verdict]]] = {}
    short: dict[int, np.ndarray] | None = None  # LongRoPE: a second call within original_max_position_embeddings
    for index, site in enumerate(sites):
        if index not in mats:
            continue
        try:
            rope = hf.layer_rope(site.layer)
        except (MatchFailure, ModelLoadError):
            continue
        if rope is None:
            continue  # NoPE layers (RP404)
        others = [r for r in all_ropes if r.layer_type != rope.layer_type]
        fp16 = site.pre.dtype == ir.DataType.FLOAT16
        if not rope.switches:
            verdict = _judge(mats[index], rope, probe, head_dim, fp16, others)
        else:  # transformers: the long factors when the call's largest position + 1 > original, else the short
            original = rope.original_max or 0
            within = probe[probe < original]
            if short is None and within.size:
                try:
                    short = _probe(ctx.model, sites, positions, [int(p) for p in within], head_dim, extra) or {}
                except Exception:  # noqa: BLE001
                    short = {}
            long = int(probe.max()) + 1 > original
            verdict = _judge(mats[index], rope, probe, head_dim, fp16, others, long)
            calls = [(verdict, probe, long)]
            if within.size and long:
                if not short or index not in short:
                    continue
                calls.insert(0, (_judge(short[index], rope, within, head_dim, fp16, others, False), within, False))
            if any(v is None for v, _, _ in calls):
                continue
            bad = next(((v, p, lg) for v, p, lg in calls if not v.ok), None)  # type: ignore[union-attr]
            if bad is None:
                verdict = calls[0][0]
            elif bad[0].first is None and len({v.shift for v, _, _ in calls}) > 1:  # type: ignore[union-attr]
                continue  # shifted differently in the two calls: not understood
            else:
                verdict = bad[0]
                assert verdict is not None
                verdict.cause = (f"in a call of positions {', '.join(map(str, bad[1]))} ("
                                 f"{'long' if bad[2] else 'short'} factors): ") + verdict.cause
        if verdict is not None:
            layers.setdefault(site.layer, {})[site.role] = (site, verdict)
    for layer in sorted(layers):
        roles = layers[layer]
        rope = hf.layer_rope(layer)
        assert rope is not None
        name = (rope.layer_type + " " if rope.layer_type else "")
        for role in ("q", "k"):
            if role not in roles:
                continue
            site, v = roles[role]
            if v.first is not None:
                word = "query" if role == "q" else "key"
                out.append(("error", site.node.name or site.out.name or "Add", (
                    f"layer {layer} {word} ({role}, rotated value {site.out.name!r}) rotates differently from "
                    f"config.json's {name}rope ({rope.describe()}) from position {v.first} on (matrix entries off by "
                    f"{v.size:.3g} there; angle error up to {v.angle:.3g} rad at the positions probed): {v.cause}")))
        shifts = {r: v.shift or 0 for r, (_, v) in roles.items() if v.first is None}
        if len(shifts) == 2 and shifts["q"] != shifts["k"]:
            site = roles["q"][0]
            out.append(("error", site.node.name or site.out.name or "Add", (
                f"layer {layer} rotates its query at position + {shifts['q']} and its key at position + "
                f"{shifts['k']} (probed at positions {', '.join(map(str, probe))}): query and key are "
                f"{abs(shifts['q'] - shifts['k'])} position(s) apart, so attention differs from config.json's from "
                f"position {int(probe[0])} on")))
        elif len(shifts) == 1 and next(iter(shifts.values())):
            (role, shift), = shifts.items()
            site = roles[role][0]
            out.append(("error", site.node.name or site.out.name or "Add", (
                f"layer {layer} rotates its {'query' if role == 'q' else 'key'} at position + {shift} (the "
                f"{'key' if role == 'q' else 'query'} could not be probed)")))
        elif len(shifts) == 2 and shifts["q"]:
            site = roles["q"][0]
            out.append(("note", site.node.name or site.out.name or "Add", (
                f"layer {layer} rotates query and key both at position + {shifts['q']}: attention is unchanged "
                f"(RoPE is relative), the tables differ from config.json's")))
    return out


@rule("RP405", "rotation-conformance", Severity.ERROR,
      "An attention layer's query or key rotation, probed numerically, differs from what config.json says",
      """Per attention layer, the rotation applied to the query and to the key (torch exports' Mul/Add/Neg/Slice/
      Concat over cos/sin) is evaluated on onnxruntime CPU at a few positions (0, 1, 2, 7, 100, max - 1) with the
      head replaced by basis vectors, and its 2x2 blocks compared with the rotation config.json prescribes for that
      layer (its layer type's rope for Gemma 3, attention scaling, partial rotary, pair layout). Finds what the table
      rules cannot: rotate_half reversed, layers reading each other's (or a private, wrong) cos/sin chain, query and
      key at different positions. The finding names the layer, query or key, the first differing position and the
      angle error. Graphs whose rotation is not understood are skipped.""")
def rotation_conformance(ctx: LintContext) -> Iterator[tuple[str, str]]:
    for severity, target, message in _findings(ctx):
        if severity == "error":
            yield target, message


@rule("RP406", "rotation-shifted", Severity.NOTE,
      "Query and key of a layer are both rotated at position + k: the same attention, other tables",
      """RoPE is relative: a layer whose query and key are both rotated at position + k (the same k) computes the
      attention config.json's rope does, though its cos/sin tables differ (RP402 may say so).""")
def rotation_shifted(ctx: LintContext) -> Iterator[tuple[str, str]]:
    for severity, target, message in _findings(ctx):
        if severity == "note":
            yield target, message


__all__ = ["rotation_conformance", "rotation_shifted"]
