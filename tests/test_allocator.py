"""The command line's malloc tuning (``coupled_qk.allocator``): who is left alone, bad values, and that the
settings really stop each large allocation from faulting its pages in again (counted by the kernel)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coupled_qk import allocator
from coupled_qk.allocator import OPT_OUT_ENV, tune_cpu_allocator

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


@pytest.fixture(autouse=True)
def keep_state(monkeypatch):
    monkeypatch.setattr(allocator, "_state", allocator._state)


def test_opt_out_and_user_choices_are_left_alone():
    assert tune_cpu_allocator({OPT_OUT_ENV: "1"}) == f"glibc defaults ({OPT_OUT_ENV}=1)"
    assert "another allocator" in tune_cpu_allocator({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"})
    assert "tuned by the environment (MALLOC_ARENA_MAX=2)" in tune_cpu_allocator({"MALLOC_ARENA_MAX": "2"})
    assert "GLIBC_TUNABLES" in tune_cpu_allocator({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"})
    said = tune_cpu_allocator({"GLIBC_TUNABLES": "x"})
    assert allocator.allocator_state() == said


@given(st.text(max_size=8).filter(lambda v: v.strip() not in ("", "0", "1")))
def test_an_unknown_opt_out_value_names_the_variable_and_value(value):
    with pytest.raises(ValueError, match=OPT_OUT_ENV) as info:
        tune_cpu_allocator({OPT_OUT_ENV: value})
    assert repr(value) in str(info.value) and "expected 1" in str(info.value)


def test_not_glibc_is_untouched(monkeypatch):
    monkeypatch.setattr(allocator.platform, "system", lambda: "Darwin")
    assert tune_cpu_allocator({}) == "untouched: not glibc (Darwin)"


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_tuning_reports_every_setting_and_repeats_safely():
    first = tune_cpu_allocator({})
    assert first == "glibc tuned: M_MMAP_THRESHOLD=1 GiB, M_TRIM_THRESHOLD=1 GiB, M_TOP_PAD=1 GiB"
    assert tune_cpu_allocator({OPT_OUT_ENV: "0"}) == first


# Allocate, touch and free a 64 MiB block five times; print the page faults of the last four. With glibc's
# defaults the block is above the mmap threshold (at most 32 MiB), so each allocation maps fresh pages and
# touching them faults all 16,384 in; tuned, the freed block is reused and touching it faults nothing.
_FAULTS = """
import ctypes, os, resource, sys
from coupled_qk.allocator import tune_cpu_allocator
print(tune_cpu_allocator(), file=sys.stderr)
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
n = 64 << 20
def once():
    p = libc.malloc(ctypes.c_size_t(n))
    ctypes.memset(p, 1, n)
    libc.free(ctypes.c_void_p(p))
once()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    once()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(env: dict) -> int:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUN"))}
    out = subprocess.run([sys.executable, "-c", _FAULTS], env={**clean, **env}, capture_output=True, text=True,
                         check=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_tuned_malloc_stops_refaulting_a_reused_large_block():
    pages = 4 * (64 << 20) // 4096  # 65,536 pages touched in the four timed rounds
    default, tuned = _faults({OPT_OUT_ENV: "1"}), _faults({})
    assert default > 0.9 * pages, default
    assert tuned < 0.01 * pages, tuned


def test_the_command_line_tunes_its_process(monkeypatch, capsys):
    from coupled_qk.cli import main

    monkeypatch.setenv(OPT_OUT_ENV, "yes")
    assert main(["describe", "--preset", "tiny"]) == 2
    err = capsys.readouterr().err
    assert f"{OPT_OUT_ENV}='yes'" in err and len(err.strip().splitlines()) == 1
    monkeypatch.setenv(OPT_OUT_ENV, "1")
    assert main(["describe", "--preset", "tiny"]) == 0
    assert allocator.allocator_state() == f"glibc defaults ({OPT_OUT_ENV}=1)"
