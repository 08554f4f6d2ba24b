"""The smoke claims protocol end to end: report structure, and verdicts that follow the measured numbers."""

import json
import shutil

import pytest

from coupled_qk.cli import main
from coupled_qk.experiments.claims.protocols import get_protocol
from coupled_qk.experiments.claims.report import build_report
from coupled_qk.experiments.claims.rules import VERDICTS


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """Run the smoke protocol once (module scope) on synthetic data; return its output folder."""
    import _pytest.monkeypatch

    tmp = tmp_path_factory.mktemp("claims")
    mp = _pytest.monkeypatch.MonkeyPatch()
    from conftest import build_mini_data

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
    protocol = get_protocol("smoke")
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
    report = build_report(get_protocol("gpu-paper"), tmp_path)
    assert all(r["verdict"] == "not run" and "not run here" in r["reason"] for r in report["rows"])
    assert report["expected_hours"]


@pytest.mark.parametrize("flag", [["--max-runs", "1"], ["--commit-records"]])
def test_converged_only_flags_are_refused_not_ignored(flag, tmp_path, capsys):
    """A flag of the converged protocols is an error (exit 2, naming it) on the others, before anything is
    trained or written."""
    assert (
        main(
            [
                "claims",
                "--protocol",
                "smoke",
                *flag,
                "--out-dir",
                str(tmp_path / "out"),
                "--run-root",
                str(tmp_path / "runs"),
                "--data-dir",
                str(tmp_path / "nodata"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert f"{flag[0]} applies only to the converged protocols" in err and "toy-converged" in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "runs").exists()


def test_plan_lists_the_runs_and_their_records_and_trains_nothing(tmp_path, capsys):
    """`claims --protocol smoke --plan` once trained the whole protocol; now it prints each run with its state:
    a record with the planned settings is done, one with other settings stale, none to run."""
    import json

    from coupled_qk.experiments.claims.runs import record_path, settings_of, train_config

    protocol = get_protocol("smoke")
    cell = protocol.cells[0]
    (variant, seed), (variant2, seed2) = list(cell.units())[:2]
    out = tmp_path / "out"
    cfg = train_config(cell, variant, seed, tmp_path / "r", tmp_path / "d")
    for (v, s), settings in (((variant, seed), settings_of(cfg)), ((variant2, seed2), {**settings_of(cfg), "lr": 9.0})):
        path = record_path(out, "smoke", cell.name, v, s)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"config": settings}))
    args = ["claims", "--protocol", "smoke", "--plan", "--out-dir", str(out), "--run-root", str(tmp_path / "runs")]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    n = sum(len(list(c.units())) for c in protocol.cells)
    assert lines[0] == f"protocol smoke: {n} runs (1 done, 1 stale, {n - 2} to run)"
    assert lines[1] == f"  {cell.name} {variant} seed {seed} (done)"
    assert lines[2] == f"  {cell.name} {variant2} seed {seed2} (stale)"
    assert not (tmp_path / "runs").exists()
