"""``coupled-qk mqar``: multi-query associative recall (Zoology, arXiv:2312.04927) over every attention variant.

Runs each (difficulty, d_model, learning rate, variant) of a sweep preset through the project's training loop,
one line per finished run, then prints the best-over-learning-rate table and writes ``results.json``,
``summary.json`` and ``mqar-<preset>.png`` into ``--out-dir`` (default ``runs/mqar-<preset>``). Runs whose
``results.json`` exists are reused, so an interrupted sweep continues where it stopped.
"""

from __future__ import annotations

import shlex
import sys
import time

import torch

from coupled_qk.checks.cli import (
    dtype_arg,
    parse_seeds,
    path_arg,
    positive_float_arg,
    positive_floats_arg,
    positive_int_arg,
    positive_ints_arg,
    seed_arg,
    threads_arg,
)
from coupled_qk.commands.options import (
    add_compile_option,
    add_device_option,
    add_overwrite_option,
    parse_variants_option,
)
from coupled_qk.devices import check_dtype
from coupled_qk.experiments.mqar.presets import SWEEP_PRESETS, customize_preset, get_preset, heads_for, mqar_variants
from coupled_qk.experiments.mqar.sweep import plan_sweep, run_sweep, sweep_plan
from coupled_qk.extras import require_extra
from coupled_qk.output_dir import OutputDir

HELP = "multi-query associative recall (Zoology) sweep over attention variants"


def sweep_rewrite(preset) -> tuple[str, ...]:
    """The report files a rerun of the sweep regenerates (its documented resume path)."""
    from coupled_qk.training.run_folder import RESULTS_FILE

    return (RESULTS_FILE, "summary.json", f"mqar-{preset.name}.png")


def sweep_layout(preset, plan) -> tuple[str, ...]:
    """Top-level names of a sweep folder: the reports, the data cache and one folder per difficulty."""
    return (
        *sweep_rewrite(preset),
        "mqar-*.png",
        "data-cache/",
        *sorted({f"{d.name}/" for d in preset.difficulties} | {f"{r.difficulty.name}/" for r in plan}),
    )


def add_arguments(parser) -> None:
    """Register the ``mqar`` options on ``parser``: what the sweep covers, what each run trains on, where and how
    it runs (in that order, as ``--help`` lists them)."""
    _add_grid_options(parser)
    _add_run_options(parser)
    _add_execution_options(parser)


def _add_grid_options(parser) -> None:
    """The sweep's grid: preset, variants, model widths, learning rates, difficulties."""
    parser.add_argument(
        "--preset",
        default="cpu",
        choices=sorted(SWEEP_PRESETS),
        help="sweep preset (default cpu: measured 9.4 minutes on 2 shared CPU cores)",
    )
    parser.add_argument(
        "--variants", default=None, help=f"comma-separated variant specs (default: all = {','.join(mqar_variants())})"
    )
    parser.add_argument(
        "--d-models", default=None, type=positive_ints_arg, help="comma-separated model widths (default: the preset's)"
    )
    parser.add_argument(
        "--lrs", default=None, type=positive_floats_arg, help="comma-separated learning rates (default: the preset's)"
    )
    parser.add_argument("--difficulties", default=None, help="comma-separated difficulty names (default: all)")


def _add_run_options(parser) -> None:
    """What every run trains: its step cap, data sizes, batch and seeds."""
    parser.add_argument(
        "--max-steps",
        type=positive_int_arg,
        default=None,
        help="step cap of every run (default: the preset's; cpu 600). With the options below, a "
        "smoke run of any preset, e.g. --difficulties easy --d-models 32 --lrs 2e-3 "
        "--variants standard,coupled --max-steps 100: seconds on one CPU core",
    )
    parser.add_argument(
        "--train-examples",
        type=positive_int_arg,
        default=None,
        help="training sequences per (L, K) slice (default: the preset's; cpu 20000)",
    )
    parser.add_argument(
        "--test-examples",
        type=positive_int_arg,
        default=None,
        help="test sequences per (L, K) slice (default: the preset's; cpu 500)",
    )
    parser.add_argument(
        "--batch-size",
        type=positive_int_arg,
        default=None,
        help="sequences per optimiser step of every difficulty (default: the preset's; cpu 64)",
    )
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument(
        "--seed",
        type=seed_arg,
        default=None,
        help="model initialisation and batch-order seed of every run (default: the preset's, 0; "
        "the data stay the same)",
    )
    seeds.add_argument(
        "--seeds",
        default=None,
        help="comma-separated seeds, e.g. 0,1,2: every run once per seed; the table then shows each "
        "cell's mean with a 95%% interval and the paired difference against standard",
    )


def _add_execution_options(parser) -> None:
    """Where and how the sweep runs: its folder, device, precision, compilation, time guard, threads, dry run."""
    parser.add_argument(
        "--out-dir",
        default=None,
        type=path_arg,
        help="sweep folder (default runs/mqar-<preset>); a folder holding anything but a sweep is refused",
    )
    add_overwrite_option(parser)
    add_device_option(parser)
    parser.add_argument(
        "--dtype",
        type=dtype_arg,
        default=None,
        help="autocast dtype of every run: auto, fp32, bf16 or fp16 (default auto: bf16 on CUDA, fp32 on CPU)",
    )
    add_compile_option(parser)
    parser.add_argument(
        "--max-minutes",
        type=positive_float_arg,
        default=None,
        help="wall-clock guard for the whole sweep: the run in progress is stopped (and resumed by "
        "the next invocation), later runs are skipped",
    )
    parser.add_argument(
        "--threads",
        type=threads_arg,
        default=None,
        help="torch CPU threads (default: the preset's; cpu uses 1, others torch's choice)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the planned runs, their folders and whether each would be trained, resumed or "
        "reused, then exit (nothing is created)",
    )


