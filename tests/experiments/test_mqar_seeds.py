"""MQAR sweeps over several seeds: per-cell mean and 95% interval, paired differences, resume, ``--seeds``."""

from __future__ import annotations

import json
import math
import shutil
import statistics

import pytest

from coupled_qk.experiments.mqar.report import best_over_lr, seed_cells, seed_table
from coupled_qk.experiments.mqar.sweep import check_seeds, plan_sweep

T_975_2 = 4.302652729911275  # Student t quantile, 0.975, 2 degrees of freedom (scipy.stats.t.ppf(0.975, 2))


def _rec(variant, lr, seed, acc, d=16, difficulty="easy"):
    return {
        "difficulty": difficulty,
        "variant": variant,
        "d_model": d,
        "lr": lr,
        "seed": seed,
        "accuracy": acc,
        "status": "ran",
    }


def test_seed_cells_and_table_match_a_hand_computation():
    # best over the two learning rates, per seed: standard 0.6, 0.8, 0.7; coupled 0.9, 0.8, 1.0
    records = [
        _rec("standard", 1e-3, 0, 0.6),
        _rec("standard", 2e-3, 0, 0.5),
        _rec("standard", 1e-3, 1, 0.3),
        _rec("standard", 2e-3, 1, 0.8),
        _rec("standard", 1e-3, 2, 0.7),
        _rec("standard", 2e-3, 2, 0.7),
        _rec("coupled", 1e-3, 0, 0.9),
        _rec("coupled", 2e-3, 0, 0.2),
        _rec("coupled", 1e-3, 1, 0.8),
        _rec("coupled", 2e-3, 1, 0.1),
        _rec("coupled", 1e-3, 2, 0.4),
        _rec("coupled", 2e-3, 2, 1.0),
    ]
    best = best_over_lr(records)
    assert [(b["variant"], b["seed"], b["accuracy"]) for b in best] == [
        ("standard", 0, 0.6),
        ("standard", 1, 0.8),
        ("standard", 2, 0.7),
        ("coupled", 0, 0.9),
        ("coupled", 1, 0.8),
        ("coupled", 2, 1.0),
    ]
    std, cpl = seed_cells(best)
    half = T_975_2 * 0.1 / math.sqrt(3)  # both samples have sd 0.1
    assert std["seeds"] == [0, 1, 2] and std["values"] == [0.6, 0.8, 0.7] and std["vs_reference"] is None
    assert (std["n"], std["mean"], std["low"], std["high"]) == pytest.approx((3, 0.7, 0.7 - half, 0.7 + half))
    assert (cpl["mean"], cpl["low"], cpl["high"]) == pytest.approx((0.9, 0.9 - half, 0.9 + half))
    diff = cpl["vs_reference"]  # coupled - standard, paired by seed: 0.3, 0.0, 0.3
    d_half = T_975_2 * statistics.stdev([0.3, 0.0, 0.3]) / math.sqrt(3)
    assert diff["reference"] == "standard" and diff["seeds"] == [0, 1, 2]
    assert (diff["n"], diff["mean"], diff["low"], diff["high"]) == pytest.approx((3, 0.2, 0.2 - d_half, 0.2 + d_half))
    lines = seed_table([std, cpl], [0, 1, 2], ["easy"]).splitlines()
    assert lines[0] == "| variant | easy d16 |"
    assert lines[2] == f"| standard | 0.700 [{0.7 - half:.3f}, {0.7 + half:.3f}] |"
    assert lines[3] == f"| coupled | 0.900 [{0.9 - half:.3f}, {0.9 + half:.3f}] |"
    assert lines[4] == f"| coupled − standard | +0.200 [{0.2 - d_half:+.3f}, {0.2 + d_half:+.3f}] |"


def test_cells_with_fewer_seeds_pair_only_shared_seeds_and_say_n():
    best = best_over_lr([_rec("standard", 1e-3, 0, 0.5), _rec("standard", 1e-3, 1, 0.7), _rec("coupled", 1e-3, 1, 0.9)])
    std, cpl = seed_cells(best)
    assert (cpl["n"], cpl["mean"], cpl["low"], cpl["high"]) == (1, 0.9, None, None)  # no interval from one seed
    assert cpl["vs_reference"]["seeds"] == [1] and cpl["vs_reference"]["mean"] == pytest.approx(0.2)
    table = seed_table([std, cpl], [0, 1])
    assert "| coupled | 0.900 (n=1) |" in table and "| coupled − standard | +0.200 (n=1) |" in table
    assert json.loads(json.dumps([std, cpl], allow_nan=False))  # no NaN in results.json


def test_plan_over_seeds_and_seed_errors():
    from test_mqar_sweep import _micro_preset

    preset = _micro_preset()
    plan = plan_sweep(preset, variants=["standard"], lrs=[1e-3], seeds=[3, 1])
    assert [p.seed for p in plan] == [3, 1]
    assert plan_sweep(preset)[0].seed == preset.seed
    for bad, message in (
        ([], "names no seed"),
        ([1, 1], r"repeats a seed"),
        ([-1], "seeds=-1"),
        ([2**32], "must be in"),
        ([True], "seeds=True"),
    ):
        with pytest.raises(ValueError, match=message):
            check_seeds(bad)


SMOKE = [
    "mqar",
    "--difficulties",
    "easy",
    "--d-models",
    "16",
    "--lrs",
    "1e-3",
    "--variants",
    "standard,coupled",
    "--max-steps",
    "3",
    "--train-examples",
    "40",
    "--test-examples",
    "8",
    "--batch-size",
    "8",
    "--device",
    "cpu",
    "--threads",
    "1",
    "--dtype",
    "fp32",
]


