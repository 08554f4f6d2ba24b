"""A study's plan, printed without training or writing anything (``study plan``, ``claims --plan``): every run in
execution order with what :func:`~coupled_qk.study.run.run_study` would do with it, the stages still waiting, the
records the reader does not count, the data check and the cost estimate.

A run's state comes from the same rules the runner applies: its record (:meth:`~coupled_qk.study.design.Study.read`,
precision compared on this machine), another study's identical record, and otherwise its run folder as the
executor would find it (:func:`~coupled_qk.study.executor.planned_state`: a finished or unfinished one is reused
or resumed, one with other settings refused); a folder another process of the study trains is ``in progress
(locked by ...)``, as :func:`~coupled_qk.study.run.run_study` leaves it to that process.
"""

from __future__ import annotations

from pathlib import Path

from coupled_qk.study.design import Study, Unit
from coupled_qk.study.records import record_path

DATA_FILES = {"wiki-vital": "wiki-vital/train.txt", "pubmed": "pubmed/abstracts.txt"}
"""The file a document split of each source is made from (:func:`coupled_qk.data.splits.document_split`)."""
MISSING = "MISSING (pass --data-dir, or set COUPLED_QK_DATA, to the folder holding it)"


def unit_state(study: Study, unit: Unit, reading, out_dir: Path, run_root: Path) -> str:
    """What the runner would do with ``unit``: ``done``, ``done, not counted (why)``, ``stale (why)``, ``reuse
    <study>'s record``, ``in progress (locked by ...)``, ``to run`` / ``to run: resume (...)`` ..., or
    ``refused: ...``."""
    from coupled_qk.study.executor import PlannedRun, planned_state
    from coupled_qk.study.run import run_dir_of, same_run_elsewhere, unit_config
    from coupled_qk.training.run_folder import RunFolder

    if unit.key in reading.counted:
        return "done"
    if unit.key in reading.done:
        reason = next((x.reason for x in reading.left_out if x.path == record_path(out_dir, study.name, *unit.key)), "")
        return f"done, not counted: {reason}"
    run_dir = run_dir_of(run_root, study.name, unit)
    cfg = unit_config(unit, run_dir, Path("data"), Path("cache"))
    stale = f"stale: {reading.stale[unit.key]}; " if unit.key in reading.stale else ""
    other = same_run_elsewhere(out_dir, study.name, unit, cfg)
    if other is not None:
        return f"{stale}reuse {other['reused_from']}'s record"
    holder = RunFolder(run_dir).holder()
    if holder is not None:  # another process of this study trains it (run_study goes on with the other runs)
        return f"{stale}in progress (locked by {holder})"
    state = planned_state(PlannedRun(cfg, ""))
    if state.startswith("refused"):
        return stale + state
    return f"{stale}to run" + ("" if state == "new" else f": {state}")


def _kind(state: str) -> str:
    for kind in ("done, not counted", "done", "stale", "reuse", "in progress", "refused", "to run"):
        if state.startswith(kind):
            return kind
    return state  # pragma: no cover


