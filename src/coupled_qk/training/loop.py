"""The one training loop: language modelling, MQAR and any task with the same small interface.

A task (registered in :data:`coupled_qk.training.tasks.TASKS`) implements :class:`coupled_qk.training.tasks.Task`:
``model_overrides() -> dict``, ``describe() -> dict``, ``train_batch(step, micro, rank, world, batch_size,
device) -> (x, y)`` (a pure function of its arguments, which makes resume exact and multi-process runs match
one process), ``step_tokens(step, world) -> int``, ``evaluate(model, device, quick, autocast_dtype) -> dict``
and ``save(run_dir)``. The run folder's layout is :class:`coupled_qk.training.rundir.RunDir`.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from coupled_qk.models.config import GPTConfig
from coupled_qk.models.gpt import GPT
from coupled_qk.ops.losses import next_token_loss
from coupled_qk.training import checkpoint as ckpt
from coupled_qk.training.config import (
    CONTINUATION_FIELDS,
    TrainConfig,
    config_differences,
    describe_differences,
)
from coupled_qk.training.distributed import Runtime, all_reduce_mean, barrier, setup_runtime, teardown
from coupled_qk.training.rundir import RunDir
from coupled_qk.training.tasks import steps_for_tokens, task_class


def lr_at(step: int, cfg: TrainConfig, total_steps: int) -> float:
    """Linear warmup over ``warmup_steps`` then cosine decay to ``min_lr_ratio * lr`` at ``total_steps``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps))
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - floor)


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, fused: bool = False) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices (``dim >= 2``) and none on vectors (norms, ``dt``, lambdas)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    kwargs = {"fused": True} if fused else {}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), **kwargs)


def total_steps_of(cfg: TrainConfig, task, world: int) -> int:
    """Schedule horizon: ``max_steps``, or the steps whose real tokens (:meth:`Task.step_tokens`) reach
    ``max_tokens``, whichever is smaller."""
    if not cfg.max_tokens:
        return cfg.max_steps
    return steps_for_tokens(task, cfg.max_tokens, world, cfg.max_steps)


def _build_task(cfg: TrainConfig, run_dir: Path, runtime: Runtime):
    task_cls = task_class(cfg.task)
    if runtime.is_main:  # rank 0 fills the caches first, the others then read them
        task = task_cls(cfg, run_dir)
        barrier(runtime)
    else:
        barrier(runtime)
        task = task_cls(cfg, run_dir)
    return task


def _wrap(model: GPT, cfg: TrainConfig, runtime: Runtime) -> torch.nn.Module:
    wrapped: torch.nn.Module = model
    if runtime.world > 1 and cfg.fsdp:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    elif runtime.world > 1:
        ids = [runtime.device.index] if runtime.device.type == "cuda" else None
        wrapped = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
    if cfg.compile:
        try:
            wrapped = torch.compile(wrapped)
        except Exception as exc:  # pragma: no cover - depends on the platform's compiler
            warnings.warn(f"torch.compile failed ({exc}); training eagerly", stacklevel=2)
    return wrapped


def _full_states(model: GPT, optimizer, cfg: TrainConfig, runtime: Runtime) -> tuple[dict, dict]:
    if runtime.world > 1 and cfg.fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_state_dict(model, optimizer, options=opts)
    return model.state_dict(), optimizer.state_dict()


def _load_optimizer_state(model: GPT, optimizer, opt_state: dict, cfg: TrainConfig, runtime: Runtime) -> None:
    if runtime.world > 1 and cfg.fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
        set_optimizer_state_dict(model, optimizer, opt_state, options=opts)
    else:
        optimizer.load_state_dict(opt_state)


