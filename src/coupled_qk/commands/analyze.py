"""``coupled-qk analyze``: attention diagnostics (entropy, effective rank, sinks, rank collapse) of checkpoints.

Runs :func:`coupled_qk.analysis.analyze.analyze_checkpoints` and writes ``analysis.json``, PNG figures and
``summary.md`` into ``--out-dir``. Definitions: docs/METHOD.md section 7 and
:data:`coupled_qk.analysis.analyze.CONVENTIONS`.
"""

from __future__ import annotations

HELP = "attention diagnostics (entropy, effective rank, sinks, rank collapse) of checkpoints"


def _on_cpu(args) -> bool:
    from coupled_qk.training.distributed import pick_device

    return pick_device(args.device).type == "cpu"


def _ignored_options() -> dict:
    """The example map is drawn only in the figures, and ``--threads`` runs heads concurrently only on CPU: with
    ``--no-plots`` or another device these options would be ignored."""
    from coupled_qk.commands.ignored import Applies

    plots = Applies(
        lambda a: not a.no_plots,
        "--no-plots (the example attention map is drawn only in the figures)",
        "the example map figure",
    )
    cpu = Applies(
        _on_cpu, "a --device other than the CPU (heads run concurrently only on the CPU)", "the CPU's concurrent heads"
    )
    return {"--example-layer": (plots,), "--example-head": (plots,), "--threads": (cpu,)}


def add_arguments(parser) -> None:
    """Register the ``analyze`` options on ``parser``: the checkpoints and the text they read (corpus, split,
    windows), the report folder and labels, the example maps, the device and threads, figures and progress."""
    from coupled_qk.checks.cli import folder_arg, nonneg_int_arg, path_arg, positive_int_arg, seed_arg, threads_arg
    from coupled_qk.commands.options import add_device_option, add_overwrite_option, add_progress_option

    parser.add_argument(
        "checkpoints",
        nargs="+",
        metavar="CHECKPOINT",
        help="run folders (their latest checkpoint) or checkpoint folders (ckpt-*)",
    )
    parser.add_argument(
        "--corpus",
        default=None,
        help="corpus name (wiki-vital, pubmed, mixed-domain, wikitext-2, ...) or a text path "
        "(default: the runs' own corpus, split as in training)",
    )
    parser.add_argument("--split", default="valid", choices=("train", "valid", "test"), help="default: valid")
    parser.add_argument("--n-sequences", type=positive_int_arg, default=8, help="windows analysed (default 8)")
    parser.add_argument(
        "--seq-len",
        type=positive_int_arg,
        default=None,
        help="tokens per window (default: the smallest block_size of the checkpoints)",
    )
    parser.add_argument(
        "--data-dir", default=None, type=folder_arg, help="data folder (default: COUPLED_QK_DATA or ../shared/data)"
    )
    parser.add_argument(
        "--out-dir",
        default="runs/analysis",
        type=path_arg,
        help="where the report goes (default runs/analysis); an earlier report there is replaced only with --overwrite",
    )
    add_overwrite_option(parser)
    parser.add_argument("--labels", default=None, help="comma-separated labels, one per checkpoint")
    parser.add_argument(
        "--batch-size",
        type=positive_int_arg,
        default=None,
        help="sequences per forward pass (default: all; lower it to save memory)",
    )
    parser.add_argument(
        "--example-layer",
        type=nonneg_int_arg,
        default=None,
        help="layer of the example attention maps (default: the middle layer)",
    )
    parser.add_argument("--example-head", type=nonneg_int_arg, default=0, help="head of the example maps (default 0)")
    parser.add_argument(
        "--split-seed",
        type=seed_arg,
        default=None,
        help="seed of random document splits (pubmed, mixed-domain, text paths); default: the run's",
    )
    add_device_option(parser, default="cpu")
    parser.add_argument(
        "--threads",
        type=threads_arg,
        default=None,
        help="CPU: heads analysed concurrently (default: torch's thread count)",
    )
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG figures")
    add_progress_option(parser)  # tokenizing the split (a bar for large corpora)


def run(args) -> int:
    """Analyse every checkpoint of ``args`` (:func:`coupled_qk.analysis.analyze.analyze_checkpoints`), write
    ``analysis.json``, ``summary.md`` and the figures into the claimed ``--out-dir``, and print each checkpoint's
    headline metrics; returns 0.

    Raises:
        ValueError: ``--seq-len`` below 2, an empty label, an option ignored in this mode (``--example-*`` with
            ``--no-plots``, ``--threads`` off the CPU), an output folder refused without ``--overwrite``, or a bad
            checkpoint or corpus (reported by the CLI in one line, exit 2).
    """
    from coupled_qk.analysis.analyze import analyze_checkpoints
    from coupled_qk.checks.values import positive_int
    from coupled_qk.commands.ignored import refuse_ignored_options

    positive_int("--n-sequences", args.n_sequences)
    if args.seq_len is not None and (positive_int("--seq-len", args.seq_len) < 2):
        raise ValueError(f"--seq-len={args.seq_len} must be at least 2")
    for flag in ("batch_size", "threads"):
        if getattr(args, flag) is not None:
            positive_int(f"--{flag.replace('_', '-')}", getattr(args, flag))
    refuse_ignored_options(args, add_arguments, _ignored_options())
    labels = None
    if args.labels is not None:
        labels = [label.strip() for label in args.labels.split(",")]
        if any(not label for label in labels):
            raise ValueError(f"--labels {args.labels!r}: labels must be non-empty")
    from coupled_qk.analysis.analyze import ANALYSIS_LAYOUT
    from coupled_qk.output_dir import OutputDir

    out = OutputDir(args.out_dir, "--out-dir", overwrite=args.overwrite, layout=ANALYSIS_LAYOUT, what="analyze")
    report = analyze_checkpoints(
        args.checkpoints,
        args.corpus,
        split=args.split,
        n_sequences=args.n_sequences,
        seq_len=args.seq_len,
        data_dir=args.data_dir,
        out_dir=out,
        labels=labels,
        batch_size=args.batch_size,
        example_layer=args.example_layer,
        example_head=args.example_head,
        split_seed=args.split_seed,
        device=args.device,
        threads=args.threads,
        make_plots=not args.no_plots,
    )
    from coupled_qk.analysis.report import headline

    for e in report["checkpoints"]:
        print(f"{e['label']}: {e['analysis']['attention']}, {e['checkpoint']} ({e['seconds']:.1f} s)")
        print(f"  {headline(e['analysis'])}")
    print(
        f"wrote {report['files']['summary.md']}, {report['files']['analysis.json']} and "
        f"{len(report['files']) - 2} figures"
    )
    return 0
