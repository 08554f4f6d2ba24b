"""The compare protocol: its plan (variant x seed) and its analysis (mean and spread over seeds, the table)."""

from __future__ import annotations

import json
import statistics
import warnings

import pytest

from coupled_qk.experiments.compare import analyze_comparison, comparison_table, plan_comparison
from coupled_qk.study.executor import PlannedRun, RunRecord
from coupled_qk.training.config import TrainConfig


def test_plan_is_variant_major_with_the_variants_overrides(tmp_path):
    base = TrainConfig(max_steps=3, model={"n_layer": 1})
    plan = plan_comparison(base, ["standard", "coupled-leapfrog"], [0, 1], tmp_path)
    assert [(p.keys["variant"], p.keys["seed"]) for p in plan] == [
        ("standard", 0),
        ("standard", 1),
        ("coupled_leapfrog", 0),
        ("coupled_leapfrog", 1),
    ]
    assert plan[3].config.out_dir == str(tmp_path / "coupled_leapfrog" / "seed1") and plan[3].config.seed == 1
    assert plan[3].config.model == {"n_layer": 1, "attention": "coupled", "integrator": "leapfrog"}
    assert plan[0].config.model == {"n_layer": 1, "attention": "standard"} and plan[0].label == "standard seed 0"
    with pytest.raises(ValueError, match="unknown variant"):
        plan_comparison(base, ["flash"], [0], tmp_path)


def _record(run: PlannedRun, test_ppl: float, seconds: float) -> RunRecord:
    results = {
        "final": {"valid/perplexity": test_ppl + 1, "test/perplexity": test_ppl},
        "params": 1000,
        "tokens": 4096,
        "train_seconds": seconds,
    }
    return RunRecord(run, "ran", results, run.config, seconds)


