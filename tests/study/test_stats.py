"""Statistics of the claims report against hand-computed intervals (t and F table quantiles)."""

import math

import numpy as np
import pytest
from scipy.stats import t as scipy_t

from coupled_qk.study import stats

T975_2 = 4.302652729911275  # t_{0.975} with 2 degrees of freedom (table: 4.303)
T975_3 = 3.182446305284263  # 3 degrees of freedom (table: 3.182)


def test_mean_ci_matches_hand_computation():
    r = stats.mean_ci([1.0, 2.0, 3.0])
    # mean 2, sd 1, se 1/sqrt(3)
    assert r["mean"] == pytest.approx(2.0)
    assert r["sd"] == pytest.approx(1.0)
    assert r["low"] == pytest.approx(2 - T975_2 / math.sqrt(3))
    assert r["high"] == pytest.approx(2 + T975_2 / math.sqrt(3))
    assert r["low"] == pytest.approx(-0.48414, abs=1e-4)  # by hand: 2 - 4.3027 * 0.57735
    # t statistic 2 / 0.57735 = 3.4641 on 2 df -> p = 0.0742 (table)
    assert r["p"] == pytest.approx(0.0742, abs=5e-4)


def test_mean_ci_other_level_and_degenerate_cases():
    r = stats.mean_ci([0.0, 2.0, 4.0, 6.0], conf=0.95)
    se = np.std([0, 2, 4, 6], ddof=1) / 2
    assert r["high"] - r["mean"] == pytest.approx(T975_3 * se)
    one = stats.mean_ci([5.0])
    assert one["mean"] == 5.0 and math.isnan(one["low"]) and math.isnan(one["p"])
    flat = stats.mean_ci([1.0, 1.0, 1.0])
    assert flat["low"] == flat["high"] == 1.0 and flat["p"] == 0.0
    with pytest.raises(ValueError, match="conf"):
        stats.mean_ci([1.0, 2.0], conf=1.5)
    with pytest.raises(ValueError, match="non-finite"):
        stats.mean_ci([1.0, float("nan")])


def test_paired_difference_absolute_and_relative():
    a, b = [10.0, 12.0, 11.0], [9.0, 10.0, 10.5]
    r = stats.paired_difference(a, b)
    # d = [-1, -2, -0.5]: mean -7/6, sd sqrt(0.58333) = 0.763763, se 0.440959, half-width 1.897292
    assert r["differences"] == [-1.0, -2.0, -0.5]
    assert r["mean"] == pytest.approx(-7 / 6)
    assert r["low"] == pytest.approx(-3.063959, abs=1e-5)
    assert r["high"] == pytest.approx(0.730625, abs=1e-5)
    rel = stats.paired_difference(a, b, relative=True)
    assert rel["differences"] == pytest.approx([-10.0, -100 * 2 / 12, 100 * (10.5 / 11 - 1)])
    # pairing matters: the same numbers unpaired would give a different (wider) interval
    assert r["high"] - r["low"] < 2 * T975_2 * math.sqrt((np.var(a, ddof=1) + np.var(b, ddof=1)) / 3)
    with pytest.raises(ValueError, match="equal lengths"):
        stats.paired_difference([1.0, 2.0], [1.0])


def test_variance_ratio_f_interval():
    r = stats.variance_ratio([1.0, 2.0, 3.0], [2.0, 4.0, 6.0, 8.0])
    # var 1 vs 20/3: ratio 0.15; F_{0.975}(2, 3) = 16.044, F_{0.975}(3, 2) = 39.165 (tables)
    assert r["ratio"] == pytest.approx(0.15)
    assert r["low"] == pytest.approx(0.15 / 16.044, rel=1e-3)
    assert r["high"] == pytest.approx(0.15 * 39.165, rel=1e-3)
    assert 0 < r["p"] < 1
    same = stats.variance_ratio([1.0, 2.0, 3.0], [5.0, 6.0, 7.0])
    assert same["ratio"] == pytest.approx(1.0) and same["p"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="zero variance"):
        stats.variance_ratio([1.0, 1.0], [2.0, 2.0])


def test_holm_step_down():
    adj = stats.holm([0.01, 0.04, 0.03, 0.005])
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> monotone 0.06
    assert adj == pytest.approx([0.03, 0.06, 0.06, 0.02])
    with_nan = stats.holm([0.01, float("nan"), 0.02])
    assert with_nan[0] == pytest.approx(0.02) and math.isnan(with_nan[1]) and with_nan[2] == pytest.approx(0.02)
    assert stats.holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        stats.holm([1.2])


