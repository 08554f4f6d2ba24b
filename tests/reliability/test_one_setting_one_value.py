"""One setting, one value (docs/RELIABILITY.md): a setting given twice with different values on one command line is
refused naming both places, for every command, every option and every way of giving a field; the same value twice
is accepted. Before, ``--set n_steps=2 --n-steps 3`` built 3 steps in ``describe`` and 2 in ``train``, and
argparse kept the last of ``--max-steps 3 --max-steps 5`` without a word.

The options come from the parsers (every sub-command, every single-value option) and the fields from the
declarations (every ``TrainConfig`` field with a flag, every source of a model field), so a new option or field is
covered.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest
import reliability_profile  # noqa: F401  (the example budget)
from hypothesis import given
from hypothesis import strategies as st
from test_field_declarations import valid_values

from coupled_qk import cli
from coupled_qk.checks.values import field_types, loads_json, parse_assignments
from coupled_qk.commands.train import NOT_FLAGS, train_config_from_args
from coupled_qk.training.config import TrainConfig

REQUIRED = {
    "eval": ["run"],
    "analyze": ["run"],
    "export": ["run", "hf"],
    "glue": ["run"],
    "generate": ["run"],
    "claims": ["--protocol", "smoke"],
    "study": ["run", "smoke"],
}
CANDIDATES = ["1", "2", "3", "0.5", "0.25", "a", "b", "cpu", "auto", "fp32", "bf16", "1,2", "2,3", "0", "all"]
"""Texts tried for every option: those that parse alone give the option's two values."""


def _subparser(cmd: str) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    top = cli.build_parser(cmd)
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return top, sub.choices[cmd]


def _parse(top, cmd: str, argv: list[str]):
    required = REQUIRED.get(cmd, [])
    if argv and argv[0] in required:  # the option under test is a required one: given here only
        required = [w for i, w in enumerate(required) if w != argv[0] and (i == 0 or required[i - 1] != argv[0])]
    return top.parse_args([cmd, *required, *argv])


def _two_ways(top, cmd: str, action: argparse.Action) -> list[list[str]] | None:
    """Two argument lists giving ``action`` two different values, or ``None`` where it has one value only (a
    plain flag)."""
    if isinstance(action, argparse.BooleanOptionalAction):
        return [[action.option_strings[0]], [action.option_strings[1]]]
    if action.nargs == 0:
        return None
    flag, values = action.option_strings[-1], {}
    for text in [*(action.choices or []), *getattr(action.type, "checks_choices", ()), *CANDIDATES]:
        try:
            parsed = getattr(_parse(top, cmd, [flag, str(text)]), action.dest)
        except SystemExit:
            continue
        values.setdefault(repr(parsed), [flag, str(text)])
        if len(values) == 2:
            return list(values.values())
    return None


def _single_value_options():
    for cmd in cli.COMMANDS:
        _, parser = _subparser(cmd)
        for action in parser._actions:
            if action.option_strings and isinstance(action, cli._ONCE):
                yield cmd, action.option_strings[-1]


SINGLE = sorted(set(_single_value_options()))


def test_every_single_value_option_is_checked_by_the_parser():
    """Every single-value option of every command is a ``_GivenOnce`` action (set by ``cli.build_parser``)."""
    missing = []
    for cmd in cli.COMMANDS:
        _, parser = _subparser(cmd)
        missing += [
            f"{cmd} {a.option_strings}"
            for a in parser._actions
            if a.option_strings and isinstance(a, cli._ONCE) and not isinstance(a, cli._GivenOnce)
        ]
    assert not missing and len(SINGLE) > 100, missing


@pytest.mark.parametrize("cmd,flag", SINGLE)
def test_an_option_given_twice_with_different_values_is_one_line_naming_it(cmd, flag, capsys):
    top, parser = _subparser(cmd)
    action = next(a for a in parser._actions if flag in a.option_strings)
    ways = _two_ways(top, cmd, action)
    if ways is None:  # a plain flag: given twice it is the same value
        assert action.nargs == 0, f"{cmd} {flag}: no two values found among the candidates"
        return
    first, second = ways
    capsys.readouterr()  # the refusals of the candidate values
    with pytest.raises(SystemExit) as exc:
        _parse(top, cmd, [*first, *second])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "two values" in err, (cmd, flag, err)
    assert first[0] in err and second[0] in err
    args = _parse(top, cmd, [*second, *second])  # the same value twice: accepted, that value
    assert getattr(args, action.dest) == getattr(_parse(top, cmd, second), action.dest)
    assert not hasattr(args, cli._GIVEN)  # the record of given options is not left in the settings


