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
- a file that exists before this run is replaced only when it is recognisably this command's earlier output
  (:data:`RECORD`: every file a command writes is recorded with the command and its SHA-256 in a hidden file of
  its folder) and ``--overwrite`` is given or it matches the command's *rewrite* patterns (its documented resume
  path); a file recorded as another command's output is never replaced, an unrecorded or since-edited one only
  with ``--overwrite``; the check is made at claim time, so a command can also check its predictable file names
  up front (:meth:`OutputDir.claim` with ``check_only=True``);
- nothing is ever written into a training run's folder (:func:`run_folder_of`), except under its ``glue/`` folder:
  a run holds only its own files (``eval RUN --json RUN/config.json --overwrite`` replaced the run's config, and
  any other file there makes the run refuse ``--resume``), even with ``--overwrite``;
- every write is atomic (a temporary file in the same folder, ``fsync``, ``os.replace``) through
  :mod:`coupled_qk.files`, figures included (:meth:`OutputDir.write_with`).

An :class:`OutputDir` is ``os.PathLike``, so code that builds paths with ``Path(out_dir) / name`` keeps working
when it is handed one; writers that know about it route their files through its claim.

Level 3 of the layering (docs/DESIGN.md), beside ``training``: what a training run's folder is, is asked of
:class:`coupled_qk.training.run_folder.RunFolder` (imported when a path is checked); otherwise only
:mod:`coupled_qk.files`.
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from coupled_qk.checks.paths import check_location, output_location, path_value
from coupled_qk.files import atomic_write, fsync_dir, write_text_atomic

__all__ = [
    "OutputDir",
    "OutputRefused",
    "check_run_out_dir",
    "output_file",
    "run_folder_of",
    "write_output_file",
]

RECORD = ".coupled-qk-outputs.json"
"""The hidden file, in each folder a command writes its outputs to, recording which command wrote each file and its
SHA-256: ``{"format": 1, "files": {"<name>": {"written_by": "<command>", "sha256": "<hex digest>"}}}``. A file is
recognisably a command's earlier output when its record names that command and its content still has that hash."""

IGNORED = (".*.tmp*", RECORD)
"""Entries of an output folder that are never counted as someone else's: our temporary files and the record of
outputs (a run folder's own hidden entries, its lock, are in its layout: :func:`check_run_out_dir`)."""

RUN_SHARED = ("glue",)
"""Sub-folders of a run folder that other commands write to (``coupled-qk glue RUN``'s default output)."""


def run_folder_of(path: str | Path) -> Path | None:
    """The training run folder that ``path`` (existing or not) is or lies in, except the sub-folders other
    commands may use (:data:`RUN_SHARED`: ``RUN/glue/...`` is not the run's); ``None`` when there is none.
    ``RUN/config.json``, ``RUN/ckpt-00000006/model.safetensors``, ``RUN/notes.json`` and ``RUN`` itself all give
    ``RUN``: a run folder holds only its own files (``train --resume`` refuses one holding anything else). The path
    is also followed through symbolic links (an output folder linked into a run is the run's). What a run folder
    is, is decided by :meth:`coupled_qk.training.run_folder.RunFolder.is_run` (the one home of the layout)."""
    from coupled_qk.training.run_folder import RunFolder

    for where in dict.fromkeys((Path(path).absolute(), Path(path).resolve())):  # through a symbolic link too
        for folder in (where, *where.parents):
            if RunFolder(folder).is_run():
                inside = where.relative_to(folder).parts
                if not (inside and inside[0] in RUN_SHARED):
                    return folder
                break
    return None


def _sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _read_records(folder: Path) -> dict:
    """The ``files`` of ``folder``'s :data:`RECORD` (``{}`` when it is missing or damaged: then no file there is
    recognised, and only ``--overwrite`` replaces them)."""
    try:
        data = json.loads((folder / RECORD).read_text(encoding="utf-8"))
        files = data.get("files", {}) if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}
    return files if isinstance(files, dict) else {}


