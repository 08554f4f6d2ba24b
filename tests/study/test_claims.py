"""Claim tests and their verdicts, the first-epoch studies' definitions and the held-out article split (fast, no
training): every number checked against a hand computation or an independent recomputation."""

import pytest
from study_helpers import COMMANDS, claim, evidence, write_record

from coupled_qk.data.splits import heldout_corpus, split_articles
from coupled_qk.studies import get_study, studies
from coupled_qk.studies.first_epoch import CPU_EXTRA_SEEDS
from coupled_qk.study.claims import NotReady, direction_verdict, equivalence_verdict
from coupled_qk.study.report import build_report, format_markdown

PROTOCOLS = {name: s for name, s in studies().items() if s.static}


def test_direction_verdict():
    assert direction_verdict(-3.0, -0.5, "negative") == "reproduced"
    assert direction_verdict(0.5, 3.0, "negative") == "contradicted"
    assert direction_verdict(-1.0, 1.0, "negative") == "not reproduced at this scale"
    assert direction_verdict(0.5, 3.0, "positive") == "reproduced"
    assert direction_verdict(-3.0, -0.5, "positive") == "contradicted"
    assert direction_verdict(float("nan"), 1.0, "positive") == "not reproduced at this scale"


def test_equivalence_verdict():
    assert equivalence_verdict(-0.5, 0.8, margin=1.0) == "reproduced"
    assert equivalence_verdict(-0.5, 1.2, margin=1.0) == "not reproduced at this scale"
    assert equivalence_verdict(1.1, 2.0, margin=1.0) == "contradicted"
    assert equivalence_verdict(-3.0, -1.5, margin=1.0) == "contradicted"


def test_protocols_are_consistent():
    for p in PROTOCOLS.values():
        names = [c.name for c in p.cells]
        assert len(names) == len(set(names)), p.name
    cpu, short = get_study("cpu"), get_study("cpu-short")
    extra = {c.name for c in CPU_EXTRA_SEEDS}
    assert [c.name for c in cpu.cells if c.name not in extra] == [c.name for c in short.cells]
    tiny = cpu.cell("wv-tiny")
    assert tiny.base["max_tokens"] == 4 * short.cell("wv-tiny").base["max_tokens"] == 1_048_576
    assert set(tiny.variants) == {"standard", "coupled", "uncoupled_mlp"} and len(tiny.seeds) >= 3
    # seed-major order: every prefix of the run list holds whole seeds
    assert tiny.units()[:3] == [("standard", 0), ("coupled", 0), ("uncoupled_mlp", 0)]
    for c in cpu.cells:  # a seeds_of cell is its base cell with other seeds
        if c.seeds_of:
            base = cpu.cell(c.seeds_of)
            assert (c.base, c.heldout) == (base.base, base.heldout) and set(c.variants) <= set(base.variants)
            assert not set(c.seeds) & set(base.seeds)
    assert cpu.cell("wv-tiny-seeds").seeds_of == "wv-tiny"
    assert not get_study("gpu-paper").runnable
    with pytest.raises(ValueError, match="protocol"):
        get_study("nope")


def test_split_articles_and_heldout_corpus(tmp_path):
    text = " = A = \n\npara a1\n\n = = Sub = = \n\npara a2\n\n = B = \n\npara b\n"
    arts = split_articles(text)
    assert arts == [" = A = \n\npara a1\n\n = = Sub = = \n\npara a2", " = B = \n\npara b"]
    with pytest.raises(ValueError, match="heading"):
        split_articles("no headings here\n")
    data = tmp_path / "data"
    (data / "wiki-vital").mkdir(parents=True)
    (data / "wiki-vital" / "train.txt").write_text("".join(f" = T{i} = \n\nbody {i}\n\n" for i in range(100)))
    out = heldout_corpus(data, tmp_path / "derived", seed=0, fraction=0.05)
    splits = {s: (out / f"{s}.txt").read_text() for s in ("train", "valid", "test")}
    titles = {s: {line for line in t.splitlines() if line.startswith(" = ")} for s, t in splits.items()}
    assert len(titles["valid"]) == len(titles["test"]) == 5 and len(titles["train"]) == 90
    assert not (titles["train"] & titles["valid"]) and not (titles["train"] & titles["test"])
    # deterministic and written once
    stamp = (out / "source.txt").read_text()
    assert heldout_corpus(data, tmp_path / "derived", seed=0, fraction=0.05) == out
    assert (out / "source.txt").read_text() == stamp


