"""Fixtures shared by the Hugging Face tests."""

import sys
from pathlib import Path

import pytest

from coupled_qk.models import registry

DRIFT_PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "drift"


@pytest.fixture
def drift(monkeypatch):
    """The drift plugin (tests/plugins/drift, registered through its entry point), undone after the test."""
    monkeypatch.syspath_prepend(str(DRIFT_PLUGIN))
    with registry.isolated():
        yield
    sys.modules.pop("coupled_qk_drift", None)
