"""The command-line types (``coupled_qk.checks.cli``) apply the value checks they are built from: one rule per
value, whether it comes from the library, a config file or the command line. Generated: for any number text, a type
accepts exactly what its value check accepts (giving the same number) and refuses with the check's own message,
reworded about the text typed; and the new rules themselves (a seed's range, a folder value, a thread count)."""

from __future__ import annotations

import argparse
import functools

import pytest
import reliability_profile  # noqa: F401  (the example budget)
from hypothesis import given
from hypothesis import strategies as st

from coupled_qk.checks import cli
from coupled_qk.checks.paths import folder_value, output_location, path_value
from coupled_qk.checks.values import MAX_SEED, finite, nonneg_int, positive_int, seed_int
from coupled_qk.devices import AUTOCAST_DTYPES, check_device, check_dtype

NUMBER_TYPES = [
    (cli.positive_int_arg, int, positive_int),
    (cli.nonneg_int_arg, int, nonneg_int),
    (cli.seed_arg, int, seed_int),
    (cli.threads_arg, int, cli.thread_count),
    (cli.positive_float_arg, float, functools.partial(finite, lo=0, lo_open=True)),
    (cli.nonneg_float_arg, float, functools.partial(finite, lo=0)),
    (cli.fraction_arg, float, functools.partial(finite, lo=0, hi=1)),
]

INTS = st.one_of(st.integers(-5, 300), st.integers(MAX_SEED - 3, MAX_SEED + 3), st.integers(-(2**70), 2**70))
FLOATS = st.floats(allow_nan=True, allow_infinity=True, width=64) | st.floats(-2, 2)


def _outcome(fn, *args):
    """``("ok", fn(*args))`` or ``("refused", its message)``."""
    try:
        return "ok", fn(*args)
    except (ValueError, argparse.ArgumentTypeError) as exc:
        return "refused", str(exc)


@pytest.mark.parametrize("arg, kind, check", NUMBER_TYPES, ids=[a.__name__ for a, _, _ in NUMBER_TYPES])
@given(data=st.data())
def test_each_number_type_applies_its_value_check(arg, kind, check, data):
    number = data.draw(INTS if kind is int else FLOATS)
    text = str(number) if kind is int else repr(number)
    expected = _outcome(check, "--x", number)
    got = _outcome(arg, text)
    assert got[0] == expected[0], (text, got, expected)
    if got[0] == "ok":
        assert got[1] == expected[1] and type(got[1]) is kind
    else:  # the check's message, about the text typed: "--x=0 must be ..." reads "'0' must be ..."
        assert got[1] == expected[1].replace(f"--x={number!r}", repr(text), 1), (got[1], expected[1])


@pytest.mark.parametrize(
    "arg, check, texts",
    [
        (cli.device_arg, check_device, ["cpu", " CPU ", "auto", "gpu", "", "cuda:99", "tpu", "None"]),
        (cli.dtype_arg, check_dtype, [*AUTOCAST_DTYPES, "FP32", "", "fp64", "float32", "0"]),
    ],
)
def test_device_and_dtype_types_apply_the_device_checks(arg, check, texts):
    for text in texts:
        expected = _outcome(check, "--x", text)
        got = _outcome(arg, text)
        assert got[0] == expected[0], (text, got, expected)
        assert got[1] == (expected[1] if got[0] == "ok" else expected[1].replace(f"--x={text!r}", repr(text), 1))


def test_path_and_folder_types_apply_the_path_checks(tmp_path):
    a_file = tmp_path / "f.txt"
    a_file.write_text("x")
    for text in ["", "   ", "a\x00b", str(a_file), str(tmp_path), str(tmp_path / "new"), "~nosuchuser_xyz/x"]:
        for arg, check in ((cli.folder_arg, folder_value), (cli.path_arg, path_value)):
            expected = _outcome(check, "--x", text)
            got = _outcome(arg, text)
            assert got[0] == expected[0], (arg.__name__, text, got, expected)
            if got[0] == "ok":
                assert got[1] == text  # the text itself: the command resolves it
            else:
                assert got[1] == expected[1].replace(f"--x={text!r}", repr(text), 1)
                assert "--x" not in got[1] and got[1].startswith(repr(text)), got[1]


def test_seed_int_is_the_range_of_a_seed():
    for good in (0, 1, MAX_SEED):
        assert seed_int("seed", good) == good
    for bad, message in (
        (-1, "seed=-1 must be an integer >= 0"),
        (MAX_SEED + 1, f"seed={MAX_SEED + 1} must be in [0, {MAX_SEED}]"),
        (True, "seed=True must be an integer >= 0"),
        (2.0, "seed=2.0 must be an integer >= 0"),
    ):
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
            seed_int("seed", bad)


def test_folder_value_refuses_only_an_existing_file(tmp_path):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    assert folder_value("--dir", str(tmp_path)) == tmp_path
    assert folder_value("--dir", str(tmp_path / "missing" / "deeper")) == tmp_path / "missing" / "deeper"
    with pytest.raises(ValueError, match=r"--dir='.*/f' is a file; expected a folder"):
        folder_value("--dir", str(a_file))
    with pytest.raises(ValueError, match=r"--dir='.*/f/sub': .*/f is a file, so nothing can be created under it"):
        output_location("--dir", str(a_file / "sub"))  # folder_value passes; the location check refuses it


def test_thread_count_is_bounded_by_this_machine():
    assert cli.thread_count("--threads", 1) == 1
    assert cli.thread_count("--threads", cli.cpu_count()) == cli.cpu_count()
    with pytest.raises(ValueError, match=rf"--threads={cli.cpu_count() + 1} is more threads than this machine's"):
        cli.thread_count("--threads", cli.cpu_count() + 1)
    with pytest.raises(ValueError, match="--threads=0 must be a positive integer"):
        cli.thread_count("--threads", 0)


@given(st.lists(st.integers(-3, MAX_SEED + 3), min_size=1, max_size=5))
def test_parse_seeds_takes_what_seed_arg_takes(seeds):
    """Every seed of ``--seeds`` is a seed of ``--seed``; a list adds only "each seed once"."""
    text = ",".join(map(str, seeds))
    each = [_outcome(cli.seed_arg, str(s))[0] for s in seeds]
    got = _outcome(cli.parse_seeds, text)
    if got[0] == "ok":
        assert got[1] == seeds and all(o == "ok" for o in each) and len(set(seeds)) == len(seeds)
    else:
        assert got[1].startswith(f"--seeds={text!r}")
        assert any(o == "refused" for o in each) or len(set(seeds)) < len(seeds), got
