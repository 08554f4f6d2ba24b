"""A report of claims read with their interim status and power, for studies whose stages are tuned by a
learning-rate grid (:mod:`coupled_qk.study.grid`): the grid, each claim (a paired change with the power to detect a
true 1% effect, a paired variance ratio, an equivalence with the tokens-to-equal-loss ratio of each pair and a
check of the regime its longer arm trained in), Holm-adjusted p-values within the study's declared family, the
runs, the mean validation curves, and the same claims in a first-epoch study beside it.

No interim analysis: a claim's row says ``running (k of n pairs)`` until its cells are complete, and its reading
("coupled better (excluded zero)", "inconclusive (interval includes zero)", ...) says only where the interval lies.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from coupled_qk.study import stats
from coupled_qk.study.claims import Arm, ChangeDifference, Equivalence, NotReady, VarianceRatio
from coupled_qk.study.grid import best_loss, plateaued
from coupled_qk.study.power import detectable_effect, power_two_sided, variance_ratio_power
from coupled_qk.study.regime import FINAL_WINDOW_EPOCHS, data_worth, final_slope, lr_fraction_at_stop
from coupled_qk.study.report import ReportContext, fmt, paper_in_ci

POWER_EFFECT = 1.0  # percent: the effect size every power statement refers to (but a variance ratio's)


@dataclass(frozen=True)
class TokensRatio:
    """Beside an equivalence row: per pair, the tokens ``a``'s validation curve needs to first reach ``b``'s best
    validation loss, over ``b``'s tokens at its best (``None`` if it never does), and their mean."""


@dataclass(frozen=True)
class RegimeCheck:
    """Beside a compute-matched row: does the arm trained on ``factor`` x the tokens of the same text (``long``)
    reach a *worse* best validation loss than the same seeds' 1x runs (``short``)? Then it overfits before its
    rate decays, and a comparison against it is not a sample-efficiency test (:func:`matched_regime`)."""

    long: Arm
    short: Arm
    factor: float


@dataclass(frozen=True)
class FreshNote:
    """Beside a fresh-data row: the fresh arm's token ratio and where its runs stopped (:func:`fresh_note`)."""

    short: Arm
    factor: float


