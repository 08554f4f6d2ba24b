"""Compare attention variants under identical seeds, data order and token budget; table and loss-curve plot.

The protocol: one run per ``variant x seed`` from a base :class:`TrainConfig` (only the model's attention
fields and the seed change), executed by the shared runner (:mod:`coupled_qk.study.executor`: finished
runs with the same settings are reused, interrupted ones resume), then summarised per variant: mean and
standard deviation over seeds of the final perplexities, the paired change against ``standard`` with its 95%
interval, parameters.
Used by ``coupled-qk compare`` and ``coupled-qk demo``; ``docs/METHOD.md`` section 5 (perplexity).
"""

from __future__ import annotations

import dataclasses
import statistics
import textwrap
from collections.abc import Callable
from pathlib import Path

from coupled_qk.models.registry import variant_names
from coupled_qk.models.specs import check_distinct, parse_variants, variant_overrides
from coupled_qk.output_dir import OutputDir
from coupled_qk.study.executor import PlannedRun, Report, RunRecord, run_experiment, stopped_early
from coupled_qk.training.config import TrainConfig
from coupled_qk.training.run_folder import RESULTS_FILE, RunFolder

__all__ = [
    "analyze_comparison",
    "comparison_table",
    "loss_trend",
    "plan_comparison",
    "plot_loss_curves",
    "run_comparison",
    "scored_text",
]

METRICS = (
    "valid/perplexity",
    "test/perplexity",
    "valid/word_perplexity",
    "test/word_perplexity",
    "valid/bits_per_byte",
    "test/bits_per_byte",
)


def _summary(values: list[float]) -> dict:
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": mean, "std": std, "values": values}


def plan_comparison(base: TrainConfig, variants: list[str], seeds: list[int], out_dir: str | Path) -> list[PlannedRun]:
    """One run per ``variant x seed`` (variant-major), in ``out_dir/<variant>/seed<k>``.

    Each run is ``base`` with the variant's model overrides (:func:`coupled_qk.models.specs.variant_overrides`)
    and ``seed``; ``keys`` are ``{"variant", "seed"}``.

    Raises:
        ValueError: an unknown variant spec, two specs that give ``base`` the same model
            (:func:`~coupled_qk.models.specs.check_distinct`), or a resulting invalid configuration.
    """
    plan = []
    specs = parse_variants(variants)
    check_distinct(specs, base.preset, base.model)  # with the base: standard+n_layer=4 is standard at 4 layers
    for variant in specs:
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
        "runs": [{"seed", "run_dir", "final", "params", "tokens", "steps", "stop_reason", "train_seconds",
        "split_tokens"}],
        "valid_perplexity":
        {"mean", "std", "values"}, "test_perplexity", ..., "params", "minutes"}}}``.
    """
    summary: dict = {"base_config": base.to_dict(), "seeds": seeds, "variants": {}}
    for record in records:
        variant = record.keys["variant"]
        entry = summary["variants"].setdefault(variant, {"overrides": variant_overrides(variant), "runs": []})
        r = record.results
        entry["runs"].append(
            {
                "seed": record.keys["seed"],
                "run_dir": str(record.run.run_dir.path),
                "final": r["final"],
                "params": r["params"],
                "tokens": r["tokens"],
                "steps": r.get("steps"),
                "stop_reason": r.get("stop_reason"),
                "train_seconds": r["train_seconds"],
                "split_tokens": ((r.get("data") or {}).get("tokens") or {}) or None,
            }
        )
    for entry in summary["variants"].values():
        runs = entry["runs"]
        for key in METRICS:
            vals = [r["final"][key] for r in runs if key in r["final"]]
            if vals:
                entry[key.replace("/", "_")] = _summary(vals)
        entry["params"] = runs[0]["params"]
        entry["minutes"] = statistics.fmean(r["train_seconds"] for r in runs) / 60
    return Report(
        json={RESULTS_FILE: summary},
        text={"results.md": comparison_table(summary) + "\n"},
        plots={"loss_curves.png": lambda path: plot_loss_curves(summary, path)},
    )


REPORT_FILES = (RESULTS_FILE, "results.md", "loss_curves.png")
"""The report files of a comparison folder, regenerated by a rerun (its documented resume path)."""


def comparison_dir(out_dir: str | Path, variants: list[str], overwrite: bool = False) -> OutputDir:
    """Claim ``out_dir`` for a comparison before any training: it may hold the report files and one folder per
    variant (any registered variant, or one of ``variants``), nothing else (see :class:`OutputDir`).

    Raises:
        ValueError: the folder is a file, not writable, or holds other files (naming ``--out-dir``).
    """
    known = variant_names()
    names = {*known, *parse_variants(variants)}
    specs = [f"{n}/" for n in sorted(names)] + [f"{n}+*/" for n in sorted(known)]  # coupled+n_steps=3/
    return OutputDir(
        out_dir,
        "--out-dir",
        overwrite=overwrite,
        what="a comparison",
        rewrite=REPORT_FILES,
        layout=(*REPORT_FILES, *specs),
    )


def run_comparison(
    base: TrainConfig,
    variants: list[str],
    seeds: list[int],
    out_dir: str | Path,
    train_fn: Callable | None = None,
    log: Callable[[str], None] | None = None,
) -> dict:
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
    _, report = run_experiment(
        plan, lambda records, _: analyze_comparison(records, base, seeds), out_dir, train_fn=train_fn, log=log
    )
    return report.json[RESULTS_FILE]


def _tokens(entry: dict) -> list[int]:
    """The distinct training-token counts of a variant's runs, sorted."""
    return sorted({r["tokens"] for r in entry["runs"]})


