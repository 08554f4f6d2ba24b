"""One writer per run folder: an OS-level lock (``flock``) on the run's lock file (``.lock``, named by
:class:`coupled_qk.training.run_folder.RunFolder`, which takes it: ``RunFolder.lock()``).

The lock is held for the whole of a training run and released by the operating system on any exit, a crash
or ``SIGKILL`` included, so a lock left by a dead process is stale by construction and simply taken over.
The lock file holds the holder's process id, host, start time and command line, which a refused second writer
names; it is removed when the holder releases it, so a run folder looks the same before and after a run that
was refused. ``flock`` is advisory and local: processes on other hosts sharing the folder over NFS are not
guaranteed to see it.

From the moment it is taken, a ``SIGTERM``, ``SIGHUP`` or ``SIGINT`` whose handler is the default action (which
would end the process without unwinding, before the training loop installs its own handler: while the corpus
is tokenised, say) removes the lock file first and then takes its default action, so the process still ends by
the signal (its exit status unchanged) and leaves no stale ``.lock``. Handlers installed later (the training
loop's) take precedence while they are installed; Python's ``SIGINT`` handler raises ``KeyboardInterrupt``,
whose unwinding releases the lock anyway.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

RELEASE_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGINT") if hasattr(signal, name))
"""Signals that release a held lock before their default action ends the process (module docstring)."""


class RunLockedError(ValueError):
    """Another process holds the run folder's lock (the message names it)."""


def lock_holder(path: str | Path) -> str | None:
    """Who holds the lock file ``path``, in words (:func:`_holder`: pid, host, start time, command), when another
    process holds it; ``None`` when nobody does, the file does not exist, cannot be opened, or this process holds it
    (a :class:`RunLock` of its own). Read-only: the probe takes a shared ``flock`` for an instant, never creates or
    writes the file (a reader of a read-only run folder can ask)."""
    path = Path(path)
    if fcntl is None or any(lock.path == path for lock in _HELD) or not path.is_file():
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(path)
    finally:
        os.close(fd)  # closing releases the shared lock, if it was taken
    return None


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    if not info:
        return "another process"
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(info.get("started", 0)))
    return f"pid {info.get('pid')} on {info.get('host')} (started {started}: {info.get('command', '?')})"


_HELD: list = []  # the RunLocks this process holds
_CAUGHT: dict = {}  # signal -> the handler ours replaced (SIG_DFL), while any lock is held


def _on_signal(signum, frame) -> None:
    for lock in list(_HELD):
        lock.release()  # the last one restores the default action of every caught signal
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)  # then the default action: the process ends by the signal, as without a lock


def _catch_signals() -> None:
    """Release the held locks on a :data:`RELEASE_SIGNALS` signal whose handler is the default action (main
    thread only: Python installs handlers there)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in RELEASE_SIGNALS:
        if sig not in _CAUGHT and signal.getsignal(sig) == signal.SIG_DFL:
            _CAUGHT[sig] = signal.signal(sig, _on_signal)


def _restore_signals() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for sig, previous in list(_CAUGHT.items()):
        if signal.getsignal(sig) is _on_signal:  # not replaced since (else whoever replaced it restores it)
            signal.signal(sig, previous)
        del _CAUGHT[sig]


class RunLock:
    """Exclusive lock of a run folder; a context manager, or :meth:`acquire` / :meth:`release`.

    Args:
        path: the lock file (its folder, the run folder, is created if missing).

    Raises:
        RunLockedError: from :meth:`acquire`, naming the holder, when another live process holds it.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.run_dir = self.path.parent
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now (acquired and not yet released)."""
        return self._fd is not None

    def acquire(self) -> RunLock:
        """Take the lock without waiting (a second writer is refused at once, not queued)."""
        if self._fd is not None:
            return self
        self.run_dir.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    raise RunLockedError(
                        f"run folder {self.run_dir} is in use by {_holder(self.path)}; wait for it to finish or "
                        "choose another --out-dir"
                    ) from None
            # the previous holder may have removed the file between our open and our lock: lock the new one
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.time(),
            "command": " ".join(["coupled-qk", *sys.argv[1:]]) if sys.argv else "python",
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd
        _HELD.append(self)
        _catch_signals()
        return self

    def release(self) -> None:
        """Remove the lock file and release the lock (idempotent)."""
        if self._fd is None:
            return
        if self in _HELD:
            _HELD.remove(self)
        if not _HELD:
            _restore_signals()
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
