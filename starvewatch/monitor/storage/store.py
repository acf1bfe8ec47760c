"""SQLite store (WAL): runs, process streams, step records, per-second rollups, statistics.

Writes go through one connection under a lock; reads use a connection per thread, which WAL
lets run beside the writer. Per-second rollups and per-loader histograms are kept as data
arrives, so summaries and long-range views never scan every step row.

This module is the store's connections, its ingest transaction and its reads; the tables and
their migration are in store_schema.py, the writing of a batch's steps (rows, rollups,
statistics) in step_ingest.py, a batch's claim in `seen` and its `streams` row (shared with the
PostgreSQL store) in stream_writes.py, the part of a replayed batch not stored yet in batch_records.py.
"""
from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import orjson

from ...private_files import FILE_MODE, make_private_dirs
from ...stats import LoaderTotals, RecordStats
from . import database_file
from ..budget import retention, rollup_bands, run_rollups
from .batch_records import event_rows
from .project_scope import check_run_project, filter_rows, visible
from .run_bounds import check_tuning
from .step_ingest import insert_steps
from .stream_writes import claim_records, upsert_stream
from .store_schema import DDL, SCHEMA_VERSION, migrate_tables
from .write_transaction import immediate_transaction

# SQLite's memory, bounded whatever the number of threads (monitor/web/resident_memory.py for the rest): each
# thread that reads has its own connection and page cache, and anyio's pool has up to 40.
WRITER_CACHE_KIB = 2000       # SQLite's default, said explicitly: ingest's indexes stay cached
READER_CACHE_KIB = 1024       # a reader's page cache; the OS page cache is behind it
SQLITE_SOFT_HEAP_BYTES = 48 * 2**20  # process-wide: past it, page caches recycle pages, not grow


