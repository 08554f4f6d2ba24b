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
REQUIRED_FLAGS = ("disallow_untyped_defs", "disallow_incomplete_defs", "check_untyped_defs", "strict_equality")
"""``[tool.mypy]`` flags that must stay on: every function of the core annotated in full, and its bodies checked."""


def mypy_config_flags(text: str) -> dict[str, str]:
    """``name -> value`` (as written) of the ``key = value`` lines of the ``[tool.mypy]`` table of a pyproject text
    (read by line: ``tomllib`` is Python 3.11+, the package supports 3.10)."""
    table = re.search(r"^\[tool\.mypy\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S)
    assert table is not None, "pyproject.toml has no [tool.mypy] table"
    return dict(re.findall(r"^(\w+)\s*=\s*(.+?)\s*$", table.group(1), re.M))


def test_mypy_requires_full_annotations():
    """The type check requires every function of the core to be annotated in full: ``disallow_untyped_defs`` and
    ``disallow_incomplete_defs`` (a function with an unannotated parameter or return fails the check, rather than
    being read as ``Any``), with the bodies checked (``check_untyped_defs``) and ``strict_equality``."""
    flags = mypy_config_flags((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    missing = [name for name in REQUIRED_FLAGS if flags.get(name) != "true"]
    assert not missing, f"[tool.mypy] must set {missing} = true; it has {flags}"


def test_config_flag_reader():
    """The reader of the ``[tool.mypy]`` table: its own lines only (not the next table's), values as written."""
    text = (
        '[tool.mypy]\n# a comment\nfiles = ["src"]\ndisallow_untyped_defs = true\n\n'
        "[tool.other]\nstrict_equality = true\n"
    )
    assert mypy_config_flags(text) == {"files": '["src"]', "disallow_untyped_defs": "true"}


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


SNIPPET = """
import torch
from coupled_qk.layers.attention import CausalSelfAttention
from coupled_qk.models.gpt import GPT

CausalSelfAttention(64, 4, "2", 16)  # LINE attention
def f(model: GPT) -> None:
    model.generate(torch.zeros(1, 1, dtype=torch.long), 3, compiled=True)  # LINE generate
    reveal_type(model.compile)  # LINE compile
"""


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed (pip install -e .[test])")
def test_decorated_signatures_are_checked(tmp_path):
    """A method decorated with ``checks.values.declared_flags`` keeps its signature for the type checker (the
    decorator is ``Callable[P, R] -> Callable[P, R]``): a wrong argument type to the attention layer's constructor
    and an unknown keyword to ``GPT.generate`` are reported on their lines, and ``GPT.compile`` reads as its own
    signature, not ``Callable[..., Any]``."""
    snippet = tmp_path / "uses_the_api.py"
    snippet.write_text(SNIPPET)
    lines = {line.split("# LINE ")[1]: n for n, line in enumerate(SNIPPET.splitlines(), 1) if "# LINE " in line}
    done = subprocess.run(
        [sys.executable, "-m", "mypy", str(snippet)], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    report = done.stdout + done.stderr
    assert re.search(rf":{lines['attention']}: error: .*\"CausalSelfAttention\".*\[arg-type\]", report), report
    assert re.search(rf":{lines['generate']}: error: Unexpected keyword argument \"compiled\"", report), report
    compile_line = re.search(rf":{lines['compile']}: note: Revealed type is \"(.*)\"", report)
    assert compile_line is not None and "fullgraph: bool =" in compile_line.group(1), report
