"""Every option of every sub-command is declared (a checking argparse type, fixed choices, a flag, a
``TrainConfig`` field, or a documented free-text option parsed by the command) and keeps the contract: a bad
value is exit 2 with one line on stderr naming the option, never a traceback.

The strategies come from the parsers themselves (introspection), so an option added later is covered, and an
option without a declaration fails :func:`test_every_option_is_declared`.
"""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import reliability_profile  # noqa: F401  (the example budget)
from hypothesis import given
from hypothesis import strategies as st

from coupled_qk import cli
from coupled_qk.checks import cli as arg_types
from coupled_qk.checks.values import field_types
from coupled_qk.training.config import TrainConfig

# free text parsed and checked by the command (or the library) itself, with the reason; anything else must be
# typed. Adding an option here is a decision that the command checks it (and a test there shows it).
FREE_TEXT = {
    "--prompt": "any text, including empty (start of a document)",
    "--variants": "variant specs: models.specs.parse_variants (tests/models/test_variants.py)",
    "--set": "FIELD=VALUE: GPTConfig fields parsed by checks.values.coerce",
    "--opt": "FIELD=VALUE: TrainConfig fields parsed by checks.values.coerce",
    "--seeds": "checks.cli.parse_seeds",
    "--labels": "analyze: non-empty, one per checkpoint",
    "--names": "glue: one distinct name per run",
    "--splits": "eval: distinct split names",
    "--task": "glue: experiments.glue.finetune.parse_tasks",
    "--cells": "claims, study: cell names of the study (commands.study.parse_cells)",
    "--shard": "claims, study: I/N, commands.study.parse_shard",
    "action": "study: list, plan, run, report or verify (commands.study.run, one line with the closest)",
    "name": "study: a registered study (commands.study.run, one line with the closest)",
    "--difficulties": "mqar: names of the preset's difficulties",
    "--max-train-examples": "glue: experiments.glue.finetune.parse_per_task",
    "--corpus": "a corpus name or path, resolved by data.corpora",
    "--attention": "GPTConfig.attention (registry names)",
    "--integrator": "GPTConfig.qk_map.integrator",
    "--config": "TrainConfig JSON file: JSONConfig.load (folder, non-UTF-8 and bad JSON are one line)",
    "checkpoint": "a run or ckpt-* folder: training.checkpoint.resolve_checkpoint",
    "checkpoints": "run or ckpt-* folders: training.checkpoint.resolve_checkpoint",
    "run_dirs": "run or ckpt-* folders: training.checkpoint.resolve_checkpoint",
    "command": "the sub-command name",
}

CHECKING_TYPES = {
    arg_types.positive_int_arg,
    arg_types.nonneg_int_arg,
    arg_types.positive_float_arg,
    arg_types.path_arg,
    arg_types.device_arg,
    arg_types.dtype_arg,
    arg_types.positive_ints_arg,
    arg_types.positive_floats_arg,
    arg_types.nonneg_float_arg,
    arg_types.fraction_arg,
    arg_types.seed_arg,
    arg_types.threads_arg,
    arg_types.folder_arg,
}

TRAIN_FIELDS = set(field_types(TrainConfig))


TOP = {name: cli.build_parser(name) for name in cli.COMMANDS}  # built once: parse_args does not change them


def subparsers() -> dict[str, argparse.ArgumentParser]:
    out = {}
    for name, parser in TOP.items():
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        out[name] = sub.choices[name]
    return out


PARSERS = subparsers()


def declared(action: argparse.Action) -> str | None:
    """How an option is declared, or None."""
    if action.nargs == 0:
        return "flag"
    if action.choices is not None:
        return "choices"
    if action.type in CHECKING_TYPES or getattr(action.type, "checks_choices", None):
        return "type"
    if action.dest in TRAIN_FIELDS and action.type is None:
        return "TrainConfig"
    name = action.option_strings[-1] if action.option_strings else action.dest
    if name in FREE_TEXT or action.dest in FREE_TEXT:
        return "free text"
    return None


def all_actions():
    for cmd, parser in PARSERS.items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            yield cmd, action