@dataclass(frozen=True)
class StageReport:
    """The layout.

    Attributes:
        holm: the claim ids of the Holm family (direction claims; adjusted within it).
        curves: ``(label, arm)`` of the mean validation curves (and the figure).
        beside: a first-epoch study whose report (``<beside>.json`` in the same folder) shows the same claims;
            beside_claims: which.
        readings: the words for an interval below zero, above zero, and across it.
        paper_ratio: the paper's variance ratio, which a variance ratio's power refers to.
        headline: the README's one paragraph (:class:`Headline`), or ``None``.
    """

    holm: tuple[str, ...]
    curves: tuple = ()
    beside: str | None = None
    beside_claims: tuple[str, ...] = ()
    readings: tuple[str, str, str] = (
        "coupled better (excluded zero)",
        "coupled worse (excluded zero)",
        "inconclusive (interval includes zero)",
    )
    paper_ratio: float = 8.0
    headline: object = None

    # ---- build ----------------------------------------------------------------------------------------------
    def build(self, ctx: ReportContext) -> dict:
        """The report: ``{"design", "description", "main_claim", "notes", "chosen_lr", "epochs", "grid",
        "waiting", "claims", "runs", "curves", "progress"}``."""
        study, reading, ev = ctx.study, ctx.reading, ctx.evidence.but(min_seeds=0, partial=True)
        p = reading.plan
        grid = {v: {str(lr): loss for lr, loss in sorted(p.grid[v].items())} for v in p.grid}
        runs = [_run_row(key, rec) for key, rec in sorted(reading.counted.items())]
        claims = [self._claim_row(c, ev) for c in study.claims]
        self._holm(claims)
        progress: dict = {}
        for unit in p.units():
            d, t = progress.get(unit.stage, (0, 0))
            progress[unit.stage] = (d + (unit.key in reading.counted), t + 1)
        for claim, row in zip(study.claims, claims):  # the paper's value, where it is in the row's units
            if claim.paper_effect is not None and "low" in row:
                row["paper_effect"] = claim.paper_effect
                row["paper_effect_in_ci"] = row["low"] <= row["paper_effect"] <= row["high"]
        first = _first_epoch_rows(ctx.out_dir / f"{self.beside}.json", self.beside_claims) if self.beside else {}
        for row in claims:
            if row["claim"] in first:
                row["first_epoch"] = first[row["claim"]]
                pooled = row.get("per_seed", []) + (first[row["claim"]].get("per_seed") or [])
                if row.get("per_seed") and len(pooled) > len(row["per_seed"]):
                    row["pooled_exploratory"] = stats.mean_ci(pooled)
        return {
            "design": study.name,
            "description": study.description,
            "main_claim": study.claims[0].id,
            "notes": list(ctx.notes),
            "chosen_lr": dict(p.chosen_lr),
            "epochs": p.epochs,
            "grid": grid,
            "waiting": p.waiting,
            "claims": claims,
            "runs": runs,
            "curves": {label: _curve_mean([ev.record(a, s) for s in ev.seeds(a)]) for label, a in self.curves},
            "progress": {k: {"done": d, "planned": t} for k, (d, t) in progress.items()},
        }

    def _claim_row(self, claim, ev) -> dict:
        test = claim.test
        if isinstance(test, ChangeDifference):
            return self._difference_row(claim, ev)
        expected = min(len(self_seeds) for self_seeds in (ev.expected_seeds(a.cell) for a in _arms(test)))
        if isinstance(test, VarianceRatio):
            return self._ratio_row(claim, ev, expected)
        row = _paired_row(claim.id, test.label, ev, *_arms(test), expected)
        if isinstance(test, Equivalence):
            if "low" in row:
                inside = -test.margin < row["low"] and row["high"] < test.margin
                row["verdict"] = test.reading if inside else self._reading(row["low"], row["high"])
            for extra in claim.extras:
                self._extra(extra, row, ev, test)
        return row

    def _extra(self, extra, row: dict, ev, test) -> None:
        a, b = _arms(test)
        if isinstance(extra, TokensRatio):
            ratios = [_tokens_to_match(ev.record(a, s), ev.record(b, s)) for s in row["seeds"]]
            reached = [x for x in ratios if x is not None]
            row["tokens_ratio"] = {
                "per_seed": ratios,
                "never_reached": len(ratios) - len(reached),
                **(stats.mean_ci(reached) if len(reached) >= 2 else {}),
            }
        elif isinstance(extra, RegimeCheck):
            both = [s for s in ev.seeds(extra.long) if ev.record(extra.short, s) is not None]
            longs = [ev.record(extra.long, s) for s in both]
            row["regime_check"] = matched_regime(longs, [ev.record(extra.short, s) for s in both], extra.factor)
            if row["regime_check"].get("overfit") and "verdict" in row:
                row["verdict"] += (
                    f"; the {extra.factor}x arm is worse than 1x and stopped early (see the note): not a "
                    "sample-efficiency test"
                )
        elif isinstance(extra, FreshNote):
            runs = [ev.record(a, s) for s in row["seeds"]]
            short = [ev.record(extra.short, s) for s in row["seeds"] if ev.record(extra.short, s) is not None]
            row["regime_check"] = {"n": len(runs), "note": fresh_note(runs, short, extra.factor)}
            trios = [(ev.record(extra.short, s), ev.record(b, s), ev.record(a, s)) for s in row["seeds"]]
            row.update(data_value([t for t in trios if None not in t], extra.factor))

    def _ratio_row(self, claim, ev, expected: int) -> dict:
        test = claim.test
        seeds, va, vb = _pairs(ev, test.a, test.b)
        row = {"claim": claim.id, "effect": test.label, "n": len(seeds), "expected_n": expected}
        if len(seeds) >= 3:
            r = stats.paired_variance_ratio(va, vb)
            reading = (
                "uncoupled more variable (excluded 1)"
                if r["low"] > 1
                else "coupled more variable (excluded 1)"
                if r["high"] < 1
                else "inconclusive (interval includes 1)"
            )
            if r["low"] <= 1 <= r["high"]:
                reading = reading[:-1] + (
                    f"; excludes the paper's {self.paper_ratio:g}x, not a smaller reduction)"
                    if r["high"] < self.paper_ratio
                    else f"; includes the paper's {self.paper_ratio:g}x)"
                )
            row.update(
                mean=r["ratio"],
                low=r["low"],
                high=r["high"],
                p=r["p"],
                r=r["r"],
                **ratio_power(r["r"], len(seeds), self.paper_ratio),
                verdict=reading,
            )
        row["status"] = "complete" if len(seeds) >= expected else f"running ({len(seeds)} of {expected})"
        return row

    def _difference_row(self, claim, ev) -> dict:
        """A difference of two paired changes (e.g. the same comparison at two model sizes, the arms of one in
        another study): each change's own count of paired seeds (named by its study, ``here`` for this one), the
        difference with its interval (Welch's for unpaired studies) once both have two, and ``complete`` once both
        have every planned seed."""
        test = claim.test
        row = {"claim": claim.id, "effect": test.label}
        pairs = (test.first, test.second)
        where = [pair[0].study or "here" for pair in pairs]
        seeds = [ev.but(min_seeds=0).pairs(a, b)[0] for a, b in pairs]  # each side's own paired seeds
        counts = [len(s) for s in seeds]
        expected = [min(len(ev.of(a).expected_seeds(a.cell)) for a in pair) for pair in pairs]
        row.update(n=sum(counts), n_pairs=counts, seeds=seeds, studies=where, expected_n=expected)
        running = f"running ({where[0]} {counts[0]} of {expected[0]}, {where[1]} {counts[1]} of {expected[1]} pairs)"
        if min(counts) < 2:
            return {**row, "status": running}
        r = test.difference(ev.but(min_seeds=2))
        verdict = _difference_words(r["low"], r["high"], where[0])
        row.update(mean=r["mean"], low=r["low"], high=r["high"], p=r["p"], verdict=verdict)
        row["status"] = "complete" if all(c >= e for c, e in zip(counts, expected)) else running
        return row

    def _holm(self, rows: list[dict]) -> None:
        """Holm-adjusted p within the family, and a verdict by its interval for every row that has none of its own
        (the family's, and a paired change outside it, read unadjusted)."""
        family = [r for r in rows if r["claim"] in self.holm and "p" in r]
        adjusted = iter(stats.holm([r["p"] for r in family])) if family else iter(())
        for r in family:
            r["p_holm"] = next(adjusted)
        for r in rows:
            if "low" in r and "verdict" not in r:
                r["verdict"] = self._reading(r["low"], r["high"])

    def _reading(self, low: float, high: float) -> str:
        if not (math.isfinite(low) and math.isfinite(high)):
            return "not enough seeds"
        below, above, across = self.readings
        return below if high < 0 else above if low > 0 else across

    # ---- write ----------------------------------------------------------------------------------------------
    @staticmethod
    def json_text(report: dict) -> str:
        """The JSON file's text."""
        return json.dumps(report, indent=1, default=str) + "\n"

    summary_end = "\n## Learning-rate grid"
    """Where the summary the command prints ends."""

    def readme(self, report: dict, commands) -> str:
        """The README's one paragraph (:class:`Headline`)."""
        return (self.headline.text(report) if self.headline else "") + "\n"

    def markdown(self, report: dict, commands) -> str:
        """The report as markdown (progress, claims, the first-epoch study beside it, grid, runs, notes)."""
        lines = [
            f"# Converged study `{report['design']}`",
            "",
            report["description"] + ".",
            "",
            f"Regenerate: `{commands.report}` (every number below is recomputed from the run records).",
            "",
            "## Progress",
            "",
        ]
        for stage, c in report["progress"].items():
            lines.append(f"- {stage}: {c['done']} of {c['planned']} planned runs finished")
        lines += [f"- {w}" for w in report["waiting"]]
        if report["chosen_lr"]:
            lines += [
                "",
                "Chosen learning rates (grid, reserve seed): "
                + ", ".join(f"{v} {lr:g}" for v, lr in report["chosen_lr"].items())
                + f"; horizon {report['epochs']:g} epochs.",
            ]
        family = [c for c in self.holm if any(r["claim"] == c for r in report["claims"])]
        lines += _claims_table(report) + [
            "",
            f"p (Holm): adjusted within the study's family ({', '.join(family)}); '-' outside it (the unadjusted p "
            "is in the JSON).",
        ]
        lines += self._beside_table(report) + _ratio_notes(report) + _grid_and_runs(report) + _annealing(report)
        lines += ["", "## Notes", ""] + [f"- {n}" for n in report["notes"]]
        return "\n".join(lines) + "\n"

    def _beside_table(self, report: dict) -> list[str]:
        first = [r for r in report["claims"] if r.get("first_epoch")]
        if not first:
            return []
        lines = [
            "",
            f"The same claims in the first-epoch `{self.beside}` protocol (one learning rate for every variant, runs "
            f"stopped inside the first epoch, last iterate; [{self.beside}.md]({self.beside}.md)):",
            "",
            "| claim | mean | 95% interval | n | verdict there |",
            "|---|---|---|---|---|",
        ]
        for r in first:
            f = r["first_epoch"]
            lines.append(
                f"| {r['claim']} | {fmt(f['mean'])} | [{fmt(f['low'])}, {fmt(f['high'])}] | {f['n']} | {f['verdict']} |"
            )
        for r in (r for r in first if "pooled_exploratory" in r):
            q = r["pooled_exploratory"]
            lines += [
                "",
                f"Exploratory, not pre-registered: {r['claim']}'s pairs of both regimes pooled as one sample of "
                f"{q['n']} (same corpus, other schedules): {fmt(q['mean'])} [{fmt(q['low'])}, {fmt(q['high'])}].",
            ]
        return lines

    def figures(self, report: dict, ctx: ReportContext | None) -> dict:
        """``{"<study>-valid.png": draw}`` when there are curves."""
        from coupled_qk.study.figures import curves_figure

        if not any(report["curves"].values()):
            return {}
        return {f"{report['design']}-valid.png": lambda path: curves_figure(report, path)}


