"""``coupled-qk study {list,plan,run,report,verify} NAME``: the studies (:mod:`coupled_qk.studies`) through the one
study engine (:mod:`coupled_qk.study`).

``study run cpu-short`` trains what is missing (resumable, one record per run; several processes may share a
study), then writes ``docs/results/claims/cpu-short.{md,json}``, ``-readme.md`` and ``figures/``; ``study report``
rebuilds the report from the records; ``study plan`` prints the runs and their state, the data check and the cost;
``study verify NAME RECORD`` re-trains one record's run from scratch and compares. An option that does not apply to
a study is refused by what the study declares (a pre-registered study fixes its seeds, variants and cells; a study
planned from its records has no fixed cells to choose or shard; ``--defer-wt2`` needs WikiText-2 evaluations,
``--glue-json`` a claim that reads it). ``coupled-qk claims --protocol NAME`` is the older spelling of ``study run``.
Committing records as they finish is a script, not the library's: ``benchmarks/commit_records.sh``.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from coupled_qk.extras import require_extra

HELP = "plan, run, report or verify a study: its runs, one record each, and its claims with intervals and verdicts"
DEFAULT_GLUE_JSON = "docs/results/glue-cpu/results.json"  # committed by the GLUE study
DEFAULT_NOTES = "docs/results/STUDIES.md"  # what each report says beside its numbers: dates, machines, measurements
ACTIONS = {
    "list": "list the studies",
    "plan": "print the runs, their state, the data check and the cost estimate; train nothing",
    "run": "train what is missing (resumable), then write the report",
    "report": "rebuild the report from the records (train nothing)",
    "verify": "re-train the run of one record from scratch and compare its metrics with the record",
}


def add_arguments(parser) -> None:
    """Register ``ACTION NAME [RECORD]`` and the study options on ``parser`` (each applies to the actions of
    :data:`OPTION_ACTIONS`; :func:`run` refuses it elsewhere)."""
    from coupled_qk.checks.cli import folder_arg, nonneg_float_arg, path_arg, positive_int_arg
    from coupled_qk.commands.options import add_progress_option

    parser.add_argument("action", metavar="ACTION", help="; ".join(f"{k}: {v}" for k, v in ACTIONS.items()))
    parser.add_argument("name", nargs="?", default=None, metavar="NAME", help="the study (coupled-qk study list)")
    parser.add_argument(
        "record", nargs="?", default=None, type=path_arg, metavar="RECORD", help="verify: a record file of the study"
    )
    parser.add_argument(
        "--out-dir",
        default=None,
        type=path_arg,
        help="report folder; records go to OUT_DIR/runs/NAME (default: the study's, docs/results/claims)",
    )
    parser.add_argument("--run-root", default="runs/claims", type=folder_arg, help="run folders (default runs/claims)")
    parser.add_argument(
        "--data-dir", default=None, type=folder_arg, help="data folder (default: COUPLED_QK_DATA or ../shared/data)"
    )
    parser.add_argument(
        "--cache-dir", default=None, type=folder_arg, help="derived data (default: the token cache folder)"
    )
    parser.add_argument("--seeds", default=None, help="comma-separated seeds replacing every cell's seeds")
    parser.add_argument(
        "--variants",
        default=None,
        help="comma-separated variant specs trained in every cell next to its own, paired by seed, reported against "
        "the cell's standard runs (any registered variant, plugins included)",
    )
    parser.add_argument("--cells", default=None, help="comma-separated cells (default: all, in order)")
    parser.add_argument("--shard", default="0/1", help="I/N: train every N-th run starting at I")
    parser.add_argument("--max-runs", type=positive_int_arg, default=None, help="stop after this many new records")
    parser.add_argument("--defer-wt2", action="store_true", help="train every run first, then evaluate WikiText-2")
    parser.add_argument(
        "--glue-json",
        default=None,
        type=path_arg,
        help=f"GLUE results for C11 (default: {DEFAULT_GLUE_JSON} if it exists, except for smoke)",
    )
    parser.add_argument("--no-figures", action="store_true", help="skip the PNG figures")
    parser.add_argument(
        "--tolerance",
        default=1e-4,
        type=nonneg_float_arg,
        help="verify: accepted difference of the test loss (else validation loss), nats (default 1e-4)",
    )
    add_progress_option(parser)


OPTION_ACTIONS = {
    "--out-dir": ("plan", "run", "report"),
    "--run-root": ("plan", "run", "verify"),
    "--data-dir": ("plan", "run", "verify"),
    "--cache-dir": ("run", "verify"),
    "--seeds": ("plan", "run", "report"),
    "--variants": ("plan", "run", "report"),
    "--cells": ("plan", "run"),
    "--shard": ("run",),
    "--max-runs": ("run",),
    "--defer-wt2": ("run",),
    "--glue-json": ("run", "report"),
    "--no-figures": ("run", "report"),
    "--tolerance": ("verify",),
    "--no-progress": ("run", "verify"),
}
"""The actions each option applies to (any other refuses it: :func:`_ignored_options`)."""


def _ignored_options() -> dict:
    from coupled_qk.commands.ignored import Applies

    def applies(actions):
        return Applies(
            lambda a: a.action in actions,
            f"study {{{','.join(a for a in ACTIONS if a not in actions)}}}",
            f"study {'/'.join(actions)}",
        )

    return {option: (applies(actions),) for option, actions in OPTION_ACTIONS.items()}


# ---- what a study declares -------------------------------------------------------------------------------------


def check_options(study, args) -> None:
    """Refuse the options that do not apply to ``study``, by what it declares (see the module docstring).

    Raises:
        ValueError: naming the option and the study's declaration.
    """
    given = {flag: value for flag, value in _given(args).items() if value}
    for flag in ("--seeds", "--variants", "--cells"):
        if flag in given and study.frozen:
            raise ValueError(
                f"{flag} does not apply to {study.name!r}: its seeds, variants and stages are pre-registered"
            )
    for flag in ("--cells", "--shard"):
        if flag in given and not study.static:
            raise ValueError(f"{flag} does not apply to {study.name!r}: its cells are planned from its records")
    if "--defer-wt2" in given and not study.reads_wikitext2():
        raise ValueError(
            f"--defer-wt2 does not apply to {study.name!r}: its runs have no WikiText-2 evaluation to defer"
        )
    if "--glue-json" in given and not any("glue_json" in getattr(c.test, "inputs", ()) for c in study.claims):
        raise ValueError(f"--glue-json does not apply to {study.name!r}: none of its claims reads GLUE results")


def _given(args) -> dict:
    return {
        "--seeds": getattr(args, "seeds", None) is not None,
        "--variants": getattr(args, "variants", None) is not None,
        "--cells": getattr(args, "cells", None) is not None,
        "--shard": getattr(args, "shard", "0/1") != "0/1",
        "--defer-wt2": getattr(args, "defer_wt2", False),
        "--glue-json": getattr(args, "glue_json", None) is not None,
    }


def resolve(name: str, args):
    """The study called ``name`` with ``--seeds``/``--variants`` applied, after :func:`check_options`."""
    from coupled_qk.checks.cli import parse_seeds
    from coupled_qk.commands.options import parse_variants_option
    from coupled_qk.studies import get_study

    study = get_study(name)
    check_options(study, args)
    if getattr(args, "seeds", None) is not None:
        study = study.with_seeds(tuple(parse_seeds(args.seeds)))
    if getattr(args, "variants", None) is not None:
        study = study.with_variants(parse_variants_option(args.variants))
    return study


def parse_cells(option: str | None, study) -> list[str] | None:
    """The cells named by ``--cells`` (comma-separated, stripped), or ``None`` when not given.

    Raises:
        ValueError: an empty name or one that is not a cell of ``study``, naming ``--cells`` and the cells.
    """
    if option is None:
        return None
    cells = [c.strip() for c in option.split(",")]
    names = [c.name for c in study.cells]
    unknown = [c for c in cells if c not in names]
    if not all(cells) or unknown:
        raise ValueError(
            f"--cells={option!r}: {unknown or 'an empty name'} is not a cell of protocol {study.name!r}; expected "
            f"some of {names}"
        )
    return cells


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` -> ``(I, N)``.

    Raises:
        ValueError: not two integers with ``0 <= I < N``.
    """
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard={text!r}: expected I/N, e.g. 0/2") from None
    if not (n >= 1 and 0 <= i < n):
        raise ValueError(f"--shard={text!r}: expected 0 <= I < N")
    return i, n


