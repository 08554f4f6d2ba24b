"""The README headline of a converged study: generated from the report, silent until C1 is
complete, and the numbers it states are the report's."""

import json
import re
from pathlib import Path

import pytest

from coupled_qk.studies.converged import PAPER_SETTING
from coupled_qk.study.stage_report import Headline


def converged_headline(report, train_tokens=None):
    return Headline(train_tokens, "tiny preset", PAPER_SETTING).text(report)


CLAIMS = Path(__file__).resolve().parents[2] / "docs" / "results" / "claims"


def _report(status="complete", mean=-0.61, low=-1.2, high=-0.02, n=10):
    c1 = {
        "claim": "C1",
        "n": n,
        "expected_n": 10,
        "status": status,
        "mean": mean,
        "low": low,
        "high": high,
        "power": 0.93,
        "paper_effect": -6.6,
        "mde80": 0.81,
        "first_epoch": {"mean": -0.755, "low": -1.787, "high": 0.276, "n": 5},
    }
    return {
        "design": "cpu-converged",
        "epochs": 8.0,
        "chosen_lr": {"standard": 0.004, "coupled": 0.004},
        "claims": [c1],
    }


@pytest.mark.parametrize("status,n", [("running (5 of 10 pairs)", 5), ("running (9 of 10 pairs)", 9)])
def test_no_statement_before_c1_is_complete(status, n):
    text = converged_headline(_report(status=status, n=n), 270_841)
    assert "no statement yet" in text and f"{n} of 10 pairs" in text
    assert "%" not in text  # no effect size is quoted from an incomplete cell


@pytest.mark.parametrize(
    "mean,low,high,reading",
    [
        (-0.61, -1.2, -0.02, "coupling lowers it"),
        (0.5, 0.1, 0.9, "coupling raises it"),
        (-0.3, -0.9, 0.3, "no change detectable at this sample size; a gain larger than 0.90% is excluded here"),
    ],
)
def test_complete_c1_is_stated_with_interval_seeds_and_regime(mean, low, high, reading):
    text = converged_headline(_report(mean=mean, low=low, high=high), 270_841)
    assert f"): {reading} (power" in text and "lies outside this interval" in text
    assert f"{mean:+.2f}% [{low:+.2f}, {high:+.2f}]" in text
    assert (
        "10 paired seeds" in text and "annealed to the end of its 8-epoch schedule of 270,841 training tokens" in text
    )
    assert "-0.76% [-1.79, +0.28] (5 seeds)" in text  # the first-epoch regime beside it


def test_committed_headline_is_the_committed_reports():
    from coupled_qk.studies import get_study

    report = json.loads((CLAIMS / "cpu-converged.json").read_text())
    headline = get_study("cpu-converged").layout.headline
    assert (CLAIMS / "cpu-converged-readme.md").read_text().strip() == headline.text(report)
    c1 = next(r for r in report["claims"] if r["claim"] == "C1")
    if c1["status"] == "complete":  # the sentence quotes the report's own interval
        assert re.search(
            re.escape(f"{c1['mean']:+.2f}% [{c1['low']:+.2f}, {c1['high']:+.2f}]"),
            headline.text(report),
        )


def test_no_statement_while_the_grid_has_not_chosen_the_horizon():
    """Verdict records beside an unfinished grid (a grid record deleted, say): the report has no horizon, and the
    sentence says nothing (it used to fail formatting ``epochs`` None)."""
    report = _report()
    report["epochs"] = None
    assert "no statement yet" in converged_headline(report, 270_841)


def test_the_papers_value_inside_the_interval_is_said_so():
    assert "lies inside this interval" in converged_headline(_report(mean=-4.0, low=-7.0, high=-1.0))


def test_a_pubmed_design_states_its_main_claim_c9_against_the_papers_pubmed_value():
    report = _report(mean=-0.4, low=-1.0, high=0.2)
    report.update(design="cpu-converged-pubmed", main_claim="C9")
    report["claims"][0].update(claim="C9", paper_effect=-4.5)
    text = converged_headline(report)
    assert "the paper's -4.5% on PubMed" in text and "lies outside this interval" in text
    report["claims"][0].update(status="running (3 of 10 pairs)", n=3)
    assert "Its C9 cell" in converged_headline(report) and "3 of 10 pairs" in converged_headline(report)


@pytest.mark.parametrize(
    "mean,low,high,reading",
    [
        (-1.4, -2.6, -0.2, "the change is lower (more favourable to coupling) at this size"),
        (0.9, 0.1, 1.7, "the change is higher (less favourable to coupling) at this size"),
        (-0.3, -1.1, 0.5, "no dependence on size detectable at these sample sizes"),
    ],
)
def test_a_complete_size_interaction_is_stated_after_c1_with_its_welch_interval(mean, low, high, reading):
    """With a complete ``C1-size`` row, the headline adds its difference in percentage points, Welch's interval,
    the smaller model's study and the reading of the interval; a running row adds nothing."""
    report = _report()
    size = {"claim": "C1-size", "status": "complete", "mean": mean, "low": low, "high": high}
    report["claims"].append({**size, "studies": ["cpu-converged", "here"], "n_pairs": [10, 10]})
    text = converged_headline(report, 270_841)
    assert (
        f"Against the same comparison in `cpu-converged` (the smaller model), this change differs by {mean:+.2f} "
        f"percentage points [{low:+.2f}, {high:+.2f}] (Welch's interval; the sizes are not paired): {reading}."
    ) in text
    report["claims"][-1]["status"] = "running (cpu-converged 10 of 10, here 9 of 10 pairs)"
    assert "Against the same comparison" not in converged_headline(report, 270_841)