def _arms(test) -> tuple[Arm, Arm]:
    """The ``(a, b)`` arms of a paired test."""
    return test.a, test.b


def _pairs(ev, a, b, metric: str = "test/perplexity"):
    try:
        return ev.pairs(a, b, metric)
    except NotReady:  # pragma: no cover - min_seeds=0 never raises
        return [], [], []


def _power(sd: float, n: int, effect: float = POWER_EFFECT) -> dict:
    """Power of a two-sided paired t-test (alpha 0.05) to detect a true mean ``effect`` given the per-pair
    ``sd``, and the effect detectable with 80% power (:mod:`~coupled_qk.study.power`)."""
    if n < 2 or not (sd > 0 and math.isfinite(sd)):
        return {"power": math.nan, "mde80": math.nan}
    se = sd / math.sqrt(n)
    # beyond scipy's accurate noncentral-t range the power is 1 to many digits
    return {"power": 1.0 if effect / se > 40 else power_two_sided(effect, se, n), "mde80": detectable_effect(se, n)}


def ratio_power(r: float, n: int, paper: float) -> dict:
    """A variance ratio's power: for the paper's ratio at the observed pair correlation ``r``, and the ratio (> 1)
    detectable with 80% power (:func:`~coupled_qk.study.power.variance_ratio_power`)."""
    if n < 4 or not -1 < r < 1:
        return {"power": math.nan, "mde80": math.nan}
    lo, hi = 0.0, math.log(1e4)  # bisection on log(ratio)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if variance_ratio_power(math.exp(mid), r, n) < 0.8 else (lo, mid)
    return {"power": variance_ratio_power(paper, r, n), "mde80": math.exp(hi)}


