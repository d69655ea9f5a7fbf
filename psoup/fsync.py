"""File-system operations shared by the write-ahead log, the archive and the importer:
a rename or unlink is only durable once its directory is fsync'ed, and what lives in a
data directory (tuples, queries) is readable by its owner only, whatever the umask."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO


def fsync_dir(directory: str | Path) -> None:
    """Make the renames and unlinks in `directory` durable (fsync the directory)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_whole(path: Path, write: Callable[[IO[bytes]], object],
                private: bool = False, fsync: bool = True) -> None:
    """Write a file whole: `write(f)` fills `path`.tmp (created with `file_mode`), which
    is flushed, fsync'ed and renamed onto `path`, so `path` never holds part of it. The
    caller fsyncs the directory to make the rename durable (or, with `fsync=False`, makes
    the file and the rename durable later, with many others: `sync_file_system`). A
    write that fails removes the .tmp."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, file_mode(private))
    try:
        with open(fd, "wb") as f:
            write(f)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
    except BaseException:
        # a file cut short by a full disk would hold on to what space it took
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def sync_file_system(path: str | Path) -> None:
    """Make everything written to the file system that holds `path` durable, files and
    renames alike: one syncfs(2) where the C library has it, else sync(2). For many
    files at once (a history job's hundreds): an fsync a file and a folder is a journal
    commit each, in a row.

    Raises:
        OSError: syncfs failed.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if not hasattr(libc, "syncfs"):
            os.sync()
        elif libc.syncfs(fd) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"syncfs of {path}: {os.strerror(errno)}")
    finally:
        os.close(fd)


def make_dir(path: str | Path, private: bool = False) -> None:
    """`mkdir -p path`; a private directory is owner-only (0700), also one that existed
    (made by an older version), and so is every folder it creates on the way. A umask
    can only remove permissions, so the mode asked for at creation is an upper bound."""
    path = Path(path)
    if private:
        missing = []
        for folder in [path, *path.parents]:       # up to the first that exists
            if folder.exists():
                break
            missing.append(folder)
        for folder in reversed(missing):
            folder.mkdir(mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)
    else:
        path.mkdir(parents=True, exist_ok=True, mode=0o777)


def file_mode(private: bool) -> int:
    """The mode to create a file with: owner read/write only when private."""
    return 0o600 if private else 0o666


def prune_dir(folder: Path, parent: Path) -> None:
    """After files under `folder` (a child of `parent`) were removed: remove its empty
    subfolders, then `folder` itself if empty, each removal made durable (fsync of the
    folder, then of `parent`). O(subfolders)."""
    if folder.is_dir():
        for sub in folder.iterdir():
            if sub.is_dir() and not any(sub.iterdir()):
                sub.rmdir()
        fsync_dir(folder)
        if not any(folder.iterdir()):
            folder.rmdir()
    fsync_dir(parent)
