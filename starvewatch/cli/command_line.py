"""The `starvewatch` command line: its options, their checks, and its help. The functions that
run the commands are given to build_parser() (the package's __init__ wires them)."""
from __future__ import annotations

import argparse
from collections.abc import Callable

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
    from ..monitor.budget.retention import parse_size
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


def _store_options(p, database_url_help: str) -> None:
    """Which store a writing command opens, as `serve` does: --dir, --db or --database-url."""
    p.add_argument("--dir", help="data directory holding the database")
    p.add_argument("--db", help="SQLite file (default STARVEWATCH_DIR/starvewatch.db)")
    p.add_argument("--database-url", metavar="URL", help=f"{database_url_help} (default STARVEWATCH_DATABASE_URL)")


def build_parser(commands: dict[str, Callable[..., int]]) -> argparse.ArgumentParser:
    """The parser; each command's parsed arguments carry `func`, its function in `commands`
    (command name -> function of the parsed arguments, returning the exit code)."""
    parser = Parser(
        prog="starvewatch", description="Live GPU-starvation monitor for PyTorch training.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    from ..version import __version__
    parser.add_argument("--version", action="version", version=f"starvewatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    _add_demo(sub, commands)
    _add_serve(sub, commands)
    _add_stop(sub, commands)
    _add_import(sub, commands)
    _add_export(sub, commands)
    _add_runs(sub, commands)
    _add_compare(sub, commands)
    _add_tune(sub, commands)
    _add_doctor(sub, commands)
    _add_token(sub, commands)
    return parser


def _add_demo(sub, commands: dict[str, Callable[..., int]]) -> None:
    demo = sub.add_parser("demo", help="run a synthetic starved training, then the fix")
    demo.add_argument("--quick", action="store_true", help="a few seconds instead of the full demo")
    demo.add_argument("--name", default="demo", help="run name (default: demo)")
    demo.set_defaults(func=commands["demo"])


def _add_serve(sub, commands: dict[str, Callable[..., int]]) -> None:
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
    serve.set_defaults(func=commands["serve"])


def _add_stop(sub, commands: dict[str, Callable[..., int]]) -> None:
    stop = sub.add_parser("stop", help="stop the collector that was started for you")
    stop.add_argument("--dir", help="data directory (default STARVEWATCH_DIR or ~/.starvewatch)")
    stop.set_defaults(func=commands["stop"])


def _add_import(sub, commands: dict[str, Callable[..., int]]) -> None:
    imp = sub.add_parser("import", help="ingest a spool directory taken from elsewhere")
    imp.add_argument("source", help="a STARVEWATCH_DIR or its spool/ directory")
    _store_options(imp, "import into this PostgreSQL database instead")
    imp.add_argument("--delete", action="store_true", help="delete the spool files once imported")
    imp.set_defaults(func=commands["import"])


def _add_export(sub, commands: dict[str, Callable[..., int]]) -> None:
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
    exp.set_defaults(func=commands["export"])


def _add_runs(sub, commands: dict[str, Callable[..., int]]) -> None:
    runs = sub.add_parser("runs", help="list, show or delete runs")
    runs.add_argument("action", nargs="?", choices=("list", "show", "delete"), default="list")
    runs.add_argument("run", nargs="?", help="run id, name or 'latest' (show, delete)")
    runs.add_argument("--status", choices=("live", "stalled", "finished", "lost"))
    runs.add_argument("--search", help="substring of the run name or id")
    runs.add_argument("--yes", "-y", action="store_true", help="delete without asking")
    _source_options(runs)
    runs.set_defaults(func=commands["runs"])


def _add_compare(sub, commands: dict[str, Callable[..., int]]) -> None:
    cmp = sub.add_parser("compare", help="compare two runs: deltas and the verify-after-change verdict")
    cmp.add_argument("before", help="run id, unique id prefix, run name, or 'latest'")
    cmp.add_argument("after", help="run id, unique id prefix, run name, or 'latest'")
    cmp.add_argument("--format", "-f", choices=("md", "json", "html"), default="md",
                     help="md (default, for the terminal), json, or html (one self-contained file with charts)")
    cmp.add_argument("-o", "--output", help="file to write (default: standard output)")
    _source_options(cmp)
    cmp.set_defaults(func=commands["compare"])


def _add_tune(sub, commands: dict[str, Callable[..., int]]) -> None:
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
    tun.set_defaults(func=commands["tune"])


def _add_doctor(sub, commands: dict[str, Callable[..., int]]) -> None:
    doc = sub.add_parser("doctor", help="check NVML, torch and CUDA, /dev/shm, the collector")
    doc.add_argument("--dir", help="data directory (default STARVEWATCH_DIR or ~/.starvewatch)")
    doc.set_defaults(func=commands["doctor"])


def _add_token(sub, commands: dict[str, Callable[..., int]]) -> None:
    tok = sub.add_parser("token", help="project tokens: create, list, revoke (docs/security.md)")
    _store_options(tok, "the collector's PostgreSQL database")
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
    tok.set_defaults(func=commands["token"])


def subparser_of(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return parser