# ------------------------------------------------------------------------------------------ fields, every source


def _train(argv: list[str]):
    """``train`` parsed and merged (as ``train --print-config`` does), or the ``ValueError`` it raises."""
    top, _ = _subparser("train")
    args = top.parse_args(["train", *argv])
    try:
        return train_config_from_args(args)
    except ValueError as exc:
        return exc


def _text(value) -> str:
    return json.dumps(value) if isinstance(value, bool) or value is None else str(value)


FREE_VALUES = {  # the fields declared as free text: values of their kind
    "corpus": st.sampled_from(["pubmed", "mixed-domain"]),
    "data_dir": st.sampled_from(["/tmp/a", "/tmp/b"]),
    "tokenizer": st.sampled_from(["gpt2", "bpe-512"]),
    "cache_dir": st.sampled_from(["/tmp/a", "/tmp/b"]),
    "early_stop_metric": st.sampled_from(["valid/loss", "valid/accuracy"]),
    "best_metric": st.sampled_from(["valid/loss", "valid/accuracy"]),
    "device": st.sampled_from(["cpu", "auto"]),
    "out_dir": st.sampled_from(["runs/a", "runs/b"]),
}
FLAG_FIELDS = [
    f for f in dataclasses.fields(TrainConfig) if f.name not in NOT_FLAGS and f.name != "resume" and f.metadata
]


@pytest.mark.parametrize("field", FLAG_FIELDS, ids=lambda f: f.name)
@given(data=st.data())
def test_a_train_field_given_by_its_flag_and_by_opt_takes_one_value(field, data):
    """Every ``TrainConfig`` field with a flag, given by the flag and by ``--opt``: two values are refused naming
    the field and both sources; one value is that value."""
    free = FREE_VALUES.get(field.name)
    strategy = free if free is not None else valid_values(TrainConfig, field).filter(lambda v: v is not None)
    a, b = data.draw(strategy, label="flag"), data.draw(strategy, label="opt")
    flag = "--" + field.name.replace("_", "-")
    flag_words = ([flag] if a else [f"--no-{flag[2:]}"]) if isinstance(a, bool) else [f"{flag}={_text(a)}"]
    budget = [] if field.name == "max_steps" else ["--max-steps", "1"]
    result = _train([*flag_words, "--opt", f"{field.name}={_text(b)}", *budget])
    if a == b:
        assert not isinstance(result, ValueError) or "twice" not in str(result), result
    else:
        assert isinstance(result, ValueError) and f"{field.name} is given twice" in str(result), (a, b, result)
        assert flag in str(result) and "--opt" in str(result)


SOURCES = {  # how a setting reaches a command: (field, value) -> words; one registry of every way in
    "--set": lambda f, v: ["--set", f"{f}={v}"],
    "--set (dashes)": lambda f, v: ["--set", f"{f.replace('_', '-')}={v}"],
    "--opt model": lambda f, v: ["--opt", "model=" + json.dumps({f: v})],
    "--set qk_map": lambda f, v: ["--set", "qk_map=" + json.dumps({f: v})],
    "flag": lambda f, v: ["--" + f.replace("_", "-"), str(v)],
}
MODEL_FIELDS = {  # field -> (its sources, two values, the attention that reads it)
    "n_steps": (("--set", "--set (dashes)", "--opt model", "--set qk_map", "flag"), (2, 3), "coupled"),
    "integrator": (("--set", "--opt model", "--set qk_map", "flag"), ("euler", "leapfrog"), "coupled"),
    "n_layer": (("--set", "--set (dashes)", "--opt model"), (2, 3), "standard"),
    "attention": (("--set", "--opt model", "flag"), ("coupled", "coupled_differential"), None),
}
PAIRS = [
    (field, s1, s2)
    for field, (sources, _, _) in MODEL_FIELDS.items()
    for i, s1 in enumerate(sources)
    for s2 in sources[i:]
    if (s1, s2) != ("--set qk_map", "--set qk_map") and (s1 != s2 or s1 != "flag")
]


