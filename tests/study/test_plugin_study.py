"""Adding a study is one file or one entry point, with no edit to ``src/``: a small study declared by a plugin
(``tests/plugins/ministudy``, registered only through the ``coupled_qk.studies`` entry point; its dist-info stands
in for an installation) is listed, planned, run at a toy budget and reported by the same engine and command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from coupled_qk.cli import main
from coupled_qk.studies import studies

PLUGIN = Path(__file__).parents[1] / "plugins" / "ministudy"


@pytest.fixture
def ministudy(monkeypatch):
    """The plugin's folder on ``sys.path``; the registry read again before and after."""
    monkeypatch.syspath_prepend(str(PLUGIN))
    studies(reload=True)
    yield
    monkeypatch.undo()
    sys.modules.pop("coupled_qk_ministudy", None)
    studies(reload=True)


def test_the_plugin_study_is_listed_and_named_like_the_others(ministudy, capsys):
    assert "mini" in studies() and studies()["mini"].claims[0].id == "M1"
    assert main(["study", "list"]) == 0
    assert any(line.startswith("mini ") for line in capsys.readouterr().out.splitlines())
    assert main(["claims", "--protocol", "mini", "--plan", "--run-root", "nowhere"]) == 0  # the alias knows it too
    assert "4 runs: 4 to run" in capsys.readouterr().out


@pytest.mark.slow
def test_a_plugin_study_plans_runs_and_reports(ministudy, tmp_path, monkeypatch, capsys):
    from study_helpers import build_mini_data

    data = build_mini_data(tmp_path, monkeypatch)
    out, runs = tmp_path / "out", tmp_path / "runs"
    where = ["--out-dir", str(out), "--run-root", str(runs), "--data-dir", str(data)]
    assert main(["study", "plan", "mini", *where]) == 0
    plan = capsys.readouterr().out
    assert "  [cells] abstracts standard seed 0 lr 0.003 max_steps 3 (to run)" in plan and "4 runs: 4 to run" in plan
    assert main(["study", "run", "mini", *where, "--cache-dir", str(tmp_path / "cache"), "--no-figures"]) == 0
    records = {}
    for path in (out / "runs" / "mini" / "abstracts").glob("*/seed*.json"):
        rec = json.loads(path.read_text())
        records[(rec["variant"], rec["seed"])] = rec["final"]["test/perplexity"]
    assert len(records) == 4
    report = json.loads((out / "mini.json").read_text())
    row = report["rows"][0]
    changes = [100 * (records[("coupled", s)] / records[("standard", s)] - 1) for s in (0, 1)]
    assert row["id"] == "M1" and row["n"] == 2 and row["mean"] == pytest.approx(sum(changes) / 2, abs=1e-5)
    assert report["notes"] == ["A plugin's study: its notes live with it."]
    md = (out / "mini.md").read_text()
    assert "Regenerate: `coupled-qk study run mini --out-dir" in md and "| M1 |" in md
    assert main(["study", "report", "mini", "--out-dir", str(out), "--no-figures"]) == 0
    assert json.loads((out / "mini.json").read_text())["rows"][0]["mean"] == row["mean"]
