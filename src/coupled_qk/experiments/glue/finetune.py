"""Fine-tune pretrained checkpoints on GLUE tasks over seeds, reuse finished runs, summarise (METHOD.md claim C11).

Each fine-tune is one run of the training loop in ``out_dir/<model>/<task>/seed<k>``, planned and executed by
the experiment runner (:mod:`coupled_qk.study.executor`: resumable like training; a finished run with the
same settings is reused). :func:`run_glue` writes ``out_dir/results.json`` (structure in its docstring) and
``out_dir/results.md``.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from coupled_qk.checks.values import finite, positive_int
from coupled_qk.data.glue import GLUE_TASKS, TASK_INFO, check_task, load_glue
from coupled_qk.extras import MissingExtra
from coupled_qk.study.executor import PlannedRun, Report, execute, stopped_early, write_report
from coupled_qk.training.config import TrainConfig
from coupled_qk.training.run_folder import RESULTS_FILE, is_checkpoint_name

SCHEMA = "coupled-qk/glue-results/v1"
# per task: learning rate, epochs, batch size (GPT-style fine-tuning, Radford et al. 2018 section 4.1: 3 epochs,
# batch 32, linear warmup over 10% of the steps; the learning rate is raised from GPT's 6.25e-5 for our
# small models, and RTE/MRPC, the small sets, get more epochs)
DEFAULTS = {
    "sst2": {"lr": 1e-4, "epochs": 3, "batch_size": 32},
    "cola": {"lr": 1e-4, "epochs": 3, "batch_size": 32},
    "rte": {"lr": 1e-4, "epochs": 5, "batch_size": 32},
    "mrpc": {"lr": 1e-4, "epochs": 5, "batch_size": 32},
}


def parse_tasks(text: str) -> list[str]:
    """``"all"`` or a comma-separated list of GLUE tasks; ``ValueError`` naming an unknown one."""
    if text.strip().lower() == "all":
        return list(GLUE_TASKS)
    try:
        tasks = [check_task(t.strip()) for t in text.split(",") if t.strip()]
    except ValueError as exc:
        raise ValueError(f"--task={text!r}: {exc}") from None
    if not tasks:
        raise ValueError(f"--task={text!r} names no task; expected 'all' or some of {GLUE_TASKS}")
    if len(set(tasks)) != len(tasks):
        raise ValueError(f"--task={text!r} repeats a task; expected each of {GLUE_TASKS} at most once")
    return tasks


def check_names(names: list, n_runs: int, option: str = "names") -> list[str]:
    """``names`` if they label ``n_runs`` pretrained runs: one each, distinct, each usable as one folder name
    (the fine-tunes go to ``<out_dir>/<name>/``; empty, ``.``/``..``, hidden or with a path separator: refused).

    Raises:
        ValueError: naming ``option``, the names and what was expected.
    """
    bad = [x for x in names if not isinstance(x, str) or not x.strip() or x.startswith(".") or "/" in x or "\\" in x]
    if bad:
        raise ValueError(
            f"{option}={names!r}: {bad!r} cannot name a folder of fine-tuning runs; expected non-empty "
            "labels without '/' or '\\' that do not start with '.'"
        )
    if len(names) != n_runs or len(set(names)) != len(names):
        raise ValueError(f"{option}={names!r}: need one distinct name per pretrained run ({n_runs})")
    return names


def parse_per_task(text: str | None, flag: str = "--max-train-examples") -> int | dict | None:
    """``"3000"`` -> 3000 (every task); ``"sst2=3000,rte=600"`` -> ``{"sst2": 3000, "rte": 600}`` (others: all rows).

    Raises:
        ValueError: naming ``flag``: an unknown task, a value that is not an integer >= 1.
    """
    if text is None:
        return None
    try:
        if "=" not in text:
            value = int(text)
            if value < 1:
                raise ValueError
            return value
        out = {}
        for item in text.split(","):
            key, value = item.split("=", 1)
            out[check_task(key.strip())] = int(value)
            if out[check_task(key.strip())] < 1:
                raise ValueError
        return out
    except ValueError as exc:
        why = f" ({exc})" if str(exc) else ""
        raise ValueError(
            f"{flag}={text!r}: expected an integer >= 1 or task=N pairs, e.g. sst2=3000,rte=600{why}"
        ) from None


def finetune_config(
    pretrained: str,
    task: str,
    seed: int,
    out_dir: str | Path,
    glue_dir: str | None = None,
    lr: float | None = None,
    epochs: float | None = None,
    batch_size: int | None = None,
    max_train_examples: int | None = None,
    pooling: str = "last",
    **fields,
) -> TrainConfig:
    """The :class:`TrainConfig` of one fine-tune: :data:`DEFAULTS` for ``task`` unless given, AdamW (weight decay
    0.01), warmup over 10% of the steps then cosine decay to 0, ``max_steps = ceil(epochs * N / batch_size)``.
    ``fields`` override any other TrainConfig field (e.g. ``device``, ``progress``)."""
    d = DEFAULTS[check_task(task)]
    # an explicit 0 is an error, never "not given" (docs/RELIABILITY.md, "0 means not given")
    lr = d["lr"] if lr is None else finite("lr", lr, 0, lo_open=True)
    epochs = d["epochs"] if epochs is None else finite("epochs", epochs, 0, lo_open=True)
    batch_size = d["batch_size"] if batch_size is None else positive_int("batch_size", batch_size)
    if max_train_examples is not None:
        positive_int("max_train_examples", max_train_examples)
    n = len(load_glue(task, "train", glue_dir))
    n = min(n, max_train_examples) if max_train_examples is not None else n
    steps = max(1, math.ceil(epochs * n / batch_size))
    options = {"glue_task": task, "pretrained": str(pretrained), "pooling": pooling}
    if glue_dir is not None:
        options["glue_dir"] = str(glue_dir)
    if max_train_examples is not None:
        options["max_train_examples"] = int(max_train_examples)
    base = dict(
        task="glue",
        lr=lr,
        batch_size=batch_size,
        max_steps=steps,
        warmup_steps=max(1, steps // 10),
        min_lr_ratio=0.0,
        weight_decay=0.01,
        eval_interval=steps,
        log_interval=max(1, steps // 20),
        seed=seed,
        out_dir=str(out_dir),
        task_options=options,
        tensorboard=False,
    )
    return TrainConfig.from_dict({**base, **fields})


def model_name(run_dir: str | Path) -> str:
    """A label for a pretrained run: its folder name, or the parent's when the folder is ``seed<k>``."""
    path = Path(run_dir).resolve()
    path = path.parent if is_checkpoint_name(path) else path  # a checkpoint folder: its run's name
    return path.parent.name if path.name.startswith("seed") else path.name