def _c11(path):
    ev = evidence(path.parent / "none", "cpu-short")
    ev.inputs["glue_json"] = path
    return claim("cpu-short", "C11").test.evaluate(ev)


def test_c11_reads_the_glue_results(tmp_path):
    with pytest.raises(NotReady, match="GLUE"):
        _c11(tmp_path / "missing.json")
    rows = [
        {"task": t, "variant": v, "seed": s, "score": base + (gain if v == "coupled" else 0.0) + 0.01 * s}
        for t, base, gain in (("sst2", 0.80, 0.0), ("rte", 0.55, 0.001))
        for v in ("standard", "coupled")
        for s in range(3)
    ]
    path = tmp_path / "glue.json"
    import json

    path.write_text(json.dumps({"runs": rows}))
    row = _c11(path)
    # sst2: identical scores (difference 0 in every seed); rte: +0.001 in every seed -> a significant gain
    assert row["details"]["per_task"]["sst2"]["mean"] == pytest.approx(0.0)
    assert row["verdict"] == "contradicted" and row["details"]["significant_gain_tasks"] == ["rte"]
    for r in rows:
        if r["task"] == "rte" and r["variant"] == "coupled":
            r["score"] -= 0.001 - 0.002 * (r["seed"] == 0)  # gains +0.002, 0, 0: not significant
    path.write_text(json.dumps(rows))
    assert _c11(path)["verdict"] == "reproduced"
    # an underpowered null is not "no benefit": rte gains +0.03, -0.02, 0 (mean +0.003, CI reaching past +0.01)
    for r in rows:
        if r["task"] == "rte" and r["variant"] == "coupled":
            r["score"] += {0: 0.028, 1: -0.02, 2: 0.0}[r["seed"]]
    path.write_text(json.dumps(rows))
    row = _c11(path)
    assert row["details"]["per_task"]["rte"]["high"] > 0.01 and row["verdict"] == "not reproduced at this scale"
    assert row["p"] == pytest.approx(min(row["details"]["task_holm_p"].values()))


def test_record_reuse_compares_settings(tmp_path):
    """A record is the planned run only with the same result-changing settings; a field it predates counts as
    default."""
    from pathlib import Path

    from coupled_qk.study.records import same_run_problem, settings_of

    cell = get_study("cpu-short").cell("wv-tiny")
    cfg = cell.config("coupled", 1, Path("runs/x"), Path("data"))
    saved = settings_of(cfg)
    assert same_run_problem({"config": saved}, cell.config("coupled", 1, Path("elsewhere"), Path("other"))) is None
    older = {k: v for k, v in saved.items() if k != "early_stop_metric"}  # a record from before that field
    assert same_run_problem({"config": older}, cfg) is None
    assert "seed: 1 vs 2" in same_run_problem({"config": older}, cell.config("coupled", 2, Path("r"), Path("d")))
    assert "model" in same_run_problem({"config": older}, cell.config("standard", 1, Path("r"), Path("d")))
    assert same_run_problem({}, cfg) == "it stores no settings (config)"


def test_extra_seeds_join_their_base_cell(tmp_path):
    """C1 and C4 read wv-tiny-seeds (seeds 3-4) as more seeds of wv-tiny: n grows from 3 to 5."""
    ppl = {"standard": 100.0, "coupled": 99.0, "uncoupled_mlp": 101.0}
    for cell, seeds in (("wv-tiny", (0, 1, 2)), ("wv-tiny-seeds", (3, 4))):
        for seed in seeds:
            for variant, value in ppl.items():
                final = {"test/perplexity": value + 0.1 * seed * (variant == "coupled") + 0.3 * seed}
                write_record(tmp_path, "cpu", cell, variant, seed, final)
    ev = evidence(tmp_path, "cpu")
    assert claim("cpu", "C1").test.evaluate(ev)["n"] == 5 and claim("cpu", "C4").test.evaluate(ev)["n"] == 5
    assert sorted(ev.values("wv-tiny", "coupled")) == [0, 1, 2, 3, 4]


