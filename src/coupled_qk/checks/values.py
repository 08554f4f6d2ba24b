"""Argument checks, typed parsing and typo hints shared by every layer of the library (no torch, no project
imports).

Every check raises ``ValueError`` whose message names the argument, the value it got and what was expected,
so a user's mistake reads as one line. ``coerce`` converts a value (a Python value from the API or a JSON
file, or a string from the command line) to a field's declared type, so ``"False"`` is ``False`` and
``"fast"`` for a float is an error, never a silently truthy string.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import json
import math
import numbers
import types
import typing
import warnings
from collections.abc import Callable, Iterable, Sequence

FLOAT32_MAX = 3.4028234663852886e38
"""The largest finite float32: a number stored in a float32 parameter (``dt_init``) must lie within +-this."""

MAX_VOCAB = 2**31 - 1
"""The largest vocabulary: token ids must fit int32, the smallest id dtype the models take (``vocab_size=10**30``
was numpy's "high is out of bounds for int64" from inside the MQAR data)."""

MAX_SEED = 2**32 - 1
"""The largest seed: seeds reach numpy's legacy generator (``np.random.seed``), which takes ``[0, 2**32)``."""

_P = typing.ParamSpec("_P")
_R = typing.TypeVar("_R")

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")
_NONE = ("none", "null")


def loads_json(text: str, where: str):
    """``json.loads(text)`` that refuses an object holding one key twice (``{"lr": 1e-3, "lr": 3e-3}``), which
    ``json`` resolves silently by keeping the last value: one setting given twice (docs/RELIABILITY.md, "One
    setting, one value"). A key repeated with the same value is refused too (one of the two is a leftover edit).

    Args:
        text: the JSON text.
        where: how messages name its source (a file, ``--opt task_options``).

    Raises:
        ValueError: naming ``where`` and the repeated key(s); ``json.JSONDecodeError`` (a ``ValueError``) for text
            that is not JSON, as ``json.loads``.
    """

    def unique(pairs: list) -> dict:
        keys = [key for key, _ in pairs]
        repeated = sorted({key for key in keys if keys.count(key) > 1})
        if repeated:
            raise ValueError(
                f"{where}: the key(s) {repeated} appear twice in one JSON object (JSON would keep only the last "
                "value); give each key once"
            )
        return dict(pairs)

    return json.loads(text, object_pairs_hook=unique)


def positive_int(name: str, value) -> int:
    """``value`` if it is an ``int >= 1`` (``bool`` is not an int here); ``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer")
    return value


def nonneg_int(name: str, value) -> int:
    """``value`` if it is an ``int >= 0``; ``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}={value!r} must be an integer >= 0")
    return value


def seed_int(name: str, value) -> int:
    """``value`` if it is a seed: an ``int`` in ``[0, 2**32 - 1]`` (:data:`MAX_SEED`, numpy's legacy generator's
    range); ``ValueError`` naming ``name`` otherwise."""
    if nonneg_int(name, value) > MAX_SEED:
        raise ValueError(f"{name}={value!r} must be in [0, {MAX_SEED}] (2**32 - 1), the range of a seed")
    return value


def finite(
    name: str, value, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False
) -> float:
    """``float(value)`` if it is a finite real number within ``[lo, hi]`` (open ends with ``lo_open``/``hi_open``).

    Raises:
        ValueError: naming ``name``, for a non-number, ``bool``, NaN, +-inf or a value out of range.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r} must be a finite number")
    below = lo is not None and (value <= lo if lo_open else value < lo)
    above = hi is not None and (value >= hi if hi_open else value > hi)
    if below or above:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        lo_s = "-inf" if lo is None else f"{lo:g}"
        hi_s = "inf" if hi is None else f"{hi:g}"
        raise ValueError(f"{name}={value!r} must be in {left}{lo_s}, {hi_s}{right}")
    return float(value)


def choice(name: str, value, allowed: Iterable) -> object:
    """``value`` if it is one of ``allowed``; ``ValueError`` listing the allowed values otherwise."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is unknown; expected one of {list(allowed)}")
    return value