def test_every_option_is_declared():
    missing = [
        f"{cmd} {a.option_strings or a.dest} (type={getattr(a.type, '__name__', a.type)})"
        for cmd, a in all_actions()
        if declared(a) is None
    ]
    assert not missing, "options without a declaration (give them a checking type from checks/cli.py):\n" + "\n".join(
        missing
    )


def test_no_plain_int_or_float_types():
    """``type=int``/``type=float`` accept 0, negatives, NaN and inf: every number goes through a checking type."""
    plain = [f"{cmd} {a.option_strings}" for cmd, a in all_actions() if a.type in (int, float)]
    assert not plain, plain


# ---------------------------------------------------------------------------------------------- generated values

REQUIRED = {
    "eval": ["run"],
    "analyze": ["run"],
    "export": ["run", "hf"],
    "glue": ["run"],
    "generate": ["run"],
    "claims": ["--protocol", "smoke"],
    "study": ["plan"],
}

BAD = {
    arg_types.positive_int_arg: ["0", "-1", "2.5", "nan", "inf", "", "x", "False", "None", "١٢"],
    arg_types.nonneg_int_arg: ["-1", "2.5", "nan", "-inf", "", "x", "True", "None"],
    arg_types.positive_float_arg: ["0", "-1e-3", "nan", "inf", "-inf", "", "x", "False", "1e999"],
    arg_types.positive_ints_arg: ["", ",", "1,,2", "0", "1,-2", "1,1", "a", "2.5", "nan"],
    arg_types.positive_floats_arg: ["", ",", "1e-3,,2", "0", "nan", "inf", "1,1", "x"],
    arg_types.path_arg: ["", "   ", "a\x00b"],
    arg_types.nonneg_float_arg: ["-1", "nan", "inf", "", "x", "False"],
    arg_types.fraction_arg: ["-0.1", "1.5", "nan", "inf", "", "x", "True"],
    arg_types.device_arg: ["", "gpu", "cuda:99", "tpu", "cpu:x", "None", "0"],
    arg_types.dtype_arg: ["", "float32", "fp64", "None", "0"],
    arg_types.folder_arg: ["", "   ", "a\x00b", __file__],
    arg_types.seed_arg: ["-1", "2.5", "nan", "", "x", "True", "None", str(2**32), "99999999999999999999999"],
    arg_types.threads_arg: [
        "0",
        "-1",
        "2.5",
        "nan",
        "",
        "x",
        "False",
        "None",
        str(arg_types.cpu_count() + 1),
        "100000",
    ],
}
GOOD = {
    arg_types.positive_int_arg: st.integers(1, 10**6).map(str),
    arg_types.nonneg_int_arg: st.integers(0, 10**6).map(str),
    arg_types.positive_float_arg: st.floats(1e-9, 1e6, allow_nan=False, allow_infinity=False).map(repr),
    arg_types.positive_ints_arg: st.lists(st.integers(1, 4096), min_size=1, max_size=4, unique=True).map(
        lambda v: ",".join(map(str, v))
    ),
    arg_types.positive_floats_arg: st.lists(
        st.floats(1e-6, 10, allow_nan=False), min_size=1, max_size=4, unique=True
    ).map(lambda v: ",".join(map(repr, v))),
    arg_types.path_arg: st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=20).filter(
        lambda s: s.strip() and not s.startswith(("-", "~"))
    ),
    arg_types.nonneg_float_arg: st.floats(0, 1e6, allow_nan=False).map(repr),
    arg_types.fraction_arg: st.floats(0, 1, allow_nan=False).map(repr),
    arg_types.device_arg: st.sampled_from(["auto", "cpu", "CPU", " cpu "]),
    arg_types.dtype_arg: st.sampled_from(["auto", "fp32", "bf16", "fp16"]),
    arg_types.seed_arg: st.integers(0, 2**32 - 1).map(str),
    arg_types.folder_arg: st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=20).filter(
        lambda s: s.strip() and not s.startswith(("-", "~"))
    ),
    arg_types.threads_arg: st.integers(1, arg_types.cpu_count()).map(str),
}

TYPED = sorted(
    {(cmd, a.option_strings[-1]) for cmd, a in all_actions() if a.option_strings and a.type in CHECKING_TYPES}
)


