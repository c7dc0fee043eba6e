"""Re-saving a model in another ONNX container form or at another opset, for the container fuzzer (issue 25).

Written from the ONNX spec, apart from the package (a test must not use the code it judges): each function takes a
``onnx.ModelProto`` (external data not loaded) and returns a new one, or None where the form cannot hold this model
(an op that does not exist at that opset).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnx.defs
import onnx.external_data_helper
import onnx.helper
import onnx.numpy_helper

#: ops whose second operand is an attribute below the opset given, an input from it on (the ONNX changelog)
_MOVED = {"ReduceSum": ("axes", 13), "Squeeze": ("axes", 13), "Unsqueeze": ("axes", 13), "Split": ("split", 13),
          **{op: ("axes", 18) for op in ("ReduceMax", "ReduceMin", "ReduceMean", "ReduceProd", "ReduceL1",
                                         "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")}}


def graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from graphs(attr.g)
            for g in attr.graphs:
                yield from graphs(g)


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    out = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer
           if t.data_location != onnx.TensorProto.EXTERNAL}
    for node in graph.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    out[node.output[0]] = onnx.numpy_helper.to_array(a.t)
                elif a.name == "value_ints":
                    out[node.output[0]] = np.array(list(a.ints), np.int64)
    return out


def at_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto | None:
    """The model with its default-domain opset import set to ``opset``, each moved operand in that opset's form;
    None when a default-domain op of the model does not exist at ``opset`` or an operand to move is not constant."""
    out = copy.deepcopy(model)
    for imp in out.opset_import:
        if imp.domain in ("", "ai.onnx"):
            imp.version = opset
    for graph in graphs(out.graph):
        consts = _constants(graph)
        for node in graph.node:
            if node.domain not in ("", "ai.onnx"):
                continue
            if not onnx.defs.has(node.op_type):
                continue  # onnxruntime's contrib ops in the default domain (SimplifiedLayerNormalization, ...)
            try:
                onnx.defs.get_schema(node.op_type, opset, "")
            except onnx.defs.SchemaError:
                return None
            moved = _MOVED.get(node.op_type)
            if moved is None:
                continue
            key, since = moved
            attrs = {a.name: a for a in node.attribute}
            if opset < since and len(node.input) > 1 and node.input[1]:
                if node.input[1] not in consts:
                    return None
                values = [int(v) for v in consts[node.input[1]].reshape(-1)]
                rest = list(node.input[2:])
                del node.input[1:]
                node.input.extend(rest)
                node.attribute.append(onnx.helper.make_attribute(key, values))
            elif opset >= since and key in attrs:
                values = list(attrs[key].ints)
                name = f"{node.name or node.output[0]}/{key}_as_input"
                graph.initializer.append(onnx.numpy_helper.from_array(np.array(values, np.int64), name))
                node.attribute.remove(attrs[key])
                rest = list(node.input[1:])
                del node.input[1:]
                node.input.extend([name, *rest])
    return out


def sparse(model: onnx.ModelProto, names: list[str], base_dir: Path | None = None) -> onnx.ModelProto:
    """Initializers ``names`` moved to ``graph.sparse_initializer`` (non-zero values, flat indices, in the proto;
    an external one is read from ``base_dir``)."""
    out = copy.deepcopy(model)
    kept = []
    for tensor in out.graph.initializer:
        if tensor.name not in names:
            kept.append(tensor)
            continue
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            assert base_dir is not None
            onnx.external_data_helper.load_external_data_for_tensor(tensor, str(base_dir))
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]
        array = onnx.numpy_helper.to_array(tensor)
        flat = np.flatnonzero(array.reshape(-1))
        values = onnx.numpy_helper.from_array(array.reshape(-1)[flat], tensor.name)
        indices = onnx.numpy_helper.from_array(flat.astype(np.int64), tensor.name + "_indices")
        out.graph.sparse_initializer.append(onnx.helper.make_sparse_tensor(values, indices, list(array.shape)))
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept)
    return out


def typed_fields(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every in-proto float/int64/int32/double initializer stored in its typed field (``float_data``, ...) instead
    of ``raw_data``."""
    out = copy.deepcopy(model)
    for graph in graphs(out.graph):
        for tensor in graph.initializer:
            if tensor.data_location == onnx.TensorProto.EXTERNAL or not tensor.HasField("raw_data"):
                continue
            array = onnx.numpy_helper.to_array(tensor)
            field = {onnx.TensorProto.FLOAT: "float_data", onnx.TensorProto.INT64: "int64_data",
                     onnx.TensorProto.INT32: "int32_data", onnx.TensorProto.DOUBLE: "double_data"}.get(tensor.data_type)
            if field is None:
                continue
            tensor.ClearField("raw_data")
            getattr(tensor, field).extend(array.reshape(-1).tolist())
    return out


def split_external(model: onnx.ModelProto, src_dir: Path, dst_dir: Path, names: list[str],
                   location: str = "tables/rope.bin", offset_pad: int = 64) -> onnx.ModelProto:
    """Initializers ``names`` moved into a second external data file ``location`` (a subfolder), each at an offset
    (``offset_pad`` bytes of padding before each); the rest as they were. Writes the file under ``dst_dir``."""
    out = copy.deepcopy(model)
    blob = bytearray()
    for tensor in out.graph.initializer:
        if tensor.name not in names:
            continue
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            onnx.external_data_helper.load_external_data_for_tensor(tensor, str(src_dir))
        raw = onnx.numpy_helper.to_array(tensor).tobytes()
        blob += b"\0" * offset_pad
        offset = len(blob)
        blob += raw
        tensor.ClearField("raw_data")
        for field in ("float_data", "int64_data", "int32_data", "double_data"):
            tensor.ClearField(field)
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", str(offset)), ("length", str(len(raw)))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
    (dst_dir / location).parent.mkdir(parents=True, exist_ok=True)
    (dst_dir / location).write_bytes(bytes(blob))
    return out


def with_training_info(model: onnx.ModelProto) -> onnx.ModelProto:
    out = copy.deepcopy(model)
    info = out.training_info.add()
    info.algorithm.CopyFrom(onnx.helper.make_graph([], "rope_passes_test_algorithm", [], []))
    return out


def ir_version_3(model: onnx.ModelProto) -> onnx.ModelProto:
    """IR version 3: every initializer is also declared a graph input (the rule before IR 4)."""
    out = copy.deepcopy(model)
    out.ir_version = 3
    for graph in graphs(out.graph):
        declared = {i.name for i in graph.input}
        for tensor in graph.initializer:
            if tensor.name not in declared:
                graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    return out
