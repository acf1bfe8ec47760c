"""The `starvewatch` command. Each subcommand imports what it needs when it runs."""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
import sys

EXAMPLES = """examples:
  starvewatch demo                 a starved training, diagnosed and fixed
  starvewatch demo --quick         the same in a few seconds
  starvewatch serve                the collector and dashboard on http://127.0.0.1:8412
  STARVEWATCH_TOKEN=... starvewatch serve --host 0.0.0.0
  starvewatch serve --host 0.0.0.0 --token-file ~/.starvewatch-token --ssl-certfile c.pem --ssl-keyfile k.pem
  starvewatch stop                 stop the collector started for you
  starvewatch import /mnt/other/.starvewatch/spool
  starvewatch runs                 list runs (status, verdict, input wait, throughput)
  starvewatch runs show latest     one run's summary
  starvewatch export latest --format html -o report.html
  starvewatch export RUN --format csv --spool ~/.starvewatch/spool   (offline)
  starvewatch compare RUN_A RUN_B  what changed, and did the fix work
  starvewatch compare RUN_A RUN_B --format html -o compare.html
  starvewatch doctor               NVML, torch/CUDA, /dev/shm, collector: with fixes
  starvewatch tune train:make_loader --budget 60 --run train
                                   measure DataLoader settings on this machine

exit codes: 0 ok, 1 error (unknown run, unreachable collector...), 2 usage, 3 doctor found problems
"""

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_PROBLEMS = 0, 1, 2, 3


def printable(text: str) -> str:
    """Text for a terminal: every invisible character (ids.HIDDEN_CATEGORIES: escapes, bidi
    overrides, line separators...) but the newline shown as a space, so a stored name can
    neither move the cursor nor reorder or fake a line."""
    import unicodedata

    from .ids import HIDDEN_CATEGORIES
    if text.isascii() and all(c == "\n" or c.isprintable() for c in text):
        return text
    return "".join(c if c == "\n" or unicodedata.category(c) not in HIDDEN_CATEGORIES else " " for c in text)


def cmd_demo(args) -> int:
    from .demo import run_demo
    from .analysis.compare import comparison
    from .monitor.outputs.compare_report import to_markdown
    before, after = run_demo(quick=args.quick, name=args.name)
    if after is None:
        print("no recommendation to apply: the starved run's summary is above", file=sys.stderr)
        return EXIT_OK
    print("\nbefore -> after", flush=True)
    print(to_markdown(comparison(before, after)), flush=True)
    return EXIT_OK


def _source(args):
    import os

    from .defaults import DEFAULT_URL, OFF_VALUES
    from .monitor.storage.sources import open_source
    url = getattr(args, "url", None) or os.environ.get("STARVEWATCH_URL") or DEFAULT_URL
    if url.strip().lower() in OFF_VALUES:
        url = DEFAULT_URL
    return open_source(url=url, spool=getattr(args, "spool", None), db=getattr(args, "db", None),
                       directory=_dir(args), token=os.environ.get("STARVEWATCH_TOKEN"))


def _with_source(fn):
    def run(args) -> int:
        from .monitor.storage.sources import LocalSource, SourceError
        try:
            source = _source(args)
        except SourceError as exc:
            return fail(str(exc))
        if isinstance(source, LocalSource) and not (getattr(args, "spool", None) or getattr(args, "db", None)):
            # Fell back: say so, or a reader takes a stale spool for what the collector holds.
            print(f"starvewatch: no collector answers; reading {source.description}", file=sys.stderr)
        try:
            return fn(args, source)
        except SourceError as exc:
            return fail(str(exc))
        finally:
            source.close()
    return run


