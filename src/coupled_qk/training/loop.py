"""The one training loop: language modelling, MQAR and any task with the same small interface.

A task (registered in :data:`coupled_qk.training.tasks.TASKS`) implements :class:`coupled_qk.training.tasks.Task`:
``model_overrides() -> dict``, ``describe() -> dict``, ``train_batch(step, micro, rank, world, batch_size,
device) -> (x, y)`` (a pure function of its arguments, which makes resume exact and multi-process runs match
one process), ``step_tokens(step, world) -> int``, ``evaluate(model, device, quick, autocast_dtype) -> dict``
and a ``tokenizer`` when it has one (the run folder records it). Optionally ``build_model(model_cfg) ->
nn.Module`` (default: ``GPT(model_cfg)``): a model with ``num_parameters()`` mapping ``x`` to logits ``(..., C)``,
scored by cross-entropy against ``y`` of shape ``(...)`` (``-100`` ignored), e.g. a classifier's ``(B, C)``
against labels ``(B,)`` (the GLUE task).

The trainer holds the run folder (:class:`coupled_qk.training.run_folder.RunFolder`: its layout, lock, resume
point, precision, checkpoints, metrics and results). Reliability: stop decisions are shared by all ranks
(:mod:`~coupled_qk.training.stop`); a stop signal saves the current step; a non-finite loss or gradient norm stops
before the step is taken, so no non-finite weights are ever saved; a resume continues the run's schedule and
global batch (:mod:`~coupled_qk.training.resume`).
"""

from __future__ import annotations

import contextlib
import random
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from coupled_qk.models.config import GPTConfig
from coupled_qk.models.gpt import GPT
from coupled_qk.ops.losses import next_token_loss
from coupled_qk.output_dir import check_run_out_dir
from coupled_qk.training.best import check_metrics, track_best
from coupled_qk.training.checkpoint_format import Checkpoint, check_compatible
from coupled_qk.training.config import TrainConfig, auto_eval_interval, higher_is_better
from coupled_qk.training.distributed import Runtime, barrier, broadcast_ok, pick_autocast_dtype, setup_runtime, teardown
from coupled_qk.training.eval_budget import auto_eval_batches, time_summary, validations_of
from coupled_qk.training.lock import RunLockedError
from coupled_qk.training.metrics_log import Logger
from coupled_qk.training.model_setup import (
    build_optimizer,
    compile_probe,
    full_states,
    gradient_norm,
    load_full_weights,
    load_optimizer_state,
    wrap_model,
)
from coupled_qk.training.provenance import note_host, weights_sha256
from coupled_qk.training.resume import Schedule, lr_at, plan_batch, plan_schedule
from coupled_qk.training.run_folder import RunFolder
from coupled_qk.training.stop import Decision, SignalCatcher, StopControl, TrainingDiverged, TrainingInterrupted
from coupled_qk.training.tasks import steps_for_tokens, task_class

__all__ = [
    "train",
    "lr_at",
    "total_steps_of",
    "build_optimizer",
    "check_metrics",
    "track_best",
    "TrainingDiverged",
    "TrainingInterrupted",
]

GRAD_SCALE_INIT = 2.0**16  # torch's default initial fp16 loss scale


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


