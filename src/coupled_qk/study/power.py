"""How to read a null verdict of the claims report: is the paper's effect excluded, or was the study too small?

The claims report (:mod:`coupled_qk.study.verdict_report`) calls a claim "not reproduced at this scale"
whenever its rule is not met. That covers two different findings: the interval *excludes* the paper's effect
(a real disagreement at this scale), or it is too wide to tell (*inconclusive*). This module separates them
and gives, for each null row whose interval is a t interval over seeds, the power the study had:

- ``se``: the standard error behind a two-sided t interval ``[low, high]`` over ``n`` seeds,
  ``(high - low) / (2 t_{1-a/2, n-1})``;
- :func:`power_two_sided`: the chance that a two-sided one-sample (paired) t test at level ``alpha`` rejects
  "no effect" when the true effect is ``effect`` and the seed spread is the one observed (noncentral t with
  ``n - 1`` degrees of freedom and noncentrality ``effect / se``; Cohen 1988, chapter 2);
- :func:`detectable_effect`: the smallest effect with the given power (80% by default).

These are post-hoc numbers computed from the observed spread: they say which effect sizes the study could have
seen, not what the true effect is. Every input is read from the committed report (``docs/results/claims/
<protocol>.json``); nothing is re-measured.
"""

from __future__ import annotations

import math

from coupled_qk.extras import LazyModule

optimize = LazyModule("scipy.optimize", "claims", "power and detectable effects")
sps = LazyModule("scipy.stats", "claims", "power and detectable effects")

__all__ = [
    "READINGS",
    "detectable_effect",
    "null_reading",
    "power_two_sided",
    "t_interval_se",
    "variance_ratio_power",
    "verdict_readings_table",
]

NULL_VERDICT = "not reproduced at this scale"
T_INTERVAL_CLAIMS = ("C1", "C2", "C3", "C5", "C6", "C7", "C8", "C9", "C10", "C11", "C12", "C13")
"""Rows whose interval is a t interval over seeds (``stats.mean_ci`` / ``stats.paired_difference``); C4's is a
Pitman-Morgan variance-ratio interval, for which no power is computed."""
NO_EFFECT = {"C6": 1.0}
"""The "no effect" value of rows not measured as a difference (C6 is a token ratio: no effect is 1)."""
READINGS = {
    "excluded": "the paper's value lies outside our 95% interval: its magnitude is ruled out at this scale",
    "inconclusive": "the interval holds the paper's value, or the paper gives none in our units: this study "
    "cannot tell",
}


