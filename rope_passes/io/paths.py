"""Where outputs go, and every check on an output path: one place for the CLI, the API and ``save_bundle``.

* :func:`plan_outputs`: the (input, output) pairs a user path stands for; a folder of model folders maps each model
  to the same relative path under the output root.
* :func:`output_target`: the file and folder one model is written to, after the checks (an output is given, it is
  not the input unless ``in_place``, it is not inside the input folder; an existing output folder is empty or holds
  an earlier output of this very input, by content: see :func:`check_replaceable_folder`); :func:`check_output`
  adds: in place, the files replaced are not read-only.
* :func:`check_report_path` / :func:`write_report`: a report file (``optimize --report``, ``lint -o``).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from rope_passes.config import GENAI_CONFIG
from rope_passes.errors import ModelSaveError, UsageError
from rope_passes.io.disk import STAGING_PREFIX, is_read_only
from rope_passes.io.files import made_from
from rope_passes.io.layout import ONNX_SUBFOLDER
from rope_passes.io.load import discover_models, resolve_model_path

#: the second data file beside a model: the tensors the passes made (the input's data file is reused as it is)
NEW_DATA_SUFFIX = ".rope.data"


def same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def inside(child: Path, parent: Path) -> bool:
    try:
        child.resolve().relative_to(parent.resolve())
        return True
    except (OSError, ValueError):
        return False


def check_output_given(output: str | os.PathLike | None, *, in_place: bool, dry_run: bool = False) -> None:
    if output is None and not (in_place or dry_run):
        raise UsageError("no output path given (use -o OUT, --in-place, or --dry-run)")


@dataclasses.dataclass(frozen=True)
class ModelJob:
    """One model of a run: where it is read from and written to (``output`` None: in place or dry run)."""

    input: Path
    output: Path | None
    #: its path below the input root, for a folder of model folders; None for a single model
    relative: Path | None = None


def plan_outputs(path: str | os.PathLike, output: str | os.PathLike | None, *, in_place: bool = False,
                 dry_run: bool = False) -> list[ModelJob]:
    """The models ``path`` stands for (see :func:`discover_models`), each with its output path.

    A model file or folder is one job, written to ``output``; a folder of model folders gives a job per model, written
    to the same relative path under ``output`` (which must not be inside the input tree).
    """
    check_output_given(output, in_place=in_place, dry_run=dry_run)
    root = Path(path)
    models = discover_models(root)
    if models == [root]:
        return [ModelJob(root, None if output is None else Path(output))]
    out_root = None if output is None else Path(output)
    if out_root is not None and (same_file(out_root, root) or inside(out_root, root)):
        raise UsageError(f"{out_root}: is inside the input tree {root}; choose an output outside it")
    return [ModelJob(m, None if out_root is None else out_root / m.relative_to(root), m.relative_to(root))
            for m in models]


@dataclasses.dataclass(frozen=True)
class OutputTarget:
    """Where one model is written."""

    model_out: Path  # the .onnx file written
    folder_out: Path | None  # the folder written, when the output is a model folder (a folder input gives one)
    onto_input: bool  # the output is the input (``in_place``)

    @property
    def target_dir(self) -> Path:
        return self.model_out.parent

    @property
    def whole_folder(self) -> bool:
        """A model folder written whole (staged beside it, then swapped in); else files written into a folder (a
        file output, or in place), committed file by file."""
        return self.folder_out is not None and not self.onto_input


def companions(model_name: str) -> set[str]:
    """The files named after a model that belong to it: its data file and the second data file of new tensors."""
    return {model_name + ".data", model_name + NEW_DATA_SUFFIX}


def check_replaceable_folder(folder_out: Path, input_folder: Path | None, model_path: Path, inner: Path) -> None:
    """An existing output folder is replaced whole only when it is empty, or holds an earlier output of this very
    input (identified by content, :func:`rope_passes.io.files.made_from`: the input's hash recorded in the output
    model's metadata, or the input's own bytes) and nothing but what this output writes (the input folder's file
    names, the model's data files, ``genai_config.json``). Anything else (a folder of other files, the output of
    another model or of another version of this one) is refused, so no stale file ever mixes in and nothing of the
    user's is deleted. ``inner``: the model file's path inside the folder."""
    if not folder_out.is_dir():
        return
    model_name = model_path.name
    ours = {model_name, GENAI_CONFIG, *companions(model_name)}
    if input_folder is not None and input_folder.is_dir():
        ours |= {p.name for p in input_folder.iterdir()}
    present = [p for p in folder_out.iterdir() if not p.name.startswith(STAGING_PREFIX)]
    foreign = sorted(p.name for p in present if p.name not in ours)
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise ModelSaveError(f"{folder_out}: folder exists and holds files this output would not replace ({shown}); "
                             "choose a new or empty folder")
    if present and not made_from(folder_out / inner, model_path, input_folder, folder_out / GENAI_CONFIG):
        raise ModelSaveError(f"{folder_out}: folder exists and does not hold an earlier output of this input (its "
                             f"{inner.as_posix()} was not made from {model_path}, as it is now); choose a new or "
                             "empty folder, or remove it")


def check_not_read_only(paths: list[Path]) -> None:
    for path in paths:
        if is_read_only(path):
            raise ModelSaveError(f"{path}: is read-only; refusing to replace it (make it writable first)")


def output_target(model_path: Path, folder: Path | None, output: str | os.PathLike | None, *,
                  in_place: bool = False) -> OutputTarget:
    """The checked output of the model read from ``model_path`` (``folder``: its folder, for a folder input).

    ``output=None`` with ``in_place`` is the input itself. Writing onto the input without ``in_place`` is refused, and
    so is an output folder inside the input folder (the copy would contain itself).
    """
    check_output_given(output, in_place=in_place)
    if output is None:
        output = folder if folder is not None else model_path
    output = Path(output)
    if folder is not None or output.is_dir() or output.suffix != ".onnx":
        # a folder input keeps the model's place in it (onnx/model.onnx in a transformers.js folder)
        nested = folder is not None and model_path.parent == folder / ONNX_SUBFOLDER
        inner = Path(ONNX_SUBFOLDER, model_path.name) if nested else Path(model_path.name)
        model_out, folder_out = output / inner, output
    else:
        model_out, folder_out = output, None
    onto_input = same_file(model_out, model_path) or (
        folder_out is not None and same_file(folder_out, folder if folder is not None else model_path.parent)
    )
    if not in_place and onto_input:
        raise ModelSaveError(f"{output}: is the input; refusing to overwrite it without --in-place")
    if folder is not None and folder_out is not None and not onto_input and inside(folder_out, folder):
        raise ModelSaveError(
            f"{output}: is inside the input folder {folder}; choose an output outside it (or --in-place)"
        )
    if folder is None and folder_out is not None:
        folder_out = None  # a file input written into a folder: a file output named like the input
    target = OutputTarget(model_out, folder_out, onto_input)
    if target.whole_folder and folder_out is not None:
        check_replaceable_folder(folder_out, folder, model_path, model_out.relative_to(folder_out))
    return target


def check_output(input_path: str | os.PathLike, output: str | os.PathLike | None, *,
                 in_place: bool = False, rewrites_data: bool = False) -> OutputTarget:
    """:func:`output_target` for a user-given input path, before anything is loaded (fail before the work); in place,
    a read-only model or ``genai_config.json`` is refused (the user marked it so: ``optimize --in-place`` respects
    that, while ``lint --fix``, asked to fix that very file, rewrites it keeping its mode). ``rewrites_data``: the
    model's data file is replaced too (``--weights rewrite``), so it is checked as well."""
    model_path, folder = resolve_model_path(input_path)
    target = output_target(model_path, folder, output, in_place=in_place)
    if target.onto_input:
        data = [model_path.parent / (model_path.name + ".data")] if rewrites_data else []
        check_not_read_only([model_path, model_path.parent / GENAI_CONFIG, *data])
    return target


def check_report_path(path: str | os.PathLike) -> None:
    """A report file can be written at ``path`` (checked before any work): not a folder, its folder writable."""
    p = Path(path)
    folder = p.parent
    if p.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ModelSaveError(f"{path}: cannot write the report there")


def write_report(path: str | os.PathLike, text: str) -> None:
    """Write a report file; a failure is a one-line ModelSaveError."""
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as exc:
        raise ModelSaveError(f"{path}: cannot write the report ({exc.strerror or exc})") from None
