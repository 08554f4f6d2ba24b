"""Each task's ``config_fields`` (the :data:`~coupled_qk.training.tasks.TASK_FIELDS` it reads, every other one refused
by ``TrainConfig``) is checked against what the task actually reads: the task is built, trains a batch,
evaluates (quick and final), describes and saves itself through a config that records every field read."""

from __future__ import annotations

import pytest

from coupled_qk.models.gpt import GPT
from coupled_qk.training.config import TrainConfig
from coupled_qk.training.tasks import TASK_FIELDS, task_class
from tests.training.test_glue_task import make_pretrained, write_sst2


class Recording:
    """A ``TrainConfig`` stand-in that records which of :data:`TASK_FIELDS` are read."""

    def __init__(self, cfg: TrainConfig):
        object.__setattr__(self, "_cfg", cfg)
        object.__setattr__(self, "read", set())

    def __getattr__(self, name):
        if name in TASK_FIELDS:
            self.read.add(name)
        return getattr(self._cfg, name)


def _config(task: str, tmp_path, tiny_corpus) -> TrainConfig:
    base = dict(
        task=task,
        max_steps=2,
        batch_size=4,
        device="cpu",
        out_dir=str(tmp_path / "run"),
        progress=False,
        tensorboard=False,
    )
    if task == "lm":
        return TrainConfig(
            **base,
            corpus=str(tiny_corpus),
            tokenizer="bpe-300",
            cache_dir=str(tmp_path / "cache"),
            model=dict(n_layer=1, d_model=16, n_heads=2, block_size=16),
        )
    if task == "mqar":
        opts = dict(vocab_size=64, train_slices=[[16, 2, 20]], test_slices=[[16, 2, 8]])
        return TrainConfig(
            **base,
            cache_dir=str(tmp_path / "cache"),
            task_options=opts,
            model=dict(n_layer=1, d_model=16, n_heads=1, use_mlp=False, position="learned"),
        )
    pre = make_pretrained(tmp_path / "pre")
    glue = write_sst2(tmp_path / "glue", n_train=20, n_dev=10)
    return TrainConfig(**base, task_options={"glue_task": "sst2", "pretrained": str(pre), "glue_dir": str(glue)})


@pytest.mark.parametrize("task", sorted(["lm", "mqar", "glue"]))
def test_config_fields_are_the_task_fields_the_task_reads(task, tmp_path, tiny_corpus):
    assert set(task_class(task).config_fields) <= set(TASK_FIELDS)
    cfg = Recording(_config(task, tmp_path, tiny_corpus))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    t = task_class(task)(cfg, run_dir)
    model = getattr(t, "build_model", GPT)(cfg.gpt_config(**t.model_overrides()))
    t.train_batch(0, 0, 0, 1, cfg.batch_size, "cpu")
    t.step_tokens(0, 1)
    t.evaluate(model, "cpu", quick=True)
    t.evaluate(model, "cpu", quick=False)
    t.describe()  # what the run folder records of the task (with its tokenizer attribute, read below)
    getattr(t, "tokenizer", None)
    assert cfg.read == set(task_class(task).config_fields), f"{task} reads {sorted(cfg.read)}"
