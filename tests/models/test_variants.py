"""The variant registry: the map x scoring grid, nested map options, typed coercion, flat spellings, old
configs, and a worked example that adds a toy variant through the registry only and trains it."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coupled_qk import GPT, GPTConfig, QKMap
from coupled_qk.models import registry
from coupled_qk.models.config import parse_overrides
from coupled_qk.models.maps.dynamics import DynamicsOptions
from coupled_qk.models.maps.query_mlp import QueryMLPOptions
from coupled_qk.models.options import MapOptions, option
from coupled_qk.models.registry import ATTENTIONS, attention_names, flat_option_names, register_qk_map
from coupled_qk.models.specs import parse_variants, variant_overrides

SMALL = dict(vocab_size=50, block_size=16, n_layer=2, d_model=32, n_heads=4)


def test_grid_is_every_map_with_every_scoring():
    cells = {
        (ATTENTIONS[n].qk_map.name if ATTENTIONS[n].qk_map else None, ATTENTIONS[n].scoring): n
        for n in attention_names()
    }
    maps = [None, *registry.QK_MAPS]
    assert set(cells) == {(m, s) for m in maps for s in ("standard", "differential")}
    assert cells[("dynamics", "differential")] == "coupled_differential"
    assert cells[("query_mlp", "standard")] == "uncoupled_mlp"
    cfg = GPTConfig(**SMALL, attention="uncoupled_mlp_differential", dt_init=0.2)  # the new grid cell builds
    attn = GPT(cfg).blocks[0].attn
    assert attn.scoring == "differential" and type(attn.qk_map).__name__ == "QueryMLP"
    assert torch.equal(attn.qk_map.dt, torch.full((4,), 0.2))


@pytest.mark.parametrize("attention", ["standard", "differential"])
@pytest.mark.parametrize(
    "option",
    [
        dict(integrator="leapfrog"),
        dict(n_steps=3),
        dict(force="gradient"),
        dict(dt_init=0.2),
        dict(dynamics_hidden=8),
        dict(shared_across_heads=False),
    ],
)
def test_map_options_without_a_map_are_errors(attention, option):
    (name,) = option
    with pytest.raises(ValueError, match=rf"\['{name}'\] do not apply to attention='{attention}'"):
        GPTConfig(**SMALL, attention=attention, **option)
    with pytest.raises(ValueError, match=name):
        GPTConfig.from_preset("tiny", attention=attention, **option)


@pytest.mark.parametrize("option", [dict(integrator="leapfrog"), dict(n_steps=3), dict(force="gradient")])
def test_dynamics_options_are_errors_for_the_query_mlp(option):
    (name,) = option
    with pytest.raises(ValueError, match=rf"\['{name}'\] do not apply to attention='uncoupled_mlp'.*'query_mlp'"):
        GPTConfig(**SMALL, attention="uncoupled_mlp", **option)
    with pytest.raises(ValueError, match=name):
        GPTConfig(**SMALL, attention="uncoupled_mlp", qk_map=option)


def test_flat_spellings_route_into_the_nested_config():
    cfg = GPTConfig(**SMALL, attention="coupled", integrator="leapfrog", n_steps=2, dynamics_hidden=8)
    assert cfg.qk_map == DynamicsOptions(integrator="leapfrog", n_steps=2, hidden=8)
    assert cfg.to_dict()["qk_map"] == dict(
        integrator="leapfrog",
        n_steps=2,
        hidden=8,
        dt_init=0.1,
        shared_across_heads=True,
        force="mlp",
        keys_per_query_head=True,
    )
    assert GPTConfig.from_dict(cfg.to_dict()) == cfg
    assert not hasattr(cfg, "integrator")  # flat names are spellings, not attributes
    assert GPTConfig(**SMALL).qk_map is None
    assert GPTConfig(**SMALL, attention="uncoupled_mlp").qk_map == QueryMLPOptions()
    assert variant_overrides("coupled+n_steps=3") == {"attention": "coupled", "integrator": "euler", "n_steps": 3}
    with pytest.raises(ValueError, match="n_steps"):
        GPTConfig(**SMALL, **variant_overrides("standard+n_steps=3"))
    shared = GPTConfig(**{**SMALL, "n_kv_heads": 1}, **variant_overrides("coupled+keys_per_query_head=False"))
    assert shared.qk_map == DynamicsOptions(keys_per_query_head=False)
    with pytest.raises(ValueError, match="keys_per_query_head"):
        GPTConfig(**SMALL, keys_per_query_head=False)


def test_replace_keeps_or_drops_map_options():
    cfg = GPTConfig(**SMALL, attention="coupled", n_steps=2)
    assert cfg.replace(attention="coupled_differential").qk_map.n_steps == 2  # same map: kept
    assert cfg.replace(attention="standard").qk_map is None
    assert cfg.replace(attention="uncoupled_mlp").qk_map == QueryMLPOptions()
    assert cfg.replace(n_layer=3, integrator="leapfrog").qk_map == DynamicsOptions(n_steps=2, integrator="leapfrog")


def test_fields_are_coerced_to_their_declared_types():
    cfg = GPTConfig(
        **{**SMALL, "n_layer": "3"},
        attention="coupled",
        use_mlp="False",
        dropout="0.25",
        shared_across_heads="false",
        n_steps="2",
        dynamics_hidden="none",
        dt_init="0",
    )
    assert cfg.n_layer == 3 and cfg.use_mlp is False and cfg.dropout == 0.25
    assert cfg.qk_map == DynamicsOptions(shared_across_heads=False, n_steps=2, hidden=None, dt_init=0.0)
    assert isinstance(cfg.qk_map.dt_init, float)
    assert GPT(cfg).blocks[0].mlp is None and GPT(cfg).blocks[0].attn.qk_map.force.n_heads == 4
    for bad, match in [
        (dict(use_mlp="maybe"), "use_mlp"),
        (dict(n_layer="2.5"), "n_layer"),
        (dict(dropout="fast"), "dropout"),
        (dict(attention="coupled", n_steps="x"), "n_steps"),
        (dict(attention="coupled", dt_init="nan"), "dt_init"),
        (dict(rope_base=-1.0), "rope_base"),
        (dict(attention="coupled", qk_map="leapfrog"), "qk_map"),
    ]:
        with pytest.raises(ValueError, match=match):
            GPTConfig(**{**SMALL, **bad})


def test_parse_overrides_is_typed():
    assert parse_overrides(["use_mlp=False", "n_layer=6", "dt_init=0", "dynamics-hidden=none", "position=learned"]) == {
        "use_mlp": False,
        "n_layer": 6,
        "dt_init": 0.0,
        "dynamics_hidden": None,
        "position": "learned",
    }
    with pytest.raises(ValueError, match=r"--set n_head=3: unknown GPTConfig field 'n_head' \(did you mean 'n_heads'"):
        parse_overrides(["n_head=3"])
    with pytest.raises(ValueError, match="FIELD=VALUE"):
        parse_overrides(["n_layer"])
    with pytest.raises(ValueError, match="n_layer"):
        parse_overrides(["n_layer=two"])


def test_old_saved_configs_load(tmp_path):
    """config.json written before GPTConfig.qk_map: every dynamics option flat, plus ``extra``."""
    old = dict(
        SMALL,
        n_kv_heads=4,
        d_head=8,
        d_ff=128,
        use_mlp=True,
        attention="standard",
        integrator="euler",
        n_steps=1,
        dynamics_hidden=None,
        dt_init=0.1,
        shared_across_heads=True,
        force="mlp",
        position="rope",
        map_position="pre_rope",
        rope_base=10000.0,
        dropout=0.0,
        attn_impl="sdpa",
        extra={},
    )
    path = tmp_path / "model_config.json"
    path.write_text(json.dumps(old))
    assert GPTConfig.load(path) == GPTConfig(**SMALL)
    path.write_text(json.dumps(dict(old, attention="uncoupled_mlp", dt_init=0.3)))
    assert GPTConfig.load(path).qk_map == QueryMLPOptions(dt_init=0.3)
    path.write_text(json.dumps(dict(old, attention="coupled", integrator="leapfrog", n_steps=2)))
    assert GPTConfig.load(path).qk_map == DynamicsOptions(integrator="leapfrog", n_steps=2)
    path.write_text(json.dumps(dict(old, integrator="leapfrog")))  # an option the old code silently ignored
    with pytest.raises(ValueError, match="integrator.*attention='standard'"):
        GPTConfig.load(path)


def test_registering_a_taken_name_fails():
    with pytest.raises(ValueError, match="already registered"):
        register_qk_map("dynamics", "other", QKMap, DynamicsOptions)
    with pytest.raises(ValueError, match="coupled"):
        register_qk_map("other", "coupled", QKMap, DynamicsOptions)
    with pytest.raises(ValueError, match="MapOptions"):
        register_qk_map("other", "other", QKMap, dict)


# -- worked example (docs/DESIGN.md): a new query-key map added through the registry only -------------------


class ScaledKeys(QKMap):
    """Toy map ``(q, k) -> (q, s k)`` with a fixed scale ``s``; keys stay per key/value head."""

    keys_per_query_head = False

    def __init__(self, d_head: int, n_heads: int, scale: float = 2.0):
        super().__init__()
        self.scale, self.dt = scale, None

    def forward(self, q, k):
        return q, self.scale * k


@dataclasses.dataclass
class ScaledKeysOptions(MapOptions):
    scale: float = option(2.0)


@pytest.fixture
def scaled_key_variant():
    with registry.isolated():  # the registration is undone after the test
        register_qk_map("scaled_key", "scaled_key", ScaledKeys, ScaledKeysOptions)
        yield


def test_worked_example_registers_a_toy_variant_and_trains_it(scaled_key_variant, tiny_cfg):
    from coupled_qk.training.loop import train

    assert {"scaled_key", "scaled_key_differential"} <= set(ATTENTIONS)
    torch.manual_seed(0)
    std = GPT(GPTConfig(**SMALL)).eval()
    idx = torch.randint(0, 50, (2, 12))
    for scale, same in [(1.0, True), (2.0, False)]:
        toy = GPT(GPTConfig(**SMALL, attention="scaled_key", qk_map={"scale": scale})).eval()
        toy.load_state_dict(std.state_dict())
        with torch.no_grad():
            assert torch.equal(toy(idx), std(idx)) == same
    # q . (s k) = (s q) . k: the toy equals standard attention with queries scaled by s
    toy = GPT(GPTConfig(**SMALL, attention="scaled_key", qk_map={"scale": 2.0})).eval()
    toy.load_state_dict(std.state_dict())
    with torch.no_grad():
        for block in std.blocks:
            block.attn.qkv.weight[: 4 * 8] *= 2.0
        torch.testing.assert_close(toy(idx), std(idx), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"\['n_steps'\] do not apply to attention='scaled_key'"):
        GPTConfig(**SMALL, attention="scaled_key", n_steps=2)

    cfg = tiny_cfg(
        model=dict(n_layer=1, d_model=32, n_heads=2, block_size=16, attention="scaled_key", qk_map={"scale": "0.5"}),
        max_steps=3,
        eval_interval=3,
    )
    results = train(cfg)
    assert results["steps"] == 3 and torch.isfinite(torch.tensor(results["final"]["valid/loss"]))
    saved = GPTConfig.load(next(Path(cfg.out_dir).rglob("model_config.json")))
    assert saved.attention == "scaled_key" and saved.qk_map == ScaledKeysOptions(scale=0.5)


def test_every_maps_options_are_flat_spellings_with_their_types():
    """The option names are generated from each registered dataclass: the v2 invertible map's too."""
    assert parse_overrides(["n_alternations=2", "scale_max=0.5"]) == {"n_alternations": 2, "scale_max": 0.5}
    spec = variant_overrides("invertible+n_alternations=3")
    assert spec == {"attention": "invertible", "n_alternations": 3}
    cfg = GPTConfig(**SMALL, **spec)
    assert cfg.qk_map.n_alternations == 3 and not hasattr(cfg, "n_alternations")
    with pytest.raises(ValueError, match=r"--set n_alternations='two' is not an integer"):
        parse_overrides(["n_alternations=two"])
    with pytest.raises(ValueError, match=r"GPTConfig.qk_map.n_alternations"):
        GPTConfig(**SMALL, attention="invertible", n_alternations=0)
    with pytest.raises(ValueError, match=r"\['n_alternations'\] do not apply to attention='coupled'"):
        GPTConfig(**SMALL, attention="coupled", n_alternations=2)
    with pytest.raises(TypeError, match="n_alternatoins"):  # a name no map has is the dataclass's own error
        GPTConfig(**SMALL, attention="invertible", n_alternatoins=2)
    assert set(flat_option_names()) >= {"integrator", "n_steps", "dynamics_hidden", "hidden", "n_alternations"}


