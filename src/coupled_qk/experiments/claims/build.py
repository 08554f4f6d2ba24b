"""Build the claims report of a protocol from its run records: :func:`build_report`, a pure function of the
records (so a changed number changes the verdict it feeds), with the tables reported next to the claims (the
one-factor scan, the token-budget trend, the paired comparisons, MQAR's escape counts, added variants).
``docs/METHOD.md`` section 3.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from coupled_qk.experiments.claims.protocols import BUDGET_LADDERS, PROTOCOLS, SCAN_FACTORS, Protocol
from coupled_qk.experiments.claims.records import PRIMARY, NotReady, Records
from coupled_qk.experiments.claims.rules import CLAIMS, PAPER_EFFECTS, c11
from coupled_qk.study import stats

ALPHA = 0.05


def _paired(rec: Records, a: tuple[str, str], b: tuple[str, str]) -> dict:
    """Paired % change of ``b`` vs ``a`` (``(cell, variant)`` pairs) in held-out test perplexity, with both
    mean perplexities, or ``{"status": "not run (reason)"}`` while runs are missing."""
    try:
        rec.need(a, b)
        _, va, vb = rec.pairs(a, b)
    except NotReady as exc:
        return {"status": f"not run ({exc})"}
    r = stats.paired_difference(va, vb, relative=True)
    return {
        **{k: r[k] for k in ("mean", "low", "high", "n", "p")},
        "status": "measured",
        "a_ppl": sum(va) / len(va),
        "b_ppl": sum(vb) / len(vb),
    }


def _scan(rec: Records) -> list[dict]:
    """The one-factor scan (issue 10, item 4): coupled vs standard per factor."""
    return [
        {
            "factor": label,
            "coupled": f"{c_var} ({c_cell})",
            "standard": f"standard ({s_cell})",
            **_paired(rec, (s_cell, "standard"), (c_cell, c_var)),
        }
        for label, c_cell, c_var, s_cell in SCAN_FACTORS
    ]


TREND_CELLS = ("wv-tiny", "wv-tiny-2x")


def token_trend(out_dir: str | Path, protocol: Protocol) -> dict:
    """How coupling's effect changes with training tokens (issue 10, item 4: the token-budget factor).

    Pools the ``wv-tiny`` and ``wv-tiny-2x`` runs of the protocol and of the protocols that differ from it only in
    the budget (:data:`~coupled_qk.experiments.claims.protocols.BUDGET_LADDERS`), read from ``<out_dir>/runs/<name>``.
    Per seed and budget: the % change of coupled vs standard in held-out test perplexity. The same seed shares its
    initialisation and data order across budgets, so the points of one seed are not independent: the slope against
    ``log2(tokens)`` is fitted per seed (least squares, seeds with at least 2 budgets) and the t interval is taken
    over the seeds' slopes.

    Returns:
        ``{"budgets": [{"tokens", "n", "mean", "low", "high"}...], "per_seed": {seed: [[tokens, %]...]},
        "slope": {"n", "mean", "low", "high", "p", ...} (% per doubling of tokens), "status"}``; ``status`` is
        ``"measured"`` or ``"not run (reason)"`` (fewer than 2 seeds with 2 budgets).
    """
    points: dict[int, dict[int, float]] = {}
    for name in BUDGET_LADDERS.get(protocol.name, (protocol.name,)):
        rec = Records.load(out_dir, protocol if name == protocol.name else PROTOCOLS[name])
        for cell in TREND_CELLS:
            std, cou = rec.values(cell, "standard"), rec.values(cell, "coupled")
            for seed in sorted(set(std) & set(cou)):
                tokens = rec.by_key[(cell, "coupled", seed)]["tokens"]
                points.setdefault(seed, {})[tokens] = 100 * (cou[seed] / std[seed] - 1)
    by_budget: dict[int, list[float]] = {}
    for per in points.values():
        for tokens, pct in per.items():
            by_budget.setdefault(tokens, []).append(pct)
    budgets = [
        {"tokens": t, **{k: v for k, v in stats.mean_ci(by_budget[t]).items() if k in ("n", "mean", "low", "high")}}
        for t in sorted(by_budget)
    ]
    slopes = [
        float(np.polyfit(np.log2(sorted(per)), [per[t] for t in sorted(per)], 1)[0])
        for per in points.values()
        if len(per) >= 2
    ]
    out = {"budgets": budgets, "per_seed": {s: sorted(per.items()) for s, per in sorted(points.items())}}
    if len(slopes) < 2:
        return {**out, "status": f"not run ({len(slopes)} seeds with runs at 2 or more budgets; 2 needed)"}
    return {**out, "slope": stats.mean_ci(slopes), "status": "measured"}


GQA_CELL = "gqa-tiny"


COMPARISONS = {
    "gqa": (
        "Grouped-query attention: shared vs per-head evolved keys (beyond the paper)",
        f"Cell `{GQA_CELL}`: the tiny preset with 4 query heads and 2 key/value heads. Per-head keys (the "
        "paper's rule) cache 4 evolved keys per layer, shared keys (`keys_per_query_head=False`) 2, as "
        "standard attention does.",
        (
            ("per-head evolved keys (paper) vs standard", (GQA_CELL, "standard"), (GQA_CELL, "coupled")),
            (
                "shared evolved keys vs standard",
                (GQA_CELL, "standard"),
                (GQA_CELL, "coupled+keys_per_query_head=False"),
            ),
            ("shared vs per-head evolved keys", (GQA_CELL, "coupled"), (GQA_CELL, "coupled+keys_per_query_head=False")),
        ),
    ),
    "differential": (
        "Differential Attention at the tiny size",
        "Cells `wv-tiny` and `wv-tiny-diff` (same data, budget and seeds): Differential Attention "
        "(arXiv:2410.05258) with and without coupling, against the tiny standard and coupled models.",
        (
            ("Differential vs standard", ("wv-tiny", "standard"), ("wv-tiny-diff", "differential")),
            ("Differential vs coupled", ("wv-tiny", "coupled"), ("wv-tiny-diff", "differential")),
            (
                "coupled Differential vs Differential",
                ("wv-tiny-diff", "differential"),
                ("wv-tiny-diff", "coupled_differential"),
            ),
        ),
    ),
}
"""Paired comparisons reported next to the claims: ``{key: (title, intro, ((label, (cell, variant) a, b), ...))}``."""


def _comparisons(rec: Records) -> dict[str, list[dict]]:
    """Each :data:`COMPARISONS` table whose cells the protocol has: paired % changes of b vs a in held-out test
    perplexity (with both mean perplexities)."""
    out = {}
    for key, (_, _, comps) in COMPARISONS.items():
        if all(rec.protocol.has_cell(c) for _, a, b in comps for c in (a[0], b[0])):
            out[key] = [
                {"comparison": label, "a": "/".join(a), "b": "/".join(b), **_paired(rec, a, b)} for label, a, b in comps
            ]
    return out


def _extra_variants(rec: Records) -> list[dict]:
    """``claims --variants``: each added variant against the ``standard`` runs of every language-model cell that
    has them (paired % change of held-out test perplexity, as :func:`_paired`)."""
    return [
        {"variant": v, "cell": c.name, **_paired(rec, (c.name, "standard"), (c.name, v))}
        for v in rec.protocol.extra_variants
        for c in rec.protocol.cells
        if c.mqar is None and "standard" in c.variants and v != "standard"
    ]


def _mqar_escape(rec: Records) -> list[dict]:
    """Per (difficulty, lr, variant): how many seeds reached ``ESCAPE_ACCURACY`` and their mean accuracy."""
    from coupled_qk.experiments.claims.rules import ESCAPE_ACCURACY

    out = []
    for c in rec.protocol.cells:
        if c.mqar is None:
            continue
        for v in c.variants:
            accs = list(rec.values(c.name, v, "valid/accuracy").values())
            if accs:
                out.append(
                    {
                        "difficulty": c.mqar["difficulty"],
                        "lr": c.mqar["lr"],
                        "variant": v,
                        "n": len(accs),
                        "escaped": sum(a >= ESCAPE_ACCURACY for a in accs),
                        "mean_accuracy": sum(accs) / len(accs),
                    }
                )
    return out


def _provisional(rec: Records, rule) -> dict | None:
    """The rule's numbers from the runs finished so far (at least 2 paired seeds), not a verdict."""
    partial = Records(rec.protocol, rec.by_key, min_seeds=2, partial=True)
    try:
        row = rule(partial)
    except (NotReady, ValueError, KeyError, ZeroDivisionError):
        return None
    return {k: row[k] for k in ("effect", "mean", "low", "high", "n")}


