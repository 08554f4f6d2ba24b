"""The type check of the core passes: ``python -m mypy`` with the configuration in pyproject.toml (``[tool.mypy]``:
``ops/``, ``layers/`` and ``models/``, the rest of the package read for its types only) reports no error.

mypy keeps its cache in the repository's ``.mypy_cache`` (git-ignored): the first run reads torch's types (tens
of seconds on two cores), later ones take about a second.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ("ops", "layers", "models")


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed (pip install -e .[test])")
def test_mypy_passes_on_the_core():
    """``python -m mypy`` from the repository root exits 0, having checked every module of the core (a file left out
    of ``[tool.mypy] files`` would pass unchecked); its report is the failure message otherwise."""
    done = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    modules = sum(len(list((ROOT / "src" / "coupled_qk" / p).rglob("*.py"))) for p in CORE)
    checked = re.search(r"Success: no issues found in (\d+) source files", done.stdout)
    assert checked is not None and int(checked.group(1)) == modules, done.stdout
