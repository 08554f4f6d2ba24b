"""Output safety, one rule in one place: what a command may write, checked before any work starts.

The rule (docs/RELIABILITY.md, "Outputs"): no command overwrites, truncates or deletes a file that it did not
write in this same run, unless the user passed ``--overwrite`` or the command's documented resume path applies
(an experiment folder regenerating its own reports after reusing its runs; ``train --resume``). Concretely:

- every output path is checked when the command starts, before any training or measurement: an empty value,
  a file where a folder is expected (and the reverse), a location under a file or without write permission
  are refused with one line naming the option (:func:`output_file`, :class:`OutputDir`);
- an output folder is claimed with the *layout* of what the command writes there (glob patterns of top-level
  names); a folder holding anything else (a finished training run given to ``mqar --out-dir``, a home folder,
  the current directory with a user's files) is refused, even with ``--overwrite``, which never mixes a run's
  files into a folder of someone else's;
- a file that exists before this run is replaced only with ``--overwrite`` or when it matches the command's
  *rewrite* patterns (its documented resume path); the check is made at claim time, so a command can also
  check its predictable file names up front (:meth:`OutputDir.claim` with ``check_only=True``);
- every write is atomic (a temporary file in the same folder, ``fsync``, ``os.replace``) through
  :mod:`coupled_qk.io`, figures included (:meth:`OutputDir.write_with`).

An :class:`OutputDir` is ``os.PathLike``, so code that builds paths with ``Path(out_dir) / name`` keeps working
when it is handed one; writers that know about it route their files through its claim.

Level 0 of the layering (docs/DESIGN.md): no torch and no project imports but :mod:`coupled_qk.io`.
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from coupled_qk.io import atomic_write, fsync_dir, write_text_atomic

__all__ = ["OutputDir", "OutputRefused", "input_dir", "input_file", "input_path", "output_file", "path_value"]

IGNORED = (".*.tmp*",)
"""Entries of an output folder that are never counted as someone else's: our temporary files (a run folder's own
hidden entries, its lock, are in its layout: ``training.run_folder.check_out_dir``)."""


class OutputRefused(ValueError):
    """An output location was refused (the message names the option, the path and what to do)."""


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


def _check_location(option: str, path: Path, is_file: bool = False) -> None:
    """Refuse ``path`` when it cannot be created: an ancestor is a file, or the nearest existing ancestor is
    not a writable folder (for a file: its folder)."""
    ancestor = path.parent if (is_file or not path.exists()) else path
    while not ancestor.exists():
        if ancestor.is_symlink():  # a dangling link
            raise ValueError(f"{option}={str(path)!r}: {ancestor} is a broken symbolic link")
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"{option}={str(path)!r}: {ancestor} is a file, so nothing can be created under it")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"{option}={str(path)!r}: the folder {ancestor} is not writable")


def output_file(option: str, value, *, overwrite: bool = False, suffixes: Iterable[str] = ()) -> Path:
    """Check an output *file* option before any work: not empty, not a folder, in an existing writable folder
    (a file's folder is not created for it, unlike an output folder's missing parents), and not an existing
    file unless ``overwrite``. Nothing is created.

    Args:
        option: the option's name for the message (``"--json"``).
        value: the path given.
        overwrite: allow replacing an existing file (``--overwrite``).
        suffixes: allowed suffixes (``(".json",)``); empty means any.

    Returns:
        The path.

    Raises:
        ValueError: naming ``option``: empty value, a folder, an ancestor that is a file, a folder that does not
            exist, an unwritable folder, a wrong suffix, or an existing file without ``overwrite``
            (:class:`OutputRefused`).
    """
    path = path_value(option, value)
    suffixes = tuple(suffixes)
    if path.is_dir():
        raise ValueError(f"{option}={str(value)!r} is a folder; expected a file name")
    if str(value).endswith(os.sep):
        raise ValueError(f"{option}={str(value)!r} ends with {os.sep!r}, so it names a folder; expected a file name")
    if suffixes and path.suffix.lower() not in suffixes:
        raise ValueError(f"{option}={str(value)!r}: expected a file ending in {' or '.join(suffixes)}")
    _check_location(option, path, is_file=True)
    if not path.parent.is_dir():
        raise ValueError(
            f"{option}={str(value)!r}: the folder {path.parent} does not exist; create it first or choose another path"
        )
    if path.exists() and not overwrite:
        raise OutputRefused(
            f"{option}={str(value)!r} already exists; pass --overwrite to replace it or choose another name"
        )
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{option}={str(value)!r} is not writable")
    return path


def input_path(option: str, value) -> Path:
    """An existing file or folder named by ``option``; ``ValueError``/``FileNotFoundError`` naming it otherwise."""
    path = path_value(option, value)
    if not path.exists():
        raise FileNotFoundError(f"{option}={str(value)!r} does not exist")
    return path


def input_file(option: str, value) -> Path:
    """An existing readable *file*; refuses a folder, a missing path and an empty value, naming ``option``."""
    path = input_path(option, value)
    if path.is_dir():
        raise ValueError(f"{option}={str(value)!r} is a folder; expected a file")
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


def _matches(name: str, is_dir: bool, patterns: Iterable[str]) -> bool:
    """Whether a top-level entry matches a layout pattern (``"x/"`` or ``"*/"`` match folders only)."""
    for pattern in patterns:
        if pattern.endswith("/"):
            if is_dir and fnmatch.fnmatchcase(name, pattern[:-1]):
                return True
        elif fnmatch.fnmatchcase(name, pattern):
            return True
    return False


class OutputDir(os.PathLike):
    """A claimed output folder: checked when constructed (before the work), written through :meth:`claim`.

    Args:
        value: the folder (``str`` or path); created on the first write, not here.
        option: the option's name for messages (``"--out-dir"``).
        overwrite: ``--overwrite``: existing files the command writes may be replaced (files outside the
            layout are still refused; nothing is ever deleted).
        layout: glob patterns of the top-level names the command writes or expects in the folder (``"x/"``
            for a folder). Empty means the folder must be empty or missing.
        rewrite: glob patterns (relative paths) of files the command regenerates on a rerun (its documented
            resume path): replaced without ``overwrite``.
        what: a few words saying what the command writes, for the messages (``"an MQAR sweep"``).

    Raises:
        ValueError: naming ``option``: empty value, a file, not creatable or not writable; an existing folder
            holding entries outside ``layout`` (:class:`OutputRefused`, listing up to five of them).
    """

    def __init__(
        self,
        value,
        option: str = "--out-dir",
        *,
        overwrite: bool = False,
        layout: Iterable[str] = (),
        rewrite: Iterable[str] = (),
        what: str = "this command's output",
    ):
        self.option = option
        self.path = path_value(option, value)
        self.overwrite = bool(overwrite)
        self.layout = tuple(layout)
        self.rewrite = tuple(rewrite)
        self.what = what
        self.written: list[Path] = []
        if self.path.exists() and not self.path.is_dir():
            raise ValueError(f"{option}={str(value)!r} is a file; expected a folder")
        _check_location(option, self.path)
        if self.path.is_dir():
            foreign = self.foreign_entries()
            if foreign:
                shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
                raise OutputRefused(
                    f"{option}={str(value)!r} holds files that {what} does not write ({shown}); nothing was "
                    "changed: choose an empty or new folder"
                )

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"OutputDir({str(self.path)!r}, option={self.option!r}, overwrite={self.overwrite})"

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    def foreign_entries(self) -> list[str]:
        """Top-level names in the folder that match neither the layout nor the ignored names (sorted)."""
        out = []
        for entry in sorted(os.scandir(self.path), key=lambda e: e.name):
            if _matches(entry.name, False, IGNORED):
                continue
            if not _matches(entry.name, entry.is_dir(), self.layout):
                out.append(entry.name + ("/" if entry.is_dir() else ""))
        return out

    def claim(self, name: str | Path, *, check_only: bool = False) -> Path:
        """The path of ``name`` (relative to the folder) after checking that it may be written now.

        Allowed: a new file; a file this object already wrote; with ``overwrite`` or a ``rewrite`` match, an
        existing file. ``check_only`` checks without recording (for names known before the work).

        Raises:
            OutputRefused: an existing file not written in this run, without ``--overwrite`` or resume path.
            ValueError: ``name`` is absolute or leaves the folder, or an existing folder has that name.
        """
        rel = Path(name)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            raise ValueError(f"output name {str(name)!r} must be a relative path inside {self.path}")
        path = self.path / rel
        if path.is_dir():
            raise OutputRefused(f"{self.option}: {path} is a folder; cannot write a file there")
        if (
            path.exists()
            and path not in self.written
            and not self.overwrite
            and not any(fnmatch.fnmatchcase(rel.as_posix(), p) for p in self.rewrite)
        ):
            raise OutputRefused(
                f"{path} already exists and was not written by this run; pass --overwrite to "
                f"replace it, or choose another {self.option}"
            )
        if not check_only and path not in self.written:
            self.written.append(path)
        return path

    def claim_existing(self) -> None:
        """Check up front that every file already in the folder may be replaced (``--overwrite`` or a rewrite
        pattern): for commands whose file names are known only after the work (figures per checkpoint), so
        that a folder holding an earlier output is refused before any work, not halfway through writing.

        Raises:
            OutputRefused: naming the first such file.
        """
        if not self.path.is_dir():
            return
        for entry in sorted(os.scandir(self.path), key=lambda e: e.name):
            if entry.is_file() and not _matches(entry.name, False, IGNORED):
                self.claim(entry.name, check_only=True)

    def _prepare(self, name) -> Path:
        path = self.claim(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def write_text(self, name: str | Path, text: str) -> Path:
        """Claim ``name`` and write UTF-8 ``text`` atomically; returns the path."""
        path = self._prepare(name)
        write_text_atomic(path, text)
        return path

    def write_json(self, name: str | Path, obj, indent: int = 2) -> Path:
        """Claim ``name`` and write ``obj`` as JSON (trailing newline) atomically; returns the path."""
        return self.write_text(name, json.dumps(obj, indent=indent, default=str) + "\n")

    def write_bytes(self, name: str | Path, data: bytes) -> Path:
        """Claim ``name`` and write ``data`` atomically; returns the path."""
        path = self._prepare(name)
        atomic_write(path, lambda f: f.write(data))
        return path

    def write_with(self, name: str | Path, draw: Callable[[Path], object]) -> Path:
        """Claim ``name``; ``draw(tmp)`` writes a temporary file in the same folder (same suffix, so
        ``savefig`` picks the format), which is then renamed over ``name``. On any exception the temporary
        file is removed and ``name`` is untouched.
        """
        path = self._prepare(name)
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
        try:
            draw(tmp)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(path.parent)
        return path


def as_output_dir(out_dir, option: str = "out_dir", **claim) -> OutputDir:
    """``out_dir`` itself when it already is an :class:`OutputDir`, else a new claim of it (``claim`` options)."""
    if isinstance(out_dir, OutputDir):
        return out_dir
    return OutputDir(out_dir, option, **claim)


def output_location(option: str, value) -> Path:
    """Check a folder option that a command creates or fills over several runs (a cache, a run root): not
    empty, not a file, creatable and writable. Its content is managed by the command's own checks.

    Raises:
        ValueError: naming ``option``.
    """
    path = path_value(option, value)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option}={str(value)!r} is a file; expected a folder")
    _check_location(option, path)
    return path
