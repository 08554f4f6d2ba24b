"""``coupled-qk glue`` as a study: ``--max-minutes`` (skipped, interrupted and resumed fine-tunes, a summary over
the finished seeds only), ``--dry-run`` (the plan, nothing created) and ``--compile`` (recorded, same scores)."""

import dataclasses
import json
import math
import types

import pytest
from test_glue_task import make_pretrained, write_sst2  # tests/training is on sys.path (rootdir conftest)

from coupled_qk.cli import main
from coupled_qk.study import executor as runner
from coupled_qk.training import loop

T_975_1 = 12.706204736174698  # Student t quantile, 0.975, 1 degree of freedom (two seeds)


@pytest.fixture
def study(tmp_path):
    a = make_pretrained(tmp_path / "standard" / "seed0")
    b = make_pretrained(tmp_path / "coupled" / "seed0", attention="coupled")
    glue_dir = write_sst2(tmp_path / "glue", n_train=32, n_dev=16)
    out = tmp_path / "out"
    args = [
        str(a),
        str(b),
        "--task",
        "sst2",
        "--glue-dir",
        str(glue_dir),
        "--epochs",
        "1",
        "--batch-size",
        "16",
        "--lr",
        "1e-3",
        "--out-dir",
        str(out),
        "--no-progress",
        "--dtype",
        "fp32",
        "--device",
        "cpu",
    ]
    return args, out


