"""Process-group setup for ``torchrun`` (DDP, optional FSDP2) and device/dtype selection."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from coupled_qk.checks.environment import env_value
from coupled_qk.devices import AUTOCAST_DTYPES, TORCH_DTYPES, resolve_device


@dataclass
class Runtime:
    """Where this process runs: ``rank`` of ``world`` processes, its ``device`` and autocast dtype."""

    rank: int
    world: int
    local_rank: int
    device: torch.device
    autocast_dtype: torch.dtype | None
    owns_group: bool = False  # this runtime initialised the process group (and its teardown destroys it)

    @property
    def is_main(self) -> bool:
        """Whether this process is rank 0 (the one that writes the run folder, logs and prints)."""
        return self.rank == 0

    @property
    def precision(self) -> str:
        """The autocast dtype as checkpoints record it (``state.json``): ``"fp32"`` (none), ``"bf16"``, ``"fp16"``."""
        return precision_name(self.autocast_dtype)


def precision_name(autocast_dtype: torch.dtype | None) -> str:
    """The name checkpoints (``state.json``) and results (``results.json``) record for an autocast dtype:
    ``"fp32"`` (``None``: no autocast), ``"bf16"``, ``"fp16"``."""
    return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(autocast_dtype, str(autocast_dtype))


def planned_precision(device: str, dtype: str, compiled: bool) -> str:
    """The precision (:func:`precision_name`) a run with these ``TrainConfig`` fields trains in on this machine,
    without starting it: ``--dtype auto`` resolves by device and, on a CPU with native bf16, by ``--compile``
    (:func:`pick_autocast_dtype`; its emulation warning is not given here).

    Raises:
        ValueError: an unknown or absent ``device``, an unknown ``dtype``.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return precision_name(pick_autocast_dtype(dtype, pick_device(device), compiled))


PG_TIMEOUT_ENV = "COUPLED_QK_PG_TIMEOUT_S"
"""Environment variable: seconds a collective may wait before the process group fails (default 1800)."""

DEFAULT_PG_TIMEOUT_S = 1800.0
"""Default process-group timeout: rank 0 alone tokenizes a corpus and writes checkpoints while the other ranks
wait in a collective; 30 minutes covers WikiText-103's tokenization on one core, and a real hang still ends."""


def pick_device(name: str) -> torch.device:
    """``auto`` picks CUDA when available, else CPU; other names must be devices this machine has.

    Choosing a CUDA device also enables TF32 for float32 matmuls and convolutions (:func:`enable_tf32`).

    Raises:
        ValueError: an unknown or absent device, listing the available ones
            (:func:`coupled_qk.devices.check_device`).
    """
    device = resolve_device("device", name)
    enable_tf32(device)
    return device


def enable_tf32(device: torch.device, enabled: bool = True) -> bool:
    """Let float32 matmuls and cuDNN convolutions on CUDA use TensorFloat-32: fp32 paths (the
    fp32 bench, decoding with fp32 weights, evaluation without autocast) run on the tensor cores, with a
    10-bit mantissa in the products and float32 accumulation, as PyTorch recommends for training on Ampere
    and later GPUs (https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices).

    Uses the flags ``torch.backends.cuda.matmul.allow_tf32`` and ``torch.backends.cudnn.allow_tf32`` (they keep
    the newer ``fp32_precision`` view consistent; CPU matmuls are untouched). Nothing happens for a non-CUDA
    ``device``. Returns whether the flags were set.
    """
    if torch.device(device).type != "cuda":
        return False
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    return True


def pg_timeout() -> timedelta:
    """The process-group timeout: ``$COUPLED_QK_PG_TIMEOUT_S`` seconds, else :data:`DEFAULT_PG_TIMEOUT_S`.

    Raises:
        ValueError: naming the variable, when it is not a positive number.
    """
    seconds = env_value(PG_TIMEOUT_ENV)  # declared and checked in checks.environment.ENVIRONMENT
    if seconds is None:
        return timedelta(seconds=DEFAULT_PG_TIMEOUT_S)
    return timedelta(seconds=seconds)


CPU_NATIVE_FLAGS = {"bf16": ("avx512_bf16", "amx_bf16", "bf16"), "fp16": ("avx512_fp16", "amx_fp16", "asimdhp")}
"""``/proc/cpuinfo`` flags (x86 ``flags``, Arm ``Features``) by which a CPU computes each autocast dtype natively."""


def _cpu_has(flags: tuple[str, ...]) -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.split(":")[0].strip() in ("flags", "Features"):
                    return bool(set(line.split(":", 1)[1].split()) & set(flags))
    except OSError:
        pass
    return False


def cpu_supports_bf16() -> bool:
    """Whether this CPU computes bf16 natively (x86 ``avx512_bf16`` or ``amx_bf16`` in ``/proc/cpuinfo``; Arm
    ``bf16``); ``False`` where the flags cannot be read. Without it bf16 autocast is emulated and slower."""
    return _cpu_has(CPU_NATIVE_FLAGS["bf16"])


