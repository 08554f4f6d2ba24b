"""Every sub-command alike: usage errors name the sub-command and suggest the closest option or choice,
abbreviated options are refused (not silently expanded), and every command that can show progress takes
``--no-progress`` (the shared ``add_progress_option``). Generated over ``cli.COMMANDS``, so a new command is covered."""

from __future__ import annotations

import argparse

import pytest

from coupled_qk import cli
from coupled_qk.cli import main

# commands that show no progress bar and no periodic progress line, with why; every other command must take
# --no-progress (an option without effect would be silently ignored, which docs/RELIABILITY.md refuses)
NO_PROGRESS = {
    "describe": "prints parameter counts at once",
    "generate": "loads a run and decodes: no bar; the samples are the output",
    "export": "copies one checkpoint into a Hugging Face folder: no bar",
    "mqar": "its runs train silently (TrainConfig.progress=False, experiments/mqar/sweep.py); one result line per "
    "run, as compare prints whatever --no-progress says",
}


def subparser(command: str) -> argparse.ArgumentParser:
    top = cli.build_parser(command)
    return next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices[command]


def required_words(parser: argparse.ArgumentParser) -> list[str]:
    """Placeholder words for a parser's positionals and required options (parsing succeeds up to the extras)."""
    words = []
    for action in parser._actions:
        if not action.option_strings:
            words.append("RUN")
        elif action.required:
            words += [action.option_strings[0], sorted(action.choices)[0] if action.choices else "x"]
    return words


def usage_error(argv: list[str], capsys) -> str:
    """stderr of parsing ``argv``, which must be a usage error (exit 2). Parsing only: a command line the parser
    wrongly accepted fails here instead of running the command."""
    with pytest.raises(SystemExit) as exc:
        cli.build_parser(argv[0] if argv[0] in cli.COMMANDS else None).parse_args(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def long_options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if a.help is not argparse.SUPPRESS
        and any(o.startswith("--") for o in a.option_strings)
        and not isinstance(a, argparse._HelpAction)
    ]


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_unknown_option_is_the_subcommands_error(command, capsys):
    """`coupled-qk eval RUN --bogus` said `coupled-qk: error: ...` (the top-level prog), not the sub-command."""
    parser = subparser(command)
    err = usage_error([command, *required_words(parser), "--bogus-option"], capsys)
    assert err.startswith(f"coupled-qk {command}: error: unrecognized arguments: --bogus-option")
    assert f"(see coupled-qk {command} --help)" in err and "did you mean" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_abbreviation_is_refused_with_the_full_name(command, capsys):
    """An abbreviation silently selected the long option (`train --max-step 3` trained 3 steps); it is refused for
    every command, naming the option it resembles."""
    parser = subparser(command)
    names = [o for a in long_options(parser) for o in a.option_strings if o.startswith("--")]
    # the longest option whose name minus its last letter is a prefix of no other option (unambiguous abbreviation)
    full = max((o for o in names if sum(n.startswith(o[:-1]) for n in names) == 1), key=len)
    short = full[:-1]
    err = usage_error([command, *required_words(parser), f"{short}=1"], capsys)
    assert err.startswith(
        f"coupled-qk {command}: error: unrecognized arguments: {short}=1; {short}: did you mean {full}?"
    )


def test_typo_suggests_the_close_option(capsys):
    err = usage_error(["train", "--max-step", "3"], capsys)
    assert err.startswith(
        "coupled-qk train: error: unrecognized arguments: --max-step 3; --max-step: did you mean "
        "--max-steps? (see coupled-qk train --help)"
    )
    err = usage_error(["eval", "RUN", "--no-progres", "--batch-sise", "2"], capsys)
    assert "--no-progres: did you mean --no-progress?; --batch-sise: did you mean --batch-size?" in err


def test_top_level_option_after_the_command_says_where_it_goes(capsys):
    assert main(["describe", "--debug"]) == 2
    assert (
        "coupled-qk describe: error: unrecognized arguments: --debug; --debug goes before the command: "
        "coupled-qk --debug COMMAND ..." in capsys.readouterr().err
    )
    assert main(["--bogus"]) == 2
    assert capsys.readouterr().err.startswith("coupled-qk: error: unrecognized arguments: --bogus (see")


def test_invalid_choice_suggests_the_close_choice(capsys):
    assert main(["trian"]) == 2
    assert "invalid choice: 'trian' (choose from " in (err := capsys.readouterr().err)
    assert "); did you mean 'train'? (see coupled-qk --help)" in err
    assert main(["describe", "--preset", "tinny"]) == 2
    assert capsys.readouterr().err.startswith(
        "coupled-qk describe: error: argument --preset: invalid choice: 'tinny' (choose from "
    )
    assert main(["describe", "--preset", "zzzzz"]) == 2
    assert "did you mean" not in capsys.readouterr().err


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_commands_that_show_progress_take_no_progress(command):
    """`--no-progress` (the README's switch for silence) is the shared add_progress_option on every command that
    can show a bar or periodic progress lines; analyze, bench and claims lacked it."""
    parser = subparser(command)
    actions = [a for a in parser._actions if "--no-progress" in a.option_strings]
    if command in NO_PROGRESS:
        assert not actions, f"{command} takes --no-progress: remove it from NO_PROGRESS"
        return
    assert actions, f"{command} shows progress but has no --no-progress (commands.options.add_progress_option)"
    words = required_words(parser)
    assert parser.parse_args([*words, "--no-progress"]).progress is False
    assert parser.parse_args(words).progress is not False  # True, or None: the run config's default


def test_bench_no_progress_silences_its_progress_lines(tmp_path, capsys):
    argv = [
        "bench",
        "--variants",
        "standard",
        "--repeats",
        "2",
        "--warmup",
        "1",
        "--batch-size",
        "1",
        "--seq-len",
        "8",
        "--device",
        "cpu",
        "--out-dir",
        str(tmp_path / "a"),
    ]
    assert main(argv) == 0
    shown = capsys.readouterr().out
    assert "  repeat 1/2" in shown and "  standard: warm" in shown
    assert main([*argv[:-1], str(tmp_path / "b"), "--no-progress"]) == 0
    quiet = capsys.readouterr().out
    assert "repeat 1/2" not in quiet and "standard: warm" not in quiet
    assert "| standard" in quiet and "wrote " in quiet  # the results are printed either way
