"""bench, compare, demo, claims and mqar: usage errors name the option and its value (--variants, typed options whose
message holds a quote, lengths beyond block_size) before any folder or measurement; claims report folders."""

import pytest

from coupled_qk.cli import main


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--preset", "tiny"],
        ["compare", "--preset", "tiny", "--max-steps", "5"],
        ["demo", "--quick"],
        ["claims", "--protocol", "smoke", "--plan"],
        ["mqar", "--dry-run"],
    ],
)
@pytest.mark.parametrize("value,expected", [("foo", "unknown variant 'foo'"), (",", "selects no variant")])
def test_bad_variants_name_the_option_before_any_folder(argv, value, expected, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--variants", value]) == 2
    err = capsys.readouterr().err
    assert f"--variants={value!r}: " in err and expected in err, err
    assert list(tmp_path.iterdir()) == []


def test_same_model_twice_names_the_option_once(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--preset", "tiny", "--variants", "coupled+n_steps=1,coupled"]) == 2
    err = capsys.readouterr().err
    assert err.count("--variants") == 1 and "are the same model" in err, err


@pytest.mark.parametrize(
    "argv,expected",
    [
        (
            ["bench", "--mode", "fastpath", "--peers", "gpt2,gpt2"],
            "error: --peers='gpt2,gpt2': expected a comma-separated subset of gpt2, llama without repeats (or '' "
            "for none)",
        ),
        (["bench", "--prefixes", ","], "error: --prefixes=',': expected a comma-separated list"),
        (["bench", "--repeats", "0"], "error: --repeats=0 must be a positive integer"),
    ],
)
def test_typed_option_errors_keep_the_value_and_the_message_whole(argv, expected, capsys):
    assert main(argv) == 2
    assert expected in capsys.readouterr().err


@pytest.mark.parametrize("protocol", ["smoke", "toy-converged"])
def test_claims_refuses_a_folder_of_bench_results(protocol, tmp_path, capsys):
    out = tmp_path / "bench"
    out.mkdir()
    (out / "bench-tiny-cpu.json").write_text("{}")
    (out / "bench-tiny-cpu.md").write_text("x")
    assert main(["claims", "--protocol", protocol, "--report-only", "--no-figures", "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--out-dir=" in err and "bench-tiny-cpu.json" in err, err
    assert sorted(p.name for p in out.iterdir()) == ["bench-tiny-cpu.json", "bench-tiny-cpu.md"]


def test_claims_folder_may_hold_every_protocols_reports(tmp_path):
    from coupled_qk.studies import studies
    from coupled_qk.study.report import report_dir

    names = ("cpu.json", "cpu.md", "cpu-readme.md", "cpu-converged.json", "verify-cpu-converged.md", "README.md")
    for name in (*names, "STUDIES.md"):
        (tmp_path / name).write_text("x")
    (tmp_path / "runs").mkdir()
    assert report_dir(tmp_path, "smoke", studies()).foreign_entries() == []


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["--seq-len", "1000"], "--seq-len=1000: 1000 > the model's block_size=128"),
        (["--mode", "memory", "--cache-len", "1000"], "--cache-len=1000: 1000 > the model's block_size=128"),
        (["--sweep", "--sweep-seq-len", "32,1000"], "--sweep-seq-len=32,1000: 1000 > the model's block_size=128"),
        (["--sweep", "--sweep-d-model", "64,66"], "--sweep-d-model=64,66: 66: GPTConfig.d_model=66 is not divisible"),
    ],
)
def test_bench_lengths_are_checked_before_any_measurement(argv, expected, tmp_path, monkeypatch, capsys):
    """The sweep measured every earlier point (minutes) before refusing a too long --sweep-seq-len."""
    from coupled_qk.commands import bench
    from coupled_qk.experiments.bench import cost_curve

    def no_measuring(*a, **k):
        raise AssertionError("measured before the check")

    monkeypatch.setattr(bench, "run_bench", no_measuring)
    monkeypatch.setattr(cost_curve, "run_bench", no_measuring)
    out = tmp_path / "out"
    assert main(["bench", "--preset", "tiny", "--out-dir", str(out), *argv]) == 2
    assert expected in capsys.readouterr().err
    assert not out.exists()