def test_unknown_names_say_where_plugin_names_come_from_and_where_specs_go():
    """A run of a plugin's variant loaded where the plugin is not installed, or a spec given as an attention name,
    is an error that says why, not only the list of known names."""
    with pytest.raises(ValueError, match="is unknown.*installed.*entry-point group 'coupled_qk.variants'"):
        GPTConfig(attention="not_installed")
    with pytest.raises(ValueError, match="unknown variant 'not_installed'.*entry-point group 'coupled_qk.variants'"):
        variant_overrides("not_installed")
    with pytest.raises(
        ValueError,
        match=r"read by --variants only.*--attention coupled --set n_steps=3 --set "
        r"dt_init=0\.2\)",
    ):
        GPTConfig(attention="coupled+n_steps=3+dt_init=0.2")
    with pytest.raises(
        ValueError,
        match=r"'coupled_leapfrog' is a named variant .*--attention coupled --set "
        r"integrator=leapfrog\)",
    ):
        GPTConfig(attention="coupled_leapfrog")  # the hint's flags build it:
    flags = GPTConfig(attention="coupled", integrator="leapfrog")
    assert flags.qk_map == GPTConfig(**variant_overrides("coupled_leapfrog")).qk_map


@pytest.mark.parametrize(
    "spec, match",
    [
        ("coupled+n_steps=-1", r"variant 'coupled\+n_steps=-1': GPTConfig.qk_map.n_steps"),
        ("standard+n_steps=2", r"variant 'standard\+n_steps=2': GPTConfig option\(s\) \['n_steps'\] do not apply"),
        ("invertible+dt_init=0.2", r"variant 'invertible\+dt_init=0.2': .*do not apply to attention='invertible'"),
    ],
)
def test_a_spec_with_bad_map_options_is_refused_when_parsed_naming_the_spec(spec, match):
    """`claims --variants drift+gain=-1` once trained a cell's other runs before failing on the bad one, and
    `compare` did not say which spec was wrong: a spec's map options are checked when it is parsed."""
    with pytest.raises(ValueError, match=match):
        variant_overrides(spec)
    assert variant_overrides("coupled+n_steps=2+integrator=leapfrog")["n_steps"] == 2


