"""Plans of a run's start: how a resumed run continues its learning-rate schedule and its global batch (where it
may write, its checkpoint and its precision are the run folder's: :mod:`coupled_qk.training.run_folder`).

A resumed run must see the same data and the same learning-rate schedule as an uninterrupted one. The data
order depends on the seed and on the per-micro-step global batch (``batch_size * world_size``) and
``grad_accum``; the schedule on its horizon. So a resume may change the number of processes only together
with ``batch_size`` (same global batch: re-planned exactly and said so), and a different budget changes the
horizon only when asked for (``on_budget_change``: ``keep`` or ``rewarm``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from coupled_qk.training.config import TrainConfig


@dataclass
class Schedule:
    """Learning-rate schedule of a run: warmup from ``start``, cosine decay to ``horizon``; training ends at
    ``end`` (``end == horizon`` unless a budget change kept an older horizon)."""

    start: int
    horizon: int
    end: int

    def to_dict(self) -> dict:
        """``{"start", "total_steps", "end_steps"}`` (``horizon`` stored as ``total_steps``, ``end`` as
        ``end_steps``): the checkpoint's ``schedule`` entry, read back by :func:`plan_schedule`."""
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