def _stats():
    """:mod:`coupled_qk.study.stats` (needs scipy, an optional dependency: the [glue] extra)."""
    try:
        from coupled_qk.study import stats
    except ImportError as exc:
        raise MissingExtra("GLUE summaries need scipy: pip install 'coupled-qk[glue]'") from exc
    return stats


def _summary(values: list[float]) -> dict:
    """Mean, std, range, the 95% Student-t interval of the mean (``ci95``: ``None`` for one seed) and ``n``."""
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    ci = _stats().mean_ci(values)
    return {
        "mean": statistics.fmean(values),
        "std": std,
        "min": min(values),
        "max": max(values),
        "ci95": [ci["low"], ci["high"]] if len(values) > 1 else None,
        "n": len(values),
        "values": values,
    }


def paired_difference(a: list[float], b: list[float]) -> dict:
    """Mean of ``a_i - b_i`` with a two-sided 95% Student-t interval
    (:func:`coupled_qk.study.stats.paired_difference`); ``ci95`` is ``None`` for n < 2.

    Raises:
        ValueError: ``a`` and ``b`` of different lengths, empty or non-finite.
    """
    d = _stats().paired_difference(b, a)  # stats' difference is its second argument minus its first
    return {
        "mean": d["mean"],
        "ci95": [d["low"], d["high"]] if d["n"] > 1 else None,
        "n": d["n"],
        "values": d["differences"],
    }


def plan_glue(
    pretrained: list[str], tasks: list[str], seeds: list[int], out_dir: str | Path, names: list[str], **options
) -> list[PlannedRun]:
    """One :class:`PlannedRun` per ``pretrained x task x seed`` (model-major), in ``out_dir/<name>/<task>/seed<k>``;
    ``keys`` are ``{"model", "task", "seed"}``. ``options`` go to :func:`finetune_config`;
    ``max_train_examples`` may also be a ``{task: N}`` dict. Nothing is created (the task's training file is read
    for its size).

    Raises:
        ValueError: from :func:`finetune_config` (a bad option, a missing or malformed GLUE file).
    """
    per_task = options.pop("max_train_examples", None)
    plan = []
    for name, path in zip(names, pretrained, strict=True):
        for task in tasks:
            subset = per_task.get(task) if isinstance(per_task, dict) else per_task
            for seed in seeds:
                cfg = finetune_config(
                    path, task, seed, Path(out_dir) / name / task / f"seed{seed}", max_train_examples=subset, **options
                )
                plan.append(PlannedRun(cfg, f"{name} {task} seed {seed}", {"model": name, "task": task, "seed": seed}))
    return plan


