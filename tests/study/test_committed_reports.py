"""The committed reports of the frozen (pre-registered) studies can be regenerated on a clean clone.

``coupled-qk claims --protocol NAME --report-only`` rewrites ``docs/results/claims/NAME{.json,.md,-readme.md}``
(and its figures) on every run and takes no ``--overwrite``; output safety replaces a file only when the folder's
output record (:data:`coupled_qk.output_dir.RECORD`) names it as that command's output with its content's SHA-256.
So the record is committed beside the reports, and each committed report must match its entry: a report
regenerated without committing the record (or edited by hand) fails here instead of on a user's clone.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from coupled_qk.output_dir import RECORD
from coupled_qk.studies import studies

CLAIMS = Path(__file__).resolve().parents[2] / "docs" / "results" / "claims"
FROZEN_WITH_REPORTS = sorted(n for n, s in studies().items() if s.frozen and (CLAIMS / f"{n}.json").is_file())


def _entries() -> dict:
    return json.loads((CLAIMS / RECORD).read_text(encoding="utf-8"))["files"]


def test_some_frozen_study_has_a_committed_report():
    assert "cpu-converged" in FROZEN_WITH_REPORTS  # the test below would pass vacuously otherwise


@pytest.mark.parametrize("name", FROZEN_WITH_REPORTS)
def test_a_frozen_studys_committed_report_is_recorded_as_the_reports_own_output(name):
    entries = _entries()
    for file in (f"{name}.json", f"{name}.md", f"{name}-readme.md"):
        assert file in entries, f"{file} is not in {CLAIMS / RECORD}: regenerate the report and commit the record"
        digest = hashlib.sha256((CLAIMS / file).read_bytes()).hexdigest()
        assert entries[file]["sha256"] == digest, f"{file} differs from what the report recorded writing"


def test_every_recorded_file_is_committed_with_the_recorded_content():
    for file, entry in _entries().items():
        path = CLAIMS / file
        assert path.is_file(), f"{RECORD} names {file}, which is not there"
        assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"], file
