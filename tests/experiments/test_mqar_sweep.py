"""MQAR sweep: variants, run configs, best-over-lr aggregation, table, JSON, plot, reuse and the CLI."""

from __future__ import annotations

import json

import pytest

from coupled_qk.experiments.mqar.presets import (
    SWEEP_PRESETS,
    Difficulty,
    SweepPreset,
    customize_preset,
    get_preset,
    heads_for,
    mqar_variants,
)
from coupled_qk.experiments.mqar.report import accuracy_table, best_over_lr
from coupled_qk.experiments.mqar.sweep import plan_sweep, run_config, run_sweep
from coupled_qk.models.specs import parse_variants


def _rec(variant, d, lr, acc, difficulty="easy", status="ran"):
    return {
        "difficulty": difficulty,
        "variant": variant,
        "d_model": d,
        "lr": lr,
        "accuracy": acc,
        "status": status,
        "steps": 10,
        "slices": {"L16_K2": acc},
    }


def test_variants_cover_every_attention_variant_and_leapfrog():
    from coupled_qk import ATTENTION_VARIANTS

    MQAR_VARIANTS = mqar_variants()
    # every attention of the paper (the grid cell uncoupled_mlp x differential is beyond it)
    assert {v["attention"] for v in MQAR_VARIANTS.values()} == set(ATTENTION_VARIANTS) - {"uncoupled_mlp_differential"}
    assert MQAR_VARIANTS["coupled_leapfrog"] == {"attention": "coupled", "integrator": "leapfrog"}
    assert parse_variants(None) == list(MQAR_VARIANTS)
    assert parse_variants("coupled-euler, leapfrog,standard") == ["coupled", "coupled_leapfrog", "standard"]
    with pytest.raises(ValueError, match="unknown variant 'mamba'"):
        parse_variants("standard,mamba")
    with pytest.raises(ValueError, match="selects no variant"):
        parse_variants(",")


def test_heads_and_run_config_follow_zoology_models(tmp_path):
    preset = get_preset("cpu")
    assert heads_for("standard", 1) == 1 and heads_for("differential", 1) == 2
    assert heads_for("coupled_differential", 1) == 2 and heads_for("differential", 2) == 2
    diff = preset.difficulties[0]
    cfg = run_config(preset, diff, "differential", 32, 3e-3, tmp_path)
    m = cfg.gpt_config(vocab_size=64, block_size=64)
    assert (m.n_layer, m.n_heads, m.d_head, m.use_mlp, m.position) == (2, 2, 16, False, "learned")
    std = run_config(preset, diff, "standard", 32, 3e-3, tmp_path).gpt_config(vocab_size=64, block_size=64)
    assert (std.n_heads, std.d_head) == (1, 32)
    from coupled_qk import GPT

    # one differential head (two sub-heads) is parameter-matched to one standard head, up to the lambdas/norm
    extra = GPT(m).num_parameters() - GPT(std).num_parameters()
    assert 0 < extra <= 2 * (4 * 16 + 2 * 16)
    assert cfg.early_stop_metric == "valid/accuracy" and cfg.early_stop_value == 0.99
    assert cfg.weight_decay == 0.1 and cfg.min_lr_ratio == 0.0 and cfg.task == "mqar"
    assert cfg.max_steps <= preset.max_steps
    lf = run_config(preset, diff, "coupled_leapfrog", 16, 1e-2, tmp_path)
    assert lf.model["integrator"] == "leapfrog" and lf.out_dir.endswith("coupled_leapfrog/d16/lr0.01/seed0")


def test_presets_match_the_papers():
    z = get_preset("zoology-fig2")
    assert [(d.train_slices[0][:2], d.batch_size) for d in z.difficulties] == [
        ((64, 4), 512),
        ((128, 8), 512),
        ((256, 16), 256),
        ((512, 64), 128),
    ]
    assert all(d.train_slices[0][2] == 100_000 and d.test_slices[0][2] == 3_000 for d in z.difficulties)
    assert z.vocab_size == 8192 and z.d_models == (64, 128, 256, 512) and z.epochs == 64
    assert z.lrs == pytest.approx((1e-4, 4.64e-4, 2.15e-3, 1e-2), rel=1e-2)
    b = get_preset("based-mixture")
    assert max(L for L, _, _ in b.difficulties[0].train_slices) == 256
    assert max(L for L, _, _ in b.difficulties[0].test_slices) == 1024
    # every slice of every preset is a valid MQAR setting, and every run config builds
    from coupled_qk.data.mqar import mqar_batch

    for preset in SWEEP_PRESETS.values():
        for d in preset.difficulties:
            for L, K, _ in d.train_slices + d.test_slices:
                mqar_batch(1, L, preset.vocab_size, K)
            for v in preset.variants or mqar_variants():
                cfg = run_config(preset, d, v, preset.d_models[0], preset.lrs[0], "unused")
                cfg.gpt_config(vocab_size=preset.vocab_size, block_size=max(x[0] for x in d.test_slices))
    fig2 = run_config(z, z.difficulties[0], "standard", 64, 1e-3, "unused")
    assert fig2.max_steps == 64 * 196 and fig2.eval_interval == 196  # 64 epochs of ceil(100k / 512) batches
    assert fig2.grad_clip == 0.0 and fig2.warmup_steps == 0 and fig2.beta2 == 0.999
    with pytest.raises(ValueError, match="unknown MQAR sweep preset 'nope'"):
        get_preset("nope")
    assert set(SWEEP_PRESETS) == {"zoology-fig2", "based-mixture", "cpu"}