# ---- the actions -----------------------------------------------------------------------------------------------


def show_plan(study, out_dir, run_root, data_dir, cells) -> int:
    """Print the study's plan (:func:`coupled_qk.study.plan.plan_lines`); trains and writes nothing."""
    from coupled_qk.data.paths import default_data_dir
    from coupled_qk.study.plan import plan_lines

    if data_dir is None:
        try:
            data_dir = default_data_dir()
        except FileNotFoundError:
            data_dir = None
    print("\n".join(plan_lines(study, out_dir, run_root, data_dir, cells)))
    return 0


def claim_report_dir(study, out_dir, overwrite: bool = False):
    """The report folder claimed before any training (:func:`coupled_qk.study.report.report_dir`)."""
    from coupled_qk.studies import studies
    from coupled_qk.study.report import report_dir

    return report_dir(out_dir, study.name, studies(), overwrite=overwrite)


def check_records_exist(study, out_dir) -> None:
    """A report rebuilt from the records of a runnable study needs a record folder: a mistyped ``--out-dir`` would
    otherwise write a report of no runs and succeed.

    Raises:
        ValueError: naming ``--out-dir`` and the folder looked for.
    """
    folder = Path(out_dir) / "runs" / study.name
    if study.runnable and not folder.is_dir():
        raise ValueError(
            f"--out-dir={str(out_dir)!r} holds no records of {study.name!r} (no folder {folder}): nothing to report; "
            "check --out-dir, or train the study first"
        )


