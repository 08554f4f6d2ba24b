"""Environment variables: each ``COUPLED_QK_*`` variable the project reads is declared here (:data:`ENVIRONMENT`), with
its check, and read through :func:`env_value`; the command line names any other one (:func:`undeclared_env`).

Level 0 of the layering: no torch and no project imports.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping

__all__ = ["ENVIRONMENT", "ENV_PREFIX", "EnvVar", "env_value", "undeclared_env"]


@dataclasses.dataclass(frozen=True)
class EnvVar:
    """A declared environment variable.

    Attributes:
        what: what it sets, for messages and docs.
        parse: ``text -> value`` for a set, non-blank value; ``ValueError`` saying what is expected.
        default: the value when unset or blank.
        read_by: where it is read (``tests`` for the test suite's own).
    """

    what: str
    parse: Callable[[str], object]
    default: object
    read_by: str


def _env_choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return text

    return parse


def _env_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError("expected a positive number of seconds")
    return value


def _env_interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise ValueError("expected a number of seconds >= 0 (0: a line at every update)")
    return value


def _env_opt_out(text: str) -> str:
    if text not in ("0", "1"):
        raise ValueError("is not understood; expected 1 (keep glibc's malloc defaults) or 0 / unset (tune malloc)")
    return text


def _env_count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError("expected a positive integer")
    return int(text)


ENVIRONMENT: dict[str, EnvVar] = {
    "COUPLED_QK_PROGRESS": EnvVar(
        "progress display (--no-progress is off)", _env_choice("auto", "bar", "lines", "off"), "auto", "progress"
    ),
    "COUPLED_QK_LOG_INTERVAL": EnvVar("seconds between plain progress lines", _env_interval, 30.0, "progress"),
    "COUPLED_QK_PG_TIMEOUT_S": EnvVar(
        "seconds a process group waits for its ranks", _env_seconds, None, "training.distributed"
    ),
    "COUPLED_QK_DEFAULT_MALLOC": EnvVar("1: keep glibc's malloc defaults", _env_opt_out, "0", "allocator"),
    "COUPLED_QK_DATA": EnvVar("the data folder (checked by data.paths)", str, None, "data.paths"),
    "COUPLED_QK_CACHE": EnvVar("the cache folder (checked by data.paths)", str, None, "data.paths"),
    "COUPLED_QK_HYPOTHESIS_EXAMPLES": EnvVar("examples per generated test", _env_count, None, "tests"),
    "COUPLED_QK_FAULT_EXAMPLES": EnvVar("fault-injection examples", _env_count, None, "tests"),
    "COUPLED_QK_FAULT_SEED": EnvVar("fault-injection seed", int, None, "tests"),
    "COUPLED_QK_UPDATE_DOCS": EnvVar("1: regenerate the generated docs", _env_choice("0", "1"), "0", "tests"),
}
"""Every ``COUPLED_QK_*`` environment variable, declared once: the command line warns about any other one (a typo
such as ``COUPLED_QK_PROGRES=off`` was ignored without a word)."""

ENV_PREFIX = "COUPLED_QK_"


def env_value(name: str, environ: Mapping[str, str] | None = None):
    """The checked value of the declared environment variable ``name`` in ``environ`` (default ``os.environ``); its
    declared default when it is unset or blank.

    Raises:
        ValueError: one line naming the variable, its value and what is expected. KeyError: ``name`` is not declared
            in :data:`ENVIRONMENT` (a programming error).
    """
    spec = ENVIRONMENT[name]
    text = (os.environ if environ is None else environ).get(name, "")
    if not text.strip():
        return spec.default
    try:
        return spec.parse(text.strip())
    except ValueError as exc:
        raise ValueError(f"environment variable {name}={text!r}: {exc} ({spec.what})") from None


def undeclared_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line for each ``COUPLED_QK_*`` variable of ``environ`` that is not declared, with its close match."""
    import difflib

    environ = os.environ if environ is None else environ
    out = []
    for name in sorted(n for n in environ if n.startswith(ENV_PREFIX) and n not in ENVIRONMENT):
        close = difflib.get_close_matches(name, ENVIRONMENT, n=1, cutoff=0.8)
        hint = f"; did you mean {close[0]}?" if close else f"; coupled-qk reads {', '.join(sorted(ENVIRONMENT))}"
        out.append(f"environment variable {name} is not one coupled-qk reads, so it has no effect{hint}")
    return out