def _record(folder: Path, name: str, written_by: str) -> None:
    """Add ``name`` (relative to ``folder``, just written) to ``folder``'s :data:`RECORD` with ``written_by`` and
    its SHA-256; under an OS lock on the folder, so that two processes writing reports there keep both entries."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        fcntl = None
    fd = os.open(folder, os.O_RDONLY)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        files = _read_records(folder)
        files[name] = {"written_by": written_by, "sha256": _sha256(folder / name)}
        write_text_atomic(folder / RECORD, json.dumps({"format": 1, "files": files}, indent=1, sort_keys=True) + "\n")
    finally:
        os.close(fd)  # releases the lock


def _replaceable(folder: Path, name: str, written_by: str, overwrite: bool, resume_path: bool) -> str | None:
    """Why the existing file ``folder/name`` may not be replaced by ``written_by`` now (``None``: it may):
    a training run's file (never), another command's recorded output (never), an unrecorded or since-edited file
    (only with ``overwrite``), this command's own output (with ``overwrite`` or on its ``resume_path``)."""
    path = folder / name
    run = run_folder_of(path)
    if run is not None:
        return (
            f"{path} belongs to the training run {run}; a run folder holds only the run's own files (replacing or "
            "adding one loses the run or stops it from resuming), so nothing is written there, even with "
            "--overwrite: choose a path outside the run"
        )
    entry = _read_records(folder).get(name)
    if isinstance(entry, dict) and entry.get("written_by") not in (None, written_by):
        return (
            f"{path} was written by {entry['written_by']}, not {written_by}: a command replaces only its own "
            f"earlier output, even with --overwrite (its record: {folder / RECORD}); move or delete it, or choose "
            "another path"
        )
    ours = isinstance(entry, dict) and entry.get("sha256") == _sha256(path)
    if overwrite or (ours and resume_path):
        return None
    if ours:
        return f"{path} already exists (an earlier output of {written_by}); pass --overwrite to replace it"
    why = "was changed since it was written" if isinstance(entry, dict) else "has no record of being written by it"
    return (
        f"{path} already exists and is not recognisably an earlier output of {written_by} (it {why}: someone "
        "else's file, one edited by hand, or one written before coupled-qk recorded its outputs); pass --overwrite "
        "to replace it, or choose another path"
    )


class OutputRefused(ValueError):
    """An output location was refused (the message names the option, the path and what to do)."""


def output_file(
    option: str, value, *, overwrite: bool = False, suffixes: Iterable[str] = (), written_by: str = "this command"
) -> Path:
    """Check an output *file* option before any work: not empty, not a folder, in an existing writable folder
    (a file's folder is not created for it, unlike an output folder's missing parents), not inside a training run
    (:func:`run_folder_of`), and not an existing file unless it is recognisably ``written_by``'s earlier output
    or an unrecorded file given with ``overwrite``. Nothing is created; write it with :func:`write_output_file`,
    which records it.

    Args:
        option: the option's name for the message (``"--json"``).
        value: the path given.
        overwrite: allow replacing an existing file (``--overwrite``) that is not another command's output.
        suffixes: allowed suffixes (``(".json",)``); empty means any.
        written_by: the command, as its outputs are recorded (``"eval"``).

    Returns:
        The path.

    Raises:
        ValueError: naming ``option``: empty value, a folder, an ancestor that is a file, a folder that does not
            exist, an unwritable folder, a wrong suffix, a path inside a training run, an existing file that may
            not be replaced (:class:`OutputRefused`).
    """
    path = path_value(option, value)
    suffixes = tuple(suffixes)
    if path.is_dir():
        raise ValueError(f"{option}={str(value)!r} is a folder; expected a file name")
    if str(value).endswith(os.sep):
        raise ValueError(f"{option}={str(value)!r} ends with {os.sep!r}, so it names a folder; expected a file name")
    if suffixes and path.suffix.lower() not in suffixes:
        raise ValueError(f"{option}={str(value)!r}: expected a file ending in {' or '.join(suffixes)}")
    run = run_folder_of(path)
    if run is not None:
        raise OutputRefused(
            f"{option}={str(value)!r} is inside the training run {run}; a run folder holds only the run's own files "
            "(replacing or adding one loses the run or stops it from resuming), even with --overwrite: choose a "
            "path outside the run"
        )
    check_location(option, path, is_file=True)
    if not path.parent.is_dir():
        raise ValueError(
            f"{option}={str(value)!r}: the folder {path.parent} does not exist; create it first or choose another path"
        )
    if path.exists():
        problem = _replaceable(path.parent, path.name, written_by, overwrite, resume_path=False)
        if problem is not None:
            raise OutputRefused(f"{option}: {problem}")
        if not os.access(path, os.W_OK):
            raise ValueError(f"{option}={str(value)!r} is not writable")
    return path


def write_output_file(path: str | Path, text: str, written_by: str) -> Path:
    """Write UTF-8 ``text`` to the output file ``path`` (checked by :func:`output_file`) atomically and record it
    as ``written_by``'s output (:data:`RECORD` in its folder); returns the path."""
    path = Path(path)
    write_text_atomic(path, text)
    _record(path.parent, path.name, written_by)
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


