"""Arguments and variables, declared (docs/RELIABILITY.md): a flag of the public API takes a bool, a keyword passed on
to torch is one it declares, every ``COUPLED_QK_*`` environment variable is declared with its check, and a field
assigned after construction carries the fields derived from it. Before, ``GPT.generate(idx, 3, compile="False")``
compiled, ``COUPLED_QK_LOG_INTERVAL=abc`` was a traceback deep in a progress bar, and ``config.d_model = 64`` left
``d_head`` at the old width.

Generated from the public API (every callable with a ``bool`` parameter), the declarations (every variable) and
the config's fields, so a new flag, variable or derived field is covered.
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
import typing
from pathlib import Path

import pytest
import reliability_profile  # noqa: F401  (the example budget)
import torch
from hypothesis import given
from hypothesis import strategies as st

import coupled_qk
from coupled_qk.checks.assignment import CheckedAssignment
from coupled_qk.checks.environment import ENVIRONMENT, env_value, undeclared_env
from coupled_qk.checks.values import FlagError, _unwrap_optional
from coupled_qk.hf import modeling
from coupled_qk.hf.retrofit import retrofit
from coupled_qk.models.maps.invertible import InvertibleQKCoupling

HOT = {  # called on every forward or decoding step: not wrapped (their flags come from the model's own code)
    "CausalSelfAttention.forward": "record: set by GPT.trace, per layer and step",
    "ScoringRule.forward": "eager: set by the layer from its config",
    "DifferentialScoring.forward": "eager: set by the layer from its config",
    "scaled_dot_product": "eager: set by the layer from its config",
    "integrate_qk": "check: set by the query-key map (check_every_call)",
    "GPT.embed": "check_ids: set by GPT's own forward paths",
}


def _bool_params(fn) -> list[str]:
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = {}
    names = []
    for p in inspect.signature(fn).parameters.values():
        annotation = hints.get(p.name, p.annotation)
        annotation = {"bool": bool, "bool | None": bool | None}.get(annotation, annotation)
        if _unwrap_optional(annotation)[0] is bool:
            names.append(p.name)
    return names


def public_callables():
    """``(qualified name, function)`` of the public API: the package root's classes and functions, the Hugging Face
    models and ``retrofit``, with their public methods and constructors (inherited ones included)."""
    objects = [getattr(coupled_qk, n) for n in coupled_qk.__all__]
    objects += [modeling.CoupledQKForCausalLM, modeling.CoupledQKModel, retrofit, InvertibleQKCoupling]
    seen = set()
    for obj in objects:
        if inspect.isfunction(obj):
            yield obj.__name__, obj
        elif inspect.isclass(obj):
            for klass in obj.__mro__:
                if not klass.__module__.startswith("coupled_qk"):
                    continue
                for name, member in vars(klass).items():
                    fn = member.__func__ if isinstance(member, classmethod) else member
                    if (name.startswith("_") and name not in ("__init__", "_set_gradient_checkpointing")) or not (
                        inspect.isfunction(fn)
                    ):
                        continue
                    if name == "__init__" and issubclass(klass, CheckedAssignment):
                        continue  # a config's fields are converted by checks.values.coerce ("False" is False): declared
                    key = f"{obj.__name__}.{name}" if klass is obj else f"{klass.__name__}.{name}"
                    if key not in seen:
                        seen.add(key)
                        yield key, fn


FLAGGED = sorted(
    (name, flag) for name, fn in public_callables() for flag in _bool_params(inspect.unwrap(fn)) if name not in HOT
)


def test_every_flag_of_the_public_api_is_declared():
    """Each ``bool`` parameter of the public API is checked by :func:`coupled_qk.checks.values.declared_flags`."""
    missing = [
        f"{name}({flag})"
        for name, fn in public_callables()
        if name not in HOT
        for flag in _bool_params(inspect.unwrap(fn))
        if flag not in getattr(fn, "declared_flags", ())
    ]
    assert not missing and len(FLAGGED) >= 15, missing


@pytest.mark.parametrize("name,flag", FLAGGED)
@given(value=st.sampled_from(["False", "True", "", 0, 1, 0.0, "no", []]))
def test_a_flag_given_anything_but_a_bool_is_refused_before_the_call_runs(name, flag, value):
    fn = dict(public_callables())[name]
    optional = _unwrap_optional(typing.get_type_hints(inspect.unwrap(fn)).get(flag, bool))[1]
    with pytest.raises(FlagError, match=re.escape(f"{flag}={value!r} must be True or False")):
        fn(object(), **{flag: value})  # checked first: the other arguments are never looked at
    if optional:
        with pytest.raises(Exception) as exc:  # None passes the check, then the call fails on the dummy arguments
            fn(object(), **{flag: None})
        assert not isinstance(exc.value, FlagError)


def test_generate_with_compile_false_as_text_does_not_compile():
    model = coupled_qk.GPT(coupled_qk.GPTConfig(vocab_size=32, block_size=16, n_layer=1, d_model=16, n_heads=2))
    idx = torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(FlagError, match="compile='False'"):
        model.generate(idx, 3, compile="False")
    assert model._decode_step is None  # nothing was compiled
    assert model.generate(idx, 3, temperature=0, compile=False).shape == (1, 5)


def test_gradient_checkpointing_keywords_are_torchs_declared_ones():
    from coupled_qk.hf.configuration import CoupledQKConfig

    model = modeling.CoupledQKForCausalLM(
        CoupledQKConfig(vocab_size=32, block_size=16, n_layer=2, d_model=16, n_heads=2)
    )
    for bad, message in (
        ({"use_reentrant": "False"}, "use_reentrant='False' must be True or False"),
        ({"use_reentrnt": False}, "'use_reentrnt' is not an argument of torch.utils.checkpoint.checkpoint"),
    ):
        with pytest.raises(ValueError, match=message):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=bad)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False, "debug": False})
    model.train()
    ids = torch.randint(0, 32, (2, 8))
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()  # the declared keywords run


# ------------------------------------------------------------------------------------------- environment variables


def _names_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith("COUPLED_QK_")
        and n.value.rstrip("_").isidentifier() and " " not in n.value
    }  # fmt: skip


def test_every_variable_the_project_names_is_declared():
    """Every ``COUPLED_QK_*`` name in the sources and tests is declared in ``checks.environment.ENVIRONMENT``."""
    root = Path(coupled_qk.__file__).parents[2]
    named = set()
    for folder in ("src", "tests", "benchmarks", "examples"):
        for path in (root / folder).rglob("*.py"):
            named |= _names_in(path)
    named -= {"COUPLED_QK_PROGRES", "COUPLED_QK_"}  # this file's own example of a typo, and the prefix
    assert named <= set(ENVIRONMENT), sorted(named - set(ENVIRONMENT))
    assert not [n for n in ENVIRONMENT if n not in named]  # and no declaration is left over


@pytest.mark.parametrize("name", sorted(n for n, v in ENVIRONMENT.items() if v.parse is not str))
@given(text=st.one_of(st.text(max_size=8), st.sampled_from(["0", "-1", "nan", "inf", "1e999", "abc", "on", "2"])))
def test_a_declared_variable_is_its_value_or_one_line_naming_it(name, text):
    try:
        value = env_value(name, {name: text})
    except ValueError as exc:
        assert str(exc).startswith(f"environment variable {name}=") and "\n" not in str(exc)
        return
    assert value == ENVIRONMENT[name].default if not text.strip() else value is not None


def _progress_mode():
    from coupled_qk.progress import progress_mode

    return progress_mode()


def _line_progress():
    from coupled_qk.progress import LineProgress

    return LineProgress(3, "x", "it")


def _pg_timeout():
    from coupled_qk.training.distributed import pg_timeout

    return pg_timeout()


def _allocator():
    from coupled_qk.allocator import tune_cpu_allocator

    return tune_cpu_allocator()


@pytest.mark.parametrize(
    "name,value,reader",
    [
        ("COUPLED_QK_PROGRESS", "fancy", _progress_mode),
        ("COUPLED_QK_LOG_INTERVAL", "abc", _line_progress),
        ("COUPLED_QK_LOG_INTERVAL", "nan", _line_progress),
        ("COUPLED_QK_PG_TIMEOUT_S", "-5", _pg_timeout),
        ("COUPLED_QK_DEFAULT_MALLOC", "yes", _allocator),
    ],
)
def test_each_reader_refuses_a_bad_value_naming_the_variable(name, value, reader, monkeypatch):
    from coupled_qk import progress

    monkeypatch.setenv(name, value)
    monkeypatch.setitem(progress._MODE, "mode", None)
    with pytest.raises(ValueError, match=f"environment variable {name}={value!r}"):
        reader()


def test_an_undeclared_variable_is_named_with_its_close_match(monkeypatch):
    monkeypatch.setenv("COUPLED_QK_PROGRES", "off")
    assert undeclared_env() == [
        "environment variable COUPLED_QK_PROGRES is not one coupled-qk reads, so it has no effect; did you mean "
        "COUPLED_QK_PROGRESS?"
    ]
    from coupled_qk.cli import main

    with pytest.warns(UserWarning, match="COUPLED_QK_PROGRES is not one coupled-qk reads"):
        assert main(["describe"]) == 0


# ------------------------------------------------------------------------------- fields assigned after construction

SIZES = {
    "d_model": [16, 24, 32, 48, 64],
    "n_heads": [1, 2, 4, 8],
    "n_kv_heads": [None, 1, 2, 4],  # None: not given, derived (assigned, it stayed None or failed in validate)
    "d_head": [None, 4, 8, 12],
    "d_ff": [None, 8, 64],
}


@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.sampled_from(sorted(SIZES)), st.integers(0, 4)),
            st.tuples(st.just("attention"), st.sampled_from(["standard", "coupled", "invertible", "differential"])),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_assignment_gives_the_config_construction_gives(steps):
    """After any assignments, the config equals one built from the fields the user set (derived fields derived
    again, a derived field assigned ``None`` derived as when not given, the attention's own map options); a refused
    assignment changes nothing."""
    from coupled_qk.models.config import DERIVED, GPTConfig

    given_fields = {"vocab_size": 32, "block_size": 16, "n_layer": 1, "d_model": 32, "n_heads": 2}
    config = GPTConfig(**given_fields)
    for field, choice in steps:
        value = choice if field == "attention" else SIZES[field][choice % len(SIZES[field])]
        if field in DERIVED and value == DERIVED[field]({**config.to_dict(), **given_fields}):
            continue  # a derived field set to its derived value reads as derived: not a case of this test
        before = config.to_dict()
        try:
            expected = GPTConfig(**{**given_fields, field: value})
        except ValueError:
            with pytest.raises(ValueError):
                setattr(config, field, value)
            assert config.to_dict() == before
            continue
        setattr(config, field, value)
        given_fields[field] = value
        assert config.to_dict() == expected.to_dict(), (field, value)


@pytest.mark.parametrize("flag", ["use_cache", "output_hidden_states", "output_attentions", "return_dict"])
@given(value=st.sampled_from(["False", "True", 0, 1]))
def test_the_hf_forwards_switches_take_bools(flag, value):
    """``output_attentions="False"`` was read as asking for attention probabilities (refused as unsupported)."""
    with pytest.raises(TypeError, match=re.escape(f"{flag}={value!r} must be True, False or None")):
        _tiny_hf()(input_ids=torch.zeros(1, 3, dtype=torch.long), **{flag: value})


@functools.cache
def _tiny_hf():
    from coupled_qk.hf.configuration import CoupledQKConfig

    config = CoupledQKConfig(vocab_size=32, block_size=16, n_layer=1, d_model=16, n_heads=2)
    return modeling.CoupledQKForCausalLM(config)
