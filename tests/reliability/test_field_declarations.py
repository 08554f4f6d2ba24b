"""Every field of GPTConfig, of each registered map's options, of TrainConfig and of each registered task's options
(``options_class``: LMOptions, MQAROptions, GlueOptions) declares its valid values once in its dataclass field
metadata (``coupled_qk.option``); valid and invalid values are drawn FROM those declarations.

A field added without a declaration fails ``test_every_field_is_declared``; a declaration that construction does
not enforce fails ``test_values_outside_the_declaration_are_refused_naming_the_field``.
"""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest
import reliability_profile  # noqa: F401  (the example budget)
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from coupled_qk.checks.assignment import CheckedAssignment
from coupled_qk.checks.values import _unwrap_optional, declaration_problems, field_types
from coupled_qk.models.config import GPTConfig
from coupled_qk.models.options import MapOptions, option
from coupled_qk.models.registry import QK_MAPS, load_plugins
from coupled_qk.training.config import TrainConfig
from coupled_qk.training.tasks import TASKS, task_class
from coupled_qk.training.tasks.lm import LMOptions

NO_SHRINK = settings(phases=[Phase.explicit, Phase.reuse, Phase.generate])
"""Each example draws a value for every field (the draws are labelled in a failure's report): shrinking such
examples takes minutes, so these tests report the first failing example as drawn."""

TRAIN_BASE = {"max_steps": 10}
"""The smallest valid TrainConfig: a schedule horizon is required."""


def map_options_classes() -> list[type]:
    load_plugins()
    return [entry.options for entry in QK_MAPS.values()]


TASK_BASE = {
    "mqar": {"train_slices": [[16, 2, 10]], "test_slices": [[16, 2, 10]]},
    "glue": {"glue_task": "sst2", "pretrained": "runs/pretrained"},
}
"""The required options of each task (a task without an entry needs none)."""


def task_options_classes() -> list[tuple[str, type]]:
    """``(task name, options class)`` of every registered task (introspected from ``TASKS``)."""
    return [(name, task_class(name).options_class) for name in TASKS]


def declared_classes() -> list[tuple[type, str, dict]]:
    """``(class, owner prefix in messages, base keyword arguments)`` of every declared dataclass."""
    out = [(GPTConfig, "GPTConfig", {}), (TrainConfig, "TrainConfig", TRAIN_BASE)]
    out += [(cls, "GPTConfig.qk_map", {}) for cls in map_options_classes()]
    return out + [(cls, "task_options", TASK_BASE.get(task, {})) for task, cls in task_options_classes()]


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
    """Values the declaration of ``field`` allows (``None`` too for an optional field); an ``AssertionError``
    naming the field when it declares neither a range nor choices (an empty strategy would fail a Hypothesis
    health check that names no field)."""
    inner, optional = _unwrap_optional(field_types(cls)[field.name])
    meta = field.metadata
    if inner is bool:
        base = st.booleans()
    elif typing.get_origin(inner) is typing.Literal and "choices" not in meta:  # declared by its type
        base = st.sampled_from(typing.get_args(inner))
    elif "choices" in meta:
        base = st.sampled_from(_choices(meta))
    elif "range" in meta:
        lo, hi, lo_open, hi_open = _bounds(meta, inner)
        if inner is int:
            lo_i = -(10**6) if lo is None else lo
            base = st.integers(lo_i, lo_i + 10**6 if hi is None else hi)
        else:
            base = st.floats(
                lo,
                hi,
                exclude_min=lo_open and lo is not None,
                exclude_max=hi_open and hi is not None,
                allow_nan=False,
                allow_infinity=False,
            )
    else:
        raise AssertionError(
            f"{cls.__name__}.{field.name} declares no range or choices to draw valid values from "
            f"({'free: ' + meta['free'] if 'free' in meta else 'undeclared: declare it with coupled_qk.option(...)'})"
        )
    return st.one_of(base, st.none()) if optional else base


def invalid_values(cls, field: dataclasses.Field) -> st.SearchStrategy:
    """Values the declaration of ``field`` refuses: out of range, non-finite, of another type, not a choice."""
    inner, optional = _unwrap_optional(field_types(cls)[field.name])
    meta = field.metadata
    wrong_type = st.sampled_from(["fast", "1e400", "nan", "inf", "", "1.5x"])
    if "choices" in meta:
        allowed = _choices(meta)
        text = st.text(max_size=12).filter(
            lambda t: (
                t not in allowed
                and (not optional or t.strip().lower() not in ("none", "null"))
                and t.lower().replace("-", "") not in allowed
            )
        )  # GLUE task names are read case- and dash-blind
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
    return [
        f
        for f in dataclasses.fields(cls)
        if _unwrap_optional(types[f.name])[0] is not bool and ("range" in f.metadata or "choices" in f.metadata)
    ]


