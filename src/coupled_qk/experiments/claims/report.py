"""Build and write the claims report (JSON, markdown, figures) from a protocol's run records.

:func:`build_report` is a pure function of the records (so a changed number changes the verdict it feeds);
:func:`write_report` writes ``<out_dir>/<protocol>.json``, ``<protocol>.md``, ``<protocol>-readme.md`` (the README's
results section) and ``figures/<protocol>-*.png``.
``docs/METHOD.md`` section 3.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from coupled_qk.experiments import stats
from coupled_qk.experiments.claims.protocols import BUDGET_LADDERS, PROTOCOLS, SCAN_FACTORS, Protocol
from coupled_qk.experiments.claims.records import PRIMARY, NotReady, Records
from coupled_qk.experiments.claims.rules import CLAIMS, PAPER_EFFECTS, c11
from coupled_qk.outputs import OutputDir

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
    return {**{k: r[k] for k in ("mean", "low", "high", "n", "p")}, "status": "measured",
            "a_ppl": sum(va) / len(va), "b_ppl": sum(vb) / len(vb)}


def _scan(rec: Records) -> list[dict]:
    """The one-factor scan (issue 10, item 4): coupled vs standard per factor."""
    return [{"factor": label, "coupled": f"{c_var} ({c_cell})", "standard": f"standard ({s_cell})",
             **_paired(rec, (s_cell, "standard"), (c_cell, c_var))} for label, c_cell, c_var, s_cell in SCAN_FACTORS]


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
    budgets = [{"tokens": t, **{k: v for k, v in stats.mean_ci(by_budget[t]).items() if k in ("n", "mean", "low", "high")}}
               for t in sorted(by_budget)]
    slopes = [float(np.polyfit(np.log2(sorted(per)), [per[t] for t in sorted(per)], 1)[0])
              for per in points.values() if len(per) >= 2]
    out = {"budgets": budgets, "per_seed": {s: sorted(per.items()) for s, per in sorted(points.items())}}
    if len(slopes) < 2:
        return {**out, "status": f"not run ({len(slopes)} seeds with runs at 2 or more budgets; 2 needed)"}
    return {**out, "slope": stats.mean_ci(slopes), "status": "measured"}


GQA_CELL = "gqa-tiny"
COMPARISONS = {
    "gqa": ("Grouped-query attention: shared vs per-head evolved keys (beyond the paper)",
            f"Cell `{GQA_CELL}`: the tiny preset with 4 query heads and 2 key/value heads. Per-head keys (the "
            "paper's rule) cache 4 evolved keys per layer, shared keys (`keys_per_query_head=False`) 2, as "
            "standard attention does.",
            (("per-head evolved keys (paper) vs standard", (GQA_CELL, "standard"), (GQA_CELL, "coupled")),
             ("shared evolved keys vs standard", (GQA_CELL, "standard"), (GQA_CELL, "coupled+keys_per_query_head=False")),
             ("shared vs per-head evolved keys", (GQA_CELL, "coupled"), (GQA_CELL, "coupled+keys_per_query_head=False")))),
    "differential": ("Differential Attention at the tiny size",
                     "Cells `wv-tiny` and `wv-tiny-diff` (same data, budget and seeds): Differential Attention "
                     "(arXiv:2410.05258) with and without coupling, against the tiny standard and coupled models.",
                     (("Differential vs standard", ("wv-tiny", "standard"), ("wv-tiny-diff", "differential")),
                      ("Differential vs coupled", ("wv-tiny", "coupled"), ("wv-tiny-diff", "differential")),
                      ("coupled Differential vs Differential", ("wv-tiny-diff", "differential"),
                       ("wv-tiny-diff", "coupled_differential")))),
}
"""Paired comparisons reported next to the claims: ``{key: (title, intro, ((label, (cell, variant) a, b), ...))}``."""


def _comparisons(rec: Records) -> dict[str, list[dict]]:
    """Each :data:`COMPARISONS` table whose cells the protocol has: paired % changes of b vs a in held-out test
    perplexity (with both mean perplexities)."""
    out = {}
    for key, (_, _, comps) in COMPARISONS.items():
        if all(rec.protocol.has_cell(c) for _, a, b in comps for c in (a[0], b[0])):
            out[key] = [{"comparison": label, "a": "/".join(a), "b": "/".join(b), **_paired(rec, a, b)}
                        for label, a, b in comps]
    return out


def _extra_variants(rec: Records) -> list[dict]:
    """``claims --variants``: each added variant against the ``standard`` runs of every language-model cell that
    has them (paired % change of held-out test perplexity, as :func:`_paired`)."""
    return [{"variant": v, "cell": c.name, **_paired(rec, (c.name, "standard"), (c.name, v))}
            for v in rec.protocol.extra_variants for c in rec.protocol.cells
            if c.mqar is None and "standard" in c.variants and v != "standard"]


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
                out.append({"difficulty": c.mqar["difficulty"], "lr": c.mqar["lr"], "variant": v, "n": len(accs),
                            "escaped": sum(a >= ESCAPE_ACCURACY for a in accs), "mean_accuracy": sum(accs) / len(accs)})
    return out


def _provisional(rec: Records, rule) -> dict | None:
    """The rule's numbers from the runs finished so far (at least 2 paired seeds), not a verdict."""
    partial = Records(rec.protocol, rec.by_key, min_seeds=2, partial=True)
    try:
        row = rule(partial)
    except (NotReady, ValueError, KeyError, ZeroDivisionError):
        return None
    return {k: row[k] for k in ("effect", "mean", "low", "high", "n")}


