"""ONNX container forms onnx_ir does not read, made readable at load time (issue 25): nothing the model holds is lost.

* **Sparse initializers** (``graph.sparse_initializer``, in the main graph or a subgraph) are valid ONNX that
  onnxruntime densifies; onnx_ir drops them on load (with a warning), so a node reading one would read a value no
  longer there. They are **densified**: each becomes a dense initializer of the same name, shape and type (its values
  read from the proto, or from external data where they live there). A model whose passes change nothing is copied
  byte for byte and keeps its sparse form; a rewritten one holds the dense tensor (onnxruntime computes the same).
* **``Constant(sparse_value=...)``** (onnx_ir cannot deserialize it) becomes ``Constant(value=<dense>)``.
* **``training_info``** (onnx_ir has no field for it) is kept aside on the model (:data:`TRAINING_INFO`) and written
  back by every save.
* **IR version < 4** (every initializer must also be a graph input): an initializer a pass added is declared as an
  input by every save (:func:`declare_initializers_as_inputs`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnx.external_data_helper
import onnx.numpy_helper
import onnx_ir as ir

__all__ = ["TRAINING_INFO", "declare_initializers_as_inputs", "dense", "keep_training_info", "normalize",
           "restore_training_info"]

#: where the model's serialized ``training_info`` entries travel: ``ir.Model.meta`` (not written to the file by
#: onnx_ir; put back into the proto by :func:`restore_training_info`)
TRAINING_INFO = "rope_passes.training_info"


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _graphs(attr.g)
            for g in attr.graphs:
                yield from _graphs(g)


def _array(tensor: onnx.TensorProto, base_dir: Path) -> np.ndarray:
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        copy = onnx.TensorProto()
        copy.CopyFrom(tensor)
        onnx.external_data_helper.load_external_data_for_tensor(copy, str(base_dir))
        return onnx.numpy_helper.to_array(copy)
    return onnx.numpy_helper.to_array(tensor)


def dense(sparse: onnx.SparseTensorProto, base_dir: Path) -> onnx.TensorProto:
    """The dense tensor a SparseTensorProto stands for (indices flat [NNZ] or coordinates [NNZ, rank])."""
    values = _array(sparse.values, base_dir)
    indices = _array(sparse.indices, base_dir).astype(np.int64)
    shape = tuple(int(d) for d in sparse.dims)
    out = np.zeros(shape, dtype=values.dtype)
    if values.size:
        flat = indices if indices.ndim == 1 else np.ravel_multi_index(tuple(indices.T), shape)
        out.reshape(-1)[flat] = values.reshape(-1)
    return onnx.numpy_helper.from_array(out, sparse.values.name)


def normalize(proto: onnx.ModelProto, base_dir: Path) -> bool:
    """Make ``proto`` readable by onnx_ir in place (see the module doc); True when anything was changed."""
    changed = False
    for graph in list(_graphs(proto.graph)):
        if len(graph.sparse_initializer):
            for sparse in graph.sparse_initializer:
                graph.initializer.append(dense(sparse, base_dir))
            del graph.sparse_initializer[:]
            changed = True
        for node in graph.node:
            changed |= _dense_constant(node, base_dir)
    for function in proto.functions:
        for node in function.node:
            changed |= _dense_constant(node, base_dir)
    return changed


def _dense_constant(node: onnx.NodeProto, base_dir: Path) -> bool:
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
        return False
    for i, attr in enumerate(node.attribute):
        if attr.name == "sparse_value":
            value = onnx.helper.make_attribute("value", dense(attr.sparse_tensor, base_dir))
            node.attribute.pop(i)
            node.attribute.insert(i, value)
            return True
    return False


def declare_initializers_as_inputs(proto: onnx.ModelProto) -> bool:
    """IR versions below 4 require every initializer to be a graph input too (onnx.checker: "in initializer but not
    in graph input"): declare those a pass added (main graph and subgraphs). True when anything was declared."""
    if proto.ir_version >= 4:
        return False
    changed = False
    for graph in _graphs(proto.graph):
        declared = {i.name for i in graph.input}
        for tensor in graph.initializer:
            if tensor.name not in declared:
                graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type,
                                                                      list(tensor.dims)))
                changed = True
    return changed


def keep_training_info(proto: onnx.ModelProto, model: ir.Model) -> None:
    """Hold the model's ``training_info`` entries on ``model`` (serialized) for the save to put back."""
    if len(proto.training_info):
        model.meta[TRAINING_INFO] = [t.SerializeToString() for t in proto.training_info]


def restore_training_info(model: ir.Model, proto: onnx.ModelProto) -> None:
    """Put the ``training_info`` entries :func:`keep_training_info` held back into a serialized ``proto``."""
    for blob in model.meta.get(TRAINING_INFO, ()):
        info = proto.training_info.add()
        info.ParseFromString(blob)
