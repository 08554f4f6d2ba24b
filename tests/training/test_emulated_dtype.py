"""An explicit bf16 / fp16 autocast on a CPU that does not compute it natively: every path that runs under the
asked dtype says so once (training through ``setup_runtime``, ``bench`` through ``resolve_dtype``), rank 0 only
under ``torchrun``; paths that would ignore ``--dtype`` refuse it."""

import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from coupled_qk.devices import AUTOCAST_DTYPES
from coupled_qk.experiments.bench.train import resolve_dtype
from coupled_qk.training import distributed

DEVICES = st.sampled_from([torch.device("cpu"), torch.device("cuda"), torch.device("mps")])


def _said(fn, *args):
    """``fn(*args)`` and whether it warned of emulation."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args)
    return out, any("emulated" in str(w.message) and w.category is RuntimeWarning for w in caught)


@given(st.sampled_from(AUTOCAST_DTYPES), DEVICES, st.booleans(), st.booleans())
def test_warned_exactly_when_the_cpu_emulates_the_asked_dtype(dtype, device, bf16, fp16):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(distributed, "cpu_supports_bf16", lambda: bf16)
        mp.setattr(distributed, "cpu_supports_fp16", lambda: fp16)
        native = {"bf16": bf16, "fp16": fp16}.get(dtype, True)
        expected = device.type == "cpu" and not native
        assert _said(distributed.warn_if_emulated, dtype, device) == (expected, expected)
        if device.type == "cpu":  # the training loop's and the bench's entry points say the same
            assert _said(distributed.pick_autocast_dtype, dtype, device)[1] == expected
            assert _said(resolve_dtype, dtype, device)[1] == expected


@given(st.text(max_size=6).filter(lambda v: v not in AUTOCAST_DTYPES))
def test_an_unknown_dtype_is_a_value_error_naming_it(dtype):
    with pytest.raises(ValueError, match="is unknown; expected one of"):
        distributed.pick_autocast_dtype(dtype, torch.device("cpu"))


def test_the_fp16_flags_are_read_like_the_bf16_ones(monkeypatch, tmp_path):
    import builtins

    real_open = builtins.open
    for flags, bf16, fp16 in (
        ("avx2 avx512_fp16", False, True),
        ("amx_bf16 amx_fp16", True, True),
        ("avx2 f16c", False, False),
    ):
        info = tmp_path / "cpuinfo"
        info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
        monkeypatch.setattr(
            builtins, "open", lambda p, *a, _i=info, **k: real_open(_i if p == "/proc/cpuinfo" else p, *a, **k)
        )
        assert (distributed.cpu_supports_bf16(), distributed.cpu_supports_fp16()) == (bf16, fp16)


@pytest.mark.parametrize("rank", ["0", "1", "3"])
def test_only_rank_0_warns_under_torchrun(monkeypatch, rank):
    monkeypatch.setattr(distributed, "cpu_supports_bf16", lambda: False)
    monkeypatch.setenv("RANK", rank)  # WORLD_SIZE stays 1: no process group, the rank is read all the same
    runtime, said = _said(distributed.setup_runtime, "cpu", "bf16")
    assert runtime.autocast_dtype == torch.bfloat16 and said == (rank == "0")


def test_fastpath_native_bf16_is_per_device(monkeypatch):
    monkeypatch.setattr(distributed, "cpu_supports_bf16", lambda: True)
    assert distributed.native_bf16(torch.device("cpu")) and not distributed.native_bf16(torch.device("mps"))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    # a GPU before Ampere: bf16 only emulated
    assert not distributed.native_bf16(torch.device("cuda"))
