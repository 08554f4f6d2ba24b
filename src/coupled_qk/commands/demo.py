"""``coupled-qk demo``: standard vs coupled (Euler, leapfrog) vs uncoupled MLP on real Wikipedia text.

Trains the ``tiny`` preset with a byte-level BPE (8,192 tokens) trained on the wiki-vital lead sections,
validates and tests on WikiText-2 valid/test, all on CPU in about 15 minutes on 2 cores.
"""

from __future__ import annotations

from coupled_qk.commands.options import add_overwrite_option, parse_seeds, reject_variant_flags
from coupled_qk.commands.train import add_train_options, config_from_args, preflight

HELP = "standard vs coupled (Euler, leapfrog) vs uncoupled MLP on wiki-vital, on CPU in minutes"
DEMO_VARIANTS = "standard,coupled,coupled_leapfrog,uncoupled_mlp"
DEMO_DEFAULTS = dict(
    corpus="wiki-vital", tokenizer="bpe-8192", preset="tiny", batch_size=16, lr=2e-3, warmup_steps=50,
    max_tokens=900_000, eval_interval=100, eval_batches=8, log_interval=10, out_dir="runs/demo",
)


def add_arguments(parser) -> None:
    add_train_options(parser, defaults=DEMO_DEFAULTS, variant_flags=False)
    parser.add_argument("--variants", default=DEMO_VARIANTS, help=f"variants to compare (default {DEMO_VARIANTS})")
    add_overwrite_option(parser)
    parser.add_argument("--seeds", default="0", help="comma-separated seeds")


def run(args) -> int:
    from coupled_qk.experiments.compare import comparison_dir, comparison_table, run_comparison

    reject_variant_flags(args, "demo")
    defaults = {k: v for k, v in DEMO_DEFAULTS.items() if getattr(args, k, None) is None}
    if "corpus" in defaults:  # wiki-vital offline, else WikiText-2 from the hub, else an error saying what to get
        from coupled_qk.data.hub import demo_corpus

        defaults["corpus"], which = demo_corpus(args.data_dir)
        print(which)
    base = config_from_args(args, **defaults)
    seeds = parse_seeds(args.seeds)
    preflight(base, run_folder=False)  # the comparison folder is claimed by comparison_dir
    variants = [v.strip() for v in args.variants.split(",")]
    summary = run_comparison(base, variants, seeds, comparison_dir(base.out_dir, variants, args.overwrite))
    print(comparison_table(summary))
    print(f"\nwritten: {base.out_dir}/results.json, results.md, loss_curves.png")
    return 0
