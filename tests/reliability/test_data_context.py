"""A context length beyond the data is said where the data enters (``training/tasks/lm.py::LMTask._check_context``)."""

from __future__ import annotations

import warnings

import pytest

from coupled_qk.training.tasks.lm import LMTask
from tests.conftest import make_text


def _corpus(tmp_path, valid: str):
    root = tmp_path / "short"
    root.mkdir()
    (root / "train.txt").write_text(make_text(300, 0))
    (root / "valid.txt").write_text(valid)
    (root / "test.txt").write_text(make_text(20, 2))
    return root


def _build(cfg):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        task = LMTask(cfg)
    return task, [str(w.message) for w in caught if "block_size=" in str(w.message)]


def test_a_split_shorter_than_the_context_is_said(tiny_cfg, tmp_path):
    task, said = _build(tiny_cfg(corpus=str(_corpus(tmp_path, "the cat sat on the mat.\n"))))
    n_valid = len(task.tokens["valid"])
    assert 2 <= n_valid < task.block_size + 1  # the case: one short window
    assert said == [
        f"block_size=16 is longer than the valid split of {task.cfg.corpus!r} ({n_valid:,} tokens): its "
        f"evaluation is one window of {n_valid - 1:,} targets with less context than the model's, not "
        "comparable with runs whose windows are full; lower block_size (--set block_size=...) or use a "
        "longer split"
    ]


def test_full_splits_say_nothing(tiny_cfg):
    task, said = _build(tiny_cfg())
    assert min(len(t) for t in task.tokens.values()) > task.block_size and said == []


def test_too_few_training_windows_for_a_batch_are_said(tiny_cfg):
    task, _ = _build(tiny_cfg())
    n_train = len(task.tokens["train"])
    block = n_train - 3  # 3 distinct windows, batch_size 4
    task, said = _build(tiny_cfg(model=dict(n_layer=1, d_model=32, n_heads=2, block_size=block)))
    assert any(
        f"leaves only 3 distinct training windows in the {n_train:,} tokens" in m and "batch_size=4" in m for m in said
    )
    assert any("longer than the valid split" in m for m in said)  # the valid split is shorter still


def test_an_evaluation_split_without_two_tokens_is_refused(tiny_cfg, tmp_path):
    with pytest.raises(
        ValueError,
        match=r"the valid split of .* has [01] token\(s\): nothing to evaluate "
        r"\(block_size=16\)",
    ):
        LMTask(tiny_cfg(corpus=str(_corpus(tmp_path, "a"))))
