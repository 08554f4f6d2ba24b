"""Reading null verdicts: standard errors from t intervals, power against a simulation, the two readings."""

import json
import statistics
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from coupled_qk.study.power import (
    detectable_effect,
    null_reading,
    power_two_sided,
    t_interval_se,
    verdict_readings_table,
)

CLAIMS = Path(__file__).resolve().parents[2] / "docs" / "results" / "claims"


def test_se_of_a_committed_row_equals_the_per_seed_spread():
    """C1 of the cpu report: the interval's standard error is the sd of the per-seed differences / sqrt(n)."""
    row = next(r for r in json.loads((CLAIMS / "cpu.json").read_text())["rows"] if r["id"] == "C1")
    per_seed = row["details"]["per_seed_percent"]
    assert t_interval_se(row["low"], row["high"], row["n"]) == pytest.approx(
        statistics.stdev(per_seed) / len(per_seed) ** 0.5, rel=1e-5
    )


@pytest.mark.parametrize("n, effect", [(3, 4.0), (5, 2.5), (5, -1.0)])
def test_power_matches_a_simulated_t_test(n, effect):
    """Draw n seeds with the given mean and an sd giving se = 1, run the two-sided t test, count rejections."""
    rng = np.random.default_rng(0)
    draws = rng.normal(effect, n**0.5, size=(40_000, n))  # sd sqrt(n): se of the mean = 1
    t = draws.mean(1) / (draws.std(1, ddof=1) / n**0.5)
    simulated = float(np.mean(np.abs(t) > sps.t.ppf(0.975, n - 1)))
    assert power_two_sided(effect, 1.0, n) == pytest.approx(simulated, abs=0.01)


def test_power_at_zero_is_alpha_and_the_detectable_effect_has_the_asked_power():
    assert power_two_sided(0.0, 0.7, 4) == pytest.approx(0.05, abs=1e-9)
    mde = detectable_effect(0.7, 4)
    assert power_two_sided(mde, 0.7, 4) == pytest.approx(0.8, abs=1e-9)
    assert power_two_sided(-mde, 0.7, 4) == pytest.approx(0.8, abs=1e-9)  # two-sided: symmetric
    assert detectable_effect(0.7, 4, power=0.9) > mde > detectable_effect(0.7, 20)  # more seeds, smaller effects
    for call, message in [
        (lambda: t_interval_se(0, 1, 1), "n=1"),
        (lambda: power_two_sided(1, 0, 3), "se=0"),
        (lambda: detectable_effect(1, 3, power=0.01), "power=0.01"),
        (lambda: t_interval_se(1, 0, 3), "low <= high"),
    ]:
        with pytest.raises(ValueError, match=message):
            call()


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 30), st.floats(-60, 60), st.floats(0.01, 100))
def test_power_is_a_probability_at_every_noncentrality(n, ncp, se):
    """scipy's noncentral t is NaN at many noncentralities above ~7.5; power must stay a number in [alpha, 1]
    that grows with |effect| (it fell back to NaN, and detectable_effect raised for every se at n = 2)."""
    p = power_two_sided(ncp * se, se, n)
    assert 0.05 - 1e-9 <= p <= 1.0
    assert power_two_sided(abs(ncp) * se * 1.5 + se, se, n) >= p - 1e-9


@pytest.mark.parametrize("n", [2, 3])
def test_the_detectable_effect_exists_with_two_or_three_seeds(n):
    """A report row with two paired seeds asks for it (the toy design's matched stage, any study mid-way)."""
    mde = detectable_effect(1.3, n)
    assert power_two_sided(mde, 1.3, n) == pytest.approx(0.8, abs=1e-9)
    rng = np.random.default_rng(1)
    draws = rng.normal(mde, 1.3 * n**0.5, size=(40_000, n))
    t = draws.mean(1) / (draws.std(1, ddof=1) / n**0.5)
    assert float(np.mean(np.abs(t) > sps.t.ppf(0.975, n - 1))) == pytest.approx(0.8, abs=0.01)


