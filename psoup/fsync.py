"""Durable directory operations shared by the write-ahead log, the archive and the
importer: a rename or unlink is only durable once its directory is fsync'ed."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(directory: str | Path) -> None:
    """Make the renames and unlinks in `directory` durable (fsync the directory)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