def test_best_over_lr_table_ignores_unfinished_runs():
    records = [
        _rec("standard", 16, 1e-3, 0.4),
        _rec("standard", 16, 1e-2, 0.7),
        _rec("coupled", 16, 1e-3, 0.95),
        _rec("coupled", 16, 1e-2, 0.5),
        _rec("coupled", 16, 3e-2, 1.0, status="interrupted"),
        _rec("coupled", 16, 1e-1, None, status="skipped"),
        _rec("standard", 32, 1e-3, 0.2, difficulty="hard"),
    ]
    best = best_over_lr(records)
    by = {(b["difficulty"], b["variant"], b["d_model"]): b for b in best}
    assert by[("easy", "standard", 16)]["accuracy"] == 0.7 and by[("easy", "standard", 16)]["lr"] == 1e-2
    assert by[("easy", "coupled", 16)]["accuracy"] == 0.95 and by[("easy", "coupled", 16)]["lr"] == 1e-3
    assert by[("easy", "coupled", 16)]["accuracies"] == {"0.001": 0.95, "0.01": 0.5}
    table = accuracy_table(best, ["easy", "hard"])
    lines = table.splitlines()
    assert lines[0] == "| variant | easy d16 | hard d32 |"
    assert lines[2] == "| standard | 0.700 | 0.200 |"
    assert lines[3] == "| coupled | 0.950 | - |"


def _micro_preset():
    return SweepPreset(
        name="micro",
        description="test",
        vocab_size=32,
        difficulties=(Difficulty("easy", ((8, 2, 256),), ((8, 2, 64),), 32),),
        d_models=(16,),
        lrs=(3e-3, 1e-2),
        variants=("standard", "differential"),
        epochs=1.0,
        max_steps=6,
        eval_interval=3,
    )


@pytest.mark.slow
def test_micro_sweep_writes_results_table_plot_and_reuses_runs(tmp_path):
    preset = _micro_preset()
    calls = []

    def counting_train(cfg):
        from coupled_qk.training.loop import train

        calls.append(cfg.out_dir)
        return train(cfg)

    lines = []
    summary = run_sweep(preset, tmp_path / "sweep", device="cpu", log=lines.append, train_fn=counting_train)
    assert len(calls) == 4 and len(lines) == 4
    assert summary["counts"] == {"ran": 4}
    runs = summary["runs"]
    assert {(r["variant"], r["lr"]) for r in runs} == {
        (v, lr) for v in ("standard", "differential") for lr in (3e-3, 1e-2)
    }
    assert all(r["steps"] <= 6 and r["config"]["max_steps"] == 6 and 0 <= r["accuracy"] <= 1 for r in runs)
    assert {r["n_heads"] for r in runs if r["variant"] == "differential"} == {2}
    for b in summary["best"]:
        group = [r["accuracy"] for r in runs if r["variant"] == b["variant"]]
        assert b["accuracy"] == max(group)
    assert "| standard |" in summary["table"] and "| differential |" in summary["table"]
    out = tmp_path / "sweep"
    saved = json.loads((out / "results.json").read_text())
    assert saved["best"] == summary["best"] and "config" in saved["runs"][0]
    compact = json.loads((out / "summary.json").read_text())
    assert "config" not in compact["runs"][0] and compact["table"] == summary["table"]
    png = out / "mqar-micro.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    calls.clear()
    again = run_sweep(preset, out, device="cpu", log=lines.append, train_fn=counting_train)
    assert calls == [] and again["counts"] == {"reused": 4}
    assert again["best"] == summary["best"]
    # a finished run is only reused for the same configuration
    import dataclasses

    changed = dataclasses.replace(preset, max_steps=5)
    with pytest.raises(ValueError, match=r"different settings \(max_steps: 6 vs 5\)"):
        run_sweep(changed, out, device="cpu", log=lines.append, train_fn=counting_train)
    assert calls == []
    # a moved sweep folder (different data-cache path) is still reused
    import shutil

    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    assert run_sweep(preset, moved, device="cpu", log=lines.append, train_fn=counting_train)["counts"] == {"reused": 4}
    assert calls == []


