"""A missing optional dependency is one line naming the extra, found before a command trains anything."""

from __future__ import annotations

import sys

import pytest

from coupled_qk.cli import main
from coupled_qk.extras import MissingExtra, require_extra


def test_require_extra_names_the_missing_module_and_the_extra(monkeypatch):
    require_extra(("json",), "claims", "nothing")
    monkeypatch.setitem(sys.modules, "scipy", None)  # an import of scipy now fails as if it were not installed
    with pytest.raises(MissingExtra, match=r"mqar --seeds needs scipy, .*coupled-qk\[claims\]"):
        require_extra(("json", "scipy"), "claims", "mqar --seeds")


MQAR = [
    "mqar",
    "--difficulties",
    "easy",
    "--d-models",
    "32",
    "--lrs",
    "2e-3",
    "--variants",
    "standard",
    "--max-steps",
    "2",
    "--train-examples",
    "64",
    "--test-examples",
    "8",
]


@pytest.mark.parametrize(
    "argv, blocked, extra",
    [
        (MQAR + ["--seeds", "0,1"], "scipy", "claims"),
        (["glue", "RUN_THAT_IS_NOT_READ", "--task", "rte"], "sklearn", "glue"),
        (["claims", "--protocol", "smoke", "--plan"], "scipy", "claims"),
    ],
)
def test_commands_refuse_a_missing_extra_before_any_work(argv, blocked, extra, monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, blocked, None)
    assert main([*argv, "--out-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"needs {blocked}" in err and f"coupled-qk[{extra}]" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()  # nothing trained, nothing written


def test_mqar_with_one_seed_needs_no_scipy(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "scipy", None)
    assert main([*MQAR, "--out-dir", str(tmp_path / "one")]) == 0
    assert (tmp_path / "one" / "results.json").is_file()
