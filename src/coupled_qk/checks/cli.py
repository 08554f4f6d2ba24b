"""Command-line types built from the value checks: each argparse ``type`` converts the text as every config value is
converted (:func:`coupled_qk.checks.values.coerce`) and applies the rule of its kind from
:mod:`coupled_qk.checks.values`, :mod:`coupled_qk.checks.paths` or :mod:`coupled_qk.devices`, so a value has one
rule whether it comes from the library, a config file or the command line (docs/RELIABILITY.md, "Command line").

The only thing added here is the adaptation: the check's message is reworded about the text typed (``'0' must be a
positive integer``) and raised as ``argparse.ArgumentTypeError``, which the parser prints as one line naming the
option (``argument --n-steps: '-1' must be an integer >= 0``), exit status 2.

Level 0 of the layering: the value checks and :mod:`coupled_qk.devices` only.
"""

from __future__ import annotations

import argparse
import functools
import os

from coupled_qk.checks.paths import folder_value, path_value
from coupled_qk.checks.values import MAX_SEED, coerce, finite, nonneg_int, positive_int, seed_int
from coupled_qk.devices import check_device, check_dtype

__all__ = [
    "cpu_count",
    "device_arg",
    "dtype_arg",
    "folder_arg",
    "fraction_arg",
    "nonneg_float_arg",
    "nonneg_int_arg",
    "parse_seeds",
    "path_arg",
    "positive_float_arg",
    "positive_floats_arg",
    "positive_int_arg",
    "positive_ints_arg",
    "seed_arg",
    "subset_arg",
    "threads_arg",
]


