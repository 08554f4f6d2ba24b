"""Shared command-line options: model preset plus ``GPTConfig`` overrides."""

from __future__ import annotations

import argparse
import os

from coupled_qk.checks.values import MAX_SEED, coerce, finite, nonneg_int, positive_int
from coupled_qk.models.config import PRESETS, GPTConfig, parse_overrides
from coupled_qk.models.registry import QK_MAPS, attention_names, variant_names

VARIANT_FLAGS = ("attention", "integrator", "n_steps")


def add_model_options(
    parser: argparse.ArgumentParser, default_preset: str | None = "tiny", variant_flags: bool = True
) -> None:
    """Add ``--preset``, ``--attention``, ``--integrator``, ``--n-steps`` and ``--set FIELD=VALUE``.

    With ``variant_flags=False`` (``compare``, ``demo``: the variants come from ``--variants``) the three variant
    flags are hidden and :func:`reject_variant_flags` refuses them instead of ignoring them."""
    hide = None if variant_flags else argparse.SUPPRESS
    parser.add_argument(
        "--preset",
        default=default_preset,
        choices=sorted(PRESETS),
        help=f"model size preset (default: {default_preset or 'tiny, or the config file'})",
    )
    parser.add_argument(
        "--attention", default=None, help=hide or f"attention: {', '.join(attention_names())} (default: standard)"
    )
    parser.add_argument(
        "--integrator",
        default=None,
        help=hide or "integrator of coupled attention: euler, leapfrog or symplectic_euler (default: euler)",
    )
    parser.add_argument(
        "--n-steps",
        type=nonneg_int_arg,
        default=None,
        metavar="INT",
        help=hide or "integration steps of coupled attention (default: 1)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override any GPTConfig field or option of the attention's query-key map, e.g. --set n_layer=6 "
        f"--set position=learned (repeatable); map options: {map_options_help()}",
    )


def map_options_help() -> str:
    """``"dynamics (coupled*): integrator, n_steps, ...; ..."``: every registered map's options (from its
    dataclass), for help texts."""
    attention_names()  # loads plugins
    return "; ".join(f"{m.name} ({m.stem}*): {', '.join(m.option_names())}" for m in QK_MAPS.values())


def reject_variant_flags(args, command: str) -> None:
    """``ValueError`` if ``--attention``, ``--integrator`` or ``--n-steps`` was given to a command whose variants
    come from ``--variants`` (they would otherwise be silently ignored)."""
    given = ["--" + n.replace("_", "-") for n in VARIANT_FLAGS if getattr(args, n, None) is not None]
    if given:
        raise ValueError(
            f"{command} trains the variants named by --variants, so {', '.join(given)} would be ignored; put the "
            "setting in a variant spec instead, e.g. --variants standard,coupled+integrator=leapfrog+n_steps=3 "
            f"(variants: {', '.join(variant_names())})"
        )