@_with_source
def cmd_export(args, source) -> int:
    from .monitor.outputs.export import export
    from .monitor.storage.sources import resolve_run
    run_id = resolve_run(source, args.run)
    if args.format == "trace":
        from .monitor.outputs.trace_cli import write_trace
        return write_trace(source, run_id, args)
    if args.output and args.output != "-":
        try:
            out = open(args.output, "w", newline="" if args.format == "csv" else None, encoding="utf-8")
        except OSError as exc:
            return fail(f"cannot write {args.output}: {exc.strerror or exc}")
        with out:
            rows = export(source, run_id, args.format, out)
        extra = f" ({rows} rows)" if rows is not None else ""
        print(f"wrote {args.output}: run {run_id} as {args.format}{extra}", file=sys.stderr)
    else:
        # To the terminal: a stored escape sequence (in a stack, a tuning note) is shown as a
        # space, never run (JSON escapes its own; a file written with --output keeps the text).
        shown = args.format == "md" or (args.format == "csv" and sys.stdout.isatty())
        export(source, run_id, args.format, _PrintableOut(sys.stdout) if shown else sys.stdout)
    return EXIT_OK


class _PrintableOut:
    """A text stream whose writes go through printable()."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write(printable(text.replace("\r\n", "\n")))

    def __getattr__(self, name):
        return getattr(self.stream, name)


@_with_source
def cmd_runs(args, source) -> int:
    from .monitor.storage.sources import resolve_run
    action = args.action or "list"
    if action == "list":
        runs = source.list_runs(status=args.status, search=args.search)
        if not runs:
            which = f"{args.status} " if args.status else ""
            matching = f" matching {args.search!r}" if args.search else ""
            print(f"no {which}runs{matching} in {source.description}")
            return EXIT_OK
        print(f"{'run':<40} {'name':<16} {'status':<9} {'verdict':<17} {'wait':>6} {'batches/s':>10} {'duration':>9}")
        for r in runs:
            wait = "n/a" if r["input_wait_fraction"] is None else f"{100 * r['input_wait_fraction']:.1f}%"
            rate = "n/a" if not r["batches_per_s"] else f"{r['batches_per_s']:.1f}"
            print(f"{r['id']:<40} {printable(r['name'])[:16]:<16} {r['status']:<9} {r['verdict']:<17} {wait:>6} {rate:>10} "
                  f"{r['duration_s']:>8.1f}s")
        return EXIT_OK
    if not args.run:
        return fail(f"`starvewatch runs {action}` needs a run (an id, a name or 'latest')", EXIT_USAGE)
    run_id = resolve_run(source, args.run)
    if action == "show":
        from .hooks.report import format_report
        print(printable(format_report(source.summary(run_id))))
        return EXIT_OK
    if not args.yes:
        answer = _confirm_delete(source, run_id)
        if answer is not None:
            return answer
    source.delete(run_id)
    print(f"deleted run {run_id}")
    return EXIT_OK


def _confirm_delete(source, run_id: str) -> int | None:
    """None to go ahead; an exit code otherwise. A name resolves to its newest run, so the
    question names the run that would go; without a terminal to ask on, nothing is deleted."""
    run = next((r for r in source.list_runs() if r["id"] == run_id), {"name": "?", "status": "?"})
    what = f"run {run_id} (name {printable(str(run.get('name')))}, {run.get('status')})"
    if not sys.stdin.isatty():
        return fail(f"not deleting {what} without confirmation: no terminal to ask on; "
                    f"add --yes to delete it", EXIT_USAGE)
    print(f"delete {what} and all its data? [y/N] ", end="", file=sys.stderr, flush=True)
    try:
        reply = sys.stdin.readline().strip().lower()
    except (OSError, ValueError):
        reply = ""
    if reply not in ("y", "yes"):
        print("nothing deleted", file=sys.stderr)
        return EXIT_ERROR
    return None


@_with_source
def cmd_compare(args, source) -> int:
    from .analysis import compare
    from .monitor.outputs import compare_report
    from .monitor.storage.sources import resolve_run
    a, b = resolve_run(source, args.before), resolve_run(source, args.after)
    if args.format == "html":
        from .monitor.outputs.compare_figures import figures_for
        _, _, comp, distributions, series = compare.gather(
            source.summary, source.distributions, lambda run, loader: source.series(run, loader=loader, points=300),
            a, b)
        charts = figures_for(comp, distributions, series)
        figs = [f for pair in charts["pairs"] for f in (pair["wait"], pair["compute"], pair["throughput"],
                                                        pair["input_wait"])] + [charts["verify"]]
        text = compare_report.render_html(comp, figs)
    else:
        comp = compare.comparison(source.summary(a), source.summary(b))
        text = compare_report.to_json(comp) if args.format == "json" else compare_report.to_markdown(comp)
    if args.output and args.output != "-":
        try:
            with open(args.output, "w", encoding="utf-8") as out:
                out.write(text)
        except OSError as exc:
            return fail(f"cannot write {args.output}: {exc.strerror or exc}")
        print(f"wrote {args.output}: {a} vs {b} as {args.format}", file=sys.stderr)
    else:
        sys.stdout.write(printable(text) if args.format == "md" else text)
    return EXIT_OK


def cmd_doctor(args) -> int:
    from .doctor import run_checks
    problems = 0
    for name, ok, detail, fix in run_checks(_dir(args)):
        mark = "ok " if ok else "!! "
        print(f"{mark}{name}: {detail}")
        if not ok and fix:
            print(f"    fix: {fix}")
        problems += 0 if ok else 1
    return EXIT_OK if problems == 0 else EXIT_PROBLEMS


def cmd_tune(args) -> int:
    from .tuning import FactoryError, TrialFailed, tune
    from .tuning.remote import CollectorError
    if args.budget <= 0:
        return fail("--budget must be a positive number of seconds", EXIT_USAGE)
    if args.consumption is not None and args.consumption <= 0:
        return fail("--consumption must be a positive number of batches per second", EXIT_USAGE)
    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        return fail("--checkpoint-every must be a positive number of steps", EXIT_USAGE)
    try:
        result = tune(args.factory, budget_s=args.budget, consumption_batches_per_s=args.consumption,
                      run_name=args.run, loader=args.loader, checkpoint_every=args.checkpoint_every)
    except (FactoryError, CollectorError, TrialFailed) as exc:
        return fail(str(exc))
    return EXIT_OK if result.answer is not None and result.stored is not False else EXIT_ERROR


def fail(message: str, code: int = EXIT_ERROR) -> int:
    print(f"starvewatch: error: {message}", file=sys.stderr)
    return code


def _dir(args):
    from pathlib import Path

    from .defaults import default_dir
    return Path(args.dir) if getattr(args, "dir", None) else default_dir()


def read_token_file(path) -> str | None:
    """A token file's token; refused when others may read it (it would be everyone's token)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, encoding="utf-8") as f:
        mode = os.fstat(f.fileno()).st_mode
        if mode & 0o077:
            raise ValueError(f"other users may read it (mode {mode & 0o777:o}): chmod 600 it")
        return f.read(4096).strip() or None


