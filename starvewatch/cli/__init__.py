"""The `starvewatch` command (the console script's entry point is main()). Each subcommand
imports what it needs when it runs. The parts, by command group:

  command_line.py        the parser: options, their checks, help and examples
  collector_commands.py  serve (composes the dashboard onto the collector), stop, import, token
  run_commands.py        what reads runs: export, runs, compare
  local_commands.py      what runs on this machine alone: demo, doctor, tune
  cli_basics.py          exit codes, the error line, printable text, the data directory
"""
from __future__ import annotations

import argparse
import sys

from .cli_basics import EXIT_ERROR, EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, fail, printable
from .collector_commands import cmd_import, cmd_serve, cmd_stop, cmd_token, dashboard_ui, read_token_file
from .command_line import EXAMPLES, Parser
from . import command_line
from .local_commands import cmd_demo, cmd_doctor, cmd_tune
from .run_commands import cmd_compare, cmd_export, cmd_runs

__all__ = ["EXAMPLES", "EXIT_ERROR", "EXIT_OK", "EXIT_PROBLEMS", "EXIT_USAGE", "Parser", "build_parser",
           "cmd_compare", "cmd_demo", "cmd_doctor", "cmd_export", "cmd_import", "cmd_runs", "cmd_serve",
           "cmd_stop", "cmd_token", "cmd_tune", "dashboard_ui", "fail", "main", "printable", "read_token_file"]


def build_parser() -> argparse.ArgumentParser:
    # The functions are looked up here when the parser is built, so that one replaced on this
    # module (a test's monkeypatch of cli.cmd_serve) is the one that runs.
    return command_line.build_parser({
        "demo": cmd_demo, "serve": cmd_serve, "stop": cmd_stop, "import": cmd_import, "export": cmd_export,
        "runs": cmd_runs, "compare": cmd_compare, "tune": cmd_tune, "doctor": cmd_doctor, "token": cmd_token})


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the subcommand, with its usage, not the top-level one
        command_line.subparser_of(parser, args.command).error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        code = args.func(args)
        sys.stdout.flush()
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`starvewatch runs | head`): what it read is all it wanted. Point
        # stdout at /dev/null so that the interpreter's last flush cannot complain either.
        import os
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK

