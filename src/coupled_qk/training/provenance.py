"""Where a run came from: a checksum of its initial weights and the hosts it trained on.

Two runs with the same settings, code and data repeat each other's arithmetic only when they start from the same
weights and run on the same kind of host (CPU or GPU model, torch build, thread count): the order of floating-point
reductions depends on all of them, and a training run amplifies a last-digit difference. The training loop stores
both in ``results.json`` (from the checkpoint state, so a resumed run keeps the checksum of its first start and
lists every host it trained on), the study records copy them, and ``study verify`` shows them beside the code
revision, so a re-run that differs can say whether it started elsewhere or ran elsewhere.
"""

from __future__ import annotations

import hashlib
import platform
from pathlib import Path

import torch
from torch import nn

__all__ = ["host", "note_host", "weights_sha256"]


def weights_sha256(module: nn.Module) -> str:
    """SHA-256 hex digest of ``module.state_dict()``: every entry in name order, each as its name, dtype and shape
    (UTF-8 text ``"<name>\\0<dtype>\\0<shape>\\0"``, e.g. ``"wte.weight\\0torch.float32\\0(64, 32)\\0"``) followed
    by its elements' bytes in row-major order (the machine's byte order, as the tensor stores them).

    Equal for two modules exactly when they hold the same names, dtypes, shapes and bit patterns, whatever device
    they are on; one changed bit changes it. Costs one read of the weights (~20 ms for 7M float32 parameters on one
    CPU core).

    Raises:
        TypeError: ``module`` is not an ``nn.Module``.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module={type(module).__name__}: expected a torch.nn.Module")
    digest = hashlib.sha256()
    state = module.state_dict()
    for name in sorted(state):
        tensor = state[name].detach()
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _cpu_name() -> str:
    """The CPU's model name (Linux ``/proc/cpuinfo``'s ``model name``), else ``platform.processor()``, else
    ``"unknown"``."""
    cpuinfo = Path("/proc/cpuinfo")
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name") and ":" in line:
                return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or "unknown"


def host(device: torch.device | str = "cpu") -> dict:
    """What decides a run's floating-point arithmetic besides its code and settings, as plain JSON values:
    ``{"cpu": model name, "machine": e.g. "x86_64", "system": e.g. "Linux", "python": "3.x.y", "torch":
    torch.__version__, "threads": torch.get_num_threads()}``, plus ``"gpu"`` (``torch.cuda.get_device_name``) and
    ``"cuda"`` (the CUDA version torch was built with) when ``device`` is a CUDA device.

    Raises:
        RuntimeError: from torch for a malformed ``device`` string.
    """
    device = torch.device(device)
    about = {
        "cpu": _cpu_name(),
        "machine": platform.machine(),
        "system": platform.system(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        about["gpu"] = torch.cuda.get_device_name(device)
        about["cuda"] = torch.version.cuda
    return about


def note_host(state: dict, device: torch.device | str = "cpu") -> None:
    """Append this process's :func:`host` to ``state["hosts"]`` (a run's checkpoint state) unless it is already the
    last entry: a run that trained on one host lists one, a run resumed elsewhere lists each host in order."""
    here = host(device)
    hosts = state.setdefault("hosts", [])
    if not hosts or hosts[-1] != here:
        hosts.append(here)
