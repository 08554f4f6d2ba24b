"""Converged studies: the plan's rules on synthetic records, the toy instance end to end, the report recomputed
independently from the records, and the committed GPU configs generated from the design."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coupled_qk.studies.converged import (
    CPU_CONVERGED,
    CPU_CONVERGED_PUBMED,
    GPU_60M,
    TOY_CONVERGED,
    standalone_configs,
    study,
)
from coupled_qk.study.grid import plateaued

D = CPU_CONVERGED


def grid_name(design, lr: float) -> str:
    return f"{design.name}-grid-lr{lr:g}"


def plan(design, records):
    return study(design).plan(records)


def _rec(loss, stop="patience", curve=None, tokens=2_400_000, epochs=8.0):
    return {
        "best": {"metric": "valid/loss", "value": loss, "tokens": tokens},
        "final": {"valid/loss": loss},
        "stop_reason": stop,
        "curve": {"valid": curve or []},
        "tokens": tokens,
        "epochs": epochs,
    }


def _grid(losses: dict, stop="patience") -> dict:
    """records for the base grid: losses[variant][lr]"""
    out = {}
    for v, by_lr in losses.items():
        for lr, loss in by_lr.items():
            out[(grid_name(D, lr), v, D.reserve_seed)] = _rec(loss, stop)
    return out


def test_grid_first_then_verdict_stages_at_each_variants_own_rate():
    p = plan(D, {})
    assert [s for s, _ in p.cells] == ["grid"] * 3 and p.waiting and p.epochs is None
    interior = {
        "standard": {1e-3: 3.2, 2e-3: 3.1, 4e-3: 3.3},
        "coupled": {1e-3: 3.3, 2e-3: 3.05, 4e-3: 3.2},
        "uncoupled_mlp": {1e-3: 3.4, 2e-3: 3.1, 4e-3: 3.15},
    }
    p = plan(D, _grid(interior))
    assert p.chosen_lr == {"standard": 2e-3, "coupled": 2e-3, "uncoupled_mlp": 2e-3} and p.epochs == 8.0
    stages = {s: c for s, c in p.cells if s != "grid"}
    assert stages["main"].variants == ("standard", "coupled") and stages["main"].seeds == tuple(range(10))
    assert stages["main"].variant_base == {"standard": {"lr": 2e-3}, "coupled": {"lr": 2e-3}}
    assert stages["matched"].base["max_tokens"] == round(8.0 * 2.4 * D.budget.train_tokens)
    assert stages["uncoupled"].variants == ("uncoupled_mlp",)
    # fresh data: standard on 2.4x the training articles (a superset), same valid/test, 2.4x the tokens
    fresh = stages["fresh"]
    assert [s for s, _ in p.cells][-1] == "fresh" and fresh.variants == ("standard", "coupled")
    assert fresh.seeds == (0, 1, 2, 3)
    assert fresh.split == {**D.budget.split, "train_fraction": 0.6} and fresh.base["corpus"] != D.budget.base["corpus"]
    assert fresh.base["max_tokens"] == stages["matched"].base["max_tokens"]
    assert fresh.base["eval_interval"] == round(2.4 * D.budget.eval_interval())
    assert fresh.variant_base == {"standard": {"lr": 2e-3}, "coupled": {"lr": 2e-3}}


def test_an_edge_optimum_adds_the_next_rate_once_and_waits_for_it():
    edge = {
        "standard": {1e-3: 3.2, 2e-3: 3.1, 4e-3: 3.3},
        "coupled": {1e-3: 3.3, 2e-3: 3.2, 4e-3: 3.0},
        "uncoupled_mlp": {1e-3: 3.0, 2e-3: 3.1, 4e-3: 3.15},
    }
    recs = _grid(edge)
    p = plan(D, recs)
    extra = {c.name: c.variants for s, c in p.cells[3:]}
    assert extra == {grid_name(D, 5e-4): ("uncoupled_mlp",), grid_name(D, 8e-3): ("coupled",)}
    assert p.waiting and not p.chosen_lr
    recs[(grid_name(D, 8e-3), "coupled", 100)] = _rec(2.9)
    recs[(grid_name(D, 5e-4), "uncoupled_mlp", 100)] = _rec(3.05)
    p = plan(D, recs)
    # coupled's best is now 8e-3, at the new edge: no second extension; uncoupled keeps 1e-3
    assert p.chosen_lr == {"standard": 2e-3, "coupled": 8e-3, "uncoupled_mlp": 1e-3}
    assert len([1 for s, _ in p.cells if s == "grid"]) == 5


def test_a_two_variant_design_without_matched_or_fresh_seeds_plans_only_its_main_stage(tmp_path):
    P = CPU_CONVERGED_PUBMED
    assert plan(P, {}).waiting == ["main: wait for the learning-rate grid"]
    recs = {}
    for lr, (ls, lc) in {1e-3: (3.2, 3.3), 2e-3: (3.1, 3.0), 4e-3: (3.3, 3.2)}.items():
        for v, loss in (("standard", ls), ("coupled", lc)):
            recs[(grid_name(P, lr), v, P.reserve_seed)] = _rec(loss)
    p = plan(P, recs)
    assert [s for s, _ in p.cells] == ["grid"] * 3 + ["main"] and p.chosen_lr == {"standard": 2e-3, "coupled": 2e-3}
    main = p.cells[-1][1]
    assert main.claims == ("C9",) and main.split["source"] == "pubmed" and main.seeds == tuple(range(10))
    # its report: C9 from the records, no C3/C4/C6 rows
    from study_helpers import write_record

    from coupled_qk.studies import get_study
    from coupled_qk.study.report import build_report

    for (cell, v, s), r in [*recs.items(), *(((main.name, v, s), _rec(3.0)) for v in P.variants for s in (0, 1, 2))]:
        ppl = 150.0 * (1 + 0.01 * s) * (0.99 if v == "coupled" else 1.0)
        fields = {k: x for k, x in r.items() if k != "final"}
        write_record(tmp_path, study(P), cell, v, s, {**r["final"], "test/perplexity": ppl}, records=recs, **fields)
    report = build_report(study(P), tmp_path, get_study)
    assert [r["claim"] for r in report["claims"]] == ["C9"] and report["main_claim"] == "C9"
    assert report["claims"][0]["mean"] == pytest.approx(-1.0) and report["claims"][0]["n"] == 3
    assert set(report["curves"]) == {"standard", "coupled"}


def test_horizon_grows_when_a_chosen_run_did_not_plateau():
    interior = {v: {1e-3: 3.2, 2e-3: 3.1, 4e-3: 3.3} for v in D.variants}
    recs = _grid(interior)
    key = (grid_name(D, 2e-3), "coupled", 100)
    # still falling 2% over the last half epoch, and stopped by the budget
    curve = [[t, 3.9 - 0.96 * t / 2_400_000] for t in range(75_000, 2_400_001, 75_000)]
    recs[key] = _rec(curve[-1][1], stop="completed", curve=curve)
    assert not plateaued(recs[key])
    assert plan(D, recs).epochs == D.budget.long_epochs


def test_plateau_rule():
    flat = [[t, 3.0 + (0.001 if t > 2_250_000 else 0.0)] for t in range(75_000, 2_400_001, 75_000)]
    assert plateaued(_rec(3.0, stop="completed", curve=flat))
    assert plateaued(_rec(3.0, stop="patience"))
    assert not plateaued(_rec(3.0, stop="completed", curve=[]))


def test_committed_gpu_configs_come_from_the_design():
    root = Path(__file__).resolve().parents[2]
    for name, cfg in standalone_configs(GPU_60M).items():
        assert json.loads((root / "configs" / name).read_text()) == cfg, name
    cfg = standalone_configs(GPU_60M)["wt103-60m-coupled.json"]
    assert cfg["best_metric"] == "valid/loss" and cfg["patience"] == 4 and cfg["full_eval"]
    assert cfg["max_tokens"] == round(GPU_60M.budget.epochs * GPU_60M.budget.train_tokens)


def _cli(*args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one thread, as the in-process re-run below: same reductions
    return subprocess.run(
        [sys.executable, "-m", "coupled_qk.cli", "claims", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=1200,
        env=env,
    )


def test_gpu_plan_mode_trains_nothing_and_checks_the_data(tmp_path):
    res = _cli(
        "--protocol", "gpu-60m", "--plan", "--data-dir", str(tmp_path), "--out-dir", str(tmp_path / "o"), cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr
    assert "[grid] gpu-60m-grid-lr0.0006 coupled seed 100" in res.stdout
    assert "MISSING wiki.train.tokens" in res.stdout and "cost estimate" in res.stdout
    assert not (tmp_path / "o").exists()
    res = _cli("--protocol", "gpu-60m", "--data-dir", str(tmp_path), "--out-dir", str(tmp_path / "o"), cwd=tmp_path)
    assert res.returncode != 0 and "needs a GPU" in res.stderr


@pytest.mark.slow
def test_toy_instance_end_to_end_and_report_recomputed_from_records(tmp_path):
    out, runs = tmp_path / "out", tmp_path / "runs"
    res = _cli(
        "--protocol", "toy-converged", "--out-dir", str(out), "--run-root", str(runs), "--no-figures", cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((out / "toy-converged.json").read_text())
    assert all(c["done"] == c["planned"] for c in report["progress"].values())
    recs = {}
    for path in (out / "runs" / "toy-converged").glob("*/*/seed*.json"):
        r = json.loads(path.read_text())
        recs[(r["cell"], r["variant"], r["seed"])] = r
        assert r["best"]["metric"] == "valid/loss" and r["final_from"].startswith("best-")
    # C1 recomputed independently: mean of the per-seed relative changes of test perplexity
    main = "toy-converged-main"
    d = [
        100
        * (
            recs[(main, "coupled", s)]["final"]["test/perplexity"]
            / recs[(main, "standard", s)]["final"]["test/perplexity"]
            - 1
        )
        for s in TOY_CONVERGED.seeds
    ]
    c1 = next(c for c in report["claims"] if c["claim"] == "C1")
    assert c1["mean"] == pytest.approx(sum(d) / len(d)) and c1["n"] == 3
    sd = math.sqrt(sum((x - c1["mean"]) ** 2 for x in d) / 2)
    assert c1["high"] - c1["mean"] == pytest.approx(4.302653 * sd / math.sqrt(3), rel=1e-5)  # t_{0.975, 2}
    # C6 with fresh data, recomputed from the raw records: total test nats over the 1x tokenizer's test tokens
    fresh = "toy-converged-fresh"
    d = [
        100
        * (
            recs[(main, "coupled", s)]["final"]["test/perplexity"]
            / math.exp(
                recs[(fresh, "standard", s)]["final"]["test/nll"] / recs[(main, "coupled", s)]["final"]["test/n_tokens"]
            )
            - 1
        )
        for s in TOY_CONVERGED.fresh_seeds
    ]
    c6f = next(c for c in report["claims"] if c["claim"] == "C6-fresh")
    assert c6f["n"] == 2 and c6f["mean"] == pytest.approx(sum(d) / len(d))
    assert (
        recs[(fresh, "standard", 0)]["data"]["tokens"]["train"]
        > 2 * recs[(main, "standard", 0)]["data"]["tokens"]["train"]
    )
    # each run of the main stage used its variant's chosen rate
    for (cell, v, _), r in recs.items():
        if cell == main:
            assert r["config"]["lr"] == report["chosen_lr"][v]
    # `claims --verify`: the run of one record re-trained from scratch in a fresh folder matches it exactly
    rec_path = out / "runs" / "toy-converged" / main / "coupled" / "seed1.json"
    res = _cli(
        "--protocol",
        "toy-converged",
        "--verify",
        str(rec_path),
        "--run-root",
        str(runs),
        "--tolerance",
        "0",
        cwd=tmp_path,
    )
    assert res.returncode == 0 and "MATCH: test/loss differs by +0" in res.stdout, res.stdout + res.stderr[-2000:]
    rows = {line[:27].strip(): line[27:].split() for line in res.stdout.splitlines()}
    assert rows["initial weights (sha256)"][2] == "equal" and ("host" in rows or "host (re-run)" in rows)
    assert (runs / "verify" / "toy-converged" / main / "coupled" / "seed1").is_dir()
    # a record whose stored loss is off is caught (the verified run folder is reused, nothing retrained)
    tampered = json.loads(rec_path.read_text())
    tampered["final"]["test/loss"] += 0.01
    rec_path.write_text(json.dumps(tampered))
    res = _cli("--protocol", "toy-converged", "--verify", str(rec_path), "--run-root", str(runs), cwd=tmp_path)
    assert res.returncode == 1 and "MISMATCH: test/loss differs by -0.01" in res.stdout, res.stdout + res.stderr
    assert "the initial weights are bitwise the same (SHA-256)" in res.stdout


def test_verify_refuses_what_is_not_a_record_of_the_protocol(tmp_path, capsys):
    from coupled_qk.cli import main

    good = tmp_path / "out" / "runs" / "toy-converged" / "toy-converged-main" / "coupled" / "seed1.json"
    good.parent.mkdir(parents=True)
    good.write_text(
        json.dumps(
            {"protocol": "toy-converged", "cell": "toy-converged-main", "variant": "coupled", "seed": 1, "final": {}}
        )
    )
    moved = tmp_path / "seed1.json"
    moved.write_text(good.read_text())
    (tmp_path / "bad.json").write_text("{")
    cases = [
        (["--verify", str(tmp_path / "none.json")], "no such record file"),
        (["--verify", str(good.parent)], "is a folder; expected one run record file"),
        (["--verify", str(tmp_path / "bad.json")], "is not a JSON run record"),
        (["--verify", str(moved)], "must stay where the study wrote it"),
        (["--verify", str(good), "--plan"], "--plan cannot be combined"),
        (["--verify", str(good), "--tolerance", "-1"], "--tolerance"),
        (["--verify", str(good), "--protocol", "cpu"], "not of --protocol 'cpu'"),
    ]
    for extra, message in cases:
        args = ["claims", "--protocol", "toy-converged", "--run-root", str(tmp_path / "runs"), *extra]
        if "--protocol" in extra:
            args = ["claims", "--run-root", str(tmp_path / "runs"), *extra]
        try:
            code = main(args)
        except SystemExit as exc:  # argparse's own type errors
            code = exc.code
        err = capsys.readouterr().err
        assert code == 2 and message in err and "Traceback" not in err, (extra, err)
    assert not (tmp_path / "runs").exists()


def test_a_run_held_by_another_process_is_left_to_it(tmp_path):
    """Parallel workers on one study: the first grid run's folder is locked (as by a second process), so this
    worker trains the next run of the plan and writes no record for the held one."""
    from coupled_qk.data.paths import default_cache_dir, default_data_dir
    from coupled_qk.study.records import record_path, variant_tag
    from coupled_qk.study.run import Places, run_study
    from coupled_qk.training.run_folder import RunFolder

    out, runs = tmp_path / "out", tmp_path / "runs"
    first = grid_name(TOY_CONVERGED, TOY_CONVERGED.lrs[0])
    held = runs / TOY_CONVERGED.name / first / variant_tag("standard") / "seed100"
    held.mkdir(parents=True)
    places = Places(out, runs, default_data_dir(), default_cache_dir() / "claims-data")
    with RunFolder(held).lock():
        n = run_study(study(TOY_CONVERGED), places, max_runs=1)
    assert n == 1
    assert not record_path(out, TOY_CONVERGED.name, first, "standard", 100).exists()
    assert record_path(out, TOY_CONVERGED.name, first, "coupled", 100).is_file()


def test_a_worker_leaves_when_only_held_runs_remain_and_no_stage_waits(tmp_path, monkeypatch):
    """The last runs of a study are in other processes' hands and nothing else can be planned: return at once
    instead of polling (a worker started as `claims A; claims B` moves on to B); while a stage still waits on
    held runs (the grid), it polls."""
    import dataclasses
    import time

    import coupled_qk.study.run as study_run
    from coupled_qk.study.design import Cells
    from coupled_qk.study.run import Places
    from coupled_qk.training.lock import RunLockedError

    def held(*args, **kwargs):
        raise RunLockedError("held by pid 1")

    toy = study(TOY_CONVERGED)
    places = Places(tmp_path, tmp_path, tmp_path, tmp_path)
    cell = toy.plan({}).cells[0][1]
    static = dataclasses.replace(toy, stages=(Cells((cell,)),))  # its runs planned, no stage waiting
    monkeypatch.setattr(study_run, "run_unit", held)
    monkeypatch.setattr(time, "sleep", lambda s: pytest.fail("polled although nothing waits"))
    assert study_run.run_study(static, places, wait_seconds=1e6) == 0

    def stop(seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", stop)
    assert toy.plan({}).waiting  # the grid's runs are held, and the main stage waits on them
    with pytest.raises(KeyboardInterrupt):  # it would poll again
        study_run.run_study(toy, places, wait_seconds=1e6)


@pytest.mark.slow
def test_a_design_runs_under_torchrun_and_records_the_one_process_run(tmp_path):
    """`claims --protocol toy-converged` under torchrun (2 CPU processes, gloo): the ranks train each run together
    with the global batch split between them, rank 0 writes the records and the report, and a record matches
    the same run trained by one process (same global batches; float summation order aside)."""
    out, runs = tmp_path / "out", tmp_path / "runs"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "coupled_qk.cli",
        "claims",
        "--protocol",
        "toy-converged",
        "--out-dir",
        str(out),
        "--run-root",
        str(runs),
        "--no-figures",
        "--max-runs",
        "2",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=900, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    recs = sorted((out / "runs" / "toy-converged").glob("*/*/seed*.json"))
    assert len(recs) == 2 and (out / "toy-converged.json").is_file()
    rec = json.loads(recs[0].read_text())
    assert rec["config"]["batch_size"] == TOY_CONVERGED.budget.base["batch_size"]  # the global batch, as one process
    results = json.loads((Path(rec["run_dir"]) / "results.json").read_text())
    assert results["world_size"] == 2

    from coupled_qk.data.paths import default_cache_dir
    from coupled_qk.training.loop import train

    cell = next(c for _, c in plan(TOY_CONVERGED, {}).cells if c.name == rec["cell"])
    again = train(cell.config(rec["variant"], rec["seed"], tmp_path / "one", default_cache_dir() / "claims-data"))
    assert again["final"]["test/loss"] == pytest.approx(rec["final"]["test/loss"], abs=1e-4)


@pytest.mark.slow
def test_the_gpu_protocol_at_toy_size_runs_on_a_cpu(tmp_path):
    """`toy-gpu-60m` is `gpu-60m` with toy budgets (same corpus layout, GPT-2 BPE, grid and stages): on a small
    WikiText-103-layout folder it plans, trains the first grid runs, records and reports, on a CPU."""
    from coupled_qk.data.paths import default_data_dir
    from coupled_qk.studies.converged import TOY_GPU_60M

    assert {
        k: v
        for k, v in TOY_GPU_60M.budget.base.items()
        if k
        not in (
            "preset",
            "batch_size",
            "warmup_steps",
            "eval_batches",
            "log_interval",
            "patience",
            "dtype",
            "compile",
            "checkpoint_minutes",
            "model",
        )
    } == {
        k: v
        for k, v in GPU_60M.budget.base.items()
        if k
        not in (
            "preset",
            "batch_size",
            "warmup_steps",
            "eval_batches",
            "log_interval",
            "patience",
            "dtype",
            "compile",
            "checkpoint_minutes",
        )
    }
    lines = (default_data_dir() / "wikitext-2" / "valid.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    data = tmp_path / "data"
    (data / "wikitext-103").mkdir(parents=True)
    for name, part in (("train", lines[:60]), ("valid", lines[60:90]), ("test", lines[90:120])):
        (data / "wikitext-103" / f"wiki.{name}.tokens").write_text("".join(part), encoding="utf-8")
    (data / "tokenizer").symlink_to(default_data_dir() / "tokenizer")
    out, runs = tmp_path / "out", tmp_path / "runs"
    plan = _cli("--protocol", "toy-gpu-60m", "--plan", "--data-dir", str(data), "--out-dir", str(out), cwd=tmp_path)
    assert plan.returncode == 0 and "[grid] toy-gpu-60m-grid-lr0.001 coupled seed 100" in plan.stdout, plan.stderr
    res = _cli(
        "--protocol",
        "toy-gpu-60m",
        "--data-dir",
        str(data),
        "--out-dir",
        str(out),
        "--run-root",
        str(runs),
        "--max-runs",
        "2",
        "--no-figures",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    recs = [json.loads(p.read_text()) for p in (out / "runs" / "toy-gpu-60m").glob("*/*/seed*.json")]
    assert len(recs) == 2 and all(
        r["config"]["corpus"] == "wikitext-103" and r["config"]["tokenizer"] == "gpt2" for r in recs
    )
    assert (out / "toy-gpu-60m.json").is_file()


def test_a_claim_may_bind_arms_of_another_study(tmp_path):
    """A difference of two paired changes across studies (the size interaction of C1 is one: cpu-converged-small's
    change minus cpu-converged's, Welch's interval, the sizes unpaired) is one more claim in a recipe: here
    PubMed's coupled-vs-standard change minus wiki-vital's, over the committed records, recomputed from the record
    files and scipy's Welch interval."""
    import dataclasses
    import shutil

    from scipy import stats as st
    from study_helpers import COMMANDS

    from coupled_qk.studies import get_study
    from coupled_qk.study.claims import Arm, ChangeDifference, Claim
    from coupled_qk.study.report import build_report, format_markdown

    root = Path(__file__).resolve().parents[2] / "docs" / "results" / "claims" / "runs"
    changes = {}
    for name in ("cpu-converged", "cpu-converged-pubmed"):
        shutil.copytree(root / name, tmp_path / "runs" / name)
        per_seed = {}
        for path in (root / name / f"{name}-main").glob("*/seed*.json"):
            rec = json.loads(path.read_text())
            per_seed.setdefault(rec["seed"], {})[rec["variant"]] = rec["final"]["test/perplexity"]
        changes[name] = [100 * (v["coupled"] / v["standard"] - 1) for _, v in sorted(per_seed.items())]
    tiny = (
        Arm("cpu-converged-main", "standard", "cpu-converged"),
        Arm("cpu-converged-main", "coupled", "cpu-converged"),
    )
    pubmed = (Arm("cpu-converged-pubmed-main", "standard"), Arm("cpu-converged-pubmed-main", "coupled"))
    test = ChangeDifference(tiny, pubmed, "C9 minus C1, percentage points (Welch)", paired=False)
    base = get_study("cpu-converged-pubmed")
    s = dataclasses.replace(base, claims=(*base.claims, Claim("C9-C1", "", "", test)))
    row = build_report(s, tmp_path, get_study)["claims"][-1]
    ref = st.ttest_ind(changes["cpu-converged-pubmed"], changes["cpu-converged"], equal_var=False)
    ci = ref.confidence_interval(0.95)
    diff = sum(changes["cpu-converged-pubmed"]) / 10 - sum(changes["cpu-converged"]) / 10
    assert row["mean"] == pytest.approx(diff) and (row["low"], row["high"]) == (
        pytest.approx(ci.low),
        pytest.approx(ci.high),
    )
    assert row["n_pairs"] == [10, 10] and row["status"] == "complete" and row["p"] == pytest.approx(ref.pvalue)
    assert "| C9-C1 | C9 minus C1, percentage points (Welch) |" in format_markdown(
        s, build_report(s, tmp_path, get_study), COMMANDS
    )
