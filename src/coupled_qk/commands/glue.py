"""``coupled-qk glue``: fine-tune pretrained checkpoints on GLUE (SST-2, CoLA, RTE, MRPC) over seeds."""

from __future__ import annotations

from coupled_qk.checks.cli import parse_seeds
from coupled_qk.extras import require_extra

HELP = "fine-tune pretrained checkpoints on GLUE tasks (SST-2, CoLA, RTE, MRPC) and compare them"


def add_arguments(parser) -> None:
    """Register the ``glue`` options on ``parser``: the pretrained runs, tasks, seeds and labels, the output and GLUE
    folders, the fine-tuning hyper-parameters (learning rate, epochs, batch, subsets, pooling), the device, dtype
    and compilation, the time guard, ``--dry-run`` and progress."""
    from coupled_qk.checks.cli import dtype_arg, folder_arg, path_arg, positive_float_arg, positive_int_arg
    from coupled_qk.commands.options import (
        add_compile_option,
        add_device_option,
        add_overwrite_option,
        add_progress_option,
    )

    parser.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="pretrained run folder(s) (or ckpt-* folders); the first is the baseline of the paired differences",
    )
    parser.add_argument("--task", default="all", help="sst2, cola, rte, mrpc, a comma-separated list, or all")
    parser.add_argument("--seeds", default="0,1,2", help="fine-tuning seeds (head init and data order)")
    parser.add_argument("--names", default=None, help="comma-separated labels of the runs (default: folder names)")
    parser.add_argument(
        "--out-dir", default=None, type=path_arg, help="default: RUN_DIR/glue for one run, runs/glue for several"
    )
    add_overwrite_option(parser)
    parser.add_argument(
        "--glue-dir",
        default=None,
        type=folder_arg,
        help="folder with SST-2/, CoLA/, RTE/, MRPC/ (default: <data>/glue)",
    )
    parser.add_argument("--lr", type=positive_float_arg, default=None, help="learning rate (default per task, 1e-4)")
    parser.add_argument(
        "--epochs", type=positive_float_arg, default=None, help="epochs (default per task: 3, RTE/MRPC 5)"
    )
    parser.add_argument("--batch-size", type=positive_int_arg, default=None, help="batch size (default 32)")
    parser.add_argument(
        "--max-train-examples",
        default=None,
        help="fine-tune on a seeded random subset of this many training rows (default: all): N for "
        "every task or task=N pairs, e.g. sst2=3000,rte=600",
    )
    parser.add_argument(
        "--pooling",
        default="last",
        choices=("last", "mean"),
        help="classify from the last token's hidden state (default) or the mean over tokens",
    )
    add_device_option(parser)
    parser.add_argument(
        "--dtype",
        type=dtype_arg,
        default=None,
        help="autocast dtype of every fine-tune: auto, fp32, bf16 or fp16 (default auto: bf16 on CUDA, fp32 on CPU)",
    )
    add_compile_option(parser)
    parser.add_argument(
        "--max-minutes",
        type=positive_float_arg,
        default=None,
        help="wall-clock guard for the whole study: the fine-tune in progress is stopped (and "
        "resumed by the next invocation), later ones are skipped; the summary counts finished "
        "runs only and names the incomplete cells",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the planned fine-tunes (model x task x seed), their folders and whether each "
        "would be trained, resumed or reused, then exit (nothing is created)",
    )
    add_progress_option(parser)