def run(args) -> int:
    """Run the sweep described by ``args``; returns 0 (errors raise ``ValueError``, reported by the CLI)."""
    preset = customize_preset(
        get_preset(args.preset),
        max_steps=args.max_steps,
        seed=args.seed,
        train_examples=args.train_examples,
        test_examples=args.test_examples,
        batch_size=args.batch_size,
    )
    seeds = parse_seeds(args.seeds) if args.seeds is not None else [preset.seed]
    if len(seeds) > 1:  # the intervals over seeds: found missing before any run, not after the sweep
        require_extra(("scipy",), "claims", "mqar --seeds (intervals over seeds)")
    dtype = "auto" if args.dtype is None else check_dtype("--dtype", args.dtype, args.device)
    variants = parse_variants_option(args.variants) if args.variants is not None else None
    d_models, lrs = args.d_models, args.lrs
    difficulties = _parse_difficulties(args.difficulties, preset)
    out_dir = args.out_dir if args.out_dir is not None else f"runs/mqar-{preset.name}"
    threads = args.threads if args.threads is not None else preset.threads
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads={threads} must be >= 1")
        torch.set_num_threads(threads)
    plan = plan_sweep(preset, variants, d_models, lrs, difficulties, seeds)
    if not args.dry_run:  # claim the folder before any training (docs/RELIABILITY.md, "Outputs")
        out_dir = OutputDir(
            out_dir,
            "--out-dir",
            overwrite=args.overwrite,
            what="an MQAR sweep",
            layout=sweep_layout(preset, plan),
            rewrite=sweep_rewrite(preset),
        )
    _announce(preset, plan, seeds, out_dir)
    if args.dry_run:
        _show_plan(preset, plan, seeds, out_dir, args.device, dtype, args.compile)
        return 0
    t0 = time.perf_counter()
    summary = run_sweep(
        preset,
        out_dir,
        variants=variants,
        d_models=d_models,
        lrs=lrs,
        difficulties=difficulties,
        seeds=seeds,
        device=args.device,
        dtype=dtype,
        compile=args.compile,
        max_minutes=args.max_minutes,
        log=lambda line: print(line, flush=True),
    )
    _print_summary(summary, preset, seeds, out_dir, wall=time.perf_counter() - t0)
    return 0


def _parse_difficulties(option: str | None, preset) -> list[str] | None:
    """The difficulty names of ``--difficulties`` (comma-separated, stripped), or ``None`` when not given.

    Raises:
        ValueError: an empty or repeated name, or one that is not a difficulty of ``preset``, naming the option.
    """
    if option is None:
        return None
    difficulties = [d.strip() for d in option.split(",")]
    if not all(difficulties) or len(set(difficulties)) != len(difficulties):
        raise ValueError(
            f"--difficulties={option!r}: expected comma-separated difficulty names, "
            f"each once, of {[d.name for d in preset.difficulties]}"
        )
    for name in difficulties:
        try:
            preset.difficulty(name)
        except ValueError as exc:
            raise ValueError(f"--difficulties={option!r}: {exc}") from None
    return difficulties


def _announce(preset, plan, seeds, out_dir) -> None:
    """The sweep's opening lines: the preset, any customisation, the runs and where they go."""
    print(f"coupled-qk mqar: preset {preset.name}: {preset.description}")
    if preset is not SWEEP_PRESETS[preset.name]:
        print(f"  {preset.notes[-1]}")
    several = f" (seeds {','.join(map(str, seeds))})" if len(seeds) > 1 else ""
    print(
        f"  {len(plan)} runs{several} -> {out_dir} (torch threads {torch.get_num_threads()}); differential variants "
        "use "
        f"n_heads={heads_for('differential', preset.n_heads)} where the others use n_heads={preset.n_heads} "
        "(one differential head = two sub-heads, parameter-matched)"
    )


def _show_plan(preset, plan, seeds, out_dir, device, dtype, compile) -> None:
    """``--dry-run``: what the sweep would do with each run (:func:`coupled_qk.study.executor.plan_lines`)."""
    from coupled_qk.study.executor import plan_lines

    def coordinates(run) -> str:
        k = run.keys
        return (
            f"{preset.difficulty(k['difficulty']).label:<24s} {k['variant']:<20s} d_model={k['d_model']:<4d} "
            f"lr={k['lr']:<8.3g}" + (f" seed={k['seed']}" if len(seeds) > 1 else "")
        )

    print("\n".join(plan_lines(sweep_plan(preset, out_dir, plan, device, dtype, compile), coordinates)))


def _print_summary(summary: dict, preset, seeds, out_dir, wall: float) -> None:
    """The sweep's closing lines: the best-accuracy table, the run counts and wall time, the command, the files."""
    print()
    print(
        "best accuracy over learning rates (final, full test set)"
        + (f", over seeds {','.join(map(str, seeds))}:" if len(seeds) > 1 else ":")
    )
    print(summary["table"])
    counts = ", ".join(f"{k} {v}" for k, v in sorted(summary["counts"].items()))
    print(f"\n{counts}; wall time {wall / 60:.1f} min")
    print(f"command: {shlex.join(['coupled-qk', *sys.argv[1:]]) if sys.argv[1:2] == ['mqar'] else 'coupled-qk mqar'}")
    print(f"wrote {out_dir}/results.json, {out_dir}/summary.json and {out_dir}/mqar-{preset.name}.png")
