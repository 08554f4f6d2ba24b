"""``coupled-qk glue``: fine-tunes over models x tasks x seeds, reuse, summary JSON/markdown, paired intervals."""

import json
import math

import pytest
from scipy import stats
from test_glue_task import make_pretrained, write_sst2  # tests/training is on sys.path (rootdir conftest)

from coupled_qk.cli import main
from coupled_qk.experiments.glue.finetune import (
    finetune_config,
    model_name,
    paired_difference,
    parse_per_task,
    parse_tasks,
)


def test_paired_difference_matches_a_hand_computed_t_interval():
    d = paired_difference([0.7, 0.8, 0.9], [0.6, 0.6, 0.9])  # differences 0.1, 0.2, 0.0
    assert d["mean"] == pytest.approx(0.1) and d["n"] == 3
    half = 4.302652729911275 * 0.1 / math.sqrt(3)  # t_{0.975, 2} * sd / sqrt(n), sd of (0.1, 0.2, 0) = 0.1
    assert d["ci95"] == pytest.approx([0.1 - half, 0.1 + half])
    assert stats.t.ppf(0.975, 2) == pytest.approx(4.302652729911275)
    assert paired_difference([0.5], [0.4])["ci95"] is None


def test_parse_tasks_and_defaults(tmp_path):
    assert parse_tasks("all") == ["sst2", "cola", "rte", "mrpc"]
    assert parse_tasks("RTE, mrpc") == ["rte", "mrpc"]
    with pytest.raises(ValueError, match="'qnli' is unknown"):
        parse_tasks("rte,qnli")
    assert parse_per_task("3000") == 3000 and parse_per_task(None) is None
    assert parse_per_task("SST2=3000, rte=600") == {"sst2": 3000, "rte": 600}
    for bad in ("0", "x", "rte=0", "qqp=5", "rte"):
        with pytest.raises(ValueError, match="--max-train-examples"):
            parse_per_task(bad)
    assert model_name(tmp_path / "coupled" / "seed0") == "coupled"
    assert model_name(tmp_path / "coupled" / "seed0" / "ckpt-00000064") == "coupled"
    assert model_name(tmp_path / "coupled" / "seed0" / "best-00000032") == "coupled"
    assert model_name(tmp_path / "my-run") == "my-run"
    glue_dir = write_sst2(tmp_path / "glue", n_train=100, n_dev=10)
    cfg = finetune_config("pre", "sst2", 1, tmp_path / "o", glue_dir=str(glue_dir), max_train_examples=50)
    assert cfg.max_steps == math.ceil(3 * 50 / 32) and cfg.lr == 1e-4 and cfg.warmup_steps == 1
    assert cfg.task_options == {
        "glue_task": "sst2",
        "pretrained": "pre",
        "pooling": "last",
        "glue_dir": str(glue_dir),
        "max_train_examples": 50,
    }


def test_command_end_to_end_and_reuse(tmp_path, capsys):
    a = make_pretrained(tmp_path / "standard" / "seed0")
    b = make_pretrained(tmp_path / "coupled" / "seed0", attention="coupled")
    glue_dir = write_sst2(tmp_path / "glue", n_train=64, n_dev=40)
    out = tmp_path / "out"
    args = [
        str(a),
        str(b),
        "--task",
        "sst2",
        "--seeds",
        "0,1",
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
    ]
    assert main(["glue", *args]) == 0
    summary = json.loads((out / "results.json").read_text())
    assert summary["schema"] == "coupled-qk/glue-results/v1" and summary["baseline"] == "standard"
    assert list(summary["models"]) == ["standard", "coupled"]
    assert summary["settings"]["sst2"]["dtype"] == "fp32" and summary["settings"]["sst2"]["batch_size"] == 16
    assert summary["models"]["coupled"]["attention"] == "coupled"
    runs = {m: summary["models"][m]["tasks"]["sst2"]["runs"] for m in summary["models"]}
    for m in runs:
        for r in runs[m]:
            res = json.loads((out / m / "sst2" / f"seed{r['seed']}" / "results.json").read_text())
            assert r["dev"]["accuracy"] == res["final"]["dev/accuracy"] and res["steps"] == 4
    diffs = [
        x["dev"]["accuracy"] - y["dev"]["accuracy"] for x, y in zip(runs["coupled"], runs["standard"], strict=True)
    ]
    assert summary["differences"]["coupled"]["sst2"]["accuracy"]["values"] == pytest.approx(diffs)
    table = (out / "results.md").read_text()
    assert "| coupled − standard |" in table and "majority class" in table
    t_975_1 = 12.706204736174698  # Student t quantile, 0.975, 1 degree of freedom (two seeds)
    for m, entry in summary["models"].items():  # each cell: mean over the seeds with its 95% t-interval
        acc = [r["dev"]["accuracy"] for r in runs[m]]
        mean, half = sum(acc) / 2, t_975_1 * abs(acc[0] - acc[1]) / math.sqrt(2) / math.sqrt(2)
        assert entry["tasks"]["sst2"]["metrics"]["accuracy"]["ci95"] == pytest.approx([mean - half, mean + half])
        assert f"| {m} | {100 * mean:.1f} [{100 * (mean - half):.1f}, {100 * (mean + half):.1f}] |" in table
    d_mean = sum(diffs) / 2
    d_half = t_975_1 * abs(diffs[0] - diffs[1]) / math.sqrt(2) / math.sqrt(2)
    assert summary["differences"]["coupled"]["sst2"]["accuracy"]["ci95"] == pytest.approx(
        [d_mean - d_half, d_mean + d_half]
    )
    capsys.readouterr()
    assert main(["glue", *args]) == 0  # everything finished: reused, nothing retrained
    assert capsys.readouterr().out.count("reusing the finished run") == 4
    changed = [x if x != "1e-3" else "2e-3" for x in args]
    assert main(["glue", *changed]) == 2
    assert "different settings (lr: 0.001 vs 0.002)" in capsys.readouterr().err


