"""Disk primitives for writing outputs: staging folders, all-or-nothing commits, copies as cheap as ``cp``.

* Staging folders are named ``.rope-passes-<pid>-<random>``; one whose process is gone (a killed run) is removed by
  the next run that stages in the same folder (:func:`new_staging`).
* :func:`commit_files` moves staged files into place with a journal: a file it replaces is first moved aside into
  the staging folder, and any failure (or Ctrl-C) puts every replaced file back. :func:`swap_folder` replaces a whole
  folder the same way. Ctrl-C during a commit is held until the commit (or its roll-back) is done.
* :func:`carry_file` brings an input file to the output unchanged: ``reflink`` (a copy-on-write clone, where the
  filesystem has them), ``link`` (a hard link: the two names are one file, editing one edits both), or ``copy`` (a
  streaming, sparse-aware copy with ``copy_file_range``); it falls back to ``copy`` and says which it used.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import stat
import time
from pathlib import Path

from rope_passes.interrupts import held_interrupts

STAGING_PREFIX = ".rope-passes-"
_STAGING_PID = re.compile(re.escape(STAGING_PREFIX) + r"(\d+)-")
#: when this process started (near enough: when this module was imported)
_STARTED = time.time()

#: bytes per copy_file_range / read call of a streaming copy
_CHUNK = 64 << 20
#: ioctl FICLONE (linux/fs.h): make dst a copy-on-write clone of src
_FICLONE = 0x40049409


# ------------------------------------------------------------------------------------------------------------
# staging folders
# ------------------------------------------------------------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def is_stale_staging(path: Path) -> bool:
    """A staging folder no running process owns: its pid is gone, or (no pid in the name) it predates this process."""
    match = _STAGING_PID.match(path.name)
    if match:
        pid = int(match.group(1))
        return pid != os.getpid() and not _pid_alive(pid)
    try:
        return path.lstat().st_mtime < _STARTED
    except OSError:
        return False


def clean_stale_staging(folder: Path) -> None:
    """Remove the staging folders that killed runs left in ``folder``."""
    try:
        entries = [p for p in folder.iterdir() if p.name.startswith(STAGING_PREFIX)]
    except OSError:
        return
    for path in entries:
        if is_stale_staging(path):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()


def staging_name(folder: Path) -> Path:
    """A fresh staging path in ``folder`` (not created)."""
    return folder / f"{STAGING_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"


def new_staging(folder: Path) -> Path:
    """Create a staging folder in ``folder`` (after removing stale ones there)."""
    clean_stale_staging(folder)
    path = staging_name(folder)
    path.mkdir()
    return path


def make_dirs(folder: Path, created: list[Path]) -> None:
    """``mkdir -p``, appending each folder it creates to ``created`` (outermost first), to remove them on failure."""
    missing = []
    p = folder
    while not p.exists() and not p.is_symlink() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:  # another thread or process made it since the check: theirs, not ours to remove
            if not d.is_dir():
                raise
            continue
        created.append(d)


def remove_dirs(created: list[Path]) -> None:
    """Undo :func:`make_dirs` (innermost first), leaving any folder something else has filled."""
    for d in reversed(created):
        with contextlib.suppress(OSError):
            d.rmdir()


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


# ------------------------------------------------------------------------------------------------------------
# commits
# ------------------------------------------------------------------------------------------------------------


def is_read_only(path: Path) -> bool:
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return not (mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)) or not os.access(path, os.W_OK)


def commit_files(moves: list[tuple[Path, Path]], removals: list[Path], backup_dir: Path) -> None:
    """Move each staged ``src`` to ``dest`` and remove ``removals``, all or nothing.

    A ``dest`` that exists is moved into ``backup_dir`` first and its permission bits are given to the new file; on
    any failure every move is undone and every backup put back. ``backup_dir`` (inside the staging folder, same
    filesystem) is the caller's to remove afterwards.
    """
    backup_dir.mkdir(exist_ok=True)
    journal: list[tuple[Path, Path | None, bool]] = []  # (dest, its backup, new file placed)
    with held_interrupts():
        try:
            for i, (src, dest) in enumerate([*moves, *((None, r) for r in removals)]):
                backup = None
                if dest.exists() or dest.is_symlink():
                    backup = backup_dir / f"{i}-{dest.name}"
                    if src is not None and not dest.is_symlink() and src.stat().st_nlink == 1:  # not a hard link
                        os.chmod(src, stat.S_IMODE(dest.stat().st_mode))
                    os.replace(dest, backup)
                journal.append((dest, backup, False))
                if src is not None:
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(src, dest)
                    journal[-1] = (dest, backup, True)
        except BaseException:
            for dest, backup, placed in reversed(journal):
                with contextlib.suppress(OSError):
                    if placed:
                        _remove(dest)
                    if backup is not None:
                        os.replace(backup, dest)
            raise


def swap_folder(staged: Path, target: Path) -> None:
    """Put the folder ``staged`` at ``target``, replacing whatever folder is there, all or nothing."""
    with held_interrupts():
        if not target.exists():
            os.replace(staged, target)
            return
        old = staging_name(target.parent)
        os.replace(target, old)
        try:
            os.replace(staged, target)
        except BaseException:
            os.replace(old, target)
            raise
        shutil.rmtree(old, ignore_errors=True)


# ------------------------------------------------------------------------------------------------------------
# carrying files unchanged
# ------------------------------------------------------------------------------------------------------------


def _copy_range(src_fd: int, dst_fd: int, start: int, end: int) -> None:
    offset = start
    try:
        while offset < end:
            n = os.copy_file_range(src_fd, dst_fd, min(_CHUNK, end - offset), offset, offset)
            if n == 0:
                break
            offset += n
        if offset >= end:
            return
    except OSError as exc:  # EXDEV (old kernels), ENOSYS, EINVAL on some filesystems: plain reads and writes
        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM):
            raise
    while offset < end:
        chunk = os.pread(src_fd, min(_CHUNK, end - offset), offset)
        if not chunk:
            break
        written = 0
        while written < len(chunk):
            written += os.pwrite(dst_fd, memoryview(chunk)[written:], offset + written)
        offset += len(chunk)


def _copy_bytes(src_fd: int, dst_fd: int, size: int) -> None:
    """Copy ``size`` bytes, skipping holes (a sparse input stays sparse and costs no reads of its zeros)."""
    position = 0
    while position < size:
        try:
            start = os.lseek(src_fd, position, os.SEEK_DATA)
            end = os.lseek(src_fd, start, os.SEEK_HOLE)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                break  # only a hole is left
            start, end = position, size  # no SEEK_DATA here: copy the rest
        _copy_range(src_fd, dst_fd, start, min(end, size))
        position = end
    os.ftruncate(dst_fd, size)


def _reflink(src_fd: int, dst_fd: int) -> bool:
    try:
        import fcntl

        fcntl.ioctl(dst_fd, _FICLONE, src_fd)
        return True
    except (ImportError, OSError):
        return False


def copy_file(src: Path, dst: Path, *, reflink: bool = True) -> str:
    """Copy ``src`` to a new file ``dst`` with its permission bits and times; returns "reflink" or "copy"."""
    with open(src, "rb") as fsrc, open(dst, "xb") as fdst:
        size = os.fstat(fsrc.fileno()).st_size
        used = "reflink" if reflink and size and _reflink(fsrc.fileno(), fdst.fileno()) else "copy"
        if used == "copy":
            _copy_bytes(fsrc.fileno(), fdst.fileno(), size)
    shutil.copystat(src, dst)
    return used


def carry_file(src: Path, dst: Path, mode: str = "reflink") -> str:
    """Bring ``src`` to the new path ``dst`` unchanged: mode "reflink", "link" or "copy"; returns the mode used."""
    if mode == "link":
        try:
            os.link(src, dst)
            return "link"
        except OSError as exc:  # another filesystem, or links not supported: copy
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
    return copy_file(src, dst, reflink=mode != "copy")


def carry_tree(src: Path, dst: Path, mode: str = "reflink") -> None:
    """A folder, file by file with :func:`carry_file` (symlinks kept as links). Files already at their place under
    ``dst`` (a data file of the model in a subfolder, staged by the serializer) are left as they are."""

    def copy(s: str, d: str) -> None:
        if not os.path.lexists(d):
            carry_file(Path(s), Path(d), mode)

    shutil.copytree(src, dst, symlinks=True, copy_function=copy, dirs_exist_ok=True)
