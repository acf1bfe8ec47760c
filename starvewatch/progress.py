"""Progress bars for long CLI work (rich when installed, else a plain counter on stderr)."""
from __future__ import annotations

import sys
from contextlib import contextmanager


@contextmanager
def progress_bar(total: int, label: str):
    try:
        from rich.progress import Progress
    except ImportError:
        done = [0]

        def advance(n: int = 1) -> None:
            done[0] += n
            if sys.stderr.isatty():
                print(f"\r{label} {done[0]}/{total}", end="", file=sys.stderr, flush=True)

        yield advance
        if sys.stderr.isatty():
            print(file=sys.stderr)
        return
    with Progress(transient=True, disable=not sys.stderr.isatty()) as progress:
        task = progress.add_task(label, total=total)
        yield lambda n=1: progress.advance(task, n)
