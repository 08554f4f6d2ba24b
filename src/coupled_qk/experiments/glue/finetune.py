"""Fine-tune pretrained checkpoints on GLUE tasks over seeds, reuse finished runs, summarise (METHOD.md claim C11).

Each fine-tune is one run of the training loop in ``out_dir/<model>/<task>/seed<k>``, planned and executed by
the experiment runner (:mod:`coupled_qk.experiments.runner`: resumable like training; a finished run with the
same settings is reused). :func:`run_glue` writes ``out_dir/results.json`` (structure in its docstring) and
``out_dir/results.md``.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from coupled_qk._checks import finite, positive_int
from coupled_qk.data.glue import GLUE_TASKS, TASK_INFO, check_task, load_glue
from coupled_qk.experiments.runner import PlannedRun, Report, execute, write_report
from coupled_qk.extras import MissingExtra
from coupled_qk.training.config import TrainConfig

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
        raise ValueError(f"{option}={names!r}: {bad!r} cannot name a folder of fine-tuning runs; expected non-empty "
                         "labels without '/' or '\\' that do not start with '.'")
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
        raise ValueError(f"{flag}={text!r}: expected an integer >= 1 or task=N pairs, e.g. sst2=3000,rte=600{why}") \
            from None


def finetune_config(pretrained: str, task: str, seed: int, out_dir: str | Path, glue_dir: str | None = None,
                    lr: float | None = None, epochs: float | None = None, batch_size: int | None = None,
                    max_train_examples: int | None = None, pooling: str = "last", **fields) -> TrainConfig:
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
    base = dict(task="glue", lr=lr, batch_size=batch_size, max_steps=steps, warmup_steps=max(1, steps // 10),
                min_lr_ratio=0.0, weight_decay=0.01, eval_interval=steps, log_interval=max(1, steps // 20),
                seed=seed, out_dir=str(out_dir), task_options=options, tensorboard=False)
    return TrainConfig.from_dict({**base, **fields})


def model_name(run_dir: str | Path) -> str:
    """A label for a pretrained run: its folder name, or the parent's when the folder is ``seed<k>``."""
    path = Path(run_dir).resolve()
    path = path.parent if path.name.startswith("ckpt-") else path
    return path.parent.name if path.name.startswith("seed") else path.name


def _stats():
    """:mod:`coupled_qk.experiments.stats` (needs scipy, an optional dependency: the [glue] extra)."""
    try:
        from coupled_qk.experiments import stats
    except ImportError as exc:
        raise MissingExtra("GLUE summaries need scipy: pip install 'coupled-qk[glue]'") from exc
    return stats


def _summary(values: list[float]) -> dict:
    """Mean, std, range and the 95% Student-t interval of the mean (``ci95``: ``None`` for one seed)."""
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    ci = _stats().mean_ci(values)
    return {"mean": statistics.fmean(values), "std": std, "min": min(values), "max": max(values),
            "ci95": [ci["low"], ci["high"]] if len(values) > 1 else None, "values": values}


def paired_difference(a: list[float], b: list[float]) -> dict:
    """Mean of ``a_i - b_i`` with a two-sided 95% Student-t interval
    (:func:`coupled_qk.experiments.stats.paired_difference`); ``ci95`` is ``None`` for n < 2.

    Raises:
        ValueError: ``a`` and ``b`` of different lengths, empty or non-finite.
    """
    d = _stats().paired_difference(b, a)  # stats' difference is its second argument minus its first
    return {"mean": d["mean"], "ci95": [d["low"], d["high"]] if d["n"] > 1 else None, "n": d["n"],
            "values": d["differences"]}


