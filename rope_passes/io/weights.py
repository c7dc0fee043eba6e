"""Serializing a model without rewriting the weights the passes did not touch (issue 14).

``--weights`` (``weights=`` of ``save_bundle``) says how the input's external data reaches the output (and with
it every file carried unchanged: a folder's tokenizer files and other models, an unchanged model's files):

* ``reflink`` (default): the data file is cloned copy-on-write where the filesystem can (btrfs, XFS, ...), else
  copied; ``copy``: always a real copy (streaming, sparse-aware, no slower than ``cp``); ``link``: a hard link, so
  the output costs no space and no time, but the two names are ONE file: editing either edits both, and onnx_ir
  (so tools on it: onnxscript's optimizer, checked) refuses to read a data file with two names ("hard link attack");
  rope-passes reads it (:class:`rope_passes.io.load.LinkedExternalTensor`). In these modes
  the graph is written with its external references kept: every tensor still in an input data file keeps its
  offset and length in the same bytes, under the output's name for that file (``<model>.onnx.data``). Tensors the
  passes made (in memory) go into the ``.onnx`` file itself while they are small: each of at most
  :data:`INLINE_NEW_BYTES` (1 MiB: the cos/sin and offset tables of a context up to ~4k positions), and at most
  :data:`INLINE_NEW_TOTAL` (8 MiB) in all, so ``lint --fix`` and ``optimize --in-place`` on such a model leave no new
  file for the user to commit; larger ones go into a second file, ``<model>.onnx.rope.data`` (lint's RP005 errors
  while git does not track it). That file is always rewritten, never reused. In place, only the graph file and the
  second file are written: the data file keeps its inode and its mtime.
* ``rewrite``: everything re-serialized into one ``<model>.onnx.data`` (the layout of earlier versions, byte for
  byte: what ``tools/output_digests.py`` compares).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import onnx
import onnx_ir as ir

import rope_passes.graph_walk as graph_walk
from rope_passes.errors import UsageError
from rope_passes.io.containers import TRAINING_INFO, declare_initializers_as_inputs, restore_training_info
from rope_passes.io.disk import carry_file
from rope_passes.io.layout import DATA_SUFFIX
from rope_passes.io.load import MAX_IR_VERSION, ModelBundle, external_tensors
from rope_passes.io.paths import NEW_DATA_SUFFIX, same_file

#: how untouched weights reach the output; the first is the default
WEIGHT_MODES = ("reflink", "copy", "link", "rewrite")
#: tensors of at most this many bytes stay inside the .onnx file (onnx_ir.save's threshold)
SMALL_TENSOR_BYTES = 256
#: a tensor the passes made goes into the .onnx file itself when it has at most this many bytes ...
INLINE_NEW_BYTES = 1 << 20
#: ... and the ones put there add up to at most this many; the rest go into <model>.onnx.rope.data
INLINE_NEW_TOTAL = 8 << 20


def check_weights_mode(mode: str) -> None:
    if mode not in WEIGHT_MODES:
        raise UsageError(f"unknown weights mode {mode!r} (choose from: {', '.join(WEIGHT_MODES)})")


def carry_mode(mode: str) -> str:
    """How files copied unchanged travel in a weights mode (``rewrite`` copies, as earlier versions did)."""
    return "copy" if mode == "rewrite" else mode


def summarize(used: list[str]) -> str | None:
    """One word for how the data files travelled: the mode they all had, else ``copy`` (a fallback happened)."""
    if not used:
        return None
    return used[0] if len(set(used)) == 1 else "copy"


@dataclasses.dataclass
class Serialized:
    """What a serializer put in the staging folder."""

    names: list[str]  # files staged, relative to the output folder; the model first
    referenced: set[str]  # the data files the written graph references (staged or already in place)
    weights: str | None  # how the input's data files travelled ("rewrite", "reflink", "link", "copy"; None: stayed)
    #: the staged files that are the input's data files carried unchanged (copy, reflink, hard link)
    carried: frozenset[str] = frozenset()


def _cap_ir_version(model: ir.Model) -> None:
    if model.ir_version is None or model.ir_version > MAX_IR_VERSION:
        model.ir_version = MAX_IR_VERSION


def _in_memory(tensor: ir.TensorProtocol) -> ir.Tensor:
    return ir.Tensor(tensor.numpy().copy(), dtype=tensor.dtype, name=tensor.name)


def _inline_small_external_tensors(model: ir.Model) -> None:
    """Copy small external initializers into memory before saving.

    onnx_ir.save would do it itself, but by ``release()``-ing the memory map, which raises ``BufferError`` when a
    pass still holds a NumPy view of that tensor (analysis reads small constants). Copying leaves the map alone.
    """
    for graph in graph_walk.graphs(model):
        for value in graph.initializers.values():
            tensor = value.const_value
            if isinstance(tensor, ir.ExternalTensor) and tensor.nbytes <= SMALL_TENSOR_BYTES:
                value.const_value = _in_memory(tensor)


def data_name(model_name: str, transformers_js: bool) -> str:
    """The one data file of a model: ``<model>.onnx.data``, or transformers.js's ``<model>.onnx_data``."""
    return model_name + (DATA_SUFFIX if transformers_js else ".data")


