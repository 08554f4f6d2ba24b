"""Every claim row of a converged report with an interval and no verdict of its own is read by its interval: inside
the Holm family (adjusted p) and outside it (a paired change such as C1-fresh, unadjusted). A row outside the family
once showed an empty verdict."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from coupled_qk.study.stage_report import StageReport

finite = st.floats(-50, 50, allow_nan=False)


def expected_reading(low: float, high: float) -> str:
    """The three readings, by where the 95% interval lies (hand-written, not the report's code)."""
    if high < 0:
        return "coupled better (excluded zero)"
    if low > 0:
        return "coupled worse (excluded zero)"
    return "inconclusive (interval includes zero)"


@given(family=st.tuples(finite, finite), outside=st.tuples(finite, finite), p=st.floats(0, 1))
def test_rows_inside_and_outside_the_family_get_the_reading_of_their_interval(family, outside, p):
    (a, b), (c, d) = sorted(family), sorted(outside)
    rows = [
        {"claim": "C1", "p": p, "low": a, "high": b},
        {"claim": "C1-fresh", "p": p, "low": c, "high": d},
        {"claim": "C4", "low": 0.2, "high": 3.7, "verdict": "its own"},  # a row with its own verdict keeps it
        {"claim": "C3", "n": 0},  # running: nothing to read
    ]
    StageReport(holm=("C1",))._holm(rows)
    assert rows[0]["verdict"] == expected_reading(a, b) and math.isclose(rows[0]["p_holm"], p)
    assert rows[1]["verdict"] == expected_reading(c, d) and "p_holm" not in rows[1]
    assert rows[2]["verdict"] == "its own"
    assert "verdict" not in rows[3]