def _unfinished(entry: dict) -> bool:
    """Whether a run of the variant stopped early (``max_minutes``, ``stop_after_steps``) before its budget."""
    return any(stopped_early(r) for r in entry["runs"])


def _budget_notes(variants: dict, ref: dict | None) -> tuple[set[str], list[str]]:
    """The variants whose change against ``standard`` (``ref``) is withheld, and the lines under the table: a run
    stopped early is unfinished, and a change computed from different numbers of training tokens is withheld when
    a run in it is unfinished, flagged otherwise (the runs' own early-stopping rule, ``patience``)."""
    withheld: set[str] = set()
    notes = []
    if any(_unfinished(e) for e in variants.values()):
        notes.append(
            "\n(unfinished): a run stopped early (--max-minutes or --stop-after-steps) before its budget; "
            "compare again without that limit to continue it."
        )
    counts = sorted({t for e in variants.values() for t in _tokens(e)})
    if len(counts) > 1:
        differ = [n for n, e in variants.items() if ref is not None and len({*_tokens(e), *_tokens(ref)}) > 1]
        withheld = {n for n in differ if _unfinished(variants[n]) or _unfinished(ref)}
        line = f"\nWarning: the runs were trained on different numbers of tokens ({counts[0]:,} to {counts[-1]:,})"
        if withheld:
            line += f"; the change against standard is withheld for {', '.join(sorted(withheld))} (unfinished runs)"
        if set(differ) - withheld:
            line += (
                f"; for {', '.join(sorted(set(differ) - withheld))} it compares different budgets (the runs' own "
                "early stopping)"
            )
        notes.append(line + ".")
    return withheld, notes


def scored_text(scored: int | None, split_tokens: int | None) -> str | None:
    """What an evaluation of a split scored, in words: ``"whole split (27,350 tokens)"`` or ``"first 6,144 of
    27,350 tokens (22%)"``; ``None`` when the count is unknown (results written before it was recorded).

    The one source of these labels: the comparison table's note, the legend and the title of the validation panel
    all call it with the scored targets of an evaluation (``n_tokens`` of
    :func:`~coupled_qk.training.perplexity.evaluate_perplexity`) and the split's tokens (``results["data"]``); a
    split of ``N`` tokens has ``N - 1`` targets, so ``scored >= N - 1`` is the whole split.
    """
    if scored is None or not split_tokens:
        return None
    if scored >= split_tokens - 1:
        return f"whole split ({split_tokens:,} tokens)"
    return f"first {scored:,} of {split_tokens:,} tokens ({100 * scored / split_tokens:.0f}%)"