def run_glue(
    pretrained: list[str],
    tasks: list[str],
    seeds: list[int],
    out_dir: str | Path,
    names: list[str] | None = None,
    max_minutes: float | None = None,
    log=print,
    train_fn=None,
    **options,
) -> dict:
    """Fine-tune every ``pretrained x task x seed`` (:func:`plan_glue`) and summarise; the first model is the
    baseline.

    A finished run with the same settings is reused, an unfinished one resumes. With ``max_minutes`` (a
    wall-clock guard for the whole study, :func:`coupled_qk.study.executor.execute`), a run cut short is
    marked ``interrupted`` (resumed by the next invocation) and runs not started in time ``skipped``; the summary
    then counts only finished runs (:func:`summarize_glue`). ``log`` receives the progress lines and
    ``train_fn`` replaces the training function (tests).

    Returns:
        The summary written to ``out_dir/results.json`` (:func:`summarize_glue`); ``out_dir/results.md`` holds
        :func:`format_table`.

    Raises:
        ValueError: bad names or options, ``max_minutes`` <= 0, a finished run with other settings.
    """
    if names is None:
        names = check_names(
            [model_name(p) for p in pretrained], len(pretrained), "the runs' folder names (--names to label them)"
        )
    check_names(names, len(pretrained))
    plan = plan_glue(pretrained, tasks, seeds, out_dir, names, **options)
    records = execute(plan, train_fn=train_fn, log=log, max_minutes=max_minutes)
    summary = summarize_glue(records, pretrained, tasks, seeds, names)
    write_report(out_dir, Report(json={RESULTS_FILE: summary}, text={"results.md": format_table(summary) + "\n"}))
    return summary


def _counted(record) -> bool:
    """Whether a run's results count in the summary: finished (ran or reused) and not stopped early."""
    return record.finished and not stopped_early(record.results)


def _cell(records, task: str) -> dict:
    """One (model, task) cell: its finished runs, the runs that are missing (seed, why, folder) and the metrics over
    the finished seeds (``None`` for a metric without any)."""
    runs, missing, data = [], [], None
    for rec in records:
        if not _counted(rec):
            why = rec.status if not rec.finished else f"stopped early ({rec.results.get('stop_reason')})"
            missing.append({"seed": rec.keys["seed"], "status": why, "run_dir": rec.run.config.out_dir})
            continue
        res = rec.results
        runs.append(
            {
                "seed": rec.keys["seed"],
                "run_dir": rec.run.config.out_dir,
                "dev": {k.removeprefix("dev/"): v for k, v in res["final"].items()},
                "train_seconds": res["train_seconds"],
            }
        )
        data = res["data"]
    metrics = {m: _summary([r["dev"][m] for r in runs]) if runs else None for m in TASK_INFO[task][3]}
    return {"metrics": metrics, "runs": runs, "missing": missing, "complete": not missing, "data": data}


def summarize_glue(records, pretrained: list[str], tasks: list[str], seeds: list[int], names: list[str]) -> dict:
    """The study's summary from the runner's records (structure below). Only finished runs count: a run
    ``skipped`` or ``interrupted`` by the time guard, or stopped early, is listed under its cell's ``missing``;
    means and intervals are over the finished seeds (``n`` says how many) and differences pair the seeds both
    models finished::

        {"schema": SCHEMA, "tasks": [...], "seeds": [...], "baseline": name, "settings": {task: config},
         "complete": bool, "counts": {status: n},
         "models": {name: {"pretrained": path, "attention": str | None, "tasks": {task: {
             "metrics": {metric: {"mean", "std", "min", "max", "ci95", "n", "values"} | None},  # finished seeds
             "runs": [{"seed", "run_dir", "dev": {...}, "train_seconds"}],  # finished runs only
             "missing": [{"seed", "status", "run_dir"}], "complete": bool, "data": {...} | None}}}},
         "differences": {name: {task: {metric: {"mean", "ci95", "n", "seeds", "values"} | None}}}}

    Metrics are fractions (accuracy, F1) or the Matthews correlation in [-1, 1].
    """
    counts: dict[str, int] = {}
    for rec in records:
        counts[rec.status] = counts.get(rec.status, 0) + 1
    summary: dict = {
        "schema": SCHEMA,
        "tasks": tasks,
        "seeds": seeds,
        "baseline": names[0],
        "settings": {},
        "complete": all(_counted(r) for r in records),
        "counts": counts,
        "models": {},
        "differences": {},
    }
    for name, path in zip(names, pretrained, strict=True):
        entry = {"pretrained": str(path), "attention": None, "tasks": {}}
        for task in tasks:
            mine = [r for r in records if r.keys["model"] == name and r.keys["task"] == task]
            summary["settings"].setdefault(
                task,
                {k: v for k, v in mine[0].run.config.to_dict().items() if k not in ("seed", "out_dir", "task_options")},
            )
            entry["tasks"][task] = _cell(mine, task)
            attention = next((r.results["model_config"]["attention"] for r in mine if _counted(r)), None)
            entry["attention"] = entry["attention"] or attention
        summary["models"][name] = entry
    base = summary["models"][names[0]]
    for name in names[1:]:
        summary["differences"][name] = {
            task: {
                m: _paired_by_seed(summary["models"][name]["tasks"][task]["runs"], base["tasks"][task]["runs"], m)
                for m in TASK_INFO[task][3]
            }
            for task in tasks
        }
    return summary


