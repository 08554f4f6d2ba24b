"""MQAR sweep results: best accuracy over learning rates, the summary JSON, the accuracy table and the figure.

Source: Zoology arXiv:2312.04927 (the best final accuracy over a learning-rate sweep is reported per model);
``docs/METHOD.md`` section 6.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from coupled_qk.experiments.mqar.presets import Difficulty, SweepPreset, mqar_variants
from coupled_qk.experiments.runner import Report, RunRecord

__all__ = ["accuracy_table", "best_over_lr", "plot_sweep", "sweep_record", "sweep_report", "sweep_summary"]


def sweep_record(record: RunRecord) -> dict:
    """One run of a sweep as a flat dict: its coordinates (``difficulty, variant, d_model, lr``), ``n_heads``,
    ``params``, ``accuracy`` (final, full test set), per-slice ``slices``, ``steps``, ``max_steps``,
    ``stop_reason``, ``train_seconds``, ``seconds`` (this invocation), ``status``, ``run_dir`` and ``config``."""
    results, cfg = record.results, record.config
    final = results.get("final", {})
    return {
        **{k: record.keys[k] for k in ("difficulty", "variant", "d_model", "lr")},
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
    return Report(json={"results.json": summary, "summary.json": compact},
                  plots={f"mqar-{preset.name}.png": lambda path: plot_sweep(summary, path)})


def _in_variant_order(names) -> list[str]:
    """``names`` in :func:`~coupled_qk.experiments.mqar.presets.mqar_variants` order, other specs after them alphabetically."""
    rank = {v: i for i, v in enumerate(mqar_variants())}
    return sorted(set(names), key=lambda v: (rank.get(v, len(rank)), v))


def best_over_lr(records: Sequence[dict]) -> list[dict]:
    """Best final accuracy over learning rates for each (difficulty, variant, d_model).

    Args:
        records: run records with keys ``difficulty, variant, d_model, lr, accuracy, status`` (others are
            carried along from the best run). Records with status ``skipped`` or ``interrupted`` or without an
            accuracy are ignored; ties go to the earliest record.

    Returns:
        One dict per group, in first-seen order: ``difficulty, variant, d_model, accuracy, lr`` (the best),
        ``accuracies`` (``{lr: accuracy}`` over all finished learning rates), ``steps``, ``slices``,
        ``n_heads``, ``params``.
    """
    groups: dict[tuple, dict] = {}
    for r in records:
        if r.get("status") in ("skipped", "interrupted") or r.get("accuracy") is None:
            continue
        key = (r["difficulty"], r["variant"], r["d_model"])
        g = groups.get(key)
        if g is None:
            g = groups[key] = {"difficulty": key[0], "variant": key[1], "d_model": key[2], "accuracy": -1.0,
                               "accuracies": {}}
        g["accuracies"][f"{r['lr']:.3g}"] = r["accuracy"]
        if r["accuracy"] > g["accuracy"]:
            g.update(accuracy=r["accuracy"], lr=r["lr"], steps=r.get("steps"), slices=r.get("slices", {}),
                     n_heads=r.get("n_heads"), params=r.get("params"))
    return list(groups.values())


def sweep_summary(preset: SweepPreset, records: Sequence[dict], wall_seconds: float | None = None) -> dict:
    """The sweep's results: preset, every run, the best-over-lr table and its text rendering.

    Returns:
        ``{"preset", "source", "wall_seconds", "runs", "best", "table", "counts"}`` where ``counts`` counts runs
        by status (``ran``, ``reused``, ``interrupted``, ``skipped``).
    """
    best = best_over_lr(records)
    counts: dict[str, int] = {}
    for r in records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return {
        "preset": preset.to_dict(),
        "source": "Zoology arXiv:2312.04927 protocol (docs/METHOD.md section 6); coupled_qk mqar sweep",
        "wall_seconds": wall_seconds,
        "counts": counts,
        "runs": list(records),
        "best": best,
        "table": accuracy_table(best, [d.name for d in preset.difficulties]),
    }


def accuracy_table(best: Sequence[dict], difficulty_order: Sequence[str] | None = None) -> str:
    """Text table of best-over-lr accuracy: one row per variant, one column per (difficulty, d_model).

    Args:
        best: output of :func:`best_over_lr`.
        difficulty_order: column order of difficulties (default: first-seen order).

    Returns:
        A Markdown table (``-`` where a cell has no finished run); variants in :func:`~coupled_qk.experiments.mqar.presets.mqar_variants` order.
    """
    diffs = list(difficulty_order or [])
    for b in best:
        if b["difficulty"] not in diffs:
            diffs.append(b["difficulty"])
    present = {b["difficulty"] for b in best}
    diffs = [d for d in diffs if d in present]
    columns = [(d, m) for d in diffs for m in sorted({b["d_model"] for b in best if b["difficulty"] == d})]
    variants = _in_variant_order(b["variant"] for b in best)
    cell = {(b["variant"], b["difficulty"], b["d_model"]): b["accuracy"] for b in best}
    header = "| variant | " + " | ".join(f"{d} d{m}" for d, m in columns) + " |"
    lines = [header, "|" + "---|" * (len(columns) + 1)]
    for v in variants:
        vals = [cell.get((v, d, m)) for d, m in columns]
        lines.append(f"| {v} | " + " | ".join("-" if x is None else f"{x:.3f}" for x in vals) + " |")
    return "\n".join(lines)


def plot_sweep(summary: dict, path: str | Path) -> Path:
    """Accuracy (best over learning rates) vs d_model, one panel per difficulty, one line per variant (PNG).

    Uses matplotlib's Agg backend (no display needed). Returns the written path.

    Raises:
        ImportError: if matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    best = summary["best"]
    diffs = []
    for b in best:
        if b["difficulty"] not in diffs:
            diffs.append(b["difficulty"])
    order = [d["name"] for d in summary["preset"]["difficulties"]]
    diffs.sort(key=lambda d: order.index(d) if d in order else len(order))
    labels = {d["name"]: Difficulty(**{**d, "train_slices": d["train_slices"], "test_slices": d["test_slices"]}).label
              for d in summary["preset"]["difficulties"]}
    n = max(1, len(diffs))
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.6), sharey=True, squeeze=False)
    variants = _in_variant_order({b["variant"] for b in best})
    for ax, diff in zip(axes[0], diffs):
        for v in variants:
            pts = sorted((b["d_model"], b["accuracy"]) for b in best if b["difficulty"] == diff and b["variant"] == v)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=v)
        ax.set_xscale("log", base=2)
        widths = sorted({b["d_model"] for b in best if b["difficulty"] == diff})
        ax.set_xticks(widths, [str(w) for w in widths])
        ax.minorticks_off()
        ax.set_title(labels.get(diff, diff), fontsize=10)
        ax.set_xlabel("d_model")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("MQAR accuracy (best lr)")
    fig.suptitle(f"MQAR sweep '{summary['preset']['name']}' (best accuracy over learning rates)", fontsize=11)
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
