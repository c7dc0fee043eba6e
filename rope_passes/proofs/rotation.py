"""Each rotation site's rotation, probed on onnxruntime CPU (the evidence lint RP405/RP406 judge against config.json,
:mod:`rope_passes.lint.rules_rotation`): :func:`probe_rotations` runs the subgraph from the heads and ``position_ids``
to the rotated values (:func:`rope_passes.analysis.rotation_sites.sites`) with the heads set to the head's basis
vectors, at the probe positions: each site's ``head_dim x head_dim`` rotation matrix per position.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.rotation_sites import Site, graph_inputs_needed
from rope_passes.report import name_of

#: the positions a rotation is probed at
PROBE = (0, 1, 2, 7, 100)


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
        feeds[name_of(value)] = np.ascontiguousarray(np.transpose(x, (0, 2, 1, 3))).reshape(rows, count, h * n) \
            if site.heads else x
    feeds[name_of(sub.inputs[len(sites)])] = pos_feed
    for value, original in zip(sub.inputs[len(sites) + 1:], needed, strict=True):
        feed = _shape_feed(original, positions, rows, count)
        if feed is None:
            return None
        feeds[name_of(value)] = feed
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


__all__ = ["PROBE", "probe_rotations"]
