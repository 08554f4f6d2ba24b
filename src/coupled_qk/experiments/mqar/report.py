"""MQAR sweep results: best accuracy over learning rates, the summary JSON, the accuracy table and the figure.

Source: Zoology arXiv:2312.04927 (the best final accuracy over a learning-rate sweep is reported per model);
``docs/METHOD.md`` section 6.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from coupled_qk.experiments.mqar.presets import Difficulty, SweepPreset, mqar_variants
from coupled_qk.extras import MissingExtra
from coupled_qk.study.executor import Report, RunRecord
from coupled_qk.training.run_folder import RESULTS_FILE

__all__ = [
    "accuracy_table",
    "best_over_lr",
    "plot_sweep",
    "seed_cells",
    "seed_table",
    "sweep_record",
    "sweep_report",
    "sweep_summary",
]


def sweep_record(record: RunRecord) -> dict:
    """One run of a sweep as a flat dict: its coordinates (``difficulty, variant, d_model, lr, seed``), ``n_heads``,
    ``params``, ``accuracy`` (final, full test set), per-slice ``slices``, ``steps``, ``max_steps``,
    ``stop_reason``, ``train_seconds``, ``seconds`` (this invocation), ``status``, ``run_dir`` and ``config``."""
    results, cfg = record.results, record.config
    final = results.get("final", {})
    return {
        **{k: record.keys[k] for k in ("difficulty", "variant", "d_model", "lr")},
        "seed": record.keys.get("seed", cfg.seed),
        "n_heads": results.get("model_config", {}).get("n_heads"),
        "params": results.get("params"),
        "accuracy": final.get("valid/accuracy"),
        "slices": {k.split("/", 2)[2]: v for k, v in final.items() if k.startswith("valid/accuracy/")},
        "steps": results.get("steps"),
        "max_steps": cfg.max_steps,
        "stop_reason": results.get("stop_reason"),
        "train_seconds": results.get("train_seconds"),
        "seconds": record.seconds,
        "status": record.status,
        "run_dir": cfg.out_dir,
        "config": cfg.to_dict(),
    }


def sweep_report(preset: SweepPreset, records: Sequence[RunRecord], wall_seconds: float | None = None) -> Report:
    """The sweep's files: ``results.json`` (:func:`sweep_summary`), ``summary.json`` (the same without each
    run's config and folder) and ``mqar-<preset>.png`` (:func:`plot_sweep`)."""
    summary = sweep_summary(preset, [sweep_record(r) for r in records], wall_seconds)
    compact = {k: v for k, v in summary.items() if k != "runs"}
    compact["runs"] = [{k: v for k, v in r.items() if k not in ("config", "run_dir")} for r in summary["runs"]]
    return Report(
        json={RESULTS_FILE: summary, "summary.json": compact},
        plots={f"mqar-{preset.name}.png": lambda path: plot_sweep(summary, path)},
    )


def _in_variant_order(names) -> list[str]:
    """``names`` in :func:`~coupled_qk.experiments.mqar.presets.mqar_variants` order, other specs after them
    alphabetically."""
    rank = {v: i for i, v in enumerate(mqar_variants())}
    return sorted(set(names), key=lambda v: (rank.get(v, len(rank)), v))


def best_over_lr(records: Sequence[dict]) -> list[dict]:
    """Best final accuracy over learning rates for each (difficulty, variant, d_model, seed).

    Args:
        records: run records with keys ``difficulty, variant, d_model, lr, accuracy, status`` and optionally
            ``seed`` (others are carried along from the best run). Records with status ``skipped`` or
            ``interrupted`` or without an accuracy are ignored; ties go to the earliest record.

    Returns:
        One dict per group, in first-seen order: ``difficulty, variant, d_model, seed, accuracy, lr`` (the best),
        ``accuracies`` (``{lr: accuracy}`` over all finished learning rates), ``steps``, ``slices``,
        ``n_heads``, ``params``.
    """
    groups: dict[tuple, dict] = {}
    for r in records:
        if r.get("status") in ("skipped", "interrupted") or r.get("accuracy") is None:
            continue
        key = (r["difficulty"], r["variant"], r["d_model"], r.get("seed"))
        g = groups.get(key)
        if g is None:
            g = groups[key] = {
                "difficulty": key[0],
                "variant": key[1],
                "d_model": key[2],
                "seed": key[3],
                "accuracy": -1.0,
                "accuracies": {},
            }
        g["accuracies"][f"{r['lr']:.3g}"] = r["accuracy"]
        if r["accuracy"] > g["accuracy"]:
            g.update(
                accuracy=r["accuracy"],
                lr=r["lr"],
                steps=r.get("steps"),
                slices=r.get("slices", {}),
                n_heads=r.get("n_heads"),
                params=r.get("params"),
            )
    return list(groups.values())


def _interval(result: dict) -> dict:
    """``n, mean, low, high`` of a :mod:`coupled_qk.study.stats` result, ``None`` for NaN (one seed)."""
    return {
        k: (None if isinstance(result[k], float) and math.isnan(result[k]) else result[k])
        for k in ("n", "mean", "low", "high")
    }