def serialize_rewrite(bundle: ModelBundle, staging: Path, model_name: str, *,
                      transformers_js: bool = False) -> Serialized:
    """Everything re-serialized: the graph and one data file with every tensor above the threshold."""
    model = bundle.model
    _cap_ir_version(model)
    had_external = bool(bundle.external_data_files)
    _inline_small_external_tensors(model)
    data_name_ = data_name(model_name, transformers_js)
    ir.save(model, staging / model_name, external_data=data_name_ if had_external else None,
            size_threshold_bytes=SMALL_TENSOR_BYTES)
    if model.meta.get(TRAINING_INFO) or (model.ir_version or 0) < 4:  # what onnx_ir does not write: see containers
        proto = onnx.load(staging / model_name, load_external_data=False)
        restore_training_info(model, proto)
        declare_initializers_as_inputs(proto)
        onnx.save(proto, staging / model_name)
    data = [data_name_] if had_external else []
    return Serialized([model_name, *data], set(data), "rewrite")


def _tensor_protos(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    for node in graph.node:
        yield from _attribute_tensors(node)


def _attribute_tensors(node: onnx.NodeProto) -> Iterator[onnx.TensorProto]:
    for attr in node.attribute:
        if attr.HasField("t"):
            yield attr.t
        yield from attr.tensors
        if attr.HasField("g"):
            yield from _tensor_protos(attr.g)
        for g in attr.graphs:
            yield from _tensor_protos(g)


def _relocate(proto: onnx.ModelProto, rename: dict[str, str]) -> None:
    """Point external references at the output's names for the reused data files (offsets and lengths unchanged)."""
    tensors = [*_tensor_protos(proto.graph), *(t for f in proto.functions for n in f.node for t in _attribute_tensors(n))]
    for tensor in tensors:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key == "location" and entry.value in rename:
                    entry.value = rename[entry.value]


def serialize_reusing(bundle: ModelBundle, staging: Path, model_out: Path, *, in_place: bool,
                      mode: str, transformers_js: bool = False) -> Serialized:
    """The graph with its external references kept; the input's data files carried (``mode``) or, in place, left
    alone; the tensors the passes made in ``<model>.rope.data`` (or inline when small). ``transformers_js`` (a model
    of that layout, :mod:`rope_passes.io.layout`): data files named as transformers.js fetches them
    (``<model>.onnx_data``, chunks ``_data_1``...) and every new tensor inline, since transformers.js hands the
    browser's onnxruntime only those files (new tensors are cos/sin tables: kilobytes to a few MB)."""
    model = bundle.model
    _cap_ir_version(model)
    source_dir = bundle.model_path.parent.resolve()

    known: dict[tuple[str, str], bool] = {}  # (base_dir, location) -> reused: one resolve() and stat per file

    def reused(tensor: ir.TensorProtocol | None) -> bool:
        if not isinstance(tensor, ir.ExternalTensor) or str(tensor.location).endswith(NEW_DATA_SUFFIX):
            return False  # in memory, or in a second data file of ours (always rewritten)
        key = (str(tensor.base_dir or source_dir), str(tensor.location))
        if key not in known:
            known[key] = (Path(key[0]).resolve() == source_dir and (source_dir / tensor.location).is_file())
        return known[key]

    external = list(external_tensors(model))
    locations = sorted({str(t.location) for t in external if reused(t)})
    had_external = bool(external)  # bundle.external_data_files is not empty
    if in_place:
        rename = {loc: loc for loc in locations}
    elif len(locations) == 1:
        rename = {locations[0]: data_name(model_out.name, transformers_js)}
    else:  # sharded data: same names, unless the output sits beside the input
        beside = same_file(model_out.parent, source_dir)
        chunk = (lambda i: f"{model_out.name}{DATA_SUFFIX}{f'_{i}' if i else ''}") if transformers_js else (
            lambda i: f"{model_out.name}.{i}.data")
        rename = {loc: chunk(i) if beside else loc for i, loc in enumerate(locations)}

    new_name = model_out.name + NEW_DATA_SUFFIX
    to_file: list[ir.Value] = []  # in-memory (or no longer reusable) initializers: the second data file
    to_inline: list[ir.Value] = []  # small ones that are external somewhere not reused
    inlined = 0  # bytes of new tensors put into the .onnx file
    for graph in graph_walk.graphs(model):
        for value in graph.initializers.values():
            tensor = value.const_value
            if tensor is None or reused(tensor):
                continue
            small = tensor.nbytes <= SMALL_TENSOR_BYTES
            if had_external and not transformers_js and not small and (tensor.nbytes > INLINE_NEW_BYTES
                                               or inlined + tensor.nbytes > INLINE_NEW_TOTAL):
                to_file.append(value)
                continue
            inlined += 0 if small else tensor.nbytes
            if isinstance(tensor, ir.ExternalTensor):
                to_inline.append(value)
    attributes = [(node, name, attr) for node in graph_walk.nodes(model.graph)
                  for name, attr in node.attributes.items()
                  if attr.type == ir.AttributeType.TENSOR and isinstance(attr.value, ir.ExternalTensor)
                  and not reused(attr.value)]

    originals: list[tuple[ir.Value, ir.TensorProtocol | None]] = [(v, v.const_value) for v in to_file + to_inline]
    try:
        if to_file:
            tensors = [cast(ir.TensorProtocol, v.const_value) for v in to_file]  # selected above: not None
            written = ir.external_data.convert_tensors_to_external(tensors, staging, new_name)
            for value, tensor in zip(to_file, written):
                value.const_value = tensor
        for value in to_inline:
            value.const_value = _in_memory(cast(ir.TensorProtocol, value.const_value))
        for node, name, attr in attributes:
            node.attributes[name] = ir.AttrTensor(name, _in_memory(attr.value))
        proto = ir.serde.serialize_model(model)
    finally:
        for value, tensor in originals:
            value.const_value = tensor
        for node, name, attr in attributes:
            node.attributes[name] = attr
    _relocate(proto, rename)
    restore_training_info(model, proto)
    declare_initializers_as_inputs(proto)
    onnx.save(proto, staging / model_out.name)

    names = [model_out.name, *([new_name] if to_file else [])]
    used = []
    if not in_place:
        for loc, name in rename.items():
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            used.append(carry_file(source_dir / loc, staging / name, mode))
            names.append(name)
    return Serialized(names, set(rename.values()) | set(names[1:]), summarize(used),
                      frozenset(rename.values()) if not in_place else frozenset())
