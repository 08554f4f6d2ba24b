"""The committed study records stay valid for the runs their protocols plan: a changed default of ``TrainConfig``
(``eval_batches`` became "scaled to the run") must not turn a record stale, which would make the study loop
train it again (its results were made with the settings the record stores)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coupled_qk.experiments.claims.converged import DESIGNS, plan, units
from coupled_qk.experiments.claims.converged_report import load_records
from coupled_qk.experiments.claims.protocols import PROTOCOLS
from coupled_qk.experiments.claims.runs import _differences, record_path, train_config

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "claims"


def _planned():
    """``(protocol, cell, variant, seed, planned TrainConfig)`` of every run the protocols and designs plan now."""
    for name, protocol in PROTOCOLS.items():
        for cell in protocol.cells:
            for variant, seed in cell.units():
                yield name, cell, variant, seed
    for name, design in DESIGNS.items():
        for _, cell, variant, seed in units(plan(design, load_records(RESULTS, design))):
            yield name, cell, variant, seed


@pytest.mark.skipif(not (RESULTS / "runs").is_dir(), reason="no committed study records in this checkout")
def test_every_committed_record_has_the_settings_its_protocol_plans():
    checked, stale = 0, []
    for protocol, cell, variant, seed in _planned():
        path = record_path(RESULTS, protocol, cell.name, variant, seed)
        if not path.is_file():
            continue
        cfg = train_config(cell, variant, seed, Path("run"), None if cell.mqar is not None else Path("data"))
        diff = _differences(json.loads(path.read_text())["config"], cfg)
        checked += 1
        if diff:
            stale.append(f"{path.relative_to(RESULTS)}: {diff}")
    assert checked >= 100, checked  # the committed studies are planned and found
    assert not stale, "\n".join(stale[:10])