class GivenOnce:
    """The settings given on one command line, each under one canonical name: one field, one value
    (docs/RELIABILITY.md, "One setting, one value").

    Every command builds its configuration through :func:`gpt_config_from_args` or
    :func:`coupled_qk.commands.train.train_config_from_args`, which pass each setting here with where it came
    from: a flag (``--n-steps``, ``--max-steps``), an item of ``--set`` or ``--opt``, a field inside ``--opt
    model='{...}'``, ``--opt task_options='{...}'`` or ``--set qk_map='{...}'``, a split flag. A name given twice
    with different values is refused naming both places; before, ``--set n_steps=2 --n-steps 3`` built 3 steps in
    ``describe`` and 2 in ``train``. The same value twice is accepted. A ``--config`` file is not a command-line
    source: its fields are the base that the command line overrides (as documented in ``--config``'s help).
    """

    def __init__(self):
        self._given: dict[str, tuple[object, str]] = {}

    def add(self, name: str, value, where: str) -> None:
        """Record ``name`` (canonical, e.g. ``model.qk_map.n_steps``) given as ``value`` by ``where``.

        Raises:
            ValueError: ``name`` was already given another value, naming both places.
        """
        if name in self._given:
            old, old_where = self._given[name]
            if not _same_value(old, value):
                raise ValueError(
                    f"{name} is given twice with different values: {old_where} gives {old!r}, {where} gives "
                    f"{value!r}; give it once"
                )
            return
        self._given[name] = (value, where)

    def names(self) -> set[str]:
        """The top-level names given (``TrainConfig`` fields such as ``eval_batches``; not ``model.*``)."""
        return {name for name in self._given if "." not in name}

    def add_model(self, key: str, value, where: str) -> None:
        """Record the ``GPTConfig`` override ``key`` (a field, an old field name, a flat map option or the
        ``qk_map`` dict, whose options are recorded one by one) under its canonical name."""
        from coupled_qk.models.config import RENAMED_FIELDS
        from coupled_qk.models.registry import flat_option_names

        if key == "qk_map" and isinstance(value, dict):
            flat = flat_option_names()
            for option, option_value in value.items():
                self.add(f"model.qk_map.{flat.get(option, option)}", option_value, where)
            return
        key = RENAMED_FIELDS.get(key, key)
        flat = flat_option_names()
        self.add(f"model.qk_map.{flat[key]}" if key in flat else f"model.{key}", value, where)


def _same_value(a, b) -> bool:
    """Whether two given values are one: equal, and of one type except ``2`` and ``2.0`` (``True`` is not ``1``)."""
    if a != b:
        return False
    numbers = (int, float)
    both_numbers = all(isinstance(v, numbers) and not isinstance(v, bool) for v in (a, b))
    return type(a) is type(b) or both_numbers


def model_overrides(args, given: GivenOnce) -> dict:
    """The ``GPTConfig`` overrides of the model options (``--set`` items, then ``--attention``, ``--integrator``,
    ``--n-steps``), each recorded in ``given`` (which refuses one field given two values).

    Raises:
        ValueError: an item :func:`~coupled_qk.models.config.parse_overrides` refuses, or a field given twice.
    """
    overrides: dict = {}
    for item in getattr(args, "overrides", None) or []:
        for key, value in parse_overrides([item]).items():
            given.add_model(key, value, f"--set {item}")
            overrides[key] = value
    for name in VARIANT_FLAGS:
        value = getattr(args, name, None)
        if value is not None:
            given.add_model(name, value, "--" + name.replace("_", "-"))
            overrides[name] = value
    return overrides


def refuse_variant_conflicts(args, variants: list[str]) -> None:
    """Refuse a model setting of the command line (``--set``, ``--n-steps``) that a variant spec of ``--variants``
    gives another value: the spec would replace it for that variant without a word (``compare --set n_layer=2
    --variants coupled+n_layer=3``, ``bench --n-steps 2 --variants coupled+n_steps=3``, ``compare --set
    attention=coupled --variants standard,...``). Used by every command that takes both (``compare``, ``demo``,
    ``bench``).

    Raises:
        ValueError: naming the setting, the option and the spec (:class:`GivenOnce`).
    """
    from coupled_qk.models.specs import variant_overrides

    for spec in variants:
        given = GivenOnce()
        model_overrides(args, given)
        for key, value in variant_overrides(spec).items():
            given.add_model(key, value, f"--variants spec {spec!r}")


def gpt_config_from_args(args, **extra) -> GPTConfig:
    """Build the validated :class:`GPTConfig` from parsed model options (``extra`` wins over the preset; the
    command line wins over ``extra``).

    Raises:
        ValueError: a refused field or value, or one field given two different values (:class:`GivenOnce`).
    """
    return GPTConfig.from_preset(args.preset, **{**extra, **model_overrides(args, GivenOnce())})