def test_smoke_sweep_over_seeds_resumes_and_reports_intervals(tmp_path, capsys):
    from coupled_qk.cli import main

    out = tmp_path / "sweep"
    assert main([*SMOKE, "--seeds", "0", "--out-dir", str(out)]) == 0  # a sweep stopped after its first seed
    capsys.readouterr()
    assert main([*SMOKE, "--seeds", "0,1,2", "--out-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("(reused)") == 2 and "ran 4, reused 2" in printed
    saved = json.loads((out / "results.json").read_text())
    assert saved["seeds"] == [0, 1, 2] and saved["counts"] == {"ran": 4, "reused": 2}
    assert saved["preset"]["difficulties"][0]["batch_size"] == 8
    acc = {}
    for run in saved["runs"]:
        run_dir = out / "easy" / run["variant"] / "d16" / "lr0.001" / f"seed{run['seed']}"
        assert run["run_dir"] == str(run_dir) and run["config"]["batch_size"] == 8 and run["config"]["dtype"] == "fp32"
        assert json.loads((run_dir / "config.json").read_text())["batch_size"] == 8
        assert json.loads((run_dir / "config.json").read_text())["seed"] == run["seed"]
        acc[run["variant"], run["seed"]] = json.loads((run_dir / "results.json").read_text())["final"]["valid/accuracy"]
    cells = {c["variant"]: c for c in saved["cells"]}
    for variant in ("standard", "coupled"):
        values = [acc[variant, s] for s in (0, 1, 2)]
        mean, sd = statistics.fmean(values), statistics.stdev(values)
        half = T_975_2 * sd / math.sqrt(3)
        assert cells[variant]["values"] == values
        assert (cells[variant]["mean"], cells[variant]["low"], cells[variant]["high"]) == pytest.approx(
            (mean, mean - half, mean + half)
        )
    diffs = [acc["coupled", s] - acc["standard", s] for s in (0, 1, 2)]
    assert cells["coupled"]["vs_reference"]["mean"] == pytest.approx(statistics.fmean(diffs))
    assert "| coupled − standard |" in saved["table"] and saved["table"] in printed
    # a sweep folder of the layout before seed folders (run in lr<lr>/) is continued, not trained again
    legacy = tmp_path / "legacy"
    assert main([*SMOKE, "--out-dir", str(legacy)]) == 0
    for variant in ("standard", "coupled"):
        lr_dir = legacy / "easy" / variant / "d16" / "lr0.001"
        for f in (lr_dir / "seed0").iterdir():
            shutil.move(str(f), lr_dir / f.name)
        (lr_dir / "seed0").rmdir()
    capsys.readouterr()
    assert main([*SMOKE, "--out-dir", str(legacy)]) == 0
    assert (
        "reused 2" in capsys.readouterr().out
        and not (legacy / "easy" / "standard" / "d16" / "lr0.001" / "seed0").exists()
    )


def test_compile_is_recorded_and_matches_eager(tmp_path, monkeypatch):
    """``mqar --compile``: train's flag (regional torch.compile, eager fallback) reaches every run's config; the
    compiled smoke run (aot_eager backend: dynamo's graphs without inductor's codegen, to stay cheap) reaches
    the eager run's accuracy."""
    import functools

    from coupled_qk.cli import main
    from coupled_qk.models import compiled as compiled_module
    from coupled_qk.training import model_setup

    monkeypatch.setattr(
        model_setup, "compile_regions", functools.partial(compiled_module.compile_regions, backend="aot_eager")
    )
    smoke = [x if x != "standard,coupled" else "coupled" for x in SMOKE]
    assert main([*smoke, "--compile", "--out-dir", str(tmp_path / "compiled")]) == 0
    assert main([*smoke, "--out-dir", str(tmp_path / "eager")]) == 0
    run = "easy/coupled/d16/lr0.001/seed0"
    compiled, eager = (json.loads((tmp_path / d / run / "results.json").read_text()) for d in ("compiled", "eager"))
    assert compiled["config"]["compile"] is True and eager["config"]["compile"] is False
    assert compiled["compile"]["compiled"] is True and compiled["compile"]["error"] is None
    saved = json.loads((tmp_path / "compiled" / "results.json").read_text())
    assert saved["runs"][0]["config"]["compile"] is True
    assert compiled["final"]["valid/accuracy"] == pytest.approx(eager["final"]["valid/accuracy"], abs=1e-6)
    assert compiled["final"]["valid/loss"] == pytest.approx(eager["final"]["valid/loss"], rel=1e-4)


def test_dry_run_says_what_each_run_would_do(tmp_path, capsys):
    from coupled_qk.cli import main

    out = tmp_path / "sweep"
    assert main([*SMOKE, "--seeds", "0", "--out-dir", str(out)]) == 0
    capsys.readouterr()
    assert main([*SMOKE, "--seeds", "0,1", "--out-dir", str(out), "--dry-run"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if " -> " in x and "d_model=" in x]
    folder = out / "easy" / "{}" / "d16" / "lr0.001" / "seed{}"
    assert [x.split(" -> ", 1)[1] for x in lines] == [
        f"{str(folder).format('standard', 0)}: reuse (finished)",
        f"{str(folder).format('coupled', 0)}: reuse (finished)",
        f"{str(folder).format('standard', 1)}: new",
        f"{str(folder).format('coupled', 1)}: new",
    ]
    assert not (out / "easy" / "standard" / "d16" / "lr0.001" / "seed1").exists()
    changed = list(SMOKE)
    changed[changed.index("--batch-size") + 1] = "4"
    assert main([*changed, "--out-dir", str(out), "--dry-run"]) == 0
    assert "refused: different settings (batch_size: 8 vs 4)" in capsys.readouterr().out
