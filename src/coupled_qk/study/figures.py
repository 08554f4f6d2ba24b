"""Figures of the study reports: effects with intervals, loss curves, the scan, the token trend, a correlation across
runs (:func:`verdict_figures`), and the mean validation curves of a tuned study (:func:`curves_figure`)."""

from __future__ import annotations

import math
from pathlib import Path


def _finite(*xs) -> bool:
    return all(isinstance(x, (int, float)) and math.isfinite(x) for x in xs)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def verdict_figures(layout, report: dict, ctx) -> dict:
    """``{"<study>-effects.png" ...: draw(path)}`` for each figure of a verdict report that has data (effects,
    curves, scan, trend, and the claim correlation's points); each ``draw`` saves the PNG and closes the figure."""
    plt = _pyplot()
    out = {}
    name = report["protocol"]
    for suffix, make in (
        ("effects", _effects),
        ("curves", _curves),
        ("scan", _scan),
        ("trend", _trend),
        ("rank", _correlation),
    ):
        fig = make(plt, layout, report, ctx)
        if fig is None:  # no data for this figure
            continue
        fig.tight_layout()

        def draw(path, fig=fig):
            try:
                fig.savefig(path, dpi=100, format="png")
            finally:
                plt.close(fig)

        out[f"{name}-{suffix}.png"] = draw
    return out


def _intervals(plt, rows: list[dict], labels: list[str], xlabel: str):
    """One horizontal 95% interval per row (``mean``, ``low``, ``high``) around a line at 0."""
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.5))
    for i, r in enumerate(rows):
        ax.errorbar(r["mean"], i, xerr=[[r["mean"] - r["low"]], [r["high"] - r["mean"]]], fmt="o", capsize=4)
    ax.set_yticks(range(len(rows)), labels)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_xlabel(xlabel)
    return fig, ax


def _effects(plt, layout, report: dict, ctx):
    """The claims measured in percent, with their intervals."""
    pct = [
        r
        for r in report["rows"]
        if r["verdict"] != "not run" and "%" in r.get("effect", "") and _finite(r["mean"], r["low"], r["high"])
    ]
    if not pct:
        return None
    fig, ax = _intervals(
        plt,
        pct,
        [f"{r['id']}: {r['verdict']}" for r in pct],
        "effect, % of held-out test perplexity (mean, 95% CI over seeds)",
    )
    ax.set_title(f"claims measured in percent ({report['protocol']})")
    return fig


def _curves(plt, layout, report: dict, ctx):
    """Validation loss curves of the layout's cell, one line per seed."""
    if ctx is None or not layout.curves:
        return None
    cell, variants = layout.curves
    by_key = ctx.evidence.by_key
    curves = {v: [r["curve"]["valid"] for (c, v2, _), r in by_key.items() if c == cell and v2 == v] for v in variants}
    if not any(curves.values()):
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (v, runs) in enumerate(curves.items()):
        for j, pts in enumerate(runs):
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, color=f"C{i}", alpha=0.7, label=v if j == 0 else None)
    ax.set_xlabel("training tokens")
    ax.set_ylabel("held-out validation loss (nats/token)")
    ax.set_title(f"{cell}: one line per seed")
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def _scan(plt, layout, report: dict, ctx):
    """The one-factor scan: coupled vs standard per factor, with intervals."""
    scan = [
        s for s in report.get("scan", []) if s.get("status") == "measured" and _finite(s["mean"], s["low"], s["high"])
    ]
    if not scan:
        return None
    fig, _ = _intervals(
        plt,
        scan,
        [s["factor"] for s in scan],
        "coupled vs standard, % held-out test perplexity (negative: coupling helps)",
    )
    return fig


def _trend(plt, layout, report: dict, ctx):
    """Coupled vs standard against training tokens: per seed and the mean with its interval."""
    trend = report.get("token_trend") or {}
    if not trend.get("budgets"):
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for per in trend["per_seed"].values():
        ax.plot([t for t, _ in per], [p for _, p in per], color="0.7", marker=".", lw=0.8)
    b = [x for x in trend["budgets"] if _finite(x["mean"], x["low"], x["high"])]
    ax.errorbar(
        [x["tokens"] for x in b],
        [x["mean"] for x in b],
        fmt="o-",
        capsize=4,
        color="C0",
        yerr=[[x["mean"] - x["low"] for x in b], [x["high"] - x["mean"] for x in b]],
        label="mean, 95% CI",
    )
    ax.set_xscale("log", base=2)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xlabel("training tokens per run")
    ax.set_ylabel("coupled vs standard, % held-out test ppl")
    ax.set_title("trend with training tokens (grey: one line per seed)")
    ax.legend(fontsize=8)
    return fig


def _correlation(plt, layout, report: dict, ctx):
    """The claim correlation's points (effective rank against held-out test perplexity), one per run."""
    if ctx is None or layout.correlation is None:
        return None
    claim = next((c for c in ctx.study.claims if c.id == layout.correlation.claim), None)
    corr = getattr(claim.test, "correlation", None) if claim is not None else None
    pts = [(x, y, variant) for _, variant, x, y in corr.points(ctx.evidence)] if corr is not None else []
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, v in enumerate(sorted({p[2] for p in pts})):
        sel = [p for p in pts if p[2] == v]
        ax.scatter([p[0] for p in sel], [p[1] for p in sel], color=f"C{i}", label=v)
    ax.set_xlabel("effective rank of attention maps (layer mean)")
    ax.set_ylabel("held-out test perplexity")
    ax.legend(fontsize=7)
    return fig


def curves_figure(report: dict, path: str | Path) -> None:
    """The mean validation curves of a tuned study's arms with their min-max band over seeds, saved at ``path``."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    try:
        for label, c in report["curves"].items():
            if not c:
                continue
            (line,) = ax.plot(c["tokens"], c["mean"], label=f"{label} (n={c['n']})")
            ax.fill_between(c["tokens"], c["low"], c["high"], color=line.get_color(), alpha=0.2)
        ax.set_xlabel("training tokens")
        ax.set_ylabel("validation loss (nats/token)")
        ax.set_title(f"{report['design']}: validation loss, mean and min-max band over seeds")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=110, format="png")
    finally:
        plt.close(fig)
