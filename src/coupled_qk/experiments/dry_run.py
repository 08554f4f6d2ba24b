"""What :func:`coupled_qk.experiments.runner.execute` would do with each planned run, without doing it.

The ``--dry-run`` of ``compare``, ``mqar`` and ``glue`` prints one line per planned run: the run's coordinates,
its folder and :func:`planned_state` (train, resume, continue, reuse, or refused for other settings). Nothing is
trained, written, renamed or created.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from coupled_qk.experiments.runner import (
    PlannedRun,
    continues_stopped_run,
    resume_note,
    setting_differences,
    stopped_early,
)
from coupled_qk.training.config import describe_differences

__all__ = ["plan_lines", "planned_state"]


def planned_state(run: PlannedRun) -> str:
    """What :func:`~coupled_qk.experiments.runner.execute` would do with ``run``, read from its folder only:
    ``"new"``, ``"resume (resuming from its checkpoint at step N)"``, ``"continue (stopped at step N by R)"``,
    ``"reuse (finished)"``, ``"reuse (stopped early by R)"`` or ``"refused: different settings (...)"`` (the error
    the run would raise). A folder whose ``results.json`` cannot be read gives ``"refused: <why>"``."""
    rundir = run.run_dir
    holder = rundir.holder()
    if holder is not None:  # the runner refuses it (another process is writing it)
        return f"refused: being written by {holder}"
    if not rundir.is_finished():
        return f"resume ({resume_note(rundir)})" if rundir.has_checkpoint() else "new"
    try:
        results = rundir.read_results()
        diff = setting_differences(results.get("config", {}), run.config)
    except ValueError as exc:
        return f"refused: {exc}"
    if diff:
        return f"refused: different settings ({describe_differences(diff)})"
    if continues_stopped_run(results, run.config, rundir):
        return f"continue (stopped at step {results.get('steps')} by {results['stop_reason']})"
    return f"reuse (stopped early by {results['stop_reason']})" if stopped_early(results) else "reuse (finished)"


def plan_lines(plan: Sequence[PlannedRun], coordinates: Callable[[PlannedRun], str] | None = None) -> list[str]:
    """One line per planned run, ``"  <coordinates> -> <folder>: <planned_state>"`` (``coordinates`` default: the
    run's label), then a count line ``"  N runs: a new, b reuse, ..."`` (by the first word of the state)."""
    coordinates = coordinates or (lambda run: run.label)
    lines, counts = [], {}
    for run in plan:
        state = planned_state(run)
        kind = state.split(" ", 1)[0].rstrip(":")
        counts[kind] = counts.get(kind, 0) + 1
        lines.append(f"  {coordinates(run)} -> {run.run_dir.path}: {state}")
    lines.append(f"  {len(plan)} runs: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    return lines