def test_summary_means_spreads_and_the_change_against_standard(tmp_path):
    base = TrainConfig(max_steps=3)
    plan = plan_comparison(base, ["standard", "coupled"], [0, 1], tmp_path)
    ppl = [20.0, 22.0, 18.0, 19.0]  # standard seeds 0, 1; coupled seeds 0, 1
    records = [_record(run, p, 60.0 * (i + 1)) for i, (run, p) in enumerate(zip(plan, ppl))]
    for run in plan:  # loss curves read each run's metrics.jsonl
        run.run_dir.path.mkdir(parents=True)
        run.run_dir.metrics_path.write_text(
            json.dumps({"step": 1, "tokens": 64, "train/loss": 3.0})
            + "\n"
            + json.dumps({"step": 2, "tokens": 128, "valid/loss": 2.5})
            + "\n"
        )
    report = analyze_comparison(records, base, [0, 1])
    summary = report.json["results.json"]
    std, cpl = summary["variants"]["standard"], summary["variants"]["coupled"]
    assert std["test_perplexity"] == {"mean": 21.0, "std": statistics.stdev([20.0, 22.0]), "values": [20.0, 22.0]}
    assert cpl["test_perplexity"]["mean"] == 18.5 and cpl["valid_perplexity"]["values"] == [19.0, 20.0]
    assert cpl["overrides"] == {"attention": "coupled", "integrator": "euler"}
    assert std["minutes"] == 1.5 and cpl["minutes"] == 3.5  # mean train seconds / 60
    assert [r["seed"] for r in cpl["runs"]] == [0, 1] and cpl["runs"][1]["run_dir"] == str(
        tmp_path / "coupled" / "seed1"
    )
    assert "test_word_perplexity" not in std  # only metrics the runs have
    table = comparison_table(summary).splitlines()
    assert table[2] == "| standard | 22.00 ± 1.41 | 21.00 ± 1.41 | - | - | +0.0% | 1,000 | 4,096 | 1.5 |"
    assert table[3].startswith("| coupled | 19.50 ± 0.71 | 18.50 ± 0.71 | - | - | -11.9% |")  # 18.5 / 21 - 1
    assert not any("Smoke run" in line for line in table)
    assert report.text["results.md"] == comparison_table(summary) + "\n"
    report.plots["loss_curves.png"](tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_loss_curves_of_runs_without_training_loss_records_warn_nothing(tmp_path):
    """A run shorter than log_interval logs validations only: the empty training panel gets no legend (matplotlib's
    'No artists with labels' warning used to reach the user as a coupled-qk warning)."""
    base = TrainConfig(max_steps=3)
    plan = plan_comparison(base, ["standard", "coupled"], [0], tmp_path)
    records = [_record(run, 20.0, 60.0) for run in plan]
    for run in plan:
        run.run_dir.path.mkdir(parents=True)
        run.run_dir.metrics_path.write_text(json.dumps({"step": 1, "tokens": 64, "valid/loss": 2.5}) + "\n")
    report = analyze_comparison(records, base, [0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report.plots["loss_curves.png"](tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_table_shows_bits_per_byte_and_labels_a_subsampled_evaluation(tmp_path):
    base = TrainConfig(max_steps=3)
    plan = plan_comparison(base, ["standard"], [0, 1], tmp_path)
    records = []
    for run, bpb in zip(plan, (1.25, 1.75)):
        rec = _record(run, 20.0, 60.0)
        rec.results["final"].update({"test/bits_per_byte": bpb, "test/subsample_windows": 64})
        records.append(rec)
    summary = analyze_comparison(records, base, [0, 1]).json["results.json"]
    assert summary["variants"]["standard"]["test_bits_per_byte"]["values"] == [1.25, 1.75]
    table = comparison_table(summary).splitlines()
    assert table[2].split(" | ")[4] == "1.5000 ± 0.3536"  # mean 1.5, sample sd 0.5 / sqrt(2)
    assert table[-1].startswith("Smoke run: valid and test scored on their first 64 windows only")


def test_specs_that_give_the_base_the_same_model_are_refused_naming_both(tmp_path):
    """With the base model known, an override equal to the base's value is the same model too."""
    base = TrainConfig(max_steps=3, model={"n_layer": 1})
    with pytest.raises(ValueError, match=r"'standard' and 'standard\+n_layer=1' are the same model"):
        plan_comparison(base, ["standard", "standard+n_layer=1"], [0], tmp_path)
    with pytest.raises(ValueError, match=r"'coupled' and 'coupled\+n_steps=1' are the same model"):
        plan_comparison(base, ["coupled", "coupled+n_steps=1"], [0], tmp_path)
    assert len(plan_comparison(base, ["standard", "standard+n_layer=2"], [0], tmp_path)) == 2


def _budget_records(plan, runs):
    """Records of ``plan`` with ``(test ppl, tokens, stop_reason)`` per run."""
    records = []
    for run, (ppl, tokens, stop) in zip(plan, runs):
        rec = _record(run, ppl, 60.0)
        rec.results.update(tokens=tokens, steps=tokens // 256, stop_reason=stop)
        records.append(rec)
    return records


def test_runs_stopped_early_are_marked_and_a_change_from_other_budgets_is_withheld(tmp_path):
    """`compare --max-minutes 0.02` printed "coupled_leapfrog -14.1% vs standard" from 11,520 vs 15,616 tokens."""
    base = TrainConfig(max_steps=300)
    plan = plan_comparison(base, ["standard", "coupled_leapfrog", "coupled"], [0], tmp_path)
    records = _budget_records(
        plan, [(20.0, 15616, "max_minutes"), (17.0, 11520, "max_minutes"), (19.0, 15616, "completed")]
    )
    summary = analyze_comparison(records, base, [0]).json["results.json"]
    assert summary["variants"]["coupled_leapfrog"]["runs"][0]["stop_reason"] == "max_minutes"
    table = comparison_table(summary).splitlines()
    assert table[2].startswith("| standard (unfinished) | ")
    assert table[3].startswith("| coupled_leapfrog (unfinished) | ") and " | withheld | " in table[3]
    assert " | 11,520 | " in table[3]
    assert table[4].startswith("| coupled | ") and " | -5.0% | " in table[4]  # the same tokens: shown
    assert any(line.startswith("(unfinished): a run stopped early") for line in table)
    assert (
        "Warning: the runs were trained on different numbers of tokens (11,520 to 15,616); the change against "
        "standard is withheld for coupled_leapfrog (unfinished runs)."
    ) in table


def test_different_budgets_of_finished_runs_are_flagged_and_seeds_show_a_range(tmp_path):
    """Runs ended by their own early-stopping rule differ in tokens too: the change is shown with a warning."""
    base = TrainConfig(max_steps=300)
    plan = plan_comparison(base, ["standard", "coupled"], [0, 1], tmp_path)
    records = _budget_records(
        plan,
        [(20.0, 4096, "completed"), (20.0, 4096, "completed"), (19.0, 2048, "patience"), (19.0, 4096, "completed")],
    )
    table = comparison_table(analyze_comparison(records, base, [0, 1]).json["results.json"]).splitlines()
    assert "unfinished" not in "\n".join(table)
    assert " | -5.0% | " in table[3] and " | 2,048 to 4,096 | " in table[3]
    assert table[-1] == (
        "Warning: the runs were trained on different numbers of tokens (2,048 to 4,096); for coupled "
        "it compares different budgets (the runs' own early stopping)."
    )


def test_cli_dry_run_prints_the_plan_with_what_each_run_would_do(tmp_path, capsys):
    """``compare --dry-run`` (as ``mqar``'s and ``glue``'s): one line per variant x seed with its folder and
    whether it would be trained, reused or refused; nothing is created and nothing is trained."""
    from coupled_qk.cli import build_parser, main
    from coupled_qk.commands.train import train_config_from_args

    out = tmp_path / "cmp"
    argv = [
        "compare",
        "--preset",
        "tiny",
        "--max-steps",
        "3",
        "--variants",
        "standard,coupled",
        "--seeds",
        "0,1",
        "--out-dir",
        str(out),
        "--device",
        "cpu",
    ]
    assert main([*argv, "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"coupled-qk compare: 4 runs (2 variants x 2 seeds) -> {out}"
    assert lines[1:] == [
        f"  {v} seed {s} -> {out / v / f'seed{s}'}: new" for v in ("standard", "coupled") for s in (0, 1)
    ] + ["  4 runs: 4 new"]
    assert not out.exists()
    base = train_config_from_args(build_parser("compare").parse_args(argv))  # the command's base config
    finished = plan_comparison(base, ["standard"], [0], out)[0]
    finished.run_dir.path.mkdir(parents=True)
    (finished.run_dir.path / "results.json").write_text(json.dumps({"config": finished.config.to_dict(), "final": {}}))
    assert main([*argv, "--dry-run"]) == 0
    assert f"standard seed 0 -> {out / 'standard' / 'seed0'}: reuse (finished)" in capsys.readouterr().out
    assert main([*[x if x != "3" else "4" for x in argv], "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "standard seed 0" in printed and "refused: different settings (max_steps: 3 vs 4)" in printed
    assert "4 runs: 1 refused, 3 new" in printed


def test_a_dry_run_refuses_what_the_run_would_refuse_before_training(tmp_path, capsys):
    """`compare --variants standard,coupled+vocab_size=10 --dry-run` said "new" for both runs, then the real run
    trained standard before refusing the second; now both refuse it in one line before anything is created."""
    from coupled_qk.cli import main

    out = tmp_path / "cmp"
    argv = ["compare", "--preset", "tiny", "--max-steps", "2", "--variants", "standard,coupled+vocab_size=10"]
    for extra in (["--dry-run"], []):
        assert main([*argv, "--out-dir", str(out), "--device", "cpu", *extra]) == 2
        err = capsys.readouterr().err
        assert "the model override vocab_size=10 cannot apply: task='lm' sets vocab_size from its data" in err, err
        assert not out.exists()
