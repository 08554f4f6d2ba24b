"""The smoke study end to end: report structure, and verdicts that follow the measured numbers."""

import json
import shutil

import pytest

from coupled_qk.cli import main
from coupled_qk.studies import get_study
from coupled_qk.study.claims import VERDICTS
from coupled_qk.study.report import build_report as build


def build_report(study, out):
    return build(study, out, get_study)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """Run the smoke protocol once (module scope) on synthetic data; return its output folder."""
    import _pytest.monkeypatch

    tmp = tmp_path_factory.mktemp("claims")
    mp = _pytest.monkeypatch.MonkeyPatch()
    from study_helpers import build_mini_data

    data = build_mini_data(tmp, mp)
    out = tmp / "out"
    rc = main(
        [
            "claims",
            "--protocol",
            "smoke",
            "--out-dir",
            str(out),
            "--run-root",
            str(tmp / "runs"),
            "--data-dir",
            str(data),
            "--cache-dir",
            str(tmp / "derived"),
        ]
    )
    assert rc == 0
    yield out
    mp.undo()


@pytest.mark.slow
def test_report_structure(smoke):
    report = json.loads((smoke / "smoke.json").read_text())
    assert [r["id"] for r in report["rows"]] == [f"C{i}" for i in range(1, 14)]
    for r in report["rows"]:
        assert r["verdict"] in VERDICTS
        if r["verdict"] == "not run":
            assert r["reason"]
        else:
            assert {"effect", "mean", "low", "high", "n", "tokens", "train_hours"} <= set(r)
            assert r["n"] >= 2 and r["tokens"]
    by_id = {r["id"]: r for r in report["rows"]}
    assert by_id["C11"]["verdict"] == "not run" and "GLUE" in by_id["C11"]["reason"]
    for cid in ("C1", "C2", "C3", "C4", "C5", "C6", "C7", "C8", "C9", "C10", "C12", "C13"):
        assert by_id[cid]["verdict"] != "not run", (cid, by_id[cid]["reason"])
    assert all(c["finished"] == c["planned"] for c in report["cells"])
    scan = {s["factor"].split(" (")[0]: s["status"] for s in report["scan"]}
    assert scan["baseline"] == scan["dt_init 0.5"] == "measured"  # the factors the smoke protocol runs
    assert scan["d_head 64"].startswith("not run")
    assert by_id["C13"]["details"]["rank_vs_ppl"]["n"] >= 4
    assert [g["status"] for g in report["gqa"]] == ["measured"] * 3
    shared = json.loads(next((smoke / "runs" / "smoke" / "gqa-tiny").glob("coupled*keys*/seed0.json")).read_text())
    assert shared["config"]["model"]["n_kv_heads"] == 1 and shared["config"]["model"]["keys_per_query_head"] is False
    md = (smoke / "smoke.md").read_text()
    assert "shared vs per-head evolved keys" in md
    assert "| C1 |" in md and "coupled-qk claims" in md and "Holm" in md
    for fig in ("effects", "curves", "scan", "rank"):
        assert (smoke / "figures" / f"smoke-{fig}.png").stat().st_size > 1000
    rec = json.loads(next((smoke / "runs" / "smoke" / "wv-tiny" / "coupled").glob("seed*.json")).read_text())
    assert {"wt2_test/perplexity", "test/perplexity", "valid/perplexity"} <= set(rec["final"])
    assert rec["diagnostics"]["effective_rank"] > 0 and rec["diagnostics"]["windows"] == 8 and rec["curve"]["valid"]


def _set_relative(out, cell, variant, reference, factor, key="test/perplexity"):
    """Set ``variant``'s metric to ``factor`` times ``reference``'s in every seed (same cell)."""
    for path in (out / "runs" / "smoke" / cell / variant).glob("seed*.json"):
        rec = json.loads(path.read_text())
        ref = json.loads((out / "runs" / "smoke" / cell / reference / path.name).read_text())
        rec["final"][key] = ref["final"][key] * factor
        path.write_text(json.dumps(rec))