RUN_WHAT = "a training run"
"""The ``what`` of a run folder's own claim (``training/resume.py``): the one claim a run folder may have."""


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
        what: a few words saying what the command writes, for the messages (``"an MQAR sweep"``); also the name
            under which its files are recorded (:data:`RECORD`), so commands that share a folder's outputs share it.

    Raises:
        ValueError: naming ``option``: empty value, a file, not creatable or not writable; an existing folder
            holding entries outside ``layout`` (:class:`OutputRefused`, listing up to five of them); a training
            run's folder or a folder inside one (:func:`run_folder_of`), for any command but the run itself; an
            existing file matching ``rewrite`` that is not recognisably this command's earlier output (checked
            here, before the work, as :meth:`claim` would when it is written).
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
        self.path = output_location(option, value)
        self.overwrite = bool(overwrite)
        self.layout = tuple(layout)
        self.rewrite = tuple(rewrite)
        self.what = what
        self.written: list[Path] = []
        run = run_folder_of(self.path) if what != RUN_WHAT else None  # named first: the more specific refusal
        if run is not None:
            inside = "is the training run" if run == self.path.absolute() else f"is inside the training run {run}:"
            raise OutputRefused(
                f"{option}={str(value)!r} {inside} a run folder holds only the run's own files (any other file "
                "there stops it from resuming); nothing was changed: choose a folder outside the run"
            )
        if self.path.is_dir():
            foreign = self.foreign_entries()
            if foreign:
                shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
                raise OutputRefused(
                    f"{option}={str(value)!r} holds files that {what} does not write ({shown}); nothing was "
                    "changed: choose an empty or new folder"
                )
        if self.path.is_dir():
            for pattern in self.rewrite:  # the files its resume path regenerates: checked now, before any work
                for path in sorted(self.path.glob(pattern)):
                    if path.is_file() and not _matches(path.name, False, IGNORED):
                        self.claim(path.relative_to(self.path), check_only=True)

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

        Allowed: a new file; a file this object already wrote; an existing file that is recognisably this
        command's earlier output (:data:`RECORD`) with ``overwrite`` or a ``rewrite`` match; an unrecorded or
        since-edited file with ``overwrite``. Never: another command's recorded output, a training run's file.
        ``check_only`` checks without recording (for names known before the work).

        Raises:
            OutputRefused: an existing file that may not be replaced, naming it and why.
            ValueError: ``name`` is absolute or leaves the folder, or an existing folder has that name.
        """
        rel = Path(name)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            raise ValueError(f"output name {str(name)!r} must be a relative path inside {self.path}")
        path = self.path / rel
        if path.is_dir():
            raise OutputRefused(f"{self.option}: {path} is a folder; cannot write a file there")
        if path.exists() and path not in self.written:
            resume_path = any(fnmatch.fnmatchcase(rel.as_posix(), p) for p in self.rewrite)
            problem = _replaceable(self.path, rel.as_posix(), self.what, self.overwrite, resume_path)
            if problem is not None:
                raise OutputRefused(f"{self.option}: {problem}")
        if not check_only and path not in self.written:
            self.written.append(path)
        return path

    def record(self, path: str | Path) -> None:
        """Record the file ``path`` (inside the folder), just written, as this command's output (:data:`RECORD`);
        the write methods do it themselves, a command that writes a claimed file otherwise calls this."""
        _record(self.path, Path(path).relative_to(self.path).as_posix(), self.what)

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
        self.record(path)
        return path

    def write_json(self, name: str | Path, obj, indent: int = 2) -> Path:
        """Claim ``name`` and write ``obj`` as JSON (trailing newline) atomically; returns the path."""
        return self.write_text(name, json.dumps(obj, indent=indent, default=str) + "\n")

    def write_bytes(self, name: str | Path, data: bytes) -> Path:
        """Claim ``name`` and write ``data`` atomically; returns the path."""
        path = self._prepare(name)
        atomic_write(path, lambda f: f.write(data))
        self.record(path)
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
        self.record(path)
        return path


def as_output_dir(out_dir, option: str = "out_dir", **claim) -> OutputDir:
    """``out_dir`` itself when it already is an :class:`OutputDir`, else a new claim of it (``claim`` options)."""
    if isinstance(out_dir, OutputDir):
        return out_dir
    return OutputDir(out_dir, option, **claim)


def check_run_out_dir(run_dir: str | Path) -> None:
    """Refuse an ``out_dir`` that is a file, not creatable or writable, a checkpoint folder inside a run
    (``--out-dir RUN/ckpt-...``), or a folder holding files a run does not write (a home folder, a user's
    project, another command's output): the run would mix its files with them or replace them
    (:class:`OutputDir` with :data:`coupled_qk.training.run_folder.RUN_LAYOUT`; docs/RELIABILITY.md, "Outputs").

    Raises:
        ValueError: naming ``out_dir`` and what to pass instead.
    """
    from coupled_qk.training.checkpoint_format import Checkpoint
    from coupled_qk.training.run_folder import RUN_LAYOUT, RunFolder, checkpoint_step

    run_dir = Path(run_dir)
    if Checkpoint(run_dir).has_weights() or (
        checkpoint_step(run_dir) is not None and RunFolder(run_dir.parent).latest_path.is_file()
    ):
        raise ValueError(
            f"out_dir {run_dir} is a checkpoint folder inside the run {run_dir.parent}; pass "
            f"--out-dir {run_dir.parent} (the run folder)"
        )
    OutputDir(run_dir, "out_dir", layout=(*RUN_LAYOUT, RunFolder.LOCK), what=RUN_WHAT)
