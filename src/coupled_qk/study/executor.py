"""The one executor of training runs: a plan is a list of planned training runs plus an analysis step.

:func:`execute` takes the plan (:class:`PlannedRun` objects, each a complete :class:`TrainConfig` whose
``out_dir`` is the run's folder) and, run by run: reuses a finished run (``results.json`` present) after
checking that it was made with the same settings (``training.config.RESULT_NEUTRAL_FIELDS`` aside; others
raise ``ValueError`` naming them), resumes an unfinished one from its checkpoint, starts the others (clearing
what a run killed before its first checkpoint left), and records each outcome as a :class:`RunRecord`. A run
that a stopping point ended before its budget (``max_minutes``, ``stop_after_steps``:
``training.config.STOPPING_POINTS``) is unfinished: it is continued unless the plan would stop it at the same
point again (the same time limit, already spent), then reused as it is, and its results say how it stopped. An
optional wall-clock guard (``max_minutes``) gives each run the time left; a run it stops is marked
``interrupted`` (resumed by the next invocation) and runs not started in time ``skipped``.

The protocol's analysis turns the records into a :class:`Report` (JSON files, markdown, PNG figures) that
:func:`write_report` writes; :func:`run_experiment` does plan -> execute -> analyse -> write in one call.
:func:`planned_state` and :func:`plan_lines` say what :func:`execute` would do with each run without doing it
(the ``--dry-run`` of ``compare``, ``mqar`` and ``glue``, and the studies' plans): the same checks, nothing
trained, written or created. Used by the studies (:mod:`coupled_qk.study.run`), ``compare``/``demo``, the MQAR
sweep and the GLUE study. See ``docs/DESIGN.md``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from coupled_qk.models.config import rename_fields
from coupled_qk.output_dir import OutputDir, as_output_dir
from coupled_qk.training.config import (
    RESULT_NEUTRAL_FIELDS,
    RESULT_NEUTRAL_TASK_OPTIONS,
    STOPPING_POINTS,
    TrainConfig,
    describe_differences,
    saved_value,
)
from coupled_qk.training.lock import RunLockedError
from coupled_qk.training.run_folder import RunFolder, checkpoint_step
from coupled_qk.training.tasks import unread_fields

__all__ = [
    "RESULT_NEUTRAL_FIELDS",
    "RESULT_NEUTRAL_TASK_OPTIONS",
    "STOPPING_POINTS",
    "agreed_holder",
    "PlannedRun",
    "Report",
    "RunRecord",
    "check_reusable",
    "check_same_precision",
    "check_plan",
    "plan_lines",
    "planned_state",
    "recorded_precision",
    "result_settings",
    "execute",
    "run_experiment",
    "setting_differences",
    "settings_text",
    "stopped_early",
    "write_report",
]


STATUSES = ("ran", "reused", "interrupted", "skipped")


def stopped_early(results: dict) -> bool:
    """Whether a run's results (``results.json``) come from a run that a stopping point
    (:data:`~coupled_qk.training.config.STOPPING_POINTS`) ended before its budget: unfinished, resumable."""
    return (results or {}).get("stop_reason") in STOPPING_POINTS


@dataclass(frozen=True)
class PlannedRun:
    """One training run of a protocol.

    Attributes:
        config: the complete :class:`TrainConfig`; ``config.out_dir`` is the run folder (unique in a plan).
        label: a short name for log lines, e.g. ``"coupled seed 1"``.
        keys: the protocol's coordinates of the run (e.g. ``{"variant": "coupled", "seed": 1}``), JSON values;
            carried into the :class:`RunRecord` for the analysis step.
    """

    config: TrainConfig
    label: str
    keys: dict = field(default_factory=dict)

    @property
    def run_dir(self) -> RunFolder:
        """The run's folder."""
        return RunFolder(self.config.out_dir)


