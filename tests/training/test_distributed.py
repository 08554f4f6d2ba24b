"""Process-group timeout and TF32 (issue 28 item 6): CPU checks of what the CUDA paths will do."""

from datetime import timedelta

import pytest
import torch

from coupled_qk.training import distributed
from coupled_qk.training.distributed import DEFAULT_PG_TIMEOUT_S, PG_TIMEOUT_ENV, enable_tf32, pg_timeout


@pytest.fixture
def tf32_flags():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_tf32_is_enabled_for_cuda_only(tf32_flags):
    assert enable_tf32(torch.device("cpu")) is False
    distributed.pick_device("cpu")
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert enable_tf32(torch.device("cuda", 0)) is True
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    enable_tf32("cuda", enabled=False)
    assert not torch.backends.cuda.matmul.allow_tf32


def test_pg_timeout_default_env_and_errors(monkeypatch):
    monkeypatch.delenv(PG_TIMEOUT_ENV, raising=False)
    assert pg_timeout() == timedelta(seconds=DEFAULT_PG_TIMEOUT_S) == timedelta(minutes=30)
    monkeypatch.setenv(PG_TIMEOUT_ENV, "90.5")
    assert pg_timeout() == timedelta(seconds=90.5)
    for bad in ("0", "-3", "soon", "inf", "nan"):
        monkeypatch.setenv(PG_TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=f"{PG_TIMEOUT_ENV}='{bad}'"):
            pg_timeout()


def test_process_group_is_created_with_the_timeout(monkeypatch):
    calls = []
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda **kw: calls.append(kw))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv(PG_TIMEOUT_ENV, "120")
    rt = distributed.setup_runtime("cpu", "fp32")
    assert (rt.rank, rt.world, rt.device.type) == (1, 2, "cpu")
    assert calls == [dict(backend="gloo", timeout=timedelta(seconds=120))]
