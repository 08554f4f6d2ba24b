"""Progress reporting for every phase that takes more than a few seconds.

On a terminal this is a ``tqdm`` bar. Without one (output redirected to a log file, CI), on a terminal that
reports no width (``stty size`` of ``0 0``: some containers, serial consoles and IDE panes, where ``tqdm``
would draw nothing) or when the bar is switched off, a carriage-return bar would make the log unreadable or
empty, so :class:`LineProgress` prints a plain line every ``interval`` seconds (``COUPLED_QK_LOG_INTERVAL``,
default 30) and one when the phase ends.
``--no-progress`` on the command line (or :func:`set_mode` ``"off"``) silences both.
"""

from __future__ import annotations

import os
import sys
import time

from tqdm.auto import tqdm

from coupled_qk.checks.environment import env_value

_MODE: dict[str, str | None] = {"mode": None}  # None: not set yet, read from COUPLED_QK_PROGRESS when first needed
MODES = ("auto", "bar", "lines", "off")


def set_mode(mode: str) -> None:
    """``"auto"`` (a bar on a terminal, plain lines otherwise), ``"bar"``, ``"lines"`` or ``"off"``.

    Raises:
        ValueError: another mode.
    """
    if mode not in MODES:
        raise ValueError(f"progress mode={mode!r} is unknown; expected one of {list(MODES)}")
    _MODE["mode"] = mode


def progress_mode() -> str:
    """The current mode (see :func:`set_mode`); until one is set, ``COUPLED_QK_PROGRESS`` (``auto`` when unset).

    Raises:
        ValueError: ``COUPLED_QK_PROGRESS`` is not one of :data:`MODES`, naming it (``checks.environment.ENVIRONMENT``).
    """
    if _MODE["mode"] is None:
        _MODE["mode"] = env_value("COUPLED_QK_PROGRESS")
    return _MODE["mode"]


