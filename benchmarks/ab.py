"""Revision A/B benchmark: this checkout's code against another git revision, the same CPU cells interleaved in one
run (``benchmarks/README.md``, section "Revision A/B"). A benchmark tool, not part of the library: it runs ``git
worktree`` (the library runs no git).

    python benchmarks/ab.py --against REV [--cells ...] [--variants ...]   # ab-<preset>-cpu.{md,json}
    python benchmarks/ab.py --tracked [FILE] [--repeats N]                 # tracked-<preset>-cpu.{md,json}
    python benchmarks/ab.py --tracked --accept                             # record this commit's ratios in FILE

``--against REV``: this checkout (uncommitted changes included, labelled ``+changes``) against revision ``REV``,
checked out into a temporary worktree. ``--tracked [FILE]``: the tracked cells of ``FILE`` (default
``benchmarks/tracked.json``) against the revision they were accepted at. Both exit with code 1 when a cell got
slower (:func:`ab_measure.compare`), 2 on bad input (one line naming the option). The measurement is
:mod:`ab_measure` (driver, statistics, report) with one :mod:`ab_worker` process per revision; the tracked file
is :mod:`ab_tracked`; timing helpers, the machine line and ``median_ci`` come from the library.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import signal
import sys
import threading

import torch
from ab_measure import CELLS, THRESHOLD, ab_markdown, cell_spec, compare, run_ab, slower_cells
from ab_tracked import accepted_state, accepted_table, load_tracked, settings_of, variant_settings, write_tracked
from ab_worker import CLOCKS

from coupled_qk.checks.cli import fraction_arg, path_arg, positive_int_arg, seed_arg, threads_arg
from coupled_qk.commands.ignored import given_options, shown_option
from coupled_qk.commands.options import (
    add_model_options,
    add_overwrite_option,
    add_progress_option,
    gpt_config_from_args,
    parse_variants_option,
    reject_variant_flags,
)
from coupled_qk.experiments.bench.train import with_baseline
from coupled_qk.models.config import parse_overrides
from coupled_qk.models.registry import default_variants, variant_names
from coupled_qk.output_dir import OutputDir
from coupled_qk.study.executor import Report, write_report

PROG = "python benchmarks/ab.py"

RESULTS_LAYOUT = ("ab-*", "tracked-*", "README.md", "*/")
"""What an A/B results folder may hold: the A/B and tracked result files, a README and sub-folders of runs."""


def add_arguments(parser) -> None:
    """The A/B's options: the model (``--preset``, ``--set``), ``--variants``, ``--against``, ``--tracked``,
    ``--accept``, ``--cells``, ``--clock``, ``--threshold``, ``--repeats``, ``--threads``, ``--seed`` and the
    output (``--out-dir``, ``--overwrite``, ``--no-progress``)."""
    add_model_options(parser, variant_flags=False)
    parser.add_argument(
        "--variants",
        default="all",
        help=f"comma-separated variant specs from {','.join(variant_names())} ('coupled' = Euler), each "
        "optionally +field=value; standard is always measured as the baseline (default: all = "
        f"{','.join(default_variants())})",
    )
    parser.add_argument(
        "--against",
        default=None,
        metavar="REV",
        help="this checkout's code against git revision REV (checked out into a temporary worktree), the same "
        "cells interleaved in one run, CPU; flags what got slower (exit code 1)",
    )
    parser.add_argument(
        "--tracked",
        nargs="?",
        const="benchmarks/tracked.json",
        default=None,
        type=path_arg,
        metavar="FILE",
        help="the tracked cells of FILE (default benchmarks/tracked.json) against the revision they were accepted "
        "at: which cells this checkout made slower (exit code 1 if any); run it before stopping work on "
        "layers/, models/generation*, ops/",
    )
    parser.add_argument(
        "--accept",
        action="store_true",
        help="with --tracked: record this commit's ratios as the accepted ones in FILE (a committed checkout only)",
    )
    parser.add_argument(
        "--cells",
        default=",".join(CELLS),
        help=f"comma-separated cells (default {','.join(CELLS)}; -b<B> sets another batch size)",
    )
    parser.add_argument(
        "--clock",
        default="step",
        choices=CLOCKS,
        help="step = the undisturbed step (decoding: the fastest single-token step of a call; train: the "
        "fastest of 3 steps), wall = the whole call, cpu = process CPU time (default step)",
    )
    parser.add_argument(
        "--threshold",
        default=THRESHOLD,
        type=fraction_arg,
        help=f"a cell is slower when its change's 95%% interval lies above 1 + THRESHOLD (default {THRESHOLD})",
    )
    parser.add_argument("--repeats", type=positive_int_arg, default=10, help="alternating repeats (default 10)")
    parser.add_argument("--threads", type=threads_arg, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--seed", type=seed_arg, default=0, help="seed of the weights and the token batch")
    parser.add_argument(
        "--out-dir",
        default="benchmarks/results",
        type=path_arg,
        help="where the JSON and markdown go (an existing result is replaced only with --overwrite)",
    )
    add_overwrite_option(parser)
    add_progress_option(parser)


TRACKED_FIXED = ("--preset", "--set", "--variants", "--cells", "--clock", "--threshold", "--threads", "--seed")
"""Options that a tracked file sets itself: refused with ``--tracked`` (only ``--repeats`` may replace its value)."""


def check_options(args) -> None:
    """Refuse, before anything is measured, a run that is neither ``--against`` nor ``--tracked`` or both,
    ``--accept`` without ``--tracked``, a variant flag (``--attention``, ``--integrator``, ``--n-steps``: the
    variants come from ``--variants``) and with ``--tracked`` an option the file sets itself.

    Raises:
        ValueError: naming the option and its value.
    """
    if (args.against is None) == (args.tracked is None):
        raise ValueError(
            "give one of --against REV (this checkout against revision REV) or --tracked [FILE] (the tracked "
            "cells against their accepted revision; it takes its revision from the file)"
        )
    if args.accept and args.tracked is None:
        raise ValueError("--accept records the ratios of a --tracked run in its file; it needs --tracked [FILE]")
    reject_variant_flags(args, PROG)
    fixed = given_options(args, add_arguments, TRACKED_FIXED) if args.tracked is not None else []
    if fixed:
        raise ValueError(
            f"{shown_option(*fixed[0])} does not apply with --tracked (the file {args.tracked} sets the preset, "
            "variants, cells, threads, seed, clock and threshold; only --repeats may replace its value)"
        )


def ab_settings(args) -> dict:
    """The settings of ``--against`` from the options, each variant's config checked here first.

    Raises:
        ValueError: an unknown or repeated cell, a variant or ``--set`` that makes no valid config.
    """
    config = gpt_config_from_args(args)
    cells = [c.strip() for c in args.cells.split(",")]
    if len(set(cells)) != len(cells):
        raise ValueError(f"--cells={args.cells}: a cell is named twice")
    try:
        specs = [cell_spec(c, config.block_size) for c in cells]
    except ValueError as exc:
        raise ValueError(f"--cells={args.cells}: {exc}") from None
    base = parse_overrides(args.overrides)
    return dict(
        preset=args.preset,
        base=base,
        variants=variant_settings(with_baseline(parse_variants_option(args.variants)), args.preset, base),
        cells=specs,
        repeats=args.repeats,
        threads=args.threads or torch.get_num_threads(),
        seed=args.seed,
        clock=args.clock,
        threshold=args.threshold,
    )


def ab_command(against: str, settings: dict, tracked: str | None) -> str:
    """A command line that repeats the A/B run of ``settings``."""
    if tracked is not None:
        return shlex.join([*PROG.split(), "--tracked", tracked, "--repeats", str(settings["repeats"])])
    parts = [*PROG.split(), "--against", against, "--preset", settings["preset"]]
    parts += [a for k, v in settings["base"].items() for a in ("--set", f"{k}={v}")]
    parts += ["--variants", ",".join(settings["variants"]), "--cells", ",".join(c["name"] for c in settings["cells"])]
    parts += ["--repeats", str(settings["repeats"]), "--threads", str(settings["threads"])]
    parts += ["--seed", str(settings["seed"]), "--clock", settings["clock"], "--threshold", str(settings["threshold"])]
    return shlex.join(parts)


@contextlib.contextmanager
def terminate_as_interrupt():
    """While inside, ``SIGTERM`` raises ``KeyboardInterrupt`` (so ``finally`` blocks run); the main thread only."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args, argv: list[str]) -> int:
    """``--against REV`` and ``--tracked [FILE]`` (with ``--accept``) from parsed ``args`` (``argv``: the command
    line as given, recorded in the result); exit code 1 when a cell got slower (and was not accepted).

    Raises:
        ValueError: a refused option (:func:`check_options`, :func:`ab_settings`), an existing output without
            ``--overwrite``, or an unknown revision. RuntimeError: a worker failed.
    """
    check_options(args)
    tracked = None
    if args.tracked is not None:
        tracked = load_tracked(args.tracked)
        repeats = args.repeats if given_options(args, add_arguments, ["--repeats"]) else None
        settings, against, kind = settings_of(tracked, repeats), tracked["revision"], "tracked"
    else:
        settings, against, kind = ab_settings(args), args.against, "ab"
    out = OutputDir(args.out_dir, "--out-dir", overwrite=args.overwrite, layout=RESULTS_LAYOUT, what="bench")
    stem = f"{kind}-{settings['preset']}-cpu"
    for suffix in (".json", ".md"):
        out.claim(stem + suffix, check_only=True)
    print(
        f"{PROG}: this checkout against {against}, {len(settings['cells'])} cells x "
        f"{len(settings['variants'])} variants, {settings['repeats']} alternating repeats"
    )
    with terminate_as_interrupt():  # a killed run still stops its workers and removes its temporary worktree
        result = run_ab(against, settings, log=print if args.progress else None, accept=args.accept)
    reproduce = ab_command(against, settings, args.tracked)
    result["command"] = shlex.join([*PROG.split(), *argv])
    rows = compare(result, settings["threshold"], settings["clock"])
    accepted = accepted_table(tracked) if tracked else None
    text = ab_markdown(result, rows, settings["threshold"], settings["clock"], accepted)
    report = Report(json={f"{stem}.json": {**result, "reproduce": reproduce, "rows": rows}}, text={f"{stem}.md": text})
    paths = write_report(out, report)
    print(text)
    print(f"wrote {', '.join(str(p) for p in paths)}")
    if args.accept:
        write_tracked(args.tracked, accepted_state(result, rows, repeats=tracked["repeats"]))
        print(f"accepted: {args.tracked} records the ratios of {result['revisions']['new']['commit'][:7]}")
        return 0
    return 1 if slower_cells(rows) else 0


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and :func:`run`; a refused input is one line on stderr, exit 2."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already reported
        return exc.code if isinstance(exc.code, int) else 0
    try:
        return run(args, argv)
    except (ValueError, OSError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
