"""Regime readings of the tuned studies: C6's matched arm flagged when it ends worse than 1x; the final validation
slope, the learning rate at a stop and the value of data against independent recomputations."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as hs

from coupled_qk.study.regime import data_worth, final_slope, lr_fraction_at_stop
from coupled_qk.study.stage_report import matched_regime
from coupled_qk.training.resume import lr_at


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


# ---- study/regime.py: the readings that qualify the claims' wording --------------------------------------------


def _curve_rec(losses, per_epoch=1000, evals_per_epoch=4):
    tokens = [per_epoch * (i + 1) // evals_per_epoch for i in range(len(losses))]
    return {"tokens": tokens[-1], "epochs": tokens[-1] / per_epoch, "curve": {"valid": list(zip(tokens, losses))}}


def test_final_slope_of_a_straight_line_is_its_slope_with_no_spread():
    epochs = np.arange(1, 33) / 4
    s = final_slope(_curve_rec(list(5.0 - 0.02 * epochs)))
    assert s["slope"] == pytest.approx(-0.02) and s["low"] == pytest.approx(-0.02) and s["high"] == pytest.approx(-0.02)
    assert s["n"] == 7  # epochs 6.5 .. 8.0 at 4 validations per epoch


def test_final_slope_equals_an_independent_least_squares_fit_over_the_window():
    rng = np.random.default_rng(0)
    epochs = np.arange(1, 33) / 4
    losses = 5.0 - 0.02 * epochs + rng.normal(0, 0.003, epochs.size)
    s = final_slope(_curve_rec(list(losses)))
    x, y = epochs[-7:], losses[-7:]
    slope = np.polyfit(x, y, 1)[0]
    resid = y - np.polyval(np.polyfit(x, y, 1), x)
    se = math.sqrt(resid @ resid / 5 / ((x - x.mean()) @ (x - x.mean())))
    assert s["slope"] == pytest.approx(slope) and s["high"] - s["slope"] == pytest.approx(2.5705818 * se, rel=1e-6)
    assert final_slope(_curve_rec([5.0, 4.9])) == {}  # no interval from two points


@given(steps=hs.integers(1, 3000), warmup=hs.integers(1, 200), floor=hs.floats(0, 1))
def test_lr_fraction_at_stop_is_the_trainers_schedule_over_its_peak(steps, warmup, floor):
    per_step, max_tokens = 2048, 2048 * 3000 - 17
    rec = {
        "tokens": steps * per_step,
        "steps": steps,
        "config": {"max_tokens": max_tokens, "warmup_steps": warmup, "min_lr_ratio": floor},
    }
    cfg = SimpleNamespace(lr=0.004, warmup_steps=warmup, min_lr_ratio=floor)
    expected = lr_at(steps, cfg, 3000) / 0.004 if steps > warmup else steps / warmup
    assert lr_fraction_at_stop(rec) == pytest.approx(expected, abs=1e-12)


def test_data_worth_interpolates_log_linearly_between_the_two_data_sizes():
    assert data_worth(5.0, 5.0, 4.0, 2.4) == pytest.approx(1.0)  # coupled = standard at 1x: worth nothing
    assert data_worth(5.0, 4.0, 4.0, 2.4) == pytest.approx(2.4)  # coupled = standard on 2.4x the data
    assert data_worth(5.0, 4.5, 4.0, 2.4) == pytest.approx(math.sqrt(2.4))
    with pytest.raises(ValueError, match="factor=1"):
        data_worth(5.0, 4.5, 4.0, 1)
    with pytest.raises(ValueError, match="loss_more == loss_base"):
        data_worth(5.0, 4.5, 5.0, 2.4)
