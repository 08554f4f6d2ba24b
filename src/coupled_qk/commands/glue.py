"""``coupled-qk glue``: fine-tune pretrained checkpoints on GLUE (SST-2, CoLA, RTE, MRPC) over seeds."""

from __future__ import annotations

from coupled_qk.commands.options import parse_seeds

HELP = "fine-tune pretrained checkpoints on GLUE tasks (SST-2, CoLA, RTE, MRPC) and compare them"


def add_arguments(parser) -> None:
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="pretrained run folder(s) (or ckpt-* folders); the first is the baseline of the "
                        "paired differences")
    parser.add_argument("--task", default="all", help="sst2, cola, rte, mrpc, a comma-separated list, or all")
    parser.add_argument("--seeds", default="0,1,2", help="fine-tuning seeds (head init and data order)")
    parser.add_argument("--names", default=None, help="comma-separated labels of the runs (default: folder names)")
    parser.add_argument("--out-dir", default=None, help="default: RUN_DIR/glue for one run, runs/glue for several")
    parser.add_argument("--glue-dir", default=None, help="folder with SST-2/, CoLA/, RTE/, MRPC/ (default: <data>/glue)")
    parser.add_argument("--lr", type=float, default=None, help="learning rate (default per task, 1e-4)")
    parser.add_argument("--epochs", type=float, default=None, help="epochs (default per task: 3, RTE/MRPC 5)")
    parser.add_argument("--batch-size", type=int, default=None, help="batch size (default 32)")
    parser.add_argument("--max-train-examples", default=None,
                        help="fine-tune on a seeded random subset of this many training rows (default: all): N for "
                        "every task or task=N pairs, e.g. sst2=3000,rte=600")
    parser.add_argument("--pooling", default="last", choices=("last", "mean"),
                        help="classify from the last token's hidden state (default) or the mean over tokens")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--no-progress", dest="progress", action="store_false")


def run(args) -> int:
    from coupled_qk.experiments.glue import format_table, parse_per_task, parse_tasks, run_glue

    tasks, seeds = parse_tasks(args.task), parse_seeds(args.seeds)
    names = [n.strip() for n in args.names.split(",")] if args.names else None
    out_dir = args.out_dir or (f"{args.run_dirs[0]}/glue" if len(args.run_dirs) == 1 else "runs/glue")
    subsets = parse_per_task(args.max_train_examples)
    summary = run_glue(args.run_dirs, tasks, seeds, out_dir, names=names, glue_dir=args.glue_dir, lr=args.lr,
                       epochs=args.epochs, batch_size=args.batch_size, max_train_examples=subsets,
                       pooling=args.pooling, device=args.device, progress=args.progress)
    print(format_table(summary))
    print(f"\nwritten: {out_dir}/results.json, results.md")
    return 0
