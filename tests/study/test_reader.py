"""The one record reader (``Study.read``): a record counts only when it sits at its path, is a run of the plan, has
the plan's settings and holds every metric its cell declares as a finite number. Any other record file is named
(left out) in the report, its JSON and the plan; the runner trains a run again only when its record is another run
(other settings), not when the run's own result lacks a number. Generated over the ways a record can fail, and on
the committed records (a record made with another learning rate was "done" in ``--plan`` and counted by
``--report-only``)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from study_helpers import COMMANDS, write_record

from coupled_qk.cli import main
from coupled_qk.studies import get_study
from coupled_qk.study.claims import Arm, Claim, PairedChange
from coupled_qk.study.design import Cell, Cells, Study
from coupled_qk.study.plan import plan_lines
from coupled_qk.study.records import record_path
from coupled_qk.study.report import build_report, format_markdown
from coupled_qk.study.verdict_report import VerdictReport

ROOT = Path(__file__).resolve().parents[2]
TOY = dict(task="lm", corpus="pubmed", tokenizer="bpe-300", preset="tiny", batch_size=4, lr=3e-3, max_steps=3)
CELL = Cell("c", TOY, ("standard", "coupled"), (0, 1, 2))
STUDY = Study(
    "reader",
    "a study of one cell",
    (Cells((CELL,)),),
    (Claim("M1", "coupled beats standard", "-", PairedChange(Arm("c", "standard"), Arm("c", "coupled"), "ppl, %")),),
    VerdictReport(),
)


def _studies(name):
    return STUDY if name == STUDY.name else get_study(name)


def _write_all(out: Path) -> None:
    for seed in CELL.seeds:
        for variant in CELL.variants:
            ppl = 100.0 + seed - (variant == "coupled")
            write_record(out, STUDY, "c", variant, seed, {"test/perplexity": ppl})


def _edit(path: Path, change) -> None:
    rec = json.loads(path.read_text())
    change(rec)
    path.write_text(json.dumps(rec))


# how a record fails -> (what is changed, words of the reason, whether the runner trains the run again)
FAILURES = {
    "other learning rate": (lambda r: r["config"].update(lr=9.0), "made with other settings (lr: 9.0 vs 0.003)", True),
    "other seed setting": (lambda r: r["config"].update(seed=1), "made with other settings (seed: 1 vs 0)", True),
    "no settings": (lambda r: r.pop("config"), "it stores no settings", True),
    "fields name another seed": (lambda r: r.update(seed=2), "its fields name reader/c/", False),
    "fields name another study": (lambda r: r.update(protocol="cpu"), "its fields name cpu/c/", False),
    "metric missing": (lambda r: r["final"].clear(), "test/perplexity=None, expected a finite number", False),
    "metric not finite": (lambda r: r["final"].update({"test/perplexity": math.nan}), "test/perplexity=nan", False),
    "metric a string": (lambda r: r["final"].update({"test/perplexity": "9"}), "test/perplexity='9'", False),
    "metric a bool": (lambda r: r["final"].update({"test/perplexity": True}), "test/perplexity=True", False),
}


@settings(max_examples=len(FAILURES) * 2, deadline=None)
@given(kind=st.sampled_from(sorted(FAILURES)), variant=st.sampled_from(CELL.variants))
def test_a_record_that_is_not_the_planned_run_is_named_and_not_counted(tmp_path_factory, kind, variant):
    out = tmp_path_factory.mktemp("out")
    _write_all(out)
    change, reason, stale = FAILURES[kind]
    path = record_path(out, "reader", "c", variant, 0)
    _edit(path, change)
    reading = STUDY.read(out)
    assert ("c", variant, 0) not in reading.counted and len(reading.counted) == 5
    assert [(x.path, reason in x.reason) for x in reading.left_out] == [(path, True)], reading.left_out
    runner = STUDY.read(out, damaged="skip", here=True)
    assert (("c", variant, 0) in runner.stale) is stale  # trained again only when it is another run
    assert (("c", variant, 0) in runner.done) is (kind.startswith("metric"))
    report = build_report(STUDY, out, _studies)
    assert report["left_out"] == [{"file": str(path), "reason": reading.left_out[0].reason}]
    assert report["rows"][0]["verdict"] == "not run"  # seed 0 incomplete: the claim waits for it
    assert f"- `{path}`: {reading.left_out[0].reason}" in format_markdown(STUDY, report, COMMANDS)
    plan = "\n".join(plan_lines(STUDY, out, out / "runs-root", None))
    assert reason in plan


@pytest.mark.parametrize(
    "cell, variant, seed, reason",
    [
        ("c", "standard", 7, "seed 7 is not planned in cell 'c' (seeds 0, 1, 2)"),
        ("c", "differential", 0, "variant 'differential' is not planned in cell 'c' (standard, coupled)"),
        ("other", "standard", 0, "cell 'other' is not in the plan (cells: ['c'])"),
    ],
)
def test_a_record_of_a_run_outside_the_plan_is_named_in_the_plan_and_the_report(tmp_path, cell, variant, seed, reason):
    _write_all(tmp_path)
    path = record_path(tmp_path, "reader", cell, variant, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    rec = json.loads(record_path(tmp_path, "reader", "c", "standard", 0).read_text())
    path.write_text(json.dumps({**rec, "cell": cell, "variant": variant, "seed": seed}))
    reading = STUDY.read(tmp_path)
    assert len(reading.counted) == 6 and [(x.path, x.reason) for x in reading.left_out] == [(path, reason)]
    assert f"left out: {path}: {reason}" in plan_lines(STUDY, tmp_path, tmp_path / "runs-root", None)
    assert build_report(STUDY, tmp_path, _studies)["rows"][0]["n"] == 3


def _committed(tmp_path: Path, study: str) -> Path:
    out = tmp_path / "out"
    shutil.copytree(ROOT / "docs" / "results" / "claims" / "runs" / study, out / "runs" / study)
    return out


def test_a_committed_record_made_with_another_learning_rate_is_stale_not_done(tmp_path, capsys):
    """The issue's case on the committed PubMed study: one main record with another learning rate was "(done)" in
    the plan and counted by the report; now the plan says stale, naming the setting, and the report leaves it out."""
    out = _committed(tmp_path, "cpu-converged-pubmed")
    path = record_path(out, "cpu-converged-pubmed", "cpu-converged-pubmed-main", "coupled", 3)
    _edit(path, lambda r: r["config"].update(lr=0.001))
    assert main(["claims", "--protocol", "cpu-converged-pubmed", "--plan", "--out-dir", str(out)]) == 0
    plan = capsys.readouterr().out
    assert "cpu-converged-pubmed-main coupled seed 3 lr 0.004 max_tokens 2,994,760 (stale: made with other " in plan
    assert "(lr: 0.001 vs 0.004); to run)" in plan
    assert (
        main(["claims", "--protocol", "cpu-converged-pubmed", "--report-only", "--no-figures", "--out-dir", str(out)])
        == 0
    )
    report = json.loads((out / "cpu-converged-pubmed.json").read_text())
    c9 = report["claims"][0]
    assert c9["n"] == 9 and 3 not in c9["seeds"] and c9["status"] == "running (9 of 10 pairs)"
    assert [x["file"] for x in report["left_out"]] == [str(path)]
    assert "## Records left out" in (out / "cpu-converged-pubmed.md").read_text()


def test_verdict_records_beside_an_unfinished_grid_wait_for_it(tmp_path, capsys):
    """Partial plans beside verdict records: a grid record gone (deleted, or left out) while the main stage's
    records exist. The main records are not planned yet, so they are named and not counted; the report says what
    waits and makes no statement (it used to count them, then fail formatting the horizon None)."""
    out = _committed(tmp_path, "cpu-converged-pubmed")
    grid = record_path(out, "cpu-converged-pubmed", "cpu-converged-pubmed-grid-lr0.008", "coupled", 100)
    grid.unlink()
    code = main(
        ["claims", "--protocol", "cpu-converged-pubmed", "--report-only", "--no-figures", "--out-dir", str(out)]
    )
    assert code == 0, capsys.readouterr().err
    report = json.loads((out / "cpu-converged-pubmed.json").read_text())
    assert report["waiting"] == ["main: wait for the learning-rate grid"] and report["epochs"] is None
    assert report["claims"][0]["n"] == 0 and report["claims"][0]["status"] == "running (0 of 10 pairs)"
    assert len(report["left_out"]) == 20 and all("not planned yet" in x["reason"] for x in report["left_out"])
    assert "no statement yet" in (out / "cpu-converged-pubmed-readme.md").read_text()
    assert main(["claims", "--protocol", "cpu-converged-pubmed", "--plan", "--out-dir", str(out)]) == 0
    plan = capsys.readouterr().out
    assert "cpu-converged-pubmed-grid-lr0.008 coupled seed 100 lr 0.008 max_tokens 2,994,760 (to run)" in plan
    assert "left out: " in plan and "  waiting: main: wait for the learning-rate grid" in plan


@pytest.mark.parametrize("command", [["claims", "--protocol", "cpu", "--report-only"], ["study", "report", "cpu"]])
def test_report_only_on_a_folder_without_the_studys_records_is_refused(tmp_path, capsys, command):
    """A mistyped, empty --out-dir wrote a report of no runs and exited 0; now one line naming the folder, nothing
    written. (A study not run here, gpu-paper, still reports its claims as not run.)"""
    out = tmp_path / "typo"
    assert main([*command, "--out-dir", str(out), "--no-figures"]) == 2
    err = capsys.readouterr().err
    assert "holds no records of 'cpu'" in err and "nothing to report" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
    assert main(["study", "report", "gpu-paper", "--out-dir", str(out), "--no-figures"]) == 0


def test_the_plan_sees_a_run_another_process_trains(tmp_path, capsys):
    """A run folder whose lock another process holds is "in progress (locked by ...)" in the plan (it was "to
    run"), and the plan refuses what the runner would refuse before its first run (a model field the data set)."""
    from study_helpers import held_elsewhere

    runs = tmp_path / "runs"
    folder = runs / "reader" / "c" / "standard" / "seed0"
    with held_elsewhere(folder):
        lines = plan_lines(STUDY, tmp_path / "out", runs, None)
    assert any(
        line.startswith("  [cells] c standard seed 0 ") and "(in progress (locked by pid 4242 on node7" in line
        for line in lines
    )
    assert "6 runs: 1 in progress, 5 to run" in lines
    assert main(["claims", "--protocol", "smoke", "--variants", "coupled+vocab_size=10", "--plan"]) == 2
    assert "the model override vocab_size=10 cannot apply: task='lm' sets vocab_size" in capsys.readouterr().err