def _fmt_seconds(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class LineProgress:
    """Plain periodic log lines with the same small interface as ``tqdm`` (``update``, ``set_postfix``,
    ``close``, context manager). Lines look like
    ``eval valid: 45% 450/1000 windows, 12.3 windows/s, elapsed 0m36s, ETA 0m44s``."""

    def __init__(
        self, total: int | None, desc: str, unit: str, initial: int = 0, interval: float | None = None, file=None
    ):
        self.total, self.desc, self.unit, self.n = total, desc, unit, initial
        self.start_n = initial
        self.interval = env_value("COUPLED_QK_LOG_INTERVAL") if interval is None else interval
        self.file = file or sys.stderr
        self.t0 = self.last = time.monotonic()
        self.postfix: dict = {}
        self.closed = False

    def _line(self) -> str:
        elapsed = time.monotonic() - self.t0
        rate = (self.n - self.start_n) / elapsed if elapsed > 0 else 0.0
        parts = [f"{self.desc}:"]
        if self.total:
            parts.append(f"{100 * self.n / self.total:.0f}% {self.n:,}/{self.total:,} {self.unit}")
        else:
            parts.append(f"{self.n:,} {self.unit}")
        parts[-1] += f", {rate:,.1f} {self.unit}/s, elapsed {_fmt_seconds(elapsed)}"
        if self.total and rate > 0 and self.n < self.total:
            parts[-1] += f", ETA {_fmt_seconds((self.total - self.n) / rate)}"
        parts += [f"{k}={v}" for k, v in self.postfix.items()]
        return " ".join(parts)

    def update(self, n: int = 1) -> None:
        """Count ``n`` more units (as ``tqdm.update``); print a line when ``interval`` seconds have passed since the
        last one."""
        self.n += n
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            print(self._line(), file=self.file, flush=True)

    def set_postfix(self, postfix: dict | None = None, refresh: bool = False, **kwargs) -> None:
        """Replace the ``key=value`` items shown at the end of each line by ``postfix`` and ``kwargs`` (as
        ``tqdm.set_postfix``; floats written to 4 significant digits). ``refresh`` is accepted for ``tqdm``'s
        signature and ignored: the next periodic line shows them."""
        self.postfix = {
            k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in {**(postfix or {}), **kwargs}.items()
        }

    def write(self, text: str) -> None:
        """Print ``text`` as one line to this reporter's stream (as ``tqdm.write``), flushed."""
        print(text, file=self.file, flush=True)

    def close(self) -> None:
        """End the phase (idempotent): a final line marked ``(done)`` (total reached or unknown) or ``(stopped)``,
        printed only when the phase lasted at least ``min(interval, 5)`` seconds."""
        if not self.closed:
            self.closed = True
            if time.monotonic() - self.t0 >= min(self.interval, 5.0):
                end = " (done)" if self.total is None or self.n >= self.total else " (stopped)"
                print(self._line() + end, file=self.file, flush=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def terminal_columns(stream=None) -> int:
    """Columns of the terminal behind ``stream`` (default ``sys.stderr``); 0 when it reports none or is not one.

    A terminal may report a width of 0 (``stty size`` prints ``0 0``); ``tqdm`` then draws an empty bar, so
    :func:`progress` falls back to plain lines. ``COLUMNS`` is not consulted: it describes the shell, not the
    stream.
    """
    stream = sys.stderr if stream is None else stream
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 0


def bars_shown() -> bool:
    """Whether progress is drawn as bars: mode ``bar``, or ``auto`` with stderr a terminal reporting a non-zero
    width (:func:`terminal_columns`). The policy of :func:`progress` and of other libraries' bars
    (:func:`library_bars_follow_policy`)."""
    mode = progress_mode()
    return mode == "bar" or (mode == "auto" and sys.stderr.isatty() and terminal_columns() > 0)


def progress(total: int | None = None, desc: str = "", unit: str = "it", initial: int = 0, enabled: bool = True):
    """A progress reporter for one phase: a ``tqdm`` bar, a :class:`LineProgress`, or a silent one.

    Mode ``auto`` draws a bar only when stderr is a terminal reporting a non-zero width
    (:func:`bars_shown`), plain lines otherwise.

    Args:
        total: expected count (``None`` if unknown). desc: what is running. unit: what is counted.
        initial: count already done (resumed runs). enabled: ``False`` silences it (e.g. non-zero ranks).
    """
    if not enabled or progress_mode() == "off":
        return tqdm(total=total, initial=initial, disable=True)
    if bars_shown():
        return tqdm(total=total, desc=desc, unit=unit, initial=initial, dynamic_ncols=True)
    return LineProgress(total, desc, unit, initial)


def _library_bar(factory, args: tuple, kwargs: dict):
    """``transformers``' tqdm hook: its bar, disabled where :func:`bars_shown` says no bars (a log file, CI,
    ``--no-progress``). A notebook (``ipykernel`` loaded), whose widgets are no carriage-return lines, keeps them
    in mode ``auto``."""
    notebook = progress_mode() == "auto" and "ipykernel" in sys.modules
    if not (bars_shown() or notebook):
        kwargs = {**kwargs, "disable": True}
    return factory(*args, **kwargs)


def library_bars_follow_policy() -> None:
    """Make ``transformers``' progress bars (loading weights, downloads) follow :func:`bars_shown`: without a
    terminal they wrote carriage-return bars into log files. Installs its tqdm hook
    (``transformers.utils.logging.set_tqdm_hook``) unless another hook is set; nothing without ``transformers``
    or in a version without the hook. Called when coupled-qk registers its models with ``transformers``
    (:mod:`coupled_qk.hf.registration`, on the first use of its Auto classes); idempotent."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    current = getattr(hf_logging, "_tqdm_hook", None)
    if hasattr(hf_logging, "set_tqdm_hook") and current in (None, _library_bar):
        hf_logging.set_tqdm_hook(_library_bar)


_SAID: set[str] = set()


def announce(message: str, enabled: bool = True, once: bool = False) -> None:
    """Print one status line (``coupled-qk: <message>``) to stderr unless progress is off; with ``once``, only the
    first time this process says that message (each run of a comparison would repeat it)."""
    if not enabled or progress_mode() == "off" or (once and message in _SAID):
        return
    _SAID.add(message)
    print(f"coupled-qk: {message}", file=sys.stderr, flush=True)