@pytest.mark.slow
def test_verdicts_follow_the_numbers(smoke, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(smoke, out)
    protocol = get_study("smoke")
    # coupled 30% better than standard in every seed: C1 reproduced; 30% worse: contradicted
    before = {r["id"]: r for r in build_report(protocol, out)["rows"]}
    _set_relative(out, "wv-tiny", "coupled", "standard", 0.7)
    rows = {r["id"]: r for r in build_report(protocol, out)["rows"]}
    assert rows["C1"]["verdict"] == "reproduced" and rows["C1"]["mean"] == pytest.approx(-30.0)
    _set_relative(out, "wv-tiny", "coupled", "standard", 1.3)
    rows = {r["id"]: r for r in build_report(protocol, out)["rows"]}
    assert rows["C1"]["verdict"] == "contradicted" and rows["C1"]["mean"] == pytest.approx(30.0)
    assert rows["C1"]["mean"] != before["C1"]["mean"]
    # the same change moves C3 (coupled vs uncoupled) but not C9 (another cell)
    assert rows["C3"]["mean"] != before["C3"]["mean"] and rows["C9"]["mean"] == before["C9"]["mean"]
    # leapfrog equal to Euler in every seed: C2 (equivalence) reproduced
    for path in (out / "runs" / "smoke" / "wv-tiny-leapfrog" / "coupled_leapfrog").glob("seed*.json"):
        rec = json.loads(path.read_text())
        euler = json.loads((out / "runs" / "smoke" / "wv-tiny" / "coupled" / path.name).read_text())
        rec["final"]["test/perplexity"] = euler["final"]["test/perplexity"] * 1.001
        path.write_text(json.dumps(rec))
    rows = {r["id"]: r for r in build_report(protocol, out)["rows"]}
    assert rows["C2"]["verdict"] == "reproduced"
    # deleting a record turns a verdict into "not run" with the reason
    next((out / "runs" / "smoke" / "pubmed-tiny" / "coupled").glob("seed*.json")).unlink()
    rows = {r["id"]: r for r in build_report(protocol, out)["rows"]}
    assert rows["C9"]["verdict"] == "not run" and "in progress" in rows["C9"]["reason"]


@pytest.mark.slow
def test_finished_runs_are_reused(smoke, tmp_path, capsys):
    """A second invocation trains nothing: every run comes from its record."""
    before = {p: p.stat().st_mtime_ns for p in (smoke / "runs").rglob("*.json")}
    assert main(["claims", "--protocol", "smoke", "--out-dir", str(smoke), "--report-only", "--no-figures"]) == 0
    assert (
        main(
            [
                "claims",
                "--protocol",
                "smoke",
                "--out-dir",
                str(smoke),
                "--run-root",
                str(tmp_path / "none"),
                "--data-dir",
                str(tmp_path / "nodata"),
                "--cells",
                "wv-tiny",
                "--no-figures",
            ]
        )
        == 0
    )
    assert {p: p.stat().st_mtime_ns for p in (smoke / "runs").rglob("*.json")} == before


def test_gpu_protocols_are_defined_not_run(tmp_path):
    report = build_report(get_study("gpu-paper"), tmp_path)
    assert all(r["verdict"] == "not run" and "not run here" in r["reason"] for r in report["rows"])
    assert report["expected_hours"]


def test_commit_records_is_refused_naming_the_script(tmp_path, capsys):
    """The library runs no git: `claims --commit-records` (which committed each record) is refused before anything is
    trained or written, naming the script that commits records as they finish."""
    args = ["--out-dir", str(tmp_path / "out"), "--run-root", str(tmp_path / "runs"), "--data-dir", str(tmp_path)]
    assert main(["claims", "--protocol", "toy-converged", "--commit-records", *args]) == 2
    err = capsys.readouterr().err
    assert "--commit-records was removed" in err and "benchmarks/commit_records.sh" in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "runs").exists()


def test_plan_lists_the_runs_and_their_records_and_trains_nothing(tmp_path, capsys):
    """`claims --protocol smoke --plan` once trained the whole protocol; now it prints each run with its state:
    a record with the planned settings is done, one with other settings stale (naming the setting), none to run."""
    from study_helpers import write_record

    smoke = get_study("smoke")
    cell = smoke.cells[0]
    (variant, seed), (variant2, seed2) = list(cell.units())[:2]
    out = tmp_path / "out"
    write_record(out, smoke, cell.name, variant, seed, {"test/perplexity": 100.0})
    stale = write_record(out, smoke, cell.name, variant2, seed2, {"test/perplexity": 100.0})
    rec = json.loads(stale.read_text())
    rec["config"]["lr"] = 9.0
    stale.write_text(json.dumps(rec))
    args = ["claims", "--protocol", "smoke", "--plan", "--out-dir", str(out), "--run-root", str(tmp_path / "runs")]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    n = sum(len(list(c.units())) for c in smoke.cells)
    assert lines[0] == f"protocol smoke: {smoke.description}"
    assert lines[1] == f"  [cells] {cell.name} {variant} seed {seed} lr 0.002 max_steps 6 (done)"
    assert lines[2] == (
        f"  [cells] {cell.name} {variant2} seed {seed2} lr 0.002 max_steps 6 (stale: made with other settings "
        "(lr: 9.0 vs 0.002); to run)"
    )
    assert f"{n} runs: 1 done, 1 stale, {n - 2} to run" in lines
    assert not (tmp_path / "runs").exists()
