"""``coupled-qk claims``: run a claims protocol (or reuse its committed run records) and regenerate the report.

Example: ``coupled-qk claims --protocol cpu-short`` trains what is missing, then writes
``docs/results/claims/cpu-short.{md,json}`` and ``figures/cpu-short-*.png``; ``--report-only`` skips training.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from coupled_qk.extras import require_extra

DEFAULT_GLUE_JSON = "docs/results/glue-cpu/results.json"  # committed by the GLUE study (issue 15)
HELP = "run a claims protocol (C1-C13 with seeds and confidence intervals) and regenerate its report"


def add_arguments(parser) -> None:
    from coupled_qk.commands.options import folder_arg, nonneg_float_arg, path_arg, positive_int_arg
    from coupled_qk.experiments.claims.converged import DESIGNS
    from coupled_qk.experiments.claims.protocols import PROTOCOLS

    parser.add_argument(
        "--protocol",
        required=True,
        choices=sorted([*PROTOCOLS, *DESIGNS]),
        help="smoke (toy budgets, every code path), cpu-short / cpu (the first-epoch CPU study), "
        "cpu-converged (trained to a plateau at tuned learning rates), cpu-converged-pubmed (the "
        "same design on PubMed, C9), gpu-60m (the same design at 60M on WikiText-103, for a GPU), "
        "toy-converged / toy-gpu-60m (their toy instances), gpu-paper (defined, not runnable here)",
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="print the planned runs and whether each has a record (converged protocols: also the data check and "
        "the cost estimate); "
        "train nothing",
    )
    parser.add_argument(
        "--max-runs",
        type=positive_int_arg,
        default=None,
        help="converged protocols: stop after training this many new runs",
    )
    parser.add_argument(
        "--commit-records",
        action="store_true",
        help="converged protocols: git-commit each new run record (and the regenerated report) as "
        "soon as it is written",
    )
    parser.add_argument("--seeds", default=None, help="comma-separated seeds replacing every cell's seeds")
    parser.add_argument(
        "--variants",
        default=None,
        help="comma-separated variant specs trained in every cell next to its own variants (paired by "
        "seed) and reported against the cell's standard runs, e.g. --variants coupled+n_steps=3; any "
        "registered variant, plugins included",
    )
    parser.add_argument(
        "--out-dir",
        default=None,
        type=path_arg,
        help="report folder; run records go to OUT_DIR/runs/PROTOCOL (default docs/results/claims; "
        "runs/claims-smoke for the smoke protocol)",
    )
    parser.add_argument(
        "--run-root", default="runs/claims", type=folder_arg, help="run folders (checkpoints; default runs/claims)"
    )
    parser.add_argument(
        "--data-dir", default=None, type=folder_arg, help="data folder (default: COUPLED_QK_DATA or ../shared/data)"
    )
    parser.add_argument(
        "--cache-dir", default=None, type=folder_arg, help="derived data (default: the token cache folder)"
    )
    parser.add_argument("--cells", default=None, help="comma-separated cells to run (default: all, in order)")
    parser.add_argument("--shard", default="0/1", help="I/N: run every N-th run starting at I (parallel processes)")
    parser.add_argument("--defer-wt2", action="store_true", help="train every run first, then evaluate WikiText-2")
    parser.add_argument("--report-only", action="store_true", help="do not train; report from the records")
    parser.add_argument(
        "--glue-json",
        default=None,
        type=path_arg,
        help="GLUE results for C11: a `coupled-qk glue` results.json, or a JSON list of rows with task, "
        f"variant, seed and score (default: {DEFAULT_GLUE_JSON} if it exists, except for smoke)",
    )
    parser.add_argument("--no-figures", action="store_true", help="skip the PNG figures")
    parser.add_argument(
        "--verify",
        default=None,
        metavar="RECORD",
        type=path_arg,
        help="re-train the run of one committed record of this protocol from scratch (in "
        "RUN_ROOT/verify, one thread) and compare its metrics with the record; exit 1 if the "
        "primary metric differs by more than --tolerance",
    )
    parser.add_argument(
        "--tolerance",
        default=1e-4,
        type=nonneg_float_arg,
        help="--verify: accepted difference of the test loss (else validation loss), nats (default 1e-4)",
    )
    from coupled_qk.commands.options import add_overwrite_option, add_progress_option

    add_overwrite_option(parser)
    add_progress_option(parser)  # the held-out evaluations' bars and the tokenizers' training


def _ignored_options() -> dict:
    """``--tolerance`` is read by ``--verify`` alone; ``--verify`` re-trains one record's run and writes no report, so
    the report's options are not read with it; a converged protocol regenerates its report from its records on
    every run, so ``--overwrite`` is not read there (the other flags these modes ignore have their own checks below,
    older than this table)."""
    from coupled_qk.commands.ignored import Applies
    from coupled_qk.experiments.claims.converged import DESIGNS

    verify = Applies(
        lambda a: a.verify is not None,
        "no --verify (nothing is re-trained to compare with a record)",
        "--verify's comparison",
    )
    report = Applies(
        lambda a: a.verify is None,
        "--verify (it re-trains the one run of its record, compares its metrics and writes no report)",
        "a protocol's runs and report",
    )
    classic = Applies(
        lambda a: a.protocol not in DESIGNS,
        "a converged --protocol (its report is regenerated from its "
        f"records on every run; {', '.join(sorted(DESIGNS))})",
        "the other protocols' report",
    )
    return {
        "--tolerance": (verify,),
        "--out-dir": (report,),
        "--glue-json": (report,),
        "--no-figures": (report,),
        "--defer-wt2": (report,),
        "--overwrite": (report, classic),
    }


def _shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard={text!r}: expected I/N, e.g. 0/2") from None
    if not (n >= 1 and 0 <= i < n):
        raise ValueError(f"--shard={text!r}: expected 0 <= I < N")
    return i, n


def run(args) -> int:
    require_extra(("scipy",), "claims", "coupled-qk claims (intervals and verdicts)")
    from coupled_qk.commands.ignored import refuse_ignored_options
    from coupled_qk.commands.options import parse_seeds, parse_variants_option
    from coupled_qk.data.paths import default_cache_dir, default_data_dir
    from coupled_qk.experiments.claims.build import build_report
    from coupled_qk.experiments.claims.converged import DESIGNS
    from coupled_qk.experiments.claims.markdown import format_markdown
    from coupled_qk.experiments.claims.protocols import get_protocol
    from coupled_qk.experiments.claims.report import report_dir, write_report
    from coupled_qk.experiments.claims.runs import run_protocol

    refuse_ignored_options(args, add_arguments, _ignored_options())
    if args.verify is not None:
        return _verify(args)
    _refuse_training_flags_without_training(args)
    if args.protocol in DESIGNS:
        return _run_converged(args)
    # the converged-only flags, refused rather than ignored
    for flag, given in (("--max-runs", args.max_runs is not None), ("--commit-records", args.commit_records)):
        if given:
            raise ValueError(
                f"{flag} applies only to the converged protocols ({', '.join(sorted(DESIGNS))}), "
                f"not to {args.protocol!r}: --cells and --shard choose the runs to train"
            )
    protocol = get_protocol(args.protocol)
    if args.seeds is not None:
        protocol = protocol.with_seeds(tuple(parse_seeds(args.seeds)))
    if args.variants is not None:
        protocol = protocol.with_variants(parse_variants_option(args.variants))
    shard = _shard(args.shard)
    cells = _cells(args.cells, protocol)  # checked when the command starts, also when nothing is trained
    if args.report_only and (cells is not None or shard != (0, 1)):
        raise ValueError("--cells and --shard choose the runs to train; --report-only trains nothing (drop them)")
    out_dir = args.out_dir
    if out_dir is None:
        out_dir = "runs/claims-smoke" if protocol.name == "smoke" else "docs/results/claims"
    if args.plan:  # the runs and their state; trains and writes nothing
        from coupled_qk.experiments.claims.runs import plan_lines as protocol_plan

        print("\n".join(protocol_plan(protocol, out_dir, cells)))
        return 0
    if args.glue_json is not None:  # an explicit results file must exist and parse (before any training)
        from coupled_qk.experiments.claims.glue import load_glue_rows

        load_glue_rows("--glue-json", args.glue_json)
    out = report_dir(out_dir, protocol.name, overwrite=args.overwrite)  # checked before any training
    if not args.report_only and protocol.runnable:
        from coupled_qk.checks.paths import output_location
        from coupled_qk.outputs import input_dir

        output_location("--run-root", args.run_root)
        if args.data_dir is not None and Path(args.data_dir).exists():  # missing is fine when every run is reused
            input_dir("--data-dir", args.data_dir)
        data_dir = args.data_dir if args.data_dir is not None else default_data_dir()
        cache = (
            output_location("--cache-dir", args.cache_dir)
            if args.cache_dir is not None
            else (default_cache_dir() / "claims-data")
        )
        run_protocol(
            protocol, out_dir, args.run_root, data_dir, cache, cells=cells, shard=shard, defer_wt2=args.defer_wt2
        )
    use_default = protocol.name != "smoke" and Path(DEFAULT_GLUE_JSON).is_file()  # smoke: toy runs only
    glue_json = args.glue_json if args.glue_json is not None else (DEFAULT_GLUE_JSON if use_default else None)
    report = build_report(protocol, out_dir, glue_json)
    # the command that regenerates this report from scratch: without --cells/--shard/--report-only/--run-root,
    # which choose what this invocation trains, not what the report contains
    given = ["--protocol", args.protocol]
    for flag, value in (
        ("--seeds", args.seeds),
        ("--variants", args.variants),
        ("--out-dir", args.out_dir),
        ("--glue-json", args.glue_json),
    ):
        if value is not None:
            given += [flag, str(value)]
    command = "coupled-qk claims " + shlex.join(given)
    paths = write_report(report, protocol, out, command, figures=not args.no_figures)
    print(format_markdown(report, command).split("\n## Notes")[0])
    print("written: " + ", ".join(str(p) for p in paths))
    return 0


def _cells(option: str | None, protocol) -> list[str] | None:
    """The cells named by ``--cells`` (comma-separated, stripped), or ``None`` when not given.

    Raises:
        ValueError: an empty name or one that is not a cell of ``protocol``, naming ``--cells`` and the cells.
    """
    if option is None:
        return None
    cells = [c.strip() for c in option.split(",")]
    names = [c.name for c in protocol.cells]
    unknown = [c for c in cells if c not in names]
    if not all(cells) or unknown:
        raise ValueError(
            f"--cells={option!r}: {unknown or 'an empty name'} is not a cell of protocol "
            f"{protocol.name!r}; expected some of {names}"
        )
    return cells


def _refuse_training_flags_without_training(args) -> None:
    """``--plan`` and ``--report-only`` train nothing: the flags that steer training (``--max-runs``,
    ``--commit-records``; ``--report-only`` beside ``--plan``) are refused with them, not ignored.

    Raises:
        ValueError: naming the mode and the flags to drop.
    """
    for mode, on in (("--plan", args.plan), ("--report-only", args.report_only)):
        clash = [
            flag
            for flag, given in (
                ("--report-only", args.report_only and mode == "--plan"),
                ("--max-runs", args.max_runs is not None),
                ("--commit-records", args.commit_records),
            )
            if given
        ]
        if on and clash:
            raise ValueError(f"{mode} trains nothing; {', '.join(clash)} only apply when training (drop them)")


def _run_converged(args) -> int:
    """``claims --protocol cpu-converged|gpu-60m|toy-converged``: plan, train (resumable), report."""
    from coupled_qk.data.paths import default_cache_dir, default_data_dir
    from coupled_qk.experiments.claims.converged import get_design
    from coupled_qk.experiments.claims.converged_report import build_report, write_report
    from coupled_qk.experiments.claims.converged_study import plan_lines, run_design

    design = get_design(args.protocol)
    for flag, value in (
        ("--seeds", args.seeds),
        ("--cells", args.cells),
        ("--glue-json", args.glue_json),
        ("--variants", args.variants),
    ):
        if value is not None:
            raise ValueError(
                f"{flag} does not apply to the converged protocol {design.name!r} (its seeds and "
                "stages are pre-registered)"
            )
    # refused rather than ignored
    for flag, given, why in (
        (
            "--shard",
            args.shard != "0/1",
            "several processes share its runs without it: start one `coupled-qk claims` per core or GPU",
        ),
        ("--defer-wt2", args.defer_wt2, "its runs evaluate on their own split, with no WikiText-2 evaluation to defer"),
    ):
        if given:
            raise ValueError(f"{flag} does not apply to the converged protocol {design.name!r} ({why})")
    default_out = "runs/claims-toy" if design.name.startswith("toy-") else "docs/results/claims"
    out_dir = args.out_dir or default_out
    if not args.plan:  # records and the report go there: a file, an unwritable folder or one holding another
        from coupled_qk.experiments.claims.report import report_dir  # command's results fails now, not after a run

        report_dir(out_dir, design.name, overwrite=True)  # its report is regenerated from its records every time
    data_dir = args.data_dir or default_data_dir()
    command = "coupled-qk claims " + shlex.join(
        ["--protocol", design.name, *(["--out-dir", args.out_dir] if args.out_dir else [])]
    )
    if args.plan:
        print("\n".join(plan_lines(design, out_dir, data_dir)))
        return 0

    def regenerate() -> list[Path]:
        return write_report(
            build_report(design, out_dir), out_dir, command + " --report-only", figures=not args.no_figures
        )

    def commit(path: Path, record: dict) -> None:
        paths = regenerate()
        _git_commit(
            [path, *paths],
            f"{design.name}: {record['cell']} {record['variant']} seed {record['seed']} "
            f"(test ppl {record['final'].get('test/perplexity', float('nan')):.2f})",
        )

    if not args.report_only:
        cache = args.cache_dir or (default_cache_dir() / "claims-data")
        run_design(
            design,
            out_dir,
            args.run_root,
            data_dir,
            cache,
            max_runs=args.max_runs,
            on_record=commit if args.commit_records else None,
        )
        if os.environ.get("RANK", "0") != "0":
            return 0  # under torchrun, rank 0 alone writes the report
    paths = regenerate()
    print((Path(out_dir) / f"{design.name}.md").read_text().split("\n## Learning-rate grid")[0])
    print("written: " + ", ".join(str(p) for p in paths))
    return 0


def _verify(args) -> int:
    """``claims --protocol P --verify RECORD``: re-train one record's run and compare (exit 1 on a mismatch)."""
    from coupled_qk.data.paths import default_cache_dir, default_data_dir
    from coupled_qk.experiments.claims.verify import format_comparison, read_record, verify_record

    chosen = [
        flag
        for flag, given in (
            ("--plan", args.plan),
            ("--report-only", args.report_only),
            ("--max-runs", args.max_runs is not None),
            ("--commit-records", args.commit_records),
            ("--cells", args.cells is not None),
            ("--seeds", args.seeds is not None),
            ("--variants", args.variants is not None),
            ("--shard", args.shard != "0/1"),
        )
        if given
    ]
    if chosen:
        raise ValueError(
            f"--verify re-trains the one run of its record; {', '.join(chosen)} cannot be combined with it"
        )
    record, _ = read_record(args.verify)
    if record["protocol"] != args.protocol:
        raise ValueError(
            f"--verify={args.verify!r} is a record of protocol {record['protocol']!r}, not of "
            f"--protocol {args.protocol!r}"
        )
    cache = args.cache_dir or (default_cache_dir() / "claims-data")
    result = verify_record(
        args.verify, args.run_root, args.data_dir or default_data_dir(), cache, tolerance=args.tolerance
    )
    print(format_comparison(result))
    return 0 if result["match"] else 1


def _git_commit(paths: list[Path], message: str) -> None:
    """Commit ``paths`` (retrying while another git process holds the index); a failure is reported, not raised:
    the record is already safe on disk."""
    import subprocess
    import sys
    import time

    for attempt in range(10):
        add = subprocess.run(["git", "add", "--", *map(str, paths)], capture_output=True, text=True)
        done = (
            add.returncode == 0
            and subprocess.run(
                ["git", "commit", "-q", "-m", message, "--", *map(str, paths)], capture_output=True, text=True
            ).returncode
            == 0
        )
        if done:
            return
        time.sleep(2 + attempt)
    print(
        f"claims: could not git-commit {', '.join(map(str, paths))} (the files are written; commit them by hand)",
        file=sys.stderr,
    )
