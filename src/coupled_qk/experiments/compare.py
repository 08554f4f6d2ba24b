"""Compare attention variants under identical seeds, data order and token budget; table and loss-curve plot.

The protocol: one run per ``variant x seed`` from a base :class:`TrainConfig` (only the model's attention
fields and the seed change), executed by the shared runner (:mod:`coupled_qk.experiments.runner`: finished
runs with the same settings are reused, interrupted ones resume), then summarised per variant: mean and
standard deviation over seeds of the final perplexities, the change against ``standard``, parameters.
Used by ``coupled-qk compare`` and ``coupled-qk demo``; ``docs/METHOD.md`` section 5 (perplexity).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable
from pathlib import Path

from coupled_qk.experiments.runner import PlannedRun, Report, RunRecord, run_experiment
from coupled_qk.models.specs import parse_variants, variant_overrides
from coupled_qk.training.config import TrainConfig
from coupled_qk.training.rundir import RunDir

__all__ = ["analyze_comparison", "comparison_table", "plan_comparison", "plot_loss_curves", "run_comparison"]

METRICS = ("valid/perplexity", "test/perplexity", "valid/word_perplexity", "test/word_perplexity",
           "valid/bits_per_byte", "test/bits_per_byte")


def _summary(values: list[float]) -> dict:
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": mean, "std": std, "values": values}


def plan_comparison(base: TrainConfig, variants: list[str], seeds: list[int], out_dir: str | Path) -> list[PlannedRun]:
    """One run per ``variant x seed`` (variant-major), in ``out_dir/<variant>/seed<k>``.

    Each run is ``base`` with the variant's model overrides (:func:`coupled_qk.models.variants.variant_overrides`)
    and ``seed``; ``keys`` are ``{"variant", "seed"}``.

    Raises:
        ValueError: an unknown variant spec, or a resulting invalid configuration.
    """
    plan = []
    for variant in parse_variants(variants):
        overrides = variant_overrides(variant)
        for seed in seeds:
            run_dir = Path(out_dir) / variant / f"seed{seed}"
            cfg = dataclasses.replace(base, seed=seed, out_dir=str(run_dir), model={**base.model, **overrides})
            plan.append(PlannedRun(cfg, f"{variant} seed {seed}", {"variant": variant, "seed": seed}))
    return plan


def analyze_comparison(records: list[RunRecord], base: TrainConfig, seeds: list[int]) -> Report:
    """The comparison's summary (``results.json``), markdown table (``results.md``) and ``loss_curves.png``.

    Returns:
        A :class:`Report` whose ``results.json`` is ``{"base_config", "seeds", "variants": {name: {"overrides",
        "runs": [{"seed", "run_dir", "final", "params", "tokens", "train_seconds"}], "valid_perplexity":
        {"mean", "std", "values"}, "test_perplexity", ..., "params", "minutes"}}}``.
    """
    summary: dict = {"base_config": base.to_dict(), "seeds": seeds, "variants": {}}
    for record in records:
        variant = record.keys["variant"]
        entry = summary["variants"].setdefault(variant, {"overrides": variant_overrides(variant), "runs": []})
        r = record.results
        entry["runs"].append({"seed": record.keys["seed"], "run_dir": str(record.run.run_dir.path),
                              "final": r["final"], "params": r["params"], "tokens": r["tokens"],
                              "train_seconds": r["train_seconds"]})
    for entry in summary["variants"].values():
        runs = entry["runs"]
        for key in METRICS:
            vals = [r["final"][key] for r in runs if key in r["final"]]
            if vals:
                entry[key.replace("/", "_")] = _summary(vals)
        entry["params"] = runs[0]["params"]
        entry["minutes"] = statistics.fmean(r["train_seconds"] for r in runs) / 60
    return Report(
        json={"results.json": summary},
        text={"results.md": comparison_table(summary) + "\n"},
        plots={"loss_curves.png": lambda path: plot_loss_curves(summary, path)},
    )


def run_comparison(base: TrainConfig, variants: list[str], seeds: list[int], out_dir: str | Path,
                   train_fn: Callable | None = None, log: Callable[[str], None] | None = None) -> dict:
    """Train every ``variant x seed`` from ``base`` (same data order per seed, same budget) and summarise.

    Each run goes to ``out_dir/<variant>/seed<k>``; a finished run (``results.json`` present) with the same
    settings is reused (different settings raise ``ValueError`` naming them), an interrupted one resumes.
    Writes ``out_dir/results.json``, ``results.md`` and ``loss_curves.png``.

    Args:
        train_fn: the training function (default :func:`coupled_qk.training.loop.train`).
        log: receives progress lines (default: ``print`` with flush).

    Returns:
        The summary written to ``results.json`` (see :func:`analyze_comparison`).
    """
    log = log or (lambda line: print(line, flush=True))
    plan = plan_comparison(base, variants, seeds, out_dir)
    _, report = run_experiment(plan, lambda records, _: analyze_comparison(records, base, seeds), out_dir,
                               train_fn=train_fn, log=log)
    return report.json["results.json"]


def comparison_table(summary: dict) -> str:
    """Markdown table: per variant, perplexities per token and per word and bits per byte of the test split
    (mean +- std over seeds), change vs standard, parameters. Runs whose final evaluation scored only a
    subsample of the splits (``task_options.final_eval_windows``, ``demo --quick``) get a line saying so."""
    variants = summary["variants"]
    ref = variants.get("standard", {}).get("test_perplexity", {}).get("mean")

    def cell(entry, key, digits=2):
        s = entry.get(key)
        if not s:
            return "-"
        return (f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}" if len(s["values"]) > 1
                else f"{s['mean']:.{digits}f}")

    lines = [
        "| variant | valid ppl | test ppl | test word ppl | test bits/byte | test vs standard | params | tokens | "
        "minutes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, e in variants.items():
        test = e.get("test_perplexity", {}).get("mean")
        delta = f"{100 * (test / ref - 1):+.1f}%" if ref and test else "-"
        lines.append(
            f"| {name} | {cell(e, 'valid_perplexity')} | {cell(e, 'test_perplexity')} | "
            f"{cell(e, 'test_word_perplexity')} | {cell(e, 'test_bits_per_byte', 4)} | {delta} | {e['params']:,} | "
            f"{e['runs'][0]['tokens']:,} | {e['minutes']:.1f} |"
        )
    windows = sorted({r["final"]["test/subsample_windows"] for e in variants.values() for r in e["runs"]
                      if "test/subsample_windows" in (r.get("final") or {})})
    if windows:
        lines.append(f"\nSmoke run: valid and test scored on their first {', '.join(map(str, windows))} windows "
                     "only (a subsample, not the whole splits); not comparable with full evaluations.")
    return "\n".join(lines)


LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def plot_loss_curves(summary: dict, path: str | Path) -> None:
    """Training loss (smoothed) and validation loss against training tokens, one style per variant.

    Each variant has its own colour, line style and marker, so variants whose curves coincide (Euler and
    leapfrog often do) stay visible. The validation curve during training is an estimate on the first
    ``eval_batches x batch_size`` windows of the validation split (the title says so); the final full-split
    validation loss of each run is drawn as a star at its last token count.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = summary.get("base_config", {})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, (name, entry) in enumerate(summary["variants"].items()):
        style = dict(color=f"C{i % 10}", linestyle=LINE_STYLES[i % len(LINE_STYLES)], marker=MARKERS[i % len(MARKERS)])
        for j, run in enumerate(entry["runs"]):
            records = RunDir(run["run_dir"]).read_metrics()
            train_pts = [(r["tokens"], r["train/loss"]) for r in records if "train/loss" in r]
            valid_pts = [(r["tokens"], r["valid/loss"]) for r in records if "valid/loss" in r]
            label = name if j == 0 else None
            if train_pts:
                xs, ys = zip(*train_pts)
                axes[0].plot(xs, _smooth(ys), alpha=0.8, label=label, markevery=max(1, len(xs) // 8), ms=4, **style)
            if valid_pts:
                xs, ys = zip(*valid_pts)
                axes[1].plot(xs, ys, alpha=0.8, label=label, ms=4, **style)
            final = (run.get("final") or {}).get("valid/loss")
            if final is not None and run.get("tokens"):
                axes[1].plot([run["tokens"]], [final], marker="*", ms=11, color=style["color"], linestyle="none",
                             label=f"{name}: full valid split" if j == 0 else None)
    subset = ""
    if base.get("eval_batches") and base.get("batch_size"):
        subset = f" (first {base['eval_batches'] * base['batch_size']} windows; stars: whole split)"
    for ax, title in zip(axes, ("training loss (smoothed)", "validation loss" + subset)):
        ax.set_xlabel("training tokens", fontsize=10)
        ax.set_ylabel("cross-entropy (nats/token)", fontsize=10)
        ax.set_title(title, fontsize=10)
        ax.tick_params(labelsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _smooth(values, alpha: float = 0.9) -> list[float]:
    out, acc = [], None
    for v in values:
        acc = v if acc is None or not math.isfinite(acc) else alpha * acc + (1 - alpha) * v
        out.append(acc)
    return out
