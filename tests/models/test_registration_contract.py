"""A registration mistake fails at the ``register_*`` call that made it, naming it (``models/contracts.py``),
and a registration run again (a notebook cell re-run) replaces the earlier one instead of failing."""

from __future__ import annotations

import dataclasses
import re
import sys
import types
import typing

import pytest
import torch

from coupled_qk import GPT, GPTConfig, MapOptions, QKMap, ScoringRule, option, scaled_dot_product
from coupled_qk.models import registry
from coupled_qk.models.registry import register_qk_map, register_scoring, register_variant

SMALL = dict(vocab_size=32, block_size=8, n_layer=1, d_model=16, n_heads=2)


class Scale(QKMap):
    """``(q, k) -> (s q, k)``."""

    def __init__(self, d_head: int, n_heads: int, s: float = 2.0):
        super().__init__()
        self.s, self.dt = s, None

    def forward(self, q, k):
        return self.s * q, k


@dataclasses.dataclass
class ScaleOptions(MapOptions):
    s: float = option(2.0)


class Plain(ScoringRule):
    def __init__(self, d_head: int, n_heads: int, layer_idx: int):
        super().__init__()

    def forward(self, q, k, v, eager, dropout_p=0.0, mask=None):
        return scaled_dot_product(q, k, v, eager, dropout_p, mask)


@pytest.fixture(autouse=True)
def _isolated():
    with registry.isolated():
        yield


@pytest.mark.parametrize("name", ["my map", "my-map", "a+b", "a,b", "", "2x", 3])
def test_names_that_are_not_identifiers_are_refused(name):
    with pytest.raises(ValueError, match=r"name=.* must be a Python identifier"):
        register_qk_map(name, "ok_stem", Scale, ScaleOptions)
    with pytest.raises(ValueError, match=r"stem=.* must be a Python identifier"):
        register_qk_map("ok_name", name, Scale, ScaleOptions)
    with pytest.raises(ValueError, match=r"name=.* must be a Python identifier"):
        register_variant(name, "coupled", n_steps=2)
    with pytest.raises(ValueError, match=r"name=.* must be a Python identifier"):
        register_scoring(name, Plain)
    assert "ok_name" not in registry.QK_MAPS and "ok_stem" not in registry.attention_names()


def _map_class(**namespace):
    return type("Bad", (QKMap,), {"__init__": Scale.__init__, **namespace})


@pytest.mark.parametrize(
    "module, options, message",
    [
        (torch.nn.Identity, ScaleOptions, "must be a QKMap subclass"),
        (_map_class(), ScaleOptions, r"Bad must define forward\(q, k\)"),
        (
            _map_class(forward=Scale.forward, __init__=lambda self, d_head, n_heads: QKMap.__init__(self)),
            ScaleOptions,
            r"cannot be built as Bad\(d_head, n_heads, s=...\).*unexpected keyword argument 's'",
        ),
        (Scale, dataclasses.make_dataclass("Req", [("s", float)], bases=(MapOptions,)), r"\['s'\] need a default"),
        (
            Scale,
            dataclasses.make_dataclass(
                "Drop", [("s", float, option(2.0)), ("dropout", float, option(0.5))], bases=(MapOptions,)
            ),
            r"\['dropout'\] are GPTConfig fields",
        ),
        (
            Scale,
            dataclasses.make_dataclass("Bare", [("s", float, 2.0)], bases=(MapOptions,)),
            r"options Bare: declare each field's valid values with coupled_qk.option .*Bare.s: declares nothing",
        ),  # its values would be checked by nothing (and a plain field failed a test naming no field)
        (
            Scale,
            dataclasses.make_dataclass("Pair", [("s", tuple, (1.0, 2.0))], bases=(MapOptions,)),
            r"field type\(s\) \{'s': 'tuple'\} cannot be read from --set",
        ),  # '--set s=3,4' was stored as a string
    ],
)
def test_a_map_breaking_the_contract_is_refused_at_registration(module, options, message):
    with pytest.raises(ValueError, match=message):
        register_qk_map("bad", "bad", module, options)
    assert "bad" not in registry.attention_names()


