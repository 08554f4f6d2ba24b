"""Device and autocast-dtype names checked against what this machine has, before any work starts.

Every command with a ``--device`` or ``--dtype`` option parses it through :func:`check_device` /
:func:`check_dtype` (as argparse types in :mod:`coupled_qk.checks.cli`), and the training loop checks
``TrainConfig.device`` the same way, so ``--device cuda:7`` on a one-GPU machine, ``--device gpu`` or
``--device ""`` is one line listing the devices that exist, never a torch traceback after the data loaded.

Level 0 of the layering (imports torch only).
"""

from __future__ import annotations

import re

import torch

__all__ = ["AUTOCAST_DTYPES", "TORCH_DTYPES", "available_devices", "check_device", "check_device_name", "check_dtype"]

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
"""The torch dtype each fixed dtype name stands for (``fp32``: no autocast)."""

AUTOCAST_DTYPES = ("auto", *TORCH_DTYPES)
"""Names of the autocast dtypes (``auto``: bf16 on CUDA, fp32 elsewhere): the one list every option, config field
and check reads (``--dtype``, ``TrainConfig.dtype``, ``bench``)."""

_DEVICE = re.compile(r"^(cpu|cuda|mps)(?::(\d+))?$")


def available_devices() -> list[str]:
    """The device names this machine accepts: ``auto``, ``cpu``, and ``cuda``, ``cuda:0``... / ``mps`` where
    present."""
    names = ["auto", "cpu"]
    if torch.cuda.is_available():
        names += ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        names.append("mps")
    return names


def check_device(option: str, value, *, allow_auto: bool = True) -> str:
    """``value`` normalised (stripped, lower case) if it names a device this machine has.

    Args:
        option: how the user named the value (``"--device"``, ``"TrainConfig.device"``).
        value: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"`` (a ``str``; a ``torch.device`` is
            accepted and converted).
        allow_auto: whether ``"auto"`` is accepted.

    Raises:
        ValueError: naming ``option`` and listing the available devices, for a non-string, an empty or unknown
            name, or a device that is not present (CUDA without a GPU, ``cuda:N`` past the device count).
    """
    if isinstance(value, torch.device):
        value = str(value)
    available = available_devices() if allow_auto else available_devices()[1:]
    given = f"{option}={value!r}"
    if not isinstance(value, str):
        raise ValueError(f"{given} must be a device name; available here: {', '.join(available)}")
    name = value.strip().lower()
    if name == "auto" and allow_auto:
        return name
    match = _DEVICE.match(name)
    if match is None:
        raise ValueError(f"{given} is not a device name; available here: {', '.join(available)}")
    if name not in available and not (match.group(1) == "cpu" and match.group(2) in (None, "0")):
        raise ValueError(f"{given} is not available on this machine; available here: {', '.join(available)}")
    return name


def resolve_device(option: str, value) -> torch.device:
    """The ``torch.device`` that ``value`` names (:func:`check_device`; ``"auto"``: CUDA when available, else CPU).

    Raises:
        ValueError: as :func:`check_device`, naming ``option``.
    """
    name = check_device(option, value)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else torch.device(name)


def check_device_name(option: str, value) -> str:
    """``value`` if it is *spelled* as a device (``auto``, ``cpu``, ``cuda``, ``cuda:N``, ``mps``), whether or not
    this machine has it: for configs that may be read on another machine (a GPU run's config on a laptop).

    Raises:
        ValueError: naming ``option``, for anything else.
    """
    if not isinstance(value, str) or not (value.strip().lower() == "auto" or _DEVICE.match(value.strip().lower())):
        raise ValueError(f"{option}={value!r} is not a device name; expected auto, cpu, cuda, cuda:N or mps")
    return value


def check_dtype(option: str, value, device: str = "auto") -> str:
    """``value`` if it is an autocast dtype name usable on ``device`` (bf16 on CUDA needs hardware support).

    Raises:
        ValueError: naming ``option``, listing :data:`AUTOCAST_DTYPES`, for an unknown name or bf16 on a GPU
            without bf16.
    """
    given = f"{option}={value!r}"
    if not isinstance(value, str) or value.strip().lower() not in AUTOCAST_DTYPES:
        raise ValueError(f"{given} is unknown; expected one of {list(AUTOCAST_DTYPES)}")
    name = value.strip().lower()
    uses_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if name == "bf16" and uses_cuda and not torch.cuda.is_bf16_supported():
        raise ValueError(f"{given}: this GPU does not support bfloat16; use fp16 or fp32")
    return name
