"""``coupled-qk claims --protocol NAME``: the older spelling of ``coupled-qk study run NAME`` (and, with ``--plan``,
``--report-only`` or ``--verify RECORD``, of ``study plan``, ``study report`` and ``study verify``), kept with its
options and messages; both go through the same functions of :mod:`coupled_qk.commands.study`.

Example: ``coupled-qk claims --protocol cpu-short`` trains what is missing, then writes
``docs/results/claims/cpu-short.{md,json}`` and ``figures/cpu-short-*.png``; ``--report-only`` skips training.
"""

from __future__ import annotations

import os
import shlex

from coupled_qk.extras import require_extra

HELP = "run a claims protocol (C1-C13 with seeds and confidence intervals) and regenerate its report"
COMMIT_SCRIPT = "benchmarks/commit_records.sh"


def add_arguments(parser) -> None:
    """Register the ``claims`` options on ``parser``: the protocol and which of its runs, the folders, the report's
    inputs and ``--verify`` (in that order, as ``--help`` lists them)."""
    from coupled_qk.commands.options import add_overwrite_option, add_progress_option

    _add_protocol_options(parser)
    _add_folder_options(parser)
    _add_report_and_verify_options(parser)
    add_overwrite_option(parser)
    add_progress_option(parser)  # the held-out evaluations' bars and the tokenizers' training


def _add_protocol_options(parser) -> None:
    """The protocol, what to do with it (plan, how many runs) and its seeds and variants."""
    from coupled_qk.checks.cli import positive_int_arg
    from coupled_qk.studies import studies

    parser.add_argument(
        "--protocol",
        required=True,
        choices=sorted(studies()),
        help="the study (coupled-qk study list describes each): " + ", ".join(f"{name}" for name in studies()),
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
        help="stop after training this many new runs",
    )
    parser.add_argument(
        "--commit-records",
        action="store_true",
        help=f"removed: the library runs no git; commit records as they finish with {COMMIT_SCRIPT}",
    )
    parser.add_argument("--seeds", default=None, help="comma-separated seeds replacing every cell's seeds")
    parser.add_argument(
        "--variants",
        default=None,
        help="comma-separated variant specs trained in every cell next to its own variants (paired by "
        "seed) and reported against the cell's standard runs, e.g. --variants coupled+n_steps=3; any "
        "registered variant, plugins included",
    )


