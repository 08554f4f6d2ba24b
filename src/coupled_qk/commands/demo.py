"""``coupled-qk demo``: standard vs coupled (Euler, leapfrog) vs uncoupled MLP on real Wikipedia text.

Trains the ``tiny`` preset with a byte-level BPE (8,192 tokens) trained on the wiki-vital lead sections,
validates and tests on WikiText-2 valid/test, all on CPU in about 15 minutes on 2 cores (idle; an hour or
more on a busy machine).

``--quick`` is a smoke run: the same four variants, data and tokenizer with a budget of
:data:`QUICK_DEFAULTS` (about 3 minutes on 2 cores) and a final evaluation on the first
:data:`QUICK_EVAL_WINDOWS` windows of WikiText-2 valid and test only (``task_options.final_eval_windows``: the
windows of each quick validation, so the final point lies on the validation curve's text), in its own folder
``runs/demo-quick``. It shows that everything works end to end; its numbers say nothing about
the variants (the table says it is a smoke run).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from coupled_qk.checks.cli import parse_seeds
from coupled_qk.commands.options import (
    add_overwrite_option,
    parse_variants_option,
    refuse_variant_conflicts,
    reject_variant_flags,
)
from coupled_qk.commands.train import add_train_options, preflight, read_corpus_first, train_config_from_args

if TYPE_CHECKING:
    from coupled_qk.training.config import TrainConfig

HELP = "standard vs coupled (Euler, leapfrog) vs uncoupled MLP on wiki-vital, on CPU in minutes (--quick: ~3)"
DEMO_VARIANTS = "standard,coupled,coupled_leapfrog,uncoupled_mlp"
DEMO_DEFAULTS = dict(
    corpus="wiki-vital",
    tokenizer="bpe-8192",
    preset="tiny",
    batch_size=16,
    lr=2e-3,
    warmup_steps=50,
    max_tokens=900_000,
    eval_interval=100,
    eval_batches=8,
    log_interval=10,
    out_dir="runs/demo",
)
QUICK_DEFAULTS = dict(
    max_tokens=65_536, warmup_steps=8, eval_interval=8, eval_batches=2, log_interval=4, out_dir="runs/demo-quick"
)
"""What ``--quick`` changes (explicit flags still win): 32 steps of 2,048 tokens per variant."""
QUICK_EVAL_WINDOWS = QUICK_DEFAULTS["eval_batches"] * DEMO_DEFAULTS["batch_size"]
"""Windows of ``block_size`` (128) tokens of each of WikiText-2 valid and test scored by ``--quick``'s final
evaluation (4,096 tokens each, about 1% of the splits): the windows each quick validation reads (``eval_batches``
batches of ``batch_size`` windows from the start of the split), so the final validation scores the same text as the
validation curve and its point on the plot is comparable with the curve's (:func:`with_quick_evaluation` keeps them
equal when flags change the batch)."""


def add_arguments(parser) -> None:
    """Register the ``demo`` options on ``parser``: the training options of ``train`` with the demo's defaults shown
    (:data:`DEMO_DEFAULTS`), ``--variants``, ``--overwrite``, ``--seeds`` and ``--quick``."""
    add_train_options(parser, defaults=DEMO_DEFAULTS, variant_flags=False)
    parser.add_argument("--variants", default=DEMO_VARIANTS, help=f"variants to compare (default {DEMO_VARIANTS})")
    add_overwrite_option(parser)
    parser.add_argument("--seeds", default="0", help="comma-separated seeds")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run (about 3 minutes on 2 cores): max_tokens {QUICK_DEFAULTS['max_tokens']:,}, "
        f"final evaluation on the first {QUICK_EVAL_WINDOWS} windows of WikiText-2 valid/test "
        f"only, out_dir {QUICK_DEFAULTS['out_dir']}; shows the pipeline works, not which "
        "variant is better",
    )


def demo_fields(args) -> dict:
    """The demo's ``TrainConfig`` fields that no flag set: :data:`DEMO_DEFAULTS`, with :data:`QUICK_DEFAULTS` under
    ``--quick``."""
    base = {**DEMO_DEFAULTS, **(QUICK_DEFAULTS if args.quick else {})}
    return {k: v for k, v in base.items() if getattr(args, k, None) is None}


def with_quick_evaluation(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` whose final evaluation scores the windows one quick validation reads (``eval_batches x batch_size``
    from the start of each split; :data:`QUICK_EVAL_WINDOWS` at the defaults), whatever the flags set."""
    windows = cfg.eval_batches * cfg.batch_size if cfg.eval_batches is not None else QUICK_EVAL_WINDOWS
    return dataclasses.replace(cfg, task_options={**(cfg.task_options or {}), "final_eval_windows": windows})


def run(args) -> int:
    """Compare the demo's variants as ``compare`` does, with :data:`DEMO_DEFAULTS` (and :data:`QUICK_DEFAULTS` under
    ``--quick``) for every field no flag set: wiki-vital when its files are there, else WikiText-2 from the hub
    (:func:`coupled_qk.data.hub.demo_corpus`). Prints the table; returns 0.

    Raises:
        ValueError: as ``compare``'s :func:`~coupled_qk.commands.compare.run`, and no demo corpus available
            (saying what to get).
    """
    from coupled_qk.experiments.compare import comparison_dir, comparison_table, run_comparison

    reject_variant_flags(args, "demo")
    variants = parse_variants_option(args.variants)
    refuse_variant_conflicts(args, variants)
    defaults = demo_fields(args)
    if "corpus" in defaults:  # wiki-vital offline, else WikiText-2 from the hub, else an error saying what to get
        from coupled_qk.data.hub import demo_corpus

        defaults["corpus"], which = demo_corpus(args.data_dir)
        print(which)
    base = train_config_from_args(args, **defaults)
    if args.quick:
        base = with_quick_evaluation(base)
        print(
            f"demo --quick: a smoke run ({base.max_tokens} training tokens per variant, final evaluation on "
            f"{base.task_options['final_eval_windows']} windows of each split); for the real comparison run "
            "`coupled-qk demo`",
            flush=True,
        )
    seeds = parse_seeds(args.seeds)
    preflight(base, run_folder=False)  # the comparison folder is claimed by comparison_dir
    read_corpus_first(base)
    summary = run_comparison(base, variants, seeds, comparison_dir(base.out_dir, variants, args.overwrite))
    print(comparison_table(summary))
    print(f"\nwritten: {base.out_dir}/results.json, results.md, loss_curves.png")
    return 0