def _unwrap_optional(annotation) -> tuple[object, bool]:
    """``(inner type, optional?)`` of ``X | None`` / ``Optional[X]``; other annotations pass through."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], len(args) < len(typing.get_args(annotation))
    return annotation, False


def coerce(name: str, value, annotation):
    """Convert ``value`` to the declared type ``annotation`` (``bool``, ``int``, ``float``, ``str``, a ``Literal``
    of strings (one of them), ``dict``, ``list``, or ``X | None`` of those); strings are parsed (``"False"`` ->
    ``False``, ``"3"`` -> ``3``,
    ``"none"`` -> ``None`` for optional fields, JSON for dicts and lists).

    Raises:
        ValueError: naming ``name``, the value and the expected type, when it cannot be converted exactly
            (``"fast"`` as a float, ``2.5`` as an int, ``"maybe"`` as a bool, ``None`` for a required field).
    """
    inner, optional = _unwrap_optional(annotation)
    if value is None or (optional and isinstance(value, str) and value.strip().lower() in _NONE):
        if optional:
            return None
        raise ValueError(f"{name}=None is not allowed; expected {_type_name(inner)}")
    expected = f"expected {_type_name(inner)}{' or none' if optional else ''}"
    if inner is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        raise ValueError(f"{name}={value!r} is not a boolean; {expected} (true/false)")
    if inner is int:
        if isinstance(value, bool):
            raise ValueError(f"{name}={value!r} is not an integer; {expected}")
        if isinstance(value, int):
            return value
        if isinstance(value, numbers.Integral):  # numpy integers
            return int(value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip().replace("_", ""))
            except ValueError:
                pass
            try:
                as_float = float(value)
            except ValueError:
                as_float = math.nan
            if math.isfinite(as_float) and as_float.is_integer():
                return int(as_float)
        raise ValueError(f"{name}={value!r} is not an integer; {expected}")
    if inner is float:
        if isinstance(value, bool):
            raise ValueError(f"{name}={value!r} is not a number; {expected}")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, numbers.Real) and not isinstance(value, str):  # numpy numbers
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ValueError(f"{name}={value!r} is not a number; {expected}")
    if inner is str:
        if isinstance(value, str):
            return value
        raise ValueError(f"{name}={value!r} is not a string; {expected}")
    if _string_choices(inner):
        return choice(name, value, typing.get_args(inner))
    container = typing.get_origin(inner) or inner
    if container in (dict, list):
        if isinstance(value, str):
            try:
                value = loads_json(value, name)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{name}={value!r} is not valid JSON ({exc.msg}); {expected}") from None
        if isinstance(value, container):
            return value
        raise ValueError(f"{name}={value!r} is not a {container.__name__}; {expected}")
    return value


def _string_choices(annotation) -> bool:
    return typing.get_origin(annotation) is typing.Literal and all(
        isinstance(a, str) for a in typing.get_args(annotation)
    )


def coercible(annotation) -> bool:
    """Whether :func:`coerce` converts and checks values of ``annotation`` (``bool``, ``int``, ``float``, ``str``,
    a ``Literal`` of strings, ``dict``, ``list`` or ``X | None`` of those); any other annotation is passed through
    unchecked."""
    inner, _ = _unwrap_optional(annotation)
    return (
        inner in (bool, int, float, str)
        or _string_choices(inner)
        or (typing.get_origin(inner) or inner) in (dict, list)
    )


def _type_name(annotation) -> str:
    return getattr(annotation, "__name__", str(annotation))


def field_types(cls) -> dict[str, object]:
    """``{field name: resolved annotation}`` of a dataclass (string annotations resolved; a new dict each call)."""
    return dict(_field_types(cls))


@functools.cache
def _field_types(cls) -> dict[str, object]:
    """:func:`field_types`, resolved once per class (``typing.get_type_hints`` costs milliseconds, and every
    validation of a config calls it)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def coerce_fields(obj, owner: str | None = None) -> None:
    """Convert every field of the dataclass instance ``obj`` to its declared type in place (see :func:`coerce`).

    Error messages name the field as ``Owner.field`` (``owner`` defaults to the class name).
    """
    owner = owner or type(obj).__name__
    for name, annotation in field_types(type(obj)).items():
        object.__setattr__(obj, name, coerce(f"{owner}.{name}", getattr(obj, name), annotation))


def parse_assignments(items: Sequence[str], flag: str = "--set") -> dict[str, str]:
    """``["a=1", "b-c=x"] -> {"a": "1", "b_c": "x"}`` (values stay strings for :func:`coerce`).

    One name given twice (``--set n_steps=2 --set n-steps=3``, ``coupled+n_steps=2+n_steps=3``) must be given the
    same text both times: the later one used to win silently (docs/RELIABILITY.md, "One setting, one value").

    Raises:
        ValueError: an item without ``=`` or with an empty name, or a name given twice with different values,
            naming ``flag``.
    """
    out: dict[str, str] = {}
    first: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ValueError(f"{flag} {item!r}: expected FIELD=VALUE")
        if key in out and out[key] != value.strip():
            raise ValueError(f"{flag} {first[key]!r} and {flag} {item!r} give {key} two different values; give it once")
        out[key] = value.strip()
        first.setdefault(key, item)
    return out


