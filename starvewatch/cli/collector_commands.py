"""The collector's commands: serve (and the dashboard composed onto it), stop, import, token."""
from __future__ import annotations

import json
import os
from pathlib import Path
import sys

from .cli_basics import EXIT_ERROR, EXIT_OK, EXIT_USAGE, data_dir, fail, printable


def read_token_file(path) -> str | None:
    """A token file's token; refused when others may read it (it would be everyone's token)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, encoding="utf-8") as f:
        mode = os.fstat(f.fileno()).st_mode
        if mode & 0o077:
            raise ValueError(f"other users may read it (mode {mode & 0o777:o}): chmod 600 it")
        return f.read(4096).strip() or None


def cmd_serve(args) -> int:
    from ..monitor.web.collector_settings import CollectorSettings
    settings = CollectorSettings(host=args.host, port=args.port, dir=data_dir(args), db=args.db,
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
    from ..defaults import default_dir
    from ..local_secrets import UnsafeSecret, check_private_dir, collector_key, local_token, private_dir
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
    from ..monitor.web.collector_settings import is_loopback
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
    from ..monitor.web.server import serve
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
    from ..monitor.web.server import running_collector
    own = running_collector(settings.dir)
    if own is not None and int(own.get("port", -1)) == settings.port:
        return (f"a starvewatch collector already runs on {own.get('url')} (pid {own['pid']}): open that "
                f"address, or stop it with `starvewatch stop" + (f" --dir {dir_option}" if dir_option else "") + "`")
    from ..hooks.delivery.collector_link import probe
    from ..hooks.delivery.transport import HttpTransport
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
    from ..monitor.storage.open_store import is_database_url
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
    from ..dashboard import mount
    return mount


def cmd_stop(args) -> int:
    from ..monitor.web.server import stop
    ok, message = stop(data_dir(args))
    print(message, file=sys.stdout if ok else sys.stderr)
    return EXIT_OK if ok else EXIT_ERROR


def cmd_import(args) -> int:
    from pathlib import Path

    from ..monitor.web.collector_settings import CollectorSettings
    from ..monitor.storage.spool_import import SpoolImporter
    from ..monitor.storage.open_store import open_store
    source = Path(args.source)
    if not source.is_dir():
        return fail(f"{source} is not a directory")
    root = source / "spool" if (source / "spool").is_dir() else source
    settings = CollectorSettings(dir=data_dir(args), db=args.db,
                                 **({"database_url": args.database_url} if args.database_url else {}))
    store = open_store(settings.store_target)
    importer = SpoolImporter(store, root, delete=args.delete)
    files = importer.files()
    if not files:
        return fail(f"no spooled batches under {root} (expected <run>/<stream>/<seq>.json.gz)")
    from ..progress import progress_bar
    with progress_bar(len(files), "importing") as advance:
        count = importer.scan(progress=lambda path: advance())
    store.close()
    print(f"imported {count} new batches from {root} into {settings.store_label.split(' ', 1)[1]}"
          + (f"; {importer.rejected_count} unreadable files set aside (in {importer.rejected_root}, "
             f"each with a .reason file)" if importer.rejected_count else "")
          + (f"; {importer.not_files} entries that are not regular files skipped (a FIFO?)"
             if importer.not_files else ""))
    return EXIT_OK


def cmd_token(args) -> int:
    """Project tokens in the collector's store (the one `serve` opens with the same --dir, --db
    or --database-url): create prints the token once; the store keeps its SHA-256 digest."""
    from ..monitor.storage import access_tokens
    from ..monitor.storage.open_store import open_store
    from ..monitor.web.collector_settings import CollectorSettings
    settings = CollectorSettings(dir=data_dir(args), db=args.db,
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
