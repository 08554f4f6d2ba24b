"""A report of one verdict row per claim (``docs/METHOD.md`` section 3), with the tables a study declares beside it:
a one-factor scan, paired comparisons, the trend of an effect with training tokens pooled over studies that
differ only in their budget, a score table (MQAR's escapes), a correlation across runs, the variants added from
the command line, and the progress of every cell.

A claim whose runs are still missing is ``not run`` with the reason, and its numbers from the runs finished so
far (at least 2 paired seeds) are shown as provisional. Holm's adjustment runs over every claim tested for a
difference (a finite p).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass

import numpy as np

from coupled_qk.study import stats
from coupled_qk.study.claims import NotReady
from coupled_qk.study.design import PRIMARY
from coupled_qk.study.report import ReportContext, fmt, paired, paper_in_ci, round_floats

ALPHA = 0.05


@dataclass(frozen=True)
class PairedTable:
    """Paired comparisons reported beside the claims: rows of ``(label, arm a, arm b)``, each the % change of
    ``b`` against ``a`` in held-out test perplexity."""

    key: str
    title: str
    intro: str
    rows: tuple


@dataclass(frozen=True)
class ScanTable:
    """One factor at a time: rows of ``(label, standard arm, coupled arm)``."""

    title: str
    intro: str
    rows: tuple


@dataclass(frozen=True)
class TokenTrend:
    """How an effect (``b`` vs ``a`` in ``cells``) changes with training tokens, pooled over ``studies`` (the study
    itself and those that differ from it only in the budget). The same seed shares its initialisation and data
    order across budgets, so a seed's points are not independent: the slope against ``log2(tokens)`` is fitted
    per seed (least squares, seeds with at least 2 budgets) and the t interval is taken over the seeds' slopes."""

    studies: tuple[str, ...]
    cells: tuple[str, ...]
    intro: str
    a: str = "standard"
    b: str = "coupled"


@dataclass(frozen=True)
class ScoreTable:
    """Per scored cell (``labels`` with ``difficulty`` and ``lr``) and variant: how many seeds reached
    ``threshold`` of ``metric`` and the mean."""

    title: str
    intro: str
    threshold: float
    metric: str = "valid/accuracy"


@dataclass(frozen=True)
class CorrelationSection:
    """The correlation a claim's details hold (``claim``'s ``details[name]``), as a table with its reading."""

    claim: str
    name: str
    title: str
    intro: str
    reading: str


