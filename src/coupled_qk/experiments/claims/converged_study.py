"""Run a converged design (:mod:`coupled_qk.experiments.claims.converged`) and show its plan.

``run_design`` executes the plan one run at a time (re-planning after each, so the grid's edge extensions and
the verdict stages appear as soon as their inputs exist), writes one record per run and can hand each new
record to a callback (``coupled-qk claims --commit-records`` commits it); ``plan_lines`` is ``--plan``. The
report, recomputed from the records alone, is :mod:`coupled_qk.experiments.claims.converged_report`
(``build_report``, ``write_report``: importable from here too).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from coupled_qk.experiments.claims.converged import GRID, Design, Plan, plan, units
from coupled_qk.experiments.claims.converged_report import (  # noqa: F401 - the report: public here too
    build_report,
    format_markdown,
    load_records,
    write_report,
)
from coupled_qk.experiments.claims.runs import execute, record_path


def run_design(
    design: Design,
    out_dir: str | Path,
    run_root: str | Path,
    data_dir: str | Path,
    cache_root: str | Path,
    max_runs: int | None = None,
    on_record: Callable[[Path, dict], None] | None = None,
    wait_seconds: float = 60.0,
) -> int:
    """Train every run of ``design`` that has no record yet, in plan order; return how many were trained.

    ``max_runs`` stops after that many new runs (a session's share); ``on_record(path, record)`` is called
    after each new record is written. Interrupting is safe: a run folder resumes, a record is atomic.

    Several processes may work on one study at once (one per core, or per GPU): a run whose folder another
    process holds (its :class:`~coupled_qk.training.lock.RunLock`) is left to that process and the next run
    of the plan is taken. When every run still to do is held elsewhere and a stage waits on them (e.g. the last
    grid run, on which the verdict stages depend), this process waits ``wait_seconds`` and plans again; when no
    stage waits, those held runs are all that is left and it returns (its core is free for other work).

    Under ``torchrun`` (``WORLD_SIZE > 1``) every rank trains every run together: the process group is made
    once for the study, rank 0's records decide the plan for all ranks (broadcast), each cell's batch is the
    global batch split over the ranks (:func:`~coupled_qk.experiments.claims.runs.execute`), and rank 0 alone
    writes records and calls ``on_record``.

    Raises:
        ValueError: the design needs accelerators (``runnable_here`` is false) and no GPU is present; under
            ``torchrun``, a global batch the number of processes does not divide.
    """
    import os
    import time

    import torch

    from coupled_qk.training.distributed import setup_runtime, teardown

    if not design.runnable_here and not torch.cuda.is_available():
        raise ValueError(
            f"protocol {design.name!r} needs a GPU (see --plan for its runs and cost); none is available here"
        )
    runtime = None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        runtime = setup_runtime(design.base.get("device", "auto"))
    main = runtime is None or runtime.is_main
    trained = 0
    try:
        while max_runs is None or trained < max_runs:
            records = _shared(load_records(out_dir, design, "skip") if main else None, runtime)
            p = plan(design, records)
            new, held = _next_new_record(design, units(p), out_dir, run_root, data_dir, cache_root, runtime)
            if new is None:
                if not held:
                    break
                if not p.waiting:  # nothing more can be planned: the held runs are all that is left, theirs
                    if main:
                        print(
                            f"== the {len(held)} remaining run(s) are held by other processes and no stage "
                            "waits to be planned: leaving them to those processes",
                            flush=True,
                        )
                    break
                if main:
                    print(
                        f"== {len(held)} run(s) held by other processes; planning again in {wait_seconds:g} s",
                        flush=True,
                    )
                time.sleep(wait_seconds)
                continue
            trained += 1
            if on_record is not None and main:
                on_record(*new)
    finally:
        if runtime is not None:
            teardown(runtime)
    return trained


def _next_new_record(design: Design, todo: list, out_dir, run_root, data_dir, cache_root, runtime):
    """Walk the plan's runs in order: a run with a record is skipped, one held by another process is noted and
    left, the first that writes a new record ends the walk. Returns ``((path, record) or None, held runs)``."""
    from coupled_qk.training.distributed import barrier
    from coupled_qk.training.lock import RunLockedError

    main = runtime is None or runtime.is_main
    held = []
    for k, (stage, cell, variant, seed) in enumerate(todo):
        path = record_path(out_dir, design.name, cell.name, variant, seed)
        before = path.stat().st_mtime_ns if path.is_file() else None
        if main:
            print(f"== {design.name} [{stage}] {cell.name} {variant} seed {seed} ({k + 1}/{len(todo)})", flush=True)
        try:
            rec = execute(
                cell,
                variant,
                seed,
                design.name,
                Path(out_dir),
                Path(run_root),
                Path(data_dir),
                Path(cache_root),
                runtime=runtime,
            )
        except RunLockedError as exc:
            if main:
                print(f"== held by another process, left to it: {exc}", flush=True)
            held.append((cell.name, variant, seed))
            continue
        if runtime is not None:
            barrier(runtime)  # rank 0's record is on disk before any rank looks at it
        if not path.is_file() or path.stat().st_mtime_ns != before:
            return (path, rec), held
    return None, held


def _shared(records: dict | None, runtime) -> dict:
    """Rank 0's ``records`` on every rank (a broadcast under ``torchrun``; identity for one process), so that
    all ranks plan the same runs even if another process writes a record between their reads."""
    if runtime is None:
        return records
    import torch.distributed as dist

    box = [records]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def cost_hours(design: Design, p: Plan) -> dict:
    """Expected training hours of the planned runs at ``design.tokens_per_second`` (grid runs at the horizon
    ``epochs``; verdict stages at the plan's horizon), and the total including not-yet-planned stages at
    ``epochs``."""
    per_epoch = design.train_tokens / design.tokens_per_second / 3600
    grid_runs = sum(len(c.variants) * len(c.seeds) for s, c in p.cells if s == GRID)
    epochs = p.epochs or design.epochs
    main = 2 * len(design.seeds) * epochs
    matched = len(design.matched_seeds) * epochs * design.matched_factor
    unc = len(design.seeds) * epochs * (len(design.variants) > 2)
    fresh = len(design.fresh_seeds) * epochs * design.matched_factor
    return {
        "grid": grid_runs * design.epochs * per_epoch,
        "main": main * per_epoch,
        "matched": matched * per_epoch,
        "uncoupled": unc * per_epoch,
        "fresh": fresh * per_epoch,
        "total": (grid_runs * design.epochs + main + matched + unc + fresh) * per_epoch,
    }


def plan_lines(design: Design, out_dir: str | Path, data_dir: str | Path | None) -> list[str]:
    """``--plan``: the runs planned now, what waits, the data check and the cost estimate (no training)."""
    records = load_records(out_dir, design)
    p = plan(design, records)
    lines = [f"protocol {design.name}: {design.description}"]
    for stage, cell, variant, seed in units(p):
        state = "done" if (cell.name, variant, seed) in records else "to run"
        lr = cell.variant_base.get(variant, {}).get("lr", cell.base.get("lr"))
        lines.append(
            f"  [{stage}] {cell.name} {variant} seed {seed} lr {lr:g} max_tokens {cell.base['max_tokens']:,} ({state})"
        )
    lines += [f"  waiting: {w}" for w in p.waiting]
    lines.append("data: " + _data_check(design, data_dir))
    cost = cost_hours(design, p)
    lines.append(
        f"cost estimate (hours of one device at {design.tokens_per_second:,.0f} tokens/s): "
        + ", ".join(f"{k} {v:.1f}" for k, v in cost.items() if v or k == "total")
    )
    return lines


def _data_check(design: Design, data_dir) -> str:
    from coupled_qk.data.corpora import KNOWN_CORPORA

    if data_dir is None:
        return "no data folder given"
    root = Path(data_dir)
    if design.split is not None:
        source = design.split["source"]
        need = root / ("wiki-vital/train.txt" if source == "wiki-vital" else "pubmed/abstracts.txt")
        return f"{need} " + (
            "found" if need.is_file() else "MISSING (pass --data-dir, or set COUPLED_QK_DATA, to the folder holding it)"
        )
    corpus = design.base["corpus"]
    if corpus == "wikitext-103":
        folder = root / "wikitext-103"
        names = ("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens")
        missing = [n for n in names if not (folder / n).is_file()]
        return f"{folder}: " + (
            "all splits found"
            if not missing
            else f"MISSING {', '.join(missing)} (put the WikiText-103 release there or pass --data-dir)"
        )
    return f"corpus {corpus!r} ({'known' if corpus in KNOWN_CORPORA else 'a path'})"
