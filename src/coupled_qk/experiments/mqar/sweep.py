"""MQAR sweeps over attention variants, model widths and learning rates, run by the shared experiment runner.

A sweep preset (:mod:`coupled_qk.experiments.mqar.presets`) spans difficulties x d_model x learning rate x
variant; :func:`plan_sweep` lists the points, :func:`run_config` makes each point's :class:`TrainConfig`
(``task="mqar"``, :class:`coupled_qk.training.tasks.mqar.MQARTask`), and :func:`run_sweep` executes them with
:func:`coupled_qk.study.executor.execute` (reuse, resume, time guard) and writes the report of
:mod:`coupled_qk.experiments.mqar.report`. Source: Zoology arXiv:2312.04927; ``docs/METHOD.md`` section 6.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from coupled_qk.checks.values import finite, positive_int, seed_int
from coupled_qk.experiments.mqar.presets import Difficulty, SweepPreset, heads_for
from coupled_qk.experiments.mqar.report import sweep_report
from coupled_qk.models.specs import parse_variants, variant_overrides
from coupled_qk.study.executor import PlannedRun, RunRecord, run_experiment
from coupled_qk.training.config import TrainConfig
from coupled_qk.training.run_folder import RESULTS_FILE, RunFolder
from coupled_qk.training.tasks.mqar import steps_per_epoch

__all__ = ["SweepPoint", "plan_sweep", "run_config", "run_sweep", "sweep_plan"]


def _lr_tag(lr: float) -> str:
    return f"lr{lr:.3g}"


def run_config(
    preset: SweepPreset,
    difficulty: Difficulty,
    variant: str,
    d_model: int,
    lr: float,
    out_dir: str | Path,
    device: str = "auto",
    cache_dir: str | Path | None = None,
    seed: int | None = None,
    dtype: str = "auto",
    compile: bool = False,
) -> TrainConfig:
    """The :class:`TrainConfig` of one sweep run (``task="mqar"``), written to ``<out_dir>/<difficulty>/<variant>/
    d<d_model>/lr<lr>/seed<seed>`` (``seed``: model initialisation and batch order; ``None``: ``preset.seed``;
    ``dtype``: the autocast dtype, :attr:`TrainConfig.dtype`; ``compile``: :attr:`TrainConfig.compile`, regional
    ``torch.compile`` with an eager fallback).

    The step budget is ``ceil(epochs * steps_per_epoch)``, capped by ``preset.max_steps``; evaluation runs every
    ``preset.eval_interval`` steps (or once per epoch) and the run stops early at ``preset.early_stop`` accuracy.

    Raises:
        ValueError: unknown variant, or an invalid resulting configuration (from :class:`TrainConfig`).
    """
    overrides = variant_overrides(variant)  # raises ValueError naming an unknown variant
    per_epoch = steps_per_epoch(difficulty.train_slices, difficulty.batch_size)
    max_steps = max(1, math.ceil(preset.epochs * per_epoch))
    if preset.max_steps is not None:
        max_steps = min(max_steps, preset.max_steps)
    eval_interval = preset.eval_interval or max(1, round(per_epoch))
    model = dict(
        n_layer=preset.n_layer,
        d_model=d_model,
        n_heads=heads_for(variant, preset.n_heads),
        use_mlp=False,
        position=preset.position,
        dropout=preset.dropout,
        **overrides,
    )
    options = dict(
        vocab_size=preset.vocab_size,
        train_slices=[list(s) for s in difficulty.train_slices],
        test_slices=[list(s) for s in difficulty.test_slices],
        data_seed=preset.data_seed,
        quick_eval_examples=preset.quick_eval_examples,
    )
    if preset.eval_batch_size is not None:
        options["eval_batch_size"] = preset.eval_batch_size
    if cache_dir is not None:
        options["cache_dir"] = str(cache_dir)
    seed = preset.seed if seed is None else seed
    run_dir = Path(out_dir) / difficulty.name / variant / f"d{d_model}" / _lr_tag(lr) / f"seed{seed}"
    return TrainConfig(
        task="mqar",
        preset="tiny",
        model=model,
        batch_size=difficulty.batch_size,
        lr=float(lr),
        min_lr_ratio=preset.min_lr_ratio,
        warmup_steps=preset.warmup_steps,
        weight_decay=preset.weight_decay,
        beta2=preset.beta2,
        grad_clip=preset.grad_clip,
        max_steps=max_steps,
        eval_interval=eval_interval,
        log_interval=max(1, min(50, eval_interval)),
        early_stop_metric="valid/accuracy",
        early_stop_value=preset.early_stop,
        seed=seed,
        device=device,
        dtype=dtype,
        compile=compile,
        out_dir=str(run_dir),
        tensorboard=False,
        progress=False,
        task_options=options,
    )


@dataclass(frozen=True)
class SweepPoint:
    """One (difficulty, d_model, lr, variant, seed) point of a sweep."""

    difficulty: Difficulty
    variant: str
    d_model: int
    lr: float
    seed: int = 0


def check_seeds(seeds) -> list[int]:
    """``seeds`` as a list of distinct integers in ``[0, 2**32 - 1]``; ``ValueError`` naming ``seeds`` otherwise
    (a repeat would count one run twice in the intervals)."""
    seeds = list(seeds)
    if not seeds:
        raise ValueError("seeds=[] names no seed; expected at least one integer in [0, 2**32 - 1]")
    for s in seeds:
        seed_int("seeds", s)
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds={seeds} repeats a seed; expected each seed once")
    return seeds


def plan_sweep(
    preset: SweepPreset, variants=None, d_models=None, lrs=None, difficulties=None, seeds=None
) -> list[SweepPoint]:
    """All runs of a sweep, ordered seed -> difficulty -> d_model -> lr -> variant (so a time guard cuts whole
    blocks of variants, never one variant alone, and finishes one seed's sweep before the next). Arguments
    default to the preset's values (``seeds``: ``[preset.seed]``).

    Raises:
        ValueError: unknown variant or difficulty, a non-positive d_model or lr, a negative, too large or
            repeated seed (:func:`check_seeds`), or a point whose configuration
            is invalid (e.g. a width the variant's heads do not divide, a variant option out of range), naming the
            point: every run's :class:`TrainConfig` is built here, so ``--dry-run`` and the sweep refuse it before
            any training.
    """
    variants = parse_variants(variants if variants is not None else preset.variants)  # None: the defaults now
    d_models = list(d_models) if d_models is not None else list(preset.d_models)
    lrs = list(lrs) if lrs is not None else list(preset.lrs)
    diffs = [preset.difficulty(n) for n in difficulties] if difficulties is not None else list(preset.difficulties)
    for d in d_models:
        positive_int("d_model", d)
    for lr in lrs:
        finite("lr", lr, 0, lo_open=True)
    seeds = check_seeds(seeds if seeds is not None else [preset.seed])
    plan = [
        SweepPoint(diff, v, d, float(lr), s)
        for s in seeds
        for diff in diffs
        for d in d_models
        for lr in lrs
        for v in variants
    ]
    for point in plan:
        try:
            run_config(preset, point.difficulty, point.variant, point.d_model, point.lr, "plan", seed=point.seed)
        except ValueError as exc:
            raise ValueError(
                f"{point.difficulty.name} {point.variant} d_model={point.d_model} lr={point.lr:g}: {exc}"
            ) from None
    return plan


def _line(total: int, seeds: bool = False):
    """The one log line per run of :func:`run_sweep` (accuracy and steps, or why it has none); ``seeds``: the
    sweep has several seeds, so the line names the run's."""

    def describe(record: RunRecord) -> str:
        k = record.keys
        tag = (
            f"[{k['position'] + 1}/{total}] {k['difficulty']:>8s} {k['variant']:<20s} d={k['d_model']:<4d} "
            f"lr={k['lr']:<8.3g}" + (f" seed={k['seed']:<3d}" if seeds else "")
        )
        r = record.results
        if record.status == "skipped":
            return f"{tag} skipped (--max-minutes reached)"
        if record.status == "reused":
            return f"{tag} acc={r['final']['valid/accuracy']:.3f} steps={r['steps']} (reused)"
        return (
            f"{tag} acc={r['final']['valid/accuracy']:.3f} steps={r['steps']}/{record.config.max_steps} "
            f"{r['stop_reason']} {record.seconds:.1f}s"
            + (" (resumed)" if record.config.resume else "")
            + (" (interrupted)" if record.status == "interrupted" else "")
        )

    return describe


def run_sweep(
    preset: SweepPreset,
    out_dir: str | Path,
    variants=None,
    d_models=None,
    lrs=None,
    difficulties=None,
    seeds=None,
    device: str = "auto",
    dtype: str = "auto",
    compile: bool = False,
    max_minutes: float | None = None,
    log: Callable[[str], None] = print,
    train_fn: Callable | None = None,
) -> dict:
    """Run (or reuse) every run of a sweep through the shared runner and summarise.

    A run whose ``results.json`` exists is reused (after checking its settings), not retrained. With
    ``max_minutes``, each run is given the remaining time; a run cut short by it is marked ``interrupted``
    (its results file renamed ``results.interrupted.json`` and its checkpoint kept, so the next invocation
    resumes it), and runs not started in time are marked ``skipped``; both are excluded from the best-over-lr
    table. Writes ``results.json`` (every run with its config), ``summary.json`` (compact) and
    ``mqar-<preset>.png`` into ``out_dir``.

    Args:
        preset: the sweep (see :data:`coupled_qk.experiments.mqar.presets.SWEEP_PRESETS`); variants, d_models,
            lrs, difficulties and seeds (default ``[preset.seed]``) override its values (see :func:`plan_sweep`);
            with several seeds the table reports each cell's mean over seeds with a 95% interval and each
            variant's paired difference against ``standard`` (:mod:`coupled_qk.experiments.mqar.report`).
        out_dir: sweep folder; data are cached in ``<out_dir>/data-cache``.
        device: ``auto``, ``cpu`` or ``cuda``.
        dtype: autocast dtype of every run (``auto``: bf16 on CUDA, fp32 on CPU; see :class:`TrainConfig`).
        compile: ``torch.compile`` every run's model (:attr:`TrainConfig.compile`; eager if compilation fails).
        max_minutes: wall-clock guard for the whole sweep (``None``: no guard).
        log: receives one line per run.
        train_fn: the training function (default :func:`coupled_qk.training.loop.train`; tests may wrap it).

    Returns:
        The summary written to ``results.json`` (see :func:`coupled_qk.experiments.mqar.report.sweep_summary`).

    Raises:
        ValueError: from :func:`plan_sweep`, a run's configuration, a finished run with other settings;
            ``max_minutes`` <= 0.
    """
    plan = sweep_plan(
        preset, out_dir, plan_sweep(preset, variants, d_models, lrs, difficulties, seeds), device, dtype, compile
    )
    several = len({run.keys["seed"] for run in plan}) > 1
    _, report = run_experiment(
        plan,
        lambda records, wall: sweep_report(preset, records, wall),
        out_dir,
        train_fn=train_fn,
        log=log,
        max_minutes=max_minutes,
        announce=False,
        describe=_line(len(plan), several),
    )
    return report.json[RESULTS_FILE]


def sweep_plan(
    preset: SweepPreset,
    out_dir: str | Path,
    points: list[SweepPoint],
    device: str = "auto",
    dtype: str = "auto",
    compile: bool = False,
) -> list[PlannedRun]:
    """The runner's plan of a sweep's ``points`` (:func:`plan_sweep`): one :class:`PlannedRun` per point, its
    :func:`run_config` (data cached in ``<out_dir>/data-cache``; a run finished in the folder layout before seed
    folders is planned there, :func:`_legacy_run_dir`), with keys ``difficulty, variant, d_model, lr, seed,
    position``. Reads the folder, creates nothing."""
    cache_dir = Path(out_dir) / "data-cache"
    plan = []
    for i, p in enumerate(points):
        cfg = run_config(
            preset,
            p.difficulty,
            p.variant,
            p.d_model,
            p.lr,
            out_dir,
            device,
            cache_dir,
            seed=p.seed,
            dtype=dtype,
            compile=compile,
        )
        legacy = _legacy_run_dir(cfg)
        if legacy is not None:
            cfg = dataclasses.replace(cfg, out_dir=legacy)
        keys = {
            "difficulty": p.difficulty.name,
            "variant": p.variant,
            "d_model": p.d_model,
            "lr": p.lr,
            "seed": p.seed,
            "position": i,
        }
        plan.append(PlannedRun(cfg, f"{p.difficulty.name} {p.variant} d{p.d_model} lr{p.lr:.3g} seed {p.seed}", keys))
    return plan


def _legacy_run_dir(cfg: TrainConfig) -> str | None:
    """The folder of a run finished by a sweep made before seeds had folders of their own (``.../lr<lr>``, the
    parent of ``cfg.out_dir``), when it holds a finished run with ``cfg``'s seed; ``None`` otherwise. Reused there
    (after the usual settings check), so an old sweep folder is continued, not trained again."""
    legacy = RunFolder(Path(cfg.out_dir).parent)
    if Path(cfg.out_dir).exists() or not legacy.is_finished():
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an unknown key: read anyway, only the seed is asked here
            saved = legacy.read_results()
    except (OSError, ValueError):
        return None
    seed = saved.get("config", {}).get("seed") if isinstance(saved, dict) else None
    return str(Path(cfg.out_dir).parent) if seed == cfg.seed else None
