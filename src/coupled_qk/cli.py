"""``coupled-qk`` command line: one sub-command per module in :mod:`coupled_qk.commands`.

Each command module defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``; modules
are imported only when their command runs, so ``coupled-qk --help`` stays fast.

Usage errors name the sub-command (``coupled-qk eval: error: ...``) and suggest the closest option or choice
(``--max-step``: did you mean ``--max-steps``?). Options are spelled out: an abbreviation (``--max-step`` for
``--max-steps``) is refused, not silently expanded, so a command line keeps its meaning when options are added.

Exit codes: 0 success; 2 a user error (bad option or value, missing or damaged file, a refused resume, a
folder in use), reported in one line naming the file, field or value (``--debug`` shows the traceback);
3 training became non-finite; 130 / 143 stopped by ``SIGINT`` / ``SIGTERM`` (after saving a checkpoint when
training). Internal errors keep their traceback.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import importlib
import re
import sys
import warnings

from coupled_qk.extras import MissingExtra
from coupled_qk.models.registry import PluginError

COMMANDS = {
    "describe": "parameter counts and coupling overhead of a model",
    "bench": "train-step speed of every attention variant against standard",
    "train": "train a language model on a corpus",
    "eval": "perplexity of a checkpoint on a corpus split",
    "compare": "train several attention variants with the same data and budget, then compare",
    "demo": "standard vs coupled (Euler, leapfrog) vs uncoupled MLP on wiki-vital, on CPU in minutes",
    "mqar": "multi-query associative recall (Zoology) sweep over attention variants",
    "generate": "sample text from a trained run (its own tokenizer, KV-cache decoding)",
    "analyze": "attention diagnostics (entropy, effective rank, sinks, rank collapse) of checkpoints",
    "export": "write a run's checkpoint as a Hugging Face folder (AutoModelForCausalLM / AutoTokenizer)",
    "glue": "fine-tune pretrained checkpoints on GLUE tasks (SST-2, CoLA, RTE, MRPC) and compare them",
    "study": "plan, run, report or verify a study: its runs, one record each, and its claims with intervals",
    "claims": "run a claims protocol (C1-C13 with seeds and confidence intervals) and regenerate its report",
}

EXIT_USAGE, EXIT_DIVERGED = 2, 3
TOP_LEVEL_OPTIONS = {"--debug": "coupled-qk --debug COMMAND ..."}
"""Options of ``coupled-qk`` itself, with how to place them (a sub-command's parser does not take them)."""


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line (not the whole usage block) and exit 2, under this
    parser's own ``prog`` (a sub-command's errors name it), with the closest option or choice suggested.
    Abbreviated long options are refused (``allow_abbrev=False``) for every command alike."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        """As ``argparse``'s, but leftover words are this parser's error (argparse hands a sub-command's leftovers
        to the top-level parser, whose message named ``coupled-qk`` and not the sub-command)."""
        namespace, extras = super().parse_known_args(args, namespace)
        vars(namespace).pop(_GIVEN, None)  # the record of given options (_GivenOnce): not a setting
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._suggest_options(extras)}")
        return namespace, extras

    def _suggest_options(self, extras: list[str]) -> str:
        """``"; --max-step: did you mean --max-steps?"`` for the unknown options in ``extras`` that are close to one
        of this
        parser's visible options (``difflib``), ``""`` when none is."""
        known = [o for a in self._actions if a.help is not argparse.SUPPRESS for o in a.option_strings]
        hints = []
        for word in extras:
            name = word.split("=", 1)[0]
            if not name.startswith("--"):
                continue
            if name in TOP_LEVEL_OPTIONS and name not in known:
                hints.append(f"{name} goes before the command: {TOP_LEVEL_OPTIONS[name]}")
                continue
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.7)
            if close:
                hints.append(f"{name}: did you mean {close[0]}?")
        return "".join(f"; {h}" for h in hints)

    def error(self, message: str):
        """Print ``message`` as one usage line, ``<prog>: error: <message> (see <prog> --help)``, on stderr and exit
        with status 2 (:data:`EXIT_USAGE`; ``argparse.ArgumentParser.error`` prints the whole usage block first).

        An option type's refusal (``argument --n: '0' must be ...``) is reworded as ``--n=0 must be ...``, and an
        invalid choice gets the closest valid one suggested (``difflib``, cutoff 0.6).

        Raises:
            SystemExit: always, with code 2 (argparse's contract: ``error`` must not return).
        """
        # an option type's refusal ("argument --n: '0' must be ...") reads as "--n=0 must be ..."
        # and "argument --n: 'a,a': expected ..." as "--n='a,a': expected ..."; the value is the repr up to its
        # first unescaped quote (a later quote, as in "(or '' for none)", is the message's own)
        typed = re.match(r"^argument (?:[^:]*/)?(-[-\w]+): '((?:[^'\\]|\\.)*)'(:?) (.*)$", message, re.S)
        if typed:
            option, value, colon, rest = typed.groups()
            message = f"{option}='{value}': {rest}" if colon else f"{option}={value} {rest}"
        choice = re.search(r"invalid choice: '((?:[^'\\]|\\.)*)' \(choose from (.*)\)$", message, re.S)
        if choice:
            close = difflib.get_close_matches(
                choice.group(1), re.findall(r"'((?:[^'\\]|\\.)*)'", choice.group(2)), n=1, cutoff=0.6
            )
            message += f"; did you mean '{close[0]}'?" if close else ""
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


