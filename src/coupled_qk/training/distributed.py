"""Process-group setup for ``torchrun`` (DDP, optional FSDP2) and device/dtype selection."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from coupled_qk.devices import check_device


@dataclass
class Runtime:
    """Where this process runs: ``rank`` of ``world`` processes, its ``device`` and autocast dtype."""

    rank: int
    world: int
    local_rank: int
    device: torch.device
    autocast_dtype: torch.dtype | None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def pick_device(name: str) -> torch.device:
    """``auto`` picks CUDA when available, else CPU; other names must be devices this machine has.

    Raises:
        ValueError: an unknown or absent device, listing the available ones
            (:func:`coupled_qk.devices.check_device`).
    """
    name = check_device("device", name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def pick_autocast_dtype(dtype: str, device: torch.device) -> torch.dtype | None:
    """``auto``: bf16 autocast on CUDA (fp16 if bf16 is unsupported), none (fp32) on CPU."""
    if dtype == "fp32" or (dtype == "auto" and device.type != "cuda"):
        return None
    if dtype == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]


def setup_runtime(device: str = "auto", dtype: str = "auto") -> Runtime:
    """Initialise the process group when launched by ``torchrun`` (``WORLD_SIZE > 1``).

    The backend is NCCL on CUDA and gloo on CPU; each process uses ``cuda:LOCAL_RANK``.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = pick_device(device)
    if world > 1:
        if dev.type == "cuda":
            dev = torch.device("cuda", local_rank)
            torch.cuda.set_device(dev)
        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    return Runtime(rank, world, local_rank, dev, pick_autocast_dtype(dtype, dev))


def all_reduce_mean(value: float, runtime: Runtime) -> float:
    """Mean of a Python float over ranks (identity for one process)."""
    if runtime.world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=runtime.device)
    dist.all_reduce(t)
    return t.item() / runtime.world


def all_reduce_sum(values: list[float], runtime: Runtime) -> list[float]:
    """Element-wise sum of a list of floats over ranks in one collective (identity for one process).

    Used once per training step to share the loss and every stop decision, so all ranks act alike.
    """
    if runtime.world == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=runtime.device)
    dist.all_reduce(t)
    return t.tolist()


def broadcast_ok(ok: bool, runtime: Runtime) -> bool:
    """``True`` on every rank if ``ok`` is true on every rank (a collective: all ranks must call it)."""
    return all_reduce_sum([0.0 if ok else 1.0], runtime)[0] == 0.0


def barrier(runtime: Runtime) -> None:
    """Synchronise ranks (no-op for one process)."""
    if runtime.world > 1:
        dist.barrier()


def teardown(runtime: Runtime) -> None:
    """Destroy the process group if this module created one."""
    if runtime.world > 1 and dist.is_initialized():
        dist.destroy_process_group()
