"""Path values: what every path option and path field is checked against before a command works (docs/RELIABILITY.md,
"Outputs" and "Command line"): a path value (not empty, no NUL, ``~`` expanded), a location something can be created
at, a folder option a command fills over several runs, and an input that must exist (a file or a folder to read).
What a command may write, and never overwrite, is :mod:`coupled_qk.output_dir`.

Level 0 of the layering: no torch and no project imports.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["check_location", "folder_value", "input_dir", "input_file", "input_path", "output_location", "path_value"]


def path_value(option: str, value) -> Path:
    """``Path(value)`` for a path option; ``ValueError`` naming ``option`` for ``None``, a non-string, an empty
    or blank string, or a NUL character (which the OS would reject with a traceback later).

    Args:
        option: how the user named the value, e.g. ``"--out-dir"`` or ``"TrainConfig.out_dir"``.
        value: a ``str`` or ``os.PathLike``.
    """
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise ValueError(f"{option}={value!r} must be a path (a string)")
    if not value.strip():
        raise ValueError(f"{option}={value!r} is empty; expected a path")
    if "\x00" in value:
        raise ValueError(f"{option}={value!r} contains a NUL character; expected a path")
    try:
        return Path(value).expanduser()
    except RuntimeError:  # "~someone" for a user that does not exist
        raise ValueError(f"{option}={value!r}: cannot expand {value.split('/')[0]!r} (no such user)") from None


def check_location(option: str, path: Path, is_file: bool = False) -> None:
    """Refuse ``path`` when it cannot be created: an ancestor is a file, or the nearest existing ancestor is
    not a writable folder (for a file, ``is_file``: its folder).

    Raises:
        ValueError: naming ``option``, ``path`` and the ancestor in the way (a broken link, a file, no write access).
    """
    ancestor = path.parent if (is_file or not path.exists()) else path
    while not ancestor.exists():
        if ancestor.is_symlink():  # a dangling link
            raise ValueError(f"{option}={str(path)!r}: {ancestor} is a broken symbolic link")
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"{option}={str(path)!r}: {ancestor} is a file, so nothing can be created under it")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"{option}={str(path)!r}: the folder {ancestor} is not writable")


def output_location(option: str, value) -> Path:
    """Check a folder option that a command creates or fills over several runs (a cache, a run root): not
    empty, not a file, creatable and writable. Its content is managed by the command's own checks.

    Raises:
        ValueError: naming ``option``.
    """
    path = folder_value(option, value)
    check_location(option, path)
    return path


def folder_value(option: str, value) -> Path:
    """A folder path (:func:`path_value`) that, where it exists, is a folder and not a file; whether it must exist or
    be creatable is the caller's to check.

    Raises:
        ValueError: naming ``option``, as :func:`path_value`, or for an existing file.
    """
    path = path_value(option, value)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option}={str(value)!r} is a file; expected a folder")
    return path


def input_path(option: str, value) -> Path:
    """An existing file or folder named by ``option``; ``ValueError``/``FileNotFoundError`` naming it otherwise."""
    path = path_value(option, value)
    if not path.exists():
        raise FileNotFoundError(f"{option}={str(value)!r} does not exist")
    return path


def input_file(option: str, value) -> Path:
    """An existing readable regular *file*; refuses a folder, a pipe, socket or device, a missing path and an empty
    value, naming ``option``."""
    path = input_path(option, value)
    if path.is_dir():
        raise ValueError(f"{option}={str(value)!r} is a folder; expected a file")
    if not path.is_file():  # a named pipe would block the reader, a device never end
        raise ValueError(f"{option}={str(value)!r} is not a regular file (a pipe, socket or device); expected a file")
    if not os.access(path, os.R_OK):
        raise ValueError(f"{option}={str(value)!r} is not readable")
    return path


def input_dir(option: str, value) -> Path:
    """An existing readable *folder*; refuses a file, a missing path and an empty value, naming ``option``."""
    path = input_path(option, value)
    if not path.is_dir():
        raise ValueError(f"{option}={str(value)!r} is a file; expected a folder")
    if not os.access(path, os.R_OK | os.X_OK):
        raise ValueError(f"{option}={str(value)!r} is not readable")
    return path
