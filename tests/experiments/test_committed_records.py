"""The committed study records stay valid for the runs their protocols plan: a changed default of ``TrainConfig``
(``eval_batches`` became "scaled to the run") must not turn a record stale, which would make the study loop
train it again (its results were made with the settings the record stores)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from coupled_qk.experiments.claims.converged import DESIGNS, plan, units
from coupled_qk.experiments.claims.converged_report import load_records
from coupled_qk.experiments.claims.protocols import PROTOCOLS
from coupled_qk.experiments.claims.runs import (
    _differences,
    fingerprint,
    load_record,
    record_path,
    settings_of,
    train_config,
)

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "claims"


def _planned():
    """``(protocol, cell, variant, seed)`` of every run the protocols and designs plan now."""
    for name, protocol in PROTOCOLS.items():
        for cell in protocol.cells:
            for variant, seed in cell.units():
                yield name, cell, variant, seed
    for name, design in DESIGNS.items():
        for _, cell, variant, seed in units(plan(design, load_records(RESULTS, design))):
            yield name, cell, variant, seed


def _planned_configs() -> dict[Path, object]:
    """``{record path: planned TrainConfig}`` of :func:`_planned`, built as the study loop (``claims.runs.execute``)
    builds them, on the CPU device the committed studies ran on (a record's precision is compared with the one
    ``--dtype auto`` picks there; on a GPU the study would rightly train a CPU record again)."""
    out = {}
    for protocol, cell, variant, seed in _planned():
        cfg = train_config(cell, variant, seed, Path("run"), None if cell.mqar is not None else Path("data"))
        out[record_path(RESULTS, protocol, cell.name, variant, seed)] = dataclasses.replace(cfg, device="cpu")
    return out


@pytest.mark.skipif(not (RESULTS / "runs").is_dir(), reason="no committed study records in this checkout")
def test_every_committed_record_is_reused_by_the_run_its_protocol_plans():
    """Every record file under ``runs/`` is planned by its protocol or design (a record the plan no longer reaches
    would be left behind unchecked), and the study loop's own reuse decision (:func:`load_record`: the settings,
    a field the record predates counting as its default, and the precision) takes it instead of training again.
    Where the record stores every result-changing setting (it postdates them all), its stored fingerprint is
    also the planned run's (:func:`fingerprint`, which ``claims --verify`` compares)."""
    planned = _planned_configs()
    on_disk = set(RESULTS.glob("runs/*/*/*/seed*.json"))
    assert len(on_disk) >= 100  # the committed studies are there
    assert not on_disk - set(planned), sorted(str(p.relative_to(RESULTS)) for p in on_disk - set(planned))[:10]
    stale, fingerprints = [], 0
    for path in sorted(on_disk):
        cfg = planned[path]
        if load_record(path, cfg) is None:
            stale.append(f"{path.relative_to(RESULTS)}: {_differences(json.loads(path.read_text())['config'], cfg)}")
            continue
        rec = json.loads(path.read_text())
        if set(settings_of(cfg)) <= set(rec["config"]):
            fingerprints += 1
            assert rec["fingerprint"] == fingerprint(cfg), path.relative_to(RESULTS)
    assert not stale, "\n".join(stale[:10])
    assert fingerprints >= 50, fingerprints  # the converged designs' records store every setting
