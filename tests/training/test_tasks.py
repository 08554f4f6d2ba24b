"""Task registry: names -> classes, the Task protocol, LM option validation and token-budget horizons."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from coupled_qk.training.config import TrainConfig
from coupled_qk.training.tasks import TASK_FIELDS, TASKS, Task, check_options, steps_for_tokens, task_class
from coupled_qk.training.tasks.lm import LMTask, run_corpus
from coupled_qk.training.tasks.mqar import MQARTask


def test_registry_maps_names_to_classes():
    assert task_class("lm") is LMTask and task_class("mqar") is MQARTask
    assert list(TASKS) == ["lm", "mqar", "glue"]
    for name in TASKS:
        cls = task_class(name)
        assert cls.name == name
        for method in ("model_overrides", "describe", "train_batch", "step_tokens", "evaluate"):
            assert callable(getattr(cls, method)), (name, method)
    with pytest.raises(ValueError, match=r"task='glue2' is unknown; expected one of \['lm', 'mqar'"):
        task_class("glue2")
    with pytest.raises(ValueError, match="task='nope' is unknown"):
        TrainConfig(task="nope", max_steps=1)


def test_lm_task_options_are_validated(tiny_cfg, tiny_corpus):
    corpus = str(tiny_corpus / "train.txt")  # one file: split at random, so every option applies
    assert run_corpus(corpus, None, {}).source["seed"] == 0
    assert run_corpus(corpus, None, {"split_seed": 3, "min_split_words": 0}).source["seed"] == 3
    with pytest.raises(ValueError, match=r"unknown lm task_options 'bogus'; valid options: .*'split_seed'"):
        run_corpus(corpus, None, {"bogus": 1})
    with pytest.raises(ValueError, match="split_seed=-1"):
        run_corpus(corpus, None, {"split_seed": -1})
    with pytest.raises(ValueError, match="valid_fraction=2"):
        run_corpus(corpus, None, {"valid_fraction": 2})
    for not_a_dict in ([], 0, "", "abc"):  # read as {} before (``task_options or {}``); None means the defaults
        with pytest.raises(ValueError, match=r"task_options=.* must be a dict"):
            run_corpus(corpus, None, not_a_dict)
    with pytest.raises(ValueError, match="unknown lm task_options"):
        LMTask(tiny_cfg(task_options={"splitseed": 1}))
    task = LMTask(tiny_cfg(batch_size=3, grad_accum=2))
    assert isinstance(task, Task)
    assert task.step_tokens(0, 1) == 3 * 2 * 16 and task.step_tokens(5, 4) == 3 * 2 * 4 * 16


@pytest.mark.parametrize("damage", ["truncated", "empty", "meta_missing", "meta_garbage", "replaced"])
def test_a_damaged_cached_tokenizer_is_trained_again(tiny_cfg, tmp_path, damage):
    """A damaged ``cache/tokenizers/bpe-*`` entry blocked every run of its corpus until deleted by hand; now it
    is warned about and trained again (as a damaged token array is rebuilt), and the cache holds a good one."""
    from coupled_qk.data.tokenizers import Tokenizer

    good = LMTask(tiny_cfg()).tokenizer
    (entry,) = (tmp_path / "cache" / "tokenizers").iterdir()
    tok_file, meta = entry / "tokenizer.json", entry / "coupled_qk_tokenizer.json"
    if damage == "truncated":
        tok_file.write_bytes(tok_file.read_bytes()[:-100])
    elif damage == "empty":
        tok_file.write_bytes(b"")
    elif damage == "meta_missing":  # a save cut between its two files
        meta.unlink()
    elif damage == "meta_garbage":
        meta.write_text("[\n")
    else:  # another tokenizer's file under this entry's name and fingerprint
        other = LMTask(tiny_cfg(tokenizer="bpe-290")).tokenizer
        tok_file.write_text(other.hf.to_str(pretty=True))
    with pytest.warns(UserWarning, match=rf"the cached tokenizer {entry} is damaged \(.+\); training it again"):
        again = LMTask(tiny_cfg()).tokenizer
    assert (again.name, again.fingerprint) == (good.name, good.fingerprint)
    assert Tokenizer.load(entry).fingerprint == good.fingerprint  # the entry was written again


def test_check_options():
    assert check_options("x", {"a": 1}, ("a", "b")) == {"a": 1}
    with pytest.raises(ValueError, match=r"unknown x task_options 'c'"):
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
    with pytest.warns(UserWarning, match="max_tokens=1 is smaller than one optimizer step"):
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


FIELD_VALUES = {"eval_batches": st.integers(1, 100), "full_eval": st.booleans()}


@given(st.sampled_from(list(TASKS)), st.data())
def test_a_task_field_the_task_does_not_read_is_refused(task, data):
    """``--task mqar --corpus X`` must not train on MQAR while recording corpus X: every task field a task does not
    read (its ``config_fields``) is refused at a non-default value, by name; the ones it reads are accepted."""
    field = data.draw(st.sampled_from(TASK_FIELDS))
    value = data.draw(FIELD_VALUES.get(field, st.text(alphabet="abcdefgh/-_.0123456789", min_size=1, max_size=12)))
    reads = task_class(task).config_fields
    default = {f.name: f.default for f in dataclasses.fields(TrainConfig)}[field]
    assume(value != default)
    make = dict(task=task, max_steps=1, **{field: value})
    if task == "glue":
        make["task_options"] = {"pretrained": "run", "glue_task": "sst2"}  # options are checked by the task, later
    if field in reads:
        assert getattr(TrainConfig(**make), field) == value
    else:
        with pytest.raises(ValueError, match=rf"TrainConfig\.{field}=.* does not apply to task='{task}'"):
            TrainConfig(**make)


def test_every_task_declares_the_task_fields_it_reads():
    for name in TASKS:
        reads = task_class(name).config_fields
        assert isinstance(reads, tuple) and set(reads) <= set(TASK_FIELDS), name
    assert task_class("lm").config_fields == TASK_FIELDS  # language modelling reads every task field