def _checked(args) -> tuple[list[str], list[int], int | dict | None, list[str], str]:
    """``(tasks, seeds, max_train_examples, names, out_dir)`` of ``args``, every input checked (pretrained runs,
    GLUE files, names) before any folder is created; ``ValueError`` naming the option otherwise."""
    from coupled_qk.experiments.glue.finetune import check_names, model_name, parse_per_task, parse_tasks

    tasks, seeds = parse_tasks(args.task), parse_seeds(args.seeds)
    if args.dtype is not None:  # checked against the device before any folder is created
        from coupled_qk.devices import check_dtype

        check_dtype("--dtype", args.dtype, args.device)
    subsets = parse_per_task(args.max_train_examples)
    unused = sorted(set(subsets) - set(tasks)) if isinstance(subsets, dict) else []
    if unused:  # a task=N pair for a task not fine-tuned would be silently ignored
        raise ValueError(
            f"--max-train-examples={args.max_train_examples!r} sets {', '.join(unused)}, which "
            f"--task={args.task!r} does not fine-tune; expected task=N pairs of {', '.join(tasks)}"
        )
    from coupled_qk.training.run_folder import open_run

    if args.out_dir is not None:  # a folder it may not write (a training run's, a user's) before the runs are read
        _claim_out_dir(args, args.out_dir)
    # every pretrained run exists and can be read (not still training, a language model with its tokenizer)
    # before any folder is created
    pretrained = [open_run(run_dir, "glue", text=True) for run_dir in args.run_dirs]
    if args.glue_dir is not None:  # a file, a missing or an unreadable folder: one line naming the option
        from coupled_qk.checks.paths import input_dir

        input_dir("--glue-dir", args.glue_dir)
    from coupled_qk.data.glue import SPLITS, load_glue

    for task in tasks:  # every file read (a missing, malformed or empty one named) before any folder is created
        for split in SPLITS:
            load_glue(task, split, args.glue_dir)

    if args.names is not None:  # checked before any folder is created
        names = check_names([n.strip() for n in args.names.split(",")], len(args.run_dirs), "--names")
    else:
        names = check_names(
            [model_name(p) for p in args.run_dirs], len(args.run_dirs), "the runs' folder names (--names to label them)"
        )
    if args.out_dir is not None:
        out_dir = args.out_dir
    else:
        out_dir = str(pretrained[0].folder.glue_dir) if len(args.run_dirs) == 1 else "runs/glue"
    return tasks, seeds, subsets, names, out_dir


def _claim_out_dir(args, out_dir: str):
    """The study's output folder, claimed (:class:`coupled_qk.output_dir.OutputDir`; nothing is created): the report
    files are regenerated by a rerun (finished runs are reused); the folder may hold one folder per pretrained model
    and nothing else."""
    from coupled_qk.output_dir import OutputDir
    from coupled_qk.training.run_folder import RESULTS_FILE

    layout = (RESULTS_FILE, "results.md", "*/")
    return OutputDir(
        out_dir, "--out-dir", overwrite=args.overwrite, what="a GLUE study", layout=layout, rewrite=layout[:2]
    )


def run(args) -> int:
    """Fine-tune (or, with ``--dry-run``, list) every pretrained run x task x seed; returns 0 (errors raise
    ``ValueError``, reported by the CLI)."""
    from coupled_qk.experiments.glue.finetune import format_table, plan_glue, run_glue

    if not args.dry_run:  # metrics and intervals: refused before any work, not after the fine-tunes
        require_extra(("sklearn", "scipy"), "glue", "coupled-qk glue (metrics and intervals)")
    tasks, seeds, subsets, names, out_dir = _checked(args)
    options = dict(
        glue_dir=args.glue_dir,
        lr=args.lr,
        epochs=args.epochs,
        batch_size=args.batch_size,
        max_train_examples=subsets,
        pooling=args.pooling,
        device=args.device,
        progress=args.progress,
        compile=args.compile,
        **({"dtype": args.dtype} if args.dtype is not None else {}),
    )
    if args.dry_run:
        from coupled_qk.study.executor import plan_lines

        plan = plan_glue(args.run_dirs, tasks, seeds, out_dir, names, **options)
        print(
            f"coupled-qk glue: {len(plan)} fine-tunes ({len(names)} models x {len(tasks)} tasks x {len(seeds)} "
            f"seeds) -> {out_dir}"
        )
        print("\n".join(plan_lines(plan)))
        return 0
    out_dir = _claim_out_dir(args, out_dir)
    summary = run_glue(
        args.run_dirs,
        tasks,
        seeds,
        out_dir,
        names=names,
        max_minutes=args.max_minutes,
        log=lambda line: print(line, flush=True),
        **options,
    )
    print(format_table(summary))
    counts = ", ".join(f"{k} {v}" for k, v in sorted(summary["counts"].items()))
    print(f"\n{counts}" + ("" if summary["complete"] else "; incomplete: run the same command again to finish"))
    print(f"written: {out_dir}/results.json, results.md")
    return 0