def build_report(protocol: Protocol, out_dir: str | Path, glue_json: str | Path | None = None,
                 min_seeds: int | None = None) -> dict:
    """The report of ``protocol`` from the records under ``out_dir`` (see :mod:`coupled_qk.experiments.claims.rules`).

    Returns ``{"protocol", "description", "notes", "rows": [one per claim], "scan", "gqa", "mqar_escape", "holm", "cells",
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
        if value is not None and row["verdict"] != "not run" and math.isfinite(row["low"]) and math.isfinite(row["high"]):
            row.update(paper_effect=value, paper_effect_in_ci=bool(row["low"] <= value <= row["high"]))
        rows.append(row)
    tested = [r for r in rows if isinstance(r.get("p"), float) and math.isfinite(r["p"])]
    adjusted = stats.holm([r["p"] for r in tested])
    holm = [{"id": r["id"], "p": r["p"], "holm_p": a, "verdict": r["verdict"],
             "survives": (a <= ALPHA) if r["verdict"] in ("reproduced", "contradicted") else None}
            for r, a in zip(tested, adjusted)]
    cells = []
    for c in protocol.cells:
        done = [r for r in rec.runs(c.name) if r["cell"] == c.name]  # not the seeds_of cells' records it aliases
        cells.append({"cell": c.name, "claims": list(c.claims), "planned": len(c.units()), "finished": len(done),
                      "train_hours": sum(r["train_seconds"] for r in done) / 3600,
                      "tokens_per_run": sorted({r["tokens"] for r in done}), "est_cpu_minutes_per_run": c.est_cpu_minutes})
    return {"protocol": protocol.name, "description": protocol.description, "notes": list(protocol.notes),
            "expected_hours": protocol.expected_hours, "primary_metric": PRIMARY, "rows": rows,
            "scan": _scan(rec) if protocol.runnable else [], **(_comparisons(rec) if protocol.runnable else {}),
            "token_trend": token_trend(out_dir, protocol) if protocol.runnable else None,
            "mqar_escape": _mqar_escape(rec), "holm": holm, "extra_variants": _extra_variants(rec),
            "cells": cells, "n_records": len({id(r) for r in rec.by_key.values()}),  # aliases (seeds_of) once
            "generated_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _num(x, digits: int = 2) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


def _paper_in_ci(row: dict) -> str:
    """``"yes (V)"`` / ``"no (V)"`` for a measured row with a paper value ``V`` in our units, else ``"-"``."""
    if "paper_effect_in_ci" not in row:
        return "-"
    return f"{'yes' if row['paper_effect_in_ci'] else 'no'} ({_num(row['paper_effect'], 1)})"


def format_markdown(report: dict, command: str) -> str:
    """The report as markdown: verdict table, notes, scan, MQAR escape table, Holm note, cell progress."""
    lines = (_verdict_table(report, command) + _notes_section(report) + _details_and_holm(report)
             + _scan_and_trend(report) + _rank_section(report) + _comparisons_and_added(report)
             + _progress_section(report))
    return "\n".join(lines) + "\n"


def _verdict_table(report: dict, command: str) -> list[str]:
    """The title, how to regenerate, and one row per claim (markdown lines)."""
    lines = [f"# Claims report: protocol `{report['protocol']}`", "", report["description"] + ".", "",
             f"Regenerate: `{command}` (trains the runs whose records are missing, then writes this report; add "
             "`--report-only` to rebuild it from the committed records).", "", f"Generated {report['generated_utc']} from {report['n_records']} run "
             "records. Effects are means over seeds with 95% t intervals (paired by seed where two variants are "
             "compared); the primary metric is the in-distribution held-out test perplexity.", "",
             "| id | claim | paper | measured effect | mean [95% CI] | n | tokens/run | training hours (sum) | verdict | "
             "paper's value in our CI |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        if r["verdict"] == "not run":
            p = r.get("provisional")
            eff, val = (p["effect"], f"provisional: {_num(p['mean'])} [{_num(p['low'])}, {_num(p['high'])}]") if p \
                else ("-", "-")
            n = p["n"] if p else "-"
            lines.append(f"| {r['id']} | {r['claim']} | {r['paper']} | {eff} | {val} | {n} | - | - | not run: "
                         f"{r['reason']} | - |")
            continue
        tokens = ", ".join(f"{t:,}" for t in r["tokens"]) or "-"
        lines.append(f"| {r['id']} | {r['claim']} | {r['paper']} | {r['effect']} | {_num(r['mean'])} "
                     f"[{_num(r['low'])}, {_num(r['high'])}] | {r['n']} | {tokens} | {_num(r['train_hours'])} | "
                     f"**{r['verdict']}** | {_paper_in_ci(r)} |")
    return lines


def _notes_section(report: dict) -> list[str]:
    """The notes: the protocol's, how to read the paper's value, C11's source, expected hours."""
    lines: list[str] = []
    lines += ["", "## Notes", ""] + [f"- {n}" for n in report["notes"]]
    lines.append("- \"Paper's value in our CI\": the paper's number in the units of our effect "
                 "(`claims.PAPER_EFFECTS`); \"no\" excludes that magnitude at this scale, not at the paper's.")
    c11 = next((r for r in report["rows"] if r["id"] == "C11"), None)
    if c11 and c11["verdict"] != "not run":
        lines.append("- C11 is read from GLUE fine-tuning results (`--glue-json`; default "
                     "`docs/results/glue-cpu/results.json`, with its own pretraining budget and one pretrained "
                     "checkpoint per model, so its seeds are fine-tuning seeds), not from this protocol's runs.")
    if report["expected_hours"]:
        lines.append("- Expected hours: " + ", ".join(f"{k}: {v}" for k, v in report["expected_hours"].items()))
    return lines