@dataclass
class RunRecord:
    """The outcome of one :class:`PlannedRun`.

    Attributes:
        run: the planned run.
        status: ``ran`` (trained in this invocation, possibly resuming, to its end or to a stopping point of its
            config: see :func:`stopped_early`), ``reused`` (finished earlier, or stopped early at the point
            where this plan would stop it again), ``interrupted`` (stopped by the runner's time guard; resumable) or
            ``skipped``
            (not started: no time left).
        results: the run's results (``train()``'s return value, as in ``results.json``); ``{}`` when skipped.
        config: the configuration actually trained (the plan's, with ``resume`` and the time guard applied).
        seconds: wall seconds of this invocation's training (``None`` when reused, ``0.0`` when skipped).
    """

    run: PlannedRun
    status: str
    results: dict
    config: TrainConfig
    seconds: float | None = None

    @property
    def keys(self) -> dict:
        """The planned run's coordinates."""
        return self.run.keys

    @property
    def final(self) -> dict:
        """Final metrics (``results["final"]``; ``{}`` when skipped)."""
        return self.results.get("final", {})

    @property
    def finished(self) -> bool:
        """Whether the run has final results that count (``ran`` or ``reused``)."""
        return self.status in ("ran", "reused")


@dataclass
class Report:
    """What a protocol's analysis step produces; :func:`write_report` writes it into the experiment folder.

    Attributes:
        json: file name -> JSON object (written indented).
        text: file name -> text (markdown tables).
        plots: file name -> function drawing the figure at the given path (PNG via matplotlib).
    """

    json: dict[str, dict] = field(default_factory=dict)
    text: dict[str, str] = field(default_factory=dict)
    plots: dict[str, Callable[[Path], object]] = field(default_factory=dict)


def result_settings(config: dict) -> dict:
    """The settings of a run config that decide what the run computes: the one "same run?" rule of the reuse
    decision (:func:`setting_differences`) and of a record's fingerprint
    (:func:`coupled_qk.study.records.fingerprint`), so the two cannot disagree.

    Args:
        config: a run config as a dict: a finished run's ``results["config"]``, a record's stored ``config``
            (:func:`coupled_qk.study.records.settings_of`) or a planned ``TrainConfig.to_dict()``.

    Returns:
        ``{field: value}`` over the :class:`TrainConfig` fields, a field the config predates (absent from it) holding
        its default (:func:`~coupled_qk.training.config.saved_value`), less :data:`RESULT_NEUTRAL_FIELDS` and the
        data and evaluation fields the config's task does not read (:func:`~coupled_qk.training.tasks.unread_fields`:
        an MQAR run saved with ``eval_batches=20`` is the run planned with the field's current default; a task no
        longer registered reads them all); the :data:`STOPPING_POINTS` (where an invocation stops, not what the run
        computes) hold their default, ``task_options`` lack :data:`RESULT_NEUTRAL_TASK_OPTIONS`, and model
        overrides saved under an old field name (:data:`coupled_qk.models.config.RENAMED_FIELDS`) are read under
        the new one. Fields the config holds that ``TrainConfig`` no longer has are left out.
    """
    from coupled_qk.training.tasks import TASKS

    if isinstance(config.get("model"), dict):
        config = {**config, "model": rename_fields(config["model"], "saved TrainConfig.model")}
    task = saved_value(config, "task")
    unread = unread_fields(task) if task in TASKS else frozenset()
    settings = {}
    for name in (f.name for f in dataclasses.fields(TrainConfig)):
        if name in RESULT_NEUTRAL_FIELDS or name in unread:
            continue
        value = saved_value({} if name in STOPPING_POINTS else config, name)
        if name == "task_options":
            value = {k: v for k, v in (value or {}).items() if k not in RESULT_NEUTRAL_TASK_OPTIONS}
        settings[name] = value
    return settings


def settings_text(value) -> str:
    """A setting as the JSON text a record stores it in (keys sorted; what :func:`setting_differences` compares
    and the fingerprint hashes): a tuple equals the list a record reads back, ``1`` differs from ``1.0``."""
    return json.dumps(value, sort_keys=True, default=str)


