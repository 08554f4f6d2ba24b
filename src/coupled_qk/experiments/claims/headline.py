"""The README's one-sentence answer of a converged study (issue 25 item 3), generated from its report.

:func:`converged_headline` reads the report of :func:`coupled_qk.experiments.claims.converged_study.build_report`
and says what coupling did to held-out test perplexity against standard attention in the converged regime (C1,
mean and 95% interval over paired seeds, the seed count) beside the first-epoch regime's C1, or, while C1 is
incomplete, that no statement is made yet (the study's pre-registered rule). The README block
``<!-- claims:<design> -->`` is a copy of ``<design>-readme.md`` (kept equal by a test), so the sentence
changes only with the records.
"""

from __future__ import annotations

import math

from coupled_qk.experiments.claims.rules import PAPER_EFFECTS


def _interval(row: dict) -> str:
    return f"{row['mean']:+.2f}% [{row['low']:+.2f}, {row['high']:+.2f}]"


def _reading(row: dict) -> str:
    if row["high"] < 0:
        return "coupling lowers it"
    if row["low"] > 0:
        return "coupling raises it"
    return "no change detectable"


PAPER_SETTING = {"C1": "at 60M parameters on WikiText-103", "C9": "on PubMed (its 60M model)"}
"""Where the paper measured the claim a converged design's main stage tests."""


def converged_headline(report: dict, train_tokens: int | None = None) -> str:
    """One paragraph: the converged main claim (C1; C9 on PubMed) with interval and seeds, and the first-epoch
    value beside it.

    Args:
        report: a converged study's report (``claims`` rows with ``mean``/``low``/``high``/``n``/``status``/
            ``power``/``mde80`` and ``first_epoch``; ``epochs``, ``chosen_lr``, ``design``).
        train_tokens: training tokens of one epoch, for the sentence (omitted when ``None``).

    Returns:
        Markdown text (no trailing newline).
    """
    claim = report.get("main_claim", "C1")
    c1 = next((r for r in report["claims"] if r["claim"] == claim), None)
    name = report["design"]
    if (
        c1 is None
        or c1.get("status") != "complete"
        or not all(isinstance(c1.get(k), (int, float)) and math.isfinite(c1[k]) for k in ("mean", "low", "high"))
    ):
        done = 0 if c1 is None else c1.get("n", 0)
        total = "?" if c1 is None else c1.get("expected_n", "?")
        return (
            f"**Converged regime (`{name}`): no statement yet.** Its {claim} cell (coupled vs standard, paired "
            f"seeds) has {done} of {total} pairs; by the study's pre-registered rule nothing is read from it "
            f"before it is complete. Progress: [docs/results/claims/{name}.md](docs/results/claims/{name}.md)."
        )
    lrs = report.get("chosen_lr") or {}
    lr_text = ", ".join(f"{v} {lr:g}" for v, lr in lrs.items())
    tokens = f" of {train_tokens:,} training tokens" if train_tokens else ""
    paper = PAPER_EFFECTS[claim]
    where = "outside" if not c1["low"] <= paper <= c1["high"] else "inside"
    text = (
        f"**Converged regime (`{name}`, tiny preset, {report['epochs']:g} epochs{tokens}, best-validation "
        f"checkpoint, each variant at its own learning rate: {lr_text}; {c1['n']} paired seeds):** held-out "
        f"test perplexity, coupled vs standard, {_interval(c1)} (mean and 95% interval over seeds): "
        f"{_reading(c1)} (power for a true 1% effect {c1['power']:.0%}, smallest effect detectable at 80% power "
        f"{c1['mde80']:.2f}%); the paper's {paper:+.1f}% {PAPER_SETTING.get(claim, '')} lies {where} this "
        f"interval (a different scale: this excludes that magnitude here, not there)."
    )
    first = c1.get("first_epoch")
    if first:
        text += (
            f" In the first epoch at one shared learning rate (`cpu` protocol) the same comparison gave "
            f"{_interval(first)} ({first['n']} seeds)."
        )
    return text + f" Full report: [docs/results/claims/{name}.md](docs/results/claims/{name}.md)."
