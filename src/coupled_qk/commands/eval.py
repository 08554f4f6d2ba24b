"""``coupled-qk eval CHECKPOINT``: perplexity (per token and per word) and bits per byte and per character of a
trained model on whole corpus splits."""

from __future__ import annotations

import json

HELP = "perplexity and bits per byte of a checkpoint on a corpus split"


def _ignored_options() -> dict:
    """``--overwrite`` replaces the ``--json`` file and nothing else: without ``--json`` it would be ignored."""
    from coupled_qk.commands.ignored import Applies

    return {
        "--overwrite": (
            Applies(
                lambda a: a.json_out is not None,
                "no --json (eval writes no file without it)",
                "replacing an existing --json file",
            ),
        )
    }


def add_arguments(parser) -> None:
    """Register the ``eval`` options on ``parser``: the checkpoint, the corpus and splits, the windows (stride,
    batch), the device, the ``--json`` file with ``--overwrite``, and progress."""
    from coupled_qk.checks.cli import folder_arg, path_arg, positive_int_arg
    from coupled_qk.commands.options import add_device_option, add_overwrite_option, add_progress_option

    parser.add_argument(
        "checkpoint", type=path_arg, help="a run folder (uses its latest checkpoint) or a ckpt-* folder"
    )
    parser.add_argument("--corpus", default=None, help="corpus name or path (default: the run's corpus)")
    parser.add_argument(
        "--data-dir",
        default=None,
        type=folder_arg,
        help="data folder of named corpora (default: the run's, else COUPLED_QK_DATA or ../shared/data)",
    )
    parser.add_argument("--splits", default="valid,test", help="comma-separated splits (train, valid, test)")
    parser.add_argument(
        "--stride", type=positive_int_arg, default=None, help="sliding-window stride (default: non-overlapping)"
    )
    parser.add_argument("--batch-size", type=positive_int_arg, default=8, help="windows per forward pass (default 8)")
    add_device_option(parser)
    parser.add_argument(
        "--json",
        dest="json_out",
        default=None,
        type=path_arg,
        help="also write the results to this JSON file (an existing file only with --overwrite)",
    )
    add_overwrite_option(parser)
    add_progress_option(parser)


def run(args) -> int:
    """Score the checkpoint on each of ``--splits`` (:func:`coupled_qk.training.evaluate.evaluate_checkpoint`) and
    print one line per split: token perplexity, word perplexity and bits per byte and per character where the
    corpus has them; with ``--json`` the results are also written there (the file claimed before evaluating).
    Returns 0.

    Raises:
        ValueError: repeated or empty split names, an empty ``--corpus``, ``--overwrite`` without ``--json``, a
            ``--json`` path that is a run's own file or exists without ``--overwrite``, a bad checkpoint or corpus
            (exit 2 from the CLI).
    """
    from coupled_qk.commands.ignored import refuse_ignored_options
    from coupled_qk.output_dir import output_file
    from coupled_qk.training.evaluate import evaluate_checkpoint
    from coupled_qk.training.run_folder import refuse_run_file

    refuse_ignored_options(args, add_arguments, _ignored_options())
    json_out = None
    if args.json_out is not None:  # checked before the evaluation, so its result is never lost to its path
        refuse_run_file("--json", args.json_out)  # a run's own file (its config.json), --overwrite or not
        json_out = output_file("--json", args.json_out, overwrite=args.overwrite, written_by="eval")
    splits = [s.strip() for s in args.splits.split(",")]
    if not all(splits) or len(set(splits)) != len(splits):
        raise ValueError(
            f"--splits={args.splits!r}: expected distinct comma-separated split names (train, valid, test)"
        )
    if args.corpus is not None and not args.corpus.strip():
        raise ValueError("--corpus='' is empty; expected a corpus name or path")
    res = evaluate_checkpoint(
        args.checkpoint, args.corpus, args.data_dir, splits, args.stride, args.batch_size, args.device
    )
    for split in splits:
        r = res[split]
        line = f"{split}: token perplexity {r['perplexity']:.3f} over {r['n_tokens']:,} {res['tokenizer']} tokens"
        if "word_perplexity" in r:
            line += f"; word perplexity {r['word_perplexity']:.3f} over {r['n_words']:,} words"
        if "bits_per_byte" in r:
            line += (
                f"; {r['bits_per_byte']:.4f} bits per byte over {r['n_bytes']:,} bytes, "
                f"{r['bits_per_char']:.4f} bits per character"
            )
        print(line)
    if json_out is not None:
        from coupled_qk.output_dir import write_output_file

        write_output_file(json_out, json.dumps(res, indent=2) + "\n", "eval")
    return 0