def _final_scored(variants: dict, split: str) -> set[str | None]:
    """The distinct :func:`scored_text` of the final evaluation of ``split`` over all runs."""
    return {
        scored_text((r.get("final") or {}).get(f"{split}/n_tokens"), (r.get("split_tokens") or {}).get(split))
        for e in variants.values()
        for r in e["runs"]
    }


def _subsample_note(variants: dict) -> list[str]:
    """The line saying that the final evaluation scored part of the splits (``task_options.final_eval_windows``,
    ``demo --quick``), from what each run's evaluation scored (:func:`scored_text`)."""
    windows = sorted(
        {r["final"]["test/subsample_windows"] for e in variants.values() for r in e["runs"] if _subsampled(r)}
    )
    if not windows:
        return []
    parts = []
    for split in ("valid", "test"):
        texts = sorted(t for t in _final_scored(variants, split) if t is not None)
        if texts:
            parts.append(f"{split} on its {' / '.join(texts)}")
    what = "; ".join(parts) if parts else f"their first {', '.join(map(str, windows))} windows only"
    return [
        f"\nSmoke run: the final evaluation scored {what}, a subsample, not the whole splits; not comparable "
        "with full evaluations."
    ]


def _subsampled(run: dict) -> bool:
    return "test/subsample_windows" in (run.get("final") or {})


def _paired_change(ref: dict, entry: dict) -> dict | None:
    """The per-seed change of test perplexity of ``entry`` against ``ref`` (same seed), in percent, with its
    95% Student-t interval (:func:`coupled_qk.study.stats.paired_difference`, ``relative=True``): ``{"n",
    "mean", "low", "high", "sd", "needed"}`` (``low``/``high``/``sd`` ``None`` for one pair or without scipy;
    ``needed``: :func:`~coupled_qk.study.stats.seeds_for_interval` where the interval includes 0).
    ``None`` when no seed has both."""
    key = "test/perplexity"
    base = {r["seed"]: r["final"][key] for r in ref["runs"] if key in (r.get("final") or {})}
    pairs = [(base[r["seed"]], r["final"][key]) for r in entry["runs"] if r["seed"] in base and key in r["final"]]
    if not pairs:
        return None
    changes = [100 * (b / a - 1) for a, b in pairs]
    out = {"n": len(pairs), "mean": statistics.fmean(changes), "low": None, "high": None, "sd": None}
    out["needed"] = None
    if len(pairs) < 2:
        return out
    try:
        from coupled_qk.study import stats
    except ImportError:  # scipy (the claims extra): the note says how to get the interval
        return {**out, "sd": statistics.stdev(changes), "no_scipy": True}
    d = stats.paired_difference([a for a, _ in pairs], [b for _, b in pairs], relative=True)
    out.update(low=d["low"], high=d["high"], sd=d["sd"])
    if not d["low"] > 0 and not d["high"] < 0:
        out["needed"] = stats.seeds_for_interval(d["mean"], d["sd"])
    return out


def _change_cell(change: dict | None) -> str:
    """``-0.2% [-3.1%, +2.7%]`` (mean paired change and its 95% interval), ``-0.2% (1 seed)``, or ``-``; with two
    decimals where every number is below 1% (a change of 0.04% read "+0.0% [-0.0%, +0.1%]")."""
    if change is None:
        return "-"
    shown = [v for v in (change["mean"], change["low"], change["high"]) if v is not None]
    digits = 2 if max(abs(v) for v in shown) < 1 else 1
    text = f"{change['mean']:+.{digits}f}%"
    if change["low"] is not None:
        return text + f" [{change['low']:+.{digits}f}%, {change['high']:+.{digits}f}%]"
    return text + (f" ({change['n']} seed{'s' if change['n'] > 1 else ''})")


