"""Where each attention layer rotates its query and key (pure graph reading; the rotation itself is probed by
:mod:`rope_passes.proofs.rotation` and judged against config.json by lint RP405/RP406,
:mod:`rope_passes.lint.rules_rotation`).

* :func:`sites`: the rotated values (the torch exporters' ``Add(Mul(x, cos'), Mul(rotate_half(x), sin'))`` and
  RotaryEmbedding nodes), each with its layer (:mod:`rope_passes.analysis.layers`) and whether it is the query or the
  key;
* :func:`graph_inputs_needed`: the graph inputs the rotated values are computed from besides the heads.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from rope_passes.analysis.layers import layer_in_name, present_layer
from rope_passes.report import name_of

#: ops between a Cos/Sin node and the Mul of the rotation
_TRIG_PATH = {"Unsqueeze", "Squeeze", "Cast", "Mul", "Gather", "Slice", "Expand", "Reshape", "Transpose", "Identity",
              "Concat", "Where", "GatherElements", "Tile", "Div"}
#: ops of rotate_half (and of an interleaved rotate_every_two)
_HALF_PATH = {"Slice", "Neg", "Concat", "Split", "Reshape", "Gather", "Mul", "Unsqueeze", "Squeeze", "Transpose",
              "Identity", "Stack", "Flatten", "Cast"}
_ATTENTION = {"GroupQueryAttention", "MultiHeadAttention", "Attention", "SparseAttention", "PagedAttention"}


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
        parts[kinds[k]] = m.inputs[1 - k]
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
    return node.inputs[0], cat.outputs[0]


def _attention_of(value: ir.Value, depth: int = 30) -> tuple[ir.Node, int, int | None] | None:
    """The first attention MatMul (or fused attention op) the rotated value reaches: (node, input index, the N of a
    ``present.N`` output on the way)."""
    frontier, present, seen = [value], None, set()
    for _ in range(depth):
        nxt = []
        for v in frontier:
            if v.is_graph_output() and present is None:
                present = present_layer(v.name)
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
        by_name = layer_in_name(site.node.name)
        by_name = by_name if by_name is not None else layer_in_name(node.name)
        if present is not None:
            named[id(node)] = present
        elif by_name is not None:
            named[id(node)] = by_name
        site.layer = id(node)
        kept.append(site)
    for site in kept:
        key = site.layer
        site.layer = named.get(key, order[key])
    return kept


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
                (shapes if node.op_type == "Shape" else values).add(name_of(i))
        if node.op_type != "Shape":
            stack += [i for i in node.inputs if i is not None]
    return values, shapes - values, ranged


__all__ = ["Site", "graph_inputs_needed", "sites"]
