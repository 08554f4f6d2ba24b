"""glibc's ``malloc`` tuned for training on a CPU, applied by every ``coupled-qk`` command (opt-out).

Why: a training step on a CPU allocates and frees the same large activation and gradient buffers every step.
With glibc's defaults, a block above the mmap threshold (128 KiB, adapting up to 32 MiB) is mapped on
allocation and unmapped on free, and free memory at the top of the heap is trimmed back to the system, so the
next step faults every page in again (the kernel zeroes each one). Keeping freed memory in the process removes
that work: on the project's 2-core VM training processes spent ~25% of their CPU time in the kernel with the
defaults and ~1% with these settings, and a ``coupled-qk bench`` training step ran 1.33-1.50x faster at ``tiny``
and 1.06-1.19x at ``60m`` (median per run of paired processes; ``benchmarks/results/allocator/``). PyTorch's CPU
performance guide recommends jemalloc or tcmalloc for the same reason; this needs no
extra library.

What :func:`tune_cpu_allocator` sets, with ``mallopt`` (the same as the environment variables
``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` and ``MALLOC_TOP_PAD_``): blocks below 1 GiB come from the
heap, up to 1 GiB of free heap top is kept, and the heap grows in 1 GiB steps of address space. The cost: a
process keeps up to ~1 GiB of freed memory instead of returning it, and the resident size of a long run can
be higher after a peak. Untouched: processes that opt out (``COUPLED_QK_DEFAULT_MALLOC=1``), that tune glibc
themselves (any ``MALLOC_*`` variable or ``GLIBC_TUNABLES`` set), that preload another allocator (``LD_PRELOAD``
naming jemalloc, tcmalloc, mimalloc, tbbmalloc, snmalloc or Hoard), and systems without glibc (macOS, Windows,
musl).

Only the command line calls it (for its own process); importing :mod:`coupled_qk` changes nothing. A script of
your own can call :func:`tune_cpu_allocator` once at its start. Level 0 of the layering (no torch).
"""

from __future__ import annotations

import ctypes
import os
import platform
import re
from collections.abc import Mapping

from coupled_qk.checks.environment import env_value

__all__ = ["OPT_OUT_ENV", "SETTINGS", "allocator_state", "preloaded_allocator", "tune_cpu_allocator", "user_tuning_env"]

OPT_OUT_ENV = "COUPLED_QK_DEFAULT_MALLOC"
"""Set to ``1`` to keep glibc's defaults (``0`` or unset: tune)."""

SETTINGS = (("M_MMAP_THRESHOLD", -3, 1 << 30), ("M_TRIM_THRESHOLD", -1, 1 << 30), ("M_TOP_PAD", -2, 1 << 30))
"""``(name, mallopt parameter number from glibc's malloc.h, value in bytes)`` for each setting."""

USER_TUNING_PREFIX, GLIBC_TUNABLES = "MALLOC_", "GLIBC_TUNABLES"
"""A variable named ``MALLOC_*`` (glibc's ``MALLOC_ARENA_MAX``, ``MALLOC_TOP_PAD_``, ...) or ``GLIBC_TUNABLES``
tunes glibc's malloc; when one is set, even to an empty value, the user's choice stands."""

OTHER_ALLOCATORS = ("malloc", "hoard")
"""Parts of a preloaded library's file name (any case) that mark another allocator: ``libjemalloc.so.2``,
``libtcmalloc_minimal.so.4``, ``libmimalloc.so``, ``libtbbmalloc_proxy.so.2``, ``libsnmalloc.so``,
``libhoard.so``."""


def user_tuning_env(environ: Mapping[str, str]) -> list[str]:
    """The names in ``environ`` by which a user tunes glibc's malloc (``MALLOC_*``, ``GLIBC_TUNABLES``), sorted."""
    return sorted(k for k in environ if k.startswith(USER_TUNING_PREFIX) or k == GLIBC_TUNABLES)


def shown(value: str) -> str:
    """``value`` as written in a one-line report: itself if printable, else its ``repr`` (a newline, a tab or an
    undecodable byte of an environment variable cannot break a line of a bench result)."""
    return value if value.isprintable() else repr(value)


def preloaded_allocator(environ: Mapping[str, str]) -> str | None:
    """The first library of ``LD_PRELOAD`` in ``environ`` (entries separated by spaces or colons, as ``ld.so``
    reads them) whose file name names another allocator (:data:`OTHER_ALLOCATORS`), or ``None``."""
    for entry in re.split(r"[\s:]+", environ.get("LD_PRELOAD", "")):
        if any(part in entry.rsplit("/", 1)[-1].lower() for part in OTHER_ALLOCATORS):
            return entry
    return None


_state = "untouched (no coupled-qk command ran in this process)"


def tune_cpu_allocator(environ: Mapping[str, str] | None = None) -> str:
    """Tune glibc's ``malloc`` of this process for training (see the module docstring); returns what was done.

    Args:
        environ: the environment to decide from (default ``os.environ``).

    Returns:
        A one-line description, also kept for :func:`allocator_state`: ``"glibc tuned: M_MMAP_THRESHOLD=1 GiB,
        ..."`` (only the settings glibc accepted), or why nothing was changed (opted out, tuned by the
        environment, another allocator preloaded, not glibc).

    Raises:
        ValueError: ``COUPLED_QK_DEFAULT_MALLOC`` set to something other than ``0`` or ``1`` (names the variable
            and the value).

    Safe to call more than once (``mallopt`` sets values; nothing accumulates).
    """
    global _state
    env = os.environ if environ is None else environ
    opt_out = env_value(OPT_OUT_ENV, env)  # "0" or "1", checked where it is declared (checks.environment.ENVIRONMENT)
    preload, user = preloaded_allocator(env), user_tuning_env(env)
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        _state = f"untouched: not glibc ({platform.system()})"
    elif opt_out == "1":
        _state = f"glibc defaults ({OPT_OUT_ENV}=1)"
    elif preload is not None:
        _state = f"untouched: another allocator is preloaded (LD_PRELOAD={shown(env['LD_PRELOAD'])})"
    elif user:
        _state = f"untouched: tuned by the environment ({', '.join(f'{k}={shown(env[k])}' for k in user)})"
    else:
        mallopt = ctypes.CDLL(None).mallopt
        mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
        accepted = [f"{name}={value >> 30} GiB" for name, param, value in SETTINGS if mallopt(param, value) == 1]
        _state = "glibc tuned: " + ", ".join(accepted) if accepted else "glibc defaults (mallopt refused every setting)"
    return _state


def allocator_state() -> str:
    """What :func:`tune_cpu_allocator` last did in this process (recorded with benchmark results)."""
    return _state
