"""Shared command-line options: model preset plus ``GPTConfig`` overrides."""

from __future__ import annotations

import argparse

from coupled_qk.models.config import PRESETS, GPTConfig, parse_overrides
from coupled_qk.models.registry import QK_MAPS, attention_names, variant_names

VARIANT_FLAGS = ("attention", "integrator", "n_steps")


def add_model_options(parser: argparse.ArgumentParser, default_preset: str | None = "tiny",
                      variant_flags: bool = True) -> None:
    """Add ``--preset``, ``--attention``, ``--integrator``, ``--n-steps`` and ``--set FIELD=VALUE``.

    With ``variant_flags=False`` (``compare``, ``demo``: the variants come from ``--variants``) the three variant
    flags are hidden and :func:`reject_variant_flags` refuses them instead of ignoring them."""
    hide = None if variant_flags else argparse.SUPPRESS
    parser.add_argument(
        "--preset", default=default_preset, choices=sorted(PRESETS), help=f"model size preset (default: {default_preset or 'tiny, or the config file'})"
    )
    parser.add_argument("--attention", default=None,
                        help=hide or f"attention: {', '.join(attention_names())} (default: standard)")
    parser.add_argument("--integrator", default=None,
                        help=hide or "integrator of coupled attention: euler, leapfrog or symplectic_euler (default: euler)")
    parser.add_argument("--n-steps", type=int, default=None, metavar="INT",
                        help=hide or "integration steps of coupled attention (default: 1)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
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
            f"(variants: {', '.join(variant_names())})")


def gpt_config_from_args(args, **extra) -> GPTConfig:
    """Build the validated :class:`GPTConfig` from parsed model options (``extra`` wins over the preset)."""
    overrides = {**extra, **parse_overrides(args.overrides)}
    for name in ("attention", "integrator", "n_steps"):
        if getattr(args, name, None) is not None:
            overrides[name] = getattr(args, name)
    return GPTConfig.from_preset(args.preset, **overrides)


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
        raise ValueError(f"--seeds={text!r} repeats seed(s) {repeated}: each seed is one run, so a repeat would "
                         "be reported as an independent run")
    negative = [s for s in seeds if s < 0]
    if negative:
        raise ValueError(f"--seeds={text!r}: seeds must be >= 0, got {negative}")
    return seeds
