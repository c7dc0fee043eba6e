"""cos/sin computed per call from an ``inv_freq`` vector: positions MatMul (or Einsum, or a broadcasting Mul)
``inv_freq``, then Cos and Sin, as exporters emit. :func:`inv_freq_product` is the one test for it (the census
reports it, ``precompute-cos-sin`` rewrites it)."""

from __future__ import annotations

import onnx_ir as ir

from rope_passes.analysis.graph import ancestors, const_tensor, graph_inputs_of, is_vector, iter_nodes, op_domain
from rope_passes.analysis.schema import InvFreqMatMul, shape_list
from rope_passes.report import name_of


def inv_freq_product(trig: ir.Node, model: ir.Model) -> tuple[ir.Node, ir.Value] | None:
    """``(product, inv_freq)`` when the Cos/Sin node ``trig`` reads positions times an ``inv_freq`` vector.

    ``product`` is the MatMul/Einsum, or the broadcasting Mul (transformers 5 dynamo exports) with a graph input
    behind one side, among ``trig``'s ancestors; ``inv_freq`` the constant float vector (``[N]`` or ``[1,N,1]``)
    behind one of its sides. None when ``trig`` is not computed that way (e.g. it reads a constant table).
    """
    for mm in ancestors(trig.inputs):
        if mm.op_type not in ("MatMul", "Einsum", "Mul") or len(mm.inputs) != 2:
            continue
        if mm.op_type == "Mul" and not any(  # outer product by broadcasting (transformers 5 dynamo exports)
                graph_inputs_of(ancestors([side]), model) for side in mm.inputs):
            continue
        for side in mm.inputs:
            for anc_value in [side, *[i for a in ancestors([side]) for i in a.inputs]]:
                t = const_tensor(anc_value) if anc_value is not None else None
                if t is not None and t.dtype.is_floating_point() and is_vector(t.shape):
                    return mm, anc_value
    return None


def inv_freq_matmuls(model: ir.Model) -> list[InvFreqMatMul]:
    """The inv_freq vectors cos/sin are computed from, with their products, Cos/Sin counts and position sources."""
    records: dict[str, InvFreqMatMul] = {}
    trig = [n for n in iter_nodes(model) if n.op_type in ("Cos", "Sin") and op_domain(n) == ""]
    for node in trig:
        found = inv_freq_product(node, model)
        if found is not None:
            mm, vector = found
            rec = records.setdefault(name_of(vector), InvFreqMatMul(
                inv_freq=name_of(vector), inv_freq_shape=shape_list(const_tensor(vector).shape) or [],
                matmuls=[], cos_nodes=0, sin_nodes=0, positions_from=[]))
            if mm.name not in rec.matmuls:
                rec.matmuls.append(name_of(mm))
                nodes = ancestors(mm.inputs)
                for src in graph_inputs_of(nodes, model) + [n.name for n in nodes if n.op_type == "Range"]:
                    if src not in rec.positions_from:
                        rec.positions_from.append(src)
            if node.op_type == "Cos":
                rec.cos_nodes += 1
            else:
                rec.sin_nodes += 1
    return list(records.values())