@pytest.mark.parametrize("field,first,second", PAIRS)
def test_a_model_field_from_any_two_sources_takes_one_value(field, first, second):
    """Every pair of sources of a model field, in ``train`` and ``describe`` alike: two values refused naming
    the field, one value used."""
    from coupled_qk.commands.options import gpt_config_from_args

    _, (a, b), attention = MODEL_FIELDS[field]
    context = [] if attention is None else ["--attention", attention] if "flag" not in (first, second) else []
    if attention and field != "attention" and not context:
        context = ["--set", f"attention={attention}"]
    top, _ = _subparser("describe")
    for values in ((a, b), (a, a)):
        words = [*SOURCES[first](field, values[0]), *SOURCES[second](field, values[1]), *context]
        result = _train(words)
        described = result if "--opt model" in (first, second) else None  # describe has no --opt
        if described is None:
            try:
                described = gpt_config_from_args(top.parse_args(["describe", *words]))
            except ValueError as exc:
                described = exc
        if values[0] != values[1]:
            for got in (result, described):
                assert isinstance(got, ValueError) and f"{field} is given twice" in str(got), (words, got)
        else:
            assert not isinstance(result, ValueError), (words, result)
            gpt = result.gpt_config()
            for config in (gpt, described if isinstance(described, type(gpt)) else gpt):
                value = getattr(config.qk_map, field) if hasattr(config.qk_map or (), field) else getattr(config, field)
                assert value == a, (words, value)


@pytest.mark.parametrize(
    "words,field",
    [
        (["--valid-fraction", "0.2", "--opt", 'task_options={"valid_fraction": 0.1}'], "task_options.valid_fraction"),
        (["--split-seed", "1", "--opt", 'task_options={"split_seed": 2}'], "task_options.split_seed"),
        (["--preset", "tiny", "--opt", "preset=60m"], "preset"),
        (["--opt", "lr=0.1", "--opt", "lr=0.2"], "lr"),
        (["--compile", "--opt", "compile=false"], "compile"),
    ],
)
def test_task_options_presets_and_repeated_opts_take_one_value(words, field):
    result = _train(words)
    assert isinstance(result, ValueError) and f"{field} is given twice" in str(result), result


def test_the_same_value_in_two_spellings_is_one_value():
    assert not isinstance(_train(["--lr", "0.001", "--opt", "lr=1e-3"]), ValueError)
    assert not isinstance(_train(["--set", "n_layer=2", "--opt", 'model={"n_layer": 2.0}']), ValueError)
    assert isinstance(_train(["--tensorboard", "--opt", "tensorboard=1"]), TrainConfig)  # "1" reads as true


@given(keys=st.lists(st.sampled_from(["lr", "seed", "a", "b"]), min_size=1, max_size=5))
def test_json_objects_with_a_repeated_key_are_refused(keys):
    """``--config`` files, ``--opt``/``--set`` JSON values and a run's files: one key twice is refused, naming it."""
    text = "{" + ", ".join(f'"{k}": {i}' for i, k in enumerate(keys)) + "}"
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        with pytest.raises(ValueError, match="appear twice") as exc:
            loads_json(text, "where")
        assert str(repeated) in str(exc.value) and "where" in str(exc.value)
    else:
        assert loads_json(text, "where") == {k: keys.index(k) for k in keys}