def test_max_minutes_guard_skips_and_marks_interrupted(tmp_path):
    preset = _micro_preset()
    fake_results = {"final": {"valid/accuracy": 0.5}, "steps": 2, "stop_reason": "max_minutes", "model_config": {}}

    def fake_train(cfg):
        assert cfg.max_minutes is not None and cfg.max_minutes > 0
        from pathlib import Path

        Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
        (Path(cfg.out_dir) / "results.json").write_text(json.dumps(fake_results))
        import time

        time.sleep(1.5)
        return fake_results

    summary = run_sweep(preset, tmp_path, device="cpu", max_minutes=0.02, log=lambda s: None, train_fn=fake_train)
    statuses = [r["status"] for r in summary["runs"]]
    assert statuses[0] == "interrupted" and set(statuses[1:]) == {"skipped"}
    first = tmp_path / "easy" / "standard" / "d16" / "lr0.003" / "seed0"
    assert (first / "results.interrupted.json").is_file() and not (first / "results.json").exists()
    assert summary["best"] == []
    with pytest.raises(ValueError, match="max_minutes"):
        run_sweep(preset, tmp_path, max_minutes=0)


def test_plan_order_and_errors():
    preset = _micro_preset()
    plan = plan_sweep(preset, d_models=[8, 16])
    assert [(p.d_model, p.lr, p.variant) for p in plan[:3]] == [
        (8, 3e-3, "standard"),
        (8, 3e-3, "differential"),
        (8, 1e-2, "standard"),
    ]
    with pytest.raises(ValueError, match="d_model=0"):
        plan_sweep(preset, d_models=[0])
    with pytest.raises(ValueError, match="lr=-1"):
        plan_sweep(preset, lrs=[-1])
    with pytest.raises(ValueError, match="difficulty 'medium' is not in preset 'micro'"):
        plan_sweep(preset, difficulties=["medium"])
    with pytest.raises(ValueError, match="batch_size=0"):
        Difficulty("x", ((8, 2, 10),), ((8, 2, 10),), 0)