def cpu_supports_fp16() -> bool:
    """Whether this CPU computes fp16 natively (x86 ``avx512_fp16`` or ``amx_fp16`` in ``/proc/cpuinfo``; Arm
    ``asimdhp``); ``False`` where the flags cannot be read. Without it fp16 autocast is emulated and slower."""
    return _cpu_has(CPU_NATIVE_FLAGS["fp16"])


def native_bf16(dev: torch.device) -> bool:
    """Whether ``dev`` computes bf16 natively: a CUDA GPU with bf16 units (Ampere or later,
    ``torch.cuda.is_bf16_supported(including_emulation=False)``) or a CPU with native bf16 (:func:`cpu_supports_bf16`);
    never another device (``mps``)."""
    if dev.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    return dev.type == "cpu" and cpu_supports_bf16()


def warn_if_emulated(dtype: str, device: torch.device) -> bool:
    """A ``RuntimeWarning`` (and ``True``) when ``dtype`` (an autocast dtype name) is ``"bf16"`` or ``"fp16"`` on
    a CPU that does not compute it natively (:func:`cpu_supports_bf16`, :func:`cpu_supports_fp16`): autocast is
    then emulated, several times slower than fp32. Every path that runs under an explicitly asked autocast dtype
    calls it (training: :func:`pick_autocast_dtype`; ``bench``: its ``resolve_dtype``). Said once per process."""
    if torch.device(device).type != "cpu" or dtype not in ("bf16", "fp16"):
        return False
    if (cpu_supports_bf16 if dtype == "bf16" else cpu_supports_fp16)():
        return False
    measured = (
        "9.4x for a tiny training step on an AVX2 CPU"
        if dtype == "bf16"
        else "16x for a small MLP training step on an AVX2 CPU"
    )
    warnings.warn(
        f"dtype {dtype} on a CPU without native {dtype} (no {'/'.join(CPU_NATIVE_FLAGS[dtype][:2])} flag "
        f"in /proc/cpuinfo): autocast is emulated, several times slower than fp32 ({measured}); use fp32 "
        "or auto for speed",
        RuntimeWarning,
        stacklevel=2,
    )
    return True


def pick_autocast_dtype(dtype: str, device: torch.device, compiled: bool = False) -> torch.dtype | None:
    """``auto``: bf16 autocast on CUDA (fp16 if bf16 is unsupported); on CPU none (fp32), except for a compiled
    model on a CPU with native bf16 (:func:`cpu_supports_bf16`), where bf16 autocast is the fast path (
    weights and optimizer stay fp32; ``dtype="fp32"`` opts out). An explicit ``"bf16"`` or ``"fp16"`` on a CPU
    without it natively is used as asked, with a ``RuntimeWarning`` (:func:`warn_if_emulated`): autocast is then
    emulated and several times slower than fp32 (docs/SPEED.md).

    Raises:
        ValueError: ``dtype`` not one of ``auto``, ``fp32``, ``bf16``, ``fp16``.
    """
    if dtype not in AUTOCAST_DTYPES:
        raise ValueError(f"dtype={dtype!r} is unknown; expected one of {list(AUTOCAST_DTYPES)}")
    if dtype == "auto" and device.type == "cpu" and compiled and cpu_supports_bf16():
        return torch.bfloat16
    warn_if_emulated(dtype, device)
    if dtype == "fp32" or (dtype == "auto" and device.type != "cuda"):
        return None
    if dtype == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return TORCH_DTYPES[dtype]


def setup_runtime(device: str = "auto", dtype: str = "auto", compiled: bool = False) -> Runtime:
    """Initialise the process group when launched by ``torchrun`` (``WORLD_SIZE > 1``).

    The backend is NCCL on CUDA and gloo on CPU; each process uses ``cuda:LOCAL_RANK``. An existing process
    group is reused (and left in place by :func:`teardown`). Collectives time out
    after :func:`pg_timeout` (``$COUPLED_QK_PG_TIMEOUT_S``, default 30 minutes) instead of hanging.

    Raises:
        ValueError: CUDA requested but unavailable, or a bad ``$COUPLED_QK_PG_TIMEOUT_S``.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = pick_device(device)
    owns = False
    if world > 1:
        if dev.type == "cuda":
            dev = torch.device("cuda", local_rank)
            torch.cuda.set_device(dev)
        owns = not dist.is_initialized()
        if owns:
            dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo", timeout=pg_timeout())
    with warnings.catch_warnings():
        if rank != 0:  # said once, by rank 0, not by every process of torchrun
            warnings.simplefilter("ignore", RuntimeWarning)
        autocast = pick_autocast_dtype(dtype, dev, compiled)
    return Runtime(rank, world, local_rank, dev, autocast, owns_group=owns)


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
    """Destroy the process group if this runtime created it (a group made by the caller, e.g. a study that
    trains many runs under one ``torchrun``, is left to the caller)."""
    if runtime.owns_group and dist.is_initialized():
        dist.destroy_process_group()