def _paired_by_seed(runs: list[dict], base_runs: list[dict], metric: str) -> dict | None:
    """:func:`paired_difference` of ``metric`` over the seeds both run lists finished, with ``seeds``; ``None``
    when they share none."""
    mine, ref = ({r["seed"]: r["dev"][metric] for r in rs} for rs in (runs, base_runs))
    shared = [s for s in mine if s in ref]
    if not shared:
        return None
    return {**paired_difference([mine[s] for s in shared], [ref[s] for s in shared]), "seeds": shared}


def _n(count: int, planned: int) -> str:
    return f" (n={count})" if count < planned else ""


def format_table(summary: dict) -> str:
    """Markdown: dev metric mean over the finished seeds with its 95% t-interval (one seed: the value) per model
    and task, the majority-class baseline, and the paired difference to the baseline model with its 95%
    t-interval (in percentage points). A cell with fewer finished seeds than planned shows ``(n=k)``, one with
    none ``-``; a note under the table names the incomplete cells and why."""
    tasks, planned = summary["tasks"], len(summary["seeds"])
    cols = [(t, m) for t in tasks for m in TASK_INFO[t][3]]
    head = "| model | " + " | ".join(f"{t.upper()} {m}" for t, m in cols) + " |"
    lines = [head, "|" + "---|" * (len(cols) + 1)]
    majority = {
        t: next(
            (
                e["tasks"][t]["data"]["dev_majority"]
                for e in summary["models"].values()
                if e["tasks"][t]["data"] is not None
            ),
            None,
        )
        for t in tasks
    }
    lines.append(
        "| majority class | "
        + " | ".join("-" if majority[t] is None else f"{100 * majority[t][m]:.1f}" for t, m in cols)
        + " |"
    )
    for name, entry in summary["models"].items():
        cells = []
        for t, m in cols:
            s = entry["tasks"][t]["metrics"][m]
            ci = "" if s is None or s.get("ci95") is None else f" [{100 * s['ci95'][0]:.1f}, {100 * s['ci95'][1]:.1f}]"
            cells.append("-" if s is None else f"{100 * s['mean']:.1f}{ci}{_n(s['n'], planned)}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for name, diffs in summary["differences"].items():
        cells = []
        for t, m in cols:
            d = diffs[t][m]
            ci = "" if d is None or d["ci95"] is None else f" [{100 * d['ci95'][0]:+.1f}, {100 * d['ci95'][1]:+.1f}]"
            cells.append("-" if d is None else f"{100 * d['mean']:+.1f}{ci}{_n(d['n'], planned)}")
        lines.append(f"| {name} − {summary['baseline']} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        f"Dev-set scores ×100 (MCC for CoLA), mean over {planned} fine-tuning seeds (n: fewer finished) "
        "with its 95% Student-t interval; differences are paired by seed, with 95% Student-t intervals."
    )
    missing = [
        f"{name} {t} (" + ", ".join(f"seed {x['seed']}: {x['status']}" for x in e["tasks"][t]["missing"]) + ")"
        for name, e in summary["models"].items()
        for t in tasks
        if e["tasks"][t]["missing"]
    ]
    if missing:
        lines.append(
            f"Incomplete: {'; '.join(missing)}. Those cells are over the finished seeds only (n shown); "
            "run the same command again to finish them."
        )
    return "\n".join(lines)
