"""What the files of an output are, by content: which differ from the input (bytes compared), and which input an
existing output folder was made from (a hash of that input, recorded in the output model's metadata).

* :func:`same_bytes` / :func:`file_states`: each file a write produced, compared byte for byte with the input's
  file it stands for: ``changed``, ``same``, ``new`` (the input has none), ``removed`` (a file of ours the write
  deleted); :func:`describe_files` is the one sentence every summary prints about them.
* :func:`input_identity` (sha256 of the input's model file, ``genai_config.json`` and samples of its data files),
  recorded by a save in the output's ``metadata_props[INPUT_METADATA_KEY]``; :func:`made_from` reads it back
  (without loading the graph) to tell whether an existing output folder is an earlier output of the same input (see
  :func:`rope_passes.io.paths.check_replaceable_folder`).
"""

from __future__ import annotations

import functools
import hashlib
import mmap
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from rope_passes.config import GENAI_CONFIG
from rope_passes.io.load import DATA_FILE

#: metadata_props key of a written model: :func:`input_identity` of the input it was made from
INPUT_METADATA_KEY = "rope_passes.input_sha256"
#: the states of an output file, against the input
STATES = ("changed", "new", "removed", "same")
_CHUNK = 1 << 20


def same_bytes(a: Path, b: Path) -> bool:
    """``a`` and ``b`` hold the same bytes (one file, or equal sizes and equal contents)."""
    try:
        if os.path.samefile(a, b):
            return True
        if a.stat().st_size != b.stat().st_size:
            return False
        with open(a, "rb") as fa, open(b, "rb") as fb:
            while True:
                ca, cb = fa.read(_CHUNK), fb.read(_CHUNK)
                if ca != cb:
                    return False
                if not ca:
                    return True
    except OSError:
        return False


def file_states(written: Iterable[tuple[str, Path]], counterpart: Callable[[str], Path | None], *,
                carried: Iterable[str] = (), removed: Iterable[str] = ()) -> dict[str, str]:
    """name -> state for the files of an output: ``written`` (name, where its new bytes are now), each compared with
    ``counterpart(name)`` (the input's file it stands for; None or absent: ``new``); ``carried``: files brought over
    from the input unchanged (copy, reflink, hard link: ``same`` by construction); ``removed``: files of ours the
    write deletes."""
    states = {name: "same" for name in carried}
    for name, path in written:
        if name in states:
            continue
        source = counterpart(name)
        states[name] = "new" if source is None or not source.is_file() else (
            "same" if same_bytes(path, source) else "changed")
    states.update({name: "removed" for name in removed})
    return dict(sorted(states.items(), key=lambda kv: _order(kv[0])))


def _order(name: str) -> tuple[int, str]:
    base = name.rsplit("/", 1)[-1]
    rank = 0 if base.endswith(".onnx") else 1 if base == GENAI_CONFIG else 2 if ".onnx" in base else 3
    return rank, name


def _names(names: list[str], limit: int = 0) -> str:
    shown = names if not limit or len(names) <= limit else names[:limit]
    text = ", ".join(shown)
    return text + (f" and {len(names) - len(shown)} more" if len(shown) < len(names) else "")


def describe_files(states: Mapping[str, str]) -> str:
    """The one sentence about an output's files: ``model.onnx, genai_config.json differ from the input;
    model.onnx.rope.data is new; model.onnx.data and 2 more are the input's bytes``."""
    if not states:
        return "nothing written: the output is the input, unchanged"
    by = {s: [n for n, st in states.items() if st == s] for s in STATES}
    parts = []
    if by["changed"]:
        parts.append(f"{_names(by['changed'])} differ{'s' if len(by['changed']) == 1 else ''} from the input")
    if by["new"]:
        parts.append(f"{_names(by['new'])} {'is' if len(by['new']) == 1 else 'are'} new")
    if by["removed"]:
        parts.append(f"{_names(by['removed'])} removed")
    if by["same"]:
        parts.append(("all " if len(by["same"]) == len(states) and len(states) > 1 else "")
                     + f"{_names(by['same'], 3)} {'is' if len(by['same']) == 1 else 'are'} the input's bytes")
    return "; ".join(parts)


def changed_files(states: Mapping[str, str]) -> list[str]:
    """The files of an output that are not the input's bytes (changed, new or removed)."""
    return [n for n, s in states.items() if s != "same"]


