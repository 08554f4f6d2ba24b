"""The compare protocol: its plan (variant x seed) and its analysis (mean and spread over seeds, the table)."""

from __future__ import annotations

import json
import math
import statistics
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coupled_qk.experiments.compare import (
    analyze_comparison,
    comparison_table,
    loss_trend,
    plan_comparison,
    plot_loss_curves,
)
from coupled_qk.study.executor import PlannedRun, RunRecord
from coupled_qk.training.config import TrainConfig

T975_1 = 12.706204736174698  # Student t quantile 0.975 with 1 degree of freedom (table: 12.706)


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
    assert table[2] == "| standard | 22.00 ± 1.41 | 21.00 ± 1.41 | n/a | - | reference | 1,000 | 4,096 | 1.5 |"
    # the paired change: seed 0 18/20 - 1 = -10%, seed 1 19/22 - 1 = -13.64%; mean -11.82%, its t interval on 1 df
    changes = [100 * (18 / 20 - 1), 100 * (19 / 22 - 1)]
    half = T975_1 * statistics.stdev(changes) / 2**0.5
    mean = statistics.fmean(changes)
    assert table[3].startswith(
        f"| coupled | 19.50 ± 0.71 | 18.50 ± 0.71 | n/a | - | {mean:+.1f}% [{mean - half:+.1f}%, {mean + half:+.1f}%] |"
    )
    assert "±: the standard deviation over the 2 seeds (the spread of single runs, not an interval)." in table
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
    assert table[-1].startswith("Smoke run: the final evaluation scored their first 64 windows only")


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
    assert table[4].startswith("| coupled | ") and " | -5.0% (1 seed) | " in table[4]  # the same tokens: shown
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
    assert " | -5.0% [-5.0%, -5.0%] | " in table[3] and " | 2,048 to 4,096 | " in table[3]
    assert (
        "Warning: the runs were trained on different numbers of tokens (2,048 to 4,096); for coupled "
        "it compares different budgets (the runs' own early stopping)."
    ) in table


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


# ---- the trend of the training-loss panel -----------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 300),
    intercept=st.floats(-20, 20),
    slope=st.floats(-1e-3, 1e-3),
    gaps=st.lists(st.integers(1, 5000), min_size=300, max_size=300),
)
def test_the_trend_of_a_linear_series_is_the_series_itself_no_lag(n, intercept, slope, gaps):
    """A local line reproduces any linear trend exactly, at uneven token spacing and at both ends: no lag."""
    xs = np.cumsum(gaps[:n]).astype(float)
    ys = intercept + slope * xs
    assert np.allclose(loss_trend(xs, ys), ys, rtol=0, atol=1e-9 * (1 + np.abs(ys).max()))


def test_the_trend_of_a_noisy_exponential_decay_stays_on_it_and_the_old_ema_did_not():
    """A loss decaying as 2 + 8 exp(-x / 40) over 200 records with noise: the trend is within 0.15 nats of the
    true curve at every record (the noise sd is 0.1, a single record strays 0.3); the exponential moving average
    the panel used (alpha 0.9, started at the first record) lagged it by over 1 nat early on and at the end of a
    short run."""
    rng = np.random.default_rng(0)
    x = np.arange(200.0)
    truth = 2 + 8 * np.exp(-x / 40)
    noisy = truth + rng.normal(0, 0.1, x.size)
    trend = np.array(loss_trend(x, noisy))
    assert np.abs(trend - truth).max() < 0.15
    assert np.abs(trend - truth).mean() < 0.04  # and it smooths: the records stray 0.08 on average
    ema, acc = [], None
    for v in noisy:
        acc = v if acc is None else 0.9 * acc + 0.1 * v
        ema.append(acc)
    assert np.abs(np.array(ema) - truth).max() > 1.0
    short = 10.8 - 3.9 * np.arange(8) / 7  # a demo --quick run: 8 records falling from 10.8 to 6.9
    assert loss_trend(np.arange(8) * 2048, short)[-1] == pytest.approx(6.9, abs=1e-9)