def test_command_errors(tmp_path, capsys):
    a = make_pretrained(tmp_path / "pre")
    assert main(["glue", str(a), "--task", "wnli", "--out-dir", str(tmp_path / "o")]) == 2
    assert "'wnli' is unknown" in capsys.readouterr().err
    assert (
        main(
            [
                "glue",
                str(tmp_path / "missing"),
                "--task",
                "sst2",
                "--glue-dir",
                str(tmp_path),
                "--out-dir",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    assert "no checkpoint at" in capsys.readouterr().err  # every run is checked before anything is created
    assert main(["glue", str(a), "--task", "sst2", "--glue-dir", str(tmp_path), "--out-dir", str(tmp_path / "o")]) == 2
    assert "SST-2/train.tsv is missing" in capsys.readouterr().err


def test_task_repeats_and_unknown_tasks_name_the_option():
    with pytest.raises(ValueError, match=r"--task='rte,RTE' repeats a task"):
        parse_tasks("rte,RTE")  # was: "the plan uses a run folder twice" after the output folder was claimed
    with pytest.raises(ValueError, match=r"--task='qnli': GLUE task 'qnli' is unknown"):
        parse_tasks("qnli")


@pytest.mark.parametrize(
    "names, message",
    [
        (
            "",
            r"--names=\[''\]: \[''\] cannot name a folder",
        ),  # was: fine-tuned into <out>/<task>/ without a model level
        ("..", r"--names=\['..'\]: \['..'\] cannot name a folder"),  # was: fine-tuned into <out>/../<task>/
        ("a/b", r"\['a/b'\] cannot name a folder"),
        ("a,b", r"--names=\['a', 'b'\]: need one distinct name per pretrained run \(1\)"),
    ],
)
def test_bad_names_are_refused_before_any_folder(tmp_path, capsys, names, message):
    import re

    a = make_pretrained(tmp_path / "standard" / "seed0")
    glue_dir = write_sst2(tmp_path / "glue", n_train=16, n_dev=8)
    out = tmp_path / "out"
    assert (
        main(
            [
                "glue",
                str(a),
                "--task",
                "sst2",
                "--seeds",
                "0",
                "--glue-dir",
                str(glue_dir),
                "--names",
                names,
                "--out-dir",
                str(out),
                "--no-progress",
            ]
        )
        == 2
    )
    assert re.search(message, capsys.readouterr().err) and not out.exists() and not (tmp_path / "sst2").exists()


def test_runs_with_the_same_folder_name_ask_for_names(tmp_path, capsys):
    a = make_pretrained(tmp_path / "x" / "standard")
    b = make_pretrained(tmp_path / "y" / "standard")
    glue_dir = write_sst2(tmp_path / "glue", n_train=16, n_dev=8)
    out = tmp_path / "out"
    assert main(["glue", str(a), str(b), "--task", "sst2", "--glue-dir", str(glue_dir), "--out-dir", str(out)]) == 2
    assert "--names to label them" in capsys.readouterr().err and not out.exists()


def test_a_synthetic_task_run_is_named_by_every_command_that_reads_text(tmp_path, capsys):
    """An MQAR run passed to eval/generate/analyze/glue failed as "tokenizer ... not found" / "no tokenizer for
    checkpoint": the user's mistake (a run that reads MQAR token ids, not text) was never named."""
    import shutil

    from coupled_qk.analysis.analyze import analyze_checkpoints
    from coupled_qk.training.evaluate import evaluate_checkpoint
    from coupled_qk.training.pretrained import load_run
    from coupled_qk.training.run_folder import load_checkpoint_model

    run = make_pretrained(tmp_path / "mqar-run")
    shutil.rmtree(run / "tokenizer")
    (run / "config.json").write_text(json.dumps({"task": "mqar"}))
    message = r"is a run of the synthetic task 'mqar' \(task='mqar' in .*config.json\)"
    assert load_checkpoint_model(run)[1]["step"] >= 0  # loading the model alone stays allowed
    for call in (
        lambda: load_run(run),
        lambda: analyze_checkpoints([run], "wiki-vital", out_dir=tmp_path / "a"),
        lambda: evaluate_checkpoint(run, corpus="wiki-vital"),
    ):
        with pytest.raises(ValueError, match=message):
            call()
    glue_dir = write_sst2(tmp_path / "glue", n_train=16, n_dev=8)
    assert (
        main(["glue", str(run), "--task", "sst2", "--glue-dir", str(glue_dir), "--out-dir", str(tmp_path / "g")]) == 2
    )
    assert "synthetic task 'mqar'" in capsys.readouterr().err
