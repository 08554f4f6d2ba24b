"""The written results of the attention diagnostics: ``analysis.json`` text and ``summary.md`` (docs/METHOD.md
section 7)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

from coupled_qk.analysis.conventions import (
    DESCRIPTIONS,
    HEADLINE_METRICS,
    MAP_NAMES,
    PER_LAYER_TABLES,
    describe_metric,
    metric_rank,
    reference_scale,
)

__all__ = ["dumps", "headline", "summary_markdown"]


def _json_ready(obj):
    if isinstance(obj, dict):
        return {str(k): _json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_ready(v) for v in obj]
    if isinstance(obj, (np.floating, np.integer)):
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Path):
        return str(obj)
    return obj


_NUMBER_LIST = re.compile(r"\[\n\s*([-+0-9.eE,\snul]*?)\n\s*\]")  # raw newlines never occur in JSON strings


def dumps(obj) -> str:
    """JSON text of ``obj`` (non-finite floats -> null), indented, with lists of numbers kept on one line."""
    text = json.dumps(_json_ready(obj), indent=1, allow_nan=False)
    return _NUMBER_LIST.sub(lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text) + "\n"


def _fmt(value) -> str:
    if value is None:
        return "–"
    value = float(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value != 0 and (abs(value) >= 1e4 or abs(value) < 1e-3):
        return f"{value:.3e}"
    return f"{value:.4f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return [line(header), "|" + "|".join(["---"] * len(header)) + "|"] + [line(row) for row in rows]


def headline(analysis: dict) -> str:
    """One line of a checkpoint's layer-averaged :data:`~coupled_qk.analysis.conventions.HEADLINE_METRICS`, each with
    its reference (:func:`~coupled_qk.analysis.conventions.reference_scale`): ``"normalised entropy (/ log row
    length) 0.9930 (1 = uniform, 0 = one key); effective rank (Roy & Vetterli) 55.10 (max 128 = window); ..."``.

    Args:
        analysis: an :func:`~coupled_qk.analysis.capture.analyze_model` result (its ``mean`` and ``seq_len``).
    """
    parts = []
    for base in HEADLINE_METRICS:
        keys = [k for k in sorted(analysis["mean"], key=metric_rank) if k.rpartition("/")[2] == base]
        for key in keys:
            parts.append(
                f"{describe_metric(key)} {_fmt(analysis['mean'][key])} ({reference_scale(key, analysis['seq_len'])})"
            )
    return "; ".join(parts)


def summary_markdown(report: dict) -> str:
    """``summary.md``: checkpoints side by side (layer-averaged metrics, a few per-layer tables, conventions).

    Args:
        report: the dict :func:`analyze_checkpoints` writes to ``analysis.json``.

    Returns:
        Markdown text.
    """
    entries = report["checkpoints"]
    keys = sorted({k for e in entries for k in e["analysis"]["mean"]}, key=metric_rank)
    lines = _text_lines(report) + _checkpoint_lines(entries) + _mean_lines(entries, keys, report["seq_len"])
    for base in PER_LAYER_TABLES:
        lines += _per_layer_lines(entries, [k for k in keys if k.rpartition("/")[2] == base], base, report["seq_len"])
    if report.get("figures"):
        lines += ["", "## Figures", ""]
        lines += [f"- {name}: ![{name}]({file})" for name, file in report["figures"].items()]
    lines += ["", "## Conventions", ""]
    lines += [f"- **{k}**: {v}" for k, v in report["conventions"].items()]
    return "\n".join(lines) + "\n"


def _text_lines(report: dict) -> list[str]:
    """The title and what text the checkpoints were analysed on (and whether it was the same text for all)."""
    source = report.get("corpus_source") or {}
    seed = f" (documents split at random with seed {source['seed']})" if source.get("seed") is not None else ""
    lines = [
        "# Attention diagnostics",
        "",
        f"Corpus `{report['corpus']}`, split `{report['split']}`{seed}: {report['n_sequences']} sequences x "
        f"{report['seq_len']} tokens, the first non-overlapping windows from the start of the split.",
        "",
    ]
    if report["same_tokenizer"]:
        lines += ["All checkpoints share one tokenizer, so every checkpoint saw exactly the same text.", ""]
    else:
        lines += [
            "**The checkpoints use different tokenizers**: the windows hold the same number of tokens "
            "but not the same text (see 'chars covered').",
            "",
        ]
    return lines


def _checkpoint_lines(entries: list[dict]) -> list[str]:
    """The ``## Checkpoints`` table: label, attention, step, path, tokenizer, text covered, seconds."""
    rows = []
    for e in entries:
        a = e["analysis"]
        step = e["state"].get("step", "–") if isinstance(e["state"], dict) else "–"
        rows.append(
            [
                e["label"],
                a["attention"],
                str(step),
                f"`{e['checkpoint']}`",
                f"{e['tokenizer']['name']} ({e['tokenizer']['fingerprint'][:8]})",
                str(e["text"]["chars_covered"]),
                f"{e['seconds']:.1f}",
            ]
        )
    header = ["label", "attention", "step", "checkpoint", "tokenizer", "chars covered", "seconds"]
    return ["## Checkpoints", ""] + _table(header, rows)


def _mean_lines(entries: list[dict], keys: list[str], t: int) -> list[str]:
    """The ``## Layer-averaged metrics`` table of ``keys`` (one column per checkpoint, the reference scale of
    ``t``-token windows) and the embeddings' rank-collapse residual."""
    lines = [
        "",
        "## Layer-averaged metrics",
        "",
        "Mean over layers of the per-layer means over heads (each per-map value averaged over sequences).",
        "",
    ]
    rows = [
        [describe_metric(k), reference_scale(k, t) or "–"] + [_fmt(e["analysis"]["mean"].get(k)) for e in entries]
        for k in keys
    ]
    rows.append(
        ["rank-collapse residual of the embeddings (Frobenius)", reference_scale("rank_collapse_residual", t)]
        + [_fmt(e["analysis"]["rank_collapse_input"]["fro"]) for e in entries]
    )
    return lines + _table(["metric", f"reference ({t}-token windows)"] + [e["label"] for e in entries], rows)


def _per_layer_lines(entries: list[dict], present: list[str], base: str, t: int) -> list[str]:
    """The ``## Per layer`` table of metric ``base`` (the keys of it ``present``, one column per checkpoint and
    map); nothing when no checkpoint has it."""
    if not present:
        return []
    scale = reference_scale(base, t)
    lines = ["", f"## Per layer: {DESCRIPTIONS[base]}" + (f" ({scale})" if scale else ""), ""]
    header, columns = ["layer"], []
    for key in present:
        for e in entries:
            if key in e["analysis"]["mean"]:
                prefix = key.rpartition("/")[0]
                header.append(e["label"] + (f" {MAP_NAMES[prefix]}" if prefix else ""))
                columns.append([layer["mean"].get(key) for layer in e["analysis"]["layers"]])
    depth = max(len(c) for c in columns)
    rows = [[str(i)] + [_fmt(c[i]) if i < len(c) else "–" for c in columns] for i in range(depth)]
    return lines + _table(header, rows)