def test_the_trend_leaves_non_finite_records_out_and_short_curves_as_they_are():
    assert loss_trend([0, 1, 2], [3.0, 2.0, 1.5]) == [3.0, 2.0, 1.5]  # fewer than 5 records: no fit
    out = loss_trend(range(7), [7.0, 6.0, float("nan"), 4.0, 3.0, float("inf"), 1.0])
    assert math.isnan(out[2]) and math.isnan(out[5])
    assert [out[i] for i in (0, 1, 3, 4, 6)] == pytest.approx([7.0, 6.0, 4.0, 3.0, 1.0])
    with pytest.raises(ValueError, match="equal length"):
        loss_trend([0, 1], [1.0])
    with pytest.raises(ValueError, match="span"):
        loss_trend([0, 1], [1.0, 2.0], span=0)


# ---- what the report says was scored, the paired change, word perplexity, minutes ----------------------------


def _drawn_figure(summary, path, monkeypatch):
    """The figure :func:`plot_loss_curves` draws (captured before it is closed)."""
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    plot_loss_curves(summary, path)
    return figures[0]


def test_table_legend_and_panel_say_what_each_evaluation_scored(tmp_path, monkeypatch):
    """demo --quick's legend said "full valid split" while its table said "first 24 windows only", and the panel
    "first 320 windows" of a 214-window split: all three now come from the scored token counts of the runs."""
    base = TrainConfig(max_steps=3)
    plan = plan_comparison(base, ["standard", "coupled"], [0], tmp_path)
    records = []
    for run in plan:
        rec = _record(run, 20.0, 60.0)
        rec.results["final"].update(
            {"valid/n_tokens": 3072, "test/n_tokens": 3072, "test/subsample_windows": 24, "valid/loss": 2.4}
        )
        rec.results["data"] = {"tokens": {"train": 90_000, "valid": 27_392, "test": 30_000}}
        records.append(rec)
        run.run_dir.path.mkdir(parents=True)
        quick = {"valid/loss": 2.5, "valid/n_tokens": 27_391}  # each quick validation scored the whole split
        run.run_dir.metrics_path.write_text(
            "".join(
                json.dumps({"step": s, "tokens": 64 * s, "train/loss": 3.0 - 0.1 * s, **quick}) + "\n" for s in (1, 2)
            )
        )
    summary = analyze_comparison(records, base, [0]).json["results.json"]
    table = comparison_table(summary)
    assert (
        "Smoke run: the final evaluation scored valid on its first 3,072 of 27,392 tokens (11%); test on its first "
        "3,072 of 30,000 tokens (10%), a subsample" in table
    )
    note = next(line for line in table.splitlines() if line.startswith("n/a (test word ppl)"))
    assert "a final evaluation of a subsample has none" in note and "WikiText-style" not in note  # why, here
    fig = _drawn_figure(summary, tmp_path / "curves.png", monkeypatch)
    valid_panel = fig.axes[1]
    assert "lines: each on the whole split (27,392 tokens)" in " ".join(valid_panel.get_title().split())
    legend = [t.get_text() for t in valid_panel.get_legend().get_texts()]
    assert "standard: final, first 3,072 of 27,392 tokens (11%)" in legend
    assert not any("full" in t for t in legend)