def test_cli_dry_run_and_errors(capsys):
    from coupled_qk.cli import main

    assert main(["mqar", "--preset", "cpu", "--variants", "standard,coupled", "--d-models", "16", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "runs -> runs/mqar-cpu" in out and "n_heads=2" in out
    n = len(get_preset("cpu").difficulties) * len(get_preset("cpu").lrs) * 2
    assert out.count("d_model=16") == n
    assert main(["mqar", "--variants", "bogus", "--dry-run"]) == 2
    assert "unknown variant 'bogus'" in capsys.readouterr().err
    assert main(["mqar", "--lrs", "x", "--dry-run"]) == 2


def test_customize_preset_shrinks_the_budget_and_records_it():
    cpu = get_preset("cpu")
    small = customize_preset(cpu, max_steps=5, seed=3, train_examples=100, test_examples=10)
    assert small.name == "cpu" and cpu.max_steps == 600 and cpu.difficulties[0].train_slices == ((16, 2, 20_000),)
    assert [d.train_slices for d in small.difficulties] == [((16, K, 100),) for K in (2, 3, 4)]
    assert [d.test_slices for d in small.difficulties] == [((16, K, 10),) for K in (2, 3, 4)]
    cfg = run_config(small, small.difficulties[0], "standard", 32, 2e-3, "out")
    assert (cfg.max_steps, cfg.seed) == (5, 3)
    assert cfg.task_options["train_slices"] == [[16, 2, 100]] and cfg.task_options["test_slices"] == [[16, 2, 10]]
    assert small.notes[-1] == "Changed from the preset: max_steps=5, seed=3, train_examples=100, test_examples=10."
    assert small.to_dict()["seed"] == 3
    batched = customize_preset(cpu, batch_size=16)
    assert [d.batch_size for d in batched.difficulties] == [16, 16, 16] and cpu.difficulties[0].batch_size == 64
    assert run_config(batched, batched.difficulties[0], "standard", 32, 2e-3, "out").batch_size == 16
    assert batched.notes[-1] == "Changed from the preset: batch_size=16."
    assert customize_preset(cpu) is cpu
    for kwargs, name in (
        (dict(max_steps=0), "max_steps=0"),
        (dict(max_steps=True), "max_steps=True"),
        (dict(seed=-1), "seed=-1"),
        (dict(seed=2**32), "seed=4294967296"),
        (dict(train_examples=0), "train_examples=0"),
        (dict(test_examples=1.5), "test_examples=1.5"),
        (dict(batch_size=0), "batch_size=0"),
    ):
        with pytest.raises(ValueError, match=name):
            customize_preset(cpu, **kwargs)


@pytest.mark.slow
def test_cli_smoke_run_options_reach_every_run(tmp_path, capsys):
    from coupled_qk.cli import main

    out = tmp_path / "sweep"
    assert (
        main(
            [
                "mqar",
                "--difficulties",
                "easy",
                "--d-models",
                "16",
                "--lrs",
                "1e-3",
                "--variants",
                "standard",
                "--max-steps",
                "7",
                "--seed",
                "2",
                "--train-examples",
                "50",
                "--test-examples",
                "8",
                "--out-dir",
                str(out),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    assert "Changed from the preset: max_steps=7, seed=2" in capsys.readouterr().out
    saved = json.loads((out / "results.json").read_text())
    (run,) = saved["runs"]
    assert run["steps"] == 7 and run["config"]["max_steps"] == 7 and run["config"]["seed"] == 2
    assert run["config"]["task_options"]["train_slices"] == [[16, 2, 50]]
    assert run["config"]["task_options"]["test_slices"] == [[16, 2, 8]]
    assert saved["preset"]["max_steps"] == 7 and saved["preset"]["notes"][-1].startswith("Changed from the preset")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--max-steps", "0"], "--max-steps=0 must be a positive integer"),
        (["--seed", "-1"], "--seed=-1 must be an integer >= 0"),
        (["--train-examples", "nan"], "--train-examples=nan is not an integer"),
        (["--test-examples", "0"], "--test-examples=0 must be a positive integer"),
        (
            ["--difficulties", "easy,easy"],
            "--difficulties='easy,easy': expected comma-separated difficulty names, each once",
        ),
        (["--difficulties", "bogus"], "--difficulties='bogus': difficulty 'bogus' is not in preset 'cpu'"),
        (["--variants", "bogus"], "--variants='bogus': unknown variant 'bogus'"),
        (["--seeds", "0,1,0"], "--seeds='0,1,0' repeats seed(s) [0]"),
        (["--seeds", "1,-2"], "--seeds='1,-2': seeds must be >= 0, got [-2]"),
        (["--seeds", "x"], "--seeds='x': expected comma-separated integers"),
        (["--seed", "1", "--seeds", "0,1"], "argument --seeds: not allowed with argument --seed"),
        (["--batch-size", "0"], "--batch-size=0 must be a positive integer"),
    ],
)
def test_cli_bad_values_name_the_option(argv, message, capsys):
    from coupled_qk.cli import main

    assert main(["mqar", *argv, "--dry-run"]) == 2
    assert message in capsys.readouterr().err


def test_sweep_line_says_a_run_was_resumed():
    import dataclasses

    from coupled_qk.experiments.mqar.sweep import _line
    from coupled_qk.study.executor import PlannedRun, RunRecord

    preset = _micro_preset()
    cfg = run_config(preset, preset.difficulties[0], "standard", 16, 3e-3, "out")
    keys = {"difficulty": "easy", "variant": "standard", "d_model": 16, "lr": 3e-3, "position": 0}
    results = {"final": {"valid/accuracy": 0.5}, "steps": 6, "stop_reason": "completed"}
    run = PlannedRun(cfg, "x", keys)
    fresh = _line(1)(RunRecord(run, "ran", results, cfg, 1.0))
    resumed = _line(1)(RunRecord(run, "ran", results, dataclasses.replace(cfg, resume=True), 1.0))
    assert not fresh.endswith("(resumed)") and resumed == fresh + " (resumed)"


def test_a_moved_sweep_folder_resumes_its_interrupted_run():
    """Finished runs of a moved sweep were reused, but its interrupted run was refused ("cannot resume ...: a
    different config (task_options: {'cache_dir': old} vs {'cache_dir': new})") though the data cache only moved."""
    from coupled_qk.training.config import config_differences

    preset = _micro_preset()
    old = run_config(preset, preset.difficulties[0], "standard", 16, 3e-3, "a", cache_dir="a/data-cache")
    moved = run_config(preset, preset.difficulties[0], "standard", 16, 3e-3, "b", cache_dir="b/data-cache")
    assert config_differences(old.to_dict(), moved) == {}
    other = customize_preset(preset, train_examples=100)
    changed = run_config(other, other.difficulties[0], "standard", 16, 3e-3, "b", cache_dir="b/data-cache")
    assert set(config_differences(old.to_dict(), changed)) == {"task_options"}