def _arg(parse, what: str, doc: str):
    """An argparse ``type`` (a callable taking the option's text: the ``type=`` contract of :mod:`argparse`,
    docs.python.org/3/library/argparse.html#type) calling ``parse(text)``; its ``ValueError`` becomes an
    ``argparse.ArgumentTypeError``, a one-line usage error. ``what`` names the type in argparse's messages; ``doc``
    is its docstring (what ``help()`` shows)."""

    def parse_arg(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse_arg.__name__ = what  # argparse names the type in some messages
    parse_arg.__doc__ = doc
    return parse_arg


_NAME = "value"
"""The name the value checks are called with here: the parser names the option (``--n=0 must be ...``)."""


def _checked(text: str, check, value):
    """``check(_NAME, value)``, a value check (one rule for the library, configs and the command line); its
    ``ValueError`` reworded about ``text``: ``value=0 must be ...`` reads ``'0' must be ...``."""
    try:
        return check(_NAME, value)
    except ValueError as exc:
        message, head = str(exc), f"{_NAME}={value!r}"
        if message.startswith(head):
            message = f"{text!r}{message[len(head) :]}"
        raise ValueError(message) from None


def _number_text(text: str, kind: type):
    """``text`` converted to ``kind`` (``int`` or ``float``) as every config value is
    (:func:`coupled_qk.checks.values.coerce`: ``"2.0"`` is the integer 2), written with the digits 0-9."""
    if not text.isascii():
        raise ValueError(f"{text!r} is not a number (write it with the digits 0-9)")
    return _checked(text, lambda name, value: coerce(name, value, kind), text)


def _number(kind: type, check):
    """A text parser: the number ``text`` writes (:func:`_number_text`), then ``check(name, number)``."""

    def parse(text: str):
        return _checked(text, check, _number_text(text, kind))

    return parse


def cpu_count() -> int:
    """The CPUs this process may use (its affinity where the system says, else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def thread_count(name: str, value) -> int:
    """``value`` if it is a positive integer no larger than :func:`cpu_count` (``torch.set_num_threads(100000)``
    crashes); ``ValueError`` naming ``name`` otherwise."""
    positive_int(name, value)
    if value > cpu_count():
        raise ValueError(
            f"{name}={value!r} is more threads than this machine's {cpu_count()} CPUs; expected 1 to {cpu_count()}"
        )
    return value


def _path_text(text: str) -> str:
    _checked(text, path_value, text)
    return text


def _folder_text(text: str) -> str:
    _checked(text, folder_value, text)
    return text


def _device_text(text: str) -> str:
    return _checked(text, check_device, text)


def _dtype_text(text: str) -> str:
    return _checked(text, check_dtype, text)


positive_int_arg = _arg(
    _number(int, positive_int),
    "positive integer",
    """argparse type: the text of an integer >= 1 -> ``int`` (:func:`~coupled_qk.checks.values.positive_int`),
    converted as a config value is (``"2.0"`` and ``"1e3"`` are 2 and 1000).

    Raises:
        argparse.ArgumentTypeError: ``0``, ``-1`` (``'0' must be a positive integer``), ``2.5``, ``x`` (not an
            integer) or digits other than 0-9, naming the text typed.
    """,
)
nonneg_int_arg = _arg(
    _number(int, nonneg_int),
    "integer >= 0",
    """argparse type: the text of an integer >= 0 -> ``int`` (:func:`~coupled_qk.checks.values.nonneg_int`).

    Raises:
        argparse.ArgumentTypeError: a negative number, a non-integer or digits other than 0-9, naming the text.
    """,
)
seed_arg = _arg(
    _number(int, seed_int),
    "seed",
    """argparse type: a seed, the text of an integer in ``[0, 2**32 - 1]`` -> ``int``
    (:func:`~coupled_qk.checks.values.seed_int`: numpy's legacy generator's range).

    Raises:
        argparse.ArgumentTypeError: a negative or larger number, a non-integer, naming the text and the range.
    """,
)
threads_arg = _arg(
    _number(int, thread_count),
    "thread count",
    """argparse type: a thread count, the text of an integer from 1 to this machine's CPUs (:func:`cpu_count`) ->
    ``int`` (:func:`thread_count`).

    Raises:
        argparse.ArgumentTypeError: 0, a negative or non-integer number, or more threads than CPUs (naming the
            CPU count).
    """,
)
positive_float_arg = _arg(
    _number(float, functools.partial(finite, lo=0, lo_open=True)),
    "positive number",
    """argparse type: the text of a finite number > 0 -> ``float`` (:func:`~coupled_qk.checks.values.finite`).

    Raises:
        argparse.ArgumentTypeError: NaN, inf (``'inf' must be a finite number``), 0 or a negative number
            (``'0' must be in (0, inf]``), or text that is no number, naming the text.
    """,
)
nonneg_float_arg = _arg(
    _number(float, functools.partial(finite, lo=0)),
    "number >= 0",
    """argparse type: the text of a finite number >= 0 -> ``float`` (a temperature: 0 means greedy).

    Raises:
        argparse.ArgumentTypeError: NaN, inf, a negative number or text that is no number, naming the text.
    """,
)
fraction_arg = _arg(
    _number(float, functools.partial(finite, lo=0, hi=1)),
    "fraction",
    """argparse type: the text of a finite number in [0, 1] -> ``float`` (the command checks any tighter range).

    Raises:
        argparse.ArgumentTypeError: NaN, a number outside [0, 1] or text that is no number, naming the text.
    """,
)
path_arg = _arg(
    _path_text,
    "path",
    """argparse type: a path value, returned as the text typed (:func:`~coupled_qk.checks.paths.path_value`); its
    kind and existence are checked by the command.

    Raises:
        argparse.ArgumentTypeError: an empty text or one with a NUL character.
    """,
)
folder_arg = _arg(
    _folder_text,
    "folder",
    """argparse type: a folder path, returned as the text typed (:func:`~coupled_qk.checks.paths.folder_value`: a
    path value that, where it exists, is a folder; the command checks whether it must exist).

    Raises:
        argparse.ArgumentTypeError: an empty text, one with a NUL character, or the path of an existing file.
    """,
)
device_arg = _arg(
    _device_text,
    "device",
    """argparse type: a device this machine has, ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``, returned
    stripped and in lower case (:func:`coupled_qk.devices.check_device`).

    Raises:
        argparse.ArgumentTypeError: an unknown name or a device absent here, listing the devices available.
    """,
)
dtype_arg = _arg(
    _dtype_text,
    "dtype",
    """argparse type: an autocast dtype name, ``auto``, ``fp32``, ``bf16`` or ``fp16``, returned stripped and in
    lower case (:func:`coupled_qk.devices.check_dtype`).

    Raises:
        argparse.ArgumentTypeError: another name (``float32``), listing the four; ``bf16`` where the machine has a
            CUDA GPU without bfloat16.
    """,
)


def _list(item, what: str):
    """A text parser of ``"a,b"``: each item parsed by ``item``; empty items and repeats refused."""

    def parse(text: str) -> list:
        parts = [p.strip() for p in text.split(",")]
        if not text.strip() or any(not p for p in parts):
            raise ValueError(
                f"{text!r}: expected a comma-separated list of {what} without empty items, e.g. "
                f"{'16,32' if 'integer' in what else '3e-3,1e-2'}"
            )
        values = [item(p) for p in parts]
        if len(set(values)) != len(values):
            raise ValueError(f"{text!r} repeats a value")
        return values

    return parse


positive_ints_arg = _arg(
    _list(_number(int, positive_int), "positive integers"),
    "list of positive integers",
    """argparse type: a comma-separated list of integers >= 1 -> ``list[int]`` in the order typed (``"16,32"`` ->
    ``[16, 32]``; spaces around items ignored).

    Raises:
        argparse.ArgumentTypeError: an empty text or empty item, a repeated value, or an item that is 0, negative
            or not an integer (naming that item).
    """,
)
positive_floats_arg = _arg(
    _list(_number(float, functools.partial(finite, lo=0, lo_open=True)), "positive numbers"),
    "list of positive numbers",
    """argparse type: a comma-separated list of finite numbers > 0 -> ``list[float]`` in the order typed
    (``"3e-3,1e-2"`` -> ``[0.003, 0.01]``).

    Raises:
        argparse.ArgumentTypeError: an empty text or empty item, a repeated value, or an item that is NaN, inf, 0,
            negative or no number (naming that item).
    """,
)


def subset_arg(choices, allow_empty: bool = False):
    """An argparse type for a comma-separated subset of ``choices``: ``"a,b"`` -> ``["a", "b"]``; unknown,
    repeated or empty items are refused with the valid names (``allow_empty``: ``""`` is the empty list). The
    returned type carries ``checks_choices`` (what the option-contract tests read)."""
    choices = tuple(choices)

    def check(text: str) -> list[str]:
        if allow_empty and not text.strip():
            return []
        parts = [p.strip() for p in text.split(",")]
        bad = [p for p in parts if p not in choices]
        if bad or len(set(parts)) != len(parts):
            raise ValueError(
                f"{text!r}: expected a comma-separated subset of {', '.join(choices)} without repeats"
                + (" (or '' for none)" if allow_empty else "")
            )
        return parts

    parse = _arg(
        check,
        "comma-separated subset of " + ",".join(choices),
        f"argparse type: a comma-separated subset of {', '.join(choices)} -> ``list[str]`` (see :func:`subset_arg`).",
    )
    parse.checks_choices = choices
    return parse


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2" -> [0, 1, 2]``, each seed written as an integer (:func:`_number_text`) in ``[0, 2**32 - 1]``
    (:data:`~coupled_qk.checks.values.MAX_SEED`): the ``--seeds`` of the commands that train several seeds.

    Raises:
        ValueError: naming ``--seeds`` and its text for a non-integer, no seed, a repeated seed (a repeat would be
            reported as an independent run) or seeds out of range (listing them).
    """
    try:
        seeds = [_number_text(s.strip(), int) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds={text!r}: expected comma-separated integers, e.g. 0,1,2") from None
    if not seeds:
        raise ValueError(f"--seeds={text!r} names no seed")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ValueError(
            f"--seeds={text!r} repeats seed(s) {repeated}: each seed is one run, so a repeat would "
            "be reported as an independent run"
        )
    negative = [s for s in seeds if s < 0]
    if negative:
        raise ValueError(f"--seeds={text!r}: seeds must be >= 0, got {negative}")
    huge = [s for s in seeds if s > MAX_SEED]
    if huge:
        raise ValueError(f"--seeds={text!r}: seeds must be <= {MAX_SEED} (2**32 - 1), got {huge}")
    return seeds
