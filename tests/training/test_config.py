"""TrainConfig validation, the shipped paper-scale configs and the command-line merge."""

from pathlib import Path

import pytest

from coupled_qk.cli import build_parser
from coupled_qk.commands.train import train_config_from_args
from coupled_qk.training.config import TrainConfig

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.json"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_load(path):
    cfg = TrainConfig.load(path)
    model = cfg.gpt_config()
    assert model.vocab_size == 50257 and model.block_size == 512
    assert cfg.corpus == "wikitext-103" and cfg.tokenizer == "gpt2"


def test_paper_configs_exist():
    names = {p.stem for p in CONFIGS}
    for size in ("60m", "150m", "350m"):
        assert {f"wt103-{size}-standard", f"wt103-{size}-coupled"} <= names


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(task="nope"), "task"),
        (dict(batch_size=0), "batch_size"),
        (dict(max_steps=None, max_tokens=None), "max_steps or max_tokens"),
        (dict(dtype="fp8"), "dtype"),
        (dict(model={"attention": "nope"}), "attention"),
        (dict(max_minutes=-1), "max_minutes"),
        (dict(early_stop_metric="valid/accuracy"), "together"),
    ],
)
def test_train_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**{"max_steps": 10, **kwargs})


def test_unknown_field():
    with pytest.raises(ValueError, match="learning_rate"):
        TrainConfig.from_dict({"learning_rate": 1.0, "max_steps": 1})


def test_command_line_merge(tmp_path):
    base = TrainConfig(preset="60m", max_steps=5, model={"attention": "coupled"}, lr=1e-4)
    base.save(tmp_path / "c.json")
    args = build_parser("train").parse_args(
        [
            "train",
            "--config",
            str(tmp_path / "c.json"),
            "--lr",
            "0.01",
            "--integrator",
            "leapfrog",
            "--set",
            "n_layer=2",
            "--opt",
            "min_lr_ratio=0.5",
        ]
    )
    cfg = train_config_from_args(args)
    assert cfg.preset == "60m" and cfg.lr == 0.01 and cfg.min_lr_ratio == 0.5 and cfg.max_steps == 5
    assert cfg.model == {"attention": "coupled", "integrator": "leapfrog", "n_layer": 2}