def parse_variants_option(text: str | None, option: str = "--variants") -> list[str]:
    """``--variants`` text -> canonical variant specs (:func:`~coupled_qk.models.specs.parse_variants`; ``None`` or
    ``"all"``: the default variants), checked when the command starts.

    Raises:
        ValueError: an unknown or invalid spec, two specs of one model or no spec, naming ``option`` and its value.
    """
    from coupled_qk.models.specs import parse_variants

    try:
        return parse_variants(text)
    except ValueError as exc:
        message = str(exc)
        raise ValueError(message if message.startswith(option) else f"{option}={text!r}: {message}") from None


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2" -> [0, 1, 2]``; ``ValueError`` naming ``--seeds`` for non-integers, no seed, a repeated or a
    negative seed."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
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


# ---------------------------------------------------------------------------------------------------------------
# argparse types: one rule per kind of value, shared by every command (docs/RELIABILITY.md, "Command line").
# Each raises argparse.ArgumentTypeError, which the parser prints as one line naming the option, exit 2.


def _arg(check, what: str):
    """An argparse ``type`` calling ``check(text)``; its ``ValueError`` becomes a one-line usage error."""

    def parse(text: str):
        try:
            return check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = what  # argparse names the type in some messages
    return parse


_NAME = "value"
"""The name the value checks are called with here: the parser names the option (``--n=0 must be ...``)."""


def _checked(text: str, check, value):
    """``check(_NAME, value)``, a value check of :mod:`coupled_qk.checks.values` (one rule for the library, configs and
    the command line); its ``ValueError`` reworded about ``text`` (``'0' must be a positive integer``)."""
    try:
        return check(_NAME, value)
    except ValueError as exc:
        raise ValueError(f"{text!r} {str(exc).removeprefix(f'{_NAME}={value!r} ')}") from None


def _number_text(text: str, kind: type):
    """``text`` converted to ``kind`` (``int`` or ``float``) as every config value is
    (:func:`coupled_qk.checks.values.coerce`: ``"2.0"`` is the integer 2), written with the digits 0-9."""
    if not text.isascii():
        raise ValueError(f"{text!r} is not a number (write it with the digits 0-9)")
    return _checked(text, lambda name, value: coerce(name, value, kind), text)


def _positive_int(text: str) -> int:
    return _checked(text, positive_int, _number_text(text, int))


def _nonneg_int(text: str) -> int:
    return _checked(text, nonneg_int, _number_text(text, int))


def _seed(text: str) -> int:
    value = _nonneg_int(text)
    if value > MAX_SEED:
        raise ValueError(f"{text!r} must be a seed in [0, {MAX_SEED}] (2**32 - 1)")
    return value


def cpu_count() -> int:
    """The CPUs this process may use (its affinity where the system says, else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _threads(text: str) -> int:
    value = _positive_int(text)
    if value > cpu_count():
        raise ValueError(
            f"{text!r} is more threads than this machine's {cpu_count()} CPUs; expected 1 to {cpu_count()}"
        )
    return value


def _float_text(text: str, positive: bool) -> float:
    """A finite number written in ASCII, ``> 0`` (``positive``) or ``>= 0`` (:func:`coupled_qk.checks.values.finite`);
    ``ValueError`` naming the text."""
    value = _number_text(text, float)
    return _checked(text, lambda name, v: finite(name, v, lo=0, lo_open=positive), value)


def _positive_float(text: str) -> float:
    return _float_text(text, positive=True)


def _path_text(text: str) -> str:
    from coupled_qk.checks.paths import path_value

    if not text.strip():
        raise ValueError(f"{text!r} is empty; expected a path")
    path_value("path", text)
    return text


def _folder_text(text: str) -> str:
    from pathlib import Path

    _path_text(text)
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{text!r} is a file; expected a folder")
    return text


def _device_text(text: str) -> str:
    from coupled_qk.devices import check_device

    return check_device("", text)


def _dtype_text(text: str) -> str:
    from coupled_qk.devices import check_dtype

    return check_dtype("", text)


positive_int_arg = _arg(_positive_int, "positive integer")
"""argparse type: an integer >= 1 (``0``, ``-1``, ``2.5``, ``"x"`` refused in one line)."""
nonneg_int_arg = _arg(_nonneg_int, "integer >= 0")
"""argparse type: an integer >= 0."""
seed_arg = _arg(_seed, "seed")
"""argparse type: a seed, an integer in ``[0, 2**32 - 1]`` (:data:`coupled_qk.checks.values.MAX_SEED`)."""
threads_arg = _arg(_threads, "thread count")
"""argparse type: a thread count from 1 to this machine's CPUs (``torch.set_num_threads(100000)`` crashes)."""
positive_float_arg = _arg(_positive_float, "positive number")
"""argparse type: a finite number > 0 (NaN, inf, 0 and negatives refused)."""
path_arg = _arg(_path_text, "path")
"""argparse type: a non-empty path without NUL characters (kind and existence are checked by the command)."""
folder_arg = _arg(_folder_text, "folder")
"""argparse type: a folder path (:data:`path_arg`) that, where it exists, is a folder and not a file (the command
checks whether it must exist)."""
device_arg = _arg(_device_text, "device")
"""argparse type: a device this machine has (:func:`coupled_qk.devices.check_device`), listing the choices."""
dtype_arg = _arg(_dtype_text, "dtype")
"""argparse type: an autocast dtype name (:func:`coupled_qk.devices.check_dtype`)."""


