"""The `starvewatch` command. Each subcommand imports what it needs when it runs."""
from __future__ import annotations

import argparse
import sys

EXAMPLES = """examples:
  starvewatch demo                 a starved training, diagnosed and fixed
  starvewatch demo --quick         the same in a few seconds
  starvewatch serve                the collector and dashboard on http://127.0.0.1:8412
  starvewatch serve --host 0.0.0.0 --token SECRET
  starvewatch stop                 stop the collector started for you
  starvewatch import /mnt/other/.starvewatch/spool
"""

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def cmd_demo(args) -> int:
    from .demo import run_demo
    before, after = run_demo(quick=args.quick, name=args.name)
    if after is None:
        print("no recommendation to apply: the starved run's summary is above", file=sys.stderr)
    return EXIT_OK


def fail(message: str, code: int = EXIT_ERROR) -> int:
    print(f"starvewatch: error: {message}", file=sys.stderr)
    return code


def _dir(args):
    from pathlib import Path

    from .hooks.settings import default_dir
    return Path(args.dir) if getattr(args, "dir", None) else default_dir()


def cmd_serve(args) -> int:
    from .monitor.settings import CollectorSettings
    settings = CollectorSettings(host=args.host, port=args.port, dir=_dir(args), db=args.db,
                                 idle_exit_s=args.idle_exit)
    if args.token:
        settings.token = args.token
    try:
        settings.check()
    except ValueError as exc:
        return fail(str(exc), EXIT_USAGE)
    import socket
    try:
        with socket.create_server((args.host, args.port)):
            pass
    except OSError as exc:
        return fail(f"cannot listen on {settings.url}: {exc.strerror or exc}")
    from .monitor.server import serve
    if not args.autostarted:
        print(f"starvewatch collector and dashboard on {settings.url} (db {settings.db_path})", flush=True)
    serve(settings, autostarted=args.autostarted)
    return EXIT_OK


def cmd_stop(args) -> int:
    from .monitor.server import stop
    ok, message = stop(_dir(args))
    print(message, file=sys.stdout if ok else sys.stderr)
    return EXIT_OK if ok else EXIT_ERROR


def cmd_import(args) -> int:
    from pathlib import Path

    from .monitor.settings import CollectorSettings
    from .monitor.spool_import import SpoolImporter
    from .monitor.store import Store
    source = Path(args.source)
    if not source.is_dir():
        return fail(f"{source} is not a directory")
    root = source / "spool" if (source / "spool").is_dir() else source
    settings = CollectorSettings(dir=_dir(args), db=args.db)
    store = Store(settings.db_path)
    importer = SpoolImporter(store, root, delete=args.delete)
    files = importer.files()
    if not files:
        return fail(f"no spooled batches under {root} (expected <run>/<stream>/<seq>.json.gz)")
    from .progress import progress_bar
    with progress_bar(len(files), "importing") as advance:
        count = importer.scan(progress=lambda path: advance())
    store.close()
    print(f"imported {count} new batches from {root} into {settings.db_path}"
          + (f"; {len(importer.rejected_files)} unreadable files set aside" if importer.rejected_files else ""))
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

    serve = sub.add_parser("serve", help="run the collector (API, /metrics, dashboard) in the foreground")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; "
                       "any other address requires a token)")
    serve.add_argument("--port", type=int, default=8412, help="port (default 8412)")
    serve.add_argument("--db", help="SQLite file (default STARVEWATCH_DIR/starvewatch.db)")
    serve.add_argument("--dir", help="data directory (default STARVEWATCH_DIR or ~/.starvewatch)")
    serve.add_argument("--token", help="require this token on every route (or STARVEWATCH_TOKEN)")
    serve.add_argument("--idle-exit", type=float, default=0.0, metavar="SECONDS",
                       help="exit after this long with no live run (default: never)")
    serve.add_argument("--autostarted", action="store_true", help=argparse.SUPPRESS)
    serve.set_defaults(func=cmd_serve)

    stop = sub.add_parser("stop", help="stop the collector that was started for you")
    stop.add_argument("--dir", help="data directory (default STARVEWATCH_DIR or ~/.starvewatch)")
    stop.set_defaults(func=cmd_stop)

    imp = sub.add_parser("import", help="ingest a spool directory taken from elsewhere")
    imp.add_argument("source", help="a STARVEWATCH_DIR or its spool/ directory")
    imp.add_argument("--dir", help="data directory holding the database")
    imp.add_argument("--db", help="SQLite file (default STARVEWATCH_DIR/starvewatch.db)")
    imp.add_argument("--delete", action="store_true", help="delete the spool files once imported")
    imp.set_defaults(func=cmd_import)
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
