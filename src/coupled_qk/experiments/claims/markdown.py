"""The claims report (a dict from :func:`coupled_qk.experiments.claims.build.build_report`) as markdown: the
full report (:func:`format_markdown`) and the README's results section (:func:`format_readme_section`)."""

from __future__ import annotations

import json
import math

from coupled_qk.experiments.claims.build import COMPARISONS, TREND_CELLS


def fmt(x, digits: int = 2) -> str:
    """``x`` with ``digits`` decimals, or ``"-"`` for ``None`` and non-finite floats (report tables)."""
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


def paper_in_ci(row: dict) -> str:
    """``"yes (V)"`` / ``"no (V)"`` for a measured row with a paper value ``V`` in our units, else ``"-"``."""
    if "paper_effect_in_ci" not in row:
        return "-"
    return f"{'yes' if row['paper_effect_in_ci'] else 'no'} ({fmt(row['paper_effect'], 1)})"


def format_markdown(report: dict, command: str) -> str:
    """The report as markdown: verdict table, notes, scan, MQAR escape table, Holm note, cell progress."""
    lines = (
        _verdict_table(report, command)
        + _notes_section(report)
        + _details_and_holm(report)
        + _scan_and_trend(report)
        + _rank_section(report)
        + _comparisons_and_added(report)
        + _progress_section(report)
    )
    return "\n".join(lines) + "\n"


