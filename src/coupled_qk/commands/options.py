"""Shared command-line options: model preset plus ``GPTConfig`` overrides, each setting given once, and the options
several commands share (``--device``, ``--compile``, ``--overwrite``, ``--no-progress``). The argparse types of
single values are :mod:`coupled_qk.checks.cli`."""

from __future__ import annotations

import argparse

from coupled_qk.checks.cli import device_arg, nonneg_int_arg
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
