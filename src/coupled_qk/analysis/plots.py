"""PNG figures of attention diagnostics (:mod:`coupled_qk.analysis.analyze`).

Figures are drawn with Matplotlib's object-oriented API on ``matplotlib.figure.Figure`` objects rendered by the
Agg (PNG) canvas; pyplot is not used, so the global backend and any open figures are left alone and no
display is needed.

Inputs are the per-checkpoint entries of ``analysis.json`` (``{"label", "analysis": analyze_model result}``)
and the example maps that :func:`~coupled_qk.analysis.analyze.analyze_model` returns under ``"example"``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import PowerNorm, TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from coupled_qk.analysis.conventions import reference_scale

__all__ = [
    "LAYER_PANELS",
    "HEATMAP_METRICS",
    "plot_layer_metrics",
    "plot_head_heatmaps",
    "plot_example_maps",
    "plot_spectra",
    "make_figures",
]

#: Panels of the per-layer figure: (metric base name, title, log y axis).
LAYER_PANELS = (
    ("entropy", "attention entropy (nats)", False),
    ("normalized_entropy", "normalised entropy", False),
    ("effective_rank", "effective rank", False),
    ("spectral_gap_ratio", "spectral gap sigma1/sigma2", True),
    ("spectral_gap_relative", "relative gap (sigma1-sigma2)/sigma1", False),
    ("sink_mass", "sink mass on position 0", False),
    ("rank_collapse_residual", "rank-collapse residual of block output", False),
    ("dt", "learned dt (mean over heads)", False),
    ("q_update", "relative update |q'-q|/|q|", False),
    ("k_update", "relative update |k'-k|/|k|", False),
)
#: Metrics drawn as (layer x head) heatmaps for every checkpoint.
HEATMAP_METRICS = (
    ("entropy", "entropy (nats)"),
    ("effective_rank", "effective rank"),
    ("sink_mass", "sink mass"),
)
_MAP_STYLES = (("", "-", ""), ("a1/", "-", " A1"), ("a2/", "--", " A2"), ("signed/", ":", " A1-λA2"))
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_MAP_TITLES = {"attn": "A", "a1": "A1", "a2": "A2", "signed": "A1 - λ A2"}


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: Path) -> Path:
    """Save ``fig`` as PNG at ``path`` atomically (a temporary file renamed over it; folders created)."""
    from coupled_qk.files import atomic_write

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: fig.savefig(f, format="png", bbox_inches="tight"))
    return path


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _finite(values) -> np.ndarray:
    return np.array([np.nan if v is None else float(v) for v in values], dtype=float)


def slug(label: str) -> str:
    """A file-name-safe version of a checkpoint label."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(label)).strip("_") or "checkpoint"


def plot_layer_metrics(entries: list[dict], path: str | Path) -> Path:
    """One panel per metric of :data:`LAYER_PANELS` (x: layer, y: mean over heads), one line per checkpoint; each
    title carries the metric's reference point for the analysed window length
    (:func:`~coupled_qk.analysis.conventions.reference_scale`).

    Differential checkpoints draw ``A1`` solid, ``A2`` dashed and the signed map dotted (spectral panels only).
    Panels no checkpoint has data for (e.g. ``dt`` for standard attention only) say so.

    Args:
        entries: ``[{"label": str, "analysis": analyze_model result}, ...]``.
        path: output PNG.

    Returns:
        ``path``.
    """
    cols = 4
    rows = math.ceil(len(LAYER_PANELS) / cols)
    fig = _figure(4.2 * cols, 3.2 * rows)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    colors = _colors(len(entries))
    for ax, (base, title, log) in zip(axes, LAYER_PANELS):
        drawn = False
        for i, (color, e) in enumerate(zip(colors, entries)):
            marker = _MARKERS[i % len(_MARKERS)]  # coinciding checkpoints stay distinguishable
            layers = e["analysis"]["layers"]
            x = [layer["layer"] for layer in layers]
            for prefix, style, suffix in _MAP_STYLES:
                key = prefix + base
                if key not in layers[0]["mean"]:
                    continue
                y = _finite(layer["mean"].get(key) for layer in layers)
                if not np.isfinite(y).any():
                    continue
                ax.plot(x, y, style, color=color, marker=marker, markersize=4, alpha=0.85, label=e["label"] + suffix)
                drawn = True
        scale = reference_scale(base, entries[0]["analysis"]["seq_len"]) if entries else None
        ax.set_title(title + (f"\n({scale})" if scale else ""), fontsize=10)
        ax.set_xlabel("layer", fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=8)
        if drawn:
            if log:
                ax.set_yscale("log")
            else:
                ax.ticklabel_format(axis="y", useOffset=False)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        else:
            ax.text(
                0.5,
                0.5,
                "not applicable to\nthese variants",
                ha="center",
                va="center",
                fontsize=8,
                transform=ax.transAxes,
            )
    for ax in axes[len(LAYER_PANELS) :]:
        ax.set_visible(False)
    fig.suptitle("Attention diagnostics per layer (mean over heads and sequences)", fontsize=11)
    fig.tight_layout()
    return _save(fig, path)


