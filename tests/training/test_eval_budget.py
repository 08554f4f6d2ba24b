"""The evaluation budget: quick validations sized to the run when ``eval_batches`` is not set, and the run's line
saying what validation cost (a 74-step run spent most of its 463 s validating, and nothing said so)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coupled_qk.training.eval_budget import (
    EVAL_SHARE,
    MAX_EVAL_BATCHES,
    auto_eval_batches,
    time_summary,
    validations_of,
)
from coupled_qk.training.loop import train
from coupled_qk.training.run_folder import RunFolder


def test_auto_eval_batches_hand_cases():
    assert validations_of(60, 6) == 10 and validations_of(74, 7) == 11  # 10 multiples of 7, and step 74
    assert auto_eval_batches(60, 1, 6) == 3  # 30 batches over 10 validations
    assert auto_eval_batches(74, 1, 7) == 3  # 37 over 11
    assert auto_eval_batches(60, 4, 6) == 12  # 4 micro-batches a step: 120 over 10
    assert auto_eval_batches(1000, 1, 100) == MAX_EVAL_BATCHES  # long runs keep the former default of 20
    assert auto_eval_batches(5, 1, 1) == 1  # at least one batch
    with pytest.raises(ValueError, match="grad_accum=0"):
        auto_eval_batches(10, 0, 1)


@given(steps=st.integers(1, 100_000), accum=st.integers(1, 64), interval=st.integers(1, 5000))
def test_the_validations_of_a_run_read_at_most_their_share_of_its_training_batches(steps, accum, interval):
    """Over the run, quick validations read at most EVAL_SHARE of the training micro-batches (or one batch per
    validation, the least there is), and never more than MAX_EVAL_BATCHES each."""
    interval = min(interval, steps)
    n = validations_of(steps, interval)
    per = auto_eval_batches(steps, accum, interval)
    assert 1 <= per <= MAX_EVAL_BATCHES
    assert per * n <= max(n, EVAL_SHARE * steps * accum)
    if per < MAX_EVAL_BATCHES:  # not capped: the budget is used to within one batch per validation
        assert (per + 1) * n > EVAL_SHARE * steps * accum


def test_a_run_without_eval_batches_validates_on_its_share_and_says_what_validation_cost(tiny_cfg, capsys):
    """20 steps validated every 2: 10 validations of 1 batch (10 of the 20 training batches), each scoring 4
    windows of 16 tokens; the results and the closing line give the time of the validations and of the final
    evaluation."""
    cfg = tiny_cfg(max_steps=20, eval_interval=None, eval_batches=None, progress=True)
    res = train(cfg)
    quick = [r for r in RunFolder(cfg.out_dir).read_metrics() if "valid/loss" in r]
    assert len(quick) == 10 and {r["valid/n_tokens"] for r in quick} == {1 * 4 * 16}  # batches x windows x block
    err = capsys.readouterr().err
    assert "quick validation every 2 steps on 1 batches (10 over the run's 20 steps" in err
    assert res["validations"] == 10 and 0 < res["eval_seconds"] < res["train_seconds"]
    assert res["final_eval_seconds"] > 0
    assert f"{cfg.out_dir}: 20 steps, 1,280 tokens; {time_summary(res)}" in err
    given_cfg = tiny_cfg(max_steps=20, eval_interval=None, eval_batches=3, out_dir=cfg.out_dir + "-given")
    train(given_cfg)  # set by the user: used as given
    assert {r["valid/n_tokens"] for r in RunFolder(given_cfg.out_dir).read_metrics() if "valid/loss" in r} == {
        3 * 4 * 16
    }


def test_time_summary_splits_training_and_validation():
    res = {"train_seconds": 200.0, "eval_seconds": 50.0, "final_eval_seconds": 12.0, "validations": 10}
    assert time_summary(res) == (
        "time 212 s: training 150 s, validation 62 s (29%: 10 quick validations 50 s, final evaluation 12 s)"
    )
    assert time_summary({"train_seconds": 600.0}) == "time 10.0 min"  # results written before the split was kept
    assert time_summary({**res, "train_seconds": 7200.0}) == (
        "time 120.2 min: training 119.2 min, validation 1.0 min (1%: 10 quick validations 0.8 min, final evaluation "
        "0.2 min)"
    )
