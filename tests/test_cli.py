"""Command line: describe output, train/eval/compare end to end on a tiny corpus, clear errors."""

import json
import math

import pytest

from coupled_qk.cli import main


def test_describe_prints_counts_and_overhead(capsys):
    assert main(["describe", "--preset", "60m", "--attention", "coupled"]) == 0
    out = capsys.readouterr().out
    assert "63,604,320" in out and "98,400" in out and "+0.1549%" in out


def test_describe_json(capsys):
    assert main(["describe", "--preset", "tiny", "--attention", "differential", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["extra"] == 4 * 6 * 32


def test_bad_option_is_a_clear_error(capsys):
    assert main(["describe", "--set", "n_head=3"]) == 2
    assert "unknown GPTConfig field 'n_head' (did you mean 'n_heads'?)" in capsys.readouterr().err
    assert main(["describe", "--attention", "flash"]) == 2
    assert "attention='flash'" in capsys.readouterr().err


def test_bad_seeds_and_batch_size(tmp_path, capsys):
    assert main(["compare", "--seeds", "a,b"]) == 2
    assert "--seeds='a,b'" in capsys.readouterr().err
    from coupled_qk.training.perplexity import evaluate_perplexity

    with pytest.raises(ValueError, match="batch_size=0"):
        evaluate_perplexity(None, [1, 2, 3], 4, batch_size=0)


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "describe" in capsys.readouterr().out


@pytest.mark.slow
def test_train_eval_compare(tiny_corpus, tmp_path, capsys):
    common = [
        "--corpus",
        str(tiny_corpus),
        "--tokenizer",
        "bpe-300",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--set",
        "n_layer=1",
        "--set",
        "d_model=32",
        "--set",
        "n_heads=2",
        "--set",
        "block_size=16",
        "--batch-size",
        "4",
        "--eval-interval",
        "3",
        "--eval-batches",
        "2",
        "--no-progress",
        "--no-tensorboard",
    ]
    run = tmp_path / "run"
    assert main(["train", *common, "--max-steps", "6", "--out-dir", str(run), "--attention", "coupled"]) == 0
    assert json.loads((run / "results.json").read_text())["steps"] == 6
    printed = capsys.readouterr().out
    assert '"test/bits_per_byte"' in printed and '"test/perplexity"' in printed
    assert main(["eval", str(run), "--stride", "8", "--json", str(tmp_path / "e.json")]) == 0
    out = capsys.readouterr().out
    assert "valid: token perplexity" in out and "test: token perplexity" in out
    res = json.loads((tmp_path / "e.json").read_text())
    assert res["stride"] == 8 and res["valid"]["perplexity"] > 1
    raw = (tiny_corpus / "test.txt").read_bytes()  # bits per byte: total NLL in bits over the file's own bytes
    assert res["test"]["bits_per_byte"] == pytest.approx(res["test"]["nll"] / math.log(2) / len(raw), rel=1e-12)
    assert f"{res['test']['bits_per_byte']:.4f} bits per byte over {len(raw):,} bytes" in out
    cmp_dir = tmp_path / "cmp"
    assert (
        main(
            [
                "compare",
                *common,
                "--max-steps",
                "3",
                "--out-dir",
                str(cmp_dir),
                "--variants",
                "standard,coupled-leapfrog",
                "--seeds",
                "0,1",
            ]
        )
        == 0
    )
    summary = json.loads((cmp_dir / "results.json").read_text())
    assert set(summary["variants"]) == {"standard", "coupled_leapfrog"}
    assert len(summary["variants"]["coupled_leapfrog"]["test_perplexity"]["values"]) == 2
    assert summary["variants"]["coupled_leapfrog"]["overrides"] == {"attention": "coupled", "integrator": "leapfrog"}
    assert (cmp_dir / "loss_curves.png").stat().st_size > 1000
    assert "| coupled_leapfrog |" in (cmp_dir / "results.md").read_text()
    capsys.readouterr()
    again = ["compare", *common, "--out-dir", str(cmp_dir), "--variants", "standard", "--seeds", "0"]
    assert main([*again, "--max-steps", "3"]) == 0
    assert "reusing the finished run" in capsys.readouterr().out
    assert main([*again, "--max-steps", "5"]) == 2
    assert "different settings (max_steps: 3 vs 5)" in capsys.readouterr().err


def test_eval_missing_checkpoint(tmp_path, capsys):
    assert main(["eval", str(tmp_path)]) == 2
    assert "no checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("coupled-leapfrog", {"attention": "coupled", "integrator": "leapfrog"}),
        (
            "coupled+n_steps=3+dt_init=0.0",
            {"attention": "coupled", "integrator": "euler", "n_steps": 3, "dt_init": 0.0},
        ),
        ("coupled_euler", {"attention": "coupled", "integrator": "euler"}),
        ("differential", {"attention": "differential"}),
    ],
)
def test_variant_specs(spec, expected):
    from coupled_qk.models.specs import parse_variants, variant_overrides

    assert variant_overrides(spec) == expected
    assert parse_variants(f"{spec},standard,{spec}") == [parse_variants(spec)[0], "standard"]


