"""Typed parsing and argument checks (``coupled_qk.checks.values``), with hand-derived expectations."""

import dataclasses
import math
from dataclasses import dataclass

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from coupled_qk.checks.values import choice, coerce, coerce_fields, finite, nonneg_int, parse_assignments, positive_int


@pytest.mark.parametrize(
    "value, annotation, expected",
    [
        ("False", bool, False),
        ("true", bool, True),
        ("0", bool, False),
        (True, bool, True),
        ("3", int, 3),
        (3.0, int, 3),
        ("1e3", int, 1000),
        ("2_000", int, 2000),
        ("1e-3", float, 1e-3),
        (2, float, 2.0),
        ("inf", float, math.inf),
        ("none", int | None, None),
        (None, float | None, None),
        ("7", int | None, 7),
        ('{"a": 1}', dict, {"a": 1}),
        ("x", str, "x"),
    ],
)
def test_coerce_converts_exactly(value, annotation, expected):
    out = coerce("f", value, annotation)
    assert out == expected and type(out) is type(expected)


@pytest.mark.parametrize(
    "value, annotation",
    [
        ("fast", float),
        ("maybe", bool),
        (2.5, int),
        (True, int),
        (False, float),
        (None, int),
        ("{", dict),
        (3, str),
        ("1.5", int),
        ([1], dict),
    ],
)
def test_coerce_rejects_with_field_name(value, annotation):
    with pytest.raises(ValueError, match=r"^f="):
        coerce("f", value, annotation)


def test_coerce_fields_on_dataclass():
    @dataclass
    class C:
        a: int = 1
        b: bool = True
        c: float | None = None

    obj = C(a="4", b="False", c="0.5")
    coerce_fields(obj)
    assert (obj.a, obj.b, obj.c) == (4, False, 0.5)
    with pytest.raises(ValueError, match=r"C\.a='x' is not an integer"):
        coerce_fields(C(a="x"))


def test_range_checks():
    assert positive_int("n", 3) == 3
    assert nonneg_int("n", 0) == 0
    for bad in (0, -1, True, 1.0, "2"):
        with pytest.raises(ValueError, match="n="):
            positive_int("n", bad)
    assert finite("lr", 0.1, 0, lo_open=True) == 0.1
    for bad in (math.inf, math.nan, 0.0, -1.0, "0.1", True):
        with pytest.raises(ValueError, match="lr="):
            finite("lr", bad, 0, lo_open=True)
    with pytest.raises(ValueError, match=r"must be in \[0, 1\)"):
        finite("p", 1.0, 0, 1, hi_open=True)
    assert choice("x", "a", ("a", "b")) == "a"
    with pytest.raises(ValueError, match=r"x='c' is unknown; expected one of \['a', 'b'\]"):
        choice("x", "c", ("a", "b"))


def test_parse_assignments():
    assert parse_assignments(["a=1", " b-c = x=y "]) == {"a": "1", "b_c": "x=y"}
    for bad in ("a", "=1"):
        with pytest.raises(ValueError, match="--set"):
            parse_assignments([bad])


GPT_FIELDS = ("n_layer", "n_heads", "d_model", "block_size", "vocab_size", "dropout", "rope_base", "attention")


@settings(max_examples=60, deadline=None)
@given(field=st.sampled_from(GPT_FIELDS), cut=st.integers(0, 20))
def test_every_path_that_refuses_an_unknown_field_gives_the_same_hint(field, cut):
    """A field name with one character dropped: ``GPTConfig.from_dict`` (config files, presets) and ``--set`` refuse
    it with one message form, naming the typo and the closest field (``unknown_names_error``), as ``unknown_keys``
    does for run files."""
    from coupled_qk.checks.values import named_with_hints
    from coupled_qk.models.config import GPTConfig, parse_overrides

    i = cut % len(field)
    typo = field[:i] + field[i + 1 :]
    names = {f.name for f in dataclasses.fields(GPTConfig)} | set(GPTConfig.extra_names())
    assume(typo not in names)
    hinted = named_with_hints([typo], names)
    assert hinted.startswith(f"{typo!r} (did you mean ")  # one dropped character stays within difflib's cutoff
    with pytest.raises(ValueError) as from_dict:
        GPTConfig.from_dict({typo: 1})
    with pytest.raises(ValueError) as from_set:
        parse_overrides([f"{typo}=1"])
    assert f"unknown GPTConfig field(s) {hinted}; valid fields: " in str(from_dict.value)
    assert f"--set {typo}=1: unknown GPTConfig field {hinted}; valid fields: " in str(from_set.value)
