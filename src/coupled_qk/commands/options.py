"""Shared command-line options: model preset plus ``GPTConfig`` overrides."""

from __future__ import annotations

import argparse

from coupled_qk.models.config import PRESETS, GPTConfig, parse_overrides


def add_model_options(parser: argparse.ArgumentParser, default_preset: str | None = "tiny") -> None:
    """Add ``--preset``, ``--attention``, ``--integrator``, ``--n-steps`` and ``--set FIELD=VALUE``."""
    parser.add_argument(
        "--preset", default=default_preset, choices=sorted(PRESETS), help=f"model size preset (default {default_preset})"
    )
    parser.add_argument("--attention", default=None, help="attention variant (default: the preset's, standard)")
    parser.add_argument("--integrator", default=None, help="euler | leapfrog | symplectic_euler")
    parser.add_argument("--n-steps", type=int, default=None, help="integration steps of the dynamics")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
        help="override any GPTConfig field, e.g. --set n_layer=6 --set position=learned (repeatable)",
    )


def config_from_args(args, **extra) -> GPTConfig:
    """Build the validated :class:`GPTConfig` from parsed model options (``extra`` wins over the preset)."""
    overrides = {**extra, **parse_overrides(args.overrides)}
    for name in ("attention", "integrator", "n_steps"):
        if getattr(args, name, None) is not None:
            overrides[name] = getattr(args, name)
    return GPTConfig.from_preset(args.preset, **overrides)


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2" -> [0, 1, 2]``; ``ValueError`` naming ``--seeds`` otherwise."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds={text!r}: expected comma-separated integers, e.g. 0,1,2") from None
    if not seeds:
        raise ValueError(f"--seeds={text!r} names no seed")
    return seeds