def test_a_scoring_rule_breaking_the_contract_is_refused_at_registration():
    no_forward = type("NoForward", (ScoringRule,), {"__init__": Plain.__init__})
    with pytest.raises(ValueError, match=r"NoForward must define forward\(q, k, v"):
        register_scoring("no_forward", no_forward)
    two_args = type("TwoArgs", (Plain,), {"__init__": lambda self, d_head, n_heads: ScoringRule.__init__(self)})
    with pytest.raises(ValueError, match=r"cannot be built as TwoArgs\(d_head, n_heads, layer_idx\)"):
        register_scoring("two_args", two_args)
    assert not {"no_forward", "two_args"} & set(registry.attention_names())


def test_in_defaults_must_be_a_bool_or_a_list():
    with pytest.raises(ValueError, match=r"in_defaults='standard' must be True, False or a list"):
        register_qk_map("scale", "scale", Scale, ScaleOptions, in_defaults="standard")
    register_qk_map("scale", "scale", Scale, ScaleOptions, in_defaults=["standard"])
    assert "scale" in registry.default_variants() and "scale_differential" not in registry.default_variants()


def _run_cell(s: float) -> tuple[type, type, type]:
    """What a notebook cell defines when run: new class objects of the same module and qualified name."""
    namespace = sys.modules["notebook_cell"].__dict__
    namespace.update(QKMap=QKMap, MapOptions=MapOptions, option=option, dataclasses=dataclasses, Plain=Plain)
    exec(
        f"class Scale(QKMap):\n"
        f"    def __init__(self, d_head, n_heads, s={s}):\n"
        f"        super().__init__(); self.s, self.dt = s, None\n"
        f"    def forward(self, q, k):\n"
        f"        return self.s * q, k\n"
        f"@dataclasses.dataclass\n"
        f"class ScaleOptions(MapOptions):\n"
        f"    s: float = option({s})\n"
        f"class Rule(Plain):\n"
        f"    pass\n",
        namespace,
    )
    return namespace["Scale"], namespace["ScaleOptions"], namespace["Rule"]


def test_running_a_registration_cell_again_replaces_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "notebook_cell", types.ModuleType("notebook_cell"))
    first = _run_cell(2.0)
    register_qk_map("scale", "scale", *first[:2])
    register_scoring("plain", first[2])
    register_variant("scale_big", "scale", s=4.0, in_defaults=False)
    model_before = GPT(GPTConfig(attention="scale_plain", **SMALL))
    defaults = registry.default_variants()

    second = _run_cell(3.0)  # the cell edited and run again
    register_qk_map("scale", "scale", *second[:2])
    register_scoring("plain", second[2])
    register_variant("scale_big", "scale", s=4.0, in_defaults=False)
    assert registry.default_variants() == defaults  # no duplicate entries
    config = GPTConfig(attention="scale_plain", **SMALL)
    assert config.qk_map == second[1]() and config.qk_map.s == 3.0
    model = GPT(config)
    assert type(model.blocks[0].attn.qk_map) is second[0] and type(model.blocks[0].attn.scorer) is second[2]
    assert type(model_before.blocks[0].attn.qk_map) is first[0]  # a model built before keeps its classes
    idx = torch.randint(0, 32, (1, 8))
    assert model(idx).shape == model_before(idx).shape == (1, 8, 32)

    with pytest.raises(ValueError, match=r"variant 'scale_big' is already registered \(as .*'s': 4.0"):
        register_variant("scale_big", "scale", s=5.0)
    with pytest.raises(ValueError, match=r"query-key map 'scale' is already registered .*notebook_cell.Scale"):
        register_qk_map("scale", "scale", Scale, ScaleOptions)  # another class of the same name
    with pytest.raises(ValueError, match="already registered"):
        register_scoring("plain", Plain)