def test_identical_runs_of_another_protocol_are_reused(tmp_path):
    """cpu and cpu-short share their MQAR cells: a finished cpu-short record serves cpu without training; a cell
    whose budget differs between the protocols (wv-tiny) is not shared."""
    import json
    from pathlib import Path

    from study_helpers import unit_of

    from coupled_qk.study.records import record_path, settings_of
    from coupled_qk.study.run import Places, run_unit, same_run_elsewhere

    cpu = get_study("cpu")
    cell = cpu.cell("mqar-easy-lr1e-3")
    assert cell == get_study("cpu-short").cell("mqar-easy-lr1e-3")
    cfg = cell.config("coupled", 2, Path("runs/x"), None)
    short = record_path(tmp_path, "cpu-short", cell.name, "coupled", 2)
    short.parent.mkdir(parents=True)
    short.write_text(json.dumps({"protocol": "cpu-short", "config": settings_of(cfg), "final": {"acc": 0.5}}))
    # run_unit() finds it before training anything (the data and run folders below do not exist)
    unit = unit_of(cpu, cell.name, "coupled", 2)
    places = Places(tmp_path, tmp_path / "no-runs", tmp_path / "no-data", tmp_path / "c")
    rec = run_unit(cpu, unit, places)
    assert rec["protocol"] == "cpu" and rec["reused_from"] == "cpu-short" and rec["final"] == {"acc": 0.5}
    assert json.loads(record_path(tmp_path, "cpu", cell.name, "coupled", 2).read_text()) == rec
    assert not (tmp_path / "no-runs").exists()
    assert same_run_elsewhere(tmp_path, "cpu", unit_of(cpu, cell.name, "coupled", 1), cfg) is None  # another seed
    tiny_short, tiny = get_study("cpu-short").cell("wv-tiny"), cpu.cell("wv-tiny")
    path = record_path(tmp_path, "cpu-short", "wv-tiny", "coupled", 0)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"config": settings_of(tiny_short.config("coupled", 0, Path("r"), Path("d")))}))
    planned = tiny.config("coupled", 0, Path("r"), Path("d"))
    assert same_run_elsewhere(tmp_path, "cpu", unit_of(cpu, "wv-tiny", "coupled", 0), planned) is None  # 4x tokens


def test_c11_on_the_committed_glue_results_is_uninformative():
    """The committed CPU GLUE study: every model sits at the majority class or at chance, so C11's
    null claim can be neither supported nor contradicted by it."""
    from pathlib import Path

    from coupled_qk.studies.glue_scores import glue_score_rows, majority_score

    path = Path(__file__).parents[2] / "docs" / "results" / "glue-cpu" / "results.json"
    import json

    rows = glue_score_rows(json.loads(path.read_text()))
    assert {r["task"] for r in rows} == {"sst2", "cola", "rte", "mrpc"} and len(rows) == 4 * 3 * 3
    assert majority_score("cola") == 0.0 and majority_score("sst2") == pytest.approx(444 / 872)
    row = _c11(path)
    assert row["verdict"] == "not reproduced at this scale" and row["details"]["learned_tasks"] == []