# ---------------------------------------------------------------------- equivalent and contradicting specs

DYNAMICS_DEFAULTS = dataclasses.asdict(DynamicsOptions())


@given(names=st.lists(st.sampled_from(sorted(DYNAMICS_DEFAULTS)), min_size=1, unique=True))
@settings(max_examples=25, deadline=None)
def test_a_spec_that_spells_out_defaults_is_the_same_model_and_refused_naming_both(names):
    """`compare --variants coupled,coupled+n_steps=1` trained and reported one model twice under two labels."""
    same = "coupled+" + "+".join(f"{n}={DYNAMICS_DEFAULTS[n]}" for n in names)
    with pytest.raises(ValueError, match=rf"--variants: 'coupled' and '{re.escape(same)}' are the same model"):
        parse_variants(["coupled", same])
    assert parse_variants([same]) == [same]  # alone it is a valid spec


@pytest.mark.parametrize(
    "first, second",
    [
        ("coupled_leapfrog", "coupled+integrator=leapfrog"),
        ("coupled+n_steps=2", "coupled+n_steps=2.0"),
        ("coupled_symplectic_euler+dynamics_hidden=8", "coupled+integrator=symplectic_euler+hidden=8"),
        ("coupled+dt_init=0.1", "coupled"),
    ],
)
def test_other_spellings_of_one_model_are_refused(first, second):
    with pytest.raises(ValueError, match=rf"'{re.escape(first)}' and '{re.escape(second)}' are the same model"):
        parse_variants(f"{first},{second}")
    # a spec written twice is one spec, different models are kept
    assert parse_variants(f"{first},{first},coupled+n_steps=3") == [first, "coupled+n_steps=3"]


