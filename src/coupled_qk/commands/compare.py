"""``coupled-qk compare``: several attention variants with the same seeds, data order and token budget."""

from __future__ import annotations

from coupled_qk.checks.cli import parse_seeds
from coupled_qk.commands.options import (
    add_overwrite_option,
    parse_variants_option,
    refuse_variant_conflicts,
    reject_variant_flags,
)
from coupled_qk.commands.train import add_train_options, preflight, read_corpus_first, train_config_from_args
from coupled_qk.models.registry import variant_names

HELP = "train several attention variants with the same data and budget, then compare"


def add_arguments(parser) -> None:
    """Register the ``compare`` options on ``parser``: the training options of ``train``
    (:func:`~coupled_qk.commands.train.add_train_options`, without the single-variant flags), ``--variants``,
    ``--overwrite``, ``--seeds`` and ``--dry-run``."""
    add_train_options(parser, variant_flags=False)
    parser.add_argument(
        "--variants",
        default="standard,coupled,coupled_leapfrog,uncoupled_mlp",
        help=f"comma-separated variant specs ({', '.join(variant_names())}), each optionally +field=value, e.g. "
        "coupled+n_steps=3 (default: standard,coupled,coupled_leapfrog,uncoupled_mlp)",
    )
    add_overwrite_option(parser)
    parser.add_argument("--seeds", default="0", help="comma-separated seeds, e.g. 0,1,2 (mean and std reported)")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the planned runs (variant x seed), their folders and whether each would be "
        "trained, resumed or reused, then exit (nothing is created; the corpus is not read)",
    )


def run(args) -> int:
    """Train every variant x seed of ``args`` with the same data and token budget into ``--out-dir`` (default
    ``runs/compare``; finished runs reused, interrupted ones resumed), then print the comparison table and write
    ``results.json``, ``results.md`` and ``loss_curves.png``; ``--dry-run`` prints the plan and creates nothing.
    Returns 0.

    Raises:
        ValueError: a single-variant flag, a bad variant spec or one conflicting with the model options, bad
            ``--seeds``, a config this machine cannot run (:func:`~coupled_qk.commands.train.preflight`), an
            unreadable corpus, or a comparison folder refused (reported by the CLI in one line, exit 2).
    """
    from coupled_qk.experiments.compare import comparison_dir, comparison_table, run_comparison

    reject_variant_flags(args, "compare")
    variants = parse_variants_option(args.variants)
    refuse_variant_conflicts(args, variants)
    if args.out_dir is None:
        args.out_dir = "runs/compare"
    base = train_config_from_args(args)
    seeds = parse_seeds(args.seeds)
    preflight(base, run_folder=False)  # the comparison folder is claimed by comparison_dir
    if args.dry_run:
        from coupled_qk.experiments.compare import plan_comparison
        from coupled_qk.study.executor import check_plan, plan_lines

        plan = plan_comparison(base, variants, seeds, base.out_dir)
        check_plan(plan)  # what the real command refuses before its first run, refused here too
        print(f"coupled-qk compare: {len(plan)} runs ({len(variants)} variants x {len(seeds)} seeds) -> {base.out_dir}")
        print("\n".join(plan_lines(plan)))
        return 0
    read_corpus_first(base)
    summary = run_comparison(base, variants, seeds, comparison_dir(base.out_dir, variants, args.overwrite))
    print(comparison_table(summary))
    print(f"\nwritten: {base.out_dir}/results.json, results.md, loss_curves.png")
    return 0