_GIVEN = "_coupled_qk_given_options"
"""Namespace attribute where :class:`_GivenOnce` actions record the options given (removed after parsing)."""


class _GivenOnce:
    """Mixin of a single-value ``argparse`` action (a value, a flag, ``--x/--no-x``): the option given twice with
    different results (``--max-steps 3 --max-steps 5``, ``--compile --no-compile``), which argparse resolves
    silently by keeping the last, is a usage error naming both (docs/RELIABILITY.md, "One setting, one value").
    The same value twice is accepted."""

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        given = vars(namespace).setdefault(_GIVEN, {})
        value = getattr(namespace, self.dest, None)
        if self.dest in given and given[self.dest][1] != value:
            before, old = given[self.dest]
            parser.error(f"{before} {old!r} and {option_string} {value!r} give one setting two values; give it once")
        given.setdefault(self.dest, (option_string, value))


_ONCE = (argparse._StoreAction, argparse._StoreConstAction, argparse.BooleanOptionalAction)
"""The actions that set one value (``append`` options such as ``--set`` take several; help and version exit)."""


@functools.cache
def _once_class(cls: type) -> type:
    return type(f"Once{cls.__name__}", (_GivenOnce, cls), {})


def refuse_repeated_options(parser: argparse.ArgumentParser) -> None:
    """Make every single-value option of ``parser`` a :class:`_GivenOnce` (for every command: called by
    :func:`build_parser` on each sub-command's parser)."""
    for action in parser._actions:
        if action.option_strings and isinstance(action, _ONCE) and not isinstance(action, _GivenOnce):
            action.__class__ = _once_class(type(action))


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser; with ``command`` only that sub-command's arguments are registered."""
    parser = Parser(prog="coupled-qk", description="Coupled query-key dynamics attention (arXiv:2604.01683v1): tools.")
    parser.add_argument("--debug", action="store_true", help="show the traceback of user errors too")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            module = importlib.import_module(f"coupled_qk.commands.{name}")
            module.add_arguments(p)
            refuse_repeated_options(p)
    return parser


def non_utf8_argument(argv: list[str]) -> str | None:
    """One line naming the first command-line argument that is not valid UTF-8 (a byte string the shell passed,
    which Python holds as lone surrogates: tokenizers, JSON files and reports cannot take it), or ``None``."""
    for i, arg in enumerate(argv):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            option = (
                arg.split("=", 1)[0]
                if arg.startswith("-")
                else (argv[i - 1] if i and argv[i - 1].startswith("-") else f"argument {i + 1}")
            )
            shown = arg.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            return f"{option}: '{shown}' is not valid UTF-8 text; give text and paths in UTF-8"
    return None