def add_device_option(parser, default: str = "auto", help: str | None = None) -> None:
    """``--device``, checked against the devices of this machine when parsed."""
    from coupled_qk.devices import available_devices

    parser.add_argument(
        "--device",
        default=default,
        type=device_arg,
        metavar="DEVICE",
        help=help or f"torch device: {', '.join(available_devices())} (default: {default}; auto = CUDA if available)",
    )


def add_compile_option(parser) -> None:
    """``--compile``/``--no-compile`` of a study's runs (``mqar``, ``glue``): the flag ``train`` and ``compare``
    have (:attr:`TrainConfig.compile`, its help text), recorded in each run's config; default off."""
    import dataclasses

    from coupled_qk.training.config import TrainConfig

    field = next(f for f in dataclasses.fields(TrainConfig) if f.name == "compile")
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=False,
        help=field.metadata["help"] + " (default: False)",
    )


def add_overwrite_option(parser) -> None:
    """``--overwrite``: allow replacing the command's own earlier output (never another command's output, a training
    run's files or files the command does not write; see :mod:`coupled_qk.output_dir`)."""
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace this command's own earlier output files (another command's output, a training run's "
        "files and files the command does not write are never touched; a folder holding them is refused)",
    )


def add_progress_option(parser) -> None:
    """``--no-progress``: no progress bars and no periodic progress lines (``args.progress`` False; the command
    line sets :func:`coupled_qk.progress.set_mode` ``"off"`` before the command runs)."""
    parser.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        help="no progress bars or periodic progress lines (COUPLED_QK_PROGRESS=off does the same)",
    )


def _list(item, what: str):
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


positive_ints_arg = _arg(_list(_positive_int, "positive integers"), "list of positive integers")
"""argparse type: ``"16,32"`` -> ``[16, 32]``; empty items, repeats, zero, negatives and non-integers refused."""
positive_floats_arg = _arg(_list(_positive_float, "positive numbers"), "list of positive numbers")
"""argparse type: ``"3e-3,1e-2"`` -> ``[0.003, 0.01]``; empty items, repeats, NaN, inf, 0 and negatives refused."""


def _nonneg_float(text: str) -> float:
    return _float_text(text, positive=False)


def _fraction(text: str) -> float:
    return _checked(text, lambda name, v: finite(name, v, 0, 1), _number_text(text, float))


nonneg_float_arg = _arg(_nonneg_float, "number >= 0")
"""argparse type: a finite number >= 0 (a temperature: 0 means greedy)."""
fraction_arg = _arg(_fraction, "fraction")
"""argparse type: a finite number in [0, 1] (the command checks any tighter range)."""


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

    parse = _arg(check, "comma-separated subset of " + ",".join(choices))
    parse.checks_choices = choices
    return parse
