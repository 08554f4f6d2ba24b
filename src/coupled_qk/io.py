"""Crash-safe file writes shared by the token cache, the MQAR cache, checkpoints and results."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def fsync_dir(path: str | Path) -> None:
    """Flush a directory entry to disk (best effort: some file systems refuse ``fsync`` on folders)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object]) -> None:
    """Create or replace ``path`` atomically: ``write(f)`` fills a temporary file in the same folder, which is
    flushed, ``fsync``-ed and renamed over ``path`` (``os.replace``). A crash or exception at any point leaves
    either the old file or the new one under ``path``, never a partial one; the temporary file is removed
    on exceptions (a hard kill may leave a hidden ``.<name>.*.tmp`` file, which readers ignore)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_text_atomic(path: str | Path, text: str) -> None:
    """:func:`atomic_write` of UTF-8 ``text``."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))
