"""One writer per run folder: an OS-level lock (``flock``) on ``<run>/.lock``.

The lock is held for the whole of a training run and released by the operating system on any exit, a crash
or ``SIGKILL`` included, so a lock left by a dead process is stale by construction and simply taken over.
The lock file holds the holder's process id, host, start time and command line, which a refused second writer
names; it is removed when the holder releases it, so a run folder looks the same before and after a run that
was refused. ``flock`` is advisory and local: processes on other hosts sharing the folder over NFS are not
guaranteed to see it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

LOCK_NAME = ".lock"


class RunLockedError(ValueError):
    """Another process holds the run folder's lock (the message names it)."""


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    if not info:
        return "another process"
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(info.get("started", 0)))
    return f"pid {info.get('pid')} on {info.get('host')} (started {started}: {info.get('command', '?')})"


class RunLock:
    """Exclusive lock of a run folder; a context manager, or :meth:`acquire` / :meth:`release`.

    Args:
        run_dir: the run folder (created if missing).

    Raises:
        RunLockedError: from :meth:`acquire`, naming the holder, when another live process holds it.
    """

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
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
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                "command": " ".join(["coupled-qk", *sys.argv[1:]]) if sys.argv else "python"}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Remove the lock file and release the lock (idempotent)."""
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
