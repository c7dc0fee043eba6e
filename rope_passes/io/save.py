"""Writing models: nothing lost, all or nothing, the input never touched unless asked.

``save_bundle`` keeps opset imports, ``metadata_props``, doc strings and value_info (onnx_ir round-trips them) and
caps the IR version at 13 (onnxruntime 1.27 rejects 14). An unchanged model (see :func:`copies_verbatim`) is copied
byte for byte, never re-serialized; a changed one is written without rewriting the weights the passes did not touch
(:mod:`rope_passes.io.weights`). How it reaches the disk:

* a model folder (a folder input) is staged whole in a ``.rope-passes-<pid>-*`` folder beside the output folder
  (tokenizer files and all, ``genai_config.json`` as the passes left it), then renamed into place: the output folder
  appears complete or not at all, and an earlier output of the same model is replaced whole (a folder holding other
  files is refused before any work, see :func:`~rope_passes.io.paths.check_replaceable_folder`);
* a file output, or ``in_place``, is staged inside the target folder and committed file by file with a journal
  (:func:`~rope_passes.io.disk.commit_files`): a failed rename puts every replaced file back, and each replaced file
  keeps its permission bits (``optimize --in-place`` refuses read-only files up front). A file output never
  overwrites the ``genai_config.json`` of the folder it lands in (an identical one is left alone; one that differs
  is kept, and refused when the passes changed this model's config);
* a failure leaves no staging folder and no output folder it created; a killed run's staging folder is removed by the
  next run that writes there.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from rope_passes.config import GENAI_CONFIG
from rope_passes.errors import ModelSaveError
from rope_passes.io.disk import (
    STAGING_PREFIX,
    carry_file,
    carry_tree,
    commit_files,
    make_dirs,
    new_staging,
    remove_dirs,
    swap_folder,
)
from rope_passes.io.files import INPUT_METADATA_KEY, file_states, input_identity
from rope_passes.io.layout import in_transformers_js_folder
from rope_passes.io.load import MAX_IR_VERSION, ModelBundle
from rope_passes.io.paths import OutputTarget, companions, output_target, same_file
from rope_passes.io.weights import (
    Serialized,
    carry_mode,
    check_weights_mode,
    serialize_reusing,
    serialize_rewrite,
    summarize,
)


@dataclasses.dataclass(frozen=True)
class SaveResult:
    """What ``write_bundle`` wrote."""

    path: Path  # the model file written
    verbatim: bool  # the input's files were copied byte for byte (nothing re-serialized)
    #: how the input's data files reached the output: "reflink", "link", "copy" or "rewrite" (re-serialized); None
    #: when none travelled (no external data, or in place, where the data file stays as it is)
    weights: str | None = None
    #: each file of the output (path relative to the output folder, or to the folder a file output lands in) ->
    #: "changed" | "same" | "new" | "removed", against the input's file it stands for, by bytes
    #: (:func:`rope_passes.io.files.file_states`); {} when nothing was written
    files: dict[str, str] = dataclasses.field(default_factory=dict)


def copies_verbatim(bundle: ModelBundle, graph_modified: bool) -> bool:
    """The one decision "unchanged on disk": the graph was not modified (``graph_modified``, as the passes report
    it), ``genai_config.json`` was not changed, and the IR version is one onnxruntime reads (else it is lowered, which
    needs a re-serialization)."""
    return not graph_modified and not bundle.genai_config_changed and (bundle.model.ir_version or 0) <= MAX_IR_VERSION


def _carry(item: Path, dest: Path, mode: str) -> str:
    if item.is_dir() and not item.is_symlink():
        carry_tree(item, dest, mode)
        return mode
    return carry_file(item, dest, mode)


def _stage_folder_files(bundle: ModelBundle, staging: Path, skip: set[str], mode: str,
                        data_files: Iterable[str] | None = None) -> list[str]:
    """A folder input travels whole: tokenizer files, processor configs, other models (a transformers.js folder's
    other dtypes in ``onnx/``). ``skip``: paths relative to the folder, not carried. Returns how the model's data
    files travelled (those among them; ``data_files``: ``bundle.external_data_files`` where the caller has it)."""
    assert bundle.folder is not None
    inner = _model_dir(bundle)
    data = {(inner / n).as_posix() for n in (bundle.external_data_files if data_files is None else data_files)}
    descend = {p.as_posix() for p in (inner, *inner.parents) if p != Path(".")}  # the way down to the model
    used: list[str] = []

    def walk(src: Path, dst: Path, prefix: Path) -> None:
        for item in sorted(src.iterdir()):
            rel = (prefix / item.name).as_posix()
            if rel in skip or item.name.startswith(STAGING_PREFIX):
                continue
            if rel in descend and item.is_dir() and not item.is_symlink():
                (dst / item.name).mkdir(exist_ok=True)
                walk(item, dst / item.name, prefix / item.name)
                continue
            how = _carry(item, dst / item.name, mode)
            if rel in data:
                used.append(how)

    walk(bundle.folder, staging, Path("."))
    return used


def _model_dir(bundle: ModelBundle) -> Path:
    """Where the model sits in its folder: ``.``, or ``onnx`` in a transformers.js folder."""
    assert bundle.folder is not None
    return Path(os.path.relpath(bundle.model_path.parent, bundle.folder))


def _serialize(bundle: ModelBundle, staging: Path, target: OutputTarget, weights: str) -> Serialized:
    transformers_js = in_transformers_js_folder(bundle.model_path)  # its data file names, no second data file
    if weights == "rewrite":
        return serialize_rewrite(bundle, staging, target.model_out.name, transformers_js=transformers_js)
    return serialize_reusing(bundle, staging, target.model_out, in_place=target.onto_input, mode=weights,
                             transformers_js=transformers_js)


def _input_config(bundle: ModelBundle) -> Path:
    """Where the input's ``genai_config.json`` is (or would be)."""
    return (bundle.folder or bundle.model_path.parent) / GENAI_CONFIG


