"""Every field of GPTConfig, of each registered map's options and of TrainConfig declares its valid values once in
its dataclass field metadata (``_checks.declare``); valid and invalid values are drawn FROM those declarations.

A field added without a declaration fails ``test_every_field_is_declared``; a declaration that construction does
not enforce fails ``test_values_outside_the_declaration_are_refused_naming_the_field``.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import reliability_profile  # noqa: F401  (the example budget)
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from coupled_qk._checks import _unwrap_optional, declaration_problems, declare, field_types
from coupled_qk.models.config import GPTConfig
from coupled_qk.models.options import MapOptions
from coupled_qk.models.registry import QK_MAPS, load_plugins
from coupled_qk.training.config import TrainConfig
from coupled_qk.training.lm import LMOptions

NO_SHRINK = settings(phases=[Phase.explicit, Phase.reuse, Phase.generate])
"""Each example draws a value for every field (the draws are labelled in a failure's report): shrinking such
examples takes minutes, so these tests report the first failing example as drawn."""

TRAIN_BASE = {"max_steps": 10}
"""The smallest valid TrainConfig: a schedule horizon is required."""


def map_options_classes() -> list[type]:
    load_plugins()
    return [entry.options for entry in QK_MAPS.values()]


def declared_classes() -> list[tuple[type, str, dict]]:
    """``(class, owner prefix in messages, base keyword arguments)`` of every declared dataclass."""
    out = [(GPTConfig, "GPTConfig", {}), (TrainConfig, "TrainConfig", TRAIN_BASE)]
    out += [(cls, "GPTConfig.qk_map", {}) for cls in map_options_classes()]
    return out + [(LMOptions, "task_options", {})]


def _bounds(meta: dict, inner) -> tuple:
    lo, hi = meta["range"]
    lo_open, hi_open = meta.get("lo_open", False), meta.get("hi_open", False)
    if inner is int:  # integer bounds are closed
        lo = None if lo is None else (math.floor(lo) + 1 if lo_open else math.ceil(lo))
        hi = None if hi is None else (math.ceil(hi) - 1 if hi_open else math.floor(hi))
        lo_open = hi_open = False
    return lo, hi, lo_open, hi_open


def _choices(meta: dict) -> tuple:
    allowed = meta["choices"]
    return tuple(allowed() if callable(allowed) else allowed)


def valid_values(cls, field: dataclasses.Field) -> st.SearchStrategy:
    """Values the declaration of ``field`` allows (``None`` too for an optional field)."""
    inner, optional = _unwrap_optional(field_types(cls)[field.name])
    meta = field.metadata
    if inner is bool:
        base = st.booleans()
    elif "choices" in meta:
        base = st.sampled_from(_choices(meta))
    elif "range" in meta:
        lo, hi, lo_open, hi_open = _bounds(meta, inner)
        if inner is int:
            lo_i = -(10**6) if lo is None else lo
            base = st.integers(lo_i, lo_i + 10**6 if hi is None else hi)
        else:
            base = st.floats(lo, hi, exclude_min=lo_open and lo is not None, exclude_max=hi_open and hi is not None,
                             allow_nan=False, allow_infinity=False)
    else:
        return st.nothing()
    return st.one_of(base, st.none()) if optional else base


def invalid_values(cls, field: dataclasses.Field) -> st.SearchStrategy:
    """Values the declaration of ``field`` refuses: out of range, non-finite, of another type, not a choice."""
    inner, optional = _unwrap_optional(field_types(cls)[field.name])
    meta = field.metadata
    wrong_type = st.sampled_from(["fast", "1e400", "nan", "inf", "", "1.5x"])
    if "choices" in meta:
        allowed = _choices(meta)
        text = st.text(max_size=12).filter(lambda t: t not in allowed and (
            not optional or t.strip().lower() not in ("none", "null")))
        return st.one_of(text, st.just(3), st.just(2.5))
    lo, hi, lo_open, hi_open = _bounds(meta, inner)
    if inner is int:
        outs = [wrong_type, st.just(True), st.just(2.5), st.just(math.nan), st.just(math.inf)]
        if lo is not None:
            outs.append(st.integers(max_value=lo - 1))
        if hi is not None:
            outs.append(st.integers(min_value=hi + 1))
        return st.one_of(*outs)
    outs = [st.sampled_from(["fast", "", "1.5x"]), st.sampled_from([math.nan, math.inf, -math.inf, True])]
    if lo is not None:
        outs.append(st.floats(max_value=lo, exclude_max=not lo_open, allow_nan=False, allow_infinity=False))
    if hi is not None:
        outs.append(st.floats(min_value=hi, exclude_min=not hi_open, allow_nan=False, allow_infinity=False))
    return st.one_of(*outs)


def checked_fields(cls) -> list[dataclasses.Field]:
    """Fields whose declaration is a range or choices (bools are declared by type; ``free`` fields by their
    own checks)."""
    types = field_types(cls)
    return [f for f in dataclasses.fields(cls) if _unwrap_optional(types[f.name])[0] is not bool
            and ("range" in f.metadata or "choices" in f.metadata)]


@pytest.mark.parametrize("cls", [c for c, _, _ in declared_classes()], ids=lambda c: c.__name__)
def test_every_field_is_declared(cls):
    assert declaration_problems(cls) == []


def test_an_undeclared_field_is_found():
    @dataclasses.dataclass
    class Opts(MapOptions):
        width: int = 3
        gain: float = declare(1.0, free="no")
        name: str = declare("a", lo=0)
        ok: bool = True
        size: int = declare(2, lo=1)

    problems = declaration_problems(Opts)
    assert [p.split(":")[0] for p in problems] == ["Opts.width", "Opts.gain", "Opts.name"]


def test_every_registered_map_is_covered():
    names = {cls.__name__ for cls in map_options_classes()}
    assert {"DynamicsOptions", "QueryMLPOptions", "InvertibleOptions"} <= names


@NO_SHRINK
@given(st.data())
def test_map_options_accept_every_declared_value(data):
    for cls in map_options_classes():
        for field in dataclasses.fields(cls):
            value = data.draw(valid_values(cls, field), label=f"{cls.__name__}.{field.name}")
            kwargs = {field.name: value}
            if field.name == "shared_across_heads" and value is False and "keys_per_query_head" in cls.field_names():
                kwargs["keys_per_query_head"] = True  # the one cross-field rule (DynamicsOptions.validate)
            opts = cls(**kwargs)
            assert getattr(opts, field.name) == value


@NO_SHRINK
@given(st.data())
def test_train_config_accepts_every_declared_value(data):
    partners = {"early_stop_value": {"early_stop_metric": "valid/loss"}, "patience": {"best_metric": "valid/loss"}}
    for field in checked_fields(TrainConfig):
        value = data.draw(valid_values(TrainConfig, field), label=field.name)
        if field.name in ("max_steps", "max_tokens") and value is None:
            continue  # one of them is required (cross-field rule)
        kwargs = {**TRAIN_BASE, field.name: value, **(partners.get(field.name, {}) if value is not None else {})}
        assert getattr(TrainConfig(**kwargs), field.name) == value


@pytest.mark.slow
@NO_SHRINK
@given(st.data())
def test_values_outside_the_declaration_are_refused_naming_the_field(data):
    for cls, owner, base in declared_classes():
        for field in checked_fields(cls):
            value = data.draw(invalid_values(cls, field), label=f"{cls.__name__}.{field.name}")
            name = f"{owner}.{field.name}"
            with pytest.raises(ValueError, match=f"{name.replace('.', '[.]')}") as info:
                cls(**{**base, field.name: value})
            assert "\n" not in str(info.value)
            if isinstance(cls, type) and issubclass(cls, (GPTConfig, TrainConfig)):  # assignment is re-checked
                cfg = cls(**base)
                before = getattr(cfg, field.name)
                with pytest.raises(ValueError, match=f"{name.replace('.', '[.]')}"):
                    setattr(cfg, field.name, value)
                assert getattr(cfg, field.name) == before


@NO_SHRINK
@given(st.data())
def test_lm_task_options_accept_every_declared_value(data):
    for field in dataclasses.fields(LMOptions):
        value = data.draw(valid_values(LMOptions, field), label=field.name)
        assert getattr(LMOptions.from_options({field.name: value}), field.name) == value


@pytest.mark.parametrize("field,value,message", [
    ("n_steps", -1, r"GPTConfig.qk_map.n_steps=-1 must be an integer >= 0"),
    ("hidden", 0, r"GPTConfig.qk_map.hidden=0 must be a positive integer"),
    ("dt_init", math.nan, r"GPTConfig.qk_map.dt_init=nan must be a finite number"),
    ("integrator", "rk4", r"GPTConfig.qk_map.integrator='rk4' is unknown; expected one of"),
])
def test_declared_messages_read_as_before(field, value, message):
    from coupled_qk.models.options import DynamicsOptions

    with pytest.raises(ValueError, match=message):
        DynamicsOptions(**{field: value})
    with pytest.raises(ValueError, match=r"GPTConfig.dropout=1.0 must be in \[0, 1\)"):
        GPTConfig(dropout=1.0)