@dataclass(frozen=True)
class VerdictReport:
    """The layout: the tables it shows beside the claims, and the texts a reader needs (all optional).

    Attributes:
        measured_notes: ``{claim id: note}`` added to the notes when that claim is measured.
        holm: the claim ids of the Holm family (those with a finite p are adjusted together; ``None``: every claim).
        holm_note: what the Holm family leaves out, in the multiple-comparisons section.
        curves: ``(cell, variants)`` whose loss curves the figure draws, one line per seed.
    """

    scan: ScanTable | None = None
    comparisons: tuple[PairedTable, ...] = ()
    trend: TokenTrend | None = None
    scores: ScoreTable | None = None
    correlation: CorrelationSection | None = None
    measured_notes: tuple = ()
    holm: tuple[str, ...] | None = None
    holm_note: str = ""
    curves: tuple = ()

    # ---- build ----------------------------------------------------------------------------------------------
    def build(self, ctx: ReportContext) -> dict:
        """The report: ``{"protocol", "description", "notes", "expected_hours", "primary_metric", "rows": [one per
        claim], "scan", <comparisons>, "token_trend", "mqar_escape", "holm", "extra_variants", "cells", "n_records",
        "generated_utc"}``; each row has ``id, claim, paper, verdict, reason`` and, when measured, ``effect, mean,
        low, high, n, p, tokens, train_hours, details``."""
        study, ev = ctx.study, ctx.evidence
        rows = [self._row(ctx, claim) for claim in study.claims]
        family = [r for r in rows if self.holm is None or r["id"] in self.holm]
        tested = [r for r in family if isinstance(r.get("p"), float) and math.isfinite(r["p"])]
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
        runnable = study.runnable
        return {
            "protocol": study.name,
            "description": study.description,
            "notes": list(ctx.notes),
            "expected_hours": study.expected_hours,
            "primary_metric": PRIMARY,
            "rows": rows,
            "scan": self._scan(ev) if runnable and self.scan else [],
            **(self._comparisons(ev) if runnable else {}),
            "token_trend": self._trend(ctx) if runnable and self.trend else None,
            "mqar_escape": self._scores(ev),
            "holm": holm,
            "extra_variants": self._extra_variants(ev, study),
            "cells": self._cells(ev),
            "n_records": len({id(r) for r in ev.by_key.values()}),  # aliases (seeds_of) once
            "generated_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }

    def _row(self, ctx: ReportContext, claim) -> dict:
        row = {"id": claim.id, "claim": claim.text, "paper": claim.paper}
        if not ctx.study.runnable:
            row.update(verdict="not run", reason=f"protocol {ctx.study.name!r} is defined but not run here")
        else:
            try:
                row.update(claim.test.evaluate(ctx.evidence), reason="")
            except NotReady as exc:
                row.update(verdict="not run", reason=str(exc))
                provisional = _provisional(ctx, claim) if "in progress" in str(exc) else None
                if provisional:
                    row["provisional"] = provisional
        value = claim.paper_effect
        if (
            value is not None
            and row["verdict"] != "not run"
            and math.isfinite(row["low"])
            and math.isfinite(row["high"])
        ):
            row.update(paper_effect=value, paper_effect_in_ci=bool(row["low"] <= value <= row["high"]))
        return row

    def _scan(self, ev) -> list[dict]:
        return [
            {"factor": label, "coupled": b.label, "standard": a.label, **paired(ev, a, b)}
            for label, a, b in self.scan.rows
        ]

    def _comparisons(self, ev) -> dict[str, list[dict]]:
        out = {}
        for table in self.comparisons:
            if all(ev.plan.cell(x.cell) is not None for _, a, b in table.rows for x in (a, b)):
                out[table.key] = [
                    {"comparison": label, "a": "/".join(a.key), "b": "/".join(b.key), **paired(ev, a, b)}
                    for label, a, b in table.rows
                ]
        return out

    def _trend(self, ctx: ReportContext) -> dict:
        """``{"budgets": [{"tokens", "n", "mean", "low", "high"}...], "per_seed": {seed: [[tokens, %]...]},
        "slope": {...} (% per doubling of tokens), "status"}``; ``status`` is ``"measured"`` or ``"not run
        (reason)"`` (fewer than 2 seeds with 2 budgets)."""
        t = self.trend
        points: dict[int, dict[int, float]] = {}
        ladder = t.studies if ctx.study.name in t.studies else (ctx.study.name,)
        for name in ladder:
            ev = ctx.evidence if name == ctx.study.name else ctx.evidence.studies(name)
            for cell in t.cells:
                std, cou = ev.values(cell, t.a), ev.values(cell, t.b)
                for seed in sorted(set(std) & set(cou)):
                    tokens = ev.by_key[(cell, t.b, seed)]["tokens"]
                    points.setdefault(seed, {})[tokens] = 100 * (cou[seed] / std[seed] - 1)
        by_budget: dict[int, list[float]] = {}
        for per in points.values():
            for tokens, pct in per.items():
                by_budget.setdefault(tokens, []).append(pct)
        keep = ("n", "mean", "low", "high")
        budgets = [
            {"tokens": b, **{k: v for k, v in stats.mean_ci(by_budget[b]).items() if k in keep}}
            for b in sorted(by_budget)
        ]
        slopes = [
            float(np.polyfit(np.log2(sorted(per)), [per[b] for b in sorted(per)], 1)[0])
            for per in points.values()
            if len(per) >= 2
        ]
        out = {"budgets": budgets, "per_seed": {s: sorted(per.items()) for s, per in sorted(points.items())}}
        if len(slopes) < 2:
            return {**out, "status": f"not run ({len(slopes)} seeds with runs at 2 or more budgets; 2 needed)"}
        return {**out, "slope": stats.mean_ci(slopes), "status": "measured"}

    def _scores(self, ev) -> list[dict]:
        if self.scores is None:
            return []
        out = []
        for _, c in ev.plan.cells:
            if c.labels is None:
                continue
            for v in c.variants:
                accs = list(ev.values(c.name, v, self.scores.metric).values())
                if accs:
                    out.append(
                        {
                            "difficulty": c.labels["difficulty"],
                            "lr": c.labels["lr"],
                            "variant": v,
                            "n": len(accs),
                            "escaped": sum(a >= self.scores.threshold for a in accs),
                            "mean_accuracy": sum(accs) / len(accs),
                        }
                    )
        return out

    @staticmethod
    def _extra_variants(ev, study) -> list[dict]:
        """Each variant added from the command line against the ``standard`` runs of every language-model cell
        that has them (paired % change of held-out test perplexity)."""
        return [
            {"variant": v, "cell": c.name, **paired(ev, (c.name, "standard"), (c.name, v))}
            for v in study.extra_variants
            for _, c in ev.plan.cells
            if c.labels is None and "standard" in c.variants and v != "standard"
        ]

    @staticmethod
    def _cells(ev) -> list[dict]:
        cells = []
        for _, c in ev.plan.cells:
            done = [r for r in ev.runs(c.name) if r["cell"] == c.name]  # not the seeds_of cells' records it aliases
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
        return cells

    # ---- write ----------------------------------------------------------------------------------------------
    @staticmethod
    def json_text(report: dict) -> str:
        """The JSON file's text (floats rounded to 6 digits)."""
        return json.dumps(round_floats(report, 6), indent=1)

    summary_end = "\n## Notes"
    """Where the summary the command prints ends."""

    def markdown(self, report: dict, commands) -> str:
        """The report as markdown: verdict table, notes, details and Holm, the tables, cell progress."""
        lines = (
            _verdict_table(report, commands)
            + self._notes(report)
            + self._details_and_holm(report)
            + self._scan_and_trend(report)
            + self._correlation(report)
            + self._tables(report)
            + _progress(report)
        )
        return "\n".join(lines) + "\n"

    def _notes(self, report: dict) -> list[str]:
        lines = ["", "## Notes", ""] + [f"- {n}" for n in report["notes"]]
        lines.append(
            "- \"Paper's value in our CI\": the paper's number in the units of our effect "
            '(`claims.PAPER_EFFECTS`); "no" excludes that magnitude at this scale, not at the paper\'s.'
        )
        rows = {r["id"]: r for r in report["rows"]}
        for cid, note in self.measured_notes:
            if cid in rows and rows[cid]["verdict"] != "not run":
                lines.append(f"- {note}")
        if report["expected_hours"]:
            lines.append("- Expected hours: " + ", ".join(f"{k}: {v}" for k, v in report["expected_hours"].items()))
        return lines

    def _details_and_holm(self, report: dict) -> list[str]:
        lines = ["", "## Details", ""]
        for r in report["rows"]:
            if r.get("details"):
                lines.append(f"- **{r['id']}**: `{json.dumps(round_floats(r['details']))}`")
        if report["holm"]:
            lines += [
                "",
                "## Multiple comparisons",
                "",
                f"Verdicts use unadjusted 95% intervals. Holm's adjustment over the {len(report['holm'])} claims "
                f"tested for a difference ({self.holm_note}family-wise error 0.05). 'Survives' applies to reproduced "
                "or contradicted verdicts:",
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

    def _scan_and_trend(self, report: dict) -> list[str]:
        lines: list[str] = []
        if report["scan"]:
            lines += ["", f"## {self.scan.title}", "", self.scan.intro, ""]
            lines += [
                "| factor | coupled vs standard, held-out test ppl % [95% CI] | n | status |",
                "|---|---|---|---|",
            ]
            for s in report["scan"]:
                eff = f"{fmt(s.get('mean'))} [{fmt(s.get('low'))}, {fmt(s.get('high'))}]" if "mean" in s else "-"
                lines.append(f"| {s['factor']} | {eff} | {s.get('n', '-')} | {s['status']} |")
        trend = report.get("token_trend")
        if trend and trend["budgets"]:
            lines += ["", "## Trend with training tokens", "", self.trend.intro, ""]
            lines += ["| tokens per run | coupled vs standard % [95% CI] | n |", "|---|---|---|"]
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

    def _correlation(self, report: dict) -> list[str]:
        """The correlation across runs a claim's details hold, pooled and within cells."""
        c = self.correlation
        row = next((r for r in report["rows"] if c is not None and r["id"] == c.claim), None)
        corr = (row or {}).get("details", {}).get(c.name) if c is not None else None
        if not corr:
            return []
        w = corr.get("within_cell")
        lines = ["", f"## {c.title}", "", c.intro.format(protocol=report["protocol"]), ""]
        lines += [
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
        return lines + ["", c.reading]

    def _tables(self, report: dict) -> list[str]:
        """The paired comparisons, the score table and the variants added from the command line."""
        lines: list[str] = []
        for table in self.comparisons:
            if not report.get(table.key):
                continue
            lines += [
                "",
                f"## {table.title}",
                "",
                table.intro + " Held-out test perplexity (mean over seeds) and the % change of "
                "the second vs the first, paired by seed:",
                "",
                "| comparison | ppl (first, second) | % [95% CI] | n | p | status |",
                "|---|---|---|---|---|---|",
            ]
            for g in report[table.key]:
                p = f"{g['p']:.3g}" if isinstance(g.get("p"), float) else "-"
                lines.append(
                    f"| {g['comparison']} | {_ppl(g)} | {_effect(g)} | {g.get('n', '-')} | {p} | {g['status']} |"
                )
        if report["mqar_escape"]:
            lines += ["", f"## {self.scores.title}", "", self.scores.intro, ""]
            lines += [
                "| difficulty | lr | variant | seeds escaped (acc >= 0.9) | mean accuracy |",
                "|---|---|---|---|---|",
            ]
            lines += [
                f"| {m['difficulty']} | {m['lr']:g} | {m['variant']} | {m['escaped']}/{m['n']} | "
                f"{m['mean_accuracy']:.3f} |"
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
                lines.append(
                    f"| {g['variant']} | {g['cell']} | {_ppl(g)} | {_effect(g)} | {g.get('n', '-')} | {g['status']} |"
                )
        return lines

    @staticmethod
    def readme(report: dict, commands) -> str:
        """The README's results section: one verdict table (claim, measured effect, verdict) and the command."""
        lines = [
            f"Produced by `{commands.run}` (protocol `{report['protocol']}`: {report['description']}; "
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

    def figures(self, report: dict, ctx: ReportContext | None) -> dict:
        """``{file name: draw(path)}`` of the figures with data (:mod:`coupled_qk.study.figures`)."""
        from coupled_qk.study.figures import verdict_figures

        return verdict_figures(self, report, ctx)


def _provisional(ctx: ReportContext, claim) -> dict | None:
    """The claim's numbers from the runs finished so far (at least 2 paired seeds), not a verdict."""
    try:
        row = claim.test.evaluate(ctx.evidence.but(min_seeds=2, partial=True))
    except (NotReady, ValueError, KeyError, ZeroDivisionError):
        return None
    return {k: row[k] for k in ("effect", "mean", "low", "high", "n")}


def _effect(g: dict) -> str:
    return f"{fmt(g.get('mean'))} [{fmt(g.get('low'))}, {fmt(g.get('high'))}]" if "mean" in g else "-"


def _ppl(g: dict) -> str:
    return f"{fmt(g.get('a_ppl'), 1)}, {fmt(g.get('b_ppl'), 1)}" if "a_ppl" in g else "-"


def _verdict_table(report: dict, commands) -> list[str]:
    """The title, how to regenerate, and one row per claim (markdown lines)."""
    lines = [
        f"# Claims report: protocol `{report['protocol']}`",
        "",
        report["description"] + ".",
        "",
        f"Regenerate: `{commands.run}` (trains the runs whose records are missing, then writes this report; "
        f"{commands.rebuild} to rebuild it from the committed records).",
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


def _progress(report: dict) -> list[str]:
    """Finished and planned runs per cell."""
    lines = ["", "## Progress", "", "| cell | claims | finished / planned runs | tokens/run | train hours |"]
    lines.append("|---|---|---|---|---|")
    lines += [
        f"| {c['cell']} | {', '.join(c['claims'])} | {c['finished']}/{c['planned']} | "
        f"{', '.join(f'{t:,}' for t in c['tokens_per_run']) or '-'} | {fmt(c['train_hours'])} |"
        for c in report["cells"]
    ]
    return lines
