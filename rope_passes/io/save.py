"""Writing models: nothing lost, atomic, the input never touched unless asked.

``save_bundle`` writes to a new path with the external data beside the model, keeps opset imports,
``metadata_props``, doc strings and value_info (onnx_ir round-trips them), caps the IR version at 13 (onnxruntime
1.27 rejects 14), and writes atomically: everything goes to a temporary folder beside the target, then each file is
renamed into place. A folder input is copied whole (tokenizer files and all) with ``genai_config.json`` updated by the
passes. An unchanged model (see :func:`copies_verbatim`) is copied byte for byte, never re-serialized.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

import onnx_ir as ir

from rope_passes.config import GENAI_CONFIG
from rope_passes.errors import ModelSaveError
from rope_passes.io.load import MAX_IR_VERSION, ModelBundle
from rope_passes.io.paths import OutputTarget, output_target, same_file

#: onnx_ir.save keeps tensors of at most this many bytes inside the .onnx file.
SMALL_TENSOR_BYTES = 256


@dataclasses.dataclass(frozen=True)
class SaveResult:
    """What ``write_bundle`` wrote."""

    path: Path  # the model file written
    verbatim: bool  # the input's files were copied byte for byte (nothing re-serialized)


def copies_verbatim(bundle: ModelBundle, graph_modified: bool) -> bool:
    """The one decision "unchanged on disk": the graph was not modified (``graph_modified``, as the passes report
    it), ``genai_config.json`` was not changed, and the IR version is one onnxruntime reads (else it is lowered, which
    needs a re-serialization)."""
    return not graph_modified and not bundle.genai_config_changed and (bundle.model.ir_version or 0) <= MAX_IR_VERSION


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


def _copy_item(item: Path, dest: Path) -> None:
    (shutil.copytree if item.is_dir() else shutil.copy2)(item, dest)


def _stage_verbatim(bundle: ModelBundle, staging: Path, model_out: Path) -> list[Path]:
    """Stage the input's own files, byte for byte (an unchanged model is copied, never re-serialized)."""
    staged: list[Path] = []
    if bundle.folder is not None:
        for item in sorted(bundle.folder.iterdir()):
            if item.name.startswith(".rope-passes-"):
                continue
            dest = staging / item.name
            _copy_item(item, dest)
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
        if same_file(src, model_out.parent / name):
            continue  # already where the copy will look for it
        dest = staging / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest)
        staged.append(dest)
    return staged


def _stage_serialized(bundle: ModelBundle, staging: Path, target: OutputTarget) -> list[Path]:
    model, model_out = bundle.model, target.model_out
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
    folder_out = target.folder_out
    if folder_out is not None and bundle.folder is not None and not same_file(folder_out, bundle.folder):
        skip = {bundle.model_path.name, GENAI_CONFIG, *bundle.external_data_files}
        for item in sorted(bundle.folder.iterdir()):
            if item.name in skip or item.name.startswith(".rope-passes-"):
                continue
            dest = staging / item.name
            _copy_item(item, dest)
            staged.append(dest)
    return staged


def write_bundle(bundle: ModelBundle, output: str | os.PathLike | None, *, in_place: bool = False,
                 graph_modified: bool = True, unchanged: bool | None = None) -> SaveResult:
    """Write the bundle (see :func:`save_bundle`); returns what was written and how."""
    target = output_target(bundle.model_path, bundle.folder, output, in_place=in_place)
    if unchanged is None:
        unchanged = copies_verbatim(bundle, graph_modified)
    model_out = target.model_out
    if unchanged and target.onto_input:
        return SaveResult(bundle.model_path, True)  # nothing to write: the input already is the output
    target_dir = target.target_dir
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
        staged = _stage_verbatim(bundle, staging, model_out) if unchanged else _stage_serialized(bundle, staging, target)
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
    return SaveResult(model_out, unchanged)


def save_bundle(bundle: ModelBundle, output: str | os.PathLike | None, *, in_place: bool = False,
                graph_modified: bool = True, unchanged: bool | None = None) -> Path:
    """Write the bundle; returns the path of the written model file.

    ``output=None`` with ``in_place=True`` overwrites the input (atomically). Writing onto the input without
    ``in_place`` is refused, and so is an output folder inside the input folder (the copy would contain itself).

    Unchanged models are copied byte for byte instead of re-serialized ("unchanged" then holds at file level, not only
    for the graph). Say whether the graph was modified with ``graph_modified`` (e.g. ``PassResult.modified``; the
    default assumes it was) and the rest is decided here (:func:`copies_verbatim`); ``unchanged=True/False`` forces it.
    """
    return write_bundle(bundle, output, in_place=in_place, graph_modified=graph_modified, unchanged=unchanged).path