def _details_and_holm(report: dict) -> list[str]:
    """Each claim's details (JSON) and Holm's adjustment for multiple comparisons."""
    lines: list[str] = []
    lines += ["", "## Details", ""]
    for r in report["rows"]:
        if r.get("details"):
            lines.append(f"- **{r['id']}**: `{json.dumps(_round(r['details']))}`")
    if report["holm"]:
        lines += ["", "## Multiple comparisons", "",
                  f"Verdicts use unadjusted 95% intervals. Holm's adjustment over the {len(report['holm'])} claims "
                  "tested for a difference (equivalence claims C2 and C5 are judged by their intervals and left out; "
                  "family-wise error 0.05). 'Survives' applies to reproduced or contradicted verdicts:", "",
                  "| id | p | Holm p | verdict | survives Holm |", "|---|---|---|---|---|"]
        survive = {True: "yes", False: "no", None: "-"}
        lines += [f"| {h['id']} | {h['p']:.3g} | {h['holm_p']:.3g} | {h['verdict']} | {survive[h['survives']]} |"
                  for h in report["holm"]]
    return lines


def _scan_and_trend(report: dict) -> list[str]:
    """The one-factor-at-a-time scan and the trend of the effect with training tokens."""
    lines: list[str] = []
    if report["scan"]:
        lines += ["", "## Where does coupling help? One factor at a time", "",
                  "The question the paper leaves open: each factor changes one setting of the `wv-tiny` cell (the "
                  "standard run of the same setting is the reference; dt_init and the force's width change only the "
                  "coupled model, so they are compared with `wv-tiny`'s standard runs).", "",
                  "| factor | coupled vs standard, held-out test ppl % [95% CI] | n | status |", "|---|---|---|---|"]
        for s in report["scan"]:
            eff = f"{_num(s.get('mean'))} [{_num(s.get('low'))}, {_num(s.get('high'))}]" if "mean" in s else "-"
            lines.append(f"| {s['factor']} | {eff} | {s.get('n', '-')} | {s['status']} |")
    trend = report.get("token_trend")
    if trend and trend["budgets"]:
        lines += ["", "## Trend with training tokens", "",
                  "Runs of `" + "`, `".join(TREND_CELLS) + "` in this protocol and in those that differ from it only in "
                  "the budget and the budget-proportional warmup and validation interval (each budget its own run and "
                  "learning-rate schedule). Coupled vs standard, % change of held-out test perplexity, mean over the "
                  "seeds each budget has [95% CI]:", "",
                  "| tokens per run | coupled vs standard % [95% CI] | n |", "|---|---|---|"]
        lines += [f"| {b['tokens']:,} | {_num(b['mean'])} [{_num(b['low'])}, {_num(b['high'])}] | {b['n']} |"
                  for b in trend["budgets"]]
        if trend["status"] == "measured":
            sl = trend["slope"]
            lines += ["", f"Slope against log2(tokens), fitted per seed over the seeds run at every budget, t interval "
                      f"over those seeds: {_num(sl['mean'])} "
                      f"[{_num(sl['low'])}, {_num(sl['high'])}] % per doubling, n = {sl['n']} seeds, p = {sl['p']:.3g} "
                      "(negative: coupled's change falls, i.e. its advantage grows, with training)."]
        else:
            lines += ["", f"Slope: {trend['status']}."]
    return lines