# ------------------------------------------------------------------------------------------------------
# Field declarations: each field's type and valid range, declared once in dataclass field metadata
# (docs/RELIABILITY.md, "Configuration").
# ------------------------------------------------------------------------------------------------------

DECLARATION_KEYS = ("range", "choices", "free")
"""Metadata keys that declare a field's valid values: ``range`` (``(lo, hi)``, ``None`` for an open side; with
``lo_open``/``hi_open``) for numbers, ``choices`` (a tuple, or a callable returning one, e.g. a registry's
names) for a fixed set, ``free`` (a sentence saying who checks the value) for text, dicts and nested configs.
A ``bool`` field is declared by its type alone."""


def declaration_problems(cls) -> list[str]:
    """``["Owner.field: why", ...]`` for each field of the dataclass ``cls`` whose valid values are not declared
    in its metadata (see :data:`DECLARATION_KEYS`): a number without ``range`` or ``choices``, a text without
    ``choices`` or ``free``, any other field without one of the keys (a ``bool`` or a ``Literal`` is declared by
    its type). Empty when all are declared."""
    problems = []
    for f in dataclasses.fields(cls):
        inner, _ = _unwrap_optional(field_types(cls)[f.name])
        keys = [k for k in DECLARATION_KEYS if k in f.metadata]
        if (inner is bool or typing.get_origin(inner) is typing.Literal) and not keys:
            continue
        if len(keys) != 1:
            problems.append(
                f"{cls.__name__}.{f.name}: declares {keys or 'nothing'}; expected exactly one of "
                f"{list(DECLARATION_KEYS)}"
            )
        elif inner in (int, float) and keys[0] == "free":
            problems.append(f"{cls.__name__}.{f.name}: a number must declare a range or choices, not 'free'")
        elif inner not in (int, float, bool) and keys[0] == "range":
            problems.append(f"{cls.__name__}.{f.name}: only numbers declare a range; declare choices or free")
    return problems


def check_value(name: str, value, annotation, metadata) -> None:
    """Check one converted field value against its declaration (``metadata`` of
    :func:`coupled_qk.models.options.option`); ``None`` of an optional field passes.

    Raises:
        ValueError: naming ``name``, the value and what was expected: a value outside ``choices``, a number
            outside ``range`` (integers: "must be a positive integer", "must be an integer >= 0" or "must be
            an integer in [lo, hi]"; floats: :func:`finite`).
    """
    inner, _ = _unwrap_optional(annotation)
    if value is None or inner is bool:  # a bool is declared by its type (coerce_fields)
        return
    if "choices" in metadata:
        allowed = metadata["choices"]
        choice(name, value, allowed() if callable(allowed) else allowed)
        return
    if "range" not in metadata:
        return
    lo, hi = metadata["range"]
    lo_open, hi_open = metadata.get("lo_open", False), metadata.get("hi_open", False)
    if inner is int:
        if lo is not None and lo_open:
            lo, lo_open = lo + 1, False
        if hi is not None and hi_open:
            hi, hi_open = hi - 1, False
        if (lo, hi) == (1, None):
            positive_int(name, value)
        elif (lo, hi) == (0, None):
            nonneg_int(name, value)
        elif (
            isinstance(value, bool)
            or not isinstance(value, int)
            or (lo is not None and value < lo)
            or (hi is not None and value > hi)
        ):
            lo_s = "-inf" if lo is None else lo
            hi_s = "inf" if hi is None else hi
            raise ValueError(f"{name}={value!r} must be an integer in [{lo_s}, {hi_s}]")
        return
    finite(name, value, lo, hi, lo_open=lo_open, hi_open=hi_open)


def check_declared(obj, owner: str | None = None) -> None:
    """Check every field of the dataclass instance ``obj`` against its declaration (:func:`check_value`), in
    declaration order; error messages name ``Owner.field`` (``owner`` defaults to the class name).

    Raises:
        ValueError: naming the first offending field.
    """
    owner = owner or type(obj).__name__
    types = field_types(type(obj))
    for f in dataclasses.fields(obj):
        check_value(f"{owner}.{f.name}", getattr(obj, f.name), types[f.name], f.metadata)


