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


BLOCKED_FIRST = """
import sys
sys.modules["scipy"] = None  # before any coupled_qk import: as in an install without the [claims] extra
from coupled_qk.cli import main
for argv in ({argvs}):
    print("rc", argv[0], main(argv), flush=True)
"""


def test_study_commands_without_scipy_are_one_line_in_a_fresh_process(tmp_path):
    """In a fresh process (no study module imported yet, unlike the in-process test above when another test ran
    first) the study commands' parsers load every study: without scipy that must still give one line, not a
    traceback from an import, and ``study list`` needs no scipy at all."""
    import subprocess

    argvs = [
        ["study", "list"],
        ["study", "plan", "smoke", "--out-dir", str(tmp_path / "out")],
        ["claims", "--protocol", "smoke", "--plan", "--out-dir", str(tmp_path / "out")],
    ]
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED_FIRST.format(argvs=", ".join(map(repr, argvs)))],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert "Traceback" not in done.stderr, done.stderr
    codes = [line for line in done.stdout.splitlines() if line.startswith("rc ")]
    assert codes == ["rc study 0", "rc study 2", "rc claims 2"], done.stdout + done.stderr
    assert done.stderr.count("needs scipy") == 2 and "coupled-qk[claims]" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()