def setting_differences(saved: dict, planned: TrainConfig) -> dict:
    """``{field: (saved value, planned value)}`` over the fields whose :func:`result_settings` differ (compared as
    their JSON text, :func:`settings_text`; a field only one side's task reads shows ``None`` on the other side).

    Args:
        saved: a finished run's ``results["config"]`` (a ``TrainConfig.to_dict()``), or a record's ``config``.
        planned: the configuration the protocol wants.
    """
    a, b = result_settings(saved), result_settings(planned.to_dict())
    return {
        k: (a.get(k), b.get(k))
        for k in sorted(a.keys() | b.keys())
        if settings_text(a.get(k)) != settings_text(b.get(k))
    }


def check_reusable(saved: dict, planned: TrainConfig, where: str | Path) -> None:
    """Raise ``ValueError`` if the finished run in ``where`` was made with settings other than ``planned``'s
    (see :func:`setting_differences`), naming each differing field with both values."""
    diff = setting_differences(saved, planned)
    if diff:
        raise ValueError(
            f"{where} holds a finished run with different settings ({describe_differences(diff)}); "
            "choose another --out-dir or delete that folder"
        )


def recorded_precision(results: dict) -> str | None:
    """The autocast precision a finished run trained in: ``results["precision"]`` (``"fp32"``, ``"bf16"``,
    ``"fp16"``), or for results written before it was recorded the config's explicit ``dtype``; ``None`` when
    unknown (an older run with ``dtype="auto"``)."""
    saved = (results or {}).get("precision")
    dtype = ((results or {}).get("config") or {}).get("dtype", "auto")
    return saved if saved is not None else (dtype if dtype != "auto" else None)


def check_same_precision(results: dict, planned: TrainConfig, where: str | Path) -> None:
    """Refuse reusing the finished run in ``where`` (its ``results``) when it trained in another autocast
    precision than ``planned`` would on this machine (``dtype``, ``device`` and ``compile`` are result-neutral
    as settings, but ``--dtype auto`` resolves by device and, on a CPU with native bf16, by ``--compile``): a
    study would mix fp32 and bf16 cells without a word. Refused rather than retrained: the folder's checkpoints
    and results are the user's, and the run's own ``--compile``/``--device`` reuse them. A run whose precision is
    unknown
    (:func:`recorded_precision`) is not compared.

    Raises:
        ValueError: naming the folder and both precisions.
    """
    from coupled_qk.training.distributed import planned_precision

    saved = recorded_precision(results)
    now = planned_precision(planned.device, planned.dtype, planned.compile) if saved is not None else None
    if saved is not None and saved != now:
        then = results.get("config") or {}
        raise ValueError(
            f"{where} holds a finished run trained in {saved} (its results.json), but this plan trains in {now} "
            f"(dtype {planned.dtype!r}, compile={planned.compile}, device {planned.device!r}; the run had compile="
            f"{then.get('compile')}, device {results.get('device', then.get('device'))!r}): the results would mix "
            f"precisions; rerun with the run's --compile/--device, or choose another --out-dir"
        )


def check_plan(plan: Sequence[PlannedRun]) -> None:
    """The checks of a whole plan, made before its first run trains (by :func:`execute`) and by every dry run and
    study plan (:func:`plan_lines`), so that what the real command would refuse is refused there too: every run in
    its own folder, and no model override of a field its task takes from the data (``coupled+vocab_size=10`` on a
    language model: the tokenizer sets ``vocab_size``; once refused only after the runs before it had trained).

    Raises:
        ValueError: naming the folders used twice, or the run, the field and where its value comes from.
    """
    from coupled_qk.training.tasks import task_class

    folders = [str(Path(r.config.out_dir)) for r in plan]
    if len(set(folders)) != len(folders):
        raise ValueError(f"the plan uses a run folder twice: {sorted({f for f in folders if folders.count(f) > 1})}")
    for run in plan:
        decided = getattr(task_class(run.config.task), "data_model_fields", ())
        for name in (n for n in decided if n in run.config.model):
            raise ValueError(
                f"{run.label}: the model override {name}={run.config.model[name]!r} cannot apply: "
                f"task={run.config.task!r} sets {name} from its data (the tokenizer, or the MQAR sequences); remove "
                f"{name} from the variant or --set"
            )


