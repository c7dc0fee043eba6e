"""Model I/O users can trust.

* ``load_bundle`` reads a ``.onnx`` file or a genai model folder (``model.onnx`` + ``genai_config.json`` + tokenizer
  files) with onnx_ir. Weights stay on disk: external tensors are lazy (memory-mapped only when a pass reads them),
  but every external-data reference is checked up front (file present, range inside it), so a missing or truncated
  ``.onnx.data`` is a one-line error at load time, not a crash later.
* ``save_bundle`` writes to a new path with the external data beside the model, keeps opset imports,
  ``metadata_props``, doc strings and value_info (onnx_ir round-trips them), caps the IR version at 13
  (onnxruntime 1.27 rejects 14), and writes atomically: everything goes to a temporary folder beside the target,
  then each file is renamed into place. A folder input is copied whole (tokenizer files and all) with
  ``genai_config.json`` updated by the passes. The input is never modified unless ``in_place=True``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

import onnx_ir as ir

from rope_passes.config import GENAI_CONFIG, GenaiConfig
from rope_passes.errors import ModelLoadError, ModelSaveError

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
        return sorted({t.location for t in _external_tensors(self.model)})

    @property
    def genai_config_changed(self) -> bool:
        return self.genai_config.changed


def _external_tensors(model: ir.Model):
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if isinstance(tensor, ir.ExternalTensor):
            yield tensor
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.TENSOR and isinstance(attr.value, ir.ExternalTensor):
                yield attr.value


def find_model_file(folder: Path) -> Path:
    """The decoder model of a genai folder: ``genai_config.json``'s ``model.decoder.filename``, else the only .onnx."""
    try:
        name = GenaiConfig.load(folder).decoder.get("filename")
    except ModelLoadError:
        name = None  # an unreadable config is reported when the bundle loads it
    if isinstance(name, str) and name and (folder / name).is_file():
        return folder / name
    candidates = sorted(folder.glob("*.onnx"))
    if not candidates:
        raise ModelLoadError(f"{folder}: no .onnx model in this folder")
    if len(candidates) > 1:
        names = ", ".join(c.name for c in candidates)
        raise ModelLoadError(f"{folder}: several models ({names}) and no genai_config.json naming the decoder")
    return candidates[0]


def _holds_model(folder: Path) -> bool:
    return (folder / GENAI_CONFIG).is_file() or any(p.is_file() for p in folder.glob("*.onnx"))


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


def resolve_model_path(path: str | os.PathLike) -> tuple[Path, Path | None]:
    """(model file, folder or None) for a user-given file or folder path."""
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(f"{p}: no such file or directory")
    if p.is_dir():
        return find_model_file(p), p
    return p, None


def _check_external_data(model: ir.Model, model_path: Path) -> None:
    sizes: dict[Path, int] = {}
    for tensor in _external_tensors(model):
        data_path = Path(tensor.base_dir or model_path.parent) / tensor.location
        if data_path not in sizes:
            if not data_path.is_file():
                raise ModelLoadError(
                    f"{model_path}: external data file {tensor.location!r} is missing (expected at {data_path})"
                )
            sizes[data_path] = data_path.stat().st_size
        end = (tensor.offset or 0) + (tensor.length or 0)
        if tensor.length is not None and end > sizes[data_path]:
            raise ModelLoadError(
                f"{model_path}: external data file {tensor.location!r} is truncated "
                f"(tensor {tensor.name!r} needs bytes up to {end}, file has {sizes[data_path]})"
            )


def load_model(path: str | os.PathLike) -> ir.Model:
    """Load one ``.onnx`` file with lazy external data; raises ModelLoadError with a one-line reason."""
    model_path = Path(path)
    if not model_path.is_file():
        raise ModelLoadError(f"{model_path}: no such file")
    if model_path.stat().st_size == 0:
        raise ModelLoadError(f"{model_path}: file is empty, not an ONNX model")
    try:
        model = ir.load(model_path)
    except Exception as exc:  # protobuf DecodeError and friends carry multi-line messages
        raise ModelLoadError(
            f"{model_path}: not a readable ONNX model (truncated or not ONNX: {type(exc).__name__})"
        ) from None
    if not model.graph.outputs and not len(model.graph):
        raise ModelLoadError(f"{model_path}: not an ONNX model (empty graph)")
    _check_external_data(model, model_path)
    return model


def load_bundle(path: str | os.PathLike) -> ModelBundle:
    """Load a model file or a genai model folder."""
    model_path, folder = resolve_model_path(path)
    model = load_model(model_path)
    return ModelBundle(model, model_path, folder, GenaiConfig.load(model_path.parent))


# ------------------------------------------------------------------------------------------------------------
# Saving
# ------------------------------------------------------------------------------------------------------------


def _output_model_path(bundle: ModelBundle, output: Path) -> tuple[Path, Path | None]:
    """(model file to write, folder to write into or None)."""
    if bundle.folder is not None or output.is_dir() or output.suffix != ".onnx":
        return output / bundle.model_path.name, output
    return output, None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


#: onnx_ir.save keeps tensors of at most this many bytes inside the .onnx file.
SMALL_TENSOR_BYTES = 256


def _inline_small_external_tensors(model: ir.Model) -> None:
    """Copy small external initializers into memory before saving.

    onnx_ir.save would do it itself, but by ``release()``-ing the memory map, which raises ``BufferError`` when a
    pass still holds a NumPy view of that tensor (analysis reads small constants). Copying leaves the map alone.
    """
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if isinstance(tensor, ir.ExternalTensor) and tensor.nbytes <= SMALL_TENSOR_BYTES:
                value.const_value = ir.Tensor(tensor.numpy().copy(), dtype=tensor.dtype, name=tensor.name)