def _parse(cmd: str, argv: list[str]):
    return TOP[cmd].parse_args([cmd, *REQUIRED.get(cmd, []), *argv])


def _action(cmd: str, flag: str) -> argparse.Action:
    return next(a for a in PARSERS[cmd]._actions if flag in a.option_strings)


@pytest.mark.parametrize("cmd,flag", TYPED)
def test_bad_values_are_one_line_usage_errors(cmd, flag, capsys):
    action = _action(cmd, flag)
    for value in BAD[action.type]:
        with pytest.raises(SystemExit) as exc:
            _parse(cmd, [f"{flag}={value}"])
        err = capsys.readouterr().err
        assert exc.value.code == 2, (cmd, flag, value)
        assert err.count("\n") == 1 and flag in err and "Traceback" not in err, err


@pytest.mark.parametrize("cmd,flag", TYPED)
@given(data=st.data())
def test_good_values_parse(cmd, flag, data):
    action = _action(cmd, flag)
    value = data.draw(GOOD[action.type])
    args = _parse(cmd, [f"{flag}={value}"])
    assert getattr(args, action.dest) is not None


@given(value=st.one_of(st.text(max_size=12), st.sampled_from(["nan", "inf", "-1", "0", "", "False", "None", "1e999"])))
def test_any_value_of_any_option_never_tracebacks(value, capsys):
    """Every option of every command, any text: parsing either succeeds or exits 2 with one line."""
    for cmd, action in all_actions():
        if not action.option_strings or action.nargs == 0:
            continue
        try:
            _parse(cmd, [f"{action.option_strings[-1]}={value}"])
        except SystemExit as exc:
            err = capsys.readouterr().err
            assert exc.code == 2 and err.count("\n") == 1 and "Traceback" not in err, (cmd, action.dest, err)


TRAIN_VALUE_FIELDS = [f for f in dataclasses.fields(TrainConfig) if f.name not in ("model", "task_options")]


@pytest.mark.parametrize("field", [f.name for f in TRAIN_VALUE_FIELDS])
def test_train_config_fields_refuse_wrong_types(field, tiny_cfg):
    """Each TrainConfig field (its declared type): values of the wrong kind are ValueErrors naming the field."""
    annotation = field_types(TrainConfig)[field]
    text = str(annotation)
    bad: list = [[], {}]
    if "int" in text:
        bad += [2.5, "2.5", "x", float("nan"), True, "True"]
    elif "float" in text:
        bad += [float("nan"), float("inf"), "x", True, "nan"]
    elif "bool" in text:
        bad += ["maybe", 2, 0.5]
    elif "str" in text:
        bad += ["", "  ", 3, True]
    base = tiny_cfg().to_dict()
    for value in bad:
        with pytest.raises(ValueError, match=field):
            TrainConfig.from_dict({**base, field: value})


@given(data=st.data())
def test_gpt_config_fields_from_their_annotations(data):
    """Every GPTConfig field: generated values of the wrong kind (and NaN/inf/0/negative numbers) either build a
    valid config or raise ValueError naming the field; never another exception type."""
    from coupled_qk.models.config import GPTConfig

    types = field_types(GPTConfig)
    name = data.draw(st.sampled_from(sorted(n for n in types if n != "qk_map")))
    value = data.draw(
        st.one_of(
            st.sampled_from(
                [
                    0,
                    -1,
                    2.5,
                    True,
                    False,
                    None,
                    "",
                    "False",
                    "0",
                    "None",
                    "x",
                    float("nan"),
                    float("inf"),
                    -float("inf"),
                    10**12,
                    [],
                    {},
                ]
            ),
            st.integers(-5, 5),
            st.floats(allow_nan=True, allow_infinity=True),
            st.text(max_size=6),
        )
    )
    try:
        cfg = GPTConfig.from_preset("tiny", **{name: value})
    except ValueError as exc:
        assert name in str(exc) or "GPTConfig" in str(exc), (name, value, str(exc))
    else:
        got = getattr(cfg, name)
        assert not (isinstance(got, float) and got != got), (name, value)  # no NaN accepted