def cmd_serve(args) -> int:
    from .monitor.web.collector_settings import CollectorSettings
    settings = CollectorSettings(host=args.host, port=args.port, dir=_dir(args), db=args.db,
                                 **({"database_url": args.database_url} if args.database_url else {}),
                                 idle_exit_s=args.idle_exit, body_timeout_s=args.body_timeout,
                                 lost_after_s=args.lost_after, max_db_bytes=args.max_db_size,
                                 otlp_endpoint=args.otlp_endpoint,
                                 otlp_interval_s=args.otlp_interval, tensorboard_dir=args.tensorboard,
                                 tensorboard_interval_s=args.tensorboard_interval,
                                 min_body_bytes_per_s=args.min_body_rate, header_timeout_s=args.header_timeout,
                                 keep_alive_timeout_s=args.keep_alive_timeout,
                                 max_header_bytes=args.max_header_bytes, max_connections=args.max_connections,
                                 ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile)
    if settings.database_url:
        problem = _database_problem(settings.database_url)
        if problem is not None:
            return fail(*problem)
    try:  # an optional exporter asked for but not installed: say so before starting
        if args.otlp_endpoint:
            import starvewatch.monitor.outputs.otel  # noqa: F401
        if args.tensorboard:
            import starvewatch.monitor.outputs.tensorboard  # noqa: F401
    except ImportError as exc:
        return fail(str(exc))
    if args.token:
        settings.token = args.token
    if args.token_file:
        try:
            settings.token = read_token_file(args.token_file)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            return fail(f"cannot use the token file {args.token_file}: {exc}", EXIT_USAGE)
        if settings.token is None:
            return fail(f"the token file {args.token_file} is empty", EXIT_USAGE)
    from .defaults import default_dir
    from .local_secrets import UnsafeSecret, check_private_dir, collector_key, local_token, private_dir
    try:
        # The data directory, and the user's private one (the collector key: training asks
        # a loopback collector to prove it holds it; the per-user token), never another's.
        for directory in {Path(settings.dir), default_dir()}:
            if directory.exists():
                check_private_dir(directory)
        settings.collector_key = collector_key(private_dir(), make=True)
        settings.local_token = local_token(private_dir(), make=True)
    except (UnsafeSecret, OSError) as exc:
        return fail(str(exc), EXIT_USAGE)
    generated = None
    from .monitor.web.collector_settings import is_loopback
    if settings.token is None and not is_loopback(settings.host) and not args.autostarted:
        import secrets
        # As Jupyter does: a strong token made here and printed once (nowhere else).
        generated = settings.token = secrets.token_urlsafe(24)
    try:
        settings.check()
    except ValueError as exc:
        return fail(str(exc), EXIT_USAGE)
    import socket
    try:
        with socket.create_server((args.host, args.port)):
            pass
    except OSError as exc:
        import errno
        if exc.errno == errno.EADDRINUSE:
            return fail(_address_in_use(settings, args.dir))
        return fail(f"cannot listen on {settings.url}: {exc.strerror or exc}")
    from .monitor.web.server import serve
    if not args.autostarted:
        print(f"starvewatch collector and dashboard on {settings.url} ({settings.store_label})", flush=True)
    if generated:
        print(f"no token was given: this collector's token is {generated}\n"
              f"  (shown once; give it to the hooks as STARVEWATCH_TOKEN, and open "
              f"{settings.url}/?token=... in a browser once)", flush=True)
    serve(settings, autostarted=args.autostarted, ui=dashboard_ui(settings))
    return EXIT_OK


