"""Reading models: a ``.onnx`` file, a genai model folder, or a tree of model folders.

Weights stay on disk: external tensors are lazy (memory-mapped only when a pass reads them), but every external-data
reference is checked up front (file present, range inside it), so a missing or truncated ``.onnx.data`` is a
one-line error at load time, not a crash later.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator
from pathlib import Path

import onnx
import onnx_ir as ir

import rope_passes.graph_walk as graph_walk
from rope_passes.config import GENAI_CONFIG, GenaiConfig
from rope_passes.errors import ModelLoadError
from rope_passes.io.containers import keep_training_info, normalize
from rope_passes.io.layout import ONNX_SUBFOLDER, is_transformers_js_folder, model_root, transformers_js_model

#: onnxruntime 1.27 accepts IR versions up to 13; onnx 1.23 would save 14.
MAX_IR_VERSION = 13


@dataclasses.dataclass
class ModelBundle:
    """A model plus what travels with it."""

    model: ir.Model
    model_path: Path  # the .onnx file it was read from
    folder: Path | None = None  # the model folder, when the input was a folder
    genai_config: GenaiConfig = dataclasses.field(default_factory=GenaiConfig)  # genai_config.json beside it

    @property
    def external_data_files(self) -> list[str]:
        return sorted({str(t.location) for t in external_tensors(self.model)})

    @property
    def genai_config_changed(self) -> bool:
        return self.genai_config.changed


def external_tensors(model: ir.Model) -> Iterator[ir.ExternalTensor]:
    """Every tensor of the model whose bytes live in an external data file (initializers and attributes)."""
    for graph in graph_walk.graphs(model):
        for value in graph.initializers.values():
            tensor = value.const_value
            if isinstance(tensor, ir.ExternalTensor):
                yield tensor
    for node in graph_walk.nodes(model.graph):
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.TENSOR and isinstance(attr.value, ir.ExternalTensor):
                yield attr.value


def find_model_file(folder: Path) -> Path:
    """The decoder model of a genai folder: ``genai_config.json``'s ``model.decoder.filename``, else the only .onnx;
    of a transformers.js folder (:mod:`rope_passes.io.layout`): ``onnx/model.onnx``."""
    if is_transformers_js_folder(folder):
        found = transformers_js_model(folder)
        if found is None:
            names = ", ".join(p.name for p in sorted((folder / ONNX_SUBFOLDER).glob("*.onnx")))
            raise ModelLoadError(f"{folder}: a transformers.js folder without {ONNX_SUBFOLDER}/model.onnx "
                                 f"({ONNX_SUBFOLDER}/ holds {names}): give the model file to use")
        return found
    try:
        name = GenaiConfig.load(folder).decoder_filename
    except ModelLoadError:
        name = None  # an unreadable config is reported when the bundle loads it
    if isinstance(name, str) and name and (folder / name).is_file():
        return folder / name
    candidates = sorted(folder.glob("*.onnx"))
    if not candidates:
        raise ModelLoadError(f"{folder}: no .onnx model in this folder")
    if len(candidates) > 1:
        names = ", ".join(c.name for c in candidates)
        if is_transformers_js_folder(folder.parent):
            raise ModelLoadError(f"{folder}: several models ({names}); give the transformers.js folder "
                                 f"{folder.parent} (its {ONNX_SUBFOLDER}/model.onnx) or one model file")
        raise ModelLoadError(f"{folder}: several models ({names}) and no genai_config.json naming the decoder")
    return candidates[0]


def _holds_model(folder: Path) -> bool:
    return ((folder / GENAI_CONFIG).is_file() or any(p.is_file() for p in folder.glob("*.onnx"))
            or is_transformers_js_folder(folder))


def discover_models(path: str | os.PathLike) -> list[Path]:
    """The models a user path stands for: a model file or model folder is itself; a folder holding no model directly
    stands for every model folder below it (sorted, hidden folders skipped), e.g. a tree of genai builds."""
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(f"{p}: no such file or directory")
    if p.is_file() or _holds_model(p):
        return [p]
    found = []
    for root, dirs, _files in os.walk(p, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        folder = Path(root)
        if folder != p and _holds_model(folder):
            found.append(folder)
            dirs[:] = []  # a model folder's subfolders belong to it (tokenizer, processor files)
    if not found:
        raise ModelLoadError(f"{p}: no .onnx model in this folder or below it")
    return found


#: a file that belongs to a model beside it: its data files (``model.onnx.data``, sharded ``model.onnx.0.data``,
#: transformers.js's ``model.onnx_data`` / ``model.onnx_data_1``, the tables of ours ``model.onnx.rope.data``)
DATA_FILE = re.compile(r"^(?P<model>.+\.onnx)(\.data|\.\d+\.data|_data(_\d+)?|\.rope\.data)$")


def model_of(path: str | os.PathLike) -> Path:
    """The model a user path belongs to: a data file's model file (``model.onnx.data`` -> ``model.onnx`` beside it,
    or its folder where there is none), ``genai_config.json``'s folder; any other path is itself. What ``lint``
    reads for the files a pre-commit hook passes (a commit that changes only genai_config.json or a data file)."""
    p = Path(path)
    if p.name == GENAI_CONFIG:
        return p.parent
    match = DATA_FILE.match(p.name)
    if match and not p.is_dir():
        model = p.with_name(match["model"])
        return model if model.is_file() else p.parent
    return p


def lint_targets(paths: list[str | os.PathLike]) -> list[Path]:
    """The models ``paths`` stand for (:func:`model_of`, then :func:`discover_models`), each once: a model named
    twice (its file and its genai_config.json, as a hook passes them) is linted once, as first named."""
    seen: set[Path] = set()
    out = []
    for given in paths:
        for model in discover_models(model_of(given)):
            try:
                key = resolve_model_path(model)[0].resolve()
            except ModelLoadError:
                key = model.resolve()  # reported when it is linted
            if key not in seen:
                seen.add(key)
                out.append(model)
    return out


def resolve_model_path(path: str | os.PathLike) -> tuple[Path, Path | None]:
    """(model file, folder or None) for a user-given file or folder path."""
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(f"{p}: no such file or directory")
    if p.is_dir():
        return find_model_file(p), p
    return p, None


class LinkedExternalTensor(ir.ExternalTensor):
    """An external tensor in a data file with more than one hard link: the file ``optimize --weights link`` leaves
    on both sides (and any file a user hard-linked). onnx_ir refuses to read such a file (``nlink > 1`` "may indicate a
    hard link attack"), so without this a model could not be read again after ``--weights link``. Its other checks
    still run and still refuse (a location outside the model's folder, a symbolic link leading out of it): only the
    hard-link check, onnx_ir's last one, is waived. The hazard it guards against (a file hard-linked into a model
    folder by someone else) is the user's own folder here; ``--weights link``'s own hazard is documented with it."""

    def _check_path_containment(self) -> None:
        try:
            super()._check_path_containment()
        except ValueError as exc:
            if "multiple hard links" not in str(exc):  # containment and symlink checks: still refused
                raise


def _readable_hard_links(model: ir.Model) -> None:
    """Initializers and Constant tensors in hard-linked data files become :class:`LinkedExternalTensor` (same file,
    offset, length, dtype, shape, name and base folder: what a save reuses is unchanged)."""

    nlinks: dict[str, int] = {}  # one stat per data file, not per tensor

    def linked(tensor: ir.TensorProtocol) -> ir.TensorProtocol:
        if not isinstance(tensor, ir.ExternalTensor) or isinstance(tensor, LinkedExternalTensor):
            return tensor
        if tensor.path not in nlinks:
            try:
                nlinks[tensor.path] = os.stat(tensor.path).st_nlink
            except OSError:
                nlinks[tensor.path] = 1  # a missing file is reported by _check_external_data
        if nlinks[tensor.path] <= 1:
            return tensor
        return LinkedExternalTensor(tensor.location, tensor.offset, tensor.length, tensor.dtype, shape=tensor.shape,
                                    name=tensor.name, doc_string=tensor.doc_string,
                                    metadata_props=dict(tensor.metadata_props), base_dir=tensor.base_dir)

    for graph in graph_walk.graphs(model):
        for value in graph.initializers.values():
            if value.const_value is not None:
                value.const_value = linked(value.const_value)
    for node in graph_walk.nodes(model.graph):
        for name, attr in list(node.attributes.items()):
            if attr.type == ir.AttributeType.TENSOR and isinstance(attr.value, ir.ExternalTensor):
                new = linked(attr.value)
                if new is not attr.value:
                    node.attributes[name] = ir.AttrTensor(name, new)


#: the first line of a Git LFS pointer file (https://github.com/git-lfs/git-lfs/blob/main/docs/spec.md)
LFS_POINTER_PREFIX = b"version https://git-lfs.github.com/spec/"
#: the spec caps a pointer file at 1024 bytes; a larger file is never taken for one
LFS_POINTER_MAX_BYTES = 1024


def lfs_pointer_size(path: Path, size: int) -> int | None:
    """If the file at ``path`` (``size`` bytes) is a Git LFS pointer, the size of the file it stands for (0 when the
    pointer does not say); else None. A clone without ``git lfs`` (or with ``GIT_LFS_SKIP_SMUDGE``) checks these
    out in place of the model and its weights."""
    if size > LFS_POINTER_MAX_BYTES:
        return None
    try:
        head = path.read_bytes()
    except OSError:
        return None
    if not head.startswith(LFS_POINTER_PREFIX):
        return None
    for line in head.decode("utf-8", "replace").splitlines():
        key, _, value = line.partition(" ")
        if key == "size" and value.strip().isdigit():
            return int(value)
    return 0


def _lfs_error(path: Path, real_size: int, what: str) -> ModelLoadError:
    size = f" (stands for {real_size:,} bytes)" if real_size else ""
    return ModelLoadError(f"{path}: {what} looks like a Git LFS pointer{size}, not the file itself: "
                          "run `git lfs pull` in its repository")


def _check_link(model_path: Path, data_path: Path, location: str) -> None:
    """A data file reached through a symbolic link that leads out of the model's folder (a Hugging Face cache
    snapshot: files linked to ../../blobs/) is a one-line error up front: onnx_ir refuses to read through it (a
    "path traversal" guard) and would fail at the first tensor a pass reads."""
    folder, path = model_path.parent.absolute(), data_path.absolute()
    real = path.resolve()
    if real.is_relative_to(folder.resolve()) or not any(p.is_symlink() for p in [path, *path.parents]
                                                         if p.is_relative_to(folder) and p != folder):
        return
    raise ModelLoadError(f"{model_path}: external data file {location!r} is a symbolic link to {real}, outside the "
                         "model's folder, which onnx_ir refuses to read through; copy the folder with its links "
                         "resolved (cp -rL, or huggingface-cli download --local-dir for a Hugging Face cache)")


def _check_external_data(model: ir.Model, model_path: Path) -> None:
    sizes: dict[Path, int] = {}
    for tensor in external_tensors(model):
        data_path = Path(tensor.base_dir or model_path.parent) / tensor.location
        if data_path not in sizes:
            if not data_path.is_file():
                raise ModelLoadError(
                    f"{model_path}: external data file {str(tensor.location)!r} is missing (expected at {data_path})"
                )
            _check_link(model_path, data_path, str(tensor.location))
            sizes[data_path] = data_path.stat().st_size
            real_size = lfs_pointer_size(data_path, sizes[data_path])
            if real_size is not None:
                raise _lfs_error(data_path, real_size, "this external data file")
        end = (tensor.offset or 0) + (tensor.length or 0)
        if tensor.length is not None and end > sizes[data_path]:
            raise ModelLoadError(
                f"{model_path}: external data file {str(tensor.location)!r} is truncated "
                f"(tensor {tensor.name!r} needs bytes up to {end}, file has {sizes[data_path]})"
            )


def load_model(path: str | os.PathLike) -> ir.Model:
    """Load one ``.onnx`` file with lazy external data; raises ModelLoadError with a one-line reason."""
    model_path = Path(path)
    if not model_path.is_file():
        raise ModelLoadError(f"{model_path}: no such file")
    size = model_path.stat().st_size
    if size == 0:
        raise ModelLoadError(f"{model_path}: file is empty, not an ONNX model")
    real_size = lfs_pointer_size(model_path, size)
    if real_size is not None:
        raise _lfs_error(model_path, real_size, "this model file")
    try:
        proto = onnx.load(model_path, load_external_data=False)
        normalize(proto, model_path.parent)  # sparse tensors densified: onnx_ir would drop them
        model = ir.serde.deserialize_model(proto)
        ir.external_data.set_base_dir(model.graph, os.path.dirname(model_path))
        keep_training_info(proto, model)
    except Exception as exc:  # protobuf DecodeError and friends carry multi-line messages
        raise ModelLoadError(
            f"{model_path}: not a readable ONNX model (truncated or not ONNX: {type(exc).__name__})"
        ) from None
    if not model.graph.outputs and not len(model.graph):
        raise ModelLoadError(f"{model_path}: not an ONNX model (empty graph)")
    _check_external_data(model, model_path)
    _readable_hard_links(model)
    _shapes_of_initializers(model)
    return model


def _shapes_of_initializers(model: ir.Model) -> None:
    """An initializer's value has the shape and type of its tensor: a ``value_info`` (or graph input) that declares
    another shape for it (a stale exporter's [256, 16] over a [256, 14] table) is not what onnxruntime feeds, and
    every reader of ``value.shape`` (a refusal's "16 columns", a width a pass builds with) must see the tensor's.
    The output of a ``Constant`` node with a tensor ``value`` likewise."""
    pairs = [(v, v.const_value) for g in graph_walk.graphs(model) for v in g.initializers.values()]
    pairs += [(node.outputs[0], node.attributes["value"].value) for node in graph_walk.nodes(model.graph)
              if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and "value" in node.attributes
              and node.attributes["value"].type == ir.AttributeType.TENSOR]
    for value, tensor in pairs:
        if tensor is None:
            continue
        dims = [int(d) for d in tensor.shape.numpy()]  # a tensor's shape is static
        if value.shape is None or list(value.shape) != dims:
            value.shape = ir.Shape(dims)
        if value.dtype is None or value.dtype != tensor.dtype:
            value.dtype = tensor.dtype


def load_bundle(path: str | os.PathLike) -> ModelBundle:
    """Load a model file, a genai model folder or a transformers.js folder."""
    model_path, folder = resolve_model_path(path)
    model = load_model(model_path)
    return ModelBundle(model, model_path, folder, GenaiConfig.load(folder or model_root(model_path)))
