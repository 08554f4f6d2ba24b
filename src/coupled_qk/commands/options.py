"""Shared command-line options: model preset plus ``GPTConfig`` overrides."""

from __future__ import annotations

import argparse
import dataclasses
import json

from coupled_qk.models.config import PRESETS, GPTConfig


def _value(text: str):
    """Parse an override value: JSON if it parses (numbers, true/false/null), else the raw string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


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


def parse_overrides(items: list[str]) -> dict:
    """``["a=1", "b=x"] -> {"a": 1, "b": "x"}``; raises ``ValueError`` on items without ``=``."""
    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--set {item!r}: expected FIELD=VALUE")
        key, value = item.split("=", 1)
        out[key.strip().replace("-", "_")] = _value(value)
    return out


def config_from_args(args, **extra) -> GPTConfig:
    """Build the validated :class:`GPTConfig` from parsed model options (``extra`` wins over the preset)."""
    overrides = {**extra, **parse_overrides(args.overrides)}
    for name in ("attention", "integrator", "n_steps"):
        if getattr(args, name, None) is not None:
            overrides[name] = getattr(args, name)
    return GPTConfig.from_preset(args.preset, **overrides)


def config_fields() -> list[str]:
    """Names of all :class:`GPTConfig` fields."""
    return [f.name for f in dataclasses.fields(GPTConfig)]


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2" -> [0, 1, 2]``; ``ValueError`` naming ``--seeds`` otherwise."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds={text!r}: expected comma-separated integers, e.g. 0,1,2") from None
    if not seeds:
        raise ValueError(f"--seeds={text!r} names no seed")
    return seeds