def _add_folder_options(parser) -> None:
    """Where the report, run folders, data and derived data are, and which runs this process trains."""
    from coupled_qk.checks.cli import folder_arg, path_arg

    parser.add_argument(
        "--out-dir",
        default=None,
        type=path_arg,
        help="report folder; run records go to OUT_DIR/runs/PROTOCOL (default docs/results/claims; "
        "runs/claims-smoke for the smoke protocol, runs/claims-toy for the toy ones)",
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


def _add_report_and_verify_options(parser) -> None:
    """The report's inputs (GLUE results, figures) and ``--verify`` of one record."""
    from coupled_qk.checks.cli import nonneg_float_arg, path_arg
    from coupled_qk.commands.study import DEFAULT_GLUE_JSON

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


def _ignored_options() -> dict:
    """``--tolerance`` is read by ``--verify`` alone; ``--verify`` re-trains one record's run and writes no report, so
    the report's options are not read with it; a converged protocol regenerates its report from its records on
    every run, so ``--overwrite`` is not read there (the other flags these modes ignore have their own checks below,
    older than this table)."""
    from coupled_qk.commands.ignored import Applies
    from coupled_qk.studies import studies

    frozen = sorted(name for name, s in studies().items() if s.frozen)

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
        lambda a: a.protocol not in frozen,
        f"a converged --protocol (its report is regenerated from its records on every run; {', '.join(frozen)})",
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


def run(args) -> int:
    """``claims --protocol NAME``: train the study's missing runs (not with ``--report-only``), then write its report
    (:func:`coupled_qk.commands.study.write`); ``--plan`` prints the runs and trains nothing, ``--verify RECORD``
    re-trains one record's run and compares.

    Returns:
        0; 1 when ``--verify`` finds a mismatch; 0 at once on a ``torchrun`` rank other than 0 after training
        (rank 0 writes the report).

    Raises:
        MissingExtra: scipy not installed. ValueError: an option this mode or a pre-registered study refuses
            (naming it), ``--commit-records`` (removed), bad ``--cells``/``--shard``, a ``--glue-json`` that does not
            parse, a report folder refused, ``--report-only`` without records (all exit 2 from the CLI).
    """
    require_extra(("scipy",), "claims", "coupled-qk claims (intervals and verdicts)")
    from coupled_qk.commands.ignored import refuse_ignored_options
    from coupled_qk.commands.study import (
        check_records_exist,
        claim_report_dir,
        parse_cells,
        parse_shard,
        resolve,
        show_plan,
        train,
        write,
    )
    from coupled_qk.studies import get_study

    refuse_ignored_options(args, add_arguments, _ignored_options())
    if args.verify is not None:
        return _verify(args)
    _refuse_training_flags_without_training(args)
    if args.commit_records:
        raise ValueError(
            f"--commit-records was removed: the library runs no git; commit each record as it is written with "
            f"{COMMIT_SCRIPT} (it watches the records folder)"
        )
    study = get_study(args.protocol)
    if study.frozen:
        _refuse_for_preregistered(study, args)
    study = resolve(args.protocol, args)
    shard = parse_shard(args.shard) if study.static else (0, 1)
    cells = parse_cells(args.cells, study) if study.static else None  # checked also when nothing is trained
    if args.report_only and (cells is not None or shard != (0, 1)):
        raise ValueError("--cells and --shard choose the runs to train; --report-only trains nothing (drop them)")
    out_dir = args.out_dir if args.out_dir is not None else study.default_out_dir
    if args.plan:  # the runs and their state; trains and writes nothing
        return show_plan(study, out_dir, args.run_root, args.data_dir, cells)
    if args.glue_json is not None:  # an explicit results file must exist and parse (before any training)
        from coupled_qk.studies.glue_scores import load_glue_rows

        load_glue_rows("--glue-json", args.glue_json)
    # checked before any training; a pre-registered study's report is regenerated from its records on every run
    out = claim_report_dir(study, out_dir, overwrite=False if study.frozen else args.overwrite)
    if not args.report_only and study.runnable:
        train(study, args, out_dir, cells, shard)
        if os.environ.get("RANK", "0") != "0":
            return 0  # under torchrun, rank 0 alone writes the report
    elif args.report_only:
        check_records_exist(study, out_dir)
    return write(study, out, args, _commands(args))


def _commands(args):
    """The command that regenerates the report from scratch: without --cells/--shard/--report-only/--run-root,
    which choose what this invocation trains, not what the report contains."""
    from coupled_qk.study.report import Commands

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
    return Commands(command, command + " --report-only", "add `--report-only`")


def _refuse_for_preregistered(study, args) -> None:
    """The options a pre-registered study refuses, with the reasons this command always gave.

    Raises:
        ValueError: naming the option and the study.
    """
    for flag, value in (
        ("--seeds", args.seeds),
        ("--cells", args.cells),
        ("--glue-json", args.glue_json),
        ("--variants", args.variants),
    ):
        if value is not None:
            raise ValueError(
                f"{flag} does not apply to the converged protocol {study.name!r} (its seeds and "
                "stages are pre-registered)"
            )
    for flag, given, why in (
        (
            "--shard",
            args.shard != "0/1",
            "several processes share its runs without it: start one `coupled-qk claims` per core or GPU",
        ),
        ("--defer-wt2", args.defer_wt2, "its runs evaluate on their own split, with no WikiText-2 evaluation to defer"),
    ):
        if given:
            raise ValueError(f"{flag} does not apply to the converged protocol {study.name!r} ({why})")


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


def _verify(args) -> int:
    """``claims --protocol P --verify RECORD``: re-train one record's run and compare (exit 1 on a mismatch)."""
    from coupled_qk.commands.study import verify
    from coupled_qk.studies import get_study
    from coupled_qk.study.verify import read_record

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
    return verify(get_study(args.protocol), args.verify, args.run_root, args.data_dir, args.cache_dir, args.tolerance)