def build_report(
    protocol: Protocol, out_dir: str | Path, glue_json: str | Path | None = None, min_seeds: int | None = None
) -> dict:
    """The report of ``protocol`` from the records under ``out_dir`` (see :mod:`coupled_qk.experiments.claims.rules`).

    Returns ``{"protocol", "description", "notes", "rows": [one per claim], "scan", "gqa", "mqar_escape", "holm",
    "cells",
    "generated_utc"}``; each row has ``id, claim, paper, verdict, reason`` and, when measured, ``effect, mean,
    low, high, n, p, tokens, train_hours, details``.
    """
    rec = Records.load(out_dir, protocol, min_seeds)
    rows = []
    for cid, (claim, paper, rule) in CLAIMS.items():
        row = {"id": cid, "claim": claim, "paper": paper}
        if not protocol.runnable:
            row.update(verdict="not run", reason=f"protocol {protocol.name!r} is defined but not run here")
        else:
            try:
                row.update(c11(rec, glue_json) if cid == "C11" else rule(rec), reason="")
            except NotReady as exc:
                row.update(verdict="not run", reason=str(exc))
                provisional = _provisional(rec, rule) if cid != "C11" and "in progress" in str(exc) else None
                if provisional:
                    row["provisional"] = provisional
        value = PAPER_EFFECTS.get(cid)
        if (
            value is not None
            and row["verdict"] != "not run"
            and math.isfinite(row["low"])
            and math.isfinite(row["high"])
        ):
            row.update(paper_effect=value, paper_effect_in_ci=bool(row["low"] <= value <= row["high"]))
        rows.append(row)
    tested = [r for r in rows if isinstance(r.get("p"), float) and math.isfinite(r["p"])]
    adjusted = stats.holm([r["p"] for r in tested])
    holm = [
        {
            "id": r["id"],
            "p": r["p"],
            "holm_p": a,
            "verdict": r["verdict"],
            "survives": (a <= ALPHA) if r["verdict"] in ("reproduced", "contradicted") else None,
        }
        for r, a in zip(tested, adjusted)
    ]
    cells = []
    for c in protocol.cells:
        done = [r for r in rec.runs(c.name) if r["cell"] == c.name]  # not the seeds_of cells' records it aliases
        cells.append(
            {
                "cell": c.name,
                "claims": list(c.claims),
                "planned": len(c.units()),
                "finished": len(done),
                "train_hours": sum(r["train_seconds"] for r in done) / 3600,
                "tokens_per_run": sorted({r["tokens"] for r in done}),
                "est_cpu_minutes_per_run": c.est_cpu_minutes,
            }
        )
    return {
        "protocol": protocol.name,
        "description": protocol.description,
        "notes": list(protocol.notes),
        "expected_hours": protocol.expected_hours,
        "primary_metric": PRIMARY,
        "rows": rows,
        "scan": _scan(rec) if protocol.runnable else [],
        **(_comparisons(rec) if protocol.runnable else {}),
        "token_trend": token_trend(out_dir, protocol) if protocol.runnable else None,
        "mqar_escape": _mqar_escape(rec),
        "holm": holm,
        "extra_variants": _extra_variants(rec),
        "cells": cells,
        "n_records": len({id(r) for r in rec.by_key.values()}),  # aliases (seeds_of) once
        "generated_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
