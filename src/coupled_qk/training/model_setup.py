"""Building the model's training machinery: the optimizer, the DDP/FSDP wrapper and regional compilation with
its probe, gradient norms, and full (unsharded) state dicts for checkpoints. Used by the training loop
(:mod:`coupled_qk.training.loop`); each function works for one process, DDP and FSDP2 alike.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from pathlib import Path

import torch

from coupled_qk.models.compiled import compile_error_summary, compile_regions, uncompile_regions
from coupled_qk.models.gpt import GPT, current_state_key
from coupled_qk.ops.losses import next_token_loss
from coupled_qk.training.checkpoint_format import Checkpoint
from coupled_qk.training.config import TrainConfig
from coupled_qk.training.distributed import Runtime, broadcast_ok


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, fused: bool = False) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices (``dim >= 2``) and none on vectors (norms, ``dt``, lambdas)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    kwargs = {"fused": True} if fused else {}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), **kwargs)


def wrap_model(model: GPT, cfg: TrainConfig, runtime: Runtime) -> torch.nn.Module:
    """The module the training step calls: ``model`` itself, wrapped in DDP under ``torchrun``, or sharded in
    place with FSDP2 (``cfg.fsdp``); compiled per block in place when ``cfg.compile`` (parameter names, hence
    checkpoints, resume and export, are unchanged)."""
    wrapped: torch.nn.Module = model
    if runtime.world > 1 and cfg.fsdp:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    elif runtime.world > 1:
        ids = [runtime.device.index] if runtime.device.type == "cuda" else None
        wrapped = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
    if cfg.compile:  # regional and in place: parameter names (checkpoints, resume, export) are unchanged
        compile_regions(model)
    return wrapped


def compile_probe(wrapped, model, task, cfg: TrainConfig, runtime: Runtime, step: int, autocast: dict, say) -> dict:
    """Compile now, on one forward and backward of the first training batch (compilation is lazy: without this a
    compiler error would abort the run at its first step). On failure (on any rank) the model trains eagerly,
    with one warning. The probe leaves no trace: gradients are dropped and the random state is restored.

    Returns ``{"compiled": bool, "compile_s": float, "error": str | None}``."""
    start, error = time.perf_counter(), None
    devices = [runtime.device] if runtime.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        try:
            x, y = task.train_batch(step, 0, runtime.rank, runtime.world, cfg.batch_size, runtime.device)
            ctx = wrapped.no_sync() if hasattr(wrapped, "no_sync") else contextlib.nullcontext()
            with ctx:
                with torch.autocast(**autocast):
                    loss = next_token_loss(wrapped(x), y)
                loss.backward()
        except Exception as exc:  # noqa: BLE001 - any compiler failure: train eagerly
            error = compile_error_summary(exc)
    for p in model.parameters():
        p.grad = None
    warned = error is None and bool(getattr(model, "compile_info", {}).get("error"))
    if warned:
        error = model.compile_info["error"]  # GPT fell back to eager on the forward and has warned
    if not broadcast_ok(error is None, runtime):
        error = error or "compilation failed on another rank"
        uncompile_regions(model, error)
        if not warned:
            warnings.warn(f"torch.compile failed ({error}); training eagerly", RuntimeWarning, stacklevel=2)
    seconds = time.perf_counter() - start
    say(f"compile: {'failed, training eagerly' if error else f'compiled (regional) in {seconds:.1f} s'}")
    return {"compiled": error is None, "compile_s": seconds, "error": error}


def full_states(model: GPT, optimizer, cfg: TrainConfig, runtime: Runtime) -> tuple[dict, dict]:
    """The full (unsharded, CPU) model and optimizer state dicts to checkpoint, under FSDP or not."""
    if runtime.world > 1 and cfg.fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_state_dict(model, optimizer, options=opts)
    return model.state_dict(), optimizer.state_dict()


def current_optimizer_state(opt_state: dict) -> dict:
    """``opt_state`` (a full optimizer state dict) with the parameter names of an earlier layout renamed
    (:func:`~coupled_qk.models.gpt.current_state_key`: FSDP's state names the parameters, and Differential
    Attention's moved into the layer's ``scorer``); a state numbering the parameters is returned as it is (their
    order has not changed: :class:`~coupled_qk.layers.differential.DifferentialScoring`)."""
    groups = opt_state["param_groups"]
    if not any(isinstance(p, str) for g in groups for p in g["params"]):
        return opt_state
    renamed = [{**g, "params": [current_state_key(p) for p in g["params"]]} for g in groups]
    return {"state": {current_state_key(k): v for k, v in opt_state["state"].items()}, "param_groups": renamed}


def load_optimizer_state(model: GPT, optimizer, opt_state: dict, cfg: TrainConfig, runtime: Runtime) -> None:
    """Load a full optimizer state dict (as :func:`full_states` saved it, in this layout or an earlier one:
    :func:`current_optimizer_state`) into ``optimizer``, under FSDP or not."""
    opt_state = current_optimizer_state(opt_state)
    if runtime.world > 1 and cfg.fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
        set_optimizer_state_dict(model, optimizer, opt_state, options=opts)
    else:
        optimizer.load_state_dict(opt_state)


def gradient_norm(model: torch.nn.Module, clip: float) -> float:
    """Total gradient norm (clipping to ``clip`` when ``clip > 0``)."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip > 0 else math.inf)
    if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor
        norm = norm.full_tensor()
    return float(norm)


def load_full_weights(model: torch.nn.Module, folder: Path, cfg: TrainConfig, runtime: Runtime) -> None:
    """Load a checkpoint folder's full weights into ``model`` (sharded FSDP2 model or plain)."""
    if runtime.world > 1 and cfg.fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        weights = {current_state_key(k): v for k, v in Checkpoint(folder).weights().items()}
        set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=False))
    else:
        Checkpoint(folder).load_weights(model)
