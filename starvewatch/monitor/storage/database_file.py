"""The database file as the storage budget sees it: its size on disk (with its -wal and -shm
files), INCREMENTAL auto-vacuum for a new file, and the retention tables' migration.

Its own module because measuring and preparing the file is separate from deciding what to fold:
the store calls prepare_new_file and migrate at open, the budget (retention.py) and the
benchmarks read file_bytes."""
from __future__ import annotations

import logging
import os
import sqlite3
import time

log = logging.getLogger("starvewatch.retention")  # the storage budget's logger, as before the split

VACUUM_ON_MIGRATE_MAX_BYTES = 256 * 2**20  # an older file up to this size is VACUUMed once at open

DDL = """
CREATE TABLE IF NOT EXISTS rolled_spans (
    run_id TEXT NOT NULL, rank INTEGER NOT NULL, until_s INTEGER NOT NULL, steps INTEGER NOT NULL,
    PRIMARY KEY (run_id, rank)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS step_exemplars (
    run_id TEXT NOT NULL, rank INTEGER NOT NULL, loader TEXT NOT NULL, epoch INTEGER NOT NULL,
    step INTEGER NOT NULL, start_ns INTEGER NOT NULL, wait_ns INTEGER NOT NULL,
    compute_ns INTEGER NOT NULL, other_ns INTEGER NOT NULL, batch_size INTEGER, gpu_idle_ns INTEGER,
    reason TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS step_exemplars_run ON step_exemplars(run_id, start_ns);
CREATE TABLE IF NOT EXISTS retention_log (
    t REAL NOT NULL, run_id TEXT, run_name TEXT, action TEXT NOT NULL, detail TEXT NOT NULL);
"""


def prepare_new_file(path) -> None:
    """INCREMENTAL auto-vacuum for a new database: it must be set before any table exists (and
    before WAL mode writes the header), and it lets a fold give its pages back to the disk."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
            conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
            conn.execute("PRAGMA journal_mode=WAL")
    finally:
        conn.close()


def migrate(w, path, vacuum: bool = True) -> None:
    """A separate step after the store's own migration: the retention tables, the tier width of
    a rollup row, and INCREMENTAL auto-vacuum for a file created before it (one VACUUM)."""
    w.executescript(DDL)
    columns = {row[1] for row in w.execute("PRAGMA table_info(rollups)")}
    if "span_s" not in columns:
        w.execute("ALTER TABLE rollups ADD COLUMN span_s INTEGER NOT NULL DEFAULT 1")
    if vacuum and w.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:
        size = os.path.getsize(path)
        if size <= VACUUM_ON_MIGRATE_MAX_BYTES:
            started = time.monotonic()
            w.execute("PRAGMA auto_vacuum=INCREMENTAL")
            w.execute("VACUUM")
            log.info("database %s converted to incremental auto-vacuum in %.1f s", path,
                     time.monotonic() - started)
        else:
            log.warning("database %s (%d MB) predates incremental auto-vacuum: folded rows free pages "
                        "that new data reuses, but the file will not shrink below its size now",
                        path, size // 10**6)


def file_bytes(path) -> int:
    """The database as it lies on disk: the file, its write-ahead log and shared-memory file."""
    total = 0
    for suffix in ("", "-wal", "-shm"):
        try:
            total += os.stat(f"{path}{suffix}").st_size
        except FileNotFoundError:
            pass
    return total
