"""The `starvewatch` command. Each subcommand imports what it needs when it runs."""
from __future__ import annotations

import argparse
import sys

EXAMPLES = """examples:
  starvewatch demo                 a starved training, diagnosed and fixed
  starvewatch demo --quick         the same in a few seconds
"""

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def cmd_demo(args) -> int:
    from .demo import run_demo
    before, after = run_demo(quick=args.quick, name=args.name)
    if after is None:
        print("no recommendation to apply: the starved run's summary is above", file=sys.stderr)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="starvewatch", description="Live GPU-starvation monitor for PyTorch training.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    from . import __version__
    parser.add_argument("--version", action="version", version=f"starvewatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = sub.add_parser("demo", help="run a synthetic starved training, then the fix")
    demo.add_argument("--quick", action="store_true", help="a few seconds instead of about a minute")
    demo.add_argument("--name", default="demo", help="run name (default: demo)")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
