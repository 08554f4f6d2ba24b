"""Options that a command would silently ignore in some situation, refused instead (docs/RELIABILITY.md).

A command declares, per option, the situations in which the option has an effect (:class:`Applies`); an option
given at a value other than its default in any other situation is refused in one line by
:func:`refuse_ignored_options`, before any work. ``bench`` has its own table of the same kind
(``commands/bench.py::OPTION_MODES``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Applies:
    """When an option has an effect.

    Attributes:
        when: ``args -> bool``: whether the option is used with these parsed arguments.
        otherwise: the situation in which it is not, as the error shows it after "does not apply with", e.g.
            ``"--temperature=0 (greedy decoding: the most likely token, nothing is sampled)"``.
        used_for: what the option is for, as the error ends, e.g. ``"sampling, --temperature > 0"``.
    """

    when: Callable[[argparse.Namespace], bool]
    otherwise: str
    used_for: str


def option_defaults(add_arguments) -> dict[str, tuple[str, object]]:
    """``{option: (dest, default)}`` of every option that ``add_arguments(parser)`` registers, a string default
    passed through the option's type as argparse does (so it compares equal to a parsed default)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    out = {}
    for action in parser._actions:
        if not action.option_strings:
            continue
        default = action.default
        if isinstance(default, str) and callable(action.type):
            default = action.type(default)
        for option in action.option_strings:
            out[option] = (action.dest, default)
    return out


def given_options(args: argparse.Namespace, add_arguments, options) -> list[tuple[str, object]]:
    """``(option, value)`` for each of ``options`` that ``args`` gives at a value other than its default (from
    ``add_arguments``, the command's own option registration), in the order of ``options``.

    Raises:
        KeyError: an option the command does not have (a programming error).
    """
    defaults = option_defaults(add_arguments)
    out = []
    for option in options:
        dest, default = defaults[option]
        value = getattr(args, dest, default)
        if value != default:
            out.append((option, value))
    return out


def shown_option(option: str, value) -> str:
    """``--top-k=5``; a flag alone (``--no-plots``); a list comma-joined (``--prefixes=4,8``)."""
    if isinstance(value, bool):
        return option
    return f"{option}={','.join(map(str, value)) if isinstance(value, (list, tuple)) else value}"


def refuse_ignored_options(args: argparse.Namespace, add_arguments, table: dict[str, tuple[Applies, ...]]) -> None:
    """Refuse the first option of ``table`` that ``args`` gives at a value other than its default (from
    ``add_arguments``, the command's own option registration) in a situation where one of its :class:`Applies`
    rules says it has no effect: asking for something must never silently do something else.

    Raises:
        ValueError: one line, ``"--top-k=5 does not apply with --temperature=0 (...): --top-k is for ..."``.
        KeyError: ``table`` names an option the command does not have (a programming error).
    """
    for option, value in given_options(args, add_arguments, table):
        for rule in table[option]:
            if not rule.when(args):
                raise ValueError(
                    f"{shown_option(option, value)} does not apply with {rule.otherwise}: {option} is "
                    f"for {rule.used_for}"
                )
