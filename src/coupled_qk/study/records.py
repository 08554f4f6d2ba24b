"""Run records: where a study keeps one small JSON file per finished run, what such a file holds, and the one rule
that says whether a record is the run a plan asks for.

A record lives at ``<out_dir>/runs/<study>/<cell>/<variant tag>/seed<k>.json`` (:func:`record_path`) and holds the
run's result-changing settings (``config``) and their ``fingerprint``, its final metrics, a compact loss curve and
what the report reads. The rules, each in one place:

- schema: :func:`record_problem` (the fields every reader needs, each of its kind);
- damaged files: :func:`read_record_file` (``damaged="raise"`` for reports and plans, ``"skip"`` for the runner,
  which trains that run again and replaces the file);
- "is this the same run?": :func:`same_run_problem` (the settings that change results, a field the record predates
  counting as its default, and the precision it trained in against the one this machine would train it in), used
  by the reader, the runner and ``--plan`` alike; its settings rule
  (:func:`~coupled_qk.study.executor.result_settings`) is the one :func:`fingerprint` hashes, which ``--verify``
  recomputes from a record's stored ``config``;
- "may the report count it?": :func:`check_record` adds that the record sits at the path its fields name and holds
  every metric the study reads as a finite number.

Today's records (``RECORD_VERSION`` 1, also those written before a ``TrainConfig`` field existed) are read as they
are; nothing here rewrites a record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path

from coupled_qk.training.config import RESULT_NEUTRAL_FIELDS, TrainConfig

RECORD_VERSION = 1

RECORD_FIELDS = {
    "protocol": "a name",
    "cell": "a name",
    "variant": "a name",
    "seed": "an integer >= 0",
    "final": "a dict of metrics",
}
"""The fields every run record has, and what each must hold (:func:`record_problem`)."""


def variant_tag(spec: str) -> str:
    """Folder-safe name of a variant spec: ``coupled+n_steps=2`` -> ``coupled__n_steps-2``."""
    return spec.replace("+", "__").replace("=", "-")


def record_path(out_dir: str | Path, study: str, cell: str, variant: str, seed: int) -> Path:
    """Where the record of one run lives: ``<out_dir>/runs/<study>/<cell>/<variant tag>/seed<k>.json``."""
    return Path(out_dir) / "runs" / study / cell / variant_tag(variant) / f"seed{seed}.json"


def record_files(out_dir: str | Path, study: str) -> list[Path]:
    """Every ``seed*.json`` under ``<out_dir>/runs/<study>`` at the record depth, sorted."""
    root = Path(out_dir) / "runs" / study
    return sorted(root.glob("*/*/seed*.json")) if root.is_dir() else []


def settings_of(cfg: TrainConfig) -> dict:
    """The settings that change results (``TrainConfig`` minus ``RESULT_NEUTRAL_FIELDS``), as stored in records."""
    return {k: v for k, v in cfg.to_dict().items() if k not in RESULT_NEUTRAL_FIELDS}


def fingerprint(config: TrainConfig | dict) -> str:
    """sha256 (16 hex digits) of the settings that decide what a run computes
    (:func:`~coupled_qk.study.executor.result_settings`, the rule of the reuse decision too, as their JSON text:
    :func:`~coupled_qk.study.executor.settings_text`), so two configs have one fingerprint exactly when the reuse
    decision takes one's run for the other's. ``config``: a ``TrainConfig`` or a config dict (a record's stored
    ``config``, a ``results["config"]``). An MQAR run's fingerprint does not move with ``eval_batches``, which it
    never reads; a language-model run reads every data and evaluation field.

    The ``fingerprint`` string a record stores was computed by the rule of the code that wrote it; ``--verify``
    compares fingerprints recomputed from the stored ``config`` (:func:`coupled_qk.study.verify.compare`).
    """
    from coupled_qk.study.executor import result_settings, settings_text

    settings = result_settings(config.to_dict() if isinstance(config, TrainConfig) else config)
    return hashlib.sha256(settings_text(settings).encode()).hexdigest()[:16]


def record_problem(rec, fields=tuple(RECORD_FIELDS)) -> str | None:
    """What makes ``rec`` (a parsed JSON value) not a run record, in a few words, or ``None`` when it is one:
    a dict with every field of ``fields`` (default: all of :data:`RECORD_FIELDS`; a reader names the ones it
    uses), each of its kind (names non-empty strings, the seed an integer >= 0 and not a bool, ``final`` a dict)."""
    if not isinstance(rec, dict):
        return f"it holds a {type(rec).__name__}, expected a dict"
    missing = [k for k in fields if k not in rec]
    if missing:
        return f"it lacks {missing}"
    for key in fields:
        expected, value = RECORD_FIELDS[key], rec[key]
        ok = (
            isinstance(value, int) and not isinstance(value, bool) and value >= 0
            if key == "seed"
            else isinstance(value, dict)
            if key == "final"
            else isinstance(value, str) and value != ""
        )
        if not ok:
            return f"{key}={value!r}, expected {expected}"
    return None


def read_record_file(path: Path, fields=tuple(RECORD_FIELDS), damaged: str = "skip") -> dict | None:
    """The run record in the file ``path``. ``fields``: the ones the caller reads (:func:`record_problem`).

    A file that cannot be read or is not JSON (damaged) is ``None`` with ``damaged="skip"`` (the runner: the
    run is trained again and its record replaced) and an error with ``damaged="raise"`` (reports and plans: a
    report built without the record would silently count that run as never made).

    Raises:
        ValueError: naming the file, for one that parses but is not a run record (:func:`record_problem`), and
            with ``damaged="raise"`` for a damaged one.
    """
    try:
        rec = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        if damaged == "raise":
            raise ValueError(
                f"{path} is a damaged run record ({type(exc).__name__}: {exc}); a report without it "
                "would count that run as never made: restore the file (e.g. git checkout), or delete "
                "it and run the protocol without --report-only to train that run again"
            ) from None
        return None
    problem = record_problem(rec, fields)
    if problem:
        raise ValueError(
            f"{path} is not a run record ({problem}): restore or remove it; a study's records are the "
            "files <out_dir>/runs/<protocol>/<cell>/<variant>/seed<k>.json"
        )
    return rec


def same_run_problem(rec: dict, planned: TrainConfig, here: bool = True) -> str | None:
    """Why the record ``rec`` is not the run ``planned`` asks for, or ``None`` when it is: other result-changing
    settings (:func:`~coupled_qk.study.executor.setting_differences` of its stored ``config``: a field the record
    predates counts as its default), or a recorded precision other than the one
    ``planned`` trains in. The one rule of the reader, the runner, ``--plan`` and ``--verify``.

    ``--dtype auto`` leaves the precision to the device: with ``here`` (the runner, which trains on this machine)
    the record's precision is compared with the one this machine would train in, so a record of another
    precision is trained again; without (reports and plans, which must not depend on where they are made) it is
    compared only when the plan fixes the dtype."""
    from coupled_qk.study.executor import setting_differences
    from coupled_qk.training.config import describe_differences

    config = rec.get("config")
    if not isinstance(config, dict):
        return "it stores no settings (config)"
    diff = setting_differences(config, planned)
    if diff:
        return f"made with other settings ({describe_differences(diff)})"
    if rec.get("precision") is not None and (here or planned.dtype != "auto"):
        from coupled_qk.training.distributed import planned_precision

        here = planned_precision(planned.device, planned.dtype, planned.compile)
        if rec["precision"] != here:
            return f"trained in {rec['precision']}; this machine trains it in {here}"
    return None


def path_problem(path: Path, rec: dict, out_dir: str | Path, study: str) -> str | None:
    """Why the record ``rec`` read from ``path`` does not sit where its fields say (another study, cell, variant
    or seed than its folder names), or ``None``."""
    where = record_path(out_dir, rec["protocol"], rec["cell"], rec["variant"], rec["seed"])
    if rec["protocol"] != study or Path(path) != where:
        return (
            f"its fields name {rec['protocol']}/{rec['cell']}/{rec['variant']}/seed{rec['seed']} "
            f"(a record of that run lives at {where})"
        )
    return None


def metric_value(rec: dict, metric: str):
    """The value of ``metric`` in a record: ``final[metric]``, or ``diagnostics[name]`` for
    ``diagnostics/<name>``; ``None`` when absent."""
    if metric.startswith("diagnostics/"):
        return (rec.get("diagnostics") or {}).get(metric.removeprefix("diagnostics/"))
    return rec["final"].get(metric)


def is_number(value) -> bool:
    """Whether ``value`` is a finite real number (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def metric_problem(rec: dict, metrics) -> str | None:
    """The first metric of ``metrics`` that ``rec`` lacks or holds as something other than a finite number
    (``"test/perplexity=nan"``), or ``None``."""
    for metric in metrics:
        value = metric_value(rec, metric)
        if not is_number(value):
            return f"{metric}={value!r}, expected a finite number"
    return None


@dataclasses.dataclass
class LeftOut:
    """A record file the reader did not count, and why (named by plans and reports)."""

    path: Path
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"