def test_sample_efficiency_matches_final_perplexities_across_budgets(tmp_path):
    """C6 interpolates standard's *final* log-perplexity between its 1x and 2x runs: standard at exp(5.0) (1x) and
    exp(4.6) (2x), coupled at exp(4.8) (1x) -> standard needs 2**0.5 = 1.414x the tokens. The 2x run's curve
    (deliberately better than both finals mid-run, as a higher learning rate makes it) does not enter."""
    import math

    def write(cell, variant, seed, log_ppl, tokens, seconds):
        curve = [[tokens // 2, 3.0], [tokens, log_ppl]]
        final = {"test/perplexity": math.exp(log_ppl)}
        write_record(
            tmp_path, "cpu", cell, variant, seed, final, tokens=tokens, train_seconds=seconds, curve={"valid": curve}
        )

    def run(coupled_log_ppl):
        for seed in range(3):
            write("wv-tiny", "standard", seed, 5.0 + 0.01 * seed, 1000, 10.0)
            write("wv-tiny-2x", "standard", seed, 4.6 + 0.01 * seed, 2000, 20.0)
            # coupled took 2**0.25 times standard's time: wall-clock matched standard sits at 5.0 - 0.4 * 0.25
            write("wv-tiny", "coupled", seed, coupled_log_ppl + 0.012 * seed, 1000, 10.0 * 2**0.25)
        return claim("cpu", "C6").test.evaluate(evidence(tmp_path, "cpu"))

    def expected(coupled_log_ppl):  # standard's loss falls 0.4 nats per doubling
        return sum(2 ** ((5.0 - coupled_log_ppl - 0.002 * s) / 0.4) for s in range(3)) / 3

    row = run(4.8)
    assert row["mean"] == pytest.approx(expected(4.8)) and row["n"] == 3
    assert row["mean"] == pytest.approx(2**0.5, rel=0.01)
    assert row["verdict"] == "reproduced" and row["details"]["extrapolated_outside_1x_2x"] == 0
    matched = row["details"]["wallclock_matched_ppl_percent_coupled_vs_standard"]["mean"]
    assert matched == pytest.approx(sum(100 * (math.exp(-0.1 + 0.002 * s) - 1) for s in range(3)) / 3)
    row = run(5.1)  # coupled worse than standard at 1x: standard needs fewer tokens (extrapolated below 1x)
    assert row["mean"] == pytest.approx(expected(5.1)) and row["verdict"] == "contradicted"
    assert row["details"]["extrapolated_outside_1x_2x"] == 3


def test_budget_to_match_interpolates_in_log_budget():
    from coupled_qk.study import stats

    assert stats.budget_to_match([1, 2], [5.0, 4.6], 4.8) == (pytest.approx(2**0.5), False)
    assert stats.budget_to_match([1, 2, 4], [5.0, 4.6, 4.4], 4.5) == (pytest.approx(2**1.5), False)
    assert stats.budget_to_match([1, 2], [5.0, 4.6], 4.4) == (pytest.approx(2**1.5), True)
    assert stats.budget_to_match([1, 2], [5.0, 5.1], 4.9) is None  # loss does not fall with budget
    with pytest.raises(ValueError, match="increasing"):
        stats.budget_to_match([2, 1], [5.0, 4.6], 4.8)
    with pytest.raises(ValueError, match=">= 2 budgets"):
        stats.budget_to_match([1], [5.0], 4.8)


def test_loss_at_budget_is_the_inverse_of_budget_to_match():
    """Hand-computed: losses 5.0 at 1 and 4.6 at 2 -> 4.8 at sqrt(2) (half-way in log budget), 4.2 at 4
    (extrapolated); and reading the loss back at budget_to_match's budget returns the target."""
    from coupled_qk.study import stats

    assert stats.loss_at_budget([1, 2], [5.0, 4.6], 2**0.5) == pytest.approx(4.8)
    assert stats.loss_at_budget([1, 2], [5.0, 4.6], 4) == pytest.approx(4.2)
    assert stats.loss_at_budget([1, 2, 4], [5.0, 4.6, 4.4], 2**1.5) == pytest.approx(4.5)
    assert stats.loss_at_budget([1, 2, 4], [5.0, 4.6, 4.4], 0.5) == pytest.approx(5.4)
    for target in (4.95, 4.5, 4.3):
        budget, _ = stats.budget_to_match([1, 2, 4], [5.0, 4.6, 4.4], target)
        assert stats.loss_at_budget([1, 2, 4], [5.0, 4.6, 4.4], budget) == pytest.approx(target)
    with pytest.raises(ValueError, match="budget=0"):
        stats.loss_at_budget([1, 2], [5.0, 4.6], 0)
    with pytest.raises(ValueError, match="increasing"):
        stats.loss_at_budget([2, 1], [5.0, 4.6], 1.5)


def test_differential_comparison_table_pairs_cells_by_seed(tmp_path):
    """The report's Differential table pairs wv-tiny-diff with wv-tiny by seed: standard 100/110/120 and
    Differential 150/165/180 -> +50% in every seed; while a cell is unfinished its rows say so."""
    for seed in range(3):
        write_record(tmp_path, "cpu", "wv-tiny", "standard", seed, {"test/perplexity": 100.0 + 10 * seed})
        write_record(tmp_path, "cpu", "wv-tiny", "coupled", seed, {"test/perplexity": 99.0 + 10 * seed})
        write_record(
            tmp_path, "cpu", "wv-tiny-diff", "differential", seed, {"test/perplexity": 1.5 * (100.0 + 10 * seed)}
        )
    rows = build_report(get_study("cpu"), tmp_path, get_study)["differential"]
    assert rows[0]["mean"] == pytest.approx(50.0) and rows[0]["n"] == 3 and rows[0]["status"] == "measured"
    assert rows[0]["a_ppl"] == pytest.approx(110.0) and rows[0]["b_ppl"] == pytest.approx(165.0)
    assert rows[2]["status"].startswith("not run (in progress: 3 of 6 runs of wv-tiny-diff")


def test_token_trend_pools_budget_ladder_and_fits_slopes_per_seed(tmp_path):
    """Coupled vs standard at 2^18 (cpu-short wv-tiny), 2^20 (cpu wv-tiny) and 2^21 tokens (cpu wv-tiny-2x) built as
    pct = a_s + b_s (log2 tokens - 18) with slopes b = -1, -2, -3: the per-seed fit recovers them, so the slope is
    -2 with the hand-computed t interval -2 +- t(0.975, 2) * 1 / sqrt(3); the per-budget means are exact."""
    import math

    from scipy import stats as st

    intercepts, slopes = (1.0, 3.0, -1.0), (-1.0, -2.0, -3.0)
    ladder = (("cpu-short", "wv-tiny", 2**18), ("cpu", "wv-tiny", 2**20), ("cpu", "wv-tiny-2x", 2**21))
    for seed in range(3):
        for protocol, cell, tokens in ladder:
            pct = intercepts[seed] + slopes[seed] * (math.log2(tokens) - 18)
            write_record(tmp_path, protocol, cell, "standard", seed, {"test/perplexity": 200.0}, tokens=tokens)
            coupled = {"test/perplexity": 200.0 * (1 + pct / 100)}
            write_record(tmp_path, protocol, cell, "coupled", seed, coupled, tokens=tokens)
    trend = build_report(get_study("cpu"), tmp_path, get_study)["token_trend"]
    assert trend["status"] == "measured"
    assert trend["slope"]["mean"] == pytest.approx(-2.0)
    half = st.t.ppf(0.975, 2) / math.sqrt(3)
    assert (trend["slope"]["low"], trend["slope"]["high"]) == (pytest.approx(-2 - half), pytest.approx(-2 + half))
    assert [b["tokens"] for b in trend["budgets"]] == [2**18, 2**20, 2**21]
    assert [b["mean"] for b in trend["budgets"]] == pytest.approx([1.0, -3.0, -5.0]), trend["budgets"]
    # the cpu-short report pools the same ladder; with only one budget per seed there is no slope
    short = build_report(get_study("cpu-short"), tmp_path, get_study)["token_trend"]
    assert short["slope"]["mean"] == pytest.approx(-2.0)
    (tmp_path / "none" / "runs" / "smoke").mkdir(parents=True)
    only_smoke = build_report(get_study("smoke"), tmp_path / "none", get_study)["token_trend"]
    assert only_smoke["status"].startswith("not run (0 seeds") and only_smoke["budgets"] == []


@pytest.mark.parametrize("changes, inside", [((-6.0, -7.0, -6.8), True), ((-1.0, -1.2, -0.8), False)])
def test_report_says_whether_the_papers_value_is_inside_our_interval(tmp_path, changes, inside):
    """C1's paper value is -6.6%: per-seed changes -6.0/-7.0/-6.8% (mean -6.6) put it inside the interval,
    -1.0/-1.2/-0.8% (interval about [-1.5, -0.5]) exclude it; the markdown and README tables show it."""
    for seed, change in enumerate(changes):
        for variant, ppl in (("standard", 100.0 + 10 * seed), ("coupled", (100.0 + 10 * seed) * (1 + change / 100))):
            write_record(tmp_path, "cpu", "wv-tiny", variant, seed, {"test/perplexity": ppl})
    study = get_study("cpu")
    report = build_report(study, tmp_path, get_study)
    c1 = next(r for r in report["rows"] if r["id"] == "C1")
    assert c1["mean"] == pytest.approx(sum(changes) / 3)
    assert c1["paper_effect"] == -6.6 and c1["paper_effect_in_ci"] is inside
    word = "yes" if inside else "no"
    assert f"| **{c1['verdict']}** | {word} (-6.6) |" in format_markdown(study, report, COMMANDS)
    assert f"| {c1['verdict']} | {word} (-6.6) |" in study.layout.readme(report, COMMANDS)
    assert "paper_effect" not in next(r for r in report["rows"] if r["id"] == "C7")  # not run: no comparison


def test_a_pending_wikitext2_evaluation_is_completed_when_the_run_folder_is_here(tmp_path, monkeypatch, capsys):
    """A record trained with --defer-wt2 (``wt2_pending``) and reached later without it: evaluated and rewritten
    when its run folder exists on this machine; left as it is, with a message, when the folder is absent."""
    import dataclasses
    import json
    from pathlib import Path

    from coupled_qk.study import run as study_run
    from coupled_qk.study.design import Cells
    from coupled_qk.study.run import Places, run_study

    calls = []

    def fake_eval(run_dir, data_dir):
        calls.append(Path(run_dir))
        return {"wt2_test/perplexity": 1234.5}

    monkeypatch.setattr(study_run, "wikitext2_eval", fake_eval)
    smoke = get_study("smoke")
    cell = dataclasses.replace(smoke.cell("wv-tiny"), variants=("standard",), seeds=(0,))
    one = dataclasses.replace(smoke, stages=(Cells((cell,)),))  # a study of this one run
    run_root, out_dir = tmp_path / "runs", tmp_path / "out"
    run_dir = run_root / "smoke" / "wv-tiny" / "standard" / "seed0"
    path = write_record(out_dir, one, "wv-tiny", "standard", 0, {"test/perplexity": 100.0}, wt2_pending=True)
    places = Places(out_dir, run_root, tmp_path, tmp_path)
    assert run_study(one, places) == 0 and calls == []  # no run folder here: nothing to evaluate
    assert "is not on this machine" in capsys.readouterr().out
    assert json.loads(path.read_text())["wt2_pending"] is True
    run_dir.mkdir(parents=True)
    assert run_study(one, places) == 0 and calls == [run_dir]
    rec = json.loads(path.read_text())
    assert rec["wt2_pending"] is False and rec["final"] == {"test/perplexity": 100.0, "wt2_test/perplexity": 1234.5}
    assert run_study(one, places) == 0 and len(calls) == 1  # done once


def test_rank_perplexity_correlation_separates_within_cell_from_pooled(tmp_path):
    """Two cells whose levels differ (scan-dhead64: higher rank, lower perplexity) make the pooled correlation
    negative, while inside each cell rank and perplexity rise together (ppl = level + 2 rank + noise): the
    within-cell r is positive and equals the stats function on the cell-centred points; the report shows both."""
    from coupled_qk.study import stats

    study = get_study("cpu")
    noise = [0.3, -0.2, 0.1, -0.4, 0.2, 0.0]
    points = []
    for cell, rank0, level in (("wv-tiny", 10.0, 200.0), ("scan-dhead64", 20.0, 150.0)):
        for seed in range(3):
            for j, variant in enumerate(("standard", "coupled")):
                rank = rank0 + seed + 0.5 * j
                ppl = level + 2 * rank + noise[2 * seed + j]
                points.append((cell, rank, ppl))
                diagnostics = {"effective_rank": rank}
                write_record(tmp_path, study, cell, variant, seed, {"test/perplexity": ppl}, diagnostics=diagnostics)
    for seed in (3, 4):  # extra seeds of wv-tiny: counted once, in wv-tiny's group
        for j, variant in enumerate(("standard", "coupled")):
            rank = 10.0 + seed + 0.5 * j
            ppl = 200.0 + 2 * rank + 0.1 * (j - 0.5)
            points.append(("wv-tiny", rank, ppl))
            diagnostics = {"effective_rank": rank}
            write_record(
                tmp_path, study, "wv-tiny-seeds", variant, seed, {"test/perplexity": ppl}, diagnostics=diagnostics
            )
    report = build_report(study, tmp_path, get_study)
    corr = next(r for r in report["rows"] if r["id"] == "C13")["details"]["rank_vs_ppl"]
    cells, ranks, ppls = zip(*points)
    assert corr["n"] == 16 and corr["pearson_r"] == pytest.approx(stats.correlation(ranks, ppls)["pearson_r"])
    assert corr["pearson_r"] < -0.5
    within = stats.within_group_correlation(ranks, ppls, cells)
    assert corr["within_cell"] == pytest.approx(within) and within["groups"] == 2 and within["pearson_r"] > 0.9
    md = format_markdown(study, report, COMMANDS)
    assert "## Effective rank and perplexity across runs (C13)" in md
    assert f"| within cells (centred on each cell's means) | 16 (2) | {within['pearson_r']:.2f} [" in md


def test_claims_variants_refuse_another_name_of_a_cells_own_variant():
    """`claims --variants coupled+n_steps=1` would train each cell's coupled runs a second time under a new label."""
    smoke = get_study("smoke")
    cell = next(c for c in smoke.cells if "coupled" in c.variants)
    with pytest.raises(ValueError, match=rf"cell {cell.name}\): 'coupled' and 'coupled\+n_steps=1' are the same model"):
        smoke.with_variants(["coupled+n_steps=1"])
    with pytest.raises(ValueError, match=r"'coupled\+n_steps=2' and 'coupled\+n_steps=2.0' are the same model"):
        smoke.with_variants(["coupled+n_steps=2", "coupled+n_steps=2.0"])
    assert smoke.with_variants(["coupled+n_steps=2"]).extra_variants == ("coupled+n_steps=2",)


def test_a_record_made_in_another_precision_is_not_reused(tmp_path, monkeypatch):
    """A record names the precision its run trained in; the runner (here=True), on a machine that would train the
    run in another one (compile on a CPU with native bf16, faked), trains it again instead of mixing fp32 and bf16
    records; a report (here=False) compares it only with a precision the plan fixes."""
    import dataclasses
    from pathlib import Path

    from coupled_qk.study.records import same_run_problem, settings_of
    from coupled_qk.training import distributed

    cell = get_study("cpu-short").cell("wv-tiny")
    cfg = dataclasses.replace(cell.config("coupled", 1, Path("runs/x"), Path("data")), device="cpu", compile=True)
    rec = {"config": settings_of(cfg), "precision": "fp32"}
    monkeypatch.setattr(distributed, "cpu_supports_bf16", lambda: False)
    assert same_run_problem(rec, cfg) is None  # a CPU without native bf16: compiled runs train in fp32 too
    monkeypatch.setattr(distributed, "cpu_supports_bf16", lambda: True)
    assert same_run_problem(rec, cfg) == "trained in fp32; this machine trains it in bf16"
    assert same_run_problem(rec, dataclasses.replace(cfg, compile=False)) is None
    assert same_run_problem(rec, cfg, here=False) is None  # dtype auto: a report does not depend on the machine
    fixed = dataclasses.replace(cfg, dtype="bf16")
    assert same_run_problem({**rec, "config": settings_of(fixed)}, fixed, here=False) == (
        "trained in fp32; this machine trains it in bf16"
    )
