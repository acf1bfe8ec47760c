"""The commands that read runs, from the collector or offline files: export, runs, compare."""
from __future__ import annotations

import sys

from .cli_basics import EXIT_ERROR, EXIT_OK, EXIT_USAGE, data_dir, fail, printable


def _source(args):
    import os

    from ..defaults import DEFAULT_URL, OFF_VALUES
    from ..monitor.storage.sources import open_source
    url = getattr(args, "url", None) or os.environ.get("STARVEWATCH_URL") or DEFAULT_URL
    if url.strip().lower() in OFF_VALUES:
        url = DEFAULT_URL
    return open_source(url=url, spool=getattr(args, "spool", None), db=getattr(args, "db", None),
                       directory=data_dir(args), token=os.environ.get("STARVEWATCH_TOKEN"))


def _with_source(fn):
    def run(args) -> int:
        from ..monitor.storage.sources import LocalSource, SourceError
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
    from ..monitor.outputs.export import export
    from ..monitor.storage.sources import resolve_run
    run_id = resolve_run(source, args.run)
    if args.format == "trace":
        from ..monitor.outputs.trace_cli import write_trace
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
    from ..monitor.storage.sources import resolve_run
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
        from ..hooks.report import format_report
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
    from ..analysis import compare
    from ..monitor.outputs import compare_report
    from ..monitor.storage.sources import resolve_run
    a, b = resolve_run(source, args.before), resolve_run(source, args.after)
    if args.format == "html":
        from ..monitor.outputs.compare_figures import figures_for
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
