"""``coupled-qk claims``: run a claims protocol (or reuse its committed run records) and regenerate the report.

Example: ``coupled-qk claims --protocol cpu-short`` trains what is missing, then writes
``docs/results/claims/cpu-short.{md,json}`` and ``figures/cpu-short-*.png``; ``--report-only`` skips training.
"""

from __future__ import annotations

import shlex
from pathlib import Path

DEFAULT_GLUE_JSON = "docs/results/glue-cpu/results.json"  # committed by the GLUE study (issue 15)
HELP = "run a claims protocol (C1-C13 with seeds and confidence intervals) and regenerate its report"


def add_arguments(parser) -> None:
    from coupled_qk.commands.options import path_arg
    from coupled_qk.experiments.protocols import PROTOCOLS

    parser.add_argument("--protocol", required=True, choices=sorted(PROTOCOLS),
                        help="smoke (toy budgets, every code path), cpu-short / cpu (the CPU study), gpu-60m / "
                             "gpu-paper (defined, not runnable here)")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds replacing every cell's seeds")
    parser.add_argument("--out-dir", default=None, type=path_arg,
                        help="report folder; run records go to OUT_DIR/runs/PROTOCOL (default docs/results/claims; "
                             "runs/claims-smoke for the smoke protocol)")
    parser.add_argument("--run-root", default="runs/claims", type=path_arg, help="run folders (checkpoints; default runs/claims)")
    parser.add_argument("--data-dir", default=None, type=path_arg, help="data folder (default: COUPLED_QK_DATA or ../shared/data)")
    parser.add_argument("--cache-dir", default=None, type=path_arg, help="derived data (default: the token cache folder)")
    parser.add_argument("--cells", default=None, help="comma-separated cells to run (default: all, in order)")
    parser.add_argument("--shard", default="0/1", help="I/N: run every N-th run starting at I (parallel processes)")
    parser.add_argument("--defer-wt2", action="store_true", help="train every run first, then evaluate WikiText-2")
    parser.add_argument("--report-only", action="store_true", help="do not train; report from the records")
    parser.add_argument("--glue-json", default=None, type=path_arg,
                        help="GLUE results for C11: a `coupled-qk glue` results.json, or a JSON list of rows with task, "
                        f"variant, seed and score (default: {DEFAULT_GLUE_JSON} if it exists, except for smoke)")
    parser.add_argument("--no-figures", action="store_true", help="skip the PNG figures")
    from coupled_qk.commands.options import add_overwrite_option

    add_overwrite_option(parser)


def _shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard={text!r}: expected I/N, e.g. 0/2") from None
    if not (n >= 1 and 0 <= i < n):
        raise ValueError(f"--shard={text!r}: expected 0 <= I < N")
    return i, n


def run(args) -> int:
    from coupled_qk.commands.options import parse_seeds
    from coupled_qk.data.paths import default_cache_dir, default_data_dir
    from coupled_qk.experiments.claims_report import build_report, format_markdown, report_dir, write_report
    from coupled_qk.experiments.claims_runs import run_protocol
    from coupled_qk.experiments.protocols import get_protocol

    protocol = get_protocol(args.protocol)
    if args.seeds is not None:
        protocol = protocol.with_seeds(tuple(parse_seeds(args.seeds)))
    shard = _shard(args.shard)
    if args.out_dir is None:
        out_dir = "runs/claims-smoke" if protocol.name == "smoke" else "docs/results/claims"
    else:
        out_dir = args.out_dir
    out = report_dir(out_dir, protocol.name, overwrite=args.overwrite)  # checked before any training
    if not args.report_only and protocol.runnable:
        from coupled_qk.outputs import input_dir, output_location

        output_location("--run-root", args.run_root)
        if args.data_dir is not None and Path(args.data_dir).exists():  # missing is fine when every run is reused
            input_dir("--data-dir", args.data_dir)
        data_dir = args.data_dir if args.data_dir is not None else default_data_dir()
        cache = output_location("--cache-dir", args.cache_dir) if args.cache_dir is not None else (
            default_cache_dir() / "claims-data")
        cells = [c for c in args.cells.split(",") if c.strip()] if args.cells else None
        run_protocol(protocol, out_dir, args.run_root, data_dir, cache, cells=cells, shard=shard,
                     defer_wt2=args.defer_wt2)
    use_default = protocol.name != "smoke" and Path(DEFAULT_GLUE_JSON).is_file()  # smoke: toy runs only
    glue_json = args.glue_json if args.glue_json is not None else (DEFAULT_GLUE_JSON if use_default else None)
    report = build_report(protocol, out_dir, glue_json)
    # the command that regenerates this report from scratch: without --cells/--shard/--report-only/--run-root,
    # which choose what this invocation trains, not what the report contains
    given = ["--protocol", args.protocol]
    for flag, value in (("--seeds", args.seeds), ("--out-dir", args.out_dir), ("--glue-json", args.glue_json)):
        if value is not None:
            given += [flag, str(value)]
    command = "coupled-qk claims " + shlex.join(given)
    paths = write_report(report, protocol, out, command, figures=not args.no_figures)
    print(format_markdown(report, command).split("\n## Notes")[0])
    print("written: " + ", ".join(str(p) for p in paths))
    return 0