def _address_in_use(settings, dir_option: str | None) -> str:
    """Whose the port is: our own collector (from the pid file of this data directory, or one
    that answers /healthz as starvewatch), or another program."""
    from .monitor.web.server import running_collector
    own = running_collector(settings.dir)
    if own is not None and int(own.get("port", -1)) == settings.port:
        return (f"a starvewatch collector already runs on {own.get('url')} (pid {own['pid']}): open that "
                f"address, or stop it with `starvewatch stop" + (f" --dir {dir_option}" if dir_option else "") + "`")
    from .hooks.delivery.collector_link import probe
    from .hooks.delivery.transport import HttpTransport
    transport = HttpTransport(settings.url.replace("0.0.0.0", "127.0.0.1"), timeout_s=2.0)
    try:
        found = probe(transport)
    finally:
        transport.close()
    if found == "starvewatch":
        return (f"a starvewatch collector already answers on {settings.url} (started from another data "
                f"directory): open that address, or choose another port with --port")
    return (f"port {settings.port} is in use by another program: choose another port with "
            f"--port {settings.port + 1} (and set STARVEWATCH_URL to match in training)")


def _database_problem(url: str):
    """Why `serve` cannot use this database URL, as fail()'s arguments; None when it can: a
    clear line before starting, not a traceback from the server's start-up."""
    from .monitor.storage.open_store import is_database_url
    if not is_database_url(url):
        return (f"--database-url {url.split('://', 1)[0]}://...: only PostgreSQL is supported "
                f"(postgresql://user@host:port/database)", EXIT_USAGE)
    try:
        import psycopg
    except ImportError:
        return ("--database-url needs the PostgreSQL driver: pip install 'starvewatch[postgres]'",)
    try:
        psycopg.connect(url, connect_timeout=10).close()
    except psycopg.Error as exc:
        return (f"cannot connect to the database: {str(exc).strip().splitlines()[0]}",)
    return None