def _row(cid, low, high, paper, in_ci, verdict="not reproduced at this scale", n=5):
    return {
        "id": cid,
        "claim": "x",
        "mean": (low + high) / 2,
        "low": low,
        "high": high,
        "n": n,
        "verdict": verdict,
        "paper_effect": paper,
        "paper_effect_in_ci": in_ci,
    }


def test_readings_separate_excluded_from_inconclusive():
    assert null_reading(_row("C1", -1, 1, -6.6, True, verdict="reproduced")) is None
    excluded = null_reading(_row("C1", -1.0, 1.0, -6.6, False))
    assert excluded["reading"] == "excluded" and excluded["power_at_paper"] > 0.99
    wide = null_reading(_row("C1", -9.0, 9.0, -6.6, True, n=3))
    assert wide["reading"] == "inconclusive" and wide["power_at_paper"] < 0.5
    assert null_reading(_row("C13", -1, 1, None, None))["reading"] == "inconclusive"  # no paper value
    c4 = null_reading(_row("C4", 0.05, 3.25, 8.0, False))
    assert c4["reading"] == "excluded" and c4["power_at_paper"] is None  # not a t interval: no power
    c6 = null_reading(_row("C6", 0.97, 1.05, 2.4, False, n=3))  # a ratio: power against 2.4 - 1
    assert c6["power_at_paper"] == pytest.approx(power_two_sided(1.4, t_interval_se(0.97, 1.05, 3), 3))
    table = verdict_readings_table({"cpu": {"rows": [_row("C1", -1.0, 1.0, -6.6, False)]}}).splitlines()
    assert table[2].startswith("| C1 x | `cpu` | 0.00 [-1.00, 1.00] (n = 5) | **excluded** |")


@pytest.mark.parametrize("ratio,r", [(8.0, 0.0), (8.0, 0.5), (3.0, 0.3), (0.25, -0.2)])
def test_variance_ratio_power_matches_a_monte_carlo_of_the_pitman_morgan_test(ratio, r):
    """Independent reference: simulate bivariate normal pairs with that ratio and correlation and count how often
    stats.paired_variance_ratio rejects at 5% (2,000 draws: standard error <= 0.012)."""
    import numpy as np

    from coupled_qk.study.power import variance_ratio_power
    from coupled_qk.study.stats import paired_variance_ratio

    rng = np.random.default_rng(1)
    cov = [[ratio, r * np.sqrt(ratio)], [r * np.sqrt(ratio), 1.0]]
    draws = rng.multivariate_normal([0.0, 0.0], cov, size=(2000, 10))
    hits = np.mean([paired_variance_ratio(d[:, 0], d[:, 1])["p"] < 0.05 for d in draws])
    assert variance_ratio_power(ratio, r, 10) == pytest.approx(hits, abs=0.04)


def test_variance_ratio_power_is_alpha_at_no_effect_symmetric_and_checked():
    from coupled_qk.study.power import variance_ratio_power

    assert variance_ratio_power(1.0, 0.4, 10) == pytest.approx(0.05, abs=1e-9)
    assert variance_ratio_power(8.0, 0.3, 12) == pytest.approx(variance_ratio_power(1 / 8, 0.3, 12), rel=1e-9)
    assert variance_ratio_power(8.0, 0.0, 20) > variance_ratio_power(8.0, 0.0, 10)
    for kwargs, name in [({"ratio": 0.0}, "ratio"), ({"r": 1.0}, "r"), ({"n": 3}, "n"), ({"alpha": 1.0}, "alpha")]:
        with pytest.raises(ValueError, match=name):
            variance_ratio_power(**{"ratio": 2.0, "r": 0.0, "n": 10, **kwargs})


def test_c4s_detectable_ratio_is_where_the_power_reaches_80_percent():
    from coupled_qk.study.power import variance_ratio_power
    from coupled_qk.study.stage_report import ratio_power

    out = ratio_power(0.2, 10, 8.0)
    assert variance_ratio_power(out["mde80"], 0.2, 10) == pytest.approx(0.8, abs=1e-6)
    assert out["power"] == pytest.approx(variance_ratio_power(8.0, 0.2, 10))