def out_of_memory(exc: BaseException) -> str | None:
    """One line for an allocation failure (``MemoryError``, torch's ``OutOfMemoryError`` or its CPU allocator's
    ``RuntimeError``), saying how much was asked and what to lower; ``None`` for any other error."""
    text = str(exc)
    if not (
        isinstance(exc, MemoryError)
        or type(exc).__name__ == "OutOfMemoryError"
        or "can't allocate memory" in text
        or "out of memory" in text.lower()
    ):
        return None
    asked = re.search(r"allocate (\d+) bytes", text)
    if asked:
        size = f"{int(asked.group(1)) / 1e9:.1f} GB"
    else:
        gib = re.search(r"allocate ([\d.]+ [KMGT]iB)", text)
        size = gib.group(1) if gib else "more than is free"
    return (
        f"out of memory: tried to allocate {size}; lower the batch size, sequence length or model size "
        "(e.g. --batch-size, --seq-len, --set d_model=...)"
    )


def _say(command: str, message: str) -> None:
    print(f"coupled-qk {command}: {message}", file=sys.stderr, flush=True)


_WARNED: set[str] = set()


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    """Warnings for users read as one line, without the library's source line, and each text once per process:
    the runs of a comparison repeated the same warning (a run's set-up resets Python's once-per-place registry)."""
    text = f"coupled-qk: warning: {message}\n"
    if text in _WARNED:
        return ""
    _WARNED.add(text)
    return text


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``coupled-qk`` command; returns the process exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in COMMANDS:
        command = None
    problem = non_utf8_argument(argv)
    if problem is not None:  # refused before parsing: nothing downstream can encode it
        _say(command or "", f"error: {problem}")
        return EXIT_USAGE
    try:
        args = build_parser(command).parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already reported in one line
        return exc.code if isinstance(exc.code, int) else 0
    except PluginError as exc:  # the help texts list the variants: a broken plugin fails here, for every command
        if "--debug" in argv:
            raise
        _say(command or "", f"error: {exc}")
        return EXIT_USAGE
    if args.command is None:
        build_parser().print_help()
        return EXIT_USAGE
    module = importlib.import_module(f"coupled_qk.commands.{args.command}")
    from coupled_qk.allocator import tune_cpu_allocator
    from coupled_qk.progress import set_mode
    from coupled_qk.training.stop import TrainingDiverged, TrainingInterrupted

    warnings.formatwarning = _one_line_warning
    from coupled_qk.checks.environment import undeclared_env

    for line in undeclared_env():  # a misspelt COUPLED_QK_* variable takes no effect: said, not ignored
        warnings.warn(line, UserWarning, stacklevel=1)
    if getattr(args, "progress", True) is False:  # --no-progress: no bars and no periodic log lines anywhere
        set_mode("off")
    try:
        tune_cpu_allocator()  # glibc malloc kept from returning each step's buffers to the system (opt-out)
        return int(module.run(args) or 0)
    except TrainingInterrupted as exc:
        how = (
            "run the same command with --resume"
            if args.command == "train"
            else "run the same command again (finished runs are reused, this one resumes)"
        )
        _say(args.command, f"{exc}; {how} to continue exactly where it stopped")
        return exc.exit_code
    except KeyboardInterrupt:
        if args.debug:
            raise
        _say(args.command, "interrupted (Ctrl-C)")
        return 130
    except TrainingDiverged as exc:
        if args.debug:
            raise
        _say(args.command, f"error: {exc}")
        return EXIT_DIVERGED
    except (
        ValueError,
        OSError,
        PluginError,
        MissingExtra,
    ) as exc:  # FileNotFoundError, PermissionError, ...: a clear one-line message
        if args.debug:
            raise
        _say(args.command, f"error: {exc}")
        return EXIT_USAGE
    except (RuntimeError, MemoryError) as exc:  # an allocation failure is the size asked for, not a bug
        message = out_of_memory(exc)
        if message is None or args.debug:
            raise
        _say(args.command, f"error: {message}")
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
