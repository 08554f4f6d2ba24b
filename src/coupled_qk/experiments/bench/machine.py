"""Where the bench numbers come from (CPU, cores, torch, device, the environment variables that change timings)
and the timing primitives every bench module shares (waiting for the accelerator, counting compiled graphs)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

from coupled_qk.allocator import allocator_state, shown, user_tuning_env


def cpu_model() -> str:
    """The CPU model name from ``/proc/cpuinfo`` (Linux), else :func:`platform.processor`."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":")[0].strip() in ("model name", "Hardware", "cpu model"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


TIMING_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "LD_PRELOAD")
"""Environment variables that change CPU timings (threads, a preloaded allocator); with them every variable that
tunes glibc's malloc (:func:`~coupled_qk.allocator.user_tuning_env`: ``MALLOC_*``, ``GLIBC_TUNABLES``)."""


def machine_info(device: torch.device) -> dict:
    """Where the numbers come from: CPU, cores, torch version and threads, device and GPU name, the
    :data:`TIMING_ENV` and malloc-tuning variables that are set (``env``) and what
    :func:`~coupled_qk.allocator.tune_cpu_allocator` did to this process's ``malloc`` (``allocator``)."""
    info = dict(
        cpu=cpu_model(),
        cpu_count=os.cpu_count(),
        platform=platform.platform(),
        python=platform.python_version(),
        torch=torch.__version__,
        threads=torch.get_num_threads(),
        device=str(device),
        cuda=None,
        env={k: os.environ[k] for k in (*TIMING_ENV, *user_tuning_env(os.environ)) if k in os.environ},
        allocator=allocator_state(),
    )
    if device.type == "cuda":
        info["cuda"] = torch.cuda.get_device_name(device)
        info["cuda_version"] = torch.version.cuda
    return info


def machine_line(m: dict) -> str:
    """The markdown line describing :func:`machine_info`'s ``m`` (results written before ``env`` existed too)."""
    gpu = f", GPU {m['cuda']}" if m.get("cuda") else ""
    env = "".join(f"; {k}={shown(v)}" for k, v in (m.get("env") or {}).items())
    allocator = f"; malloc: {m['allocator']}" if m.get("allocator") else ""
    return (
        f"- machine: {m['cpu']} ({m['cpu_count']} logical CPUs){gpu}; torch {m['torch']}, {m['threads']} threads"
        f"{env}{allocator}; {m.get('platform', '?')}"
    )


def report_header(kind: str, result: dict, machine_note: str = "") -> list[str]:
    """The first lines of a bench result's markdown: the title (``kind``, preset and device), a blank line, the
    machine line (:func:`machine_line`, then ``machine_note``) and the command."""
    return [
        f"# {kind} benchmark: {result.get('preset', '?')} preset on {result['settings']['device']}",
        "",
        machine_line(result["machine"]) + machine_note,
        f"- command: `{result.get('command', '')}`",
    ]


def compiled_graphs() -> int:
    """Graphs compiled by ``torch.compile`` in this process so far (Dynamo's ``unique_graphs`` counter)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def sync_device(device: torch.device) -> None:
    """Wait for the queued CUDA work on ``device`` (a no-op on CPU), so that a timer reads finished work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