def test_an_option_name_two_maps_type_differently_keeps_each_maps_type_in_variant_specs():
    from coupled_qk.models.specs import variant_overrides

    steps = dataclasses.make_dataclass("Steps", [("n_steps", float, option(1.5))], bases=(MapOptions,))
    step_map = type(
        "StepMap",
        (Scale,),
        {"__init__": lambda self, d_head, n_heads, n_steps=1.5: Scale.__init__(self, d_head, n_heads)},
    )
    register_qk_map("steps", "steps", step_map, steps)  # n_steps: float here, int in the coupled dynamics
    register_variant("coupled_two", "coupled", n_steps=2, in_defaults=False)
    assert variant_overrides("coupled+n_steps=3") == {"attention": "coupled", "integrator": "euler", "n_steps": 3}
    assert variant_overrides("coupled_two+n_steps=2") == {"attention": "coupled", "n_steps": 2}  # was a contradiction
    assert variant_overrides("steps+n_steps=2") == {"attention": "steps", "n_steps": 2.0}
    with pytest.raises(ValueError, match=r"variant 'coupled\+n_steps=2.5' n_steps='2.5' is not an integer"):
        variant_overrides("coupled+n_steps=2.5")


def test_a_literal_option_is_checked_on_every_surface():
    from coupled_qk.models.config import parse_overrides

    mode = dataclasses.make_dataclass(
        "Mode", [("s", float, option(2.0)), ("mode", typing.Literal["a", "b"], "a")], bases=(MapOptions,)
    )
    mode_map = type(
        "ModeMap",
        (Scale,),
        {"__init__": lambda self, d_head, n_heads, s=2.0, mode="a": Scale.__init__(self, d_head, n_heads, s)},
    )
    register_qk_map("mode", "mode", mode_map, mode)
    assert GPTConfig(attention="mode", **parse_overrides(["mode=b"]), **SMALL).qk_map.mode == "b"
    with pytest.raises(ValueError, match=r"--set mode='c' is unknown; expected one of \['a', 'b'\]"):
        parse_overrides(["mode=c"])
    with pytest.raises(ValueError, match=r"GPTConfig.qk_map.mode='c' is unknown"):  # was accepted
        GPTConfig(attention="mode", qk_map={"mode": "c"}, **SMALL)


class Pool(QKMap):
    """Breaks the contract at run time: the keys come back one position shorter."""

    def __init__(self, d_head: int, n_heads: int):
        super().__init__()
        self.dt = None

    def forward(self, q, k):
        return q, k[..., 1:, :]


@dataclasses.dataclass
class PoolOptions(MapOptions):
    pass


def test_a_map_returning_other_shapes_is_named_at_its_call():
    register_qk_map("pool", "pool", Pool, PoolOptions)
    model = GPT(GPTConfig(attention="pool", **SMALL))
    with pytest.raises(
        ValueError,
        match=r"query-key map Pool must return q and k of its inputs' shapes "
        r"\(1, 2, 8, 8\) and \(1, 2, 8, 8\); it returned \(1, 2, 8, 8\) and \(1, 2, 7, 8\)",
    ):
        model(torch.randint(0, 32, (1, 8)))


def test_layer_kwargs_without_the_maps_options_names_them():
    """Every attention with a query-key map refuses ``layer_kwargs(None)`` naming the attention, its map and the
    options class (it failed inside ``dataclasses.asdict`` with a ``TypeError`` naming none of them); one without a
    map takes ``None``."""
    registry.load_plugins()
    for name, spec in registry.ATTENTIONS.items():
        if spec.qk_map is None:
            assert spec.layer_kwargs(None)["qk_map"] is None
            continue
        expected = (
            f"layer_kwargs: attention={name!r} has the query-key map {spec.qk_map.name!r}, so options must be its "
            f"{spec.qk_map.options.__name__}; got None"
        )
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            spec.layer_kwargs(None)
        assert callable(spec.layer_kwargs(spec.options())["qk_map"])