def dashboard_ui(settings):
    """The dashboard, composed onto the collector here where `serve` builds the app: the
    collector (monitor/) knows no UI, and the dashboard is a client of its query layer."""
    if not settings.dashboard:
        return None
    from .dashboard import mount
    return mount


def cmd_stop(args) -> int:
    from .monitor.web.server import stop
    ok, message = stop(_dir(args))
    print(message, file=sys.stdout if ok else sys.stderr)
    return EXIT_OK if ok else EXIT_ERROR


def cmd_import(args) -> int:
    from pathlib import Path

    from .monitor.web.collector_settings import CollectorSettings
    from .monitor.storage.spool_import import SpoolImporter
    from .monitor.storage.open_store import open_store
    source = Path(args.source)
    if not source.is_dir():
        return fail(f"{source} is not a directory")
    root = source / "spool" if (source / "spool").is_dir() else source
    settings = CollectorSettings(dir=_dir(args), db=args.db,
                                 **({"database_url": args.database_url} if args.database_url else {}))
    store = open_store(settings.store_target)
    importer = SpoolImporter(store, root, delete=args.delete)
    files = importer.files()
    if not files:
        return fail(f"no spooled batches under {root} (expected <run>/<stream>/<seq>.json.gz)")
    from .progress import progress_bar
    with progress_bar(len(files), "importing") as advance:
        count = importer.scan(progress=lambda path: advance())
    store.close()
    print(f"imported {count} new batches from {root} into {settings.store_label.split(' ', 1)[1]}"
          + (f"; {importer.rejected_count} unreadable files set aside (in {importer.rejected_root}, "
             f"each with a .reason file)" if importer.rejected_count else "")
          + (f"; {importer.not_files} entries that are not regular files skipped (a FIFO?)"
             if importer.not_files else ""))
    return EXIT_OK


def _positive(kind: type, what: str):
    """An argparse type: a finite number above zero (a whole one at least 1 for int)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not value > 0 or value != value or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be a positive {what.split(' ', 1)[1]}, got {text}")
        return value
    return parse


_positive_seconds = _positive(float, "a number of seconds")
_positive_number = _positive(float, "a number")
_positive_int = _positive(int, "a whole number")


def _seconds_or_never(text: str) -> float:
    """An argparse type: a finite number of seconds, at least 0 (0: never)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value < float("inf"):  # NaN compares false: refused too
        raise argparse.ArgumentTypeError(f"must be 0 (never) or a positive number of seconds, got {text}")
    return value


def _db_size(text: str) -> int:
    from .monitor.budget.retention import parse_size
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class Parser(argparse.ArgumentParser):
    """argparse, plus the closest choice on a typo ("did you mean 'serve'?")."""

    def error(self, message: str):
        import difflib
        import re
        typo = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if typo:
            choices = re.findall(r"'([^']*)'", typo.group(2))
            close = difflib.get_close_matches(typo.group(1), choices, n=1, cutoff=0.6)
            if close:
                message += f"; did you mean '{close[0]}'?"
        super().error(message)


def _source_options(p) -> None:
    """Where a reading command finds its data: the collector, or offline files."""
    p.add_argument("--url", help="collector URL (default STARVEWATCH_URL or http://127.0.0.1:8412)")
    p.add_argument("--spool", help="read offline from a spool directory instead")
    p.add_argument("--db", help="read offline from a database file instead")
    p.add_argument("--dir", help="data directory for the offline fallback (default STARVEWATCH_DIR)")


