"""Run a study: train what its plan still lacks, one committed record per run, re-planning after each.

A run ``(cell, variant, seed)`` trains in ``<run_root>/<study>/<cell>/<variant tag>/seed<k>`` (never committed,
through the executor: a finished folder with the same settings is reused, an unfinished one resumed) and writes its
record to ``<out_dir>/runs/<study>/<cell>/<variant tag>/seed<k>.json`` (:mod:`coupled_qk.study.records`): settings
and their fingerprint, parameter count, tokens, seconds, final metrics, a compact loss curve and, for language
models, the attention diagnostics of the final checkpoint (``docs/METHOD.md`` section 7). A run whose record is
already the planned run is skipped; the identical run recorded by another study (same cell, variant, seed and
settings) is copied with ``reused_from`` instead of trained.

:func:`run_study` walks the plan in order and re-plans after every new record, so the stages that wait on a grid
appear as soon as it is complete. Several processes may work on one study at once (one per core or GPU): a run
whose folder another process holds (its lock) is left to it and the next run of the plan is taken. Under
``torchrun`` every rank trains every run together (rank 0's records decide the plan, rank 0 alone writes).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from coupled_qk.files import write_text_atomic
from coupled_qk.study.design import Study, Unit
from coupled_qk.study.records import (
    RECORD_VERSION,
    fingerprint,
    read_record_file,
    record_path,
    same_run_problem,
    settings_of,
    variant_tag,
)


def _say(line: str) -> None:
    print(line, flush=True)


def run_dir_of(run_root: str | Path, study: str, unit: Unit) -> Path:
    """The run folder of ``unit``: ``<run_root>/<study>/<cell>/<variant tag>/seed<k>``."""
    return Path(run_root) / study / unit.cell.name / variant_tag(unit.variant) / f"seed{unit.seed}"


def unit_config(unit: Unit, run_dir: Path, data_dir: Path, cache_root: Path):
    """The unit's :class:`~coupled_qk.training.config.TrainConfig`: its corpus read from ``cache_root`` for a
    cell with a derived split (written there first), else from ``data_dir``."""
    corpus_dir = Path(cache_root) if (unit.cell.heldout or unit.cell.split) else Path(data_dir)
    return unit.cell.config(unit.variant, unit.seed, run_dir, corpus_dir)


def compact_curve(records: list[dict], max_points: int = 64) -> dict:
    """Loss curves of a run's ``metrics.jsonl`` records: ``{"valid": [[tokens, loss], ...], "train": [...]}``.

    ``valid`` keeps every evaluation (``valid/loss``, or ``valid/accuracy`` for MQAR as ``accuracy``); ``train``
    keeps at most ``max_points`` evenly spaced logged training losses.
    """
    valid = [[r["tokens"], r["valid/loss"]] for r in records if "valid/loss" in r]
    acc = [[r["tokens"], r["valid/accuracy"]] for r in records if "valid/accuracy" in r]
    train = [[r["tokens"], r["train/loss"]] for r in records if "train/loss" in r]
    if len(train) > max_points:
        stride = len(train) / max_points
        train = [train[min(len(train) - 1, round((i + 1) * stride) - 1)] for i in range(max_points)]
    out = {"valid": valid, "train": train}
    if acc:
        out["accuracy"] = acc
    return out


def wikitext2_eval(run_dir: str | Path, data_dir: str | Path | None = None, batch_size: int = 16) -> dict:
    """WikiText-2 valid/test perplexity (token- and word-level) and bits per byte/character of a finished run's
    latest checkpoint: the ``wiki-vital`` corpus definition (detokenized WikiText-2 splits, original word counts)
    with the run's own tokenizer, as ``{"wt2_valid/perplexity": ..., "wt2_test/...": ...}``.

    Raises:
        FileNotFoundError: no checkpoint/tokenizer in ``run_dir`` or no WikiText-2 files under ``data_dir``.
    """
    from coupled_qk.training.evaluate import evaluate_checkpoint

    res = evaluate_checkpoint(run_dir, corpus="wiki-vital", data_dir=data_dir, batch_size=batch_size, device="cpu")
    keys = ("loss", "perplexity", "word_perplexity", "bits_per_byte", "bits_per_char")
    keys += ("n_tokens", "n_words", "n_bytes", "n_chars")
    return {f"wt2_{split}/{key}": res[split][key] for split in ("valid", "test") for key in keys if key in res[split]}


def _diagnostics(run_dir: Path, corpus_dir: Path | None, cfg) -> dict:
    """Layer-averaged attention diagnostics of the final checkpoint (``docs/METHOD.md`` section 7) on the first
    (up to) 8 non-overlapping windows of (up to) 128 tokens of the held-out validation split."""
    import torch

    from coupled_qk.analysis.capture import analyze_model
    from coupled_qk.data.corpora import load_corpus
    from coupled_qk.training.run_folder import RunFolder, open_run

    run = open_run(RunFolder(run_dir).best_checkpoint() or run_dir, "claims", text=True)  # the final checkpoint
    model, _ = run.load_model("cpu")
    tokenizer = run.tokenizer()
    text = load_corpus(cfg.corpus, corpus_dir, seed=int(cfg.task_options.get("split_seed", 0))).split("valid")
    ids = tokenizer.encode(text[:200_000])
    seq_len = min(128, model.config.block_size, len(ids))
    n = min(8, len(ids) // seq_len)
    windows = torch.tensor(ids[: n * seq_len], dtype=torch.long).view(n, seq_len)
    res = analyze_model(model, windows, threads=1)
    out = {k: v for k, v in res["mean"].items() if isinstance(v, (int, float))}
    return {**out, "windows": n, "window_tokens": seq_len}


def source_commit() -> str | None:
    """The commit of the source tree this package runs from (read from its ``.git`` files; no ``git`` process),
    or ``None`` when it is not a git checkout (an installed package)."""
    here = Path(__file__).resolve()
    for root in here.parents:
        dot = root / ".git"
        if dot.is_file() and dot.read_text().startswith("gitdir:"):  # a worktree
            dot = (root / dot.read_text().split(":", 1)[1].strip()).resolve()
        if dot.is_dir():
            return _resolve_head(dot)
    return None


def _resolve_head(git_dir: Path) -> str | None:
    try:
        head = (git_dir / "HEAD").read_text().strip()
        if not head.startswith("ref:"):
            return head or None
        ref = head.split(":", 1)[1].strip()
        common = git_dir / "commondir"
        base = (git_dir / common.read_text().strip()).resolve() if common.is_file() else git_dir
        for folder in (git_dir, base):
            if (folder / ref).is_file():
                return (folder / ref).read_text().strip() or None
        packed = base / "packed-refs"
        for line in packed.read_text().splitlines() if packed.is_file() else []:
            if line.endswith(" " + ref):
                return line.split()[0]
    except OSError:
        return None
    return None


def same_run_elsewhere(out_dir: str | Path, study: str, unit: Unit, planned) -> dict | None:
    """The finished record of the same run made by another study, as a record of ``study``, or ``None``.

    "The same run" means the same cell, variant and seed and equal result-changing settings and precision
    (:func:`~coupled_qk.study.records.same_run_problem`), e.g. the MQAR cells that ``cpu`` and ``cpu-short`` share;
    a record still waiting for its WikiText-2 evaluation is not taken. The copy names the study that trained it
    in ``reused_from``.
    """
    pattern = f"*/{unit.cell.name}/{variant_tag(unit.variant)}/seed{unit.seed}.json"
    for other in sorted((Path(out_dir) / "runs").glob(pattern)):
        name = other.parts[-4]
        rec = None if name == study else read_record_file(other, ())
        if rec is not None and same_run_problem(rec, planned) is None and not rec.get("wt2_pending"):
            return {**rec, "protocol": study, "reused_from": rec.get("reused_from", name)}
    return None


def complete_wt2(path: str | Path, data_dir: str | Path, run_dir: str | Path | None = None) -> dict:
    """Add the WikiText-2 evaluation to a record written with ``defer_wt2`` and rewrite it atomically.

    ``run_dir`` is the run folder to evaluate (default: the one the record names; it must still exist).
    Returns the record (unchanged if nothing is pending). Raises ``FileNotFoundError`` if the run folder is gone.
    """
    path = Path(path)
    rec = json.loads(path.read_text())
    if not rec.get("wt2_pending"):
        return rec
    _say(f"== claims: WikiText-2 evaluation of {rec['cell']} {rec['variant']} seed {rec['seed']}")
    rec["final"].update(wikitext2_eval(rec["run_dir"] if run_dir is None else run_dir, data_dir))
    rec["wt2_pending"] = False
    write_text_atomic(path, json.dumps(rec, indent=1, default=str))
    return rec


def complete_pending(path: Path, rec: dict, data_dir, run_dir: Path) -> dict:
    """A record trained with ``--defer-wt2`` and reached without it: evaluated now when its run folder is on this
    machine, else returned as it is with a message."""
    if run_dir.is_dir():
        return complete_wt2(path, data_dir, run_dir)
    _say(
        f"claims: {path} waits for its WikiText-2 evaluation, but its run folder {run_dir} is not on this machine; "
        "reported without it"
    )
    return rec


@dataclasses.dataclass(frozen=True)
class Places:
    """Where a study's files go: ``out_dir`` (records and report), ``run_root`` (run folders), ``data_dir`` (the
    real data), ``cache_root`` (derived data: document splits)."""

    out_dir: Path
    run_root: Path
    data_dir: Path
    cache_root: Path


def run_unit(
    study: Study,
    unit: Unit,
    places: Places,
    defer_wt2: bool = False,
    runtime=None,
    reuse_elsewhere: bool = True,
) -> dict | None:
    """Produce the record of one run (reuse another study's identical record, or train) and return it.

    The record is written atomically. ``defer_wt2`` leaves the (slow) WikiText-2 evaluation of held-out cells for
    :func:`complete_wt2` and marks the record ``"wt2_pending": true``.

    ``runtime``: the :class:`~coupled_qk.training.distributed.Runtime` of a study launched by ``torchrun`` (every
    rank calls this with the same arguments). The cell's ``batch_size`` is then the global batch, split evenly over
    the ranks (the training loop draws the same global batches at any world size, so the record and its
    fingerprint are those of the one-process run); rank 0 alone prepares data and writes the record, and the
    other ranks return ``None`` after training.

    Raises:
        ValueError: under ``torchrun``, a global batch that the number of processes does not divide.
        RunLockedError: another process holds the run folder.
    """
    from coupled_qk.study.executor import agreed_holder
    from coupled_qk.training.lock import RunLockedError
    from coupled_qk.training.run_folder import RunFolder

    world, rank = (runtime.world, runtime.rank) if runtime is not None else (1, 0)
    run_dir = run_dir_of(places.run_root, study.name, unit)
    cfg = unit_config(unit, run_dir, places.data_dir, places.cache_root)
    if world > 1 and cfg.batch_size % world:
        raise ValueError(
            f"batch_size={cfg.batch_size} of cell {unit.cell.name!r} is the global batch and must be divisible "
            f"by the {world} processes of torchrun (use a divisor of it for --nproc_per_node)"
        )
    path = record_path(places.out_dir, study.name, *unit.key)
    if reuse_elsewhere and (rec := same_run_elsewhere(places.out_dir, study.name, unit, cfg)) is not None:
        if rank == 0:
            who = f"{unit.cell.name} {unit.variant} seed {unit.seed}"
            _say(f"== {who}: reusing the identical run of protocol {rec['reused_from']}")
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(path, json.dumps(rec, indent=1, default=str))
        return rec
    holder = agreed_holder(RunFolder(run_dir))  # every rank of a torchrun group takes rank 0's answer
    if holder is not None:
        raise RunLockedError(f"run folder {run_dir} is in use by {holder}")
    if rank == 0:
        set_aside_other_run(run_dir, cfg)
    return _train(study, unit, places, cfg, run_dir, defer_wt2, runtime)


def set_aside_other_run(run_dir: Path, planned) -> Path | None:
    """A study's run folder holding a *finished* run that is not ``planned`` (other settings, or another precision
    than this machine trains in) is renamed aside (``seed<k>.other-<n>``, kept, never deleted) so that the run is
    trained again: the one "same run?" rule decides for the record and for its folder alike, whether or not an old
    folder is still there. Returns the new name, or ``None`` when nothing was moved.

    (A folder a user names, as ``compare``'s, is refused instead by the executor: it is the user's, not a study's.)
    """
    from coupled_qk.study.executor import check_reusable, check_same_precision
    from coupled_qk.training.run_folder import RunFolder

    rundir = RunFolder(run_dir)
    if not rundir.is_finished():
        return None
    try:
        results = rundir.read_results()
        check_reusable(results.get("config", {}), planned, run_dir)
        check_same_precision(results, planned, run_dir)
    except ValueError as exc:
        k = 1
        while run_dir.with_name(f"{run_dir.name}.other-{k}").exists():
            k += 1
        aside = run_dir.with_name(f"{run_dir.name}.other-{k}")
        run_dir.rename(aside)
        _say(f"== {run_dir} is another run ({exc}); moved to {aside.name} and trained again")
        return aside
    return None


def _train(study: Study, unit: Unit, places: Places, cfg, run_dir: Path, defer_wt2: bool, runtime) -> dict | None:
    from coupled_qk.data.splits import document_split, heldout_corpus
    from coupled_qk.study.executor import PlannedRun, execute
    from coupled_qk.training.run_folder import RunFolder

    world, rank = (runtime.world, runtime.rank) if runtime is not None else (1, 0)
    cell = unit.cell
    if rank == 0:
        if cell.heldout:
            heldout_corpus(places.data_dir, places.cache_root)
        if cell.split:
            document_split(places.data_dir, places.cache_root, cell.base["corpus"], **cell.split)
    if world > 1:
        from coupled_qk.training.distributed import barrier

        barrier(runtime)  # the derived data exists before any rank reads it
    t0 = time.perf_counter()
    # the executor reuses a finished run folder (same settings), resumes an unfinished one, or trains
    ranked = dataclasses.replace(cfg, batch_size=cfg.batch_size // world) if world > 1 else cfg
    label = f"{cell.name} {unit.variant} seed {unit.seed}"
    (outcome,) = execute([PlannedRun(ranked, label, {"cell": cell.name})], announce=rank == 0)
    if rank != 0:
        return None
    results = outcome.results
    final = dict(results["final"])
    if cell.heldout and not defer_wt2:
        final.update(wikitext2_eval(run_dir, places.data_dir))
    corpus_dir = Path(places.cache_root) if (cell.heldout or cell.split) else Path(places.data_dir)
    rec = {
        "version": RECORD_VERSION,
        "protocol": study.name,
        "cell": cell.name,
        "variant": unit.variant,
        "seed": unit.seed,
        "fingerprint": fingerprint(cfg),
        "config": settings_of(cfg),
        "params": results["params"],
        "tokens": results["tokens"],
        "steps": results["steps"],
        "train_seconds": results["train_seconds"],
        "wall_seconds": time.perf_counter() - t0,
        "stop_reason": results["stop_reason"],
        "final": final,
        "precision": results.get("precision"),
        "diagnostics": _diagnostics(run_dir, corpus_dir, cfg) if cfg.task == "lm" else {},
        "curve": compact_curve(RunFolder(run_dir).read_metrics()),
        "data": results.get("data"),
        "epochs": results.get("epochs"),
        "best": results.get("best"),
        "final_from": results.get("final_from"),
        "wt2_pending": bool(cell.heldout and defer_wt2),
        "run_dir": str(run_dir),
        "git_commit": source_commit(),
        "initial_weights_sha256": results.get("initial_weights_sha256"),
        "hosts": results.get("hosts"),
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path = record_path(places.out_dir, study.name, *unit.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(rec, indent=1, default=str))
    return rec


def check_units(study: Study, units: list[Unit], places: Places) -> None:
    """The executor's checks of a whole plan (:func:`~coupled_qk.study.executor.check_plan`) over ``units``, before
    any of them trains (and by ``--plan``).

    Raises:
        ValueError: as :func:`~coupled_qk.study.executor.check_plan`.
    """
    from coupled_qk.study.executor import PlannedRun, check_plan

    runs = []
    for unit in units:
        cfg = unit_config(unit, run_dir_of(places.run_root, study.name, unit), places.data_dir, places.cache_root)
        runs.append(PlannedRun(cfg, f"{unit.cell.name} {unit.variant} seed {unit.seed}"))
    check_plan(runs)


def select(units: list[Unit], cells: list[str] | None = None, shard: tuple[int, int] = (0, 1)) -> list[Unit]:
    """The units of ``cells`` (default: all), in plan order, every ``n``-th starting at ``i`` (``shard``)."""
    i, n = shard
    chosen = [u for u in units if not cells or u.cell.name in cells]
    return [u for k, u in enumerate(chosen) if k % n == i]


def run_study(
    study: Study,
    places: Places,
    cells: list[str] | None = None,
    shard: tuple[int, int] = (0, 1),
    max_runs: int | None = None,
    defer_wt2: bool = False,
    on_record: Callable[[Path, dict], None] | None = None,
    wait_seconds: float = 60.0,
) -> int:
    """Train every run of ``study`` that has no record yet, in plan order; return how many records were written.

    ``cells`` / ``shard`` select the runs of a static study; ``max_runs`` stops after that many new records (a
    session's share); ``on_record(path, record)`` is called after each new record is written; ``defer_wt2`` trains
    every run first, then adds the WikiText-2 evaluations whose run folders are on this machine. Interrupting is
    safe: a run folder resumes, a record is atomic.

    A run whose folder another process holds is left to that process. When every run still to do is held
    elsewhere and a stage waits on them (e.g. the last grid run), this process waits ``wait_seconds`` and plans
    again; when no stage waits, those held runs are all that is left and it returns (its core is free).

    Raises:
        ValueError: the study is not runnable here, needs a GPU that is absent, names an unknown cell or a bad
            shard; under ``torchrun``, a global batch the number of processes does not divide.
    """
    _check_runnable(study, cells, shard)
    runtime = None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from coupled_qk.training.distributed import setup_runtime

        runtime = setup_runtime(study_device(study))
    main = runtime is None or runtime.is_main
    trained = 0
    try:
        while max_runs is None or trained < max_runs:
            reading = _shared(study.read(places.out_dir, damaged="skip", here=True) if main else None, runtime)
            todo = select(reading.plan.units(), cells, shard)
            check_units(study, todo, places)
            new, held = _next_new_record(study, todo, reading, places, defer_wt2, runtime)
            if new is None:
                if not held or not reading.plan.waiting:
                    if held and main:  # nothing more can be planned: the held runs are all that is left, theirs
                        _say(
                            f"== the {len(held)} remaining run(s) are held by other processes and no stage waits to "
                            "be planned: leaving them to those processes"
                        )
                    break
                if main:
                    _say(f"== {len(held)} run(s) held by other processes; planning again in {wait_seconds:g} s")
                time.sleep(wait_seconds)
                continue
            trained += 1
            if on_record is not None and main:
                on_record(*new)
    finally:
        if runtime is not None:
            from coupled_qk.training.distributed import teardown

            teardown(runtime)
    if defer_wt2 and main:
        _complete_deferred(study, places, cells, shard)
    return trained


def study_device(study: Study) -> str:
    """The ``device`` the study's runs ask for (``auto`` unless its cells say otherwise)."""
    cells = [c for s in study.stages for c in getattr(s, "cells", ())] or []
    budget = next((s.budget for s in study.stages if hasattr(s, "budget")), None)
    base = budget.base if budget is not None else (cells[0].base if cells else {})
    return base.get("device", "auto")


def _check_runnable(study: Study, cells, shard) -> None:
    if not study.runnable:
        raise ValueError(f"protocol {study.name!r} is defined but not runnable here (see its notes)")
    if study.needs_gpu:
        import torch

        if not torch.cuda.is_available():
            raise ValueError(
                f"protocol {study.name!r} needs a GPU (see --plan for its runs and cost); none is available here"
            )
    i, n = shard
    if not (isinstance(n, int) and n >= 1 and isinstance(i, int) and 0 <= i < n):
        raise ValueError(f"shard={shard!r} must be (i, n) with 0 <= i < n")
    if cells:
        names = [c.name for c in study.cells]
        unknown = [c for c in cells if c not in names]
        if unknown:
            raise ValueError(f"cell {unknown[0]!r} is not in protocol {study.name!r}; expected some of {names}")


def _next_new_record(study: Study, todo: list[Unit], reading, places: Places, defer_wt2: bool, runtime):
    """Walk the plan's runs in order: a run whose record is the planned run is skipped (its pending WikiText-2
    evaluation completed here when its folder is), one held by another process is noted and left, the first that
    writes a new record ends the walk. Returns ``((path, record) or None, held runs)``."""
    from coupled_qk.training.lock import RunLockedError

    main = runtime is None or runtime.is_main
    held = []
    for k, unit in enumerate(todo):
        path = record_path(places.out_dir, study.name, *unit.key)
        if unit.key in reading.done:
            rec = reading.counted.get(unit.key)
            if rec is not None and rec.get("wt2_pending") and not defer_wt2 and main:
                complete_pending(path, rec, places.data_dir, run_dir_of(places.run_root, study.name, unit))
            continue
        if main:
            _say(
                f"== {study.name} [{unit.stage}] {unit.cell.name} {unit.variant} seed {unit.seed} ({k + 1}/{len(todo)})"
            )
            if unit.key in reading.stale:
                _say(f"claims: {path} is not the planned run ({reading.stale[unit.key]}); running again")
        try:
            rec = run_unit(study, unit, places, defer_wt2=defer_wt2, runtime=runtime)
        except RunLockedError as exc:
            if main:
                _say(f"== held by another process, left to it: {exc}")
            held.append(unit.key)
            continue
        if runtime is not None:
            from coupled_qk.training.distributed import barrier

            barrier(runtime)  # rank 0's record is on disk before any rank looks at it
        return (path, rec), held
    return None, held


def _complete_deferred(study: Study, places: Places, cells, shard) -> None:
    """After a ``--defer-wt2`` run: the WikiText-2 evaluation of every pending record of the selected runs."""
    reading = study.read(places.out_dir, damaged="skip", here=True)
    for unit in select(reading.plan.units(), cells, shard):
        rec = reading.counted.get(unit.key)
        if rec is not None and rec.get("wt2_pending"):
            path = record_path(places.out_dir, study.name, *unit.key)
            complete_pending(path, rec, places.data_dir, run_dir_of(places.run_root, study.name, unit))


def _shared(reading, runtime):
    """Rank 0's ``reading`` on every rank (a broadcast under ``torchrun``; identity for one process), so that all
    ranks plan the same runs even if another process writes a record between their reads."""
    if runtime is None:
        return reading
    import torch.distributed as dist

    box = [reading]
    dist.broadcast_object_list(box, src=0)
    return box[0]
