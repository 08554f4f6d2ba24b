"""Typed parsing and argument checks (``coupled_qk.checks.values``), with hand-derived expectations."""

import math
from dataclasses import dataclass

import pytest

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