def cmd_token(args) -> int:
    """Project tokens in the collector's store (the one `serve` opens with the same --dir, --db
    or --database-url): create prints the token once; the store keeps its SHA-256 digest."""
    from .monitor.storage import access_tokens
    from .monitor.storage.open_store import open_store
    from .monitor.web.collector_settings import CollectorSettings
    settings = CollectorSettings(dir=_dir(args), db=args.db,
                                 **({"database_url": args.database_url} if args.database_url else {}))
    store = open_store(settings.store_target)
    try:
        if args.token_command == "create":
            try:
                record, token = access_tokens.create(store, args.role, args.project)
            except ValueError as exc:
                return fail(str(exc), EXIT_USAGE)
            print(token)
            print(f"token {record.id}: {record.role} on {', '.join(record.projects)}; shown once, not "
                  f"stored (only its digest is); revoke with `starvewatch token revoke {record.id}`", file=sys.stderr)
        elif args.token_command == "list":
            tokens = access_tokens.listed(store)
            if args.json:
                print(json.dumps([t.listed() for t in tokens], indent=2))
            for t in tokens if not args.json else ():
                print(f"{t.id}  {t.role:<5}  {'revoked' if t.revoked_at else 'live   '}  "
                      f"{printable(', '.join(t.projects))}")
        else:
            if not access_tokens.revoke(store, args.id):
                return fail(f"no live token {args.id!r} (starvewatch token list)")
            print(f"token {args.id} revoked: refused from now on, its logins included")
    finally:
        store.close()
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="starvewatch", description="Live GPU-starvation monitor for PyTorch training.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    from .version import __version__
    parser.add_argument("--version", action="version", version=f"starvewatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    _add_demo(sub)
    _add_serve(sub)
    _add_stop(sub)
    _add_import(sub)
    _add_export(sub)
    _add_runs(sub)
    _add_compare(sub)
    _add_tune(sub)
    _add_doctor(sub)
    _add_token(sub)
    return parser


def _add_demo(sub) -> None:
    demo = sub.add_parser("demo", help="run a synthetic starved training, then the fix")
    demo.add_argument("--quick", action="store_true", help="a few seconds instead of the full demo")
    demo.add_argument("--name", default="demo", help="run name (default: demo)")
    demo.set_defaults(func=cmd_demo)


def _add_serve(sub) -> None:
    serve = sub.add_parser("serve", help="run the collector (API, /metrics, dashboard) in the foreground")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; "
                       "any other address requires a token)")
    serve.add_argument("--port", type=int, default=8412, help="port (default 8412)")
    serve.add_argument("--db", help="SQLite file (default STARVEWATCH_DIR/starvewatch.db)")
    serve.add_argument("--database-url", metavar="URL",
                       help="a PostgreSQL database shared by several collectors, postgresql://user@host:port/db "
                       "(default STARVEWATCH_DATABASE_URL; needs pip install 'starvewatch[postgres]')")
    serve.add_argument("--dir", help="data directory (default STARVEWATCH_DIR or ~/.starvewatch)")
    serve.add_argument("--token", help="require this token on every route; prefer STARVEWATCH_TOKEN or "
                       "--token-file, as any user of the machine sees a command line (ps)")
    serve.add_argument("--token-file", metavar="FILE", help="read the token from this file (its first line)")
    serve.add_argument("--ssl-certfile", metavar="PEM", help="serve HTTPS with this certificate (chain)")
    serve.add_argument("--ssl-keyfile", metavar="PEM", help="the certificate's private key")
    serve.add_argument("--header-timeout", type=_positive_seconds, default=10.0, metavar="SECONDS",
                       help="close a connection whose request headers take longer (default 10)")
    serve.add_argument("--keep-alive-timeout", type=_positive_seconds, default=5.0, metavar="SECONDS",
                       help="close an idle kept-alive connection after this long (default 5)")
    serve.add_argument("--min-body-rate", type=_positive_number, default=1024.0, metavar="BYTES_PER_S",
                       help="answer 408 to a body arriving slower than this, after --body-timeout "
                            "(default 1024)")
    serve.add_argument("--max-header-bytes", type=_positive_int, default=64 * 1024, metavar="BYTES",
                       help="request line and headers together (default 65536)")
    serve.add_argument("--max-connections", type=_positive_int, default=100, metavar="N",
                       help="connections open at once; more are closed at once (default 100)")
    serve.add_argument("--idle-exit", type=_seconds_or_never, default=0.0, metavar="SECONDS",
                       help="exit after this long with no live run (default: never)")
    serve.add_argument("--otlp-endpoint", metavar="URL", help="also send the metrics to this OTLP/HTTP endpoint "
                       "(e.g. http://otel-collector:4318/v1/metrics; needs starvewatch[otel])")
    serve.add_argument("--otlp-interval", type=_positive_seconds, default=15.0, metavar="SECONDS",
                       help="OTLP export period (default 15)")
    serve.add_argument("--tensorboard", metavar="DIR", help="write per-run scalars for TensorBoard under DIR "
                       "(needs starvewatch[tensorboard])")
    serve.add_argument("--tensorboard-interval", type=_positive_seconds, default=5.0, metavar="SECONDS",
                       help="TensorBoard write period (default 5)")
    serve.add_argument("--body-timeout", type=float, default=30.0, metavar="SECONDS",
                       help="answer 408 to a request whose body goes silent this long (default 30)")
    serve.add_argument("--lost-after", type=_positive_seconds, default=60.0, metavar="SECONDS",
                       help="a run whose processes sent nothing for this long without finishing "
                            "(killed, crashed) is shown as lost (default 60)")
    serve.add_argument("--max-db-size", type=_db_size, default=4 * 2**30, metavar="SIZE",
                       help="storage budget of the database, its -wal and -shm files included: 500MB, 4GB "
                            "(powers of ten), 512MiB, 4GiB (powers of two); past it the oldest raw rows are "
                            "folded into rollups (default 4GiB)")
    serve.add_argument("--autostarted", action="store_true", help=argparse.SUPPRESS)
    serve.set_defaults(func=cmd_serve)