def train(cfg: TrainConfig, task=None) -> dict:
    """Train a :class:`~coupled_qk.GPT` on ``cfg.task`` and return the run's results (also ``results.json``).

    Writes the run folder ``cfg.out_dir`` (:class:`~coupled_qk.training.run_folder.RunFolder`: configs, data
    description, metrics records, TensorBoard events, atomic checksummed checkpoints and the results with the final
    validation/test metrics), locked for this run.

    Raises:
        ValueError: ``out_dir`` already holds checkpoints and ``resume`` is off (nothing is overwritten);
            the checkpoint to resume was made with a different model, config, global batch, budget, data or
            precision (:meth:`RunFolder.resume_point`, :mod:`coupled_qk.training.resume`); it is damaged;
            ``out_dir`` is a checkpoint folder.
        RunLockedError: another process is writing ``out_dir`` (a ``ValueError`` naming it).
        TrainingInterrupted: ``SIGINT``/``SIGTERM`` stopped the run after saving the current step.
        TrainingDiverged: the loss or gradient norm became non-finite (nothing was saved after the last good
            checkpoint).
    """
    run_dir = Path(cfg.out_dir)
    check_run_out_dir(run_dir)
    runtime = setup_runtime(cfg.device, cfg.dtype, compiled=cfg.compile)
    created = not run_dir.exists()
    lock, error = RunFolder(run_dir).lock(), None
    try:
        if runtime.is_main:
            try:
                lock.acquire()
            except RunLockedError as exc:
                error = exc
        if not broadcast_ok(error is None, runtime):
            raise error or RunLockedError(f"run folder {run_dir} is in use by another process")
        return _train(cfg, task, runtime, RunFolder(run_dir))
    finally:
        lock.release()
        if created and runtime.is_main and run_dir.is_dir() and not any(run_dir.iterdir()):
            run_dir.rmdir()  # a run that failed before writing anything leaves no folder behind
        teardown(runtime)


def _resume_point(cfg: TrainConfig, run: RunFolder, runtime: Runtime, say) -> tuple[dict, Path | None]:
    """The run's starting state (``step``, ``tokens``, ``train_seconds``, ...) and the checkpoint folder it resumes
    from (``None`` for a new run) (:meth:`RunFolder.resume_point`); a resume keeps its global batch (planned) and its
    precision (``runtime``'s autocast dtype set to the run's: :meth:`RunFolder.resume_precision`)."""
    state, where = run.resume_point(cfg, say)
    if where is not None:
        plan_batch(state, run.read_config() or {}, cfg, runtime.world, say)
        precision = run.resume_precision(state, runtime.precision, cfg, say)
        if precision != runtime.precision:
            runtime.autocast_dtype = pick_autocast_dtype(precision, runtime.device)
    return state, where


DATA_DECIDED = ("vocab_size", "block_size")
"""Model fields a task may take from its data (:meth:`~coupled_qk.training.tasks.Task.model_overrides`: the
tokenizer's vocabulary, the MQAR sequences' length); a GLUE checkpoint decides every field."""


def _check_model_before_data(cfg: TrainConfig, where: Path) -> None:
    """Refuse a resume whose model differs from its checkpoint's in a field its data do not decide (``--attention``,
    ``--set n_layer=...``) before the data are read (minutes for a large corpus); the full comparison
    (:func:`check_compatible`) follows once the task has set its fields.

    Raises:
        ValueError: naming the checkpoint and each differing field.
    """
    if cfg.task == "glue":  # the pretrained checkpoint decides the whole model
        return
    saved = Checkpoint(where).model_config()
    decided = {k: getattr(saved, k) for k in DATA_DECIDED if k not in cfg.model}
    check_compatible(saved, GPTConfig.from_preset(cfg.preset, **{**cfg.model, **decided}), where)


def _plan(cfg: TrainConfig, state: dict, task, runtime: Runtime, say) -> tuple[Schedule, int]:
    """The learning-rate schedule and the quick-validation interval of the run (warning about a warmup that never
    ends and announcing an automatic interval)."""
    sched = plan_schedule(state, cfg, total_steps_of(cfg, task, runtime.world), say)
    if runtime.is_main and cfg.warmup_steps >= sched.horizon - sched.start:
        warnings.warn(
            f"warmup_steps={cfg.warmup_steps} is at least the schedule's {sched.horizon - sched.start} steps: "
            "the learning rate never reaches --lr and the cosine decay never runs; set --warmup-steps "
            f"below the step count (e.g. {max(1, (sched.horizon - sched.start) // 10)}, 10% of it)",
            stacklevel=3,
        )
    eval_interval = cfg.eval_interval if cfg.eval_interval is not None else auto_eval_interval(sched.end)
    sized = "eval_batches" in getattr(task, "config_fields", ())  # the task reads eval_batches (language models)
    if sized:
        task.eval_batches = (
            cfg.eval_batches
            if cfg.eval_batches is not None
            else auto_eval_batches(sched.end, cfg.grad_accum, eval_interval)
        )
    if (cfg.eval_interval is None or (sized and cfg.eval_batches is None)) and state["step"] < sched.end:
        batches = f" on {task.eval_batches} batches" if sized and not cfg.full_eval else ""
        say(
            f"quick validation every {eval_interval} steps{batches} ({validations_of(sched.end, eval_interval)} "
            f"over the run's {sched.end} steps; --eval-interval, --eval-batches to change)"
        )
    return sched, eval_interval


