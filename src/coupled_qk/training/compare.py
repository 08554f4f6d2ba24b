"""Compare attention variants under identical seeds, data order and token budget; table and loss-curve plot."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path

from coupled_qk.models.variants import parse_variants, variant_overrides
from coupled_qk.training.checkpoint import write_text_atomic
from coupled_qk.training.config import TrainConfig, config_differences, describe_differences
from coupled_qk.training.loop import read_metrics, train

# settings that do not change what a finished run computed
REUSE_IGNORED = frozenset({"out_dir", "resume", "progress", "tensorboard", "device", "compile", "data_dir", "cache_dir"})


def _summary(values: list[float]) -> dict:
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": mean, "std": std, "values": values}


def run_comparison(base: TrainConfig, variants: list[str], seeds: list[int], out_dir: str | Path) -> dict:
    """Train every ``variant x seed`` from ``base`` (same data order per seed, same budget) and summarise.

    Each run goes to ``out_dir/<variant>/seed<k>``; a finished run (``results.json`` present) with the same
    settings is reused (different settings raise ``ValueError`` naming them), an interrupted one resumes. Writes ``out_dir/results.json``, ``results.md`` and ``loss_curves.png``.

    Returns:
        ``{"variants": {name: {"runs": [...], "valid_perplexity": {...}, "test_perplexity": {...}, ...}}}``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    variants = parse_variants(variants)
    summary: dict = {"base_config": base.to_dict(), "seeds": seeds, "variants": {}}
    for variant in variants:
        overrides = variant_overrides(variant)
        runs = []
        for seed in seeds:
            run_dir = out_dir / variant / f"seed{seed}"
            done = run_dir / "results.json"
            cfg = dataclasses.replace(
                base, seed=seed, out_dir=str(run_dir), model={**base.model, **overrides},
                resume=(run_dir / "latest").is_file(),
            )
            if done.is_file():
                results = json.loads(done.read_text())
                diff = config_differences(results["config"], cfg, REUSE_IGNORED)
                if diff:
                    raise ValueError(
                        f"{run_dir} holds a finished run with different settings ({describe_differences(diff)}); "
                        "choose another --out-dir or delete that folder"
                    )
                print(f"== {variant} seed {seed}: reusing the finished run in {run_dir}", flush=True)
            else:
                print(f"== {variant} seed {seed} -> {run_dir}", flush=True)
                results = train(cfg)
            runs.append({"seed": seed, "run_dir": str(run_dir), "final": results["final"],
                         "params": results["params"], "tokens": results["tokens"],
                         "train_seconds": results["train_seconds"]})
        entry = {"overrides": overrides, "runs": runs}
        for key in ("valid/perplexity", "test/perplexity", "valid/word_perplexity", "test/word_perplexity"):
            vals = [r["final"][key] for r in runs if key in r["final"]]
            if vals:
                entry[key.replace("/", "_")] = _summary(vals)
        entry["params"] = runs[0]["params"]
        entry["minutes"] = statistics.fmean(r["train_seconds"] for r in runs) / 60
        summary["variants"][variant] = entry
    write_text_atomic(out_dir / "results.json", json.dumps(summary, indent=2))
    table = format_table(summary)
    write_text_atomic(out_dir / "results.md", table + "\n")
    plot_loss_curves(summary, out_dir / "loss_curves.png")
    return summary


def format_table(summary: dict) -> str:
    """Markdown table: per variant, perplexities (mean +- std over seeds), change vs standard, parameters."""
    variants = summary["variants"]
    ref = variants.get("standard", {}).get("test_perplexity", {}).get("mean")

    def cell(entry, key):
        s = entry.get(key)
        if not s:
            return "-"
        return f"{s['mean']:.2f} ± {s['std']:.2f}" if len(s["values"]) > 1 else f"{s['mean']:.2f}"

    lines = [
        "| variant | valid ppl | test ppl | test word ppl | test vs standard | params | tokens | minutes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, e in variants.items():
        test = e.get("test_perplexity", {}).get("mean")
        delta = f"{100 * (test / ref - 1):+.1f}%" if ref and test else "-"
        lines.append(
            f"| {name} | {cell(e, 'valid_perplexity')} | {cell(e, 'test_perplexity')} | "
            f"{cell(e, 'test_word_perplexity')} | {delta} | {e['params']:,} | {e['runs'][0]['tokens']:,} | "
            f"{e['minutes']:.1f} |"
        )
    return "\n".join(lines)


def plot_loss_curves(summary: dict, path: str | Path) -> None:
    """Training loss (smoothed) and validation loss against tokens, one colour per variant (mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, (name, entry) in enumerate(summary["variants"].items()):
        color = f"C{i}"
        for j, run in enumerate(entry["runs"]):
            records = read_metrics(run["run_dir"])
            train_pts = [(r["tokens"], r["train/loss"]) for r in records if "train/loss" in r]
            valid_pts = [(r["tokens"], r["valid/loss"]) for r in records if "valid/loss" in r]
            label = name if j == 0 else None
            if train_pts:
                xs, ys = zip(*train_pts)
                axes[0].plot(xs, _smooth(ys), color=color, alpha=0.8, label=label)
            if valid_pts:
                xs, ys = zip(*valid_pts)
                axes[1].plot(xs, ys, color=color, marker="o", ms=3, alpha=0.8, label=label)
    for ax, title in zip(axes, ("training loss (smoothed)", "validation loss")):
        ax.set_xlabel("training tokens")
        ax.set_ylabel("cross-entropy (nats/token)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _smooth(values, alpha: float = 0.9) -> list[float]:
    out, acc = [], None
    for v in values:
        acc = v if acc is None or not math.isfinite(acc) else alpha * acc + (1 - alpha) * v
        out.append(acc)
    return out
