"""Tracked benchmark cells: a small committed set of A/B cells with their last accepted ratios
(``benchmarks/tracked.json``; ``python benchmarks/ab.py --tracked``, ``--accept``; ``benchmarks/README.md``).

The file names the revision whose ratios were last accepted and how they were measured (preset, variants,
cells, threads, clock, threshold, repeats). ``python benchmarks/ab.py --tracked`` measures the working tree against
that revision, interleaved (:func:`ab_measure.run_ab`), and flags the cells whose change
interval lies above ``1 + threshold``: what a change made slower. ``--accept`` then records the working tree's
ratios and commit as the new accepted state (a committed, unmodified checkout only: accepted ratios belong to a
revision).
"""

from __future__ import annotations

import json
from pathlib import Path

import ab_worker
from ab_measure import BASELINE, cell_spec

from coupled_qk.experiments.bench.machine import machine_line
from coupled_qk.files import write_text_atomic
from coupled_qk.models.config import PRESETS, GPTConfig
from coupled_qk.models.specs import variant_overrides

FIELDS = ("revision", "preset", "variants", "cells", "threads", "clock", "threshold", "repeats", "accepted")
"""The fields a tracked file must hold (others, e.g. ``measured``, ``machine``, ``command``, are informative)."""


def load_tracked(path: str | Path) -> dict:
    """The tracked file at ``path``, checked.

    Raises:
        ValueError: naming ``path``: not readable JSON, a missing field, an unknown preset, variant, cell or clock,
            no ``standard`` among the variants, a threshold outside (0, 1), fewer than 6 repeats or threads < 1.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"--tracked {path}: cannot read the tracked cells ({exc})") from None
    missing = [f for f in FIELDS if f not in data]
    if missing:
        raise ValueError(f"--tracked {path}: missing field(s) {missing}; expected {list(FIELDS)}")
    problems = []
    if data["preset"] not in PRESETS:
        problems.append(f"preset {data['preset']!r} is not one of {sorted(PRESETS)}")
    if BASELINE not in data["variants"]:
        problems.append(f"variants {data['variants']} lack {BASELINE!r}")
    if data["clock"] not in ab_worker.CLOCKS:
        problems.append(f"clock {data['clock']!r} is not one of {list(ab_worker.CLOCKS)}")
    if not 0 < float(data["threshold"]) < 1:
        problems.append(f"threshold {data['threshold']} is not in (0, 1)")
    if int(data["repeats"]) < 6 or int(data["threads"]) < 1:
        problems.append(f"repeats {data['repeats']} (>= 6 for a 95% interval) or threads {data['threads']} (>= 1)")
    for cell in data["cells"]:
        try:
            cell_spec(cell, PRESETS.get(data["preset"], {}).get("block_size", 128))
        except ValueError as exc:
            problems.append(str(exc))
    if problems:
        raise ValueError(f"--tracked {path}: " + "; ".join(problems))
    return data


def variant_settings(names: list[str], preset: str, base: dict) -> dict:
    """``{name: flat GPTConfig overrides}`` of variant specs, each checked by building its config here.

    Raises:
        ValueError: a spec or a ``base`` field that does not make a valid config with ``preset`` (naming both).
    """
    out = {}
    for name in names:
        overrides = variant_overrides(name)
        try:
            GPTConfig.from_preset(preset, **{**base, **overrides})
        except ValueError as exc:
            raise ValueError(f"variant {name} with --set {base}: {exc}") from None
        out[name] = overrides
    return out


def settings_of(tracked: dict, repeats: int | None = None) -> dict:
    """The A/B settings of a tracked file (``repeats`` replaces the file's when given)."""
    block = GPTConfig.from_preset(tracked["preset"], **tracked.get("base", {})).block_size
    return dict(
        preset=tracked["preset"],
        base=dict(tracked.get("base", {})),
        variants=variant_settings(tracked["variants"], tracked["preset"], tracked.get("base", {})),
        cells=[cell_spec(c, block) for c in tracked["cells"]],
        repeats=int(repeats or tracked["repeats"]),
        threads=int(tracked["threads"]),
        seed=int(tracked.get("seed", 0)),
        clock=tracked["clock"],
        threshold=float(tracked["threshold"]),
    )


def accepted_table(tracked: dict) -> dict:
    """``{cell: {variant: accepted ratio}}`` (standard: its ms) of a tracked file."""
    return {cell: {v: r["median"] for v, r in row.items()} for cell, row in tracked["accepted"].items()}


def accepted_state(result: dict, rows: list[dict], repeats: int | None = None) -> dict:
    """The tracked file recording ``result``'s new revision (its commit) and ratios as accepted; ``repeats``: the
    file's own setting, kept (``--repeats`` replaces it for one run only; the file's ``command`` records the run's),
    else the run's.

    Raises:
        ValueError: the new side has uncommitted changes (accepted ratios must belong to a commit).
    """
    new, s = result["revisions"]["new"], result["settings"]
    if new["dirty"]:
        raise ValueError(
            f"--accept records the working tree's ratios under its commit, but {new['src']} has uncommitted changes "
            f"to tracked files ({new['label']}); commit them first, then run --tracked --accept again"
        )
    accepted = {}
    for r in rows:
        if r["new"] is not None:
            ci = r["new"]
            accepted.setdefault(r["cell"], {})[r["variant"]] = {k: round(ci[k], 4) for k in ("median", "low", "high")}
    return dict(
        about="Tracked benchmark cells and their last accepted ratios to standard (standard: ms); "
        "`python benchmarks/ab.py --tracked` flags what a change made slower (benchmarks/README.md)",
        revision=new["commit"],
        measured=result["date"],
        machine=machine_line(result["machine"]).removeprefix("- machine: "),
        load=[round(x, 1) for x in result["load"]],
        command=result.get("command", ""),
        preset=s["preset"],
        base=s["base"],
        variants=list(s["variants"]),
        cells=[c["name"] for c in s["cells"]],
        threads=s["threads"],
        seed=s["seed"],
        clock=s["clock"],
        threshold=s["threshold"],
        repeats=s["repeats"] if repeats is None else repeats,
        accepted=accepted,
    )


def write_tracked(path: str | Path, state: dict) -> None:
    """Write a tracked file atomically (indented JSON)."""
    write_text_atomic(path, json.dumps(state, indent=2) + "\n")