def train(study, args, out_dir, cells, shard) -> None:
    """Train what the study lacks (:func:`coupled_qk.study.run.run_study`), the folders checked first."""
    from coupled_qk.checks.paths import input_dir, output_location
    from coupled_qk.data.paths import default_cache_dir, default_data_dir
    from coupled_qk.study.run import Places, run_study

    output_location("--run-root", args.run_root)
    if args.data_dir is not None and Path(args.data_dir).exists():  # missing is fine when every run is reused
        input_dir("--data-dir", args.data_dir)
    data_dir = args.data_dir if args.data_dir is not None else default_data_dir()
    cache = (
        output_location("--cache-dir", args.cache_dir)
        if args.cache_dir is not None
        else default_cache_dir() / "claims-data"
    )
    places = Places(Path(out_dir), Path(args.run_root), Path(data_dir), Path(cache))
    run_study(study, places, cells=cells, shard=shard, max_runs=args.max_runs, defer_wt2=args.defer_wt2)


def notes_file(out_dir: Path) -> Path | None:
    """The studies' notes (dates, machines, measured throughputs, pre-registration wording) a report adds:
    ``STUDIES.md`` beside the report folder (``docs/results/`` for the default ``docs/results/claims``), else
    :data:`DEFAULT_NOTES` under the current folder; ``None`` (said on stderr: the report then holds only the notes
    the study itself declares) when neither exists."""
    for candidate in (Path(out_dir).parent / "STUDIES.md", Path(DEFAULT_NOTES)):
        if candidate.is_file():
            return candidate
    print(
        f"note: no {DEFAULT_NOTES} found beside {out_dir} or under the current folder: the report holds only the "
        "notes the study itself declares (run from the repository root to add the studies' notes)",
        file=sys.stderr,
    )
    return None


def write(study, out, args, commands) -> int:
    """Build the study's report from its records and write it into the claimed folder ``out``; print its summary."""
    from coupled_qk.studies import get_study
    from coupled_qk.study.report import context, format_markdown, report_of, write_report

    use_default = study.name != "smoke" and Path(DEFAULT_GLUE_JSON).is_file()  # smoke: toy runs only
    glue_json = args.glue_json if args.glue_json is not None else (DEFAULT_GLUE_JSON if use_default else None)
    inputs = {"glue_json": glue_json}
    ctx = context(study, out.path, get_study, inputs, notes_file(out.path))
    report = report_of(ctx)
    paths = write_report(study, report, out, commands, figures=not args.no_figures, ctx=ctx)
    print(format_markdown(study, report, commands).split(study.layout.summary_end)[0])
    print("written: " + ", ".join(str(p) for p in paths))
    return 0