def _inside(child: Path, parent: Path) -> bool:
    try:
        child.resolve().relative_to(parent.resolve())
        return True
    except (OSError, ValueError):
        return False


def _stage_verbatim(bundle: ModelBundle, staging: Path, model_out: Path) -> list[Path]:
    """Stage the input's own files, byte for byte (an unchanged model is copied, never re-serialized)."""
    staged: list[Path] = []
    if bundle.folder is not None:
        for item in sorted(bundle.folder.iterdir()):
            if item.name.startswith(".rope-passes-"):
                continue
            dest = staging / item.name
            (shutil.copytree if item.is_dir() else shutil.copy2)(item, dest)
            staged.append(dest)
        return staged
    dest = staging / model_out.name
    shutil.copy2(bundle.model_path, dest)
    staged.append(dest)
    source_dir = bundle.model_path.parent
    extras = list(bundle.external_data_files)
    if bundle.genai_config.present:
        extras.append(GENAI_CONFIG)
    for name in extras:
        src = source_dir / name
        if _same_file(src, model_out.parent / name):
            continue  # already where the copy will look for it
        dest = staging / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest)
        staged.append(dest)
    return staged


def _stage_serialized(bundle: ModelBundle, staging: Path, model_out: Path, folder_out: Path | None) -> list[Path]:
    model = bundle.model
    if model.ir_version is None or model.ir_version > MAX_IR_VERSION:
        model.ir_version = MAX_IR_VERSION
    had_external = bool(bundle.external_data_files)
    _inline_small_external_tensors(model)
    data_name = model_out.name + ".data"
    staged_model = staging / model_out.name
    try:
        ir.save(model, staged_model, external_data=data_name if had_external else None,
                size_threshold_bytes=SMALL_TENSOR_BYTES)
    except OSError as exc:
        raise ModelSaveError(f"{model_out}: cannot write ({exc.strerror})") from None
    staged = [staged_model] + ([staging / data_name] if had_external else [])
    if bundle.genai_config.present:
        config_path = staging / GENAI_CONFIG
        config_path.write_text(bundle.genai_config.dumps())
        staged.append(config_path)
    # A folder input travels whole: tokenizer files, processor configs, other models.
    if folder_out is not None and bundle.folder is not None and not _same_file(folder_out, bundle.folder):
        skip = {bundle.model_path.name, GENAI_CONFIG, *bundle.external_data_files}
        for item in sorted(bundle.folder.iterdir()):
            if item.name in skip or item.name.startswith(".rope-passes-"):
                continue
            dest = staging / item.name
            (shutil.copytree if item.is_dir() else shutil.copy2)(item, dest)
            staged.append(dest)
    return staged


def save_bundle(
    bundle: ModelBundle, output: str | os.PathLike | None, *, in_place: bool = False, unchanged: bool = False
) -> Path:
    """Write the bundle; returns the path of the written model file.

    ``output=None`` with ``in_place=True`` overwrites the input (atomically). Writing onto the input without
    ``in_place`` is refused, and so is an output folder inside the input folder (the copy would contain itself).
    ``unchanged=True`` (the passes changed nothing) copies the input files byte for byte instead of re-serializing:
    "unchanged" then holds at file level, not only for the graph.
    """
    if output is None:
        if not in_place:
            raise ModelSaveError("no output path given (use -o OUT, or --in-place to overwrite the input)")
        output = bundle.folder if bundle.folder is not None else bundle.model_path
    output = Path(output)
    model_out, folder_out = _output_model_path(bundle, output)
    source_dir = bundle.model_path.parent
    writes_onto_input = _same_file(model_out, bundle.model_path) or (
        folder_out is not None and _same_file(folder_out, source_dir)
    )
    if not in_place and writes_onto_input:
        raise ModelSaveError(f"{output}: is the input; refusing to overwrite it without --in-place")
    if bundle.folder is not None and folder_out is not None and not writes_onto_input and _inside(folder_out, bundle.folder):
        raise ModelSaveError(
            f"{output}: is inside the input folder {bundle.folder}; choose an output outside it (or --in-place)"
        )
    if unchanged and writes_onto_input:
        return bundle.model_path  # nothing to write: the input already is the output
    target_dir = model_out.parent
    try:
        target_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelSaveError(f"{target_dir}: cannot create output folder ({exc.strerror})") from None
    if not os.access(target_dir, os.W_OK):
        raise ModelSaveError(f"{target_dir}: output folder is not writable")

    try:
        staging = Path(tempfile.mkdtemp(prefix=".rope-passes-", dir=target_dir))
    except OSError as exc:
        raise ModelSaveError(f"{target_dir}: cannot write there ({exc.strerror})") from None
    try:
        if unchanged:
            staged = _stage_verbatim(bundle, staging, model_out)
        else:
            staged = _stage_serialized(bundle, staging, model_out, folder_out)
        staged_model = staging / model_out.name
        # Rename into place: the data file first, so a reader never sees a model without its weights.
        for src in sorted(staged, key=lambda s: s == staged_model):
            dest = target_dir / src.relative_to(staging)
            if dest.is_dir() and not src.is_dir():
                raise ModelSaveError(f"{dest}: is a folder, cannot write a file there")
            if src.is_dir() and dest.exists():
                shutil.rmtree(dest)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dest)
    except ModelSaveError:
        raise
    except OSError as exc:
        raise ModelSaveError(f"{model_out}: cannot write ({exc.strerror or exc})") from None
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(staging)
    return model_out