def test_correlation_fisher_interval():
    x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    y = [2.0, 1.0, 4.0, 3.0, 6.0, 5.0]
    r = stats.correlation(x, y)
    rr = np.corrcoef(x, y)[0, 1]
    z, se = math.atanh(rr), 1 / math.sqrt(6 - 3)
    assert r["pearson_r"] == pytest.approx(rr)
    assert r["low"] == pytest.approx(math.tanh(z - 1.959964 * se), abs=1e-5)
    assert r["high"] == pytest.approx(math.tanh(z + 1.959964 * se), abs=1e-5)
    assert r["spearman_rho"] == pytest.approx(rr)  # ranks equal the values here


def test_paired_variance_ratio_is_the_test_of_uncorrelated_sums_and_differences():
    """Pitman-Morgan: var(a) = theta var(b) exactly when a / sqrt(theta) + b and a / sqrt(theta) - b are
    uncorrelated, so scipy's Pearson test of those (an independent computation) must give p = 0.05 at both ends of
    the 95% interval and the reported p at theta = 1."""
    from scipy.stats import pearsonr

    a = [208.1, 206.0, 209.4, 207.2, 211.0]
    b = [209.5, 207.9, 209.6, 208.3, 210.8]
    r = stats.paired_variance_ratio(a, b)
    av, bv = np.array(a), np.array(b)
    assert r["ratio"] == pytest.approx(av.var(ddof=1) / bv.var(ddof=1))
    assert r["r"] == pytest.approx(np.corrcoef(av, bv)[0, 1])
    assert r["p"] == pytest.approx(pearsonr(av + bv, av - bv).pvalue)
    for theta in (r["low"], r["high"]):
        s = av / math.sqrt(theta)
        assert pearsonr(s + bv, s - bv).pvalue == pytest.approx(0.05, abs=1e-9)
    assert r["low"] < r["ratio"] < r["high"]
    # pairing narrows the interval compared with the independent-samples F interval
    f = stats.variance_ratio(a, b)
    assert r["high"] / r["low"] < f["high"] / f["low"]
    with pytest.raises(ValueError, match="pairs"):
        stats.paired_variance_ratio(a, b[:4])
    with pytest.raises(ValueError, match="spread"):
        stats.paired_variance_ratio([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])


def test_within_group_correlation_matches_regression_with_group_indicators():
    # Two groups whose offsets make the pooled correlation strongly negative while x and y rise together
    # inside each group; a third group of one observation carries no within-group information.
    x = [1.0, 2.0, 3.0, 4.0, 11.0, 12.0, 13.0, 14.0, 50.0]
    y = [10.0, 12.5, 11.5, 14.0, 0.0, 1.5, 1.0, 3.5, -40.0]
    groups = ["a"] * 4 + ["b"] * 4 + ["c"]
    assert stats.correlation(x, y)["pearson_r"] < -0.9
    r = stats.within_group_correlation(x, y, groups)
    # Independent reference: OLS of y on x and one indicator per group (the singleton dropped), by lstsq.
    xa, ya = np.array(x[:8]), np.array(y[:8])
    design = np.column_stack([xa, np.repeat([1.0, 0.0], 4), np.repeat([0.0, 1.0], 4)])
    coef, res, *_ = np.linalg.lstsq(design, ya, rcond=None)
    df = 8 - 3
    se = math.sqrt(res[0] / df * np.linalg.inv(design.T @ design)[0, 0])
    t = coef[0] / se
    assert r["n"] == 8 and r["groups"] == 2
    assert r["pearson_r"] == pytest.approx(t / math.sqrt(t * t + df))  # partial r from the slope's t
    assert r["pearson_r"] > 0.8
    assert r["p"] == pytest.approx(2 * (1 - scipy_t.cdf(abs(t), df)))
    z, half = math.atanh(r["pearson_r"]), 1.959964 / math.sqrt(8 - 2 - 2)
    assert (r["low"], r["high"]) == pytest.approx((math.tanh(z - half), math.tanh(z + half)), abs=1e-5)
    with pytest.raises(ValueError, match="n - groups >= 3"):
        stats.within_group_correlation(x[:4], y[:4], ["a", "a", "b", "b"])
    with pytest.raises(ValueError, match="equal lengths"):
        stats.within_group_correlation(x, y, groups[:-1])


def test_bootstrap_brackets_the_mean():
    r = stats.bootstrap_mean_ci([1.0, 2.0, 3.0, 4.0, 10.0])
    assert r["mean"] == pytest.approx(4.0)
    assert r["low"] < 4.0 < r["high"]
    with pytest.raises(ValueError, match="distinct"):
        stats.bootstrap_mean_ci([1.0, 1.0, 1.0])


def test_curve_interpolation():
    pts = [(0, 10.0), (10, 6.0), (20, 4.0)]
    assert stats.interpolate_crossing(pts, 5.0) == pytest.approx(15.0)
    assert stats.interpolate_crossing(pts, 12.0) == 0.0
    assert stats.interpolate_crossing(pts, 3.0) is None
    assert stats.interpolate_at(pts, 5) == pytest.approx(8.0)
    assert stats.interpolate_at(pts, 25) is None