@pytest.mark.parametrize("cls", [c for c, _, _ in declared_classes()], ids=lambda c: c.__name__)
def test_every_field_is_declared(cls):
    assert declaration_problems(cls) == []


def test_an_undeclared_field_is_named_where_values_are_drawn():
    @dataclasses.dataclass
    class Opts(MapOptions):
        gain: float = 1.0

    with pytest.raises(AssertionError, match=r"Opts.gain declares no range or choices .*coupled_qk.option"):
        valid_values(Opts, dataclasses.fields(Opts)[0])


def test_an_undeclared_field_is_found():
    @dataclasses.dataclass
    class Opts(MapOptions):
        width: int = 3
        gain: float = option(1.0, free="no")
        name: str = option("a", lo=0)
        ok: bool = True
        size: int = option(2, lo=1)

    problems = declaration_problems(Opts)
    assert [p.split(":")[0] for p in problems] == ["Opts.width", "Opts.gain", "Opts.name"]


def test_every_registered_map_is_covered():
    names = {cls.__name__ for cls in map_options_classes()}
    assert {"DynamicsOptions", "QueryMLPOptions", "InvertibleOptions"} <= names


@NO_SHRINK
@given(st.data())
def test_map_options_accept_every_declared_value(data):
    for cls in map_options_classes():
        for field in [f for f in dataclasses.fields(cls) if "free" not in f.metadata]:  # free: checked by its code
            value = data.draw(valid_values(cls, field), label=f"{cls.__name__}.{field.name}")
            kwargs = {field.name: value}
            if field.name == "shared_across_heads" and value is False and "keys_per_query_head" in cls.field_names():
                kwargs["keys_per_query_head"] = True  # the one cross-field rule (DynamicsOptions.validate)
            opts = cls(**kwargs)
            assert getattr(opts, field.name) == value
            assigned = cls(**{k: v for k, v in kwargs.items() if k != field.name})
            setattr(assigned, field.name, value)  # the checked assignment accepts what the constructor does
            assert assigned == opts


@NO_SHRINK
@given(st.data())
def test_train_config_accepts_every_declared_value(data):
    partners = {
        "early_stop_value": {"early_stop_metric": "valid/loss"},
        "patience": {"best_metric": "valid/loss"},
        "best_mode": {"best_metric": "valid/loss"},
        "min_delta": {"patience": 1, "best_metric": "valid/loss"},
    }
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
            assert info.type is ValueError
            if isinstance(cls, type) and issubclass(
                cls, CheckedAssignment
            ):  # assignment is re-checked (map options too)
                cfg = cls(**base)
                before = getattr(cfg, field.name)
                with pytest.raises(ValueError, match=f"{name.replace('.', '[.]')}"):
                    setattr(cfg, field.name, value)
                assert getattr(cfg, field.name) == before


def test_every_task_declares_its_options():
    """Each registered task names a dataclass of its ``task_options`` (``options_class``), so the tests below cover
    a task added later; its ``from_options`` refuses an unknown key."""
    for task, cls in task_options_classes():
        assert dataclasses.is_dataclass(cls), task
        with pytest.raises(ValueError, match="unknown .*task_options.*bogus"):
            cls.from_options({**TASK_BASE.get(task, {}), "bogus": 1})
    assert LMOptions in [cls for _, cls in task_options_classes()]


@NO_SHRINK
@given(st.data())
def test_task_options_accept_every_declared_value(data):
    for task, cls in task_options_classes():
        for field in checked_fields(cls) + [f for f in dataclasses.fields(cls) if f.type in ("bool", bool)]:
            value = data.draw(valid_values(cls, field), label=f"{cls.__name__}.{field.name}")
            if value is None and field.name in TASK_BASE.get(task, {}):
                continue  # a required option
            base = {**TASK_BASE.get(task, {}), **({"max_train_examples": 10} if field.name == "subsample_seed" else {})}
            opts = cls.from_options({**base, field.name: value})  # a subset's seed is read with a subset only
            assert getattr(opts, field.name) == value


GENERIC_BAD = [
    math.nan,
    math.inf,
    -math.inf,
    0,
    -1,
    10**30,
    -(10**30),
    2.5,
    True,
    "False",
    "0",
    "None",
    "",
    " ",
    "fast",
    "\u0661",
    [],
    {},
    [1],
    object(),
]
"""Values of every kind a user may put in a JSON file or a Python call (some are valid for some fields)."""