def _folder_states(bundle: ModelBundle, staging: Path, written: set[str]) -> dict[str, str]:
    """The staged folder's files against the input folder's: ``written`` (relative paths) compared by bytes, the
    rest carried from the input as they were."""
    assert bundle.folder is not None
    folder = bundle.folder
    files = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file() or p.is_symlink())
    return file_states(((n, staging / n) for n in files if n in written),
                       lambda n: _input_config(bundle) if n == GENAI_CONFIG else folder / n,
                       carried=[n for n in files if n not in written])


def _write_folder(bundle: ModelBundle, target: OutputTarget, verbatim: bool,
                  weights: str) -> tuple[str | None, dict[str, str]]:
    """A model folder: staged whole beside the output folder, then swapped in."""
    assert target.folder_out is not None and bundle.folder is not None
    folder_out = target.folder_out
    created: list[Path] = []
    try:
        make_dirs(folder_out.parent, created)
        staging = new_staging(folder_out.parent)
    except OSError as exc:
        remove_dirs(created)
        raise ModelSaveError(f"{folder_out}: cannot create output folder ({exc.strerror or exc})") from None
    try:
        written: set[str] = set()
        if verbatim:
            used = summarize(_stage_folder_files(bundle, staging, set(), carry_mode(weights)))
        else:
            inner = _model_dir(bundle)
            (staging / inner).mkdir(parents=True, exist_ok=True)
            # the input this output is made from, by content: an existing output folder is replaced only by a new
            # output of the same input (rope_passes.io.paths.check_replaceable_folder)
            bundle.model.metadata_props[INPUT_METADATA_KEY] = input_identity(bundle.model_path, bundle.folder)
            serialized = _serialize(bundle, staging / inner, target, weights)
            data_files = bundle.external_data_files
            skip = {(inner / n).as_posix() for n in (bundle.model_path.name, *data_files, *serialized.names)}
            written = {(inner / n).as_posix() for n in serialized.names if n not in serialized.carried}
            if bundle.genai_config_changed:  # else the user's file travels as it is, byte for byte
                (staging / GENAI_CONFIG).write_text(bundle.genai_config.dumps())
                skip.add(GENAI_CONFIG)
                written.add(GENAI_CONFIG)
            _stage_folder_files(bundle, staging, skip, carry_mode(weights), data_files)
            used = serialized.weights
        files = _folder_states(bundle, staging, written)
        if folder_out.exists() and not folder_out.is_dir():
            raise ModelSaveError(f"{folder_out}: is a file, cannot write a folder there")
        swap_folder(staging, folder_out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        remove_dirs(created)
        raise
    return used, files


def _stage_config(bundle: ModelBundle, target: OutputTarget, verbatim: bool, staging: Path) -> list[str]:
    """``genai_config.json`` beside a file output (or in place): never over another model's (see the module doc)."""
    if not bundle.genai_config.present:
        return []
    changed = bundle.genai_config_changed and not verbatim
    if target.onto_input and not changed:
        return []  # in place and nothing in it changed: the file stays as it is (bytes, mtime, inode)
    source = bundle.model_path.parent / GENAI_CONFIG
    text = bundle.genai_config.dumps().encode() if changed else source.read_bytes()  # unchanged: the user's bytes
    dest = target.target_dir / GENAI_CONFIG
    if dest.exists() and not target.onto_input:
        if dest.is_file() and dest.read_bytes() == text:
            return []  # already there
        if bundle.genai_config_changed:
            raise ModelSaveError(f"{dest}: belongs to the folder the output goes into; the passes changed this "
                                 "model's genai_config.json and a file output never overwrites the one beside it "
                                 "(write to a new folder instead)")
        return []  # the folder's own config stays
    (staging / GENAI_CONFIG).write_bytes(text)
    return [GENAI_CONFIG]


def _write_files(bundle: ModelBundle, target: OutputTarget, verbatim: bool, weights: str,
                 graph_modified: bool = True) -> tuple[str | None, dict[str, str]]:
    """A file output, or in place: staged inside the target folder, committed file by file (journal, roll-back).
    In place with only genai_config.json changed, only that file is written."""
    target_dir, model_out = target.target_dir, target.model_out
    created: list[Path] = []
    try:
        make_dirs(target_dir, created)
        staging = new_staging(target_dir)
    except OSError as exc:
        remove_dirs(created)
        raise ModelSaveError(f"{target_dir}: cannot create output folder ({exc.strerror or exc})") from None
    try:
        if target.onto_input and not graph_modified and (bundle.model.ir_version or 0) <= MAX_IR_VERSION:
            names, referenced, used, unchanged = [], set(bundle.external_data_files), None, set()  # the config only
        elif verbatim:  # the model under its new name, its data files under the names the model references
            mode = carry_mode(weights)
            carry_file(bundle.model_path, staging / model_out.name, mode)
            names, referenced, carried = [model_out.name], set(bundle.external_data_files), []
            for name in bundle.external_data_files:
                if not same_file(bundle.model_path.parent / name, target_dir / name):
                    (staging / name).parent.mkdir(parents=True, exist_ok=True)
                    carried.append(carry_file(bundle.model_path.parent / name, staging / name, mode))
                    names.append(name)
            used, unchanged = summarize(carried), set(names)
        else:
            serialized = _serialize(bundle, staging, target, weights)
            names, referenced, used = list(serialized.names), serialized.referenced, serialized.weights
            unchanged = set(serialized.carried)
        names += _stage_config(bundle, target, verbatim, staging)
        # the model last: a reader never sees a model without its weights
        moves = [(staging / n, target_dir / n) for n in sorted(names, key=lambda n: n == model_out.name)]
        stale = [target_dir / n for n in sorted(companions(model_out.name) - set(names) - referenced)
                 if (target_dir / n).is_file()]
        for _, dest in moves:
            if dest.is_dir():
                raise ModelSaveError(f"{dest}: is a folder, cannot write a file there")
        files = _files_states(bundle, target, staging, names, unchanged, stale)
        commit_files(moves, stale, staging / (STAGING_PREFIX + "replaced"))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        remove_dirs(created)
        raise
    shutil.rmtree(staging, ignore_errors=True)
    return used, files


def _files_states(bundle: ModelBundle, target: OutputTarget, staging: Path, names: list[str], unchanged: set[str],
                  stale: list[Path]) -> dict[str, str]:
    """The staged files of a file output (or in place) against the input's, before they are committed (in place,
    the input's are the files they replace); a genai_config.json left as it was in the folder a file output lands in
    is compared too."""
    source_dir = bundle.model_path.parent

    def counterpart(name: str) -> Path:
        if name == target.model_out.name:
            return bundle.model_path
        return _input_config(bundle) if name == GENAI_CONFIG else source_dir / name

    written = [(n, staging / n) for n in names]
    config_out = target.target_dir / GENAI_CONFIG
    if (GENAI_CONFIG not in names and bundle.genai_config.present and not target.onto_input
            and config_out.is_file()):
        written.append((GENAI_CONFIG, config_out))
    return file_states(written, counterpart, carried=unchanged, removed=[p.name for p in stale])


def write_bundle(bundle: ModelBundle, output: str | os.PathLike | None, *, in_place: bool = False,
                 graph_modified: bool = True, unchanged: bool | None = None, weights: str = "reflink") -> SaveResult:
    """Write the bundle (see :func:`save_bundle`); returns what was written and how."""
    check_weights_mode(weights)
    target = output_target(bundle.model_path, bundle.folder, output, in_place=in_place)
    verbatim = copies_verbatim(bundle, graph_modified) if unchanged is None else unchanged
    if verbatim and target.onto_input:
        return SaveResult(bundle.model_path, True)  # nothing to write: the input already is the output
    try:
        if target.whole_folder:
            used, files = _write_folder(bundle, target, verbatim, weights)
        else:
            used, files = _write_files(bundle, target, verbatim, weights, graph_modified)
    except OSError as exc:
        raise ModelSaveError(f"{target.model_out}: cannot write ({exc.strerror or exc})") from None
    return SaveResult(target.model_out, verbatim, used, files)


def save_bundle(bundle: ModelBundle, output: str | os.PathLike | None, *, in_place: bool = False,
                graph_modified: bool = True, unchanged: bool | None = None, weights: str = "reflink") -> Path:
    """Write the bundle; returns the path of the written model file.

    ``output=None`` with ``in_place=True`` overwrites the input (atomically). Writing onto the input without
    ``in_place`` is refused, and so is an output folder inside the input folder (the copy would contain itself).

    Unchanged models are copied byte for byte instead of re-serialized ("unchanged" then holds at file level, not only
    for the graph). Say whether the graph was modified with ``graph_modified`` (e.g. ``PassResult.modified``; the
    default assumes it was) and the rest is decided here (:func:`copies_verbatim`); ``unchanged=True/False`` forces it.

    ``weights`` says how the input's external data reaches the output (see :mod:`rope_passes.io.weights`):
    "reflink" (default; a copy where the filesystem has no clones), "copy", "link" (hard link: editing one edits
    both), or "rewrite" (everything re-serialized into one data file, the layout of earlier versions).
    """
    return write_bundle(bundle, output, in_place=in_place, graph_modified=graph_modified, unchanged=unchanged,
                        weights=weights).path
