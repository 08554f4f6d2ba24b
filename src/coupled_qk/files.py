"""Crash-safe file writes shared by the token cache, the MQAR cache, checkpoints and results.

Files and folders made here get the modes the user's umask gives (``0666 & ~umask`` and ``0777 & ~umask``),
like every other tool, not the private ``0600``/``0700`` of :mod:`tempfile`. A failed write is re-raised as an
``OSError`` naming the file and the free space on its device, so a full disk reads as a full disk.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def current_umask() -> int:
    """The process's umask (read without changing it where ``/proc`` allows, else set and restored)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """Mode of a new regular file under the current umask (``0o644`` under the usual ``022``)."""
    return 0o666 & ~current_umask()


def dir_mode() -> int:
    """Mode of a new folder under the current umask (``0o755`` under the usual ``022``)."""
    return 0o777 & ~current_umask()


def make_temp_dir(parent: str | Path, prefix: str) -> Path:
    """A new uniquely named folder in ``parent`` with the umask's mode (``tempfile.mkdtemp`` makes ``0700``)."""
    path = Path(tempfile.mkdtemp(dir=parent, prefix=prefix))
    os.chmod(path, dir_mode())
    return path


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


def write_error(path: str | Path, exc: BaseException) -> OSError:
    """An ``OSError`` for a failed write of ``path`` naming the file, the cause and the free space there.

    Libraries report a full disk in their own words (NumPy: "90918 requested and 6144 written", PyTorch:
    "PytorchStreamWriter failed writing file"); this message says what happened in the user's terms.
    """
    path = Path(path)
    try:
        free = shutil.disk_usage(path.parent if path.parent.exists() else ".").free
        where = f"; {free / 2**20:,.1f} MiB free on that device"
        if free < 2**20:
            where += " (the disk is full)"
    except OSError:
        where = ""
    code = getattr(exc, "errno", None) or (
        errno.ENOSPC if re.search(r"os error 28\b|No space left", str(exc)) else None
    )
    message = f"cannot write {path} ({exc}){where}"
    return OSError(code, message) if code else OSError(message)  # not "[Errno 0] ..." for a library's own error


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object]) -> None:
    """Create or replace ``path`` atomically: ``write(f)`` fills a temporary file in the same folder, which is
    flushed, ``fsync``-ed and renamed over ``path`` (``os.replace``). A crash or exception at any point leaves
    either the old file or the new one under ``path``, never a partial one; the temporary file is removed
    on exceptions (a hard kill may leave a hidden ``.<name>.*.tmp`` file, which readers ignore).

    Raises:
        FileNotFoundError: the folder of ``path`` does not exist (naming ``path`` and the folder).
        OSError: the write failed (see :func:`write_error`: the message names the file and the free space).
    """
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except FileNotFoundError:  # named by the target, not by our hidden temporary file
        raise FileNotFoundError(f"cannot write {path}: the folder {path.parent} does not exist") from None
    except OSError as exc:
        raise write_error(path, exc) from exc
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) or (isinstance(exc, RuntimeError) and "writ" in str(exc).lower()):
            raise write_error(path, exc) from exc
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_text_atomic(path: str | Path, text: str) -> None:
    """:func:`atomic_write` of UTF-8 ``text``."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))