def _comparisons_and_added(report: dict) -> list[str]:
    """The paired comparisons (:data:`COMPARISONS`), the MQAR escape table and the variants added with ``claims --variants``."""
    lines: list[str] = []
    for key, (title, intro, _) in COMPARISONS.items():
        if not report.get(key):
            continue
        lines += ["", f"## {title}", "", intro + " Held-out test perplexity (mean over seeds) and the % change of "
                  "the second vs the first, paired by seed:", "",
                  "| comparison | ppl (first, second) | % [95% CI] | n | p | status |", "|---|---|---|---|---|---|"]
        for g in report[key]:
            eff = f"{_num(g.get('mean'))} [{_num(g.get('low'))}, {_num(g.get('high'))}]" if "mean" in g else "-"
            ppl = f"{_num(g.get('a_ppl'), 1)}, {_num(g.get('b_ppl'), 1)}" if "a_ppl" in g else "-"
            p = f"{g['p']:.3g}" if isinstance(g.get("p"), float) else "-"
            lines.append(f"| {g['comparison']} | {ppl} | {eff} | {g.get('n', '-')} | {p} | {g['status']} |")
    if report["mqar_escape"]:
        lines += ["", "## MQAR: which learning rates escape the 1/K plateau", "",
                  "Each run stops early once its validation accuracy reaches 0.99, so runs differ in tokens; C12 compares "
                  "each seed's best accuracy over the learning rates.", "",
                  "| difficulty | lr | variant | seeds escaped (acc >= 0.9) | mean accuracy |", "|---|---|---|---|---|"]
        lines += [f"| {m['difficulty']} | {m['lr']:g} | {m['variant']} | {m['escaped']}/{m['n']} | {m['mean_accuracy']:.3f} |"
                  for m in report["mqar_escape"]]
    if report.get("extra_variants"):
        lines += ["", "## Added variants (claims --variants)", "",
                  "Each added variant against the standard runs of the same cell, paired by seed: held-out test "
                  "perplexity (standard, added) and the % change.", "",
                  "| variant | cell | ppl (standard, added) | % [95% CI] | n | status |", "|---|---|---|---|---|---|"]
        for g in report["extra_variants"]:
            eff = f"{_num(g.get('mean'))} [{_num(g.get('low'))}, {_num(g.get('high'))}]" if "mean" in g else "-"
            ppl = f"{_num(g.get('a_ppl'), 1)}, {_num(g.get('b_ppl'), 1)}" if "a_ppl" in g else "-"
            lines.append(f"| {g['variant']} | {g['cell']} | {ppl} | {eff} | {g.get('n', '-')} | {g['status']} |")
    return lines


def _progress_section(report: dict) -> list[str]:
    """Finished and planned runs per cell."""
    lines: list[str] = []
    lines += ["", "## Progress", "", "| cell | claims | finished / planned runs | tokens/run | train hours |",
              "|---|---|---|---|---|"]
    lines += [f"| {c['cell']} | {', '.join(c['claims'])} | {c['finished']}/{c['planned']} | "
              f"{', '.join(f'{t:,}' for t in c['tokens_per_run']) or '-'} | {_num(c['train_hours'])} |"
              for c in report["cells"]]
    return lines


