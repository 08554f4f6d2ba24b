"""The command line's malloc tuning (``coupled_qk.allocator``): who is left alone, bad values, and that the
settings really stop each large allocation from faulting its pages in again (counted by the kernel)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coupled_qk import allocator
from coupled_qk.allocator import OPT_OUT_ENV, tune_cpu_allocator

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


@pytest.fixture(autouse=True)
def keep_state(monkeypatch):
    monkeypatch.setattr(allocator, "_state", allocator._state)


@pytest.fixture
def glibc(monkeypatch):
    """Decisions that come before ``mallopt``, taken as on Linux with glibc (on any host)."""
    monkeypatch.setattr(allocator.platform, "system", lambda: "Linux")
    monkeypatch.setattr(allocator.platform, "libc_ver", lambda *a, **k: ("glibc", "2.36"))


def test_opt_out_and_user_choices_are_left_alone(glibc):
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


GLIBC_SETTINGS = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # `glibc` is constant
_NAME = st.text("abcdefghijklmnopqrstuvwxyz0123456789_-.", max_size=8)


@given(
    st.sampled_from(["jemalloc", "TCMalloc_minimal", "mimalloc", "tbbmalloc_proxy", "snmalloc", "hoard"]),
    _NAME,
    _NAME,
    st.lists(st.sampled_from(["/usr/lib/libc_shim.so", "libfoo.so.1"]), max_size=2),
    st.sampled_from([" ", ":", "  ", " : "]),
)
@GLIBC_SETTINGS
def test_any_preloaded_allocator_is_left_alone(glibc, allocator_name, before, after, others, sep):
    """Any case, any place in LD_PRELOAD's list (space or colon separated), a directory before it."""
    lib = f"/opt/{before}/lib{before}{allocator_name}{after}.so"
    preload = sep.join([*others, lib])
    assert allocator.preloaded_allocator({"LD_PRELOAD": preload}) == lib
    said = tune_cpu_allocator({"LD_PRELOAD": preload})
    assert said.startswith("untouched: another allocator is preloaded") and preload in said


@given(st.lists(st.sampled_from(["/usr/lib/libc_shim.so", "libfoo.so.1", "/opt/jemalloc/libasan.so"]), max_size=3))
def test_other_preloads_are_no_allocator(libraries):
    """A library is judged by its file name, not its folder."""
    assert allocator.preloaded_allocator({"LD_PRELOAD": " ".join(libraries)}) is None


@given(st.from_regex(r"MALLOC_[A-Z0-9_]{0,16}", fullmatch=True) | st.just("GLIBC_TUNABLES"), st.text(max_size=6))
@GLIBC_SETTINGS
def test_every_malloc_variable_is_the_users_choice(glibc, name, value):
    """Every ``MALLOC_*`` variable (as the docs say), even empty, or with a value that would break the line."""
    said = tune_cpu_allocator({name: value, "UNRELATED": "1"})
    assert said.startswith(f"untouched: tuned by the environment ({name}=") and "UNRELATED" not in said
    assert len(said.splitlines()) == 1


@pytest.mark.parametrize(
    "system, libc", [("Darwin", ("", "")), ("Windows", ("", "")), ("Linux", ("", "")), ("Linux", ("musl", "1.2"))]
)
def test_not_glibc_is_untouched(monkeypatch, system, libc):
    monkeypatch.setattr(allocator.platform, "system", lambda: system)
    monkeypatch.setattr(allocator.platform, "libc_ver", lambda *a, **k: libc)
    for env in ({}, {OPT_OUT_ENV: "1"}, {"MALLOC_ARENA_MAX": "2"}):  # never reported as glibc's state
        assert tune_cpu_allocator(env) == f"untouched: not glibc ({system})"
    with pytest.raises(ValueError, match=OPT_OUT_ENV):  # a bad value is refused everywhere
        tune_cpu_allocator({OPT_OUT_ENV: "yes"})


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
    out = subprocess.run(
        [sys.executable, "-c", _FAULTS], env={**clean, **env}, capture_output=True, text=True, check=True
    )
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
