"""Best-validation checkpoint and patience-based early stopping (issue 25)."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coupled_qk.training.config import TrainConfig, higher_is_better
from coupled_qk.training.loop import track_best, train
from coupled_qk.training.run_folder import RunFolder, checkpoint_step

MODEL = dict(n_layer=1, d_model=32, n_heads=2, block_size=16, attention="coupled")


def _valid(run_dir):
    return [(r["step"], r["valid/loss"]) for r in RunFolder(run_dir).read_metrics() if "valid/loss" in r]


def test_best_checkpoint_is_the_lowest_validation_loss_and_is_evaluated(tiny_cfg, tmp_path):
    # a learning rate far too high makes validation loss rise after a few steps: the best is not the last
    cfg = tiny_cfg(
        out_dir=str(tmp_path / "run"),
        model=MODEL,
        max_steps=16,
        lr=0.3,
        warmup_steps=0,
        eval_interval=2,
        full_eval=True,
        best_metric="valid/loss",
    )
    res = train(cfg)
    curve = _valid(tmp_path / "run")
    best_step, best_loss = min(curve, key=lambda p: p[1])
    assert res["best"]["step"] == best_step and res["best"]["value"] == pytest.approx(best_loss)
    folder = RunFolder(tmp_path / "run").best_checkpoint()
    assert folder.name == f"best-{best_step:08d}"
    assert json.loads((folder / "state.json").read_text())["step"] == best_step
    assert res["final_from"] == folder.name
    # full_eval: the periodic validation covers the whole split, so the final (full) validation loss of the
    # best weights equals the logged validation loss at the best step
    assert res["final"]["valid/loss"] == pytest.approx(best_loss, rel=1e-6)
    assert res["epochs"] == pytest.approx(res["tokens"] / res["data"]["tokens"]["train"])
    # latest still holds the last iterate (resume continues from there)
    assert checkpoint_step(RunFolder(tmp_path / "run").latest_checkpoint()) == 16


def test_patience_stops_a_plateaued_run_and_resume_is_exact(tiny_cfg, tmp_path):
    kw = dict(
        model=MODEL,
        max_steps=40,
        lr=0.3,
        warmup_steps=0,
        eval_interval=2,
        full_eval=True,
        best_metric="valid/loss",
        patience=2,
    )
    full = train(tiny_cfg(out_dir=str(tmp_path / "full"), **kw))
    assert full["stop_reason"] == "patience" and full["steps"] < 40
    curve = _valid(tmp_path / "full")
    # the rule, recomputed independently: stop at the first validation that is the 2nd in a row without a new best
    best, since, stop_at = float("inf"), 0, None
    for step, loss in curve:
        since = 0 if loss < best else since + 1
        best = min(best, loss)
        if since >= 2:
            stop_at = step
            break
    assert full["steps"] == stop_at
    part = tmp_path / "part"
    train(tiny_cfg(out_dir=str(part), stop_after_steps=3, **kw))
    resumed = train(tiny_cfg(out_dir=str(part), resume=True, **kw))
    assert resumed["steps"] == full["steps"] and resumed["best"] == full["best"]
    assert resumed["final"]["test/loss"] == full["final"]["test/loss"]


def test_unknown_metric_is_refused_naming_the_metrics_that_exist(tiny_cfg, tmp_path):
    with pytest.raises(ValueError, match=r"best_metric='valid/acc' is not a validation metric.*valid/loss"):
        train(tiny_cfg(out_dir=str(tmp_path / "r"), max_steps=4, eval_interval=2, best_metric="valid/acc"))


def test_config_checks():
    with pytest.raises(ValueError, match="patience=3 needs best_metric"):
        TrainConfig(max_steps=1, patience=3)
    with pytest.raises(ValueError, match="patience"):
        TrainConfig(max_steps=1, patience=0, best_metric="valid/loss")
    with pytest.raises(ValueError, match="best_mode"):
        TrainConfig(max_steps=1, best_metric="valid/loss", best_mode="lower")
    assert higher_is_better("valid/accuracy") and not higher_is_better("valid/loss")
    assert higher_is_better("valid/loss", "max") and not higher_is_better("valid/accuracy", "min")


@pytest.mark.parametrize("higher", [False, True])
def test_track_best_with_min_delta(higher):
    cfg = TrainConfig(max_steps=1, best_metric="m", best_mode="max" if higher else "min", patience=2, min_delta=0.1)
    sign = 1 if higher else -1
    state, saved = {"step": 0, "tokens": 0}, []
    stops = []
    for i, v in enumerate([1.0, 1.05, 1.08, 1.5, 1.4]):
        state.update(step=i + 1, tokens=10 * (i + 1))
        stops.append(track_best(cfg, state, {"m": sign * v}, 100, saved.append))
    # 1.05 and 1.08 are new bests (saved) but below min_delta: the patience counter runs 1, 2 -> stop
    assert [s["step"] for s in saved] == [1, 2, 3, 4]
    assert stops == [False, False, True, False, False]
    assert state["best"]["value"] == sign * 1.5 and state["best"]["epoch"] == pytest.approx(0.4)


@given(
    st.sampled_from(["auto", "min", "max"]),
    st.sampled_from([None, "valid/loss"]),
    st.sampled_from([None, 1, 3]),
    st.sampled_from([0.0, 0.0, 1e-3, 0.5]),
)
def test_best_mode_and_min_delta_without_their_reader_are_refused(best_mode, best_metric, patience, min_delta):
    """best_mode is read only for best_metric, min_delta only by the patience counter: each alone is refused."""
    make = dict(max_steps=1, best_mode=best_mode, best_metric=best_metric, patience=patience, min_delta=min_delta)
    problems = []
    if best_mode != "auto" and best_metric is None:
        problems.append("best_mode")
    if min_delta != 0 and patience is None:
        problems.append("min_delta")
    if patience is not None and best_metric is None:
        problems.append("patience")
    if not problems:
        cfg = TrainConfig(**make)
        assert (cfg.best_mode, cfg.min_delta) == (best_mode, min_delta)
    else:
        with pytest.raises(ValueError, match=rf"TrainConfig\.({'|'.join(problems)})="):
            TrainConfig(**make)
