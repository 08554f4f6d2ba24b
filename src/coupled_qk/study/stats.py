"""Statistics of seeded comparisons: means, paired differences, variance ratios, correlations, Holm.

Every interval is two-sided at level ``conf`` (default 0.95) and comes from a scipy distribution:
Student t for means and paired differences, Fisher's F for a ratio of two independent sample variances and
Pitman-Morgan's t for paired ones (normal samples), scipy's Pearson interval (Fisher z) for correlations,
``scipy.stats.bootstrap`` (BCa) where asked.
Holm's step-down procedure adjusts a family of p-values (Holm 1979). ``docs/METHOD.md`` section 3.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from coupled_qk.checks.values import finite
from coupled_qk.extras import LazyModule

st = LazyModule("scipy.stats", "claims", "intervals and verdicts")


def _array(name: str, values, min_n: int = 1) -> np.ndarray:
    arr = np.asarray(list(values), dtype=np.float64)
    if arr.ndim != 1 or arr.size < min_n:
        raise ValueError(f"{name} must be a flat sequence of at least {min_n} numbers; got {arr.size}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}={arr.tolist()} holds a non-finite value")
    return arr


def _conf(conf: float) -> float:
    return finite("conf", conf, 0, 1, lo_open=True, hi_open=True)


def mean_ci(values: Sequence[float], conf: float = 0.95) -> dict:
    """Mean of ``values`` with its t-based interval ``mean +- t_{(1+conf)/2, n-1} * sd / sqrt(n)``.

    Returns:
        ``{"n", "mean", "sd", "se", "low", "high", "p"}``: ``sd`` with ``ddof=1``; ``p`` is the two-sided
        one-sample t-test p-value of mean 0. With ``n == 1`` the interval and ``p`` are NaN (no spread is
        measurable); with ``sd == 0`` and ``n > 1`` the interval is the point and ``p`` is 0 (mean != 0) or 1.

    Raises:
        ValueError: no values, a non-finite value, or ``conf`` outside (0, 1).
    """
    x = _array("values", values)
    conf = _conf(conf)
    n, mean = x.size, float(x.mean())
    if n == 1:
        return {"n": 1, "mean": mean, "sd": math.nan, "se": math.nan, "low": math.nan, "high": math.nan, "p": math.nan}
    sd = float(x.std(ddof=1))
    se = sd / math.sqrt(n)
    half = float(st.t.ppf((1 + conf) / 2, n - 1)) * se
    if se == 0:
        p = 1.0 if mean == 0 else 0.0
    else:
        p = float(2 * st.t.sf(abs(mean / se), n - 1))
    return {"n": n, "mean": mean, "sd": sd, "se": se, "low": mean - half, "high": mean + half, "p": p}


def median_ci(values: Sequence[float], conf: float = 0.95) -> dict:
    """Median of ``values`` with the distribution-free interval of the median (order statistics; the inverted
    sign test): ``[x_(k), x_(n-k+1)]`` of the sorted values, ``k`` the largest with ``P(Binomial(n, 1/2) < k) <=
    (1 - conf) / 2``. It needs only independent draws from one continuous distribution (no normality), so a few
    outlying repeats (a busy machine) move it little.

    Returns:
        ``{"n", "median", "low", "high", "coverage"}``: ``coverage`` is the interval's exact coverage ``1 - 2 P(
        Binomial(n, 1/2) < k)`` (``>= conf`` when ``n`` allows; below 6 values even ``[min, max]`` covers less
        than 95%, and then ``low, high`` are the minimum and maximum and ``coverage`` says how much they cover).

    Raises:
        ValueError: no values, a non-finite value, or ``conf`` outside (0, 1).

    Source: Conover (1999), *Practical Nonparametric Statistics*, section 3.2 (confidence interval for a quantile).
    """
    x = np.sort(_array("values", values))
    alpha, n = 1 - _conf(conf), x.size
    k = 1
    while k < (n + 1) // 2 and st.binom.cdf(k, n, 0.5) <= alpha / 2:  # P(Binomial < k + 1) still small enough
        k += 1
    coverage = 1 - 2 * float(st.binom.cdf(k - 1, n, 0.5))
    return {
        "n": int(n),
        "median": float(np.median(x)),
        "low": float(x[k - 1]),
        "high": float(x[n - k]),
        "coverage": coverage,
    }


def paired_difference(a: Sequence[float], b: Sequence[float], conf: float = 0.95, relative: bool = False) -> dict:
    """``b - a`` paired element by element (same seed), with the t interval of its mean (:func:`mean_ci`).

    ``relative=True`` uses the per-pair relative change in percent, ``100 * (b / a - 1)``, instead.
    The result also holds ``"differences"`` (the per-pair values).

    Raises:
        ValueError: ``a`` and ``b`` of different lengths, empty, non-finite, or ``relative`` with a zero in ``a``.
    """
    x, y = _array("a", a), _array("b", b)
    if x.size != y.size:
        raise ValueError(f"paired samples need equal lengths; got a: {x.size}, b: {y.size}")
    if relative:
        if np.any(x == 0):
            raise ValueError("relative=True needs non-zero values in a")
        d = 100.0 * (y / x - 1.0)
    else:
        d = y - x
    return {**mean_ci(d, conf), "differences": d.tolist()}


def seeds_for_interval(mean: float, sd: float, conf: float = 0.95, limit: int = 1000) -> int:
    """The fewest pairs ``n >= 2`` whose interval of :func:`mean_ci`, ``mean +- t_{(1+conf)/2, n-1} * sd /
    sqrt(n)``, excludes 0 if the mean and standard deviation of the paired differences stay ``mean`` and ``sd``:
    how many seeds a comparison whose interval still includes 0 would need. ``limit + 1`` when even ``limit``
    pairs would not do (``mean`` 0, or tiny against ``sd``); 2 when ``sd`` is 0 and ``mean`` is not.

    Raises:
        ValueError: a non-finite ``mean``, a negative or non-finite ``sd``, ``conf`` outside (0, 1), ``limit < 2``.
    """
    finite("mean", mean)
    finite("sd", sd, 0)
    conf = _conf(conf)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 2:
        raise ValueError(f"limit={limit!r} must be an integer >= 2")
    if mean == 0:
        return limit + 1
    n = np.arange(2, limit + 1)
    half = st.t.ppf((1 + conf) / 2, n - 1) * sd / np.sqrt(n)
    enough = np.nonzero(half < abs(mean))[0]
    return int(n[enough[0]]) if enough.size else limit + 1


def bootstrap_mean_ci(values: Sequence[float], conf: float = 0.95, n_resamples: int = 9999, seed: int = 0) -> dict:
    """BCa bootstrap interval of the mean (``scipy.stats.bootstrap``); needs at least 3 distinct values.

    Returns ``{"n", "mean", "low", "high"}``. With very few seeds the bootstrap under-covers; the t interval
    (:func:`mean_ci`) is the default of the claims report.

    Raises:
        ValueError: fewer than 3 values or all values equal.
    """
    x = _array("values", values, min_n=3)
    if np.all(x == x[0]):
        raise ValueError("bootstrap needs at least two distinct values")
    res = st.bootstrap(
        (x,),
        np.mean,
        confidence_level=_conf(conf),
        n_resamples=n_resamples,
        method="BCa",
        random_state=np.random.default_rng(seed),
    )
    ci = res.confidence_interval
    return {"n": int(x.size), "mean": float(x.mean()), "low": float(ci.low), "high": float(ci.high)}


def variance_ratio(a: Sequence[float], b: Sequence[float], conf: float = 0.95) -> dict:
    """Ratio of sample variances ``var(a) / var(b)`` (``ddof=1``) with Fisher's F interval.

    For independent normal samples, ``(s_a^2 / s_b^2) / (sigma_a^2 / sigma_b^2) ~ F(n_a - 1, n_b - 1)``, so the
    interval of the true ratio is ``[R / F_{(1+conf)/2}, R / F_{(1-conf)/2}]``. ``p`` is the two-sided F-test
    p-value of equal variances. The test is sensitive to non-normality; with 3 seeds per side the interval
    spans more than a factor of 1,000.

    Returns:
        ``{"ratio", "low", "high", "p", "n_a", "n_b", "var_a", "var_b"}`` (``ratio`` is inf if ``var(b) == 0``).

    Raises:
        ValueError: fewer than 2 values on either side, non-finite values, or both variances zero.
    """
    x, y = _array("a", a, min_n=2), _array("b", b, min_n=2)
    conf = _conf(conf)
    va, vb = float(x.var(ddof=1)), float(y.var(ddof=1))
    if va == 0 and vb == 0:
        raise ValueError("both samples have zero variance; their ratio is undefined")
    da, db = x.size - 1, y.size - 1
    ratio = va / vb if vb > 0 else math.inf
    hi_q, lo_q = st.f.ppf((1 + conf) / 2, da, db), st.f.ppf((1 - conf) / 2, da, db)
    cdf = st.f.cdf(ratio, da, db) if math.isfinite(ratio) else 1.0
    return {
        "ratio": ratio,
        "low": float(ratio / hi_q),
        "high": float(ratio / lo_q),
        "p": float(min(1.0, 2 * min(cdf, 1 - cdf))),
        "n_a": int(x.size),
        "n_b": int(y.size),
        "var_a": va,
        "var_b": vb,
    }


def paired_variance_ratio(a: Sequence[float], b: Sequence[float], conf: float = 0.95) -> dict:
    """Ratio of the variances of two *paired* samples ``var(a) / var(b)`` (pairs share a seed: the same data order
    and initialisation draws) with the Pitman-Morgan interval.

    For bivariate normal pairs the variances are equal exactly when ``a + b`` and ``a - b`` are uncorrelated;
    the test statistic ``t = (F - 1) sqrt(n - 2) / (2 sqrt(F (1 - r^2)))`` with ``F = s_a^2 / s_b^2`` and ``r`` the
    correlation of ``a`` and ``b`` has ``n - 2`` degrees of freedom. Inverting it for the true ratio gives
    ``[F (K - sqrt(K^2 - 1)), F (K + sqrt(K^2 - 1))]`` with ``K = 1 + 2 (1 - r^2) t_q^2 / (n - 2)``, ``t_q`` the
    ``(1 + conf) / 2`` quantile of ``t(n - 2)``. Positively correlated pairs narrow it compared with Fisher's F
    interval of :func:`variance_ratio`, which assumes independent samples.

    Returns:
        ``{"ratio", "low", "high", "p", "n", "r", "var_a", "var_b"}``.

    Raises:
        ValueError: unequal lengths, fewer than 3 pairs, non-finite values, or a zero variance on either side.

    Source: Pitman (1939), "A note on normal correlation", Biometrika 31; Morgan (1939), Biometrika 31.
    """
    x, y = _array("a", a, min_n=3), _array("b", b, min_n=3)
    if x.size != y.size:
        raise ValueError(f"paired_variance_ratio needs pairs; got {x.size} and {y.size} values")
    va, vb = float(x.var(ddof=1)), float(y.var(ddof=1))
    if va == 0 or vb == 0:
        raise ValueError(f"paired_variance_ratio needs a spread on both sides; got variances {va} and {vb}")
    n, ratio = x.size, va / vb
    r = float(np.clip(np.corrcoef(x, y)[0, 1], -1.0, 1.0))
    tq = float(st.t.ppf((1 + _conf(conf)) / 2, n - 2))
    k = 1 + 2 * (1 - r * r) * tq * tq / (n - 2)
    root = math.sqrt(max(k * k - 1, 0.0))
    t = (ratio - 1) * math.sqrt(n - 2) / (2 * math.sqrt(ratio * max(1 - r * r, 1e-300)))
    return {
        "ratio": ratio,
        "low": ratio * (k - root),
        "high": ratio * (k + root),
        "p": float(2 * st.t.sf(abs(t), n - 2)),
        "n": int(n),
        "r": r,
        "var_a": va,
        "var_b": vb,
    }


def correlation(x: Sequence[float], y: Sequence[float], conf: float = 0.95) -> dict:
    """Pearson's r with its Fisher-z interval (scipy) and Spearman's rho, over paired observations.

    Returns ``{"n", "pearson_r", "low", "high", "p", "spearman_rho", "spearman_p"}``.

    Raises:
        ValueError: fewer than 4 pairs (no interval), unequal lengths or non-finite values.
    """
    a, b = _array("x", x, min_n=4), _array("y", y, min_n=4)
    if a.size != b.size:
        raise ValueError(f"correlation needs equal lengths; got x: {a.size}, y: {b.size}")
    res = st.pearsonr(a, b)
    ci = res.confidence_interval(confidence_level=_conf(conf))
    rho = st.spearmanr(a, b)
    return {
        "n": int(a.size),
        "pearson_r": float(res.statistic),
        "low": float(ci.low),
        "high": float(ci.high),
        "p": float(res.pvalue),
        "spearman_rho": float(rho.statistic),
        "spearman_p": float(rho.pvalue),
    }


def within_group_correlation(x: Sequence[float], y: Sequence[float], groups: Sequence, conf: float = 0.95) -> dict:
    """Pearson correlation of ``x`` and ``y`` *within* groups: both centred on their group means (the fixed-effects
    or partial correlation given the group), so differences between groups (e.g. model sizes, corpora or
    architectures with their own perplexity level) cannot create it.

    With ``n`` observations in ``g`` groups (groups of one observation are dropped: they carry no within-group
    information) the test is the t-test of ``x``'s slope in the regression of ``y`` on ``x`` and group
    indicators, ``t = r sqrt(df / (1 - r^2))`` with ``df = n - g - 1``, and the interval is Fisher's z with
    standard error ``1 / sqrt(n - g - 2)`` (a partial correlation given ``g - 1`` covariates).

    Returns:
        ``{"n", "groups", "pearson_r", "low", "high", "p"}``.

    Raises:
        ValueError: unequal lengths, non-finite values, or fewer than 3 observations beyond the groups
            (``n - g < 3``: no interval).

    Source: Fisher (1924), the distribution of partial correlation coefficients; the fixed-effects (within)
    estimator of panel data.
    """
    a, b = _array("x", x), _array("y", y)
    keys = list(groups)
    if not a.size == b.size == len(keys):
        raise ValueError(
            f"within_group_correlation needs equal lengths; got x: {a.size}, y: {b.size}, groups: {len(keys)}"
        )
    members: dict = {}
    for i, key in enumerate(keys):
        members.setdefault(key, []).append(i)
    kept = [idx for idx in members.values() if len(idx) > 1]
    n, g = sum(len(idx) for idx in kept), len(kept)
    if n - g < 3:
        raise ValueError(
            f"within_group_correlation needs n - groups >= 3 (groups of one dropped); got n={n}, groups={g}"
        )
    ra = np.concatenate([a[idx] - a[idx].mean() for idx in kept])
    rb = np.concatenate([b[idx] - b[idx].mean() for idx in kept])
    r = float(np.dot(ra, rb) / math.sqrt(np.dot(ra, ra) * np.dot(rb, rb)))
    df = n - g - 1
    t = r * math.sqrt(df / max(1.0 - r * r, 1e-300))
    z = math.atanh(min(max(r, -1 + 1e-15), 1 - 1e-15))
    half = st.norm.ppf(0.5 + _conf(conf) / 2) / math.sqrt(n - g - 2)
    return {
        "n": n,
        "groups": g,
        "pearson_r": r,
        "low": math.tanh(z - half),
        "high": math.tanh(z + half),
        "p": float(2 * st.t.sf(abs(t), df)),
    }


def welch_difference(a: Sequence[float], b: Sequence[float], conf: float = 0.95) -> dict:
    """``mean(b) - mean(a)`` of two independent samples with Welch's t interval (unequal variances,
    Welch-Satterthwaite degrees of freedom), e.g. per-seed effects measured at two model sizes.

    Returns:
        ``{"n", "n_a", "n_b", "mean", "se", "df", "low", "high", "p"}`` (``n`` = ``n_a + n_b``; ``p`` two-sided, of
        a zero difference).

    Raises:
        ValueError: fewer than 2 values on either side, a non-finite value, both samples without spread, or
            ``conf`` outside (0, 1).
    """
    x, y = _array("a", a, min_n=2), _array("b", b, min_n=2)
    conf = _conf(conf)
    va, vb = float(x.var(ddof=1)) / x.size, float(y.var(ddof=1)) / y.size
    if va + vb == 0:
        raise ValueError("both samples have no spread: Welch's interval is undefined")
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (x.size - 1) + vb**2 / (y.size - 1))
    mean = float(y.mean() - x.mean())
    half = float(st.t.ppf((1 + conf) / 2, df)) * se
    p = float(2 * st.t.sf(abs(mean / se), df))
    return {
        "n": int(x.size + y.size),
        "n_a": int(x.size),
        "n_b": int(y.size),
        "mean": mean,
        "se": se,
        "df": df,
        "low": mean - half,
        "high": mean + half,
        "p": p,
    }


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979), in the input order.

    Sorted ascending, ``p_(i)`` becomes ``max_{j <= i} min(1, (m - j + 1) p_(j))``; reject at level alpha where the
    adjusted value is ``<= alpha``. NaN entries (tests not run) are kept as NaN and do not count in ``m``.

    Raises:
        ValueError: a value outside [0, 1].
    """
    p = np.asarray(list(pvalues), dtype=np.float64)
    if np.any((p < 0) | (p > 1)):
        raise ValueError(f"p-values must lie in [0, 1]; got {p.tolist()}")
    out = np.full(p.shape, np.nan)
    idx = np.flatnonzero(~np.isnan(p))
    m = idx.size
    running = 0.0
    for rank, i in enumerate(idx[np.argsort(p[idx], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out.tolist()


def interpolate_crossing(points: Sequence[Sequence[float]], target: float) -> float | None:
    """The first x at which a decreasing-in-x curve ``[(x, y), ...]`` reaches ``y <= target``, by linear
    interpolation between logged points; ``None`` if it never does. ``points`` must be sorted by x."""
    prev = None
    for x, y in points:
        if y <= target:
            if prev is None:
                return float(x)
            (x0, y0) = prev
            return float(x0 + (x - x0) * (y0 - target) / (y0 - y)) if y0 != y else float(x)
        prev = (x, y)
    return None


def _budget_curve(budgets, losses) -> tuple[np.ndarray, np.ndarray]:
    """``(budgets, losses)`` as float64 arrays, checked as :func:`budget_to_match` documents."""
    b = np.asarray(budgets, dtype=np.float64)
    y = np.asarray(losses, dtype=np.float64)
    if b.ndim != 1 or b.size < 2 or b.shape != y.shape:
        raise ValueError(f"need >= 2 budgets and as many losses; got {b.size} budgets and {y.size} losses")
    if np.any(b <= 0) or np.any(np.diff(b) <= 0):
        raise ValueError(f"budgets must be positive and strictly increasing; got {b.tolist()}")
    return b, y


def budget_to_match(budgets: Sequence[float], losses: Sequence[float], target: float) -> tuple[float, bool] | None:
    """The training budget at which a model's *final* loss would equal ``target``, from its finals at several budgets.

    The loss is interpolated linearly in ``log(budget)`` between neighbouring budgets (each point is a separate run
    with its own full learning-rate schedule, as in a scaling-law fit), and extrapolated with the end segment's
    slope outside the measured range.

    Args:
        budgets: training budgets (e.g. tokens), at least 2, strictly increasing, positive.
        losses: final losses (nats) of the runs at those budgets.
        target: the loss to match (nats).

    Returns:
        ``(budget, extrapolated)``, or ``None`` when the segment that would be used does not decrease with budget
        (no finite budget reaches ``target`` on it).

    Raises:
        ValueError: fewer than 2 budgets, a length mismatch, or budgets that are not positive and increasing.
    """
    b, y = _budget_curve(budgets, losses)
    x = np.log(b)
    inside = y[-1] <= target <= y[0] or y[0] <= target <= y[-1]
    seg = 0
    for i in range(b.size - 1):  # the segment whose loss range holds the target; else the nearer end segment
        lo, hi = sorted((y[i], y[i + 1]))
        if lo <= target <= hi:
            seg = i
            break
    else:
        seg = 0 if target > y[0] else b.size - 2
    slope = (y[seg + 1] - y[seg]) / (x[seg + 1] - x[seg])
    if slope >= 0:
        return None
    return float(np.exp(x[seg] + (target - y[seg]) / slope)), not inside


def loss_at_budget(budgets: Sequence[float], losses: Sequence[float], budget: float) -> float:
    """A model's *final* loss at ``budget``, interpolated linearly in ``log(budget)`` between its two nearest runs.

    The forward map of :func:`budget_to_match` (same segments, extrapolated with the end segment's slope outside
    the measured range).

    Args:
        budgets: training budgets (e.g. tokens), at least 2, strictly increasing, positive.
        losses: final losses (nats) of the runs at those budgets.
        budget: the budget to read the loss at (positive, same unit as ``budgets``).

    Returns:
        The interpolated loss (nats).

    Raises:
        ValueError: fewer than 2 budgets, a length mismatch, budgets not positive and increasing, or
            ``budget <= 0``.
    """
    b, y = _budget_curve(budgets, losses)
    if not budget > 0:
        raise ValueError(f"budget={budget!r} must be positive")
    x, xb = np.log(b), math.log(budget)
    seg = int(np.clip(np.searchsorted(x, xb) - 1, 0, b.size - 2))
    return float(y[seg] + (y[seg + 1] - y[seg]) * (xb - x[seg]) / (x[seg + 1] - x[seg]))


def interpolate_at(points: Sequence[Sequence[float]], x: float) -> float | None:
    """``y`` of the curve ``[(x, y), ...]`` at ``x`` by linear interpolation; None outside its x range."""
    pts = np.asarray(points, dtype=np.float64)
    if pts.size == 0 or x < pts[0, 0] or x > pts[-1, 0]:
        return None
    return float(np.interp(x, pts[:, 0], pts[:, 1]))