def _rank_section(report: dict) -> list[str]:
    """Markdown of C13's question "does effective rank go with perplexity across runs", pooled and within cells."""
    row = next((r for r in report["rows"] if r["id"] == "C13"), None)
    corr = (row or {}).get("details", {}).get("rank_vs_ppl")
    if not corr:
        return []
    w = corr.get("within_cell")
    lines = ["", "## Effective rank and perplexity across runs (C13)", "",
             f"Runs of the tiny wiki-vital cells with the `wv-tiny` tokenizer (`{report['protocol']}-rank.png`): "
             "layer-mean effective rank of the attention maps against held-out test perplexity. Pearson r [95% "
             "Fisher interval], p:", "", "| correlation | runs (cells) | r [95% CI] | p |", "|---|---|---|---|",
             f"| pooled over runs | {corr['n']} | {_num(corr['pearson_r'])} [{_num(corr['low'])}, {_num(corr['high'])}] "
             f"| {corr['p']:.3g} (Spearman rho {_num(corr['spearman_rho'])}, p {corr['spearman_p']:.3g}) |"]
    if w:
        lines.append(f"| within cells (centred on each cell's means) | {w['n']} ({w['groups']}) | "
                     f"{_num(w['pearson_r'])} [{_num(w['low'])}, {_num(w['high'])}] | {w['p']:.3g} |")
    lines += ["", "Negative r: higher rank, lower perplexity (the paper's reading). The pooled number mixes cells "
              "that differ in budget and head layout, which move both quantities; the within-cell correlation "
              "compares runs of one setup (variants and seeds) only."]
    return lines


def format_readme_section(report: dict, command: str) -> str:
    """The README's results section: one verdict table (claim, measured effect, verdict) and the command."""
    lines = [f"Produced by `{command}` (protocol `{report['protocol']}`: {report['description']}; "
             f"{report['n_records']} runs). Effects: mean over seeds with a 95% interval, paired by seed; "
             f"full report: `docs/results/claims/{report['protocol']}.md`.", "",
             "| claim | paper | measured here | verdict | paper's value in our CI |", "|---|---|---|---|---|"]
    for r in report["rows"]:
        if r["verdict"] == "not run":
            p = r.get("provisional")
            got = f"provisional, n = {p['n']}: {p['effect']}: {_num(p['mean'])} [{_num(p['low'])}, {_num(p['high'])}]" \
                if p else "-"
            lines.append(f"| {r['id']} {r['claim']} | {r['paper']} | {got} | not run ({r['reason']}) | - |")
        else:
            lines.append(f"| {r['id']} {r['claim']} | {r['paper']} | {r['effect']}: {_num(r['mean'])} "
                         f"[{_num(r['low'])}, {_num(r['high'])}], n = {r['n']} | {r['verdict']} | {_paper_in_ci(r)} |")
    return "\n".join(lines) + "\n"


def _round(obj, digits: int = 4):
    if isinstance(obj, float):
        return round(obj, digits) if math.isfinite(obj) else str(obj)
    if isinstance(obj, dict):
        return {str(k): _round(v, digits) for k, v in obj.items() if k != "differences"}
    if isinstance(obj, list):
        return [_round(v, digits) for v in obj]
    return obj


def report_dir(out_dir: str | Path, protocol_name: str, overwrite: bool = False) -> OutputDir:
    """Claim the claims report folder before any training: it may hold reports of any protocol (``*.json``,
    ``*.md``), ``figures/`` and ``runs/`` (the run records); this protocol's report files are regenerated by
    every invocation (the documented resume path), anything else there is refused.

    Raises:
        ValueError: the folder is a file, not writable, or holds other files (naming ``--out-dir``).
    """
    mine = (f"{protocol_name}.json", f"{protocol_name}.md", f"{protocol_name}-readme.md",
            f"figures/{protocol_name}-*.png")
    return OutputDir(out_dir, "--out-dir", overwrite=overwrite, what="a claims report",
                     layout=("*.json", "*.md", "figures/", "runs/"), rewrite=mine)


def write_report(report: dict, protocol: Protocol, out_dir: str | Path | OutputDir, command: str,
                 figures: bool = True) -> list[Path]:
    """Write ``<protocol>.json``, ``<protocol>.md`` and (``figures``) the PNGs; return the paths written.

    ``out_dir`` may be the command's claim (:func:`report_dir`); a plain path is claimed here the same way.
    Every file is written atomically.
    """
    name = report["protocol"]
    out = out_dir if isinstance(out_dir, OutputDir) else report_dir(out_dir, name)
    files = [f"{name}.json", f"{name}.md", f"{name}-readme.md"]
    for f in files:
        out.claim(f, check_only=True)
    paths = [out.write_text(files[0], json.dumps(_round(report, 6), indent=1)),
             out.write_text(files[1], format_markdown(report, command)),
             out.write_text(files[2], format_readme_section(report, command))]
    if figures:
        from coupled_qk.experiments.claims.plots import make_figures

        paths += make_figures(report, Records.load(out.path, protocol), out.path / "figures",
                              save_as=lambda rel, draw: out.write_with(Path("figures") / rel, draw))
    return paths