def _paired_row(claim: str, label: str, ev, a, b, expected_n: int) -> dict:
    seeds, va, vb = _pairs(ev, a, b)
    row = {"claim": claim, "effect": label, "n": len(seeds), "expected_n": expected_n, "seeds": seeds}
    if len(seeds) < 2:
        return {**row, "status": f"running ({len(seeds)} of {expected_n} pairs)"}
    r = stats.paired_difference(va, vb, relative=True)
    row.update(
        mean=r["mean"],
        low=r["low"],
        high=r["high"],
        p=r["p"],
        sd=r["sd"],
        per_seed=r["differences"],
        a_ppl=stats.mean_ci(va)["mean"],
        b_ppl=stats.mean_ci(vb)["mean"],
        **_power(r["sd"], len(seeds)),
    )
    row["status"] = "complete" if len(seeds) >= expected_n else f"running ({len(seeds)} of {expected_n} pairs)"
    return row


def _run_row(key, rec: dict) -> dict:
    cell, variant, seed = key
    return {
        "cell": cell,
        "variant": variant,
        "seed": seed,
        "lr": rec["config"].get("lr"),
        "epochs": rec.get("epochs"),
        "best_epoch": (rec.get("best") or {}).get("epoch"),
        "stop_reason": rec.get("stop_reason"),
        "plateaued": plateaued(rec),
        "final_slope": final_slope(rec),
        "best_valid_loss": best_loss(rec),
        "test_ppl": rec["final"].get("test/perplexity"),
        "train_hours": rec.get("train_seconds", 0) / 3600,
    }