def run_glue(pretrained: list[str], tasks: list[str], seeds: list[int], out_dir: str | Path,
             names: list[str] | None = None, **options) -> dict:
    """Fine-tune every ``pretrained x task x seed`` and summarise; the first model is the baseline.

    ``options`` go to :func:`finetune_config`; ``max_train_examples`` may also be a ``{task: N}`` dict.

    Returns (and writes to ``out_dir/results.json``)::

        {"schema": SCHEMA, "tasks": [...], "seeds": [...], "baseline": name, "settings": {task: config},
         "models": {name: {"pretrained": path, "attention": str, "tasks": {task: {
             "metrics": {metric: {"mean", "std", "min", "max", "values"}},   # dev set, one value per seed
             "runs": [{"seed", "run_dir", "dev": {...}, "train_seconds"}], "data": {...}}}}},
         "differences": {name: {task: {metric: {"mean", "ci95", "n", "values"}}}}}  # name - baseline, paired by seed

    Metrics are fractions (accuracy, F1) or the Matthews correlation in [-1, 1].
    """
    if names is None:
        names = check_names([model_name(p) for p in pretrained], len(pretrained),
                            "the runs' folder names (--names to label them)")
    check_names(names, len(pretrained))
    report_dir, out_dir = out_dir, Path(out_dir)  # report_dir may be a command's OutputDir claim
    per_task = options.pop("max_train_examples", None)
    plan = []
    for name, path in zip(names, pretrained, strict=True):
        for task in tasks:
            subset = per_task.get(task) if isinstance(per_task, dict) else per_task
            for seed in seeds:
                cfg = finetune_config(path, task, seed, out_dir / name / task / f"seed{seed}",
                                      max_train_examples=subset, **options)
                plan.append(PlannedRun(cfg, f"{name} {task} seed {seed}", {"model": name, "task": task, "seed": seed}))
    records = execute(plan)
    summary: dict = {"schema": SCHEMA, "tasks": tasks, "seeds": seeds, "baseline": names[0], "settings": {},
                     "models": {}, "differences": {}}
    for name, path in zip(names, pretrained, strict=True):
        entry = {"pretrained": str(path), "tasks": {}}
        for task in tasks:
            runs = []
            for rec in (r for r in records if r.keys["model"] == name and r.keys["task"] == task):
                res = rec.results
                summary["settings"].setdefault(task, {k: v for k, v in rec.run.config.to_dict().items()
                                                      if k not in ("seed", "out_dir", "task_options")})
                dev = {k.removeprefix("dev/"): v for k, v in res["final"].items()}
                runs.append({"seed": rec.keys["seed"], "run_dir": rec.run.config.out_dir, "dev": dev,
                             "train_seconds": res["train_seconds"]})
                entry["attention"] = res["model_config"]["attention"]
                data = res["data"]
            metrics = {m: _summary([r["dev"][m] for r in runs]) for m in TASK_INFO[task][3]}
            entry["tasks"][task] = {"metrics": metrics, "runs": runs, "data": data}
        summary["models"][name] = entry
    base = summary["models"][names[0]]
    for name in names[1:]:
        summary["differences"][name] = {
            task: {m: paired_difference(summary["models"][name]["tasks"][task]["metrics"][m]["values"],
                                        base["tasks"][task]["metrics"][m]["values"]) for m in TASK_INFO[task][3]}
            for task in tasks
        }
    write_report(report_dir, Report(json={"results.json": summary}, text={"results.md": format_table(summary) + "\n"}))
    return summary


def format_table(summary: dict) -> str:
    """Markdown: dev metric mean over seeds with its 95% t-interval (one seed: the value) per model and task, the
    majority-class baseline, and the paired difference to the baseline model with its 95% t-interval (in
    percentage points)."""
    tasks = summary["tasks"]
    cols = [(t, m) for t in tasks for m in TASK_INFO[t][3]]
    head = "| model | " + " | ".join(f"{t.upper()} {m}" for t, m in cols) + " |"
    lines = [head, "|" + "---|" * (len(cols) + 1)]
    any_model = next(iter(summary["models"].values()))
    lines.append("| majority class | " + " | ".join(
        f"{100 * any_model['tasks'][t]['data']['dev_majority'][m]:.1f}" for t, m in cols) + " |")
    for name, entry in summary["models"].items():
        cells = []
        for t, m in cols:
            s = entry["tasks"][t]["metrics"][m]
            ci = "" if s.get("ci95") is None else f" [{100 * s['ci95'][0]:.1f}, {100 * s['ci95'][1]:.1f}]"
            cells.append(f"{100 * s['mean']:.1f}{ci}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for name, diffs in summary["differences"].items():
        cells = []
        for t, m in cols:
            d = diffs[t][m]
            ci = "" if d["ci95"] is None else f" [{100 * d['ci95'][0]:+.1f}, {100 * d['ci95'][1]:+.1f}]"
            cells.append(f"{100 * d['mean']:+.1f}{ci}")
        lines.append(f"| {name} − {summary['baseline']} | " + " | ".join(cells) + " |")
    n = len(summary["seeds"])
    lines.append("")
    lines.append(f"Dev-set scores ×100 (MCC for CoLA), mean over {n} fine-tuning seeds with its 95% Student-t "
                 "interval; differences are paired by seed, with 95% Student-t intervals.")
    return "\n".join(lines)