def plot_head_heatmaps(entry: dict, path: str | Path) -> Path:
    """Layer x head heatmaps of :data:`HEATMAP_METRICS` for one checkpoint (one row per map: A, or A1 and A2).

    Args:
        entry: ``{"label": str, "analysis": analyze_model result}``.
        path: output PNG.

    Returns:
        ``path``.
    """
    analysis = entry["analysis"]
    layers = analysis["layers"]
    prefixes = [p for p in ("", "a1/", "a2/") if p + HEATMAP_METRICS[0][0] in layers[0]["heads"]]
    n_heads = analysis["n_map_heads"]
    fig = _figure(3.6 * len(HEATMAP_METRICS), 0.9 + (0.28 * len(layers) + 1.0) * len(prefixes))
    axes = fig.subplots(len(prefixes), len(HEATMAP_METRICS), squeeze=False)
    for r, prefix in enumerate(prefixes):
        for c, (base, title) in enumerate(HEATMAP_METRICS):
            ax = axes[r, c]
            data = np.array([_finite(layer["heads"][prefix + base]) for layer in layers])
            im = ax.imshow(data, aspect="auto", cmap="viridis", interpolation="nearest")
            fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
            name = _MAP_TITLES.get(prefix.rstrip("/"), "")
            ax.set_title(f"{title}" + (f" [{name}]" if prefix else ""), fontsize=9)
            ax.set_xlabel("head", fontsize=8)
            ax.set_ylabel("layer", fontsize=8)
            ax.set_xticks(range(n_heads))
            ax.set_yticks(range(len(layers)))
            ax.tick_params(labelsize=6)
    fig.suptitle(f"{entry['label']} ({analysis['attention']}): per-head diagnostics", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def plot_example_maps(entries: list[dict], examples: list[dict], path: str | Path) -> Path:
    """The example attention map(s) of each checkpoint, one row per checkpoint.

    Probability maps use a square-root colour scale (``PowerNorm(0.5)``, so weak attention stays visible);
    the signed differential map uses a diverging scale centred at 0.

    Args:
        entries: ``[{"label", "analysis"}, ...]``.
        examples: the matching ``analyze_model(...)["example"]`` dicts (``{"layer", "head", "tokens",
            "maps": {name: (n, n) array}}``).
        path: output PNG.

    Returns:
        ``path``.
    """
    if len(entries) != len(examples):
        raise ValueError(f"got {len(examples)} example maps for {len(entries)} checkpoints")
    n_cols = max(len(ex["maps"]) for ex in examples)
    fig = _figure(3.6 * n_cols, 3.4 * len(entries))
    axes = fig.subplots(len(entries), n_cols, squeeze=False)
    for r, (e, ex) in enumerate(zip(entries, examples)):
        for c in range(n_cols):
            ax = axes[r, c]
            if c >= len(ex["maps"]):
                ax.set_visible(False)
                continue
            name, mat = list(ex["maps"].items())[c]
            mat = np.asarray(mat, dtype=float)
            if name == "signed":
                bound = max(float(np.abs(mat).max()), 1e-12)
                im = ax.imshow(mat, cmap="RdBu_r", norm=TwoSlopeNorm(0.0, -bound, bound), interpolation="nearest")
            else:
                im = ax.imshow(
                    mat,
                    cmap="viridis",
                    norm=PowerNorm(0.5, vmin=0.0, vmax=max(float(mat.max()), 1e-12)),
                    interpolation="nearest",
                )
            fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
            ax.set_title(
                f"{e['label']}: {_MAP_TITLES.get(name, name)}, layer {ex['layer']} head {ex['head']}", fontsize=8
            )
            ax.set_xlabel("key position", fontsize=7)
            ax.set_ylabel("query position", fontsize=7)
            ax.tick_params(labelsize=6)
    fig.suptitle(
        f"Example attention maps (sequence 0, first {examples[0]['tokens']} tokens; one layer and head "
        "per model: every layer and head is summarised in heads_*.png)",
        fontsize=10,
    )
    fig.tight_layout()
    return _save(fig, path)


def plot_spectra(entries: list[dict], path: str | Path) -> Path:
    """Normalised singular-value spectra ``sigma_i / sigma_1`` (mean over heads and sequences, log scale)
    at the first, middle and last layer, one line per checkpoint (and per map for differential variants).

    Args:
        entries: ``[{"label", "analysis"}, ...]``.
        path: output PNG.

    Returns:
        ``path``.
    """
    depth = min(len(e["analysis"]["layers"]) for e in entries)
    chosen = sorted({0, depth // 2, depth - 1})
    fig = _figure(4.2 * len(chosen), 3.4)
    axes = fig.subplots(1, len(chosen), squeeze=False)[0]
    colors = _colors(len(entries))
    styles = {"attn": "-", "a1": "-", "a2": "--", "signed": ":"}
    for ax, li in zip(axes, chosen):
        for color, e in zip(colors, entries):
            spectra = e["analysis"]["layers"][li]["spectrum"]
            for name, per_head in spectra.items():
                s = np.mean(np.asarray(per_head, dtype=float), axis=0)
                if not s.size or s[0] <= 0:
                    continue
                s = s / s[0]
                s = np.where(s > 0, s, np.nan)
                suffix = "" if name == "attn" else f" {_MAP_TITLES.get(name, name)}"
                ax.plot(np.arange(1, s.size + 1), s, styles.get(name, "-"), color=color, label=e["label"] + suffix)
        ax.set_yscale("log")
        ax.set_xscale("log")
        ax.set_title(f"layer {li}: singular values / sigma1", fontsize=9)
        ax.set_xlabel("index i", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    fig.tight_layout()
    return _save(fig, path)


def make_figures(entries: list[dict], examples: list[dict] | None, out_dir: str | Path) -> dict[str, Path]:
    """Write every figure into ``out_dir``.

    Files: ``per_layer_metrics.png`` (:func:`plot_layer_metrics`), ``spectra.png`` (:func:`plot_spectra`),
    ``heads_<label>.png`` per checkpoint (:func:`plot_head_heatmaps`) and, with ``examples``,
    ``example_maps.png`` (:func:`plot_example_maps`).

    Returns:
        ``{figure name: path}``.
    """
    out_dir = Path(out_dir)
    if not entries:
        raise ValueError("entries is empty: nothing to plot")
    figures = {
        "per_layer_metrics": plot_layer_metrics(entries, out_dir / "per_layer_metrics.png"),
        "spectra": plot_spectra(entries, out_dir / "spectra.png"),
    }
    used: set[str] = set()
    for i, e in enumerate(entries):
        name = f"heads_{slug(e['label'])}"
        if name in used:  # labels that differ only in unsafe characters
            name = f"{name}_{i}"
        used.add(name)
        figures[name] = plot_head_heatmaps(e, out_dir / f"{name}.png")
    if examples:
        figures["example_maps"] = plot_example_maps(entries, examples, out_dir / "example_maps.png")
    return figures
