"""What a batch writes for its process stream, the same way on SQLite (store.py) and
PostgreSQL (pg_store.py), inside the store's ingest transaction:
- claim_records: the checks before anything is written (run_bounds.py, project_scope.py), and
  the batch's record range claimed in `seen`, so that a replayed batch is stored once;
- upsert_stream: the stream's row in `streams`: the highest sequence number seen, the last
  time, the finished flag, and the drops and delivery account of the newest batch (a replayed
  batch carries an older account).

One statement per dialect, as each store runs it: SQLite's scalar max() and json_extract;
PostgreSQL's GREATEST and a jsonb cast, its columns qualified (a bare name in DO UPDATE would be
ambiguous there) and "end" quoted (a reserved word), sent straight to the driver (pg_dialect.py
translates neither JSON paths nor reserved words).
"""
from __future__ import annotations

import orjson

from ...batch_parts import uncovered
from .batch_records import only_records
from .project_scope import check_run_project
from .run_bounds import check_batch, check_stream_owner

SEEN_SQL = {  # (the batch's stored ranges, its claim)
    "sqlite": ("SELECT first, end FROM seen WHERE stream = ? AND seq = ?",
               "INSERT OR IGNORE INTO seen VALUES (?, ?, ?, ?)"),
    "postgresql": ('SELECT first, "end" FROM seen WHERE stream = %s AND seq = %s',
                   "INSERT INTO seen VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING"),
}

STREAM_SQL = {
    "sqlite": (
        "INSERT INTO streams (stream, run_id, rank, last_seq, last_seen, finished, drops, delivery) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(stream) DO UPDATE SET "
        "last_seq = max(last_seq, excluded.last_seq), last_seen = excluded.last_seen, "
        "finished = max(finished, excluded.finished), drops = CASE WHEN excluded.last_seq >= "
        "last_seq THEN excluded.drops ELSE drops END, "
        "delivery = CASE WHEN excluded.delivery IS NOT NULL AND (delivery IS NULL OR "
        "json_extract(excluded.delivery, '$.seq') >= json_extract(delivery, '$.seq')) "
        "THEN excluded.delivery ELSE delivery END"),
    "postgresql": (
        "INSERT INTO streams (stream, run_id, rank, last_seq, last_seen, finished, drops, delivery) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT(stream) DO UPDATE SET "
        "last_seq = GREATEST(streams.last_seq, excluded.last_seq), last_seen = excluded.last_seen, "
        "finished = GREATEST(streams.finished, excluded.finished), drops = CASE WHEN "
        "excluded.last_seq >= streams.last_seq THEN excluded.drops ELSE streams.drops END, "
        "delivery = CASE WHEN excluded.delivery IS NOT NULL AND (streams.delivery IS NULL OR "
        "(excluded.delivery::jsonb->>'seq')::bigint >= (streams.delivery::jsonb->>'seq')::bigint) "
        "THEN excluded.delivery ELSE streams.delivery END"),
}


def claim_records(w, execute, dialect: str, batch, first: int, end: int, projects=None):
    """None for a replay (every record of it is stored already: the caller ends its
    transaction); else (the batch keeping only the records not stored yet, the ranges stored
    before). `w`: the store's writer connection, for the checks; `execute`: the one the `seen`
    statements of `dialect` ("sqlite" or "postgresql") run on. In this order: a stream id is its
    run's, the run is the token's project's (before the replay check: 403, never "duplicate"),
    and past a bound of its run the batch is refused whole (422) before anything is written."""
    select_stored, insert_claim = SEEN_SQL[dialect]
    check_stream_owner(w, batch)
    check_run_project(w, batch.run_id, projects)
    stored = execute(select_stored, (batch.stream, batch.seq)).fetchall()
    todo = uncovered(first, end, stored) if end > first else ([] if stored else [(first, end)])
    if not todo:
        return None
    check_batch(w, batch)
    execute(insert_claim, (batch.stream, batch.seq, first, end))
    if todo != [(first, end)]:  # split differently before: only the records not stored yet
        batch = only_records(batch, first, todo)
    return batch, stored


def upsert_stream(execute, dialect: str, batch, now: float) -> None:
    """Write `batch`'s stream row through `execute` (the store's writer connection's), with the
    statement of `dialect` ("sqlite" or "postgresql")."""
    # The delivery account keeps its batch's sequence number: the highest one wins.
    delivery = None if batch.delivery is None else orjson.dumps(
        {"seq": batch.seq, **batch.delivery.model_dump()}).decode()
    execute(STREAM_SQL[dialect],
            (batch.stream, batch.run_id, batch.rank, batch.seq, now,
             1 if batch.status == "finished" else 0, orjson.dumps(batch.drops).decode(), delivery))
