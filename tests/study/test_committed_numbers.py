"""The committed converged reports' claim numbers, recomputed here from the raw run records with SciPy alone (none of
``coupled_qk.study``): each paired change's per-seed values, mean, 95% t interval, p, power for a true 1% change and
the change detectable at 80% power; the seed-variance ratio's Pitman-Morgan interval; the size interaction's Welch
difference, which is absent until both sizes have two pairs and is then checked the same way. A report that stated
a number its records do not give, or a row computed from the wrong runs, fails here."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from scipy import stats

CLAIMS = Path(__file__).resolve().parents[2] / "docs" / "results" / "claims"

PUBMED = "cpu-converged-pubmed-main"
PAIRS = {  # (study, claim) -> (cell and variant of the reference arm a, of the arm b); the change is b vs a
    ("cpu-converged", "C1"): (("cpu-converged-main", "standard"), ("cpu-converged-main", "coupled")),
    ("cpu-converged", "C3"): (("cpu-converged-uncoupled", "uncoupled_mlp"), ("cpu-converged-main", "coupled")),
    ("cpu-converged", "C6"): (("cpu-converged-matched", "standard"), ("cpu-converged-main", "coupled")),
    ("cpu-converged", "C1-fresh"): (("cpu-converged-fresh", "standard"), ("cpu-converged-fresh", "coupled")),
    ("cpu-converged-pubmed", "C9"): ((PUBMED, "standard"), (PUBMED, "coupled")),
    ("cpu-converged-small", "C1"): (("cpu-converged-small-main", "standard"), ("cpu-converged-small-main", "coupled")),
}


def ppl_of(study: str, cell: str, variant: str) -> dict[int, float]:
    """``{seed: final test perplexity}`` of every committed record of one arm."""
    folder = CLAIMS / "runs" / study / cell / variant
    out = {}
    for path in sorted(folder.glob("seed*.json")):
        rec = json.loads(path.read_text())
        out[rec["seed"]] = rec["final"]["test/perplexity"]
    return out


def changes(study: str, claim: str) -> dict[int, float]:
    """``{seed: 100 * (ppl_b / ppl_a - 1)}`` on the seeds both arms have."""
    (cell_a, var_a), (cell_b, var_b) = PAIRS[study, claim]
    a, b = ppl_of(study, cell_a, var_a), ppl_of(study, cell_b, var_b)
    return {s: 100 * (b[s] / a[s] - 1) for s in sorted(set(a) & set(b))}


def row_of(study: str, claim: str) -> dict:
    report = json.loads((CLAIMS / f"{study}.json").read_text())
    return next(r for r in report["claims"] if r["claim"] == claim)


def power(effect: float, sd: float, n: int) -> float:
    """Two-sided one-sample t test at 5%: P(|T| > t_crit) with T noncentral, noncentrality effect / (sd / sqrt n)."""
    crit, ncp = stats.t.ppf(0.975, n - 1), effect / (sd / math.sqrt(n))
    return stats.nct.sf(crit, n - 1, ncp) + stats.nct.cdf(-crit, n - 1, ncp)


@pytest.mark.parametrize(("study", "claim"), sorted(PAIRS))
def test_a_paired_change_is_what_its_records_give(study, claim):
    """Per-seed changes, mean, t interval and p from the records; where the row states them, power for 1% and the
    80%-power detectable change (at which the recomputed power is 0.80). A row with fewer than two pairs states no
    number."""
    row, per_seed = row_of(study, claim), changes(study, claim)
    if "mean" not in row:
        assert len(per_seed) < 2 or row["status"].startswith("running"), row
        assert "low" not in row and "high" not in row
        return
    seeds = row.get("seeds", sorted(per_seed))
    values = [per_seed[s] for s in seeds]
    n = len(values)
    assert n == row["n"] >= 2
    assert row.get("per_seed", values) == pytest.approx(values, rel=1e-12, abs=1e-12)
    mean, sd = sum(values) / n, stats.tstd(values)
    half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    assert (row["mean"], row["low"], row["high"]) == pytest.approx((mean, mean - half, mean + half), rel=1e-9)
    if "p" in row:
        assert row["p"] == pytest.approx(stats.ttest_1samp(values, 0.0).pvalue, rel=1e-9)
    if "power" in row:
        assert row["power"] == pytest.approx(power(1.0, sd, n), rel=1e-9)
        assert power(row["mde80"], sd, n) == pytest.approx(0.8, abs=1e-6)


def test_the_seed_variance_ratio_is_pitman_morgans_interval_on_the_records():
    """C4: var(uncoupled MLP) / var(coupled) of the paired seeds' test perplexities, its 95% interval by the
    Pitman-Morgan inversion (F (K +- sqrt(K^2 - 1)), K = 1 + 2 (1 - r^2) t^2 / (n - 2)) and its p (the correlation
    of sums and differences)."""
    row = row_of("cpu-converged", "C4")
    u = ppl_of("cpu-converged", "cpu-converged-uncoupled", "uncoupled_mlp")
    c = ppl_of("cpu-converged", "cpu-converged-main", "coupled")
    seeds = sorted(set(u) & set(c))
    x, y = [u[s] for s in seeds], [c[s] for s in seeds]
    n = len(seeds)
    f = stats.tvar(x) / stats.tvar(y)
    r = stats.pearsonr(x, y).statistic
    k = 1 + 2 * (1 - r**2) * stats.t.ppf(0.975, n - 2) ** 2 / (n - 2)
    low, high = f * (k - math.sqrt(k * k - 1)), f * (k + math.sqrt(k * k - 1))
    p = stats.pearsonr([a + b for a, b in zip(x, y)], [a - b for a, b in zip(x, y)]).pvalue
    assert n == row["n"] == 10
    assert (row["mean"], row["low"], row["high"], row["p"], row["r"]) == pytest.approx((f, low, high, p, r), rel=1e-9)


def test_the_size_interaction_is_welchs_difference_of_the_two_sizes_changes():
    """C1-size: the larger model's per-seed C1 changes minus the tiny model's on the seeds the row lists, unpaired
    (Welch's t, its Welch-Satterthwaite interval); no number while either size has fewer than two pairs; the tiny
    study's side lists every pair of its complete C1."""
    row = row_of("cpu-converged-small", "C1-size")
    tiny, small = changes("cpu-converged", "C1"), changes("cpu-converged-small", "C1")
    assert row["n_pairs"] == [len(s) for s in row["seeds"]]
    assert set(row["seeds"][0]) <= set(tiny) and set(row["seeds"][1]) <= set(small)  # records may have come since
    assert row["seeds"][0] == row_of("cpu-converged", "C1")["seeds"]  # the tiny study is complete: all its pairs
    tiny, small = ({s: d[s] for s in seeds} for d, seeds in zip((tiny, small), row["seeds"]))
    if min(len(tiny), len(small)) < 2:
        assert "mean" not in row and row["status"].startswith("running")
        return
    a, b = list(tiny.values()), list(small.values())
    test = stats.ttest_ind(b, a, equal_var=False)
    interval = test.confidence_interval(0.95)
    expected = (sum(b) / len(b) - sum(a) / len(a), interval.low, interval.high, test.pvalue)
    assert (row["mean"], row["low"], row["high"], row["p"]) == pytest.approx(expected, rel=1e-9)


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t interval."""
    n, mean = len(values), sum(values) / len(values)
    half = stats.t.ppf(0.975, n - 1) * stats.tstd(values) / math.sqrt(n)
    return mean, mean - half, mean + half


def test_c6_with_fresh_data_and_the_value_of_data_are_what_the_records_give():
    """C6-fresh per seed: coupled (1x) against standard with 2.4x the training articles, the latter's test
    perplexity per 1x-tokenizer token (its total test nats over the 1x tokenizer's count of the same text); the value
    of data: the multiple of the 1x articles at which standard's test loss, log-linear in the amount of text between
    1x and 2.4x, equals coupled's at 1x; the bits-per-byte change (no tokenizer) and standard's own change with 2.4x
    the articles."""
    row = row_of("cpu-converged", "C6-fresh")
    factor = row["factor"]
    assert factor == 2.4
    main, fresh = "cpu-converged-main", "cpu-converged-fresh"
    changes, worth, bpb, more = [], [], [], []
    for s in row["seeds"]:
        base, cpl, wide = (
            json.loads((CLAIMS / "runs" / "cpu-converged" / cell / v / f"seed{s}.json").read_text())["final"]
            for cell, v in ((main, "standard"), (main, "coupled"), (fresh, "standard"))
        )
        wide_ppl = math.exp(wide["test/nll"] / base["test/n_tokens"])
        changes.append(100 * (cpl["test/perplexity"] / wide_ppl - 1))
        one, many, target = (math.log(x) for x in (base["test/perplexity"], wide_ppl, cpl["test/perplexity"]))
        worth.append(factor ** ((target - one) / (many - one)))
        bpb.append(100 * (cpl["test/bits_per_byte"] / wide["test/bits_per_byte"] - 1))
        more.append(100 * (wide_ppl / base["test/perplexity"] - 1))
    assert row["per_seed"] == pytest.approx(changes, rel=1e-12)
    assert (row["mean"], row["low"], row["high"]) == pytest.approx(t_interval(changes), rel=1e-9)
    assert row["data_worth"]["per_seed"] == pytest.approx(worth, rel=1e-9)
    for key, values in (("data_worth", worth), ("bits_per_byte_change", bpb), ("more_data_change", more)):
        got = row[key]
        assert (got["mean"], got["low"], got["high"]) == pytest.approx(t_interval(values), rel=1e-9), key


ROOT = CLAIMS.parents[2]
QUOTED = [  # (file, study, claim, key inside its row or "", format of mean/low/high): each quoted in prose
    ("README.md", "cpu-converged", "C3", "", "C3, {mean:+.2f}% [{low:+.2f}, {high:+.2f}]"),
    ("README.md", "cpu-converged", "C4", "", "{mean:.2f} [{low:.2f}, {high:.2f}]"),
    ("README.md", "cpu-converged", "C6-fresh", "data_worth", "{mean:.3f}x [{low:.3f}, {high:.3f}] the training text"),
    ("docs/RESULTS.md", "cpu-converged", "C1", "", "{mean:+.2f}% [{low:+.2f}, {high:+.2f}] test perplexity"),
    ("docs/RESULTS.md", "cpu-converged", "C1", "pooled_exploratory", "{mean:+.2f}% [{low:+.2f}, {high:+.2f}]"),
    ("docs/RESULTS.md", "cpu-converged", "C3", "", "{mean:+.2f}% [{low:+.2f}, {high:+.2f}], p (Holm"),
    ("docs/RESULTS.md", "cpu-converged", "C4", "", "{mean:.2f} [{low:.2f}, {high:.2f}]"),
    ("docs/RESULTS.md", "cpu-converged", "C6", "", "({mean:+.1f}% [{low:+.1f}, {high:+.1f}])"),
    ("docs/RESULTS.md", "cpu-converged", "C6-fresh", "", "{mean:+.1f}% [{low:+.1f}, {high:+.1f}]"),
    ("docs/RESULTS.md", "cpu-converged", "C6-fresh", "data_worth", "{mean:.3f}x [{low:.3f}, {high:.3f}]"),
    (
        "docs/RESULTS.md",
        "cpu-converged",
        "C6-fresh",
        "bits_per_byte_change",
        "{mean:+.1f}% [{low:+.1f}, {high:+.1f}] in",
    ),
    ("docs/RESULTS.md", "cpu-converged-pubmed", "C9", "", "{mean:+.2f}% [{low:+.2f}, {high:+.2f}] test perplexity"),
    ("README.md", "cpu-converged", "C1-fresh", "", "{mean:+.2f}% [{low:+.2f}, {high:+.2f}] (4 paired seeds"),
    ("docs/RESULTS.md", "cpu-converged", "C1-fresh", "", "{mean:+.2f}% [{low:+.2f}, {high:+.2f}] test perplexity"),
    ("README.md", "cpu-converged-small", "C1-size", "", "(C1-size, {mean:+.2f} points [{low:+.2f}, {high:+.2f}])"),
    ("README.md", "cpu-converged-small", "C1-size", "", "growth of more than {neg_low:.2f} points"),
    ("docs/RESULTS.md", "cpu-converged-small", "C1", "", "{mean:+.2f}% [{low:+.2f}, {high:+.2f}] test perplexity"),
    ("docs/RESULTS.md", "cpu-converged-small", "C1", "", "a gain over {neg_low:.2f}% is excluded at this size"),
    ("docs/RESULTS.md", "cpu-converged-small", "C1-size", "", "{mean:+.2f} percentage points [{low:+.2f}, {high:+.2f}"),
    ("docs/RESULTS.md", "cpu-converged-small", "C1-size", "", "grows by more than {neg_low:.2f} points"),
]


@pytest.mark.parametrize(("path", "study", "claim", "key", "form"), QUOTED)
def test_hand_written_sentences_quote_the_committed_numbers(path, study, claim, key, form):
    """The README's and RESULTS.md's own sentences (outside the generated blocks) quote each number as the committed
    report computes it from the records, at the precision they print."""
    row = row_of(study, claim)
    numbers = dict(row[key] if key else row)
    numbers["neg_low"] = -numbers["low"]  # "a gain over X% is excluded": the interval's lower end, as a size
    text = " ".join((ROOT / path).read_text().split())  # sentences wrap across lines
    assert form.format(**numbers) in text


def test_the_quoted_size_trend_is_a_straight_line_in_log_parameters():
    """The sentence "a straight line in log-parameters from tiny's C1 to the paper's -6.6% at 60M would put 6.8M near
    X%": recomputed from the coupled records' parameter counts and tiny's C1, and excluded by C1's interval there."""
    params = {
        study: json.loads((CLAIMS / "runs" / study / f"{study}-main" / "coupled" / "seed0.json").read_text())["params"]
        for study in ("cpu-converged", "cpu-converged-small")
    }
    tiny = row_of("cpu-converged", "C1")["mean"]
    at = math.log(params["cpu-converged-small"] / params["cpu-converged"]) / math.log(60e6 / params["cpu-converged"])
    line = tiny + at * (-6.6 - tiny)
    for path in ("README.md", "docs/RESULTS.md"):
        assert f"-{-line:.1f}%" in " ".join((ROOT / path).read_text().split())
    assert line < row_of("cpu-converged-small", "C1")["low"]  # the interval excludes it