def _change_notes(changes: dict, n_seeds: int) -> list[str]:
    """What the ``test vs standard`` column and the ``±`` mean, and how many seeds an interval needs."""
    measured = {k: c for k, c in changes.items() if c is not None}
    if not measured:
        return []
    notes = [
        "\ntest vs standard: the mean over seeds of the per-seed change of test perplexity against standard trained "
        "with the same seed (paired), 100 x (variant / standard - 1)"
        + (
            ", with its 95% Student-t interval [low, high]: an interval that excludes 0 is a difference at the 5% "
            "level."
            if any(c["low"] is not None for c in measured.values())
            else "."
        )
    ]
    if any(c["n"] < 2 for c in measured.values()):
        notes.append(
            "One seed gives no interval: an interval needs at least 2 seeds per variant (--seeds 0,1,...), and "
            "5 or more for a narrow one (the 95% t factor is 12.7 at 2 seeds, 2.8 at 5)."
        )
    if any(c.get("no_scipy") for c in measured.values()):
        notes.append("The intervals need scipy: pip install 'coupled-qk[claims]'.")
    for name, c in measured.items():
        if c["needed"] is not None:
            notes.append(
                f"{name}: the interval includes 0; "
                + (
                    f"about {c['needed']} seeds would exclude it if the mean change and its spread stayed as measured."
                    if c["needed"] <= SEEDS_LIMIT
                    else f"more than {SEEDS_LIMIT} seeds would be needed at the measured mean change and spread."
                )
            )
    if n_seeds > 1:
        notes.append(
            f"±: the standard deviation over the {n_seeds} seeds (the spread of single runs, not an interval)."
        )
    return notes


SEEDS_LIMIT = 1000
"""The most seeds a note estimates as needed for an interval that excludes 0 (beyond: "more than")."""


def _word_ppl_note(variants: dict) -> list[str]:
    """Why ``test word ppl`` is ``n/a`` where a variant has none: its final evaluation scored a subsample (words
    are counted over whole splits), or its corpus is not WikiText-style."""
    from coupled_qk.training.tasks.lm import WORD_LEVEL_CORPORA

    missing = [r for e in variants.values() if "test_word_perplexity" not in e for r in e["runs"]]
    if not missing:
        return []
    reasons = []
    if any(_subsampled(r) for r in missing):
        reasons.append("a final evaluation of a subsample has none (words are counted over whole splits)")
    if not all(_subsampled(r) for r in missing):
        reasons.append(
            "it is reported for WikiText-style corpora only "
            f"({', '.join(WORD_LEVEL_CORPORA)}), whose word counts follow the WikiText convention"
        )
    return [
        "n/a (test word ppl): word-level perplexity divides the NLL by the words of the original text; "
        + "; ".join(reasons)
        + ". Test bits/byte is the tokenizer-free measure for any text."
    ]