def execute(
    plan: Sequence[PlannedRun],
    train_fn: Callable[[TrainConfig], dict] | None = None,
    log: Callable[[str], None] = print,
    max_minutes: float | None = None,
    announce: bool = True,
    describe: Callable[[RunRecord], str] | None = None,
) -> list[RunRecord]:
    """Run, resume or reuse every planned run, in order (see the module docstring).

    Args:
        plan: the runs; their ``out_dir`` must be distinct.
        train_fn: the training function (default :func:`coupled_qk.training.loop.train`; tests may wrap it).
        log: receives the progress lines.
        max_minutes: wall-clock guard for the whole plan (``None``: none). Each started run gets the time left
            (plus what it already trained before a resume) as its ``max_minutes``.
        announce: log ``"== <label> -> <folder>"`` before training, ``"== <label>: reusing the finished run
            in <folder>"`` on reuse, a line for a run stopped early that is continued or reused as it is, and a
            line for a skipped run.
        describe: if given, a line logged after each run (any status).

    Returns:
        One :class:`RunRecord` per planned run, in plan order.

    Raises:
        ValueError: the plan's own checks (:func:`check_plan`, before anything runs), ``max_minutes`` <= 0, a
            finished run with other settings or in another precision (before anything after it runs), or any error
            of the training function.
    """
    if max_minutes is not None and not max_minutes > 0:
        raise ValueError(f"max_minutes={max_minutes!r} must be > 0")
    check_plan(plan)
    if train_fn is None:
        from coupled_qk.training.loop import train as train_fn
    deadline = None if max_minutes is None else time.perf_counter() + 60 * max_minutes
    records = []
    for run in plan:
        rundir = run.run_dir
        cfg = run.config
        record = _reused(run, rundir, log if announce else None)
        if record is None:
            remaining = None if deadline is None else (deadline - time.perf_counter()) / 60
            if remaining is not None and remaining * 60 < 1.0:  # less than a second left
                record = RunRecord(run, "skipped", {}, cfg, 0.0)
                if announce:
                    log(f"== {run.label}: skipped (--max-minutes {max_minutes} reached)")
            else:
                record = _train_one(run, cfg, rundir, remaining, train_fn, log if announce else None)
        records.append(record)
        if describe is not None:
            log(describe(record))
    return records


def _reused(run: PlannedRun, rundir: RunFolder, log) -> RunRecord | None:
    """The record of the run in ``rundir`` to reuse, or ``None`` when it is to be trained: no results yet, or
    stopped early at a point that ``run`` goes past (:func:`continues_stopped_run`; its ``results.json`` is then
    renamed, so the run counts as unfinished until it stops again).

    Raises:
        ValueError: results made with other settings (:func:`check_reusable`) or in another precision
            (:func:`check_same_precision`).
        RunLockedError: (a ``ValueError``) another process is writing the run (its results, if any, are not
            final, and training it here would be refused anyway).
    """
    holder = agreed_holder(rundir)
    if holder is not None:
        raise RunLockedError(
            f"{rundir.path} is being written by {holder}: wait for it to finish (then this plan reuses or "
            "resumes it), or choose another --out-dir"
        )
    if not rundir.is_finished():
        return None
    results = rundir.read_results()
    check_reusable(results.get("config", {}), run.config, rundir.path)
    check_same_precision(results, run.config, rundir.path)
    if continues_stopped_run(results, run.config, rundir):
        if log is not None:
            log(
                f"== {run.label}: continuing the run in {rundir.path}, stopped at step {results.get('steps')} by "
                f"{results['stop_reason']}"
            )
        rundir.mark_interrupted()
        return None
    if log is not None:
        how = f"run stopped early ({results['stop_reason']})" if stopped_early(results) else "finished run"
        log(f"== {run.label}: reusing the {how} in {rundir.path}")
    return RunRecord(run, "reused", results, run.config, None)


