"""Figures of the claims report: effects with intervals, loss curves, the scan, rank vs perplexity."""

from __future__ import annotations

import math
from pathlib import Path

from coupled_qk.experiments.claims.records import Records
from coupled_qk.experiments.claims.rules import rank_perplexity_points


def _finite(*xs) -> bool:
    return all(isinstance(x, (int, float)) and math.isfinite(x) for x in xs)


def make_figures(report: dict, rec: Records, folder: str | Path, save_as=None) -> list[Path]:
    """Write ``<protocol>-effects.png``, ``-curves.png``, ``-scan.png``, ``-trend.png`` and ``-rank.png`` where there
    is data. ``save_as(name, draw)`` (e.g. :meth:`coupled_qk.outputs.OutputDir.write_with`), when given, writes
    each file (``draw(path)`` saves the figure); by default figures are saved into ``folder`` directly."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name, written = report["protocol"], []
    for suffix, draw in (
        ("effects", _effects),
        ("curves", _curves),
        ("scan", _scan),
        ("trend", _trend),
        ("rank", _rank),
    ):
        fig = draw(plt, report, rec)
        if fig is None:  # no data for this figure
            continue
        path = folder / f"{name}-{suffix}.png"
        fig.tight_layout()
        try:
            if save_as is None:
                fig.savefig(path, dpi=100)
            else:
                path = save_as(path.name, lambda p, fig=fig: fig.savefig(p, dpi=100, format="png"))
        finally:
            plt.close(fig)
        written.append(path)
    return written


def _intervals(plt, rows: list[dict], labels: list[str], xlabel: str):
    """One horizontal 95% interval per row (``mean``, ``low``, ``high``) around a line at 0."""
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.5))
    for i, r in enumerate(rows):
        ax.errorbar(r["mean"], i, xerr=[[r["mean"] - r["low"]], [r["high"] - r["mean"]]], fmt="o", capsize=4)
    ax.set_yticks(range(len(rows)), labels)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_xlabel(xlabel)
    return fig, ax


def _effects(plt, report: dict, rec: Records):
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


def _curves(plt, report: dict, rec: Records):
    """Validation loss curves of the ``wv-tiny`` runs, one line per seed."""
    curves = {
        v: [r["curve"]["valid"] for (c, v2, _), r in rec.by_key.items() if c == "wv-tiny" and v2 == v]
        for v in ("standard", "coupled", "uncoupled_mlp")
    }
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
    ax.set_title("wv-tiny: one line per seed")
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def _scan(plt, report: dict, rec: Records):
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


def _trend(plt, report: dict, rec: Records):
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


def _rank(plt, report: dict, rec: Records):
    """Effective rank of the attention maps against held-out test perplexity, one point per run."""
    pts = [(rank, ppl, variant) for _, variant, rank, ppl in rank_perplexity_points(rec)]
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