def seed_cells(best: Sequence[dict], reference: str = "standard") -> list[dict]:
    """Each (difficulty, variant, d_model) cell over seeds: the mean of the seeds' best-over-lr accuracies with its
    95% Student-t interval, and the paired difference ``variant - reference`` over the seeds both finished.

    Args:
        best: output of :func:`best_over_lr` (one entry per seed).
        reference: the variant the differences are taken against.

    Returns:
        One dict per cell, in first-seen order: ``difficulty, variant, d_model, seeds, values`` (by seed),
        ``n, mean, low, high`` (:func:`coupled_qk.study.stats.mean_ci`; ``low``/``high`` ``None`` for one
        seed) and ``vs_reference``: ``None`` for the reference itself or a cell without it, else ``{"reference",
        "seeds", "n", "mean", "low", "high"}`` (:func:`coupled_qk.study.stats.paired_difference`).

    Raises:
        ImportError: scipy is missing (the ``claims`` extra).
    """
    try:
        from coupled_qk.study import stats
    except ImportError as exc:  # scipy: an optional dependency
        raise MissingExtra(
            "MQAR sweeps over several seeds need scipy for their intervals: pip install 'coupled-qk[claims]'"
        ) from exc
    groups: dict[tuple, dict] = {}
    for b in best:
        key = (b["difficulty"], b["variant"], b["d_model"])
        groups.setdefault(key, {})[b["seed"]] = b["accuracy"]
    cells = []
    for (diff, variant, d_model), by_seed in groups.items():
        seeds = sorted(by_seed)
        cell = {
            "difficulty": diff,
            "variant": variant,
            "d_model": d_model,
            "seeds": seeds,
            "values": [by_seed[s] for s in seeds],
            **_interval(stats.mean_ci([by_seed[s] for s in seeds])),
            "vs_reference": None,
        }
        ref = groups.get((diff, reference, d_model))
        shared = [s for s in seeds if ref is not None and s in ref]
        if variant != reference and shared:
            d = stats.paired_difference([ref[s] for s in shared], [by_seed[s] for s in shared])
            cell["vs_reference"] = {"reference": reference, "seeds": shared, **_interval(d)}
        cells.append(cell)
    return cells


def sweep_summary(preset: SweepPreset, records: Sequence[dict], wall_seconds: float | None = None) -> dict:
    """The sweep's results: preset, seeds, every run, the best-over-lr table and its text rendering.

    Returns:
        ``{"preset", "source", "seeds", "wall_seconds", "runs", "best", "table", "counts"}`` where ``best`` has one
        entry per seed and ``counts`` counts runs by status (``ran``, ``reused``, ``interrupted``, ``skipped``);
        with several seeds also ``cells`` (:func:`seed_cells`), and ``table`` is :func:`seed_table`'s.
    """
    best = best_over_lr(records)
    counts: dict[str, int] = {}
    for r in records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    seeds = sorted({r.get("seed") for r in records if r.get("seed") is not None})
    order = [d.name for d in preset.difficulties]
    extra = {}
    if len(seeds) > 1:
        extra["cells"] = seed_cells(best)
        extra["table"] = seed_table(extra["cells"], seeds, order)
    return {
        "preset": preset.to_dict(),
        "source": "Zoology arXiv:2312.04927 protocol (docs/METHOD.md section 6); coupled_qk mqar sweep",
        "seeds": seeds,
        "wall_seconds": wall_seconds,
        "counts": counts,
        "runs": list(records),
        "best": best,
        "table": accuracy_table(best, order),
        **extra,
    }


def accuracy_table(best: Sequence[dict], difficulty_order: Sequence[str] | None = None) -> str:
    """Text table of best-over-lr accuracy: one row per variant, one column per (difficulty, d_model).

    Args:
        best: output of :func:`best_over_lr`.
        difficulty_order: column order of difficulties (default: first-seen order).

    Returns:
        A Markdown table (``-`` where a cell has no finished run); variants in
        :func:`~coupled_qk.experiments.mqar.presets.mqar_variants` order.
    """
    columns, variants, lines = _layout(best, difficulty_order)
    cell = {(b["variant"], b["difficulty"], b["d_model"]): b["accuracy"] for b in best}
    for v in variants:
        vals = [cell.get((v, d, m)) for d, m in columns]
        lines.append(f"| {v} | " + " | ".join("-" if x is None else f"{x:.3f}" for x in vals) + " |")
    return "\n".join(lines)


def _layout(entries: Sequence[dict], difficulty_order) -> tuple[list, list, list[str]]:
    """The columns ``(difficulty, d_model)``, the variants (rows) and the header lines of a sweep table."""
    diffs = list(difficulty_order or [])
    for b in entries:
        if b["difficulty"] not in diffs:
            diffs.append(b["difficulty"])
    present = {b["difficulty"] for b in entries}
    diffs = [d for d in diffs if d in present]
    columns = [(d, m) for d in diffs for m in sorted({b["d_model"] for b in entries if b["difficulty"] == d})]
    header = "| variant | " + " | ".join(f"{d} d{m}" for d, m in columns) + " |"
    return columns, _in_variant_order(b["variant"] for b in entries), [header, "|" + "---|" * (len(columns) + 1)]