class _Trainer:
    """The objects one training run shares (model, its wrapper, optimizer, loss scaler, state) and the pieces of
    its loop: one optimisation step, validation with its stop rules, checkpoints. :func:`_train` drives it."""

    def __init__(
        self,
        cfg: TrainConfig,
        runtime: Runtime,
        run: RunFolder,
        task,
        model_cfg: GPTConfig,
        state: dict,
        where: Path | None,
        sched: Schedule,
    ):
        self.cfg, self.runtime, self.run, self.task = cfg, runtime, run, task
        self.model_cfg, self.state, self.sched = model_cfg, state, sched
        self.model = getattr(task, "build_model", GPT)(model_cfg).to(runtime.device)
        resumed = run.checkpoint(where) if where is not None else None
        if resumed is not None:
            resumed.load_weights(self.model)
        else:  # before any wrapper replaces the parameters; a resumed run keeps its first start's checksum
            state["initial_weights_sha256"] = weights_sha256(self.model)
        note_host(state, runtime.device)
        self.wrapped = wrap_model(
            self.model, cfg, runtime
        )  # FSDP2 replaces the parameters: build the optimizer after it
        self.optimizer = build_optimizer(self.model, cfg, fused=runtime.device.type == "cuda")
        self.use_scaler = runtime.autocast_dtype == torch.float16
        self.scaler = torch.amp.GradScaler(runtime.device.type, init_scale=GRAD_SCALE_INIT, enabled=self.use_scaler)
        if resumed is not None:
            load_optimizer_state(self.model, self.optimizer, resumed.optimizer_state(runtime.device), cfg, runtime)
            resumed.restore_rng()
            if self.use_scaler and state.get("grad_scaler"):
                self.scaler.load_state_dict(state["grad_scaler"])
        self.autocast = dict(
            device_type=runtime.device.type, dtype=runtime.autocast_dtype, enabled=runtime.autocast_dtype is not None
        )
        self.saved_step = state["step"]
        self.stop: StopControl | None = None  # set when the loop starts (it needs the signal catcher)
        self.metrics_checked = False
        self.window: list = [time.perf_counter(), 0]  # the logging window: start time, tokens (reset at the loop)
        self.train_tokens = (task.describe().get("tokens") or {}).get("train") if hasattr(task, "describe") else None

    def save(self, step: int) -> Path | None:
        """Checkpoint the current step (every rank takes part; rank 0 writes) and return its folder (rank 0)."""
        cfg, runtime, state = self.cfg, self.runtime, self.state
        state.update(
            schedule=self.sched.to_dict(),
            grad_scaler=self.scaler.state_dict() if self.use_scaler else None,
            global_batch={"batch_size": cfg.batch_size, "world_size": runtime.world, "grad_accum": cfg.grad_accum},
            precision=runtime.precision,
        )
        model_state, opt_state = full_states(self.model, self.optimizer, cfg, runtime)
        path, error = None, None
        if runtime.is_main:
            try:
                path = self.run.save(model_state, self.model_cfg, opt_state, dict(state), keep=cfg.keep_checkpoints)
            except Exception as exc:  # every rank must learn of it, or the others wait forever
                error = exc
        if not broadcast_ok(error is None, runtime):
            raise error or RuntimeError("rank 0 failed to save a checkpoint")
        self.saved_step = step
        self.stop.checkpointed()
        return path

    def save_best(self, info: dict) -> None:
        """Write the best-validation checkpoint (``info``: its metric and step)."""
        if self.runtime.world > 1 and self.cfg.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            model_state = get_model_state_dict(
                self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
            )
        else:
            model_state = self.model.state_dict()
        error = None
        if self.runtime.is_main:
            try:
                self.run.save_best(model_state, self.model_cfg, info)
            except Exception as exc:  # every rank must learn of it
                error = exc
        if not broadcast_ok(error is None, self.runtime):
            raise error or RuntimeError("rank 0 failed to save the best checkpoint")

    def optimizer_step(self, step: int, lr: float) -> tuple[float, Decision]:
        """Step ``step`` (0-based) at learning rate ``lr``: forward and backward of every micro-batch, clipping,
        the shared stop decision, then the update (not taken when the loss or gradient is non-finite:
        :class:`TrainingDiverged`). Returns the gradient norm and the decision."""
        cfg, runtime, task, wrapped, scaler = self.cfg, self.runtime, self.task, self.wrapped, self.scaler
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=runtime.device)
        for micro in range(cfg.grad_accum):
            x, y = task.train_batch(step, micro, runtime.rank, runtime.world, cfg.batch_size, runtime.device)
            sync = micro == cfg.grad_accum - 1
            ctx = wrapped.no_sync() if (not sync and hasattr(wrapped, "no_sync")) else contextlib.nullcontext()
            with ctx, torch.autocast(**self.autocast):
                logits = wrapped(x)
                loss = next_token_loss(logits, y)
            scaler.scale(loss / cfg.grad_accum).backward()
            loss_sum += loss.detach()
        scaler.unscale_(self.optimizer)
        grad_norm = gradient_norm(self.model, cfg.grad_clip)
        # one collective per step: the loss and every stop decision (the fp16 scaler skips inf gradients)
        decision = self.stop.sync(loss_sum.item(), cfg.grad_accum, None if self.use_scaler else grad_norm)
        if decision.non_finite:
            last = (
                f"the last good checkpoint is {self.run.latest_checkpoint()}"
                if self.run.latest_path.is_file()
                else "the run has no checkpoint yet"
            )
            raise TrainingDiverged(
                f"training became non-finite at step {step + 1} (loss {loss_sum.item() / cfg.grad_accum:.4g}, "
                f"gradient norm {grad_norm:.4g}, learning rate {lr:.3g}); the step was not taken and nothing "
                f"was saved after it ({last}); lower --lr or raise --warmup-steps"
            )
        scaler.step(self.optimizer)
        scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm, decision

    def log_step(
        self,
        logger: Logger,
        step: int,
        lr: float,
        grad_norm: float,
        train_loss: float,
        tokens_per_step: int,
        step_start: float,
    ) -> None:
        """Log the training record every ``log_interval`` steps and at the last (throughput over the window since
        the previous record) and advance the progress bar (this step's throughput)."""
        self.window[1] += tokens_per_step
        if step % self.cfg.log_interval == 0 or step == self.sched.end:
            now = time.perf_counter()
            tps = self.window[1] / max(now - self.window[0], 1e-9)
            self.window = [now, 0]
            record = {
                "step": step,
                "train/loss": train_loss,
                "lr": lr,
                "tokens": self.state["tokens"],
                "tokens_per_s": tps,
                "grad_norm": grad_norm,
            }
            logger.log({**record, "loss_scale": self.scaler.get_scale()} if self.use_scaler else record)
        step_tps = tokens_per_step / max(time.perf_counter() - step_start, 1e-9)
        logger.progress(1, loss=f"{train_loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{step_tps:,.0f}")

    def validate(self, step: int, logger: Logger) -> tuple[dict, str | None]:
        """Quick validation at ``step``, logged; returns its metrics and why to stop (``"patience"`` or
        ``"early_stop"``) or ``None``. Saves the best checkpoint when ``best_metric`` improved."""
        cfg = self.cfg
        metrics = self.task.evaluate(
            self.model, self.runtime.device, quick=True, autocast_dtype=self.runtime.autocast_dtype
        )
        logger.log({"step": step, "tokens": self.state["tokens"], **metrics})
        self.wrapped.train()
        if not self.metrics_checked:  # the metric names are known from the first validation on
            check_metrics(cfg, metrics, self.task)
            self.metrics_checked = True
        if cfg.best_metric is not None and track_best(cfg, self.state, metrics, self.train_tokens, self.save_best):
            return metrics, "patience"
        metric = cfg.early_stop_metric
        if metric is not None:
            value, target = metrics[metric], cfg.early_stop_value
            if (
                (value >= target)
                if higher_is_better(metric, cfg.best_mode if metric == cfg.best_metric else "auto")
                else (value <= target)
            ):
                return metrics, "early_stop"
        return metrics, None

    def results(self, stop_reason: str, compile_status: dict | None) -> dict:
        """The final evaluation (of the best-validation checkpoint when ``best_metric`` is set) and the run's
        ``results.json`` contents."""
        cfg, runtime, state = self.cfg, self.runtime, self.state
        final_from = "last"
        if cfg.best_metric is not None and state.get("best") is not None:
            best_dir = self.run.best_checkpoint()
            if best_dir is not None:  # the final evaluation is the best-validation checkpoint's
                load_full_weights(self.model, best_dir, cfg, runtime)
                final_from = best_dir.name
        started = time.perf_counter()
        final = self.task.evaluate(self.model, runtime.device, quick=False, autocast_dtype=runtime.autocast_dtype)
        final_seconds = time.perf_counter() - started
        return {
            "config": cfg.to_dict(),
            "model_config": self.model_cfg.to_dict(),
            "params": self.model.num_parameters(),
            "data": self.task.describe(),
            "steps": state["step"],
            "tokens": state["tokens"],
            "train_seconds": state["train_seconds"],
            "eval_seconds": state.get("eval_seconds"),  # the quick validations, part of train_seconds
            "validations": state.get("validations"),
            "final_eval_seconds": final_seconds,
            "stop_reason": stop_reason
            if state["step"] < self.sched.end or stop_reason in ("early_stop", "patience")
            else "completed",
            "epochs": state["tokens"] / self.train_tokens if self.train_tokens else None,
            "best": state.get("best"),
            "final_from": final_from,
            "device": str(runtime.device),
            "precision": runtime.precision,  # the experiment runner compares it
            "initial_weights_sha256": state.get("initial_weights_sha256"),  # None: resumed from an older checkpoint
            "hosts": state.get("hosts"),
            "world_size": runtime.world,
            "final": final,
            "compile": compile_status,
        }