def _add_stop(sub) -> None:
    stop = sub.add_parser("stop", help="stop the collector that was started for you")
    stop.add_argument("--dir", help="data directory (default STARVEWATCH_DIR or ~/.starvewatch)")
    stop.set_defaults(func=cmd_stop)


def _add_import(sub) -> None:
    imp = sub.add_parser("import", help="ingest a spool directory taken from elsewhere")
    imp.add_argument("source", help="a STARVEWATCH_DIR or its spool/ directory")
    imp.add_argument("--dir", help="data directory holding the database")
    imp.add_argument("--db", help="SQLite file (default STARVEWATCH_DIR/starvewatch.db)")
    imp.add_argument("--database-url", metavar="URL", help="import into this PostgreSQL database instead "
                     "(default STARVEWATCH_DATABASE_URL)")
    imp.add_argument("--delete", action="store_true", help="delete the spool files once imported")
    imp.set_defaults(func=cmd_import)


def _add_export(sub) -> None:
    exp = sub.add_parser("export", help="write a run as JSON, CSV, Markdown, self-contained HTML or a "
                                        "Chrome/Perfetto trace")
    exp.add_argument("run", help="run id, unique id prefix, run name, or 'latest'")
    exp.add_argument("--format", "-f", choices=("json", "csv", "md", "html", "trace"), default="json")
    exp.add_argument("-o", "--output", help="file to write (default: standard output)")
    exp.add_argument("--steps", help="trace: the steps A:B of each epoch (either side may be empty)")
    exp.add_argument("--window", help="trace: seconds S:E since the run's first step")
    exp.add_argument("--rank", type=int, help="trace: one rank only")
    exp.add_argument("--merge", metavar="PROFILER_TRACE",
                     help="trace: put the tracks into this torch.profiler (Kineto) JSON trace")
    _source_options(exp)
    exp.set_defaults(func=cmd_export)


