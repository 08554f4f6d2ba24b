"""Task registry: names -> classes, the Task protocol, LM option validation and token-budget horizons."""

from __future__ import annotations

import pytest

from coupled_qk.training.config import TrainConfig
from coupled_qk.training.lm import LMTask, run_corpus
from coupled_qk.training.mqar_task import MQARTask
from coupled_qk.training.tasks import TASKS, Task, check_options, steps_for_tokens, task_class


def test_registry_maps_names_to_classes():
    assert task_class("lm") is LMTask and task_class("mqar") is MQARTask
    assert list(TASKS) == ["lm", "mqar"]
    for name in TASKS:
        cls = task_class(name)
        assert cls.name == name
        for method in ("model_overrides", "describe", "train_batch", "step_tokens", "evaluate", "save"):
            assert callable(getattr(cls, method)), (name, method)
    with pytest.raises(ValueError, match=r"task='glue2' is unknown; expected one of \['lm', 'mqar'"):
        task_class("glue2")
    with pytest.raises(ValueError, match="task='nope' is unknown"):
        TrainConfig(task="nope", max_steps=1)


def test_lm_task_options_are_validated(tiny_cfg, tiny_corpus):
    corpus = str(tiny_corpus / "train.txt")  # one file: split at random, so every option applies
    assert run_corpus(corpus, None, {}).source["seed"] == 0
    assert run_corpus(corpus, None, {"split_seed": 3, "min_split_words": 0}).source["seed"] == 3
    with pytest.raises(ValueError, match=r"unknown lm task_options \['bogus'\]; valid options: .*'split_seed'"):
        run_corpus(corpus, None, {"bogus": 1})
    with pytest.raises(ValueError, match="split_seed=-1"):
        run_corpus(corpus, None, {"split_seed": -1})
    with pytest.raises(ValueError, match="valid_fraction=2"):
        run_corpus(corpus, None, {"valid_fraction": 2})
    with pytest.raises(ValueError, match="unknown lm task_options"):
        LMTask(tiny_cfg(task_options={"splitseed": 1}))
    task = LMTask(tiny_cfg(batch_size=3, grad_accum=2))
    assert isinstance(task, Task)
    assert task.step_tokens(0, 1) == 3 * 2 * 16 and task.step_tokens(5, 4) == 3 * 2 * 4 * 16


def test_check_options():
    assert check_options("x", {"a": 1}, ("a", "b")) == {"a": 1}
    with pytest.raises(ValueError, match=r"unknown x task_options \['c'\]"):
        check_options("x", {"a": 1, "c": 2}, ("a", "b"))
    with pytest.raises(ValueError, match="must be a dict"):
        check_options("x", [1], ("a",))


class _Alternating:
    """Steps of 10, 30, 10, 30, ... tokens (world 1)."""

    name = "alt"

    def step_tokens(self, step, world):
        return world * (10 if step % 2 == 0 else 30)


def test_steps_for_tokens_hand_cases():
    t = _Alternating()
    assert steps_for_tokens(t, 1, 1) == 1
    assert steps_for_tokens(t, 10, 1) == 1
    assert steps_for_tokens(t, 11, 1) == 2  # 10 + 30 = 40 >= 11
    assert steps_for_tokens(t, 40, 1) == 2
    assert steps_for_tokens(t, 41, 1) == 3
    assert steps_for_tokens(t, 80, 1) == 4
    assert steps_for_tokens(t, 80, 2) == 2  # 20 + 60
    assert steps_for_tokens(t, 10**6, 1, max_steps=7) == 7
    with pytest.raises(ValueError, match="max_tokens=0"):
        steps_for_tokens(t, 0, 1)

    class Empty(_Alternating):
        def step_tokens(self, step, world):
            return 0

    with pytest.raises(ValueError, match="reports 0 tokens at step 0"):
        steps_for_tokens(Empty(), 5, 1)
