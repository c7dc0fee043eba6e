"""The rotation each attention layer applies, found and probed on onnxruntime CPU (for lint RP405/RP406,
:mod:`rope_passes.lint.rules_rotation`, which judges the matrices against config.json).

* :func:`sites`: the rotated values (the torch exporters' ``Add(Mul(x, cos'), Mul(rotate_half(x), sin'))`` and
  RotaryEmbedding nodes), each with its layer and whether it is the query or the key;
* :func:`probe_rotations`: the subgraph from ``x`` and ``position_ids`` to the rotated values run with ``x`` the head's
  basis vectors, at the probe positions: each site's ``head_dim x head_dim`` rotation matrix per position.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import onnx_ir as ir

_PRESENT = re.compile(r"(?:present|key_values)[._](?:key_values[._]|layers[._])?(\d+)[._]")
#: ops between a Cos/Sin node and the Mul of the rotation
_TRIG_PATH = {"Unsqueeze", "Squeeze", "Cast", "Mul", "Gather", "Slice", "Expand", "Reshape", "Transpose", "Identity",
              "Concat", "Where", "GatherElements", "Tile", "Div"}
#: ops of rotate_half (and of an interleaved rotate_every_two)
_HALF_PATH = {"Slice", "Neg", "Concat", "Split", "Reshape", "Gather", "Mul", "Unsqueeze", "Squeeze", "Transpose",
              "Identity", "Stack", "Flatten", "Cast"}
_ATTENTION = {"GroupQueryAttention", "MultiHeadAttention", "Attention", "SparseAttention", "PagedAttention"}
PROBE = (0, 1, 2, 7, 100)


@dataclasses.dataclass
class Site:
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


def sites(model: ir.Model) -> list[Site]:
    found = []
    for node in model.graph:
        if node.op_type == "RotaryEmbedding" and node.domain in ("", "ai.onnx", "com.microsoft") and node.inputs and \
                node.inputs[0] is not None:
            rank = len(node.inputs[0].shape) if node.inputs[0].shape is not None else None
            heads = int(node.attributes["num_heads"].value) if "num_heads" in node.attributes else 0
            if rank == 3 and heads > 0:
                found.append(Site(node.inputs[0], node.outputs[0], node, heads=heads))
            elif rank == 4:
                found.append(Site(node.inputs[0], node.outputs[0], node))
            continue
        if node.op_type != "Add" or node.domain not in ("", "ai.onnx"):
            continue
        rot = _rotation(node)
        if rot is None:
            continue
        pre, out = _widen(*rot)
        found.append(Site(pre, out, node))
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


def position_input(model: ir.Model) -> ir.Value | None:
    for v in model.graph.inputs:
        if "position" in (v.name or "") and v.dtype in (ir.DataType.INT64, ir.DataType.INT32):
            return v
    return None


def graph_inputs_needed(model: ir.Model, sites: list[Site]) -> tuple[set[str], set[str], bool]:
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


def _heads(site: Site) -> int:
    """The site's static head count (1 where not declared)."""
    if site.heads:
        return site.heads
    shape = site.pre.shape
    return shape[1] if shape is not None and len(shape) == 4 and isinstance(shape[1], int) and shape[1] > 0 else 1


#: the most head elements one probe session is fed (the sites of a graph are probed in groups below it)
_PROBE_ELEMENTS = 1 << 23


def probe_rotations(model: ir.Model, sites: list[Site], positions: ir.Value, probe: list[int],
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


def _probe_group(model: ir.Model, sites: list[Site], positions: ir.Value, probe: list[int], n: int, rows: int,
                 extra: list[ir.Value]) -> dict[int, np.ndarray] | None:
    from rope_passes.runtime.sessions import create_session, session_options

    needed = [v for v in extra if v.name in graph_inputs_needed(model, sites)[1]]
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
