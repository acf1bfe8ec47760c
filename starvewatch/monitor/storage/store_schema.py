"""The store's tables: their DDL, the schema version, and the migration of a file written by an
earlier version (additive columns, `seen` by record range).

Its own module because the schema is a contract read by every version that opens the file:
the version history sits next to the tables it describes, apart from the store's reads and
writes. The storage budget's tables are in database_file.py, the rollups' bands and run-wide
rollups in rollup_bands.py and run_rollups.py, the samples' in sample_rollups.py.
"""
from __future__ import annotations

import sqlite3

from ..budget import sample_rollups

# 2: `seen` keeps record ranges [first, end) of each batch (batch_parts.py), not only (stream, seq);
#    `rejected_files` counts the spool files that could not be ingested.
# 3: `run_rollups`, the per-rank rollups summed over ranks (run_rollups.py), filled at open.
# 4: `events.span_s` (0: a raw sample; else the tier of a bucket of folded samples) and
#    `rolled_samples` (sample_rollups.py): samples follow the storage budget's tiers.
# 5: `rollups` keep their steps' least wait and least and greatest compute (rollup_bands.py),
#    the chart's min-max bands.
# 6: `runs.project` (the project of the token that first sent the run; NULL: none) and `tokens`
#    (project tokens: id, SHA-256 digest, role, projects; access_tokens.py).
SCHEMA_VERSION = 6
WHOLE_BATCH_END = 2**62  # a batch stored before version 2: every record of it

DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, meta TEXT NOT NULL DEFAULT '{}',
    started_at REAL, ended_at REAL, first_seen REAL NOT NULL, last_seen REAL NOT NULL, project TEXT);
CREATE TABLE IF NOT EXISTS streams (
    stream TEXT PRIMARY KEY, run_id TEXT NOT NULL, rank INTEGER NOT NULL,
    last_seq INTEGER NOT NULL DEFAULT 0, last_seen REAL NOT NULL, finished INTEGER NOT NULL DEFAULT 0,
    drops TEXT NOT NULL DEFAULT '{}', delivery TEXT);
CREATE INDEX IF NOT EXISTS streams_run ON streams(run_id);
CREATE TABLE IF NOT EXISTS seen (stream TEXT NOT NULL, seq INTEGER NOT NULL, first INTEGER NOT NULL,
    end INTEGER NOT NULL, PRIMARY KEY (stream, seq, first, end)) WITHOUT ROWID;
-- Spool files the collector could not ingest (set aside in rejected/): counted in their run's account.
CREATE TABLE IF NOT EXISTS rejected_files (
    run_id TEXT NOT NULL, stream TEXT NOT NULL, file TEXT NOT NULL, reason TEXT NOT NULL,
    records INTEGER, at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS rejected_files_run ON rejected_files(run_id);
CREATE TABLE IF NOT EXISTS loaders (
    run_id TEXT NOT NULL, stream TEXT NOT NULL, rank INTEGER NOT NULL, name TEXT NOT NULL,
    kind TEXT, config TEXT, totals TEXT NOT NULL, totals_seq INTEGER NOT NULL,
    stats TEXT, PRIMARY KEY (run_id, stream, name));
CREATE TABLE IF NOT EXISTS steps (
    run_id TEXT NOT NULL, rank INTEGER NOT NULL, loader TEXT NOT NULL, epoch INTEGER NOT NULL,
    step INTEGER NOT NULL, start_ns INTEGER NOT NULL, wait_ns INTEGER NOT NULL,
    compute_ns INTEGER NOT NULL, other_ns INTEGER NOT NULL, batch_size INTEGER, gpu_idle_ns INTEGER);
-- No index on steps (it would cost a third of ingest): each batch's rows are contiguous, so a
-- run's rows are found through its blocks of rowids.
CREATE TABLE IF NOT EXISTS step_blocks (
    run_id TEXT NOT NULL, first_rowid INTEGER NOT NULL, last_rowid INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS step_blocks_run ON step_blocks(run_id, first_rowid);
CREATE TABLE IF NOT EXISTS rollups (
    run_id TEXT NOT NULL, rank INTEGER NOT NULL, loader TEXT NOT NULL, second INTEGER NOT NULL,
    steps INTEGER NOT NULL, wait_ns INTEGER NOT NULL, compute_ns INTEGER NOT NULL,
    other_ns INTEGER NOT NULL, samples INTEGER NOT NULL, gpu_idle_ns INTEGER NOT NULL,
    gpu_steps INTEGER NOT NULL, wait_max_ns INTEGER NOT NULL, epoch_min INTEGER NOT NULL,
    epoch_max INTEGER NOT NULL, PRIMARY KEY (run_id, loader, rank, second)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS phases (
    run_id TEXT NOT NULL, rank INTEGER NOT NULL, loader TEXT NOT NULL, epoch INTEGER NOT NULL,
    step INTEGER NOT NULL, name TEXT NOT NULL, ns INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS phases_run ON phases(run_id);
CREATE TABLE IF NOT EXISTS events (
    run_id TEXT NOT NULL, rank INTEGER NOT NULL, kind TEXT NOT NULL, t_ns INTEGER NOT NULL,
    data TEXT NOT NULL, span_s INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS events_run ON events(run_id, kind, t_ns);
-- `starvewatch tune` results stored with a run (JSON documents, starvewatch.tuning/1).
CREATE TABLE IF NOT EXISTS tunings (run_id TEXT NOT NULL, created_at REAL NOT NULL, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS tunings_run ON tunings(run_id, created_at);
-- Project tokens (access_tokens.py): the token's SHA-256 digest, never the token.
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY, digest TEXT NOT NULL UNIQUE, role TEXT NOT NULL, projects TEXT NOT NULL,
    created_at REAL NOT NULL, revoked_at REAL);
"""


def migrate_tables(w: sqlite3.Connection) -> None:
    """Databases written by earlier versions: additive columns, and `seen` by record range
    (a batch stored before version 2 covers all its records)."""
    columns = {row[1] for row in w.execute("PRAGMA table_info(streams)")}
    if "delivery" not in columns:
        w.execute("ALTER TABLE streams ADD COLUMN delivery TEXT")
    if "project" not in {row[1] for row in w.execute("PRAGMA table_info(runs)")}:
        w.execute("ALTER TABLE runs ADD COLUMN project TEXT")  # version 6: NULL, no project
    if "first" not in {row[1] for row in w.execute("PRAGMA table_info(seen)")}:
        w.executescript(f"""
            BEGIN IMMEDIATE;
            CREATE TABLE seen_ranges (stream TEXT NOT NULL, seq INTEGER NOT NULL, first INTEGER NOT NULL,
                end INTEGER NOT NULL, PRIMARY KEY (stream, seq, first, end)) WITHOUT ROWID;
            INSERT INTO seen_ranges SELECT stream, seq, 0, {WHOLE_BATCH_END} FROM seen;
            DROP TABLE seen;
            ALTER TABLE seen_ranges RENAME TO seen;
            COMMIT;""")
    sample_rollups.migrate(w)