@pytest.mark.parametrize(
    "spec, match", [("flash", "unknown variant"), ("coupled+n_steps", "FIELD=VALUE"), (",", "no variant")]
)
def test_bad_variant_specs(spec, match):
    from coupled_qk.models.specs import parse_variants

    with pytest.raises(ValueError, match=match):
        parse_variants(spec)


@pytest.mark.parametrize("command", ["demo", "compare"])
@pytest.mark.parametrize(
    "flag, value", [("--attention", "differential"), ("--integrator", "leapfrog"), ("--n-steps", "3")]
)
def test_variant_commands_refuse_flags_they_would_ignore(command, flag, value, tmp_path, capsys):
    assert main([command, flag, value, "--out-dir", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert f"{command} trains the variants named by --variants, so {flag}" in err
    assert not (tmp_path / "x").exists()


def test_split_flags_reach_task_options(capsys):
    assert (
        main(
            [
                "train",
                "--print-config",
                "--valid-fraction",
                "0.05",
                "--min-split-words",
                "2000",
                "--opt",
                'task_options={"split_seed": 4}',
            ]
        )
        == 0
    )
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["task_options"] == {"split_seed": 4, "valid_fraction": 0.05, "min_split_words": 2000}
    assert main(["train", "--print-config", "--min-split-words", "many"]) == 2
    assert "--min-split-words=many is not an integer" in capsys.readouterr().err


def test_relative_corpus_path_is_stored_absolute(tmp_path, monkeypatch, capsys):
    (tmp_path / "notes.txt").write_text("some text\n")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--print-config", "--corpus", "notes.txt"]) == 0
    assert json.loads(capsys.readouterr().out)["corpus"] == str(tmp_path.resolve() / "notes.txt")
    assert main(["train", "--print-config", "--corpus", "pubmed"]) == 0
    assert json.loads(capsys.readouterr().out)["corpus"] == "pubmed"


@pytest.mark.slow
def test_demo_quick_is_a_labelled_smoke_run(tiny_corpus, tmp_path, capsys):
    """``demo --quick`` end to end on a tiny corpus (flags still override its budget): every variant's final
    evaluation scores only the windows one quick validation reads (eval_batches x the flag's batch size), so the
    final validation loss of the last checkpoint equals the curve's last quick validation; the printed table says it
    is a smoke run."""
    from coupled_qk.commands.demo import QUICK_DEFAULTS
    from coupled_qk.training.run_folder import RunFolder

    out_dir = tmp_path / "quick"
    assert (
        main(
            [
                "demo",
                "--quick",
                "--corpus",
                str(tiny_corpus),
                "--tokenizer",
                "bpe-300",
                "--cache-dir",
                str(tmp_path / "cache"),
                "--set",
                "n_layer=1",
                "--set",
                "d_model=32",
                "--set",
                "n_heads=2",
                "--set",
                "block_size=16",
                "--batch-size",
                "4",
                "--max-tokens",
                "128",
                "--variants",
                "standard,coupled",
                "--out-dir",
                str(out_dir),
                "--no-progress",
                "--no-tensorboard",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "demo --quick: a smoke run" in out
    windows = QUICK_DEFAULTS["eval_batches"] * 4  # --batch-size 4
    assert f"Smoke run: the final evaluation scored valid on its first {windows * 16:,} of " in out
    summary = json.loads((out_dir / "results.json").read_text())
    assert summary["base_config"]["task_options"] == {"final_eval_windows": windows}
    assert summary["base_config"]["max_tokens"] == 128  # the flag wins over QUICK_DEFAULTS
    assert summary["base_config"]["eval_interval"] == QUICK_DEFAULTS["eval_interval"]
    for entry in summary["variants"].values():
        final = entry["runs"][0]["final"]
        assert final["test/n_tokens"] == windows * 16 and final["test/subsample_windows"] == windows
        curve = [r for r in RunFolder(entry["runs"][0]["run_dir"]).read_metrics() if "valid/loss" in r]
        assert curve[-1]["valid/n_tokens"] == final["valid/n_tokens"]
        assert curve[-1]["valid/loss"] == pytest.approx(final["valid/loss"], rel=1e-6)  # same weights, same text


@pytest.mark.parametrize("argv", [["eval", "RUN"], ["glue", "RUN"], ["train"], ["compare"], ["demo"]])
def test_no_progress_is_an_option_of_the_commands_that_show_progress(argv):
    """README: `--no-progress` for silence; `eval` (its evaluation bars) lacked it."""
    from coupled_qk.cli import build_parser

    assert build_parser(argv[0]).parse_args([*argv, "--no-progress"]).progress is False
    assert build_parser(argv[0]).parse_args(argv).progress is not False  # True, or None: the config's default