def test_max_minutes_stops_one_run_skips_the_rest_and_the_summary_counts_finished_seeds(study, monkeypatch, capsys):
    """Before: glue had no --max-minutes, and its summary read every run's ``final`` (a skipped run has none)."""
    args, out = study
    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(runner, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    real_train = loop.train

    def guarded_train(cfg):  # the study's clock runs out during coupled seed 1: that run stops after one step
        assert cfg.max_minutes is not None  # the guard reached the run
        if cfg.out_dir.endswith("coupled/sst2/seed1"):
            results = real_train(dataclasses.replace(cfg, max_minutes=1e-9))
            clock.now += 3600.0
            return results
        return real_train(cfg)

    monkeypatch.setattr(loop, "train", guarded_train)
    seeds = ["--seeds", "0,1,2"]
    assert main(["glue", *args, *seeds, "--max-minutes", "5"]) == 0
    printed = capsys.readouterr().out
    assert "coupled sst2 seed 2: skipped (--max-minutes 5.0 reached)" in printed and "interrupted 1" in printed
    summary = json.loads((out / "results.json").read_text())
    assert summary["complete"] is False and summary["counts"] == {"ran": 4, "interrupted": 1, "skipped": 1}
    cell = summary["models"]["coupled"]["tasks"]["sst2"]
    assert [r["seed"] for r in cell["runs"]] == [0] and cell["complete"] is False
    assert [(m["seed"], m["status"]) for m in cell["missing"]] == [(1, "interrupted"), (2, "skipped")]
    acc = cell["runs"][0]["dev"]["accuracy"]
    assert cell["metrics"]["accuracy"] == {
        "mean": acc,
        "std": 0.0,
        "min": acc,
        "max": acc,
        "ci95": None,
        "n": 1,
        "values": [acc],
    }
    base = [r["dev"]["accuracy"] for r in summary["models"]["standard"]["tasks"]["sst2"]["runs"]]
    assert len(base) == 3 and summary["models"]["standard"]["tasks"]["sst2"]["metrics"]["accuracy"]["n"] == 3
    diff = summary["differences"]["coupled"]["sst2"]["accuracy"]  # paired over seed 0 only
    assert diff["seeds"] == [0] and diff["n"] == 1 and diff["mean"] == pytest.approx(acc - base[0])
    assert diff["ci95"] is None
    table = (out / "results.md").read_text()
    assert f"| coupled | {100 * acc:.1f} (n=1) |" in table and "(n=1) |" in table.split("| coupled − standard |")[1]
    assert "Incomplete: coupled sst2 (seed 1: interrupted, seed 2: skipped)" in table
    interrupted = out / "coupled" / "sst2" / "seed1"
    assert (interrupted / "results.interrupted.json").is_file() and not (interrupted / "results.json").exists()

    monkeypatch.setattr(loop, "train", real_train)  # the dry run reads the folders only
    assert main(["glue", *args, *seeds, "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert f"coupled sst2 seed 1 -> {interrupted}: resume (resuming from its checkpoint at step 1)" in plan
    assert f"coupled sst2 seed 2 -> {out / 'coupled' / 'sst2' / 'seed2'}: new" in plan
    assert "6 runs: 4 reuse, 1 resume, 1 new" in plan

    assert main(["glue", *args, *seeds]) == 0  # no guard: the interrupted run resumes, the skipped one runs
    printed = capsys.readouterr().out
    assert "resuming from its checkpoint at step 1" in printed and printed.count("reusing the finished run") == 4
    summary = json.loads((out / "results.json").read_text())
    assert summary["complete"] is True and "Incomplete" not in (out / "results.md").read_text()
    cell = summary["models"]["coupled"]["tasks"]["sst2"]
    assert [r["seed"] for r in cell["runs"]] == [0, 1, 2] and cell["missing"] == []
    assert json.loads((interrupted / "results.json").read_text())["steps"] == 2  # resumed to its full budget
    assert cell["metrics"]["accuracy"]["n"] == 3 and summary["differences"]["coupled"]["sst2"]["accuracy"]["n"] == 3


def test_a_study_with_no_finished_run_writes_an_honest_table(study, capsys):
    args, out = study
    assert main(["glue", *args, "--seeds", "0,1", "--max-minutes", "0.001"]) == 0  # 0.06 s: nothing starts
    summary = json.loads((out / "results.json").read_text())
    assert summary["counts"] == {"skipped": 4} and summary["complete"] is False
    assert summary["models"]["standard"]["tasks"]["sst2"]["metrics"]["accuracy"] is None
    assert summary["differences"]["coupled"]["sst2"]["accuracy"] is None
    table = (out / "results.md").read_text()
    assert "| majority class | - |" in table and "| standard | - |" in table and "| coupled − standard | - |" in table
    assert "standard sst2 (seed 0: skipped, seed 1: skipped)" in table
    assert not (out / "standard" / "sst2").exists()  # skipped runs leave no folder


def test_dry_run_prints_the_plan_and_creates_nothing(study, capsys):
    args, out = study
    assert main(["glue", *args, "--seeds", "0,1", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"coupled-qk glue: 4 fine-tunes (2 models x 1 tasks x 2 seeds) -> {out}"
    assert lines[1:] == [
        f"  {m} sst2 seed {s} -> {out / m / 'sst2' / f'seed{s}'}: new" for m in ("standard", "coupled") for s in (0, 1)
    ] + ["  4 runs: 4 new"]
    assert not out.exists()
    assert main(["glue", *args, "--seeds", "0", "--names", "a", "--dry-run"]) == 2  # inputs checked as without it
    assert "--names=['a']: need one distinct name per pretrained run (2)" in capsys.readouterr().err


def test_dry_run_names_a_finished_run_with_other_settings(study, capsys):
    args, out = study
    one = [args[0], *args[2:]]  # the standard model only
    assert main(["glue", *one, "--seeds", "0"]) == 0
    changed = [x if x != "1e-3" else "2e-3" for x in one]
    capsys.readouterr()
    assert main(["glue", *changed, "--seeds", "0,1", "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert f"{out / 'standard' / 'sst2' / 'seed0'}: refused: different settings (lr: 0.001 vs 0.002)" in plan
    assert "2 runs: 1 refused, 1 new" in plan


def test_compile_is_recorded_and_scores_as_eager(study, monkeypatch, capsys):
    """``glue --compile``: train's flag (regional torch.compile, eager fallback) reaches every fine-tune's config;
    the compiled fine-tune (aot_eager backend: dynamo's graphs without inductor's codegen, to stay cheap) scores
    as the eager one."""
    import functools

    from coupled_qk.models import compiled as compiled_module
    from coupled_qk.training import model_setup

    args, out = study
    one = [args[0], *args[2:], "--seeds", "0"]
    monkeypatch.setattr(
        model_setup, "compile_regions", functools.partial(compiled_module.compile_regions, backend="aot_eager")
    )
    assert main(["glue", *one, "--compile"]) == 0
    eager_out = out.parent / "eager"
    assert main(["glue", *[x if x != str(out) else str(eager_out) for x in one]]) == 0
    run = "standard/sst2/seed0/results.json"
    compiled, eager = (json.loads((d / run).read_text()) for d in (out, eager_out))
    assert compiled["config"]["compile"] is True and eager["config"]["compile"] is False
    assert compiled["compile"]["compiled"] is True and compiled["compile"]["error"] is None
    assert json.loads((out / "results.json").read_text())["settings"]["sst2"]["compile"] is True
    for key in ("dev/accuracy", "dev/loss"):
        assert math.isclose(compiled["final"][key], eager["final"][key], rel_tol=1e-4, abs_tol=1e-6), key
