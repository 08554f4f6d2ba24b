"""Checks and plans of a run's start: where it may write, and how a resumed run continues its schedule.

A resumed run must see the same data and the same learning-rate schedule as an uninterrupted one. The data
order depends on the seed and on the per-micro-step global batch (``batch_size * world_size``) and
``grad_accum``; the schedule on its horizon. So a resume may change the number of processes only together
with ``batch_size`` (same global batch: re-planned exactly and said so), and a different budget changes the
horizon only when asked for (``on_budget_change``: ``keep`` or ``rewarm``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path

from coupled_qk.outputs import RUN_WHAT, OutputDir
from coupled_qk.training.checkpoint_load import checkpoint_step
from coupled_qk.training.config import CONTINUATION_FIELDS, TrainConfig, config_differences, describe_differences
from coupled_qk.training.rundir import RunDir


@dataclass
class Schedule:
    """Learning-rate schedule of a run: warmup from ``start``, cosine decay to ``horizon``; training ends at
    ``end`` (``end == horizon`` unless a budget change kept an older horizon)."""

    start: int
    horizon: int
    end: int

    def to_dict(self) -> dict:
        return {"start": self.start, "total_steps": self.horizon, "end_steps": self.end}


def lr_at(step: int, cfg: TrainConfig, total_steps: int, start: int = 0) -> float:
    """Linear warmup over ``warmup_steps`` from ``start``, then cosine decay to ``min_lr_ratio * lr`` at
    ``total_steps`` (and that floor after it)."""
    local = step - start
    if local < cfg.warmup_steps:
        return cfg.lr * (local + 1) / cfg.warmup_steps
    progress = min(1.0, (local - cfg.warmup_steps) / max(1, total_steps - start - cfg.warmup_steps))
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - floor)


RUN_LAYOUT = (
    "config.json",
    "model_config.json",
    "data.json",
    "tokenizer/",
    "metrics.jsonl",
    "tensorboard/",
    "ckpt-*/",
    "latest",
    "best",
    "best-*/",
    "results.json",
    "results.interrupted.json",
    "glue/",
)
"""Top-level names of a run folder (``training/rundir.py``) plus ``glue/``, the default output of ``coupled-qk
glue`` for one run. A folder holding anything else is not a run folder and is refused as ``out_dir``."""


def check_out_dir(run_dir: Path) -> None:
    """Refuse an ``out_dir`` that is empty, a file, not creatable or writable, a checkpoint folder inside a run
    (``--out-dir RUN/ckpt-...``), or a folder holding files a run does not write (a home folder, a user's
    project, another command's output): the run would mix its files with them or replace them
    (:class:`coupled_qk.outputs.OutputDir`; docs/RELIABILITY.md, "Outputs")."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"out_dir {run_dir} is a file, not a folder")
    if (run_dir / "model.safetensors").is_file() or (
        checkpoint_step(run_dir) is not None and (run_dir.parent / "latest").is_file()
    ):
        raise ValueError(
            f"out_dir {run_dir} is a checkpoint folder inside the run {run_dir.parent}; pass "
            f"--out-dir {run_dir.parent} (the run folder)"
        )
    OutputDir(run_dir, "out_dir", layout=RUN_LAYOUT, what=RUN_WHAT)


def check_start(run: RunDir, resume: bool) -> bool:
    """Whether the run folder ``run`` holds a checkpoint to resume; refuses starting a run that would replace
    another: checkpoints without ``resume``, or a finished run's ``results.json`` without a checkpoint (deleted
    to save space: a new run trained over it, replacing its results, metrics and config without a word).

    Raises:
        ValueError: naming the folder and what to do.
    """
    has_ckpt = run.has_checkpoint()
    if has_ckpt and not resume:
        raise ValueError(
            f"{run.path} already holds checkpoints; pass --resume to continue it or choose another --out-dir"
        )
    if not has_ckpt and run.is_finished():
        raise ValueError(
            f"{run.path} holds a finished run ({run.RESULTS}) without checkpoints to resume: a new run "
            "there would replace its results; choose another --out-dir, or delete the folder to train "
            "it again"
        )
    return has_ckpt


def check_config(run_dir: Path, cfg: TrainConfig) -> None:
    """Refuse resuming ``run_dir`` with settings that change the run (the model is compared separately), or
    without its ``config.json`` (then nothing could be compared: a resume with another learning rate or seed
    was accepted and recorded as the whole run's settings), or with a damaged ``metrics.jsonl``
    (:func:`check_metrics_file`). Called before the resumed run writes anything."""
    run = RunDir(run_dir)
    saved = run.read_config()  # its fields' kinds checked, naming the file
    if saved is None:
        raise ValueError(
            f"cannot resume {run_dir}: its {run.CONFIG} is missing, so the settings a resume must keep (learning "
            f"rate, seed, data, ...) cannot be checked; restore {run.config_path}, or recreate it with the run's "
            f"own options: coupled-qk train <its options> --print-config > {run.config_path}"
        )
    diff = config_differences(saved, cfg, CONTINUATION_FIELDS | {"model", "preset"})
    if diff:
        raise ValueError(
            f"cannot resume {run_dir}: the run was made with a different config ({describe_differences(diff)}); "
            "only the budget, logging and paths may change on --resume"
        )
    check_metrics_file(run)


def check_metrics_file(run: RunDir) -> None:
    """Refuse resuming ``run`` when its ``metrics.jsonl`` has a damaged line before the last (the resumed run
    rewrites that file), before anything is written: the refusal used to come after ``config.json`` had been
    rewritten with this resume's budget. A torn last line is left to the logger, which drops it and says so.

    Raises:
        ValueError: naming the file and the line (:func:`~coupled_qk.training.rundir.parse_metrics`).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the torn last line: said once, by the logger that drops it
        run.read_metrics()


def plan_batch(state: dict, saved_cfg: dict, cfg: TrainConfig, world: int, say) -> None:
    """Refuse a resume whose per-micro-step global batch differs; announce an exact re-plan when only the
    split between ``batch_size`` and the number of processes changed."""
    saved = state.get("global_batch") or {
        "batch_size": saved_cfg.get("batch_size", cfg.batch_size),
        "world_size": world,
    }
    before = saved["batch_size"] * saved["world_size"]
    now = cfg.batch_size * world
    if before != now:
        hint = (
            f"; with {world} process(es) use --batch-size {before // world}"
            if before % world == 0
            else f"; use a number of processes dividing {before}"
        )
        raise ValueError(
            f"cannot resume: the checkpoint was trained with a global batch of {before} sequences per micro-step "
            f"(batch_size {saved['batch_size']} x {saved['world_size']} process(es)), this run would use {now} "
            f"(batch_size {cfg.batch_size} x {world}), which changes the data order, the tokens per step and the "
            f"schedule{hint}"
        )
    if saved["world_size"] != world:
        say(
            f"re-planned for {world} process(es) x batch_size {cfg.batch_size} (was {saved['world_size']} x "
            f"{saved['batch_size']}): the same global batch of {now} sequences, data order and schedule"
        )


def plan_resume(state: dict, saved_cfg: dict, cfg: TrainConfig, runtime, say) -> None:
    """What a resume from the checkpoint ``state`` continues with: its global batch (:func:`plan_batch`) and its
    precision (:func:`check_precision`); ``runtime``: the :class:`~coupled_qk.training.distributed.Runtime`."""
    plan_batch(state, saved_cfg, cfg, runtime.world, say)
    check_precision(state, runtime.precision, cfg)


def check_precision(state: dict, now: str, cfg: TrainConfig) -> None:
    """A ``RuntimeWarning`` when a resumed run continues under another autocast precision ``now`` (``"fp32"``,
    ``"bf16"``, ``"fp16"``) than its checkpoint's steps (``state["precision"]``; older checkpoints have none):
    ``--dtype auto`` resolves by device and, on a CPU with native bf16, by ``--compile`` (bf16 compiled, fp32
    eager), both of which a resume may change."""
    saved = state.get("precision")
    if saved is not None and saved != now:
        warnings.warn(
            f"the run trained in {saved} until step {state['step']} and continues in {now} (--dtype "
            f"{cfg.dtype}, compile={cfg.compile}, device {cfg.device}: auto is bf16 only on CUDA and, "
            f"with --compile, on a CPU with native bf16); pass --dtype {saved} to keep its precision",
            RuntimeWarning,
            stacklevel=2,
        )


def plan_schedule(state: dict, cfg: TrainConfig, end: int, say) -> Schedule:
    """The schedule of a run that is at ``state["step"]`` (0 for a new run) and whose budget ends at ``end``.

    Raises:
        ValueError: the budget changed on resume and ``cfg.on_budget_change`` is not set (the message shows
            the learning-rate jump it would cause and the two choices), or the new budget ends before the
            run's current step (the message offers a new ``--out-dir`` instead).
    """
    saved = state.get("schedule")
    step = int(state.get("step", 0))
    if not saved or saved["end_steps"] == end:
        return Schedule(saved["start"], saved["total_steps"], end) if saved else Schedule(0, end, end)
    old = Schedule(saved["start"], saved["total_steps"], saved["end_steps"])
    if end < step:  # neither keep nor rewarm can train backwards
        raise ValueError(
            f"cannot resume with this budget: the run in {cfg.out_dir} is already at step {step}, past this "
            f"budget's end at step {end} (its own schedule ends at step {old.end}). To train with the smaller "
            f"budget, start a new run: pass another --out-dir, or delete {cfg.out_dir}; to finish the saved "
            f"run, resume it with its own budget"
        )
    if cfg.on_budget_change is None:
        kept = lr_at(step, cfg, old.horizon, old.start)
        stretched = lr_at(step, cfg, end, old.start)
        raise ValueError(
            f"cannot resume with a different budget: the run's schedule ends at step {old.end} and this budget at "
            f"step {end}; stretching its cosine decay would set the learning rate of step {step + 1} to "
            f"{stretched:.3g} where the saved schedule gives {kept:.3g}. Pass --on-budget-change keep (continue the "
            f"saved schedule; after step {old.horizon} the learning rate stays at {cfg.lr * cfg.min_lr_ratio:.3g}) "
            f"or --on-budget-change rewarm (a new warmup and cosine decay from step {step} to {end})"
        )
    if cfg.on_budget_change == "keep":
        say(
            f"budget changed: training to step {end} on the saved schedule (cosine to step {old.horizon}, "
            f"then learning rate {cfg.lr * cfg.min_lr_ratio:.3g})"
        )
        return Schedule(old.start, old.horizon, end)
    say(
        f"budget changed: re-warming the learning rate from step {step} ({cfg.warmup_steps} warmup steps, "
        f"cosine decay to step {end})"
    )
    return Schedule(step, end, end)
