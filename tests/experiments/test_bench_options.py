"""Every ``coupled-qk bench`` option reaches the measurement of each mode that claims it, and every other mode
refuses it in one line (``OPTION_MODES``): checked against what the runners actually receive (mocked, so nothing is
measured), not against a second hand-written table."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coupled_qk.cli import build_parser, main
from coupled_qk.commands import bench

MODES = ("train", "decode", "memory", "fastpath", "sweep")
RUNNERS = dict(train="run_bench", decode="run_decode", memory="run_memory", fastpath="run_fastpath", sweep="run_sweep")
VALUES = {  # a value other than the default for every option that only some modes use
    "--dtype": "bf16",
    "--compile": None,
    "--n-steps": "2",
    "--seq-len": "8",
    "--batch-size": "3",
    "--warmup": "4",
    "--repeats": "2",
    "--modes": "eager-fp32",
    "--peers": "",
    "--no-decode": None,
    "--prefixes": "4",
    "--decode-batch-sizes": "2",
    "--new-tokens": "3",
    "--cache-len": "8",
    "--sweep-d-model": "32",
    "--sweep-seq-len": "16",
    "--sweep-n-steps": "3",
}
MICRO = [
    "--set",
    "vocab_size=64",
    "--set",
    "block_size=128",
    "--set",
    "n_layer=1",
    "--set",
    "d_model=16",
    "--set",
    "n_heads=2",
]


class Measured(Exception):
    """Raised by a mocked runner with what it was asked to measure."""


def _mode_args(mode: str) -> list[str]:
    return ["--sweep"] if mode == "sweep" else ["--mode", mode]


def _option_args(options) -> list[str]:
    return [a for o in options for a in ([o] if VALUES[o] is None else [f"{o}={VALUES[o]}"])]


def _call(mode: str, options, out_dir, monkeypatch):
    """What ``bench`` hands to ``mode``'s runner for ``options`` (a dict of its arguments), or the ValueError."""

    def record(*args, **kwargs):
        raise Measured(repr(args) + repr(sorted((k, v) for k, v in kwargs.items() if k != "log")))

    for name in RUNNERS.values():
        monkeypatch.setattr(bench, name, record)
    args = build_parser("bench").parse_args(
        ["bench", *MICRO, *_mode_args(mode), *_option_args(options), "--out-dir", str(out_dir)]
    )
    try:
        bench.run(args)
    except Measured as m:
        return str(m)
    except ValueError as e:
        return e
    raise AssertionError("the runner was not called")


def test_the_table_names_every_mode_specific_option():
    assert set(VALUES) == set(bench.OPTION_MODES)
    assert all(set(modes) <= set(MODES) for modes in bench.OPTION_MODES.values())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("option", sorted(VALUES))
def test_an_option_reaches_the_modes_that_claim_it_and_is_refused_elsewhere(mode, option, tmp_path, monkeypatch):
    baseline = _call(mode, [], tmp_path, monkeypatch)
    assert isinstance(baseline, str)
    got = _call(mode, [option], tmp_path, monkeypatch)
    if mode in bench.OPTION_MODES[option]:
        assert isinstance(got, str), got
        assert got != baseline, f"{option} is claimed by {mode} but changes nothing it measures"
    else:
        assert isinstance(got, ValueError)
        assert str(got).startswith(f"{option}") and "does not apply to" in str(got)


@given(st.sampled_from(MODES), st.lists(st.sampled_from(sorted(VALUES)), unique=True, max_size=5))
def test_any_combination_is_refused_iff_one_option_is_ignored(tmp_path_factory, mode, options):
    ignored = [o for o in options if mode not in bench.OPTION_MODES[o]]
    if mode == "fastpath" and "--no-decode" in options:
        ignored += [o for o in options if o in ("--prefixes", "--decode-batch-sizes", "--new-tokens")]
    with pytest.MonkeyPatch.context() as mp:
        got = _call(mode, options, tmp_path_factory.mktemp("o"), mp)
    assert isinstance(got, ValueError) == bool(ignored), (options, got)
    if ignored:
        assert any(str(got).startswith(o) for o in ignored)


def test_refusals_are_one_line(capsys, tmp_path):
    assert main(["bench", "--mode", "decode", "--dtype", "bf16", "--out-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "coupled-qk bench: error: --dtype=bf16 does not apply to --mode decode (it measures eager fp32 decoding; "
        "--dtype is for --mode train and memory)"
    ]
    assert main(["bench", "--sweep", "--mode", "memory", "--out-dir", str(tmp_path)]) == 2
    assert "--sweep and --mode memory cannot be combined" in capsys.readouterr().err
    assert main(["bench", "--mode", "fastpath", "--no-decode", "--new-tokens", "3", "--out-dir", str(tmp_path)]) == 2
    assert "--new-tokens=3 does not apply with --no-decode" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before anything was written