def _say_cpu_precision(cfg: TrainConfig, runtime: Runtime, start_step: int, say) -> None:
    """Report a CPU run that trains under autocast (not the CPU's usual fp32), and why when ``--dtype auto`` chose
    it for a fresh run."""
    if runtime.device.type == "cpu" and runtime.autocast_dtype is not None:
        say(
            f"precision: {str(runtime.autocast_dtype).split('.')[-1]} autocast on CPU, fp32 weights"
            + (
                " (--compile on a CPU with native bf16; --dtype fp32 to opt out)"
                if cfg.dtype == "auto" and start_step == 0
                else ""
            )
        )


def _step_loop(
    cfg: TrainConfig, task, runtime: Runtime, run: RunFolder, trainer, state: dict, sched, loop: tuple[int, int], logger
) -> tuple[int, str]:
    """The optimiser steps of :func:`_train`, from the step it starts or resumes at to ``sched.end`` (``loop``: that
    step and the validation interval): each step logged, validated every interval and at the end, checkpointed when
    periodic or due, ``state`` (step, tokens, seconds, validations) kept current. Returns ``(last step, stop
    reason)``: ``"max_steps"`` at the end, else ``"stop_after_steps"``, ``"max_minutes"`` or the validation's reason
    (early stop, patience).

    Raises:
        TrainingInterrupted: a signal arrived; the step is saved first.
    """
    stop = trainer.stop
    start_step, eval_interval = loop
    step = start_step
    while step < sched.end:
        if cfg.stop_after_steps is not None and step - start_step >= cfg.stop_after_steps:
            return step, "stop_after_steps"
        step_start = time.perf_counter()
        tokens_per_step = task.step_tokens(step, runtime.world)
        lr = lr_at(step, cfg, sched.horizon, sched.start)
        grad_norm, decision = trainer.optimizer_step(step, lr)
        step += 1
        state.update(step=step, tokens=state["tokens"] + tokens_per_step, train_seconds=stop.train_seconds())
        trainer.log_step(logger, step, lr, grad_norm, decision.loss, tokens_per_step, step_start)
        if decision.signum is not None:
            logger.close()
            where_saved = trainer.save(step) if step != trainer.saved_step else run.latest_checkpoint()
            raise TrainingInterrupted(decision.signum, step, where_saved or run.path)
        if step % eval_interval == 0 or step == sched.end:
            started = time.perf_counter()
            _, reason = trainer.validate(step, logger)
            if "eval_seconds" in state:  # a checkpoint saved before it was counted: unknown
                state["eval_seconds"] += time.perf_counter() - started
                state["validations"] += 1
            state["train_seconds"] = stop.train_seconds()  # the loop's time includes its validations
            if reason is not None:
                return step, reason
        if decision.time_up:
            return step, "max_minutes"
        periodic = cfg.checkpoint_interval and step % cfg.checkpoint_interval == 0
        if (periodic or decision.checkpoint_due) and step < sched.end:
            trainer.save(step)
    return step, "max_steps"


