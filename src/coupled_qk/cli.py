"""``coupled-qk`` command line: one sub-command per module in :mod:`coupled_qk.commands`.

Each command module defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``; modules
are imported only when their command runs, so ``coupled-qk --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "describe": "parameter counts and coupling overhead of a model",
    "bench": "train-step speed of every attention variant against standard",
    "train": "train a language model on a corpus",
    "eval": "perplexity of a checkpoint on a corpus split",
    "compare": "train several attention variants with the same data and budget, then compare",
    "demo": "standard vs coupled (Euler, leapfrog) vs uncoupled MLP on wiki-vital, on CPU in minutes",
    "mqar": "multi-query associative recall (Zoology) sweep over attention variants",
    "analyze": "attention diagnostics (entropy, effective rank, sinks, rank collapse) of checkpoints",
    "claims": "run a claims protocol (C1-C13 with seeds and confidence intervals) and regenerate its report",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser; with ``command`` only that sub-command's arguments are registered."""
    parser = argparse.ArgumentParser(
        prog="coupled-qk", description="Coupled query-key dynamics attention (arXiv:2604.01683v1): tools."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            module = importlib.import_module(f"coupled_qk.commands.{name}")
            module.add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``coupled-qk`` command; returns the process exit code."""
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in COMMANDS:
        command = None
    args = build_parser(command).parse_args(argv)
    if args.command is None:
        build_parser().print_help()
        return 2
    module = importlib.import_module(f"coupled_qk.commands.{args.command}")
    try:
        return int(module.run(args) or 0)
    except (ValueError, OSError) as exc:  # FileNotFoundError, PermissionError, ...: a clear one-line message
        print(f"coupled-qk {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