def comparison_table(summary: dict) -> str:
    """Markdown table: per variant, perplexities per token and per word and bits per byte of the test split
    (mean ± standard deviation over seeds), the paired change of test perplexity against ``standard`` with its
    95% interval (:func:`_paired_change`), parameters, training tokens and wall-clock minutes; then notes saying
    what ``±`` and the interval mean (and how many seeds an interval needs), why a word perplexity is ``n/a``,
    that the minutes are no speed comparison, and what the final evaluation scored where it was a subsample
    (``task_options.final_eval_windows``, ``demo --quick``; :func:`scored_text`). A variant with a run that
    stopped early (``max_minutes``, ``stop_after_steps``) is marked ``(unfinished)``; when the runs differ in
    training tokens a warning says so, and the change against standard of a variant is withheld (``withheld``)
    where one of the runs compared stopped early."""
    variants = summary["variants"]
    ref = variants.get("standard")
    withheld, notes = _budget_notes(variants, ref)
    changes = {
        name: _paired_change(ref, e) if ref is not None and name != "standard" and name not in withheld else None
        for name, e in variants.items()
    }

    def cell(entry, key, digits=2):
        s = entry.get(key)
        if not s:
            return "n/a" if key == "test_word_perplexity" else "-"
        return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}" if len(s["values"]) > 1 else f"{s['mean']:.{digits}f}"

    lines = [
        "| variant | valid ppl | test ppl | test word ppl | test bits/byte | test vs standard | params | tokens | "
        "wall min |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, e in variants.items():
        delta = "withheld" if name in withheld else "reference" if name == "standard" else _change_cell(changes[name])
        counts = _tokens(e)
        tokens = f"{counts[0]:,}" + (f" to {counts[-1]:,}" if len(counts) > 1 else "")
        lines.append(
            f"| {name}{' (unfinished)' if _unfinished(e) else ''} | {cell(e, 'valid_perplexity')} | "
            f"{cell(e, 'test_perplexity')} | {cell(e, 'test_word_perplexity')} | {cell(e, 'test_bits_per_byte', 4)} | "
            f"{delta} | {e['params']:,} | {tokens} | {e['minutes']:.1f} |"
        )
    lines.extend(notes)
    lines.extend(_change_notes(changes, len(summary.get("seeds") or [])))
    lines.extend(_word_ppl_note(variants))
    lines.append(
        "wall min: wall-clock minutes per run (mean over seeds), validation included; they reflect this machine's "
        "load while each run trained, not the speed of a variant (coupled-qk bench measures speed)."
    )
    lines.extend(_subsample_note(variants))
    return "\n".join(lines)


LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
TREND_SPAN = 0.1
"""Fraction of a run's training-loss records in each local fit of :func:`loss_trend` (at least 5 records)."""


def loss_trend(xs, ys, span: float = TREND_SPAN, min_points: int = 5) -> list[float]:
    """The trend of a noisy training-loss curve: a local linear fit (LOWESS of degree 1 with tricube weights,
    Cleveland 1979, without robustness iterations) at each point.

    Each point's value is a weighted least-squares line through its ``k = max(min_points, span * n)`` nearest
    records (by index; at the ends the window stays ``k`` long on one side), evaluated at the point. A line
    reproduces a linear trend exactly, so the trend has no lag (an exponential moving average initialised at the
    first record lags a falling loss by about ``alpha / (1 - alpha)`` records, which in a short run is most of
    it); curvature biases it by a fraction of ``f'' * (window width)^2``.

    Args:
        xs: the records' x values (training tokens), increasing. ys: the logged losses (any finite floats).
        span: fraction of the records in each fit. min_points: the smallest fit; fewer finite records are returned
            as they are.

    Returns:
        One float per record: the trend, NaN where the record is not finite (left out of every fit).

    Raises:
        ValueError: ``xs`` and ``ys`` of different lengths, or ``span`` outside (0, 1].
    """
    import numpy as np

    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"xs and ys must be 1-D of equal length; got {x.shape} and {y.shape}")
    if not 0 < span <= 1:
        raise ValueError(f"span={span!r} must be in (0, 1]")
    out = np.full(y.shape, np.nan)
    ok = np.isfinite(x) & np.isfinite(y)
    xf, yf = x[ok], y[ok]
    n = len(yf)
    k = min(n, max(min_points, round(span * n)))
    if n < min_points:
        out[ok] = yf
        return out.tolist()
    fitted = np.empty(n)
    for i in range(n):
        lo = min(max(0, i - k // 2), n - k)
        wx, wy = xf[lo : lo + k], yf[lo : lo + k]
        d = np.abs(wx - xf[i])
        w = (1 - (d / (d.max() * 1.001)) ** 3) ** 3 if d.max() > 0 else np.ones(k)
        mx, my = np.average(wx, weights=w), np.average(wy, weights=w)
        var = np.sum(w * (wx - mx) ** 2)
        slope = np.sum(w * (wx - mx) * (wy - my)) / var if var > 0 else 0.0
        fitted[i] = my + slope * (xf[i] - mx)
    out[ok] = fitted
    return out.tolist()


def _scored_in_run(run: dict, records: list[dict]) -> tuple[str | None, str | None]:
    """What the run's quick validations and its final validation scored (:func:`scored_text`)."""
    split = (run.get("split_tokens") or {}).get("valid")
    quick = {r["valid/n_tokens"] for r in records if "valid/n_tokens" in r}
    final = (run.get("final") or {}).get("valid/n_tokens")
    return scored_text(max(quick) if len(quick) == 1 else None, split), scored_text(final, split)


TITLE_WIDTH = 64
"""Characters per line of a loss-curve panel's title (half of a 12-inch figure at 10 pt); longer ones wrap."""


def plot_loss_curves(summary: dict, path: str | Path) -> None:
    """Training loss and validation loss against training tokens, one style per variant.

    Training loss: each logged value faintly, and its trend (:func:`loss_trend`, a local linear fit: no lag).
    Each variant has its own colour, line style and marker, so variants whose curves coincide (Euler and
    leapfrog often do) stay visible. The validation curve during training scores part of the validation split
    (quick validations), the final validation of each run (a star at its last token count) scores what its
    results say; the panel's title and the legend say which, from :func:`scored_text`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    quick_scored: set = set()
    for i, (name, entry) in enumerate(summary["variants"].items()):
        style = dict(color=f"C{i % 10}", linestyle=LINE_STYLES[i % len(LINE_STYLES)], marker=MARKERS[i % len(MARKERS)])
        for j, run in enumerate(entry["runs"]):
            records = RunFolder(run["run_dir"]).read_metrics()
            quick, final_scored = _scored_in_run(run, records)
            quick_scored.add(quick)
            _draw_run(axes, records, run, name if j == 0 else None, style, final_scored)
    quick_text = quick_scored.pop() if len(quick_scored) == 1 else None
    titles = (
        "training loss (faint: logged values; line: local linear trend)",
        "validation loss" + (f" (lines: each on the {quick_text})" if quick_text else "") + "; stars: final",
    )
    for ax, title in zip(axes, titles):
        ax.set_xlabel("training tokens", fontsize=10)
        ax.set_ylabel("cross-entropy (nats/token)", fontsize=10)
        ax.set_title(textwrap.fill(title, TITLE_WIDTH), fontsize=10)  # a long title would run past the figure
        ax.tick_params(labelsize=9)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        else:  # e.g. runs shorter than log_interval have no training-loss records
            ax.text(0.5, 0.5, "no records", ha="center", va="center", transform=ax.transAxes, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _draw_run(axes, records: list[dict], run: dict, label: str | None, style: dict, final_scored: str | None) -> None:
    """One run's curves: logged training losses (faint) and their trend, the quick validations, the final one."""
    train_pts = [(r["tokens"], r["train/loss"]) for r in records if "train/loss" in r]
    valid_pts = [(r["tokens"], r["valid/loss"]) for r in records if "valid/loss" in r]
    if train_pts:
        xs, ys = zip(*train_pts)
        axes[0].plot(xs, ys, color=style["color"], alpha=0.25, lw=0.8)
        axes[0].plot(xs, loss_trend(xs, ys), alpha=0.9, label=label, markevery=max(1, len(xs) // 8), ms=4, **style)
    if valid_pts:
        xs, ys = zip(*valid_pts)
        axes[1].plot(xs, ys, alpha=0.8, label=label, ms=4, **style)
    final = (run.get("final") or {}).get("valid/loss")
    if final is not None and run.get("tokens"):
        axes[1].plot(
            [run["tokens"]],
            [final],
            marker="*",
            ms=11,
            color=style["color"],
            linestyle="none",
            label=f"{label}: final, {final_scored or 'valid split'}" if label else None,
        )