# ---------------------------------------------------------------------------------------------------------------
# which input an output was made from
# ---------------------------------------------------------------------------------------------------------------
def input_identity(model_path: Path, config_dir: Path | None = None, data_names: list[str] | None = None) -> str:
    """sha256 over the input's model file and its ``genai_config.json`` (in ``config_dir``, default the model's
    folder; absent counts as empty), whole, and over each data file of the model beside it (``model.onnx.data``,
    ``model.onnx_data*``, ``model.onnx.rope.data``...) by its size and :data:`SAMPLES` blocks spread over it (two
    fine-tunes of one graph differ in their weights only; reading gigabytes of weights whole would cost more than
    the run): what identifies "the same input". ``data_names``: the data files to read (default: :func:`data_files`).
    """
    config = (config_dir or model_path.parent) / GENAI_CONFIG
    parts = [(str(model_path), _stamp(model_path), False), (str(config), _stamp(config), False)]
    names = data_files(model_path) if data_names is None else data_names
    parts += [(str(model_path.parent / n), _stamp(model_path.parent / n), True) for n in names]
    return _identity(tuple(parts))


def data_files(model_path: Path) -> list[str]:
    """The names of the data files beside a model that are named after it (:data:`rope_passes.io.load.DATA_FILE`)."""
    try:
        return sorted(p.name for p in model_path.parent.iterdir()
                      if p.is_file() and data_file_of(p.name) == model_path.name)
    except OSError:
        return []


#: blocks of a data file read for :func:`input_identity` (64 KiB each, evenly spread, the last one ending the file)
SAMPLES = 16
_SAMPLE = 64 << 10


def data_file_of(name: str) -> str | None:
    """The model file name a data file's name belongs to (``model.onnx.data`` -> ``model.onnx``), else None."""
    match = DATA_FILE.match(name)
    return match["model"] if match else None


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        s = path.stat()
        return s.st_ino, s.st_size, s.st_mtime_ns
    except OSError:
        return None


@functools.lru_cache(maxsize=64)
def _identity(parts: tuple[tuple[str, tuple[int, int, int] | None, bool], ...]) -> str:
    digest = hashlib.sha256()
    for path, stamp, sampled in parts:
        digest.update(b"\0file\0" + (Path(path).name.encode() if sampled else b""))
        if stamp is None:
            continue
        with open(path, "rb") as f:
            if not sampled:
                while chunk := f.read(_CHUNK):
                    digest.update(chunk)
                continue
            size = stamp[1]
            digest.update(size.to_bytes(8, "little"))
            for i in range(SAMPLES):
                f.seek(max(0, (size - _SAMPLE) * i // (SAMPLES - 1)))
                digest.update(f.read(_SAMPLE))
    return digest.hexdigest()


def metadata_props(path: Path) -> dict[str, str]:
    """A model file's ``metadata_props`` read from its top-level protobuf fields (the graph is skipped, not parsed:
    cheap for any model size); {} for a file that is not a readable ONNX model."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _walk_metadata(data)
    except (OSError, ValueError, IndexError):
        return {}


def _varint(data, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(data, start: int, end: int):
    """(field number, wire type, value or (start, end) of a length-delimited field) of one protobuf message."""
    pos = start
    while pos < end:
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, wire, value
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > end:
                raise ValueError("truncated")
            yield number, wire, (pos, pos + length)
            pos += length
        else:
            raise ValueError(f"wire type {wire}")


def _walk_metadata(data) -> dict[str, str]:
    props: dict[str, str] = {}
    for number, wire, span in _fields(data, 0, len(data)):
        if number == 14 and wire == 2:  # ModelProto.metadata_props: StringStringEntryProto {key = 1, value = 2}
            entry = {n: bytes(data[s:e]).decode("utf-8", "replace") for n, w, (s, e) in _fields(data, *span)
                     if w == 2 and n in (1, 2)}
            props[entry.get(1, "")] = entry.get(2, "")
    return props


def made_from(output_model: Path, model_path: Path, config_dir: Path | None, output_config: Path) -> bool:
    """``output_model`` is an earlier output of the input ``model_path`` (+ its genai_config.json and data files): it
    records that input's :func:`input_identity`, or (an output copied byte for byte, which records nothing) it, the
    ``output_config`` and the data files beside it are the input's (the same identity)."""
    recorded = metadata_props(output_model).get(INPUT_METADATA_KEY)
    mine = input_identity(model_path, config_dir)
    if recorded is not None:
        return recorded == mine
    return output_model.is_file() and input_identity(output_model, output_config.parent,
                                                     data_files(model_path)) == mine