def plan_lines(
    study: Study,
    out_dir: str | Path,
    run_root: str | Path,
    data_dir: str | Path | None,
    cells: list[str] | None = None,
) -> list[str]:
    """The plan as lines (see the module docstring); ``cells`` limits the runs shown (a static study's).

    Raises:
        ValueError: a damaged record file, or one that is not a run record (naming it); what the runner would refuse
            before its first run (:func:`~coupled_qk.study.run.check_units`).
    """
    from coupled_qk.study.run import Places, check_units, select

    out_dir, run_root = Path(out_dir), Path(run_root)
    reading = study.read(out_dir, here=True)
    check_units(study, select(reading.plan.units(), cells), Places(out_dir, run_root, Path("data"), Path("cache")))
    lines = [f"protocol {study.name}: {study.description}"]
    counts: dict = {}
    for unit in select(reading.plan.units(), cells):
        state = unit_state(study, unit, reading, out_dir, run_root)
        counts[_kind(state)] = counts.get(_kind(state), 0) + 1
        lr = unit.cell.fields(unit.variant).get("lr")
        lines.append(
            f"  [{unit.stage}] {unit.cell.name} {unit.variant} seed {unit.seed} lr {lr:g} "
            f"{unit.cell.budget(unit.variant)} ({state})"
        )
    lines += [f"  waiting: {w}" for w in reading.plan.waiting]
    lines.append(f"{sum(counts.values())} runs: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    explained = {record_path(out_dir, study.name, *key) for key in (set(reading.stale) | reading.done)}
    lines += [f"left out: {x}" for x in reading.left_out if x.path not in explained]  # the unit lines say the others
    lines += [f"data: {line}" for line in data_check(study, reading.plan, data_dir)]
    cost = cost_hours(study, reading.plan)
    if cost is not None:
        unit = f"one device at {study.tokens_per_second:,.0f} tokens/s" if study.tokens_per_second else "one idle core"
        lines.append(
            f"cost estimate (hours of {unit}): "
            + ", ".join(f"{k} {v:.1f}" for k, v in cost.items() if v or k == "total")
        )
    return lines


def data_check(study: Study, plan, data_dir) -> list[str]:
    """One line per input the planned runs read from the data folder: found or missing."""
    from coupled_qk.data.corpora import KNOWN_CORPORA

    if data_dir is None:
        return ["no data folder given"]
    root = Path(data_dir)
    out: list[str] = []
    for _, cell in plan.cells:
        if not cell.reads_corpus(cell.variants[0]):
            continue
        if cell.split is not None or cell.heldout:
            source = cell.split["source"] if cell.split is not None else "wiki-vital"
            need = root / DATA_FILES[source]
            line = f"{need} " + ("found" if need.is_file() else MISSING)
            if cell.heldout:
                wt2 = [root / "wikitext-2" / f"{s}.txt" for s in ("valid", "test")]
                missing = [str(p) for p in wt2 if not p.is_file()]
                line += "; WikiText-2 " + ("found" if not missing else f"MISSING {', '.join(missing)}")
        elif cell.base["corpus"] == "wikitext-103":
            folder = root / "wikitext-103"
            names = ("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens")
            missing = [n for n in names if not (folder / n).is_file()]
            line = f"{folder}: " + (
                "all splits found"
                if not missing
                else f"MISSING {', '.join(missing)} (put the WikiText-103 release there or pass --data-dir)"
            )
        else:
            corpus = cell.base["corpus"]
            line = f"corpus {corpus!r} ({'known' if corpus in KNOWN_CORPORA else 'a path'})"
        if line not in out:
            out.append(line)
    return out


def cost_hours(study: Study, plan) -> dict | None:
    """Expected training hours per stage: the planned cells' runs at their budgets, the waiting stages' runs at the
    default horizon, at :attr:`~coupled_qk.study.design.Study.tokens_per_second` (or, for a study without a
    throughput, the cells' ``est_cpu_minutes``); ``None`` when neither is known."""
    out: dict = {}
    for stage, cell in plan.cells:
        out[stage] = out.get(stage, 0.0) + sum(_hours(study, cell, v) for v, _ in cell.units())
    for stage in study.stages:
        if stage.name not in out and hasattr(stage, "budget") and study.tokens_per_second:
            tokens = stage.budget.epochs * stage.tokens * stage.data * stage.budget.train_tokens
            out[stage.name] = stage.expected_runs() * tokens / study.tokens_per_second / 3600
    if not out or not any(out.values()):
        return None
    return {**out, "total": sum(out.values())}


def _hours(study: Study, cell, variant: str) -> float:
    if study.tokens_per_second:
        return (cell.fields(variant).get("max_tokens") or 0) / study.tokens_per_second / 3600
    return cell.est_cpu_minutes / 60
