"""What one run may hold (issue 36 item 3), checked inside the ingest's transaction.

Without them one run could make every view slow for all: 1,000 loader names made a run's HTML
export take 159 s, 20,000 made /metrics take 6.6 s. The bounds are in starvewatch/limits.py, which
the hooks import too (they keep within them, so a batch of theirs is never refused whole): past
one, the batch is refused (422) with a message that names the bound, and nothing of it is
written. The hostname's size is the wire model's (MAX_HOST_CHARS).
"""
from __future__ import annotations

import sqlite3

from ...limits import MAX_LOADERS_PER_RUN, MAX_RANKS_PER_RUN, MAX_STALL_ROWS_PER_RANK, MAX_TUNINGS_PER_RUN


class RunBoundError(ValueError):
    """A batch or document that would take its run past one of the limits."""


def check_batch(w: sqlite3.Connection, batch) -> None:
    """Refuse `batch` when storing it would take its run past a bound (before any write)."""
    names = {l.name for l in batch.loaders} | set(batch.steps.loader)
    if names:
        # (Every batch with steps carries its loaders' records: the loaders table knows them all.)
        known = {r[0] for r in w.execute("SELECT DISTINCT name FROM loaders WHERE run_id = ?", (batch.run_id,))}
        total = len(known | names)
        if total > MAX_LOADERS_PER_RUN:
            raise RunBoundError(f"run {batch.run_id!r} would have {total:,} loader names, over the limit of "
                                f"{MAX_LOADERS_PER_RUN:,} per run (starvewatch/limits.py)")
    if w.execute("SELECT 1 FROM streams WHERE run_id = ? AND rank = ? LIMIT 1",
                 (batch.run_id, batch.rank)).fetchone() is None:
        ranks = w.execute("SELECT count(DISTINCT rank) FROM streams WHERE run_id = ?", (batch.run_id,)).fetchone()[0]
        if ranks >= MAX_RANKS_PER_RUN:
            raise RunBoundError(f"run {batch.run_id!r} has {ranks:,} ranks already, the limit per run "
                                f"(starvewatch/limits.py); rank {batch.rank} is refused")
    if batch.stalls:
        stored = w.execute("SELECT count(*) FROM events WHERE run_id = ? AND rank = ? AND kind = 'stalls'",
                           (batch.run_id, batch.rank)).fetchone()[0]
        if stored + len(batch.stalls) > MAX_STALL_ROWS_PER_RANK:
            raise RunBoundError(f"rank {batch.rank} of run {batch.run_id!r} would have "
                                f"{stored + len(batch.stalls):,} stall events, over the limit of "
                                f"{MAX_STALL_ROWS_PER_RANK:,} per rank (starvewatch/limits.py)")


def check_tuning(w: sqlite3.Connection, run_id: str) -> None:
    stored = w.execute("SELECT count(*) FROM tunings WHERE run_id = ?", (run_id,)).fetchone()[0]
    if stored >= MAX_TUNINGS_PER_RUN:
        raise RunBoundError(f"run {run_id!r} has {stored:,} tuning results already, the limit per run "
                            f"(starvewatch/limits.py); tune under a new run name")


def check_stream_owner(w: sqlite3.Connection, batch) -> None:
    """A stream id is its run's: another run reusing it (the API shows it) once made the first
    run's next batch a "duplicate" and marked that run finished. Checked before anything,
    the replay check included."""
    row = w.execute("SELECT run_id FROM streams WHERE stream = ?", (batch.stream,)).fetchone()
    if row is not None and row[0] != batch.run_id:
        raise RunBoundError(f"stream id {batch.stream!r} belongs to another run; each process of a run "
                            f"sends under a stream id of its own")
