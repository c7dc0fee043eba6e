"""Numeric evaluation of a small subgraph on onnxruntime's CPU EP: the numbers behind the passes' numeric proofs.

The subgraph between ``inputs`` and ``outputs`` is extracted into its own tiny model (weights outside it are never
read), run once per call with the given feeds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir


def evaluate_subgraph(model: ir.Model, inputs: Sequence[ir.Value], outputs: Sequence[ir.Value], feeds: list[np.ndarray]):
    """An input without a declared type (a Range output, a Where output fed in its place) is typed from its feed."""
    types = [(ir.DataType.from_numpy(f.dtype), f.ndim) for f in feeds]
    return subgraph_runner(model, inputs, outputs, types)(feeds)


def subgraph_runner(model: ir.Model, inputs: Sequence[ir.Value], outputs: Sequence[ir.Value],
                    types: Sequence[tuple[ir.DataType, int] | None] = ()) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    """The subgraph extracted and loaded once; the returned function runs it on one call's feeds (many calls,
    one session). ``types``: (element type, rank) per input, for the inputs the model declares no type or shape of
    (set on the extracted copy: the model is never changed)."""
    from rope_passes.runtime.sessions import create_session  # every session comes from there (docs/runtimes.md)

    sub = ir.convenience.extract(model.graph, inputs, outputs)
    for value, given in zip(sub.inputs, types, strict=False):
        if given is not None and value.type is None:
            value.type = ir.TensorType(given[0])
        if given is not None and value.shape is None:
            value.shape = ir.Shape([f"{value.name or 'input'}_{k}" for k in range(given[1])])
    for value in sub.initializers.values():  # small constants (caches, inv_freq, masks): load them into the proto
        if value.const_value is not None:
            value.const_value = ir.tensor(value.const_value.numpy(), name=value.name)
    sub_model = ir.Model(sub, ir_version=min(model.ir_version or 10, 10))
    proto = ir.serde.serialize_model(sub_model)
    sess = create_session(proto.SerializeToString(), "cpu")
    names = [i.name for i in sess.get_inputs()]
    return lambda feeds: sess.run(None, dict(zip(names, feeds, strict=True)))
