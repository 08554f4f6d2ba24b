"""Names with no effect are refused (docs/RELIABILITY.md, "Names that take no effect"): a keyword of the Hugging Face
config that no coupled-qk model reads, a ``TrainConfig`` field given on the command line in a setting that does
not read it, a task option that its other options make unread. Before, ``CoupledQKConfig(rope_theta=500.0)`` kept
500 as an attribute while the RoPE base stayed 10000.

The foreign names come from the ``transformers`` configs of the models users port from (their constructor
arguments and attribute maps), the rules from their tables, so a new name or rule is covered.
"""

from __future__ import annotations

import inspect
import json
import warnings

import pytest
import reliability_profile  # noqa: F401  (the example budget)
import transformers
from hypothesis import given
from hypothesis import strategies as st

from coupled_qk.hf.configuration import COUNTERPARTS, GPT_FIELDS, STANDARD_NAMES, CoupledQKConfig
from coupled_qk.models.config import GPTConfig

SOURCES = ("LlamaConfig", "MistralConfig", "GPT2Config", "GPTNeoXConfig", "Qwen2Config", "GemmaConfig", "PhiConfig")
BASE = dict(vocab_size=64, block_size=16, n_layer=1, d_model=32, n_heads=2)


def foreign_names() -> list[str]:
    """The config names of other models that are neither ours nor every transformers config's."""
    from coupled_qk.hf.configuration import _transformers_attributes

    names = set()
    for source in SOURCES:
        cls = getattr(transformers, source)
        names.update(p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "kwargs"))
        names.update(getattr(cls, "attribute_map", {}))
    ours = set(GPT_FIELDS) | set(GPTConfig.extra_names()) | set(STANDARD_NAMES)
    return sorted(n for n in names - ours - _transformers_attributes() if not n.startswith("_"))


FOREIGN = foreign_names()


def sample_value(name: str):
    """A value of ``name`` as the model that reads it has it by default (transformers checks some, e.g.
    ``layer_types``), else 0.5."""
    if name.startswith("rope_"):
        return {"rope_type": "default", "rope_theta": 10000.0}
    for source in SOURCES:
        value = getattr(getattr(transformers, source)(), name, None)
        if value is not None and isinstance(value, (int, float, str, bool, list, dict)):
            return value
    return 0.5


def test_the_foreign_names_are_many_and_include_the_sweeps():
    assert len(FOREIGN) > 30 and {"hidden_act", "rms_norm_eps", "attention_dropout"} <= set(FOREIGN)


@pytest.mark.parametrize("name", FOREIGN)
def test_a_name_no_model_reads_is_refused_when_built_and_warned_when_loaded(name, tmp_path):
    value = sample_value(name)
    with pytest.raises(ValueError, match=f"{name}=.*no coupled-qk model reads"):
        CoupledQKConfig(**BASE, **{name: value})
    data = {**CoupledQKConfig(**BASE).to_dict(), name: value}
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.warns(UserWarning, match=f"{name}=.*, which no coupled-qk model reads"):
        config = CoupledQKConfig.from_pretrained(tmp_path)  # a saved file loads: a newer version may write it
    assert config.to_gpt_config() == CoupledQKConfig(**BASE).to_gpt_config()


@pytest.mark.parametrize("name", sorted(COUNTERPARTS))
def test_names_with_a_counterpart_say_it(name):
    with pytest.raises(ValueError, match=f"here that is {COUNTERPARTS[name]}"):
        CoupledQKConfig(**BASE, **{name: 1})


@given(name=st.sampled_from(sorted(STANDARD_NAMES)), data=st.data())
def test_every_standard_name_sets_our_field(name, data):
    """``rope_theta`` (Llama's name of the RoPE base), ``num_hidden_layers``, ...: the field takes the value."""
    ours = STANDARD_NAMES[name]
    value = data.draw(
        st.sampled_from([500.0, 1e6]) if ours == "rope_base" else st.sampled_from(VALID[ours]), label="value"
    )
    config = CoupledQKConfig(**{**{k: v for k, v in BASE.items() if k != ours}, name: value})
    assert getattr(config.to_gpt_config(), ours) == value and getattr(config, name) == value


VALID = {"n_layer": [1, 3], "d_model": [32, 64], "n_heads": [2, 4], "n_kv_heads": [1, 2], "d_head": [8, 16],
         "d_ff": [40, 96], "block_size": [16, 64]}  # fmt: skip


def test_rope_theta_is_the_rope_base():
    config = CoupledQKConfig(**BASE, rope_theta=500.0)
    assert config.rope_base == 500.0 and config.to_gpt_config().rope_base == 500.0
    assert "rope_theta" not in config.to_dict()  # stored under our name
    with pytest.raises(ValueError, match="pass only one of them"):
        CoupledQKConfig(**BASE, rope_theta=500.0, rope_base=10000.0)


# ------------------------------------------------------------------------------------- the command line, the tasks


def _train(argv):
    from coupled_qk import cli
    from coupled_qk.commands.train import train_config_from_args

    return train_config_from_args(cli.build_parser("train").parse_args(["train", *argv]))


def test_every_command_line_rule_refuses_where_unread_and_accepts_where_read(tmp_path):
    from coupled_qk.training.config import COMMAND_LINE_READ_WHEN, TrainConfig

    settings = {  # field -> (its flag with a value, the setting where it is unread, the setting where it is read)
        "eval_batches": (["--eval-batches", "5"], ["--full-eval"], []),
        "on_budget_change": (["--on-budget-change", "keep"], [], ["--resume"]),
    }
    assert set(settings) == set(COMMAND_LINE_READ_WHEN)
    for name, (flag, unread, read) in settings.items():
        with pytest.raises(ValueError, match=f"--{name.replace('_', '-')}=.* is not read with"):
            _train([*flag, *unread])
        with pytest.raises(ValueError, match="is not read with"):
            _train(["--opt", f"{name}={flag[1]}", *unread])
        assert getattr(_train([*flag, *read]), name) is not None
        path = tmp_path / f"{name}.json"  # a config file (e.g. a study's saved run config) is read as it is
        TrainConfig.from_dict({**_train(unread).to_dict(), name: _train([*flag, *read]).to_dict()[name]}).save(path)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _train(["--config", str(path)])


def test_a_glue_subsample_seed_without_a_subset_is_refused():
    from coupled_qk.training.tasks.glue import GlueOptions

    with pytest.raises(ValueError, match="subsample_seed=3 is not read without max_train_examples"):
        GlueOptions.from_options({"glue_task": "sst2", "pretrained": "run", "subsample_seed": 3})
    GlueOptions.from_options({"glue_task": "sst2", "pretrained": "run", "subsample_seed": 3, "max_train_examples": 10})