class _Logger:
    """JSON-lines metrics (``metrics.jsonl``), TensorBoard scalars and the progress bar, on rank 0 only."""

    def __init__(self, run_dir: Path, cfg: TrainConfig, runtime: Runtime, start_step: int, total_steps: int):
        self.active = runtime.is_main
        self.file = None
        self.tb = None
        self.bar = None
        if not self.active:
            return
        path = RunDir(run_dir).metrics_path
        if path.exists():  # drop entries a killed run wrote after its last checkpoint
            keep = [line for line in path.read_text().splitlines() if json.loads(line).get("step", 0) <= start_step]
            path.write_text("".join(line + "\n" for line in keep))
        self.file = path.open("a")
        if cfg.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(RunDir(run_dir).tensorboard_dir))
            except ImportError:
                warnings.warn("tensorboard is not installed; logging JSON lines only", stacklevel=2)
        self.bar = tqdm(total=total_steps, initial=start_step, disable=not cfg.progress, unit="step", dynamic_ncols=True)

    def log(self, record: dict) -> None:
        if not self.active:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.tb.add_scalar(key, value, record["step"])

    def progress(self, n: int, **postfix) -> None:
        if self.bar is not None:
            self.bar.update(n)
            self.bar.set_postfix(postfix, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.file is not None:
            self.file.close()
        if self.tb is not None:
            self.tb.close()


def train(cfg: TrainConfig, task=None) -> dict:
    """Train a :class:`~coupled_qk.GPT` on ``cfg.task`` and return the run's results (also ``results.json``).

    Writes into ``cfg.out_dir``: ``config.json``, ``metrics.jsonl`` (training loss, learning rate, tokens/s and
    validation metrics), TensorBoard events, atomic checkpoints (:mod:`coupled_qk.training.checkpoint`) and
    ``results.json`` with the final validation/test metrics.

    Raises:
        ValueError: ``out_dir`` already holds checkpoints and ``resume`` is off (nothing is overwritten), or
            the checkpoint to resume was made with a different model configuration.
    """
    runtime = setup_runtime(cfg.device, cfg.dtype)
    try:
        return _train(cfg, task, runtime)
    finally:
        teardown(runtime)


def _train(cfg: TrainConfig, task, runtime: Runtime) -> dict:
    run_dir, run = Path(cfg.out_dir), RunDir(cfg.out_dir)
    has_ckpt = run.has_checkpoint()
    if has_ckpt and not cfg.resume:
        raise ValueError(f"{run_dir} already holds checkpoints; pass --resume to continue it or choose another --out-dir")
    if cfg.resume and has_ckpt and run.config_path.is_file():
        # the model is compared field by field against the checkpoint below
        ignore = CONTINUATION_FIELDS | {"model", "preset"}
        diff = config_differences(run.read_config(), cfg, ignore)
        if diff:
            raise ValueError(
                f"cannot resume {run_dir}: the run was made with a different config ({describe_differences(diff)}); "
                "only the budget, logging and paths may change on --resume"
            )
    if cfg.resume and not has_ckpt and runtime.is_main:
        print(f"coupled-qk: no checkpoint in {run_dir}; starting a new run there", flush=True)
    if runtime.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    barrier(runtime)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    task = task if task is not None else _build_task(cfg, run_dir, runtime)
    model_cfg = cfg.gpt_config(**task.model_overrides())
    model = GPT(model_cfg).to(runtime.device)
    state = {"step": 0, "tokens": 0, "train_seconds": 0.0}
    where = None
    if cfg.resume and has_ckpt:
        where = ckpt.resolve_checkpoint(run_dir)
        ckpt.check_compatible(GPTConfig.load(where / "model_config.json"), model_cfg, where)
        ckpt.load_weights(model, where)
        state = ckpt.read_json(where / "state.json")
    wrapped = _wrap(model, cfg, runtime)  # FSDP2 replaces the parameters: build the optimizer after it
    optimizer = build_optimizer(model, cfg, fused=runtime.device.type == "cuda")
    if where is not None:
        opt_state = torch.load(where / "optimizer.pt", map_location=runtime.device, weights_only=False)
        _load_optimizer_state(model, optimizer, opt_state, cfg, runtime)
        ckpt.set_rng_state(torch.load(where / "rng.pt", weights_only=False))
    if runtime.is_main:
        cfg.save(run.config_path)
        model_cfg.save(run.model_config_path)
        task.save(run_dir)
    total_steps = total_steps_of(cfg, task, runtime.world)
    start_step = state["step"]
    logger = _Logger(run_dir, cfg, runtime, start_step, total_steps)
    use_scaler = runtime.autocast_dtype == torch.float16
    scaler = torch.amp.GradScaler(runtime.device.type, enabled=use_scaler)
    autocast = dict(device_type=runtime.device.type, dtype=runtime.autocast_dtype, enabled=runtime.autocast_dtype is not None)
    stop_reason, last_eval = "max_steps", {}
    t_start, base_seconds = time.perf_counter(), state["train_seconds"]
    step = start_step
    window_t, window_tokens = time.perf_counter(), 0

    def save():
        model_state, opt_state = _full_states(model, optimizer, cfg, runtime)
        if runtime.is_main:
            ckpt.save_checkpoint(run_dir, model_state, model_cfg, opt_state, dict(state), keep=cfg.keep_checkpoints)
        barrier(runtime)

    wrapped.train()
    while step < total_steps:
        elapsed = base_seconds + time.perf_counter() - t_start
        if cfg.stop_after_steps is not None and step - start_step >= cfg.stop_after_steps:
            stop_reason = "stop_after_steps"
            break
        if cfg.max_minutes is not None and elapsed >= 60 * cfg.max_minutes:
            stop_reason = "max_minutes"
            break
        step_start = time.perf_counter()
        tokens_per_step = task.step_tokens(step, runtime.world)
        lr = lr_at(step, cfg, total_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=runtime.device)
        for micro in range(cfg.grad_accum):
            x, y = task.train_batch(step, micro, runtime.rank, runtime.world, cfg.batch_size, runtime.device)
            sync = micro == cfg.grad_accum - 1
            ctx = wrapped.no_sync() if (not sync and hasattr(wrapped, "no_sync")) else contextlib.nullcontext()
            with ctx, torch.autocast(**autocast):
                logits = wrapped(x)
                loss = next_token_loss(logits, y)
            scaler.scale(loss / cfg.grad_accum).backward()
            loss_sum += loss.detach()
        if cfg.grad_clip > 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        train_loss = all_reduce_mean(loss_sum.item() / cfg.grad_accum, runtime)  # one sync per step
        state.update(step=step, tokens=state["tokens"] + tokens_per_step)
        state["train_seconds"] = base_seconds + time.perf_counter() - t_start
        window_tokens += tokens_per_step
        if step % cfg.log_interval == 0 or step == total_steps:
            now = time.perf_counter()
            tps = window_tokens / max(now - window_t, 1e-9)
            window_t, window_tokens = now, 0
            logger.log({"step": step, "train/loss": train_loss, "lr": lr, "tokens": state["tokens"], "tokens_per_s": tps})
        step_tps = tokens_per_step / max(time.perf_counter() - step_start, 1e-9)
        logger.progress(1, loss=f"{train_loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{step_tps:,.0f}")
        if step % cfg.eval_interval == 0 or step == total_steps:
            last_eval = task.evaluate(model, runtime.device, quick=True, autocast_dtype=runtime.autocast_dtype)
            logger.log({"step": step, "tokens": state["tokens"], **last_eval})
            wrapped.train()
            metric = cfg.early_stop_metric
            if metric is not None and last_eval.get(metric, -math.inf) >= cfg.early_stop_value:
                stop_reason = "early_stop"
                break
        if cfg.checkpoint_interval and step % cfg.checkpoint_interval == 0 and step < total_steps:
            save()
        if not math.isfinite(train_loss):
            stop_reason = "non_finite_loss"
            break
    logger.close()
    save()
    final = task.evaluate(model, runtime.device, quick=False, autocast_dtype=runtime.autocast_dtype)
    results = {
        "config": cfg.to_dict(),
        "model_config": model_cfg.to_dict(),
        "params": model.num_parameters(),
        "data": task.describe(),
        "steps": state["step"],
        "tokens": state["tokens"],
        "train_seconds": state["train_seconds"],
        "stop_reason": stop_reason if state["step"] < total_steps or stop_reason == "early_stop" else "completed",
        "device": str(runtime.device),
        "world_size": runtime.world,
        "final": final,
    }
    if runtime.is_main:
        run.write_results(results)
    return results


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of a run's ``metrics.jsonl`` (see :meth:`RunDir.read_metrics`)."""
    return RunDir(run_dir).read_metrics()
