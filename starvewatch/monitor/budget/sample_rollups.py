"""Host, GPU and DataLoader-worker samples folded into per-bucket aggregates (the storage budget).

The `events` table holds one row per sample (`samples`: host and GPU; `workers`: one loader's
worker snapshot). Past the budget, the oldest of them are merged, per run, rank, sample kind
(host / GPU / loader) and tier bucket (retention.TIERS_S, in the steps' order), into one bucket
event each (`events.span_s` = the tier width; 0 for a raw sample), built by
analysis/sample_buckets.py (the bucket's shape and maths, which the analysis reads too).
This module holds the SQL: which rows fold, and the rows written in their place. Stalls are never folded (few, and
the exemplar rule reads them). `rolled_samples` counts, per rank, the samples folded and until
when (the summary's `samples_rolled_up`).
"""
from __future__ import annotations

import orjson

from ...analysis.sample_buckets import fold_members

KINDS = ("samples", "workers")
MAX_EVENTS_PER_PASS = 20_000  # one transaction's worth: its pages pass through the WAL

DDL = """
CREATE TABLE IF NOT EXISTS rolled_samples (
    run_id TEXT NOT NULL, rank INTEGER NOT NULL, until_s INTEGER NOT NULL, events INTEGER NOT NULL,
    PRIMARY KEY (run_id, rank)) WITHOUT ROWID;
"""


def migrate(w) -> None:
    """`events.span_s` (schema 4) and `rolled_samples`, for a database from before them."""
    if "span_s" not in {row[1] for row in w.execute("PRAGMA table_info(events)")}:
        w.execute("ALTER TABLE events ADD COLUMN span_s INTEGER NOT NULL DEFAULT 0")
    w.executescript(DDL)


def _group(kind: str, data: dict):
    return data.get("loader") if kind == "workers" else data.get("kind")


def span(w, run_id: str) -> tuple[int, int] | None:
    """The run's first and last sample second (index lookups, one per kind and end)."""
    ends = []
    for kind in KINDS:
        first = w.execute("SELECT t_ns, span_s FROM events WHERE run_id = ? AND kind = ? ORDER BY t_ns LIMIT 1",
                          (run_id, kind)).fetchone()
        if first is None:
            continue
        hi = w.execute("SELECT max(t_ns) FROM events WHERE run_id = ? AND kind = ?", (run_id, kind)).fetchone()[0]
        # A bucket is stored at its last sample's time: the run began no later than its bucket's start.
        lo = first[0] - first[0] % (first[1] * 1_000_000_000) if first[1] else first[0]
        ends.append((lo, hi))
    if not ends:
        return None
    return min(e[0] for e in ends) // 1_000_000_000, max(e[1] for e in ends) // 1_000_000_000


def fold(w, run_id: str, width_s: int, cut_s: int, limit: int = MAX_EVENTS_PER_PASS) -> int:
    """One pass, inside the caller's transaction: the run's oldest samples finer than width_s
    and before cut_s (a multiple of width_s) merged into width_s buckets, at most `limit` rows
    read. Returns how many rows were folded (0: none left)."""
    cut_ns = cut_s * 1_000_000_000
    for kind in KINDS:
        # One kind at a time: the index (run_id, kind, t_ns) gives the oldest rows in order, no sort.
        rows = w.execute(
            "SELECT rowid, rank, kind, t_ns, span_s, data FROM events WHERE run_id = ? AND kind = ? "
            "AND t_ns < ? AND span_s < ? ORDER BY t_ns, rowid LIMIT ?", (run_id, kind, cut_ns, width_s, limit)).fetchall()
        if rows:
            return _fold_rows(w, run_id, width_s, rows, limit)
    return 0


def _fold_rows(w, run_id: str, width_s: int, rows: list, limit: int) -> int:
    width_ns = width_s * 1_000_000_000
    if len(rows) == limit:
        # The last bucket may go on past the rows read: leave it to the next pass, unless it is all there is.
        last_bucket = rows[-1][3] // width_ns
        whole = [r for r in rows if r[3] // width_ns < last_bucket]
        rows = whole or rows
    groups: dict[tuple, list] = {}
    for rowid, rank, kind, t_ns, span_s, data in rows:
        event = orjson.loads(data)
        groups.setdefault((rank, kind, _group(kind, event), t_ns // width_ns), []).append((rowid, t_ns, span_s, event))
    raw_per_rank: dict[int, int] = {}
    until_per_rank: dict[int, int] = {}
    lone, inserts, removed = [], [], []
    for (rank, kind, _, bucket), members in groups.items():
        raw_per_rank[rank] = raw_per_rank.get(rank, 0) + sum(1 for m in members if m[2] == 0)
        until_per_rank[rank] = max(until_per_rank.get(rank, 0), (bucket + 1) * width_s)
        if len(members) == 1:
            lone.append((width_s, members[0][0]))  # alone in its bucket: kept as it is, marked
            continue
        merged = fold_members(kind, [m[3] for m in members], width_s)
        removed += [(m[0],) for m in members]
        inserts.append((run_id, rank, kind, members[-1][1], orjson.dumps(merged).decode(), width_s))
    w.executemany("UPDATE events SET span_s = ? WHERE rowid = ?", lone)
    w.executemany("DELETE FROM events WHERE rowid = ?", removed)
    w.executemany("INSERT INTO events (run_id, rank, kind, t_ns, data, span_s) VALUES (?, ?, ?, ?, ?, ?)", inserts)
    w.executemany("INSERT INTO rolled_samples VALUES (?, ?, ?, ?) ON CONFLICT(run_id, rank) DO UPDATE SET "
                  "until_s = max(until_s, excluded.until_s), events = events + excluded.events",
                  [(run_id, rank, until_per_rank[rank], n) for rank, n in raw_per_rank.items()])
    return len(rows)

