"""Device/dtype names against the machine, and the early-stopping metric against the task's metrics."""

from __future__ import annotations

import pytest
import reliability_profile  # noqa: F401  (the example budget)
import torch
from hypothesis import given
from hypothesis import strategies as st

from coupled_qk.devices import available_devices, check_device, check_device_name, check_dtype
from coupled_qk.training.distributed import pick_device
from coupled_qk.training.metrics import check_metric, metric_direction


def test_available_devices_follow_the_machine(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert available_devices()[:5] == ["auto", "cpu", "cuda", "cuda:0", "cuda:1"]
    assert check_device("--device", " CUDA:1 ") == "cuda:1"
    with pytest.raises(ValueError, match=r"--device='cuda:2' is not available.*cuda:1"):
        check_device("--device", "cuda:2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="available here: auto, cpu"):
        check_device("--device", "cuda")


@given(st.text(max_size=10))
def test_any_device_text_is_a_device_or_a_named_error(text):
    try:
        name = check_device("--device", text)
    except ValueError as exc:
        assert "--device" in str(exc) and "available here" in str(exc)
    else:
        assert name in available_devices() or name in ("cpu:0",)
        if name != "auto":
            assert pick_device(name).type == name.split(":")[0]


@pytest.mark.parametrize("value", ["", "gpu", "cuda:x", 3, None, "cuda:-1"])
def test_device_spelling(value):
    with pytest.raises(ValueError, match="TrainConfig.device"):
        check_device_name("TrainConfig.device", value)
    with pytest.raises(ValueError, match="device"):
        pick_device(value)


def test_dtype_names():
    assert check_dtype("--dtype", "BF16", "cpu") == "bf16"
    for bad in ("", "float32", None, 16):
        with pytest.raises(ValueError, match="--dtype"):
            check_dtype("--dtype", bad)


METRICS = ["valid/loss", "valid/perplexity", "valid/accuracy", "dev/f1", "dev/mcc", "tokens_per_s"]


@pytest.mark.parametrize(
    "metric,direction",
    [
        ("valid/loss", "min"),
        ("valid/perplexity", "min"),
        ("valid/accuracy", "max"),
        ("dev/f1", "max"),
        ("dev/mcc", "max"),
    ],
)
def test_early_stop_direction_is_inferred(metric, direction):
    assert metric_direction(metric) == direction
    assert check_metric("early_stop_metric", metric, None, METRICS) == direction
    assert check_metric("early_stop_metric", metric, direction, METRICS) == direction
    with pytest.raises(ValueError, match="improves when it goes"):
        check_metric("early_stop_metric", metric, "max" if direction == "min" else "min", METRICS)


def test_early_stop_metric_must_exist_and_have_a_direction():
    with pytest.raises(ValueError, match=r"not a validation metric.*valid/accuracy"):
        check_metric("early_stop_metric", "valid/acc", None, METRICS)
    with pytest.raises(ValueError, match="cannot tell"):
        check_metric("early_stop_metric", "tokens_per_s", None, METRICS)
    assert check_metric("early_stop_metric", "tokens_per_s", "max", METRICS) == "max"
    for bad in ("", None, 3):
        with pytest.raises(ValueError, match="early_stop_metric"):
            check_metric("early_stop_metric", bad, None, METRICS)
    with pytest.raises(ValueError, match="mode"):
        check_metric("early_stop_metric", "valid/loss", "down", METRICS)


def test_a_token_budget_below_one_step_is_said():
    from coupled_qk.training.tasks import steps_for_tokens

    class Task:
        name = "fake"

        def step_tokens(self, step, world):
            return 64 * world

    with pytest.warns(UserWarning, match=r"max_tokens=10 is smaller than one optimizer step \(128 tokens"):
        assert steps_for_tokens(Task(), 10, 2) == 1
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert steps_for_tokens(Task(), 128, 2) == 1 and steps_for_tokens(Task(), 129, 2) == 2


@pytest.mark.parametrize(
    "kw,message",
    [
        (
            dict(best_metric="valid/loss", best_mode="max"),
            r"TrainConfig.best_metric='valid/loss' improves when it goes "
            r"down, but the mode is 'max'",
        ),
        (
            dict(early_stop_metric="valid/acc", early_stop_value=0.5),
            r"TrainConfig.early_stop_metric='valid/acc' is not a validation metric of task 'lm'; "
            r"it reports: .*valid/loss",
        ),
    ],
)
def test_the_loop_checks_metrics_at_the_first_validation(tiny_cfg, tmp_path, kw, message):
    """One check (``training/metrics.py::check_metric``) for both metrics, run at the first validation, before any best
    checkpoint or early stop acts on the metric."""
    from coupled_qk.training.loop import train

    out = tmp_path / "r"
    with pytest.raises(ValueError, match=message):
        train(tiny_cfg(out_dir=str(out), max_steps=2, eval_interval=1, **kw))
    assert not list(out.glob("best-*"))


def test_check_metrics_lists_only_numeric_metrics():
    from coupled_qk.training.config import TrainConfig
    from coupled_qk.training.loop import check_metrics

    cfg = TrainConfig(max_steps=1, best_metric="valid/loss")
    check_metrics(cfg, {"valid/loss": 1.0, "note": "x"})
    with pytest.raises(ValueError, match=r"it reports: valid/loss$"):
        check_metrics(TrainConfig(max_steps=1, best_metric="note"), {"valid/loss": 1.0, "note": "x"})
