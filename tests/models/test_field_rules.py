"""GPTConfig fields that only some settings read (``models/field_rules.py::READ_WHEN``): the declared rule is
checked against what the model actually reads, and a non-default value is refused exactly where it is not read.

A field is "read" by a model when changing it (after construction, bypassing validation) changes the model:
its parameter shapes or its logits on a fixed input, for the same seed."""

from __future__ import annotations

import itertools
import json
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coupled_qk import GPT, GPTConfig
from coupled_qk.hf.configuration import CoupledQKConfig
from coupled_qk.models.field_rules import MISSING, READ_WHEN, field_value
from coupled_qk.models.registry import attention_names

OTHER_VALUE = {"rope_base": 37.0, "map_position": "post_rope", "d_ff": 24, "qk_map.keys_per_query_head": False}
"""A non-default value of every field of READ_WHEN (a test fails if a field is added without one)."""

SMALL = dict(vocab_size=32, block_size=8, n_layer=1, d_model=16, n_heads=4)


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
    """``config`` with ``name`` (``qk_map.<option>`` for a map option) set to ``value`` without validation (what
    a model would be given if the value were accepted)."""
    out = GPTConfig.from_dict(config.to_dict())
    top, _, option = name.partition(".")
    object.__setattr__(out.qk_map if option else out, option or name, value)
    return out


def given_as(name: str, value) -> dict:
    """The constructor keyword that gives field ``name`` (a map option by its flat spelling)."""
    return {name.rpartition(".")[2]: value}


def assign(config: GPTConfig, name: str, value) -> None:
    """``config.<name> = value`` through the checked assignment (``config.qk_map.<option>`` for a map option)."""
    top, _, option = name.partition(".")
    setattr(getattr(config, top) if option else config, option or name, value)


def skip(config: GPTConfig, name: str) -> bool:
    """Combinations outside the rule: ``post_rope`` with learned positions is refused by its own rule, and a map
    option is checked only for maps that have it."""
    return (name == "map_position" and config.position != "rope") or field_value(config, name) is MISSING


settings_grid = st.fixed_dictionaries(
    {
        "attention": st.sampled_from(attention_names()),
        "position": st.sampled_from(["rope", "learned"]),
        "use_mlp": st.booleans(),
        "n_kv_heads": st.sampled_from([None, 2]),  # SMALL has n_heads=4: 2 is grouped-query attention
    }
)


GRID = [
    dict(attention=a, position=p, use_mlp=m, n_kv_heads=kv)
    for a, p, m, kv in itertools.product(attention_names(), ["rope", "learned"], [True, False], [None, 2])
]
"""Every setting that the rules depend on (the whole product: a sample missed combinations where a rule was wrong)."""


@pytest.mark.parametrize("name", sorted(READ_WHEN))
def test_the_declared_rule_matches_what_the_model_reads(name):
    rule, value, checked = READ_WHEN[name], OTHER_VALUE[name], 0
    for grid in GRID:
        base = GPTConfig(**SMALL, **grid)
        if skip(base, name):
            continue
        shapes_a, logits_a = behaviour(base)
        shapes_b, logits_b = behaviour(forced(base, name, value))
        read = shapes_a != shapes_b or not torch.equal(logits_a, logits_b)
        assert read == rule.when(base), (name, grid, read)
        checked += 1
    assert checked >= 8, f"{name}: only {checked} settings exercise the rule"


@settings(max_examples=30, deadline=None)
@given(settings_grid, st.sampled_from(sorted(READ_WHEN)))
def test_a_non_default_value_is_refused_exactly_where_it_is_not_read(grid, name):
    base = GPTConfig(**SMALL, **grid)
    value = OTHER_VALUE[name]
    if skip(base, name):
        return
    if READ_WHEN[name].when(base):
        assert field_value(GPTConfig(**SMALL, **grid, **given_as(name, value)), name) == value
        return
    with pytest.raises(ValueError, match=rf"GPTConfig\.{name}=.* is not read with .*: {name} is for ") as info:
        GPTConfig(**SMALL, **grid, **given_as(name, value))
    assert "\n" not in str(info.value)
    assert GPTConfig(**SMALL, **grid, **given_as(name, READ_WHEN[name].default(base))) == base  # the default


@settings(max_examples=30, deadline=None)
@given(settings_grid, st.sampled_from(sorted(READ_WHEN)))
def test_assigning_a_non_default_value_is_refused_exactly_where_it_is_not_read(grid, name):
    cfg = GPTConfig(**SMALL, **grid)
    value = OTHER_VALUE[name]
    if skip(cfg, name):
        return
    before = cfg.to_dict()
    if READ_WHEN[name].when(cfg):
        assign(cfg, name, value)
        assert field_value(cfg, name) == value
        return
    with pytest.raises(ValueError, match=rf"GPTConfig\.{name}=.* is not read with "):
        assign(cfg, name, value)
    assert cfg.to_dict() == before  # the refused value is not kept


def test_replace_resets_unread_fields():
    coupled = GPTConfig(**SMALL, attention="coupled", map_position="post_rope", rope_base=500.0)
    assert coupled.replace(attention="standard").map_position == "pre_rope"
    assert coupled.replace(position="learned", map_position="pre_rope").rope_base == 10000.0
    assert GPTConfig(**SMALL, d_ff=24).replace(use_mlp=False).d_ff == 64
    with pytest.raises(ValueError, match="map_position='post_rope' is not read with attention='standard'"):
        coupled.replace(attention="standard", map_position="post_rope")
    shared = GPTConfig(**SMALL, attention="coupled", n_kv_heads=2, keys_per_query_head=False)
    assert shared.replace(n_kv_heads=4).qk_map.keys_per_query_head is True  # no grouped heads: back to the default
    assert shared.replace(dt_init=0.3).qk_map.keys_per_query_head is False
    with pytest.raises(ValueError, match="keys_per_query_head=False is not read with n_kv_heads=4 = n_heads=4"):
        shared.replace(n_kv_heads=4, keys_per_query_head=False)


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
    coupled = GPTConfig(**SMALL, attention="coupled").to_dict()
    coupled["qk_map"]["keys_per_query_head"] = False  # a map option: the same rule
    path.write_text(json.dumps(coupled))
    with pytest.warns(UserWarning, match="GPTConfig.qk_map.keys_per_query_head=False is not read with n_kv_heads=4"):
        assert GPTConfig.load(path).qk_map.keys_per_query_head is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a saved config at the defaults loads silently
        ok = tmp_path / "ok.json"
        GPTConfig(**SMALL, position="learned", use_mlp=False).save(ok)
        assert GPTConfig.load(ok).position == "learned"