def test_a_config_file_with_a_repeated_key_is_one_line_naming_the_file(tmp_path, capsys):
    path = tmp_path / "cfg.json"
    path.write_text('{"max_steps": 3, "lr": 0.001, "max_steps": 5}')
    assert cli.main(["train", "--config", str(path), "--print-config"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and "max_steps" in err, err
    data = tmp_path / "run.json"
    data.write_text('{"corpus": "a", "corpus": "b"}')
    from coupled_qk.training.run_folder import _read_json

    with pytest.raises(ValueError, match="corpus"):
        _read_json(data)


def test_the_config_file_overrides_the_commands_own_defaults(tmp_path):
    """``demo --config`` kept demo's defaults over the file's fields; the precedence is now defaults < file <
    command line."""
    path = tmp_path / "cfg.json"
    TrainConfig(max_tokens=4096, eval_batches=3).save(path)
    top, _ = _subparser("train")
    cfg = train_config_from_args(top.parse_args(["train", "--config", str(path)]), max_tokens=999, log_interval=7)
    assert (cfg.max_tokens, cfg.eval_batches, cfg.log_interval) == (4096, 3, 10)  # the file's log_interval: default
    cfg = train_config_from_args(top.parse_args(["train", "--config", str(path), "--max-tokens", "5"]), max_tokens=9)
    assert cfg.max_tokens == 5


@given(items=st.lists(st.sampled_from(["n_steps=2", "n-steps=2", "n_steps=3", "lr=1"]), min_size=1, max_size=4))
def test_assignments_repeating_a_name_take_one_value(items):
    """``parse_assignments`` (``--set``, ``--opt``, variant specs ``coupled+n_steps=2+n_steps=3``)."""
    values = {}
    for item in items:
        key, _, value = item.partition("=")
        values.setdefault(key.replace("-", "_"), set()).add(value)
    if any(len(v) > 1 for v in values.values()):
        with pytest.raises(ValueError, match="two different values"):
            parse_assignments(items, "--set")
    else:
        assert parse_assignments(items, "--set") == {k: v.pop() for k, v in values.items()}


@pytest.mark.parametrize(
    "argv",
    [
        ["compare", "--set", "n_layer=2", "--variants", "standard,coupled+n_layer=3", "--dry-run"],
        ["compare", "--set", "attention=coupled", "--variants", "standard,coupled", "--dry-run"],
        ["demo", "--set", "integrator=euler", "--variants", "standard,coupled_leapfrog", "--max-steps", "1"],
        ["bench", "--n-steps", "2", "--variants", "coupled+n_steps=3", "--repeats", "1"],
    ],
)
def test_a_command_line_setting_that_a_variant_spec_replaces_is_refused(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "given twice" in err and "--variants spec" in err, err
    assert not any(tmp_path.iterdir())


def test_the_types_of_every_field_are_known():
    """The merge compares typed values: every TrainConfig field has a declared type."""
    assert set(field_types(TrainConfig)) == {f.name for f in dataclasses.fields(TrainConfig)}


@given(
    first=st.sampled_from(["flat", "alias", "qk_map"]),
    second=st.sampled_from(["flat", "alias", "qk_map"]),
    values=st.tuples(st.integers(4, 6), st.integers(4, 6)),
)
def test_a_map_option_given_in_two_spellings_takes_one_value(first, second, values):
    """In the library, a config file or a ``--set``: ``GPTConfig(n_steps=2, qk_map={"n_steps": 3})`` kept 2, and
    ``dynamics_hidden=8, hidden=16`` the last; two values are refused, one value is used."""
    from coupled_qk.models.config import GPTConfig

    if first == second:
        return
    spell = {"flat": lambda v: {"hidden": v}, "alias": lambda v: {"dynamics_hidden": v},
             "qk_map": lambda v: {"qk_map": {"hidden": v}}}  # fmt: skip
    kwargs = {**spell[first](values[0] * 8), **spell[second](values[1] * 8)}
    if values[0] != values[1]:
        with pytest.raises(ValueError, match="'hidden' is given twice with different values"):
            GPTConfig(attention="coupled", **kwargs)
    else:
        assert GPTConfig(attention="coupled", **kwargs).qk_map.hidden == values[0] * 8


def test_a_change_of_an_existing_config_is_not_a_second_value():
    from coupled_qk.models.config import GPTConfig

    config = GPTConfig(attention="coupled", qk_map={"n_steps": 3})
    assert config.replace(n_steps=5).qk_map.n_steps == 5
    with pytest.raises(ValueError, match="given twice"):
        config.replace(n_steps=5, qk_map={"n_steps": 4})