def _estimate(e: dict | None, n_seeds: int, sign: str = "") -> str:
    """``mean [low, high]`` (``(n=k)`` added where fewer than ``n_seeds`` seeds finished), ``-`` for none."""
    if e is None:
        return "-"
    text = f"{e['mean']:{sign}.3f}"
    if e["low"] is not None:
        text += f" [{e['low']:{sign}.3f}, {e['high']:{sign}.3f}]"
    return text + (f" (n={e['n']})" if e["n"] < n_seeds else "")


def seed_table(
    cells: Sequence[dict],
    seeds: Sequence[int],
    difficulty_order: Sequence[str] | None = None,
    reference: str = "standard",
) -> str:
    """Markdown table of a sweep over several seeds: per variant and (difficulty, d_model) the mean best-over-lr
    accuracy with its 95% interval, then one row per variant with its paired difference against ``reference``.

    Args:
        cells: output of :func:`seed_cells`.
        seeds: the sweep's seeds (a cell with fewer finished seeds is marked ``(n=k)``).
        difficulty_order: column order of difficulties (default: first-seen order).

    Returns:
        The table and a line saying what it shows (``-`` where a cell has no finished run).
    """
    columns, variants, lines = _layout(cells, difficulty_order)
    by = {(c["variant"], c["difficulty"], c["d_model"]): c for c in cells}
    for v in variants:
        lines.append(f"| {v} | " + " | ".join(_estimate(by.get((v, d, m)), len(seeds)) for d, m in columns) + " |")
    for v in variants:
        diffs = [(by.get((v, d, m)) or {}).get("vs_reference") for d, m in columns]
        if any(diffs):
            lines.append(f"| {v} − {reference} | " + " | ".join(_estimate(x, len(seeds), "+") for x in diffs) + " |")
    lines.append(
        f"\nBest accuracy over learning rates of each seed ({', '.join(map(str, seeds))}): mean with a 95% "
        f"Student-t interval over seeds; differences against {reference} paired by seed."
    )
    return "\n".join(lines)


def plot_sweep(summary: dict, path: str | Path) -> Path:
    """Accuracy (best over learning rates) vs d_model, one panel per difficulty, one line per variant (PNG); over
    several seeds (``summary["cells"]``) the mean with its 95% interval as error bars.

    Uses matplotlib's Agg backend (no display needed). Returns the written path.

    Raises:
        ImportError: if matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    best = [{**c, "accuracy": c["mean"]} for c in summary["cells"]] if "cells" in summary else summary["best"]
    diffs = []
    for b in best:
        if b["difficulty"] not in diffs:
            diffs.append(b["difficulty"])
    order = [d["name"] for d in summary["preset"]["difficulties"]]
    diffs.sort(key=lambda d: order.index(d) if d in order else len(order))
    labels = {
        d["name"]: Difficulty(**{**d, "train_slices": d["train_slices"], "test_slices": d["test_slices"]}).label
        for d in summary["preset"]["difficulties"]
    }
    n = max(1, len(diffs))
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.6), sharey=True, squeeze=False)
    variants = _in_variant_order({b["variant"] for b in best})
    for ax, diff in zip(axes[0], diffs):
        for v in variants:
            pts = sorted(
                (b["d_model"], b["accuracy"], b.get("low"), b.get("high"))
                for b in best
                if b["difficulty"] == diff and b["variant"] == v
            )
            if pts:
                err = [
                    [p[1] - p[2] if p[2] is not None else 0.0 for p in pts],
                    [p[3] - p[1] if p[3] is not None else 0.0 for p in pts],
                ]
                ax.errorbar(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    yerr=err if "cells" in summary else None,
                    marker="o",
                    label=v,
                    capsize=3,
                )
        ax.set_xscale("log", base=2)
        widths = sorted({b["d_model"] for b in best if b["difficulty"] == diff})
        ax.set_xticks(widths, [str(w) for w in widths])
        ax.minorticks_off()
        ax.set_title(labels.get(diff, diff), fontsize=10)
        ax.set_xlabel("d_model")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("MQAR accuracy (best lr)")
    over = f"; mean and 95% interval over seeds {', '.join(map(str, summary['seeds']))}" if "cells" in summary else ""
    fig.suptitle(f"MQAR sweep '{summary['preset']['name']}' (best accuracy over learning rates{over})", fontsize=11)
    if variants:
        handles, names = axes[0][0].get_legend_handles_labels()
        for ax in axes[0][1:]:
            for h, name in zip(*ax.get_legend_handles_labels()):
                if name not in names:
                    handles.append(h)
                    names.append(name)
        fig.legend(handles, names, loc="center right", fontsize=8)
        fig.tight_layout(rect=(0, 0, 0.84, 1))
    else:
        fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
