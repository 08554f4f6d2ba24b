"""glibc's ``malloc`` tuned for training on a CPU, applied by every ``coupled-qk`` command (opt-out).

Why: a training step on a CPU allocates and frees the same large activation and gradient buffers every step.
With glibc's defaults, a block above the mmap threshold (128 KiB, adapting up to 32 MiB) is mapped on
allocation and unmapped on free, and free memory at the top of the heap is trimmed back to the system, so the
next step faults every page in again (the kernel zeroes each one). Keeping freed memory in the process removes
that work: on the project's 2-core VM a `tiny` training step spent ~25% of its CPU time in the kernel with the
defaults and ~1% with these settings, and ran 1.15-1.25x faster for every variant (``benchmarks/README.md``,
"Allocator"). PyTorch's CPU performance guide recommends jemalloc or tcmalloc for the same reason; this needs no
extra library.

What :func:`tune_cpu_allocator` sets, with ``mallopt`` (the same as the environment variables
``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` and ``MALLOC_TOP_PAD_``): blocks below 1 GiB come from the
heap, up to 1 GiB of free heap top is kept, and the heap grows in 1 GiB steps of address space. The cost: a
process keeps up to ~1 GiB of freed memory instead of returning it, and the resident size of a long run can
be higher after a peak. Untouched: processes that opt out (``COUPLED_QK_DEFAULT_MALLOC=1``), that tune glibc
themselves (any ``MALLOC_*`` variable or ``GLIBC_TUNABLES`` set), that preload another allocator (``LD_PRELOAD``
naming jemalloc, tcmalloc or mimalloc), and systems without glibc (macOS, Windows, musl).

Only the command line calls it (for its own process); importing :mod:`coupled_qk` changes nothing. A script of
your own can call :func:`tune_cpu_allocator` once at its start. Level 0 of the layering (no torch).
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Mapping

__all__ = ["OPT_OUT_ENV", "SETTINGS", "allocator_state", "tune_cpu_allocator"]

OPT_OUT_ENV = "COUPLED_QK_DEFAULT_MALLOC"
"""Set to ``1`` to keep glibc's defaults (``0`` or unset: tune)."""

SETTINGS = (("M_MMAP_THRESHOLD", -3, 1 << 30), ("M_TRIM_THRESHOLD", -1, 1 << 30), ("M_TOP_PAD", -2, 1 << 30))
"""``(name, mallopt parameter number from glibc's malloc.h, value in bytes)`` for each setting."""

USER_TUNING_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_ARENA_MAX",
                   "MALLOC_MMAP_MAX_", "GLIBC_TUNABLES")
"""Variables by which a user tunes glibc's malloc; when one is set, the user's choice stands."""

OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")

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
    opt_out = env.get(OPT_OUT_ENV, "").strip()
    if opt_out not in ("", "0", "1"):
        raise ValueError(f"{OPT_OUT_ENV}={env[OPT_OUT_ENV]!r} is not understood; expected 1 (keep glibc's malloc "
                         "defaults) or 0 / unset (tune malloc for training)")
    preload = env.get("LD_PRELOAD", "")
    user = [name for name in USER_TUNING_ENV if name in env]
    if opt_out == "1":
        _state = f"glibc defaults ({OPT_OUT_ENV}=1)"
    elif any(name in preload for name in OTHER_ALLOCATORS):
        _state = f"untouched: another allocator is preloaded (LD_PRELOAD={preload})"
    elif user:
        _state = f"untouched: tuned by the environment ({', '.join(f'{k}={env[k]}' for k in user)})"
    elif platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        _state = f"untouched: not glibc ({platform.system()})"
    else:
        mallopt = ctypes.CDLL(None).mallopt
        mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
        accepted = [f"{name}={value >> 30} GiB" for name, param, value in SETTINGS if mallopt(param, value) == 1]
        _state = "glibc tuned: " + ", ".join(accepted) if accepted else "glibc defaults (mallopt refused every setting)"
    return _state


def allocator_state() -> str:
    """What :func:`tune_cpu_allocator` last did in this process (recorded with benchmark results)."""
    return _state