@NO_SHRINK
@given(st.data())
def test_task_options_any_value_is_accepted_as_declared_or_refused_naming_the_field(data):
    """Any value of any kind for any task option: construction either keeps a value its declaration allows or
    raises one ``ValueError`` naming ``task_options.<field>``; never another exception type, never NaN or inf."""
    from coupled_qk.checks.values import check_value

    for task, cls in task_options_classes():
        types = field_types(cls)
        for field in dataclasses.fields(cls):
            value = data.draw(
                st.one_of(st.sampled_from(GENERIC_BAD), st.integers(), st.floats(), st.text(max_size=8)),
                label=f"{cls.__name__}.{field.name}",
            )
            try:
                opts = cls.from_options({**TASK_BASE.get(task, {}), field.name: value})
            except ValueError as exc:
                message = str(exc)
                assert f"task_options.{field.name}" in message or "task_options" in message and field.name in message, (
                    field.name,
                    value,
                    message,
                )
                assert "\n" not in message
                continue
            got = getattr(opts, field.name)
            assert not (isinstance(got, float) and not math.isfinite(got)), (field.name, value)
            check_value(f"task_options.{field.name}", got, types[field.name], field.metadata)


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("n_steps", -1, r"GPTConfig.qk_map.n_steps=-1 must be an integer >= 0"),
        ("hidden", 0, r"GPTConfig.qk_map.hidden=0 must be a positive integer"),
        ("dt_init", math.nan, r"GPTConfig.qk_map.dt_init=nan must be a finite number"),
        ("integrator", "rk4", r"GPTConfig.qk_map.integrator='rk4' is unknown; expected one of"),
    ],
)
def test_declared_messages_read_as_before(field, value, message):
    from coupled_qk.models.maps.dynamics import DynamicsOptions

    with pytest.raises(ValueError, match=message):
        DynamicsOptions(**{field: value})
    with pytest.raises(ValueError, match=r"GPTConfig.dropout=1.0 must be in \[0, 1\)"):
        GPTConfig(dropout=1.0)


@NO_SHRINK
@given(data=st.data())
def test_task_options_from_the_command_line_are_one_line_errors(tmp_path_factory, capsys, data):
    """``train --task T --opt task_options='{...}'`` with a value outside a task option's declaration: exit 2 and
    one line on stderr naming ``task_options.<field>``, no traceback, before the run folder is created."""
    import json

    from coupled_qk.cli import main

    out = tmp_path_factory.mktemp("cli") / "run"
    for task, cls in task_options_classes():
        for field in checked_fields(cls):
            value = data.draw(invalid_values(cls, field), label=f"{cls.__name__}.{field.name}")
            options = json.dumps({**TASK_BASE.get(task, {}), field.name: value})
            code = main(
                [
                    "train",
                    "--task",
                    task,
                    "--max-steps",
                    "1",
                    "--device",
                    "cpu",
                    "--out-dir",
                    str(out),
                    "--opt",
                    f"task_options={options}",
                ]
            )
            err = capsys.readouterr().err
            assert code == 2, (task, field.name, value, err)
            assert err.count("\n") == 1 and f"task_options.{field.name}" in err and "Traceback" not in err, err
            assert not out.exists()


@pytest.mark.parametrize("spelling", [None, "null", "None", "none"])
@pytest.mark.parametrize("field", ["glue_task", "pretrained"])
def test_a_required_task_option_spelt_as_none_is_named_as_missing(field, spelling):
    """A required option given as a spelling of None is missing (it was an AttributeError: the required check ran
    before "null" was read as None)."""
    from coupled_qk.training.tasks.glue import GlueOptions

    with pytest.raises(ValueError, match=rf"needs task_options\.{field}"):
        GlueOptions.from_options({"glue_task": "sst2", "pretrained": "runs/x", field: spelling})


@pytest.mark.parametrize("factory", [[], {}, "list", 0])
def test_option_refuses_a_default_factory_that_cannot_be_called(factory):
    """``option(default_factory=...)`` with a value instead of a callable (``[]`` for ``list``) is refused where it is
    declared, naming the argument; it used to give a field whose every instance failed with "object is not
    callable", naming no field. A callable factory still makes a fresh default per instance."""
    with pytest.raises(TypeError, match=r"default_factory=.* must be callable"):
        option(default_factory=factory, free="anything")

    @dataclasses.dataclass
    class Holder:
        items: list = option(default_factory=list, free="anything")

    a, b = Holder(), Holder()
    assert a.items == [] and a.items is not b.items