def _verdict_table(report: dict, command: str) -> list[str]:
    """The title, how to regenerate, and one row per claim (markdown lines)."""
    lines = [
        f"# Claims report: protocol `{report['protocol']}`",
        "",
        report["description"] + ".",
        "",
        f"Regenerate: `{command}` (trains the runs whose records are missing, then writes this report; add "
        "`--report-only` to rebuild it from the committed records).",
        "",
        f"Generated {report['generated_utc']} from {report['n_records']} run "
        "records. Effects are means over seeds with 95% t intervals (paired by seed where two variants are "
        "compared); the primary metric is the in-distribution held-out test perplexity.",
        "",
        "| id | claim | paper | measured effect | mean [95% CI] | n | tokens/run | training hours (sum) | verdict | "
        "paper's value in our CI |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        if r["verdict"] == "not run":
            p = r.get("provisional")
            eff, val = (
                (p["effect"], f"provisional: {fmt(p['mean'])} [{fmt(p['low'])}, {fmt(p['high'])}]") if p else ("-", "-")
            )
            n = p["n"] if p else "-"
            lines.append(
                f"| {r['id']} | {r['claim']} | {r['paper']} | {eff} | {val} | {n} | - | - | not run: "
                f"{r['reason']} | - |"
            )
            continue
        tokens = ", ".join(f"{t:,}" for t in r["tokens"]) or "-"
        lines.append(
            f"| {r['id']} | {r['claim']} | {r['paper']} | {r['effect']} | {fmt(r['mean'])} "
            f"[{fmt(r['low'])}, {fmt(r['high'])}] | {r['n']} | {tokens} | {fmt(r['train_hours'])} | "
            f"**{r['verdict']}** | {paper_in_ci(r)} |"
        )
    return lines


def _notes_section(report: dict) -> list[str]:
    """The notes: the protocol's, how to read the paper's value, C11's source, expected hours."""
    lines: list[str] = []
    lines += ["", "## Notes", ""] + [f"- {n}" for n in report["notes"]]
    lines.append(
        "- \"Paper's value in our CI\": the paper's number in the units of our effect "
        '(`claims.PAPER_EFFECTS`); "no" excludes that magnitude at this scale, not at the paper\'s.'
    )
    c11 = next((r for r in report["rows"] if r["id"] == "C11"), None)
    if c11 and c11["verdict"] != "not run":
        lines.append(
            "- C11 is read from GLUE fine-tuning results (`--glue-json`; default "
            "`docs/results/glue-cpu/results.json`, with its own pretraining budget and one pretrained "
            "checkpoint per model, so its seeds are fine-tuning seeds), not from this protocol's runs."
        )
    if report["expected_hours"]:
        lines.append("- Expected hours: " + ", ".join(f"{k}: {v}" for k, v in report["expected_hours"].items()))
    return lines


def _details_and_holm(report: dict) -> list[str]:
    """Each claim's details (JSON) and Holm's adjustment for multiple comparisons."""
    lines: list[str] = []
    lines += ["", "## Details", ""]
    for r in report["rows"]:
        if r.get("details"):
            lines.append(f"- **{r['id']}**: `{json.dumps(round_floats(r['details']))}`")
    if report["holm"]:
        lines += [
            "",
            "## Multiple comparisons",
            "",
            f"Verdicts use unadjusted 95% intervals. Holm's adjustment over the {len(report['holm'])} claims "
            "tested for a difference (equivalence claims C2 and C5 are judged by their intervals and left out; "
            "family-wise error 0.05). 'Survives' applies to reproduced or contradicted verdicts:",
            "",
            "| id | p | Holm p | verdict | survives Holm |",
            "|---|---|---|---|---|",
        ]
        survive = {True: "yes", False: "no", None: "-"}
        lines += [
            f"| {h['id']} | {h['p']:.3g} | {h['holm_p']:.3g} | {h['verdict']} | {survive[h['survives']]} |"
            for h in report["holm"]
        ]
    return lines


def _scan_and_trend(report: dict) -> list[str]:
    """The one-factor-at-a-time scan and the trend of the effect with training tokens."""
    lines: list[str] = []
    if report["scan"]:
        lines += [
            "",
            "## Where does coupling help? One factor at a time",
            "",
            "The question the paper leaves open: each factor changes one setting of the `wv-tiny` cell (the "
            "standard run of the same setting is the reference; dt_init and the force's width change only the "
            "coupled model, so they are compared with `wv-tiny`'s standard runs).",
            "",
            "| factor | coupled vs standard, held-out test ppl % [95% CI] | n | status |",
            "|---|---|---|---|",
        ]
        for s in report["scan"]:
            eff = f"{fmt(s.get('mean'))} [{fmt(s.get('low'))}, {fmt(s.get('high'))}]" if "mean" in s else "-"
            lines.append(f"| {s['factor']} | {eff} | {s.get('n', '-')} | {s['status']} |")
    trend = report.get("token_trend")
    if trend and trend["budgets"]:
        lines += [
            "",
            "## Trend with training tokens",
            "",
            "Runs of `" + "`, `".join(TREND_CELLS) + "` in this protocol and in those that differ from it only in "
            "the budget and the budget-proportional warmup and validation interval (each budget its own run and "
            "learning-rate schedule). Coupled vs standard, % change of held-out test perplexity, mean over the "
            "seeds each budget has [95% CI]:",
            "",
            "| tokens per run | coupled vs standard % [95% CI] | n |",
            "|---|---|---|",
        ]
        lines += [
            f"| {b['tokens']:,} | {fmt(b['mean'])} [{fmt(b['low'])}, {fmt(b['high'])}] | {b['n']} |"
            for b in trend["budgets"]
        ]
        if trend["status"] == "measured":
            sl = trend["slope"]
            lines += [
                "",
                f"Slope against log2(tokens), fitted per seed over the seeds run at every budget, t interval "
                f"over those seeds: {fmt(sl['mean'])} "
                f"[{fmt(sl['low'])}, {fmt(sl['high'])}] % per doubling, n = {sl['n']} seeds, p = {sl['p']:.3g} "
                "(negative: coupled's change falls, i.e. its advantage grows, with training).",
            ]
        else:
            lines += ["", f"Slope: {trend['status']}."]
    return lines


def _comparisons_and_added(report: dict) -> list[str]:
    """The paired comparisons (:data:`COMPARISONS`), the MQAR escape table and the variants added with
    ``claims --variants``."""
    lines: list[str] = []
    for key, (title, intro, _) in COMPARISONS.items():
        if not report.get(key):
            continue
        lines += [
            "",
            f"## {title}",
            "",
            intro + " Held-out test perplexity (mean over seeds) and the % change of "
            "the second vs the first, paired by seed:",
            "",
            "| comparison | ppl (first, second) | % [95% CI] | n | p | status |",
            "|---|---|---|---|---|---|",
        ]
        for g in report[key]:
            eff = f"{fmt(g.get('mean'))} [{fmt(g.get('low'))}, {fmt(g.get('high'))}]" if "mean" in g else "-"
            ppl = f"{fmt(g.get('a_ppl'), 1)}, {fmt(g.get('b_ppl'), 1)}" if "a_ppl" in g else "-"
            p = f"{g['p']:.3g}" if isinstance(g.get("p"), float) else "-"
            lines.append(f"| {g['comparison']} | {ppl} | {eff} | {g.get('n', '-')} | {p} | {g['status']} |")
    if report["mqar_escape"]:
        lines += [
            "",
            "## MQAR: which learning rates escape the 1/K plateau",
            "",
            "Each run stops early once its validation accuracy reaches 0.99, so runs differ in tokens; C12 compares "
            "each seed's best accuracy over the learning rates.",
            "",
            "| difficulty | lr | variant | seeds escaped (acc >= 0.9) | mean accuracy |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {m['difficulty']} | {m['lr']:g} | {m['variant']} | {m['escaped']}/{m['n']} | {m['mean_accuracy']:.3f} |"
            for m in report["mqar_escape"]
        ]
    if report.get("extra_variants"):
        lines += [
            "",
            "## Added variants (claims --variants)",
            "",
            "Each added variant against the standard runs of the same cell, paired by seed: held-out test "
            "perplexity (standard, added) and the % change.",
            "",
            "| variant | cell | ppl (standard, added) | % [95% CI] | n | status |",
            "|---|---|---|---|---|---|",
        ]
        for g in report["extra_variants"]:
            eff = f"{fmt(g.get('mean'))} [{fmt(g.get('low'))}, {fmt(g.get('high'))}]" if "mean" in g else "-"
            ppl = f"{fmt(g.get('a_ppl'), 1)}, {fmt(g.get('b_ppl'), 1)}" if "a_ppl" in g else "-"
            lines.append(f"| {g['variant']} | {g['cell']} | {ppl} | {eff} | {g.get('n', '-')} | {g['status']} |")
    return lines


def _progress_section(report: dict) -> list[str]:
    """Finished and planned runs per cell."""
    lines: list[str] = []
    lines += [
        "",
        "## Progress",
        "",
        "| cell | claims | finished / planned runs | tokens/run | train hours |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {c['cell']} | {', '.join(c['claims'])} | {c['finished']}/{c['planned']} | "
        f"{', '.join(f'{t:,}' for t in c['tokens_per_run']) or '-'} | {fmt(c['train_hours'])} |"
        for c in report["cells"]
    ]
    return lines


def _rank_section(report: dict) -> list[str]:
    """Markdown of C13's question "does effective rank go with perplexity across runs", pooled and within cells."""
    row = next((r for r in report["rows"] if r["id"] == "C13"), None)
    corr = (row or {}).get("details", {}).get("rank_vs_ppl")
    if not corr:
        return []
    w = corr.get("within_cell")
    lines = [
        "",
        "## Effective rank and perplexity across runs (C13)",
        "",
        f"Runs of the tiny wiki-vital cells with the `wv-tiny` tokenizer (`{report['protocol']}-rank.png`): "
        "layer-mean effective rank of the attention maps against held-out test perplexity. Pearson r [95% "
        "Fisher interval], p:",
        "",
        "| correlation | runs (cells) | r [95% CI] | p |",
        "|---|---|---|---|",
        f"| pooled over runs | {corr['n']} | {fmt(corr['pearson_r'])} [{fmt(corr['low'])}, {fmt(corr['high'])}] "
        f"| {corr['p']:.3g} (Spearman rho {fmt(corr['spearman_rho'])}, p {corr['spearman_p']:.3g}) |",
    ]
    if w:
        lines.append(
            f"| within cells (centred on each cell's means) | {w['n']} ({w['groups']}) | "
            f"{fmt(w['pearson_r'])} [{fmt(w['low'])}, {fmt(w['high'])}] | {w['p']:.3g} |"
        )
    lines += [
        "",
        "Negative r: higher rank, lower perplexity (the paper's reading). The pooled number mixes cells "
        "that differ in budget and head layout, which move both quantities; the within-cell correlation "
        "compares runs of one setup (variants and seeds) only.",
    ]
    return lines


def format_readme_section(report: dict, command: str) -> str:
    """The README's results section: one verdict table (claim, measured effect, verdict) and the command."""
    lines = [
        f"Produced by `{command}` (protocol `{report['protocol']}`: {report['description']}; "
        f"{report['n_records']} runs). Effects: mean over seeds with a 95% interval, paired by seed; "
        f"full report: `docs/results/claims/{report['protocol']}.md`.",
        "",
        "| claim | paper | measured here | verdict | paper's value in our CI |",
        "|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        if r["verdict"] == "not run":
            p = r.get("provisional")
            got = (
                f"provisional, n = {p['n']}: {p['effect']}: {fmt(p['mean'])} [{fmt(p['low'])}, {fmt(p['high'])}]"
                if p
                else "-"
            )
            lines.append(f"| {r['id']} {r['claim']} | {r['paper']} | {got} | not run ({r['reason']}) | - |")
        else:
            lines.append(
                f"| {r['id']} {r['claim']} | {r['paper']} | {r['effect']}: {fmt(r['mean'])} "
                f"[{fmt(r['low'])}, {fmt(r['high'])}], n = {r['n']} | {r['verdict']} | {paper_in_ci(r)} |"
            )
    return "\n".join(lines) + "\n"


def round_floats(obj, digits: int = 4):
    """``obj`` with every float rounded to ``digits`` (non-finite ones as strings) and the
    ``differences`` entries dropped, for the JSON report and the details lines."""
    if isinstance(obj, float):
        return round(obj, digits) if math.isfinite(obj) else str(obj)
    if isinstance(obj, dict):
        return {str(k): round_floats(v, digits) for k, v in obj.items() if k != "differences"}
    if isinstance(obj, list):
        return [round_floats(v, digits) for v in obj]
    return obj