def _add_runs(sub) -> None:
    runs = sub.add_parser("runs", help="list, show or delete runs")
    runs.add_argument("action", nargs="?", choices=("list", "show", "delete"), default="list")
    runs.add_argument("run", nargs="?", help="run id, name or 'latest' (show, delete)")
    runs.add_argument("--status", choices=("live", "stalled", "finished", "lost"))
    runs.add_argument("--search", help="substring of the run name or id")
    runs.add_argument("--yes", "-y", action="store_true", help="delete without asking")
    _source_options(runs)
    runs.set_defaults(func=cmd_runs)


def _add_compare(sub) -> None:
    cmp = sub.add_parser("compare", help="compare two runs: deltas and the verify-after-change verdict")
    cmp.add_argument("before", help="run id, unique id prefix, run name, or 'latest'")
    cmp.add_argument("after", help="run id, unique id prefix, run name, or 'latest'")
    cmp.add_argument("--format", "-f", choices=("md", "json", "html"), default="md",
                     help="md (default, for the terminal), json, or html (one self-contained file with charts)")
    cmp.add_argument("-o", "--output", help="file to write (default: standard output)")
    _source_options(cmp)
    cmp.set_defaults(func=cmd_compare)


def _add_tune(sub) -> None:
    tun = sub.add_parser("tune", help="measure DataLoader settings on this machine and pick one",
                         description="Builds the loader with each configuration tried (num_workers, "
                         "prefetch_factor, persistent_workers, pin_memory with CUDA), measures its "
                         "throughput without training, and prints a table and a DataLoader(...) call.")
    tun.add_argument("factory", help="module:function (or file.py:function) that builds the DataLoader from "
                     "keyword arguments, or module:name of a DataLoader")
    tun.add_argument("--budget", type=float, default=60.0, metavar="SECONDS", help="time budget (default 60)")
    tun.add_argument("--consumption", type=float, metavar="BATCHES_PER_S",
                     help="batches/s the training consumes (default: from --run, else none)")
    tun.add_argument("--run", metavar="NAME", help="a watched run: its compute per batch is the consumption, "
                     "and the results are stored with it in the collector")
    tun.add_argument("--loader", help="which of the run's loaders (default: its first)")
    tun.add_argument("--checkpoint-every", type=int, metavar="STEPS",
                     help="a StatefulDataLoader: steps between checkpoints (state_dict() calls), tried as "
                     "snapshot_every_n_steps (default: from --run)")
    tun.set_defaults(func=cmd_tune)


def _add_doctor(sub) -> None:
    doc = sub.add_parser("doctor", help="check NVML, torch and CUDA, /dev/shm, the collector")
    doc.add_argument("--dir", help="data directory (default STARVEWATCH_DIR or ~/.starvewatch)")
    doc.set_defaults(func=cmd_doctor)


def _add_token(sub) -> None:
    tok = sub.add_parser("token", help="project tokens: create, list, revoke (docs/security.md)")
    tok.add_argument("--dir", help="data directory holding the database")
    tok.add_argument("--db", help="SQLite file (default STARVEWATCH_DIR/starvewatch.db)")
    tok.add_argument("--database-url", metavar="URL", help="the collector's PostgreSQL database "
                     "(default STARVEWATCH_DATABASE_URL)")
    what = tok.add_subparsers(dest="token_command", metavar="create|list|revoke", required=True)
    create = what.add_parser("create", help="a new token for a project and a role; printed once")
    create.add_argument("--project", action="append", required=True,
                        help="the project (repeat for a read or admin token of several; '*': every project)")
    create.add_argument("--role", required=True, choices=("write", "read", "admin"),
                        help="write: send records to its project; read: read its projects; admin: both, "
                             "and delete runs")
    listing = what.add_parser("list", help="the tokens, without their secret")
    listing.add_argument("--json", action="store_true", help="as JSON")
    revoke = what.add_parser("revoke", help="revoke a token by its id")
    revoke.add_argument("id")
    tok.set_defaults(func=cmd_token)


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the subcommand, with its usage, not the top-level one
        _subparser(parser, args.command).error(f"unrecognized arguments: {' '.join(unknown)}")
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


if __name__ == "__main__":
    sys.exit(main())