# ---------------------------------------------------------------------------------------------------------------
# Flags of the public API: a bool parameter takes a bool (docs/RELIABILITY.md, "Arguments and variables, declared")


class FlagError(TypeError, ValueError):
    """A ``bool`` parameter given something else (``compile="False"``): a ``TypeError`` (a wrong kind of object), and
    a ``ValueError`` (the command line reports those in one line, as it does the other argument checks)."""


def declared_flags(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Decorate a public function or method so that each call checks its ``bool`` parameters (annotated ``bool``, or
    ``bool | None`` which also takes ``None``): ``GPT.generate(idx, 3, compile="False")`` compiled, a non-empty
    string being true. Checked before the body runs, by position or keyword, without binding the signature (about
    a microsecond a call); the wrapper lists the flags it checks as ``declared_flags``.

    Raises:
        FlagError: at the call, naming the function, the parameter and the value.
    """
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # an annotation naming what only a type checker imports: read the text
        hints = {}
    flags: dict[str, tuple[int | None, bool]] = {}
    for index, param in enumerate(inspect.signature(fn).parameters.values()):
        annotation = hints.get(param.name, param.annotation)
        if isinstance(annotation, str):
            annotation = {"bool": bool, "bool | None": bool | None}.get(annotation)
        inner, optional = _unwrap_optional(annotation)
        if inner is bool:
            positional = param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD)
            flags[param.name] = (index if positional else None, optional)

    @functools.wraps(fn)
    def checked(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        for name, (index, optional) in flags.items():
            if name in kwargs:
                value = kwargs[name]
            elif index is not None and index < len(args):
                value = args[index]
            else:
                continue
            if not isinstance(value, bool) and not (optional and value is None):
                raise FlagError(
                    f"{fn.__qualname__}: {name}={value!r} must be True or False{' (or None)' if optional else ''}"
                    " (a string or a number is not read by its truthiness)"
                )
        return fn(*args, **kwargs)

    checked.declared_flags = tuple(flags)  # type: ignore[attr-defined]  # a function attribute no Callable type declares
    return checked


# ---------------------------------------------------------------------------------------------------------------
# Typo hints: an unknown name given with its close match ("did you mean")


def named_with_hints(unknown, known) -> str:
    """``"'lerning_rate' (did you mean 'learning_rate'?), 'xyz'"``: each of ``unknown`` (sorted) with its closest
    name in ``known`` (``difflib``) where it has one: the "did you mean" part of every unknown-name message."""
    known = sorted(known)
    return ", ".join(
        repr(k) + "".join(f" (did you mean {m!r}?)" for m in difflib.get_close_matches(k, known, 1))
        for k in sorted(unknown)
    )


def unknown_names_error(what: str, unknown, known, listed: str = "valid fields") -> ValueError:
    """The one error for names outside ``known`` (fields of a config, options of a task, keys of ``--set``):
    ``ValueError("unknown GPTConfig field(s) 'n_layr' (did you mean 'n_layer'?); valid fields: [...]")``, ``what``
    naming the kind (``"GPTConfig field(s)"``) and ``listed`` the known names' heading."""
    return ValueError(f"unknown {what} {named_with_hints(unknown, known)}; {listed}: {sorted(known)}")


def unknown_keys(data: dict, known, where, what: str, *, error: bool) -> list[str]:
    """The keys of ``data`` (a dict read from the file ``where``) outside ``known``, each named with its close
    match (``difflib``; ``'lerning_rate' (did you mean 'learning_rate'?)``): a ``ValueError`` with ``error``
    (files a user edits, whose unknown key would silently take no effect), else one ``UserWarning`` (files the
    project writes itself, which a later version may extend: the keys are ignored). ``what`` names the file's
    kind in the message (``"TrainConfig"``, ``"checkpoint state"``).

    Returns:
        The unknown keys, sorted (``[]``: nothing said).

    Raises:
        ValueError: with ``error``, one line naming ``where``, each unknown key, its close match and the known keys.
    """
    known = sorted(known)
    unknown = sorted(k for k in data if k not in known)
    if unknown:
        named = named_with_hints(unknown, known)
        if error:
            raise ValueError(
                f"{where}: unknown {what} key(s) {named}; expected keys among {known} (was the file edited by hand?)"
            )
        warnings.warn(
            f"{where}: unknown {what} key(s) {named}, ignored (written by a newer coupled-qk, or edited by hand?)",
            UserWarning,
            stacklevel=3,
        )
    return unknown