def _curve_mean(recs: list[dict]) -> dict:
    """Validation loss against tokens: mean, min and max over runs at the evaluation points they share."""
    curves = [dict((int(t), loss) for t, loss in r["curve"]["valid"]) for r in recs if r is not None]
    if not curves:
        return {}
    common = sorted(set.intersection(*(set(c) for c in curves)))
    rows = [[c[t] for c in curves] for t in common]
    return {
        "tokens": common,
        "mean": [sum(x) / len(x) for x in rows],
        "low": [min(x) for x in rows],
        "high": [max(x) for x in rows],
        "n": len(curves),
    }


def _tokens_to_match(std_rec: dict, coupled_rec: dict) -> float | None:
    """Tokens the standard run's validation curve needs to first reach coupled's best validation loss, divided
    by the tokens at coupled's best (``None`` if standard never reaches it)."""
    target = best_loss(coupled_rec)
    reach = stats.interpolate_crossing([(t, loss) for t, loss in std_rec["curve"]["valid"]], target)
    at = (coupled_rec.get("best") or {}).get("tokens") or coupled_rec["tokens"]
    return None if reach is None else reach / at


def matched_regime(matched: list[dict], main: list[dict], factor: float) -> dict:
    """Does the compute-matched arm (standard at ``factor`` x the tokens) measure what C6 asks?

    With a fixed corpus, ``factor`` x the tokens is ``factor`` x the epochs over the same text under a
    ``factor`` x longer learning-rate schedule; if those runs reach a *worse* best validation loss than the
    same seeds' 1x runs (``main``, paired by position), the long arm overfits before its rate decays and a
    comparison against it is not a sample-efficiency test (the paper's C6 adds fresh data). Returns
    ``{"n", "matched_best", "main_best", "overfit", "note"}`` (means of the best validation losses; ``overfit`` when
    the matched mean is higher), or ``{"n": 0}`` without pairs.
    """
    if not matched:
        return {"n": 0}
    a = sum(best_loss(r) for r in matched) / len(matched)
    b = sum(best_loss(r) for r in main) / len(main)
    epochs = [r.get("epochs") for r in matched if r.get("epochs")]
    stops = sorted({r.get("stop_reason") for r in matched})
    lrs = [lr_fraction_at_stop(r) for r in matched if r.get("stop_reason") == "patience" and "config" in r]
    at = f" with its learning rate still at {min(lrs):.2f}-{max(lrs):.2f}x of its peak" if lrs else ""
    overfit = a > b
    why = (
        "it stopped before its rate annealed, so overfitting and an unannealed schedule are confounded"
        if lrs
        else "it overfits before its rate decays"
    )
    note = (
        f"Regime check of C6 ({len(matched)} seeds): standard at {factor}x the tokens reached a best validation "
        f"loss of {a:.4f} against {b:.4f} at 1x (same seeds), stopping at "
        f"{min(epochs, default=0):.1f}-{max(epochs, default=0):.1f} epochs ({', '.join(map(str, stops))}){at}. "
    )
    note += (
        "With a fixed corpus, more tokens are more epochs of the same text under a longer learning-rate "
        f"schedule; this arm's best is worse than at 1x and {why}: C6's comparison here is not a test of sample "
        f"efficiency (the paper's C6 has fresh data; a fair version needs a corpus {factor}x larger or the same "
        "schedule)."
        if overfit
        else "The longer arm is at least as good as 1x, so the comparison is a fair compute match."
    )
    out = {"n": len(matched), "matched_best": a, "main_best": b, "overfit": overfit, "note": note}
    return {**out, "lr_fraction_at_stop": lrs} if lrs else out


def data_value(trios: list[tuple[dict, dict, dict]], factor: float) -> dict:
    """What coupling is worth in training text, per seed (:func:`~coupled_qk.study.regime.data_worth` on test
    losses), coupled's bits-per-byte change against standard on more data, and standard's own test perplexity
    change with more data: each :func:`stats.mean_ci` over seeds, from ``(standard 1x, coupled 1x, standard with
    factor x the data)`` records of the same seed (the last per the others' tokens); ``{}`` under 2 seeds."""
    if len(trios) < 2:
        return {}

    def nats(rec):
        return math.log(rec["final"]["test/perplexity"])

    worth = [data_worth(nats(base), nats(cpl), nats(more), factor) for base, cpl, more in trios]
    bpb = [100 * (c["final"]["test/bits_per_byte"] / m["final"]["test/bits_per_byte"] - 1) for _, c, m in trios]
    gain = [100 * (m["final"]["test/perplexity"] / b["final"]["test/perplexity"] - 1) for b, _, m in trios]
    return {
        "factor": factor,
        "data_worth": {**stats.mean_ci(worth), "per_seed": worth},
        "bits_per_byte_change": stats.mean_ci(bpb),
        "more_data_change": stats.mean_ci(gain),
    }