def test_seeds_for_interval_is_the_first_n_whose_interval_excludes_zero():
    """mean 1, sd 2: t_{0.975,16} 2.1199 * 2 / sqrt(17) = 1.028 still covers 0, t_{0.975,17} 2.1098 * 2 / sqrt(18)
    = 0.9946 does not (table quantiles): 18 pairs."""
    assert stats.seeds_for_interval(1.0, 2.0) == 18
    assert stats.seeds_for_interval(-1.0, 2.0) == 18  # the sign does not matter
    assert stats.seeds_for_interval(1.0, 0.0) == 2  # no spread: two pairs are an interval of one point
    assert stats.seeds_for_interval(0.0, 1.0) == 1001  # no mean change: no count will do
    assert stats.seeds_for_interval(0.01, 5.0, limit=50) == 51
    for n in (17, 18):  # the bound itself, from the same quantiles
        r = stats.mean_ci([1.0 + 2.0 * z for z in _unit_sample(n)])
        assert (r["low"] > 0) == (n == 18)
    with pytest.raises(ValueError, match="sd"):
        stats.seeds_for_interval(1.0, -1.0)
    with pytest.raises(ValueError, match="limit"):
        stats.seeds_for_interval(1.0, 1.0, limit=1)


def _unit_sample(n: int) -> list[float]:
    """``n`` numbers with mean exactly 0 and sample standard deviation exactly 1."""
    x = np.arange(n, dtype=np.float64)
    x -= x.mean()
    return (x / x.std(ddof=1)).tolist()


def _sign_test_coverage(n: int, k: int) -> float:
    """Exact coverage of ``[x_(k), x_(n-k+1)]`` for the median: 1 - 2 P(Binomial(n, 1/2) <= k - 1), from math.comb."""
    return 1 - 2 * sum(math.comb(n, j) for j in range(k)) / 2**n


@pytest.mark.parametrize("n", [1, 2, 5, 6, 9, 15, 21, 40])
def test_median_ci_takes_the_widest_order_statistics_that_keep_the_level(n):
    values = [float(v) for v in np.random.default_rng(n).permutation(np.arange(1, n + 1))]
    r = stats.median_ci(values)
    k = int(r["low"])  # the values are 1..n, so the interval's ends are their ranks
    assert r["high"] == n + 1 - k and r["median"] == pytest.approx((n + 1) / 2)
    assert r["coverage"] == pytest.approx(_sign_test_coverage(n, k))
    if n >= 6:  # a 95% interval exists: k is the largest whose coverage stays >= 95%
        assert r["coverage"] >= 0.95 and _sign_test_coverage(n, k + 1) < 0.95
    else:  # too few values: the whole range, and its (lower) coverage said
        assert k == 1 and r["coverage"] < 0.95


def test_median_ci_covers_the_median_as_often_as_it_says():
    """Simulation: intervals from 15 draws of a skewed distribution (lognormal, median 1) hold the true median in
    96.5% of 4000 samples (the exact coverage of [x_(4), x_(12)]), within sampling error."""
    rng = np.random.default_rng(0)
    hits = [stats.median_ci(rng.lognormal(0.0, 0.5, 15)) for _ in range(4000)]
    rate = np.mean([h["low"] <= 1.0 <= h["high"] for h in hits])
    assert hits[0]["coverage"] == pytest.approx(0.9648, abs=1e-4)
    assert abs(rate - 0.9648) < 0.012  # 4 standard errors of a rate from 4000 samples


def test_median_ci_refuses_bad_input():
    with pytest.raises(ValueError, match="at least 1"):
        stats.median_ci([])
    with pytest.raises(ValueError, match="non-finite"):
        stats.median_ci([1.0, float("inf")])


def test_welch_difference_is_scipys_unequal_variance_t_test():
    """Welch's interval and p against scipy's ``ttest_ind(equal_var=False)`` and its confidence interval, and the
    Welch-Satterthwaite degrees of freedom recomputed by hand."""
    from scipy import stats as st

    a, b = [1.0, 2.5, 0.5, 1.8], [3.0, 4.2, 2.9, 5.5, 4.4, 3.8]
    r = stats.welch_difference(a, b)
    ref = st.ttest_ind(b, a, equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert r["mean"] == pytest.approx(sum(b) / 6 - sum(a) / 4)
    assert (r["low"], r["high"], r["p"]) == (pytest.approx(ci.low), pytest.approx(ci.high), pytest.approx(ref.pvalue))
    va, vb = np.var(a, ddof=1) / 4, np.var(b, ddof=1) / 6
    assert r["df"] == pytest.approx((va + vb) ** 2 / (va**2 / 3 + vb**2 / 5)) and r["n"] == 10
    with pytest.raises(ValueError, match="at least 2"):
        stats.welch_difference([1.0], b)
    with pytest.raises(ValueError, match="no spread"):
        stats.welch_difference([1.0, 1.0], [2.0, 2.0])