def agreed_holder(rundir: RunFolder) -> str | None:
    """Another process writing ``rundir`` (:meth:`RunFolder.holder`), as rank 0 sees it, on every rank of a
    ``torchrun`` group (a collective there: every rank calls it), so the ranks agree to train a run or leave it: a
    rank asking after rank 0 took the run's lock would otherwise see rank 0 as "another process", leave the run and
    desert rank 0's collectives. One process: :meth:`RunFolder.holder`."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return rundir.holder()
    box = [rundir.holder() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def continues_stopped_run(results: dict, cfg: TrainConfig, rundir: RunFolder) -> bool:
    """Whether a run with ``results`` that stopped early goes on under ``cfg``: it has a checkpoint, and either
    ``stop_after_steps`` stopped it (a count per invocation: each one continues by as many steps) or
    ``max_minutes`` did and ``cfg`` allows more time than it trained."""
    if not stopped_early(results) or not rundir.has_checkpoint():
        return False
    if results["stop_reason"] == "stop_after_steps":
        return True
    return cfg.max_minutes is None or float(results.get("train_seconds") or 0.0) < 60 * cfg.max_minutes


def resume_note(rundir: RunFolder) -> str:
    """``"resuming from its checkpoint at step N"`` for a run folder holding a checkpoint (the step when known)."""
    newest = rundir.newest_checkpoint()
    step = checkpoint_step(newest) if newest is not None else None
    return "resuming from its checkpoint" + (f" at step {step}" if step is not None else "")


def _train_one(run: PlannedRun, cfg: TrainConfig, rundir: RunFolder, remaining: float | None, train_fn, log):
    changes: dict = {"resume": rundir.has_checkpoint()}
    if remaining is not None:  # the loop counts training time over all sessions of a resumed run
        changes["max_minutes"] = remaining + rundir.train_seconds() / 60
    cfg = dataclasses.replace(cfg, **changes)
    if rundir.path.is_dir() and not changes["resume"] and os.environ.get("RANK", "0") == "0":
        rundir.remove_partial()  # a run killed before its first checkpoint: start it again cleanly (rank 0 only:
        # under torchrun the ranks meet in the training loop's first collective, after this)
    if log is not None:  # a resumed run says so (a run stopped by a signal is continued, not started again)
        log(f"== {run.label} -> {rundir.path}" + (f" ({resume_note(rundir)})" if changes["resume"] else ""))
    start = time.perf_counter()
    results = train_fn(cfg)
    seconds = time.perf_counter() - start
    status = "ran"
    if remaining is not None and results.get("stop_reason") == "max_minutes":
        status = "interrupted"
        rundir.mark_interrupted()
    return RunRecord(run, status, results, cfg, seconds)


def write_report(
    out_dir: str | Path | OutputDir, report: Report, log: Callable[[str], None] | None = None
) -> list[Path]:
    """Write a :class:`Report` into ``out_dir`` (created): JSON and text atomically, then the figures (each drawn
    into a temporary file and renamed, so a failed drawing leaves the previous figure).

    ``out_dir`` may be an :class:`~coupled_qk.output_dir.OutputDir` claimed by a command before its work (then a
    file that exists and was not written in this run is refused unless ``--overwrite`` or the claim's rewrite
    patterns allow it); a plain path is the library's documented resume path: the report's own files are
    regenerated in place.

    A figure whose drawing needs a missing package (``ImportError``) is skipped with a logged line, so the
    numbers are never lost to a plotting problem.

    Returns:
        The paths written, in the order JSON, text, figures.

    Raises:
        OutputRefused: (a ``ValueError``) a report file exists that this run may not replace.
    """
    names = [*report.json, *report.text, *report.plots]
    out = as_output_dir(out_dir, "out_dir", layout=("*", "*/"), rewrite=names, what="the report")
    for name in names:  # all refusals before the first write
        out.claim(name, check_only=True)
    written = []
    for name, obj in report.json.items():
        written.append(out.write_json(name, obj))
    for name, text in report.text.items():
        written.append(out.write_text(name, text))
    for name, draw in report.plots.items():
        try:
            written.append(out.write_with(name, draw))
        except ImportError as exc:  # matplotlib is a dependency, but keep the results if it is missing
            if log is not None:
                log(f"plot {name} skipped: {exc}")
            continue
    return written


def run_experiment(
    plan: Sequence[PlannedRun],
    analyze: Callable[[list[RunRecord], float], Report],
    out_dir: str | Path,
    **execute_options,
) -> tuple[list[RunRecord], Report]:
    """Plan -> :func:`execute` -> ``analyze(records, wall_seconds)`` -> :func:`write_report` into ``out_dir``.

    ``execute_options`` are passed to :func:`execute` (``train_fn``, ``log``, ``max_minutes``, ``announce``,
    ``describe``). Returns the records and the written report.
    """
    start = time.perf_counter()
    records = execute(plan, **execute_options)
    report = analyze(records, time.perf_counter() - start)
    write_report(out_dir, report, execute_options.get("log", print))
    return records, report


def planned_state(run: PlannedRun) -> str:
    """What :func:`execute` would do with ``run``, read from its folder only (nothing is created or changed):
    ``"refused: being written by pid N on HOST ..."`` while another process trains it (execute() raises
    :class:`~coupled_qk.training.lock.RunLockedError`; the probe takes no lock and creates nothing), ``"new"``,
    ``"resume (resuming from its checkpoint at step N)"``, ``"continue (stopped at step N by R)"``, ``"reuse
    (finished)"``, ``"reuse (stopped early by R)"`` or ``"refused: <why>"`` (the error the run would raise: other
    settings, another precision, unreadable results)."""
    rundir = run.run_dir
    holder = rundir.holder()
    if holder is not None:  # execute() refuses it: another process is writing it
        return f"refused: being written by {holder}"
    if not rundir.is_finished():
        return f"resume ({resume_note(rundir)})" if rundir.has_checkpoint() else "new"
    try:
        results = rundir.read_results()
        diff = setting_differences(results.get("config", {}), run.config)
        check_same_precision(results, run.config, rundir.path)  # the check execute() makes next
    except ValueError as exc:
        return f"refused: {exc}"
    if diff:
        return f"refused: different settings ({describe_differences(diff)})"
    if continues_stopped_run(results, run.config, rundir):
        return f"continue (stopped at step {results.get('steps')} by {results['stop_reason']})"
    return f"reuse (stopped early by {results['stop_reason']})" if stopped_early(results) else "reuse (finished)"


def plan_lines(plan: Sequence[PlannedRun], coordinates: Callable[[PlannedRun], str] | None = None) -> list[str]:
    """One line per planned run, ``"  <coordinates> -> <folder>: <planned_state>"`` (``coordinates`` default: the
    run's label), after the plan's own checks (:func:`check_plan`: ``ValueError`` as the real command), then a count
    line ``"  N runs: a new, b reuse, ..."`` (by the first word of the state)."""
    check_plan(plan)
    coordinates = coordinates or (lambda run: run.label)
    lines, counts = [], {}
    for run in plan:
        state = planned_state(run)
        kind = state.split(" ", 1)[0].rstrip(":")
        counts[kind] = counts.get(kind, 0) + 1
        lines.append(f"  {coordinates(run)} -> {run.run_dir.path}: {state}")
    lines.append(f"  {len(plan)} runs: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    return lines
