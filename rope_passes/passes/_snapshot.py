"""The model as a pass received it, to roll the pass back (its contracts: :mod:`rope_passes.passes.base`).

The graph structure is serialized, every tensor held by reference: external weights are references already;
in-memory initializers (the tables passes add, ~16-50 MB) are held as the same objects, not copied into the proto (a
pass makes new tensors, it never writes into one). :meth:`Snapshot.restore_into` puts the model back *into the same
``ir.Model`` object* (an ``onnx_ir`` ``InPlacePass`` returns the model it was given), and the proto is also what the
validity contract loads as the input's weightless stand-in (:mod:`rope_passes.runtime.loads`).
"""

from __future__ import annotations

import onnx
import onnx_ir as ir

import rope_passes.graph_walk as graph_walk

__all__ = ["Snapshot"]

#: the location of a held tensor's stand-in in a snapshot's proto
HELD = "rope-passes-snapshot-held-tensor"


def serialize_holding(model: ir.Model) -> tuple[onnx.ModelProto, list[tuple[int, str, ir.TensorProtocol]]]:
    """The model's proto with every in-memory initializer replaced by an external reference that names no file, and
    the (graph index in ``graph_walk.graphs`` order, initializer name, tensor) held aside."""
    held: list[tuple[int, str, ir.TensorProtocol]] = []
    placed: list[tuple[ir.Value, ir.TensorProtocol]] = []
    for index, graph in enumerate(graph_walk.graphs(model)):
        for name, value in graph.initializers.items():
            tensor = value.const_value
            if tensor is None or isinstance(tensor, ir.ExternalTensor) or tensor.dtype == ir.DataType.STRING:
                continue
            held.append((index, name, tensor))
            placed.append((value, tensor))
            value.const_value = ir.ExternalTensor(HELD, offset=0, length=tensor.nbytes, dtype=tensor.dtype,
                                                  shape=ir.Shape(tensor.shape.numpy()), name=name)
    try:
        proto = ir.serde.serialize_model(model)
    finally:
        for value, tensor in placed:
            value.const_value = tensor
    return proto, held


class Snapshot:
    """The model before a pass: its proto (weights by reference) and the tensors held aside."""

    def __init__(self, model: ir.Model) -> None:
        self.base_dirs = {name: v.const_value.base_dir for name, v in model.graph.initializers.items()
                          if isinstance(v.const_value, ir.ExternalTensor)}
        self.proto, self.held = serialize_holding(model)

    def restore(self) -> ir.Model:
        """The model as it was (a new object; in-memory initializers: the objects it had)."""
        model = ir.serde.deserialize_model(self.proto)
        dirs = set(self.base_dirs.values())
        if len(dirs) == 1:  # every tensor, subgraphs and attributes included
            ir.external_data.set_base_dir(model.graph, dirs.pop())
        for name, v in model.graph.initializers.items():
            if isinstance(v.const_value, ir.ExternalTensor) and name in self.base_dirs:
                v.const_value.base_dir = self.base_dirs[name]
        graphs = list(graph_walk.graphs(model))
        for index, name, tensor in self.held:
            value = graphs[index].initializers[name]
            assert isinstance(value.const_value, ir.ExternalTensor) and str(value.const_value.location) == HELD
            value.const_value = tensor
        return model

    def restore_into(self, model: ir.Model) -> None:
        """Put ``model`` back as it was, in place: its graph, functions, metadata and header fields."""
        old = self.restore()
        model.graph = old.graph
        model.functions.clear()
        model.functions.update(old.functions)
        model.metadata_props.clear()
        model.metadata_props.update(old.metadata_props)
        for field in ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string"):
            setattr(model, field, getattr(old, field))