def verify(study, record, run_root, data_dir, cache_dir, tolerance) -> int:
    """Re-train one record's run from scratch and compare (exit 1 on a mismatch)."""
    from coupled_qk.data.paths import default_cache_dir, default_data_dir
    from coupled_qk.study.verify import format_comparison, read_record, verify_record

    stored, _ = read_record(record, "RECORD")
    if stored["protocol"] != study.name:
        raise ValueError(f"RECORD={record!r} is a record of protocol {stored['protocol']!r}, not of {study.name!r}")
    cache = cache_dir or (default_cache_dir() / "claims-data")
    data = data_dir or default_data_dir()
    result = verify_record(study, record, run_root, data, cache, tolerance=tolerance, name="RECORD")
    print(format_comparison(result))
    how = "trained now" if result["run_folder"] == "trained" else "reused from an earlier verification"
    print(f"re-run folder: {how} (delete RUN_ROOT/verify/{study.name} to train it again)")
    return 0 if result["match"] else 1


def _commands(study, args, out_dir_given) -> object:
    from coupled_qk.study.report import Commands

    extra = []
    for flag, value in (("--seeds", getattr(args, "seeds", None)), ("--variants", getattr(args, "variants", None))):
        if value is not None:
            extra += [flag, str(value)]
    if out_dir_given is not None:
        extra += ["--out-dir", str(out_dir_given)]
    if getattr(args, "glue_json", None) is not None:
        extra += ["--glue-json", str(args.glue_json)]
    run = shlex.join(["coupled-qk", "study", "run", study.name, *extra])
    report = shlex.join(["coupled-qk", "study", "report", study.name, *extra])
    return Commands(run, report, f"run `{report}`")


def run(args) -> int:
    """Do ``ACTION`` (:data:`ACTIONS`) for the study ``NAME``: ``list`` the studies, ``plan`` (print, train nothing),
    ``run`` (train what is missing, then write the report), ``report`` (rebuild it from the records) or ``verify``
    (re-train ``RECORD``'s run and compare).

    Returns:
        0; 1 when ``verify`` finds a mismatch; 0 at once on a ``torchrun`` rank other than 0 after training
        (rank 0 writes the report).

    Raises:
        ValueError: an unknown action or study, a missing or unexpected ``RECORD``, an option the action or the
            study does not take (naming it), bad ``--cells``/``--shard``/``--seeds``, a ``--glue-json`` that does
            not parse, a report folder refused (exit 2 from the CLI). MissingExtra: scipy not installed.
    """
    from coupled_qk.checks.values import choice
    from coupled_qk.commands.ignored import refuse_ignored_options
    from coupled_qk.studies import studies

    choice("ACTION", args.action, ACTIONS)
    refuse_ignored_options(args, add_arguments, _ignored_options())
    if args.action == "list":
        return _list()
    if args.name is None:
        raise ValueError(f"study {args.action} needs the study's NAME, one of {', '.join(studies())}")
    choice("NAME", args.name, studies())
    if (args.record is None) == (args.action == "verify"):
        raise ValueError(
            "study verify needs a RECORD (a record file of the study)"
            if args.record is None
            else f"RECORD={args.record!r}: only study verify takes a record"
        )
    require_extra(("scipy",), "claims", "coupled-qk study (intervals and verdicts)")
    study = resolve(args.name, args)
    if args.action == "verify":
        return verify(study, args.record, args.run_root, args.data_dir, args.cache_dir, args.tolerance)
    out_dir = args.out_dir if args.out_dir is not None else study.default_out_dir
    cells = parse_cells(args.cells, study) if study.static else None
    if args.action == "plan":
        return show_plan(study, out_dir, args.run_root, args.data_dir, cells)
    if args.glue_json is not None:  # an explicit results file must exist and parse (before any training)
        from coupled_qk.studies.glue_scores import load_glue_rows

        load_glue_rows("--glue-json", args.glue_json)
    out = claim_report_dir(study, out_dir)
    if args.action == "run":
        train(study, args, out_dir, cells, parse_shard(args.shard))
        if os.environ.get("RANK", "0") != "0":
            return 0  # under torchrun, rank 0 alone writes the report
    else:
        check_records_exist(study, out_dir)
    return write(study, out, args, _commands(study, args, args.out_dir))


def _list() -> int:
    from coupled_qk.studies import studies

    for study in studies().values():
        kind = "pre-registered" if study.frozen else "runnable" if study.runnable else "defined, not run here"
        if study.needs_gpu:
            kind += ", needs a GPU"
        print(f"{study.name:22s} {study.description} ({kind})")
    return 0