def _check_n(n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n={n!r} must be an integer >= 2 (seeds behind a t interval)")
    return n


def t_interval_se(low: float, high: float, n: int, conf: float = 0.95) -> float:
    """Standard error behind a two-sided t interval ``[low, high]`` over ``n`` values (``n - 1`` degrees of
    freedom) at confidence ``conf``.

    Raises:
        ValueError: ``n < 2``, ``high < low`` or ``conf`` outside ``(0, 1)``.
    """
    _check_n(n)
    if not 0 < conf < 1:
        raise ValueError(f"conf={conf!r} must be in (0, 1)")
    if not high >= low:
        raise ValueError(f"the interval [{low}, {high}] must have low <= high")
    return (high - low) / (2 * sps.t.ppf(0.5 + conf / 2, n - 1))


def power_two_sided(effect: float, se: float, n: int, alpha: float = 0.05) -> float:
    """Power of the two-sided one-sample t test (``n - 1`` degrees of freedom, level ``alpha``) against a true
    effect ``effect`` whose estimate has standard error ``se``: ``P(|T| > t_{1-alpha/2})`` with ``T``
    noncentral t, noncentrality ``effect / se``.

    Raises:
        ValueError: ``se <= 0``, ``n < 2`` or ``alpha`` outside ``(0, 1)``.
    """
    _check_n(n)
    if not se > 0:
        raise ValueError(f"se={se!r} must be > 0")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha={alpha!r} must be in (0, 1)")
    crit = sps.t.ppf(1 - alpha / 2, n - 1)
    ncp = effect / se
    power = float(sps.nct.sf(crit, n - 1, ncp) + sps.nct.cdf(-crit, n - 1, ncp))
    # scipy's noncentral t returns NaN at many noncentralities above ~7.5 (scipy 1.17): the same probability by
    # integrating over the chi-distributed scale instead (agrees with nct to ~1e-14 where nct is finite)
    return power if math.isfinite(power) else _power_by_integral(ncp, n - 1, crit)


def _power_by_integral(ncp: float, df: int, crit: float) -> float:
    """``P(|T| > crit)`` for ``T = (Z + ncp) / (W / sqrt(df))``, ``Z`` standard normal, ``W`` chi with ``df``
    degrees of freedom: ``E_W[Phi(ncp - crit W / sqrt(df)) + Phi(-ncp - crit W / sqrt(df))]``."""
    from scipy import integrate

    def integrand(w: float) -> float:
        s = crit * w / math.sqrt(df)
        return (sps.norm.cdf(ncp - s) + sps.norm.cdf(-ncp - s)) * sps.chi.pdf(w, df)

    value = integrate.quad(integrand, 0, math.inf, epsabs=1e-13, epsrel=1e-12, limit=200)[0]
    return min(1.0, max(0.0, float(value)))


def detectable_effect(se: float, n: int, power: float = 0.8, alpha: float = 0.05) -> float:
    """The smallest effect (>= 0, in the units of ``se``) that :func:`power_two_sided` detects with ``power``.

    Raises:
        ValueError: ``power`` not in ``(alpha, 1)``, and as :func:`power_two_sided`.
    """
    if not alpha < power < 1:
        raise ValueError(f"power={power!r} must be in (alpha={alpha}, 1)")
    power_two_sided(0.0, se, n, alpha)  # checks the arguments
    hi = se
    while power_two_sided(hi, se, n, alpha) < power:
        hi *= 2
    return float(optimize.brentq(lambda e: power_two_sided(e, se, n, alpha) - power, 0.0, hi, xtol=1e-12 * hi))


def variance_ratio_power(ratio: float, r: float, n: int, alpha: float = 0.05) -> float:
    """Power of the two-sided Pitman-Morgan test (level ``alpha``, ``n`` pairs) to detect a true variance ratio
    ``ratio`` between paired normal samples whose correlation is ``r``.

    The test asks whether ``a + b`` and ``a - b`` are uncorrelated (a t test of their sample correlation with
    ``n - 2`` degrees of freedom, as :func:`coupled_qk.study.stats.paired_variance_ratio`); under a true
    ratio ``R = var(a) / var(b)`` and correlation ``r`` of ``a`` and ``b`` their correlation is
    ``rho = (R - 1) / sqrt((R + 1)^2 - 4 r^2 R)``. The power is ``P(|r_SD| > r_crit)`` under the exact density
    of a sample correlation of ``n`` bivariate normal pairs with true correlation ``rho`` (Hotelling's
    hypergeometric form), integrated numerically; ``r_crit = t / sqrt(n - 2 + t^2)``, ``t`` the
    ``1 - alpha / 2`` quantile of ``t(n - 2)``. Symmetric in ``R`` and ``1 / R``.

    Raises:
        ValueError: ``ratio <= 0``, ``r`` outside ``(-1, 1)``, ``n < 4`` or ``alpha`` outside ``(0, 1)``.

    Source: Pitman (1939), Morgan (1939), Biometrika 31; Hotelling (1953), JRSS B 15, eq. (24).
    """
    import math

    from scipy import integrate, special

    if not ratio > 0 or not math.isfinite(ratio):
        raise ValueError(f"ratio={ratio!r} must be a finite number > 0")
    if not -1 < r < 1:
        raise ValueError(f"r={r!r} must be in (-1, 1)")
    if isinstance(n, bool) or not isinstance(n, int) or n < 4:
        raise ValueError(f"n={n!r} must be an integer >= 4 (pairs behind a Pitman-Morgan test)")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha={alpha!r} must be in (0, 1)")
    rho = (ratio - 1) / math.sqrt((ratio + 1) ** 2 - 4 * r * r * ratio)
    log_c = (
        math.log(n - 2)
        + special.gammaln(n - 1)
        + (n - 1) / 2 * math.log1p(-rho * rho)
        - 0.5 * math.log(2 * math.pi)
        - special.gammaln(n - 0.5)
    )

    def density(x: float) -> float:
        return math.exp(log_c + (n - 4) / 2 * math.log1p(-x * x) - (n - 1.5) * math.log1p(-rho * x)) * special.hyp2f1(
            0.5, 0.5, n - 0.5, (1 + rho * x) / 2
        )

    t = sps.t.ppf(1 - alpha / 2, n - 2)
    crit = t / math.sqrt(n - 2 + t * t)
    tails = integrate.quad(density, -1, -crit)[0] + integrate.quad(density, crit, 1)[0]
    return float(min(max(tails, 0.0), 1.0))


def null_reading(row: dict) -> dict | None:
    """How to read one row of a claims report (``rows`` of ``<protocol>.json``): ``None`` unless its verdict
    is the null ``"not reproduced at this scale"``; else ``{"id", "reading", "paper_effect", "power_at_paper",
    "detectable_80", "se"}`` with ``reading`` ``"excluded"`` (the paper's value lies outside the interval) or
    ``"inconclusive"``, and, for t-interval rows (:data:`T_INTERVAL_CLAIMS`) with ``n >= 2``, the power of the
    study against the paper's value (``None`` without one) and the smallest effect it detects with 80% power
    (both relative to the row's no-effect value, :data:`NO_EFFECT`), else ``None``."""
    if row.get("verdict") != NULL_VERDICT:
        return None
    paper = row.get("paper_effect")
    excluded = paper is not None and row.get("paper_effect_in_ci") is False
    out = {
        "id": row["id"],
        "reading": "excluded" if excluded else "inconclusive",
        "paper_effect": paper,
        "power_at_paper": None,
        "detectable_80": None,
        "se": None,
    }
    n = row.get("n")
    if row["id"] in T_INTERVAL_CLAIMS and isinstance(n, int) and n >= 2 and row["high"] > row["low"]:
        se = t_interval_se(row["low"], row["high"], n)
        zero = NO_EFFECT.get(row["id"], 0.0)
        out["se"] = se
        out["detectable_80"] = detectable_effect(se, n)
        if paper is not None:
            out["power_at_paper"] = power_two_sided(paper - zero, se, n)
    return out


def _num(x: float) -> str:
    return f"{x:.2f}" if abs(x) < 10 else f"{x:.1f}"


def verdict_readings_table(reports: dict[str, dict]) -> str:
    """Markdown table of the null rows of several claims reports (``{protocol: <protocol>.json}``): per claim
    and protocol, the reading, the study's power against the paper's value and the smallest effect it detects
    with 80% power (in the row's units: % of perplexity for C1-C10 but C4 and C6, the token ratio minus 1
    for C6, the score for C11-C13)."""
    lines = [
        "| claim | protocol | interval (n) | reading | power vs the paper's value | detectable with 80% power |",
        "|---|---|---|---|---|---|",
    ]
    for protocol, report in reports.items():
        for row in report["rows"]:
            r = null_reading(row)
            if r is None:
                continue
            interval = f"{_num(row['mean'])} [{_num(row['low'])}, {_num(row['high'])}] (n = {row['n']})"
            paper = "-" if r["paper_effect"] is None else f"{r['paper_effect']:.3g}"
            power = "-" if r["power_at_paper"] is None else f"{100 * r['power_at_paper']:.0f}% (paper: {paper})"
            mde = "-" if r["detectable_80"] is None else f"+-{_num(r['detectable_80'])}"
            lines.append(
                f"| {row['id']} {row['claim']} | `{protocol}` | {interval} | **{r['reading']}** | {power} | {mde} |"
            )
    return "\n".join(lines)