@pytest.mark.parametrize(
    "spec, instead",
    [
        ("coupled_leapfrog+integrator=euler", "coupled+integrator=euler"),
        ("coupled-leapfrog+n_steps=2+integrator=symplectic_euler", "coupled+n_steps=2+integrator=symplectic_euler"),
        ("coupled_symplectic_euler+integrator=leapfrog", "coupled+integrator=leapfrog"),
        ("coupled+attention=uncoupled_mlp+dt_init=0.2", "uncoupled_mlp+dt_init=0.2"),
        ("leapfrog+attention=standard", "standard"),
    ],
)
def test_an_override_contradicting_the_variants_defining_setting_is_refused(spec, instead):
    """`coupled_leapfrog+integrator=euler` trained Euler under the leapfrog label; the message names the spec to
    write, which parses to the model that was asked for."""
    with pytest.raises(ValueError, match=rf"contradicts .*; write '{re.escape(instead)}' instead"):
        variant_overrides(spec)
    assert parse_variants(instead) == [instead]
    # a variant named after its attention is defined by it alone; agreeing with a defining setting is allowed
    assert variant_overrides("coupled+integrator=leapfrog")["integrator"] == "leapfrog"
    assert variant_overrides("coupled_leapfrog+integrator=leapfrog")["integrator"] == "leapfrog"