def fresh_note(fresh: list[dict], main: list[dict], factor: float) -> str:
    """One paragraph on the fresh arm (its records per reference-tokenizer token): its tokenizer's token ratio and
    where its runs stopped."""
    if not fresh:
        return ""
    ratio = sum(r["reference"]["test_token_ratio"] for r in fresh) / len(fresh)
    epochs = [r.get("epochs") or 0 for r in fresh]
    stops = ", ".join(sorted({str(r.get("stop_reason")) for r in fresh}))
    a = sum(best_loss(r) for r in fresh) / len(fresh)
    b = sum(best_loss(r) for r in main) / len(main) if main else math.nan
    return (
        f"C6 with fresh data ({len(fresh)} seeds): standard on {factor}x the training articles, its own "
        f"tokenizer (it cuts the test text into {ratio:.3f}x the 1x tokenizer's tokens), stopped at "
        f"{min(epochs):.1f}-{max(epochs):.1f} of its epochs ({stops}); best validation loss {a:.4f} against "
        f"{b:.4f} for standard at 1x (same seeds; both per 1x-tokenizer token). The C6-fresh row, its tokens "
        "ratio and the figure use this arm's values per 1x-tokenizer token (total nats of the same text; see "
        "converged_fresh.py); the runs table lists its own-tokenizer values."
    )


def _first_epoch_rows(path, claims) -> dict:
    """``claims`` of a first-epoch study's report (``path``, beside this report), to show the two regimes side by
    side; ``{}`` if that report is absent."""
    try:
        rows = json.loads(path.read_text())["rows"]
    except (OSError, ValueError, KeyError):
        return {}
    keep = ("mean", "low", "high", "n", "verdict")
    return {
        r["id"]: {**{k: r.get(k) for k in keep}, "per_seed": (r.get("details") or {}).get("per_seed_percent")}
        for r in rows
        if r.get("id") in claims
    }


def _ratio(x) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.2f}x"


def _pct(x) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.2f}%"


