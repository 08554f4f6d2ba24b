"""Standalone training configs of a converged design's runs (``coupled-qk train --config FILE``): the single
source of the committed ``configs/wt103-60m-*.json`` (:data:`~coupled_qk.experiments.claims.converged.GPU_60M`)."""

from __future__ import annotations

import math
from pathlib import Path

from coupled_qk.experiments.claims.converged import Design
from coupled_qk.experiments.claims.protocols import Cell


def train_config_dict(
    design: Design, variant: str, lr: float, seed: int, epochs: float | None = None, out_dir: str | None = None
) -> dict:
    """The :class:`TrainConfig` (as a JSON dict) of one run of ``design``, as a standalone config file would
    hold it (``coupled-qk train --config FILE``): the single source of the committed ``configs/`` files."""
    from coupled_qk._checks import finite
    from coupled_qk.experiments.claims.runs import train_config

    epochs = design.epochs if epochs is None else finite("epochs", epochs, 0, lo_open=True)  # 0 is not "default"
    cell = Cell("x", design.cell_base(epochs, lr), (variant,), (seed,), ())
    cfg = train_config(cell, variant, seed, Path(out_dir or f"runs/{design.name}-{variant}-seed{seed}"), None)
    d = cfg.to_dict()
    d.pop("progress", None)
    d.pop("tensorboard", None)
    return {k: v for k, v in d.items() if not (isinstance(v, float) and math.isnan(v))}


def standalone_configs(design: Design) -> dict[str, dict]:
    """``{file name: config dict}`` of one run per variant of ``design`` at the grid's middle learning rate and
    seed 0, for ``coupled-qk train --config FILE`` outside the study (the committed ``configs/wt103-60m-*.json``
    come from :data:`GPU_60M` through this function; a test keeps them equal)."""
    lr = sorted(design.lrs)[len(design.lrs) // 2]
    stem = "wt103-60m" if design.name == "gpu-60m" else design.name
    return {
        f"{stem}-{v}.json": train_config_dict(design, v, lr, 0, out_dir=f"runs/{stem}-{v}") for v in design.variants
    }


def write_configs(design: Design, folder: str | Path) -> list[Path]:
    """Write :func:`standalone_configs` into ``folder`` (JSON, sorted keys); return the paths."""
    import json

    from coupled_qk.io import write_text_atomic

    out = []
    for name, cfg in standalone_configs(design).items():
        path = Path(folder) / name
        write_text_atomic(path, json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        out.append(path)
    return out