def _train(cfg: TrainConfig, task, runtime: Runtime, run: RunFolder) -> dict:
    say = (
        (lambda msg: print(f"coupled-qk: {msg}", file=sys.stderr, flush=True)) if runtime.is_main else (lambda m: None)
    )
    state, where = _resume_point(cfg, run, runtime, say)
    if where is not None:
        _check_model_before_data(cfg, where)
    if cfg.fsdp and runtime.world == 1:
        say("fsdp has no effect in a single process (it applies under torchrun with several processes)")
    if runtime.is_main:
        run.clean_leftovers()
    barrier(runtime)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    task = task if task is not None else _build_task(cfg, run.path, runtime)
    model_cfg = cfg.gpt_config(**task.model_overrides())
    if where is not None:
        check_compatible(Checkpoint(where).model_config(), model_cfg, where)
        run.check_data(task)  # before data.json is written again below
    sched, eval_interval = _plan(cfg, state, task, runtime, say)
    if where is not None:  # said once every check of the resume has passed (a refusal stays one line)
        say(f"resuming {run.path} from {where.name}: step {state['step']:,}, {state['tokens']:,} tokens")
    trainer = _Trainer(cfg, runtime, run, task, model_cfg, state, where, sched)
    if runtime.is_main:
        run.record_start(cfg, model_cfg, task)
    start_step = state["step"]
    logger = Logger(run, cfg, runtime.is_main, start_step, sched.end)
    _say_cpu_precision(cfg, runtime, start_step, say)
    compile_status = (
        compile_probe(trainer.wrapped, trainer.model, task, cfg, runtime, start_step, trainer.autocast, say)
        if cfg.compile
        else None
    )
    trainer.window = [time.perf_counter(), 0]  # start of the logging window, tokens in it
    with SignalCatcher() as catcher:
        trainer.stop = StopControl(runtime, cfg.max_minutes, cfg.checkpoint_minutes, state["train_seconds"], catcher)
        trainer.wrapped.train()
        loop = (start_step, eval_interval)
        step, stop_reason = _step_loop(cfg, task, runtime, run, trainer, state, sched, loop, logger)
    logger.close()
    if step != trainer.saved_step or where is None:
        trainer.save(step)
    results = trainer.results(stop_reason, compile_status)
    if runtime.is_main:
        run.write_results(results)
    say(f"{run.path}: {results['steps']} steps, {results['tokens']:,} tokens; {time_summary(results)}")
    if catcher.received is not None:
        # the signal came after the last step's stop decision (during its evaluation or logging): the run is
        # complete and saved, but whoever sent it wants this process to stop, not to start the next run
        raise TrainingInterrupted(catcher.received, state["step"], run.path, finished=True)
    return results
