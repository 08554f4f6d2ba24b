"""Process-group setup for ``torchrun`` (DDP, optional FSDP2) and device/dtype selection."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


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
    """``auto`` picks CUDA when available, else CPU; other names are passed to ``torch.device``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} requested but CUDA is not available")
    return device


def cpu_supports_bf16() -> bool:
    """Whether this CPU computes bf16 natively (x86 ``avx512_bf16`` or ``amx_bf16`` in ``/proc/cpuinfo``; Arm
    ``bf16``); ``False`` where the flags cannot be read. Without it bf16 autocast is emulated and slower."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.split(":")[0].strip() in ("flags", "Features"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})
    except OSError:
        pass
    return False


def pick_autocast_dtype(dtype: str, device: torch.device, compiled: bool = False) -> torch.dtype | None:
    """``auto``: bf16 autocast on CUDA (fp16 if bf16 is unsupported); on CPU none (fp32), except for a compiled
    model on a CPU with native bf16 (:func:`cpu_supports_bf16`), where bf16 autocast is the fast path (issue 29;
    weights and optimizer stay fp32; ``dtype="fp32"`` opts out)."""
    if dtype == "auto" and device.type == "cpu" and compiled and cpu_supports_bf16():
        return torch.bfloat16
    if dtype == "fp32" or (dtype == "auto" and device.type != "cuda"):
        return None
    if dtype == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]


def setup_runtime(device: str = "auto", dtype: str = "auto", compiled: bool = False) -> Runtime:
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
    return Runtime(rank, world, local_rank, dev, pick_autocast_dtype(dtype, dev, compiled))


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
