"""``coupled-qk study {list,plan,run,report,verify} NAME``: uniform options, refused where they do not apply by the
action (one table) and by what the study declares (pre-registered seeds, variants and cells; cells planned from the
records; WikiText-2 evaluations to defer; a claim reading GLUE results); the same reports as ``claims``."""

from __future__ import annotations

import pytest

from coupled_qk.cli import main
from coupled_qk.studies import studies


def test_list_shows_every_study(capsys):
    assert main(["study", "list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == list(studies())
    assert {"smoke", "cpu", "cpu-short", "gpu-paper", "cpu-converged", "cpu-converged-small", "gpu-60m"} <= set(listed)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "toy-converged", "--cells", "x"], "--cells does not apply to 'toy-converged': its seeds, variants"),
        (["plan", "toy-converged", "--seeds", "0"], "--seeds does not apply to 'toy-converged': its seeds, variants"),
        (
            ["run", "toy-converged", "--shard", "1/2"],
            "--shard does not apply to 'toy-converged': its cells are planned",
        ),
        (["run", "toy-converged", "--defer-wt2"], "no WikiText-2 evaluation to defer"),
        (["report", "toy-converged", "--glue-json", "g.json"], "none of its claims reads GLUE results"),
        (["run", "gpu-paper", "--defer-wt2"], "--defer-wt2 does not apply to 'gpu-paper'"),
        (["plan", "smoke", "--max-runs", "1"], "--max-runs=1 does not apply with study {list,plan,report,verify}"),
        (["report", "smoke", "--run-root", "r"], "--run-root=r does not apply with study {list,report}"),
        (["verify", "smoke", "r.json", "--no-figures"], "--no-figures does not apply with study {list,plan,verify}"),
        (["list", "--tolerance", "0"], "--tolerance=0.0 does not apply with study {list,plan,run,report}"),
        (["verify", "smoke"], "study verify needs a RECORD"),
        (["plan", "smoke", "r.json"], "only study verify takes a record"),
        (["verify", "smoke", "r.json"], "RECORD='r.json': no such record file"),  # study's own name, not --verify
        (["plan"], "study plan needs the study's NAME"),
        (["plna", "smoke"], "ACTION='plna'"),
        (["plan", "smok"], "NAME='smok'"),
    ],
)
def test_options_that_do_not_apply_are_refused_in_one_line(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["study", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []


def test_study_report_writes_the_claims_reports_but_for_its_own_command(tmp_path, monkeypatch):
    """``study report NAME`` and ``claims --protocol NAME --report-only`` write the same reports from the same
    records; only the command each names to regenerate them differs."""
    import shutil
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for name in ("cpu-short", "cpu-converged-pubmed"):
        shutil.copytree(root / "docs" / "results" / "claims" / "runs" / name, tmp_path / "a" / "runs" / name)
        shutil.copytree(root / "docs" / "results" / "claims" / "runs" / name, tmp_path / "b" / "runs" / name)
        argv = ["--no-figures", "--glue-json", str(root / "docs" / "results" / "glue-cpu" / "results.json")]
        argv = argv if name == "cpu-short" else ["--no-figures"]
        assert main(["claims", "--protocol", name, "--report-only", "--out-dir", str(tmp_path / "a"), *argv]) == 0
        assert main(["study", "report", name, "--out-dir", str(tmp_path / "b"), *argv]) == 0
        for suffix in (".json", ".md", "-readme.md"):
            a, b = ((tmp_path / x / f"{name}{suffix}").read_text() for x in "ab")
            differ = [(x, y) for x, y in zip(a.splitlines(), b.splitlines()) if x != y]
            for x, y in differ:
                assert ("claims --protocol" in x or "generated_utc" in x or x.startswith("Generated ")) and x[:11] == y[
                    :11
                ]
            assert len(a.splitlines()) == len(b.splitlines())


def test_a_report_reads_the_studies_notes_beside_its_folder_from_any_current_folder(tmp_path, monkeypatch, capsys):
    """The notes a pre-registered report carries (``docs/results/STUDIES.md``: dates, machines, the pre-registration)
    are found beside the report folder, so a report written from another folder keeps them; where no notes file
    exists the report holds only the study's own notes, and stderr says so (before: dropped without a word)."""
    import json
    import shutil
    from pathlib import Path

    from coupled_qk.study.report import study_notes

    root = Path(__file__).resolve().parents[2]
    name = "cpu-converged-pubmed"
    out = tmp_path / "repo" / "docs" / "results" / "claims"
    shutil.copytree(root / "docs" / "results" / "claims" / "runs" / name, out / "runs" / name)
    shutil.copyfile(root / "docs" / "results" / "STUDIES.md", out.parent / "STUDIES.md")
    monkeypatch.chdir(tmp_path)  # not the repository: docs/results/STUDIES.md is not under it
    expected = study_notes(studies()[name], out.parent / "STUDIES.md")
    assert len(expected) > len(studies()[name].notes)  # the file adds notes to this study
    assert main(["study", "report", name, "--out-dir", str(out), "--no-figures"]) == 0
    assert json.loads((out / f"{name}.json").read_text())["notes"] == expected
    assert "STUDIES.md" not in capsys.readouterr().err
    (out.parent / "STUDIES.md").unlink()
    assert main(["study", "report", name, "--out-dir", str(out), "--no-figures"]) == 0
    assert json.loads((out / f"{name}.json").read_text())["notes"] == list(studies()[name].notes)
    assert "note: no docs/results/STUDIES.md found beside" in capsys.readouterr().err