def _claims_table(report: dict) -> list[str]:
    lines = [
        "",
        "## Claims",
        "",
        "| claim | effect | mean | 95% interval | n | p (Holm) | power for 1% (C4: 8x) | "
        "detectable at 80% | paper's value inside? | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["claims"]:
        n = "+".join(map(str, r["n_pairs"])) if "n_pairs" in r else r["n"]  # a difference of two changes
        if "low" not in r:
            lines.append(f"| {r['claim']} | {r['effect']} | - | - | {n} | - | - | - | - | {r['status']} |")
            continue
        p = fmt(r["p_holm"], 3) if "p_holm" in r else "-"  # unadjusted p of the rows outside: JSON only
        detectable = _ratio(r.get("mde80")) if "r" in r else _pct(r.get("mde80"))
        lines.append(
            f"| {r['claim']} | {r['effect']} | {fmt(r['mean'])} | [{fmt(r['low'])}, {fmt(r['high'])}] | "
            f"{n} | {p} | {fmt(r.get('power'))} | {detectable} | {paper_in_ci(r)} | "
            f"{r.get('verdict', '')} ({r['status']}) |"
        )
    return lines


def _ratio_notes(report: dict) -> list[str]:
    """The tokens ratio and regime note of each equivalence row."""
    lines: list[str] = []
    for c6 in (r for r in report["claims"] if "tokens_ratio" in r):
        tr = c6["tokens_ratio"]
        if tr["per_seed"]:
            lines += [
                "",
                f"{c6['claim']}, tokens standard's validation curve needs to reach coupled's best "
                "validation loss, as a multiple of coupled's tokens at its best: per seed "
                + ", ".join(fmt(x) for x in tr["per_seed"])
                + (f"; mean {fmt(tr['mean'])} [{fmt(tr['low'])}, {fmt(tr['high'])}]" if "mean" in tr else ""),
            ]
        if c6.get("regime_check", {}).get("n"):
            lines += ["", c6["regime_check"]["note"]]
        if "data_worth" in c6:
            w, b, g = c6["data_worth"], c6["bits_per_byte_change"], c6["more_data_change"]
            lines += [
                "",
                f"{c6['claim']} read as a value of data: per seed, standard's test loss interpolated log-linearly "
                f"between 1x and {c6['factor']:g}x the training articles reaches coupled's at {w['mean']:.4f}x "
                f"[{w['low']:.4f}, {w['high']:.4f}] the text ({w['n']} seeds; 1 = coupling is worth no extra "
                f"text). In bits per byte (no tokenizer), coupled at 1x is {b['mean']:+.2f}% [{b['low']:+.2f}, "
                f"{b['high']:+.2f}] against standard with {c6['factor']:g}x the articles. The row's change is the "
                f"value of {c6['factor']:g}x more unique text in this data-starved regime (standard's own test "
                f"perplexity changes {g['mean']:+.1f}% with it), not the paper's C6 arm, which trains "
                f"{c6['factor']:g}x longer on the same corpus.",
            ]
    return lines


def _slope(s: dict | None) -> str:
    return "-" if not s else f"{s['slope']:+.4f} [{s['low']:+.4f}, {s['high']:+.4f}]"


def _annealing(report: dict) -> list[str]:
    """Were the runs that completed their schedule (grid aside) still improving at its end?"""
    runs = [
        r
        for r in report["runs"]
        if r["stop_reason"] == "completed" and r.get("final_slope") and "-grid-" not in r["cell"]
    ]
    if not runs:
        return []
    falling = sum(r["final_slope"]["high"] < 0 for r in runs)
    late = sum(r["best_epoch"] is not None and r["best_epoch"] >= r["epochs"] - 0.5 for r in runs)
    mean = sum(r["final_slope"]["slope"] for r in runs) / len(runs)
    return [
        "",
        f"Regime: these runs are annealed to the end of their schedule, not verified minima. Over the last "
        f"{FINAL_WINDOW_EPOCHS:g} epochs the validation loss of {falling} of the {len(runs)} "
        f"{'run' if len(runs) == 1 else 'runs'} that completed their schedule (grid aside) still falls (slope "
        f"interval below zero; mean {mean:+.4f} nats per epoch), and in {late} of them the best checkpoint lies "
        "in the last half epoch. The plateau rule (pre-registered: "
        "the last half epoch improves the best before it by under 0.5%) set the horizon only; it is met by runs "
        "that end far apart (see the grid).",
    ]


def _grid_and_runs(report: dict) -> list[str]:
    lrs = sorted({lr for g in report["grid"].values() for lr in g}, key=float)
    lines = [
        "",
        "## Learning-rate grid (best validation loss, reserve seed)",
        "",
        "| variant | " + " | ".join(lrs) + " |",
        "|---|" + "---|" * len(lrs),
    ]
    for v, g in report["grid"].items():
        lines.append(f"| {v} | " + " | ".join(fmt(g.get(lr), 4) for lr in lrs) + " |")
    lines += [
        "",
        "## Runs",
        "",
        f"| cell | variant | seed | lr | epochs | best at epoch | stop | plateau rule | final slope "
        f"(nats/epoch, last {FINAL_WINDOW_EPOCHS:g}) | best valid loss | test ppl | hours |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        lines.append(
            f"| {r['cell']} | {r['variant']} | {r['seed']} | {r['lr']:g} | {fmt(r['epochs'])} | "
            f"{fmt(r['best_epoch'])} | {r['stop_reason']} | {'met' if r['plateaued'] else 'not met'} | "
            f"{_slope(r.get('final_slope'))} | "
            f"{fmt(r['best_valid_loss'], 4)} | {fmt(r['test_ppl'])} | {fmt(r['train_hours'])} |"
        )
    return lines


@dataclass(frozen=True)
class Headline:
    """The README's one-sentence answer of a study: its main claim (mean and 95% interval over paired seeds,
    power, the smallest detectable effect) beside the first-epoch value, or, while that claim is incomplete, that
    no statement is made yet (the study's pre-registered rule). The README block ``<!-- claims:<name> -->`` is a
    copy of ``<name>-readme.md``, so the sentence changes only with the records.

    Attributes:
        train_tokens: training tokens of one epoch, for the sentence.
        model: the model in words (``"tiny preset"``).
        paper_setting: ``{claim: where the paper measured it}``.
        beside: the first-epoch study named beside the value.
    """

    train_tokens: int | None
    model: str
    paper_setting: tuple = ()
    beside: str = "cpu"

    def text(self, report: dict) -> str:
        """One paragraph of markdown (no trailing newline)."""
        claim = report.get("main_claim", "C1")
        c1 = next((r for r in report["claims"] if r["claim"] == claim), None)
        name = report["design"]
        complete = c1 is not None and c1.get("status") == "complete" and report.get("epochs") is not None
        if not complete or not all(
            isinstance(c1.get(k), (int, float)) and math.isfinite(c1[k]) for k in ("mean", "low", "high")
        ):
            done = 0 if c1 is None else c1.get("n", 0)
            total = "?" if c1 is None else c1.get("expected_n", "?")
            lrs = report.get("chosen_lr") or {}
            chosen = f" Learning rates chosen on the grid: {_lr_text(lrs)}." if lrs else ""
            return (
                f"**Tuned and annealed (`{name}`): no statement yet.** Its {claim} cell (coupled vs standard, paired "
                f"seeds) has {done} of {total} pairs; by the study's pre-registered rule nothing is read from it "
                f"before it is complete.{chosen} Progress: "
                f"[docs/results/claims/{name}.md](docs/results/claims/{name}.md)."
            )
        lr_text = _lr_text(report.get("chosen_lr") or {})
        tokens = f" of {self.train_tokens:,} training tokens" if self.train_tokens else ""
        paper = c1["paper_effect"]
        where = "outside" if not c1["low"] <= paper <= c1["high"] else "inside"
        setting = dict(self.paper_setting).get(claim, "")
        text = (
            f"**Tuned and annealed (`{name}`: {self.model}, each variant at its own learning rate ({lr_text}), "
            f"annealed to the end of its {report['epochs']:g}-epoch schedule{tokens}, best-validation checkpoint; "
            f"{c1['n']} paired seeds):** held-out test perplexity, coupled vs standard, {_interval(c1)} (mean and "
            f"95% interval over seeds): {_direction_words(c1)} (power for a true 1% effect {c1['power']:.0%}, "
            f"smallest effect detectable at 80% power {c1['mde80']:.2f}%); the paper's {paper:+.1f}% {setting} "
            f"lies {where} this interval (a different scale: this excludes that magnitude here, not there)."
        )
        first = c1.get("first_epoch")
        if first:
            text += (
                f" In the first epoch at one shared learning rate (`{self.beside}` protocol) the same comparison gave "
                f"{_interval(first)} ({first['n']} seeds)."
            )
        pooled = c1.get("pooled_exploratory")
        if pooled:
            text += f" Both pooled, an exploratory reading ({pooled['n']} pairs): {_interval(pooled)}."
        size = next((r for r in report["claims"] if r["claim"] == f"{claim}-size"), None)
        if size is not None and size.get("status") == "complete" and "mean" in size:
            text += (
                f" Against the same comparison in `{size['studies'][0]}` (the smaller model), this change differs by "
                f"{size['mean']:+.2f} percentage points [{size['low']:+.2f}, {size['high']:+.2f}] (Welch's interval; "
                f"the sizes are not paired): {_size_words(size)}."
            )
        return text + f" Full report: [docs/results/claims/{name}.md](docs/results/claims/{name}.md)."


def _difference_words(low: float, high: float, other: str) -> str:
    """The reading of a difference of two changes (this study's minus ``other``'s), by its 95% interval."""
    if high < 0:
        return f"lower here than in {other} (excluded zero)"
    if low > 0:
        return f"higher here than in {other} (excluded zero)"
    return "no difference detectable (interval includes zero)"


def _lr_text(lrs: dict) -> str:
    """``{variant: lr}`` as ``"standard 0.002, coupled 0.002"``."""
    return ", ".join(f"{v} {lr:g}" for v, lr in lrs.items())


def _interval(row: dict) -> str:
    return f"{row['mean']:+.2f}% [{row['low']:+.2f}, {row['high']:+.2f}]"


def _size_words(row: dict) -> str:
    """The headline's reading of a size-interaction row (this size's change minus the smaller model's)."""
    if row["high"] < 0:
        return "the change is lower (more favourable to coupling) at this size"
    if row["low"] > 0:
        return "the change is higher (less favourable to coupling) at this size"
    return "no dependence on size detectable at these sample sizes"


def _direction_words(row: dict) -> str:
    if row["high"] < 0:
        return "coupling lowers it"
    if row["low"] > 0:
        return "coupling raises it"
    return (
        f"no change detectable at this sample size; a gain larger than {-row['low']:.2f}% is excluded here"
        if row["low"] < 0
        else "no change detectable"
    )
