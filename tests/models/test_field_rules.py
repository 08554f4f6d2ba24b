"""GPTConfig fields that only some settings read (``models/field_rules.py::READ_WHEN``): the declared rule is
checked against what the model actually reads, and a non-default value is refused exactly where it is not read.

A field is "read" by a model when changing it (after construction, bypassing validation) changes the model:
its parameter shapes or its logits on a fixed input, for the same seed."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coupled_qk import GPT, GPTConfig
from coupled_qk.hf.configuration import CoupledQKConfig
from coupled_qk.models.field_rules import READ_WHEN
from coupled_qk.models.registry import attention_names

OTHER_VALUE = {"rope_base": 37.0, "map_position": "post_rope", "d_ff": 24}
"""A non-default value of every field of READ_WHEN (a test fails if a field is added without one)."""

SMALL = dict(vocab_size=32, block_size=8, n_layer=1, d_model=16, n_heads=2)


def test_every_rule_has_a_test_value():
    assert set(OTHER_VALUE) == set(READ_WHEN)


def behaviour(config: GPTConfig) -> tuple:
    """Parameter shapes and logits of the model of ``config`` (seed 0) on a fixed input."""
    torch.manual_seed(0)
    model = GPT(config).eval()
    for p in model.parameters():  # make every map act (some start as the identity)
        with torch.no_grad():
            p.add_(0.05 * torch.randn_like(p))
    idx = torch.arange(8).remainder(config.vocab_size).view(1, 8)
    with torch.no_grad():
        logits = model(idx)
    return tuple((n, tuple(p.shape)) for n, p in model.state_dict().items()), logits


def forced(config: GPTConfig, name: str, value) -> GPTConfig:
    """``config`` with ``name`` set to ``value`` without validation (what a model would be given if the value
    were accepted)."""
    out = GPTConfig.from_dict(config.to_dict())
    object.__setattr__(out, name, value)
    return out


settings_grid = st.fixed_dictionaries({
    "attention": st.sampled_from(attention_names()),
    "position": st.sampled_from(["rope", "learned"]),
    "use_mlp": st.booleans(),
})


@settings(max_examples=30, deadline=None)
@given(settings_grid, st.sampled_from(sorted(READ_WHEN)))
def test_the_declared_rule_matches_what_the_model_reads(grid, name):
    base = GPTConfig(**SMALL, **grid)
    rule = READ_WHEN[name]
    value = OTHER_VALUE[name]
    if name == "map_position" and base.position != "rope":
        return  # post_rope with learned positions is refused by its own rule (the model never sees it)
    shapes_a, logits_a = behaviour(base)
    shapes_b, logits_b = behaviour(forced(base, name, value))
    read = shapes_a != shapes_b or not torch.equal(logits_a, logits_b)
    assert read == rule.when(base), (name, grid, read)


@settings(max_examples=30, deadline=None)
@given(settings_grid, st.sampled_from(sorted(READ_WHEN)))
def test_a_non_default_value_is_refused_exactly_where_it_is_not_read(grid, name):
    base = GPTConfig(**SMALL, **grid)
    value = OTHER_VALUE[name]
    if name == "map_position" and base.position != "rope":
        return  # post_rope needs position='rope' (its own rule)
    if READ_WHEN[name].when(base):
        assert getattr(GPTConfig(**SMALL, **grid, **{name: value}), name) == value
        return
    with pytest.raises(ValueError, match=rf"GPTConfig\.{name}=.* is not read with .*: {name} is for ") as info:
        GPTConfig(**SMALL, **grid, **{name: value})
    assert "\n" not in str(info.value)
    assert GPTConfig(**SMALL, **grid, **{name: READ_WHEN[name].default(base)}) == base  # the default is fine


@settings(max_examples=30, deadline=None)
@given(settings_grid, st.sampled_from(sorted(READ_WHEN)))
def test_assigning_a_non_default_value_is_refused_exactly_where_it_is_not_read(grid, name):
    cfg = GPTConfig(**SMALL, **grid)
    value = OTHER_VALUE[name]
    if name == "map_position" and cfg.position != "rope":
        return  # post_rope needs position='rope' (its own rule)
    before = cfg.to_dict()
    if READ_WHEN[name].when(cfg):
        setattr(cfg, name, value)
        assert getattr(cfg, name) == value
        return
    with pytest.raises(ValueError, match=rf"GPTConfig\.{name}=.* is not read with "):
        setattr(cfg, name, value)
    assert cfg.to_dict() == before  # the refused value is not kept


def test_replace_resets_unread_fields():
    coupled = GPTConfig(**SMALL, attention="coupled", map_position="post_rope", rope_base=500.0)
    assert coupled.replace(attention="standard").map_position == "pre_rope"
    assert coupled.replace(position="learned", map_position="pre_rope").rope_base == 10000.0
    assert GPTConfig(**SMALL, d_ff=24).replace(use_mlp=False).d_ff == 64
    with pytest.raises(ValueError, match="map_position='post_rope' is not read with attention='standard'"):
        coupled.replace(attention="standard", map_position="post_rope")


def test_saved_configs_with_an_unread_value_still_load_with_a_warning(tmp_path):
    data = {**GPTConfig(**SMALL, position="learned").to_dict(), "rope_base": 5.0}
    path = tmp_path / "model_config.json"
    path.write_text(json.dumps(data))
    with pytest.warns(UserWarning, match="model_config.json: GPTConfig.rope_base=5.0 is not read"):
        assert GPTConfig.load(path).rope_base == 5.0
    with pytest.warns(UserWarning, match="rope_base=5.0 is not read"):
        hf = CoupledQKConfig.from_dict(data)
    with pytest.warns(UserWarning):
        assert hf.to_gpt_config().rope_base == 5.0
    with pytest.raises(ValueError, match="rope_base=5.0 is not read"):
        CoupledQKConfig(**data)  # a new config is refused
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a saved config at the defaults loads silently
        ok = tmp_path / "ok.json"
        GPTConfig(**SMALL, position="learned", use_mlp=False).save(ok)
        assert GPTConfig.load(ok).position == "learned"
