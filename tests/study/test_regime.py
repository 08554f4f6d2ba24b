"""C6's regime check (converged studies): a compute-matched arm that overfits is flagged, a fair one is not."""

from coupled_qk.study.stage_report import matched_regime


def _rec(best, epochs=8.0, stop="completed"):
    return {"best": {"metric": "valid/loss", "value": best}, "epochs": epochs, "stop_reason": stop, "final": {}}


def test_a_longer_arm_with_a_worse_best_loss_is_flagged_as_overfit():
    r = matched_regime([_rec(5.27, 6.5, "patience"), _rec(5.26, 6.0, "patience")], [_rec(5.10), _rec(5.11)], 2.4)
    assert r["overfit"] and r["n"] == 2
    assert abs(r["matched_best"] - 5.265) < 1e-12 and abs(r["main_best"] - 5.105) < 1e-12
    assert "not a test of sample efficiency" in r["note"] and "6.0-6.5 epochs (patience)" in r["note"]


def test_a_longer_arm_at_least_as_good_is_a_fair_match():
    r = matched_regime([_rec(5.05, 19.2)], [_rec(5.10)], 2.4)
    assert not r["overfit"] and "fair compute match" in r["note"]
    assert matched_regime([], [], 2.4) == {"n": 0}