def test_the_panel_titles_fit_in_the_figure(tmp_path, monkeypatch):
    """demo --quick's validation title, "... (lines: each on the first 4,096 of 316,150 tokens (1%)); stars: final",
    ran past the figure's right edge and was cut at "stars: fina": every title is drawn inside the figure."""
    base = TrainConfig(max_steps=3)
    plan = plan_comparison(base, ["standard", "coupled"], [0], tmp_path)
    records = []
    for run in plan:
        rec = _record(run, 20.0, 60.0)
        rec.results["final"].update({"valid/n_tokens": 3072, "valid/loss": 2.4})
        rec.results["data"] = {"tokens": {"train": 1_268_193, "valid": 316_150, "test": 359_460}}
        records.append(rec)
        run.run_dir.path.mkdir(parents=True)
        quick = {"valid/loss": 2.5, "valid/n_tokens": 4096}
        run.run_dir.metrics_path.write_text(
            "".join(json.dumps({"step": s, "tokens": 64 * s, "train/loss": 3.0, **quick}) + "\n" for s in (1, 2))
        )
    fig = _drawn_figure(analyze_comparison(records, base, [0]).json["results.json"], tmp_path / "c.png", monkeypatch)
    title = " ".join(fig.axes[1].get_title().split())  # wrapped onto lines
    assert "first 4,096 of 316,150 tokens (1%)" in title and title.endswith("stars: final")
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        box = ax.title.get_window_extent(renderer)
        assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and box.y1 <= fig.bbox.y1, ax.title.get_text()


def test_one_seed_says_an_interval_needs_two_and_an_undecided_interval_says_how_many(tmp_path):
    base = TrainConfig(max_steps=3)
    one = plan_comparison(base, ["standard", "coupled"], [0], tmp_path / "one")
    table = comparison_table(
        analyze_comparison([_record(r, p, 60.0) for r, p in zip(one, (20.0, 19.0))], base, [0]).json["results.json"]
    )
    assert " | -5.0% (1 seed) | " in table
    assert "One seed gives no interval: an interval needs at least 2 seeds per variant" in table
    assert "±: the standard deviation" not in table
    two = plan_comparison(base, ["standard", "coupled"], [0, 1], tmp_path / "two")
    ppl = [20.0, 20.0, 19.8, 20.4]  # changes -1% and +2%: mean +0.5%, sd 2.12; the interval includes 0
    summary = analyze_comparison([_record(r, p, 60.0) for r, p in zip(two, ppl)], base, [0, 1]).json["results.json"]
    table = comparison_table(summary)
    # smallest n with t_{0.975, n-1} * 2.1213 / sqrt(n) < 0.5: n = 72 (t = 1.9939: 0.4985), n = 71 gives 0.5022
    assert "coupled: the interval includes 0; about 72 seeds would exclude it" in table
    assert "One seed" not in table


def test_word_perplexity_and_wall_minutes_are_explained(tmp_path):
    base = TrainConfig(max_steps=3)
    plan = plan_comparison(base, ["standard"], [0], tmp_path)
    rec = _record(plan[0], 20.0, 60.0)
    table = comparison_table(analyze_comparison([rec], base, [0]).json["results.json"]).splitlines()
    assert table[0].endswith("| tokens | wall min |") and table[2].split(" | ")[3] == "n/a"
    note = next(line for line in table if line.startswith("n/a (test word ppl): word-level perplexity"))
    assert "WikiText-style corpora only" in note and "wikitext-103" in note and "subsample" not in note
    assert any("not the speed of a variant" in line for line in table)
    rec.results["final"]["test/word_perplexity"] = 55.0
    table = comparison_table(analyze_comparison([rec], base, [0]).json["results.json"])
    assert "| 55.00 |" in table and "n/a (test word ppl)" not in table


def test_a_change_below_one_percent_is_shown_with_two_decimals(tmp_path):
    """A change of 0.04% read "+0.0% [-0.0%, +0.1%]"."""
    base = TrainConfig(max_steps=3)
    plan = plan_comparison(base, ["standard", "coupled"], [0, 1], tmp_path)
    ppl = [20.0, 20.0, 20.008, 20.010]
    summary = analyze_comparison([_record(r, p, 60.0) for r, p in zip(plan, ppl)], base, [0, 1]).json["results.json"]
    changes = [100 * (20.008 / 20 - 1), 100 * (20.010 / 20 - 1)]
    mean, half = statistics.fmean(changes), T975_1 * statistics.stdev(changes) / 2**0.5
    assert f" | {mean:+.2f}% [{mean - half:+.2f}%, {mean + half:+.2f}%] | " in comparison_table(summary)


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
