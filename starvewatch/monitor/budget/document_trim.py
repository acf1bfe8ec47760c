"""The storage budget's stage for the documents a run keeps beside its rows (issue 36 item 3):
`starvewatch tune` results and the Python stacks of stall events. They count toward the budget
like every table (the budget measures the whole file); before any other run is deleted to make
room, the older ones are reclaimed, a live run's included: every run keeps its latest tuning
result (the one the summary reads) and the stacks of its newest KEEP_STACKS stalls per rank; an
older stall keeps its event (times, worker, state), its stack replaced by `stack_dropped`.
"""
from __future__ import annotations

import sqlite3

KEEP_STACKS = 20


def trim(w: sqlite3.Connection) -> int:
    """One pass: rows changed (0: nothing left to reclaim here)."""
    changed = w.execute(
        "DELETE FROM tunings WHERE rowid IN (SELECT t.rowid FROM tunings t WHERE EXISTS "
        "(SELECT 1 FROM tunings n WHERE n.run_id = t.run_id AND n.rowid > t.rowid))").rowcount
    changed += w.execute(
        "UPDATE events SET data = json_set(json_remove(data, '$.stack'), '$.stack_dropped', 'storage budget') "
        "WHERE rowid IN (SELECT rowid FROM (SELECT rowid, row_number() OVER (PARTITION BY run_id, rank "
        "ORDER BY t_ns DESC, rowid DESC) AS newer FROM events WHERE kind = 'stalls' "
        "AND json_type(data, '$.stack') = 'text') WHERE newer > ?)", (KEEP_STACKS,)).rowcount
    return changed