class Store:
    def __init__(self, path: Path | str, max_db_bytes: int = retention.DEFAULT_MAX_DB_BYTES) -> None:
        self.path = Path(path)
        make_private_dirs(self.path.parent)
        # Created owner-only before SQLite opens it: SQLite gives the WAL and shm files the
        # database's own mode.
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, FILE_MODE))
        # Reentrant: the storage budget deletes runs (delete_run) from inside an ingest.
        self._write_lock = threading.RLock()
        database_file.prepare_new_file(self.path)
        self._writer = self._connect(WRITER_CACHE_KIB)
        self._writer.execute(f"PRAGMA soft_heap_limit={SQLITE_SOFT_HEAP_BYTES}")
        self.migrate_schema()
        self._local = threading.local()
        self._stats_cache: dict[tuple[str, str, str], RecordStats] = {}
        self.ingested_records = 0
        # Bumped on every change: lets readers cache answers until the data moves.
        self.versions: dict[str, int] = defaultdict(int)
        self.version = 0
        self.deletions = 0  # a deletion is never answered from a stale cache
        self.retention = retention.Retention(self, max_db_bytes)

    def migrate_schema(self, vacuum: bool = True) -> None:
        """Bring the file to this version's schema (at open; and for a copy of an older database
        restored into this store: sources.LocalSource.offline, vacuum=False)."""
        self._writer.executescript(DDL)
        migrate_tables(self._writer)
        self._writer.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        self._writer.commit()
        database_file.migrate(self._writer, self.path, vacuum=vacuum)
        rollup_bands.migrate(self._writer)
        run_rollups.migrate(self._writer)

    def _connect(self, cache_kib: int) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, timeout=30, isolation_level=None)
        conn.execute(f"PRAGMA cache_size=-{cache_kib}")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=30000")
        run_rollups.register(conn)
        return conn

    def reader(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect(READER_CACHE_KIB)
            conn.row_factory = sqlite3.Row
        return conn

    def close(self) -> None:
        with self._write_lock:
            self._writer.close()

    # ---- ingest ------------------------------------------------------------------------------
    def ingest(self, batch, projects=None) -> bool:
        """Store one validated EventBatch; False when it was already stored (a replay).
        `projects`: those of the project token that sent it (project_scope.check_run_project;
        a new run becomes the first one's); None: any run (the collector's own tokens)."""
        now = time.time()
        first, end = batch.record_range()
        with self._write_lock:
            w = self._writer
            w.execute("BEGIN IMMEDIATE")
            try:
                claimed = claim_records(w, w.execute, "sqlite", batch, first, end, projects)
                if claimed is None:  # a replay: every record of it is stored already
                    w.execute("ROLLBACK")
                    return False
                batch, stored = claimed
                steps = batch.steps
                self._upsert_run(w, batch, now, projects)
                upsert_stream(w.execute, "sqlite", batch, now)
                if len(steps):
                    insert_steps(w, batch, self._stats, self._save_stats)
                for loader in batch.loaders:
                    self._upsert_loader(w, batch, loader)
                if batch.phases:
                    w.executemany("INSERT INTO phases VALUES (?, ?, ?, ?, ?, ?, ?)",
                                  [(batch.run_id, batch.rank, *p) for p in batch.phases])
                events = event_rows(batch, first, stored)
                if events:
                    w.executemany("INSERT INTO events (run_id, rank, kind, t_ns, data) VALUES (?, ?, ?, ?, ?)",
                                  [(batch.run_id, batch.rank, kind, int(e.get("t_ns") or time.time_ns()),
                                    orjson.dumps(e).decode()) for kind, e in events])
                w.execute("COMMIT")
            except BaseException as exc:
                # The cache first: it may hold this batch's records (reloaded from disk next
                # time). A failed COMMIT (a full disk) has rolled back already, and the ROLLBACK
                # below then raises: the cache must be cleared whatever it does, or a resent
                # batch would count twice for good.
                self._stats_cache.clear()
                try:
                    w.execute("ROLLBACK")
                except sqlite3.OperationalError:
                    pass  # no transaction left: SQLite rolled it back itself
                if isinstance(exc, orjson.JSONEncodeError):  # an integer past 64 bits in a free-form field
                    raise ValueError(f"batch cannot be stored: {exc}") from None
                raise
            self.retention.after_write()
        self.ingested_records += len(batch.steps)
        self.versions[batch.run_id] += 1
        self.version += 1
        return True

    def _upsert_run(self, w, batch, now: float, projects=None) -> None:
        meta = batch.run.stored() if batch.run is not None else None
        row = w.execute("SELECT meta, project FROM runs WHERE id = ?", (batch.run_id,)).fetchone()
        if row is None:
            base = meta or {"id": batch.run_id, "name": batch.run_id}
            if meta is not None and meta.get("host"):
                base["rank_hosts"] = {str(meta.get("rank", 0)): meta["host"]}
            w.execute("INSERT INTO runs (id, name, meta, started_at, ended_at, first_seen, last_seen, project) "
                      "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                      (batch.run_id, base.get("name") or batch.run_id, orjson.dumps(base).decode(),
                       base.get("started_at"), base.get("ended_at"), now, now, projects[0] if projects else None))
            return
        if projects is not None and row[1] not in projects:
            # Made meanwhile by another collector for another project (PostgreSQL: checked again
            # under the run's lock, where this row is written).
            check_run_project(w, batch.run_id, projects)
        stored = orjson.loads(row[0])
        # Every rank's hostname, so the diagnosis divides a host's cores by the ranks on it.
        hosts = dict(stored.get("rank_hosts") or {})
        if meta is not None and meta.get("host"):
            hosts[str(meta.get("rank", 0))] = meta["host"]
        if meta is not None and (meta.get("rank", 0) == 0 or stored.get("rank") != 0):
            # Rank 0 speaks for the run; other ranks' metadata is kept on their streams.
            meta["rank_hosts"] = hosts
            w.execute("UPDATE runs SET name = ?, meta = ?, started_at = coalesce(min(started_at, ?), ?), "
                      "ended_at = ?, last_seen = ? WHERE id = ?",
                      (meta["name"], orjson.dumps(meta).decode(), meta.get("started_at"),
                       meta.get("started_at"), meta.get("ended_at"), now, batch.run_id))
        elif hosts != (stored.get("rank_hosts") or {}):
            stored["rank_hosts"] = hosts
            w.execute("UPDATE runs SET meta = ?, last_seen = ? WHERE id = ?",
                      (orjson.dumps(stored).decode(), now, batch.run_id))
        else:
            w.execute("UPDATE runs SET last_seen = ? WHERE id = ?", (now, batch.run_id))

    def note_rejected_file(self, run_id: str, stream: str, file: str, reason: str, records: int | None) -> None:
        """A spool file that could not be ingested: counted in its run's account (a run row is
        made for it when none exists, so the loss is shown)."""
        now = time.time()
        with self._write_lock:
            w = self._writer
            with immediate_transaction(w):
                w.execute("INSERT OR IGNORE INTO runs (id, name, meta, first_seen, last_seen) VALUES (?, ?, ?, ?, ?)",
                          (run_id, run_id, orjson.dumps({"id": run_id, "name": run_id}).decode(), now, now))
                w.execute("INSERT INTO rejected_files VALUES (?, ?, ?, ?, ?, ?)",
                          (run_id, stream, file, reason[:500], records, now))
            self.versions[run_id] += 1
            self.version += 1

    def rejected_files(self, run_id: str) -> list[dict]:
        rows = self.reader().execute("SELECT stream, file, reason, records FROM rejected_files WHERE run_id = ? "
                                     "ORDER BY rowid", (run_id,)).fetchall()
        return [{"stream": r[0], "file": r[1], "reason": r[2], "records": r[3]} for r in rows]

    def step_range(self, run_id: str) -> tuple[int, int] | None:
        """The rowids between which a run's step rows lie (interleaved with other runs')."""
        # Blocks of a run never overlap: the last one by first_rowid ends last (an index lookup,
        # where max(last_rowid) would read every block of a long run).
        db = self.reader()
        first = db.execute("SELECT first_rowid FROM step_blocks WHERE run_id = ? ORDER BY first_rowid LIMIT 1",
                           (run_id,)).fetchone()
        if first is None:
            return None
        last = db.execute("SELECT last_rowid FROM step_blocks WHERE run_id = ? ORDER BY first_rowid DESC LIMIT 1",
                          (run_id,)).fetchone()
        return first[0], last[0]

    STEP_ROW_COLUMNS = ("rank", "loader", "epoch", "step", "start_ns", "wait_ns", "compute_ns", "other_ns",
                        "batch_size", "gpu_idle_ns")

    def step_rows(self, run_id: str, batch: int = 5000):
        """Every step row of a run (tuples of STEP_ROW_COLUMNS) in rowid order, `batch` at a time,
        from one query on a connection of its own: a streamed export resumes on whichever
        thread is free, and memory holds one batch, not the run."""
        span = self.step_range(run_id)
        if span is None:
            return
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
        try:
            cursor = conn.execute(f"SELECT {', '.join(self.STEP_ROW_COLUMNS)} FROM steps "
                                  "WHERE rowid BETWEEN ? AND ? AND run_id = ? ORDER BY rowid", (*span, run_id))
            while rows := cursor.fetchmany(batch):
                yield rows
        finally:
            conn.close()

    def _stats(self, w, run_id: str, stream: str, loader: str) -> RecordStats:
        key = (run_id, stream, loader)
        stats = self._stats_cache.get(key)
        if stats is None:
            row = w.execute("SELECT stats FROM loaders WHERE run_id = ? AND stream = ? AND name = ?",
                            key).fetchone()
            stats = RecordStats.from_dict(orjson.loads(row[0])) if row and row[0] else RecordStats()
            if len(self._stats_cache) > 1000:
                self._stats_cache.clear()
            self._stats_cache[key] = stats
        return stats

    def _save_stats(self, w, run_id, stream, rank, loader, stats: RecordStats) -> None:
        w.execute("INSERT INTO loaders (run_id, stream, rank, name, totals, totals_seq, stats) "
                  "VALUES (?, ?, ?, ?, '{}', 0, ?) ON CONFLICT(run_id, stream, name) DO UPDATE SET "
                  "stats = excluded.stats", (run_id, stream, rank, loader, orjson.dumps(stats.to_dict()).decode()))

    def _upsert_loader(self, w, batch, loader) -> None:
        # Totals are cumulative snapshots: the one with the highest sequence number wins.
        w.execute(
            "INSERT INTO loaders (run_id, stream, rank, name, kind, config, totals, totals_seq) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(run_id, stream, name) DO UPDATE SET "
            "kind = excluded.kind, config = excluded.config, "
            "totals = CASE WHEN excluded.totals_seq > totals_seq THEN excluded.totals ELSE totals END, "
            "totals_seq = max(totals_seq, excluded.totals_seq)",
            (batch.run_id, batch.stream, batch.rank, loader.name, loader.kind,
             orjson.dumps(loader.config.model_dump(exclude_unset=True)).decode()
             if loader.config is not None else None,
             loader.totals.model_dump_json(), batch.seq))

    # ---- reads -------------------------------------------------------------------------------
    def run_rows(self) -> list[sqlite3.Row]:
        """Every run the current caller may see (project_scope.py), newest first."""
        return filter_rows(self.reader().execute("SELECT * FROM runs ORDER BY coalesce(started_at, first_seen) "
                                                 "DESC").fetchall())

    def run_row(self, run_id: str):
        """The run's row, or None when unknown or not visible to the current caller (project_scope.py)."""
        row = self.reader().execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        return row if row is not None and visible(row["project"]) else None

    def stream_rows(self, run_id: str) -> list[sqlite3.Row]:
        return self.reader().execute("SELECT * FROM streams WHERE run_id = ? ORDER BY rank, stream",
                                     (run_id,)).fetchall()

    def loader_rows(self, run_id: str) -> list[sqlite3.Row]:
        return self.reader().execute("SELECT * FROM loaders WHERE run_id = ? ORDER BY rowid",
                                     (run_id,)).fetchall()

    def loader_data(self, run_id: str, rank: int | None = None):
        """Per-loader exact totals and statistics, merged over the run's streams (ranks)."""
        from ...analysis.summary import LoaderData
        merged: dict[str, LoaderData] = {}
        for row in self.loader_rows(run_id):
            if rank is not None and row["rank"] != rank:
                continue
            totals = LoaderTotals.from_dict(orjson.loads(row["totals"]))
            stats = RecordStats.from_dict(orjson.loads(row["stats"])) if row["stats"] else RecordStats()
            data = merged.get(row["name"])
            if data is None:
                merged[row["name"]] = LoaderData(
                    name=row["name"], config=orjson.loads(row["config"]) if row["config"] else None,
                    totals=totals, records=stats, ranks=[row["rank"]])
            else:
                epochs = max(data.totals.epochs, totals.epochs)  # ranks run the same epochs
                data.totals.merge(totals)
                data.totals.epochs = epochs
                data.records.merge(stats)
                if row["rank"] not in data.ranks:
                    data.ranks.append(row["rank"])
        return list(merged.values())

    def save_tuning(self, run_id: str, document: dict) -> bool:
        """Store `starvewatch tune` results with a run; False when the run is unknown."""
        with self._write_lock:
            w = self._writer
            if w.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
                return False
            check_tuning(w, run_id)
            w.execute("INSERT INTO tunings VALUES (?, ?, ?)", (run_id, time.time(), orjson.dumps(document).decode()))
            self.versions[run_id] += 1
            self.version += 1
            self.retention.after_write()  # tuning results count toward the storage budget too
        return True

    def latest_tuning(self, run_id: str) -> dict | None:
        row = self.reader().execute("SELECT data FROM tunings WHERE run_id = ? ORDER BY created_at DESC, "
                                    "rowid DESC LIMIT 1", (run_id,)).fetchone()
        return orjson.loads(row[0]) if row else None

    @contextmanager
    def once(self, what: str):
        """Work done by one collector at a time (the budget's folds, spool sweeps): True here,
        where this process is the database's one writer; PgStore takes an advisory lock."""
        yield True

    def read_only_connection(self) -> sqlite3.Connection:
        """A connection of its own for a streamed read (folded_reads.export_rows)."""
        return sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)

    def delete_run(self, run_id: str) -> bool:
        with self._write_lock:
            w = self._writer
            with immediate_transaction(w):
                found = w.execute("DELETE FROM runs WHERE id = ?", (run_id,)).rowcount > 0
                for first, last in w.execute("SELECT first_rowid, last_rowid FROM step_blocks WHERE run_id = ?",
                                             (run_id,)).fetchall():
                    w.execute("DELETE FROM steps WHERE rowid BETWEEN ? AND ?", (first, last))
                for table in ("step_blocks", "rollups", "run_rollups", "phases", "events", "loaders", "streams", "tunings",
                              "rejected_files", "rolled_spans", "step_exemplars", "rolled_samples"):
                    w.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
                # `seen` stays: a late replay of a deleted run's batch must not resurrect it.
            for key in [k for k in self._stats_cache if k[0] == run_id]:
                del self._stats_cache[key]
            # Forgotten, not bumped: `deletions` already voids every cached answer, and a collector
            # whose budget deletes old runs for months must not keep a counter for each of them.
            self.versions.pop(run_id, None)
            self.version += 1
            self.deletions += 1
        return found

