"""SQLite store (WAL): runs, process streams, step records, per-second rollups, statistics.

Writes go through one connection under a lock; reads use a connection per thread, which WAL
lets run beside the writer. Per-second rollups and per-loader histograms are kept as data
arrives, so summaries and long-range views never scan every step row.
"""
from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections import defaultdict
from pathlib import Path

import orjson

from ..batch_parts import uncovered
from ..private_files import FILE_MODE, make_private_dirs
from ..stats import LoaderTotals, RecordStats
from . import database_file, retention, rollup_bands, run_rollups, sample_rollups

# 2: `seen` keeps record ranges [first, end) of each batch (batch_parts.py), not only (stream, seq);
#    `rejected_files` counts the spool files that could not be ingested.
# 3: `run_rollups`, the per-rank rollups summed over ranks (run_rollups.py), filled at open.
# 4: `events.span_s` (0: a raw sample; else the tier of a bucket of folded samples) and
#    `rolled_samples` (sample_rollups.py): samples follow the storage budget's tiers.
# 5: `rollups` keep their steps' least wait and least and greatest compute (rollup_bands.py),
#    the chart's min-max bands.
SCHEMA_VERSION = 5
WHOLE_BATCH_END = 2**62  # a batch stored before version 2: every record of it
# SQLite's memory, bounded whatever the number of threads (monitor/memory.py for the rest): each
# thread that reads has its own connection and page cache, and anyio's pool has up to 40.
WRITER_CACHE_KIB = 2000       # SQLite's default, said explicitly: ingest's indexes stay cached
READER_CACHE_KIB = 1024       # a reader's page cache; the OS page cache is behind it
SQLITE_SOFT_HEAP_BYTES = 48 * 2**20  # process-wide: past it, page caches recycle pages, not grow

DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, meta TEXT NOT NULL DEFAULT '{}',
    started_at REAL, ended_at REAL, first_seen REAL NOT NULL, last_seen REAL NOT NULL);
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
"""


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
        self._migrate(self._writer)
        self._writer.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        self._writer.commit()
        database_file.migrate(self._writer, self.path, vacuum=vacuum)
        rollup_bands.migrate(self._writer)
        run_rollups.migrate(self._writer)

    @staticmethod
    def _migrate(w: sqlite3.Connection) -> None:
        """Databases written by earlier versions: additive columns, and `seen` by record range
        (a batch stored before version 2 covers all its records)."""
        columns = {row[1] for row in w.execute("PRAGMA table_info(streams)")}
        if "delivery" not in columns:
            w.execute("ALTER TABLE streams ADD COLUMN delivery TEXT")
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
    def ingest(self, batch) -> bool:
        """Store one validated EventBatch; False when it was already stored (a replay)."""
        now = time.time()
        first, end = batch.record_range()
        with self._write_lock:
            w = self._writer
            w.execute("BEGIN IMMEDIATE")
            try:
                stored = w.execute("SELECT first, end FROM seen WHERE stream = ? AND seq = ?",
                                   (batch.stream, batch.seq)).fetchall()
                todo = uncovered(first, end, stored) if end > first else ([] if stored else [(first, end)])
                if not todo:  # a replay: every record of it is stored already
                    w.execute("ROLLBACK")
                    return False
                w.execute("INSERT OR IGNORE INTO seen VALUES (?, ?, ?, ?)", (batch.stream, batch.seq, first, end))
                if todo != [(first, end)]:  # split differently before: only the records not stored yet
                    batch = only_records(batch, first, todo)
                steps = batch.steps
                self._upsert_run(w, batch, now)
                # A replayed batch carries an older account: the highest sequence number wins.
                delivery = None if batch.delivery is None else orjson.dumps(
                    {"seq": batch.seq, **batch.delivery.model_dump()}).decode()
                w.execute(
                    "INSERT INTO streams (stream, run_id, rank, last_seq, last_seen, finished, drops, delivery) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(stream) DO UPDATE SET "
                    "last_seq = max(last_seq, excluded.last_seq), last_seen = excluded.last_seen, "
                    "finished = max(finished, excluded.finished), drops = CASE WHEN excluded.last_seq >= "
                    "last_seq THEN excluded.drops ELSE drops END, "
                    "delivery = CASE WHEN excluded.delivery IS NOT NULL AND (delivery IS NULL OR "
                    "json_extract(excluded.delivery, '$.seq') >= json_extract(delivery, '$.seq')) "
                    "THEN excluded.delivery ELSE delivery END",
                    (batch.stream, batch.run_id, batch.rank, batch.seq, now,
                     1 if batch.status == "finished" else 0, orjson.dumps(batch.drops).decode(), delivery))
                if len(steps):
                    self._insert_steps(w, batch)
                for loader in batch.loaders:
                    self._upsert_loader(w, batch, loader)
                if batch.phases:
                    w.executemany("INSERT INTO phases VALUES (?, ?, ?, ?, ?, ?, ?)",
                                  [(batch.run_id, batch.rank, *p) for p in batch.phases])
                events = [(kind, e.model_dump(exclude_unset=True)) for kind in ("samples", "workers", "stalls")
                          for e in getattr(batch, kind)]
                if events:
                    w.executemany("INSERT INTO events (run_id, rank, kind, t_ns, data) VALUES (?, ?, ?, ?, ?)",
                                  [(batch.run_id, batch.rank, kind, int(e.get("t_ns") or time.time_ns()),
                                    orjson.dumps(e).decode()) for kind, e in events])
                w.execute("COMMIT")
            except BaseException as exc:
                w.execute("ROLLBACK")
                self._stats_cache.clear()  # may hold this batch's records: reload from disk
                if isinstance(exc, orjson.JSONEncodeError):  # an integer past 64 bits in a free-form field
                    raise ValueError(f"batch cannot be stored: {exc}") from None
                raise
            self.retention.after_write()
        self.ingested_records += len(batch.steps)
        self.versions[batch.run_id] += 1
        self.version += 1
        return True

    def _upsert_run(self, w, batch, now: float) -> None:
        meta = batch.run.model_dump() if batch.run is not None else None
        row = w.execute("SELECT meta FROM runs WHERE id = ?", (batch.run_id,)).fetchone()
        if row is None:
            base = meta or {"id": batch.run_id, "name": batch.run_id}
            if meta is not None and meta.get("host"):
                base["rank_hosts"] = {str(meta.get("rank", 0)): meta["host"]}
            w.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?)",
                      (batch.run_id, base.get("name") or batch.run_id, orjson.dumps(base).decode(),
                       base.get("started_at"), base.get("ended_at"), now, now))
            return
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

    def _insert_steps(self, w, batch) -> None:
        import numpy as np

        s = batch.steps
        n = len(s)
        rid, rank = batch.run_id, batch.rank
        rows = zip([rid] * n, [rank] * n, s.loader, s.epoch, s.step, s.start_ns, s.wait_ns,
                   s.compute_ns, s.other_ns, s.batch_size, s.gpu_idle_ns)
        first = (w.execute("SELECT max(rowid) FROM steps").fetchone()[0] or 0) + 1
        w.executemany("INSERT INTO steps VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        w.execute("INSERT INTO step_blocks VALUES (?, ?, ?)", (rid, first, first + n - 1))
        # Per-second rollups and per-loader statistics, kept as the data arrives (numpy: a
        # 20,000-record batch costs a few milliseconds here).
        names = list(s.loader)
        groups = {names[0]: None} if names.count(names[0]) == n else None
        if groups is None:
            groups = {}
            for i, name in enumerate(names):
                groups.setdefault(name, []).append(i)
        start = np.asarray(s.start_ns, dtype=np.int64)
        wait = np.asarray(s.wait_ns, dtype=np.int64)
        compute = np.asarray(s.compute_ns, dtype=np.int64)
        other = np.asarray(s.other_ns, dtype=np.int64)
        epoch = np.asarray(s.epoch, dtype=np.int64)
        size = np.asarray([b or 0 for b in s.batch_size], dtype=np.int64)
        gpu_known = np.asarray([g is not None for g in s.gpu_idle_ns], dtype=bool)
        gpu = np.asarray([g or 0 for g in s.gpu_idle_ns], dtype=np.int64)
        for name, idx in groups.items():
            pick = (lambda col: col) if idx is None else (lambda col: [col[i] for i in idx])
            sel = slice(None) if idx is None else np.asarray(idx)
            stats = self._stats(w, rid, batch.stream, name)
            stats.add_columns(pick(s.step), pick(s.wait_ns), pick(s.compute_ns), pick(s.gpu_idle_ns),
                              vectorized=True)
            seconds, inverse = np.unique(start[sel] // 1_000_000_000, return_inverse=True)
            k = len(seconds)

            def total(values):
                return np.bincount(inverse, weights=values, minlength=k).astype(np.int64)

            wait_max = np.zeros(k, dtype=np.int64)
            np.maximum.at(wait_max, inverse, wait[sel])
            wait_min = np.full(k, np.iinfo(np.int64).max)
            np.minimum.at(wait_min, inverse, wait[sel])
            compute_min = np.full(k, np.iinfo(np.int64).max)
            np.minimum.at(compute_min, inverse, compute[sel])
            compute_max = np.zeros(k, dtype=np.int64)
            np.maximum.at(compute_max, inverse, compute[sel])
            e_min = np.full(k, np.iinfo(np.int64).max)
            np.minimum.at(e_min, inverse, epoch[sel])
            e_max = np.zeros(k, dtype=np.int64)
            np.maximum.at(e_max, inverse, epoch[sel])
            # bincount's float weights are exact below 2**53 ns (104 days) per second bucket.
            columns = (seconds, np.bincount(inverse, minlength=k), total(wait[sel]), total(compute[sel]),
                       total(other[sel]), total(size[sel]), total(gpu[sel]),
                       np.bincount(inverse, weights=gpu_known[sel], minlength=k).astype(np.int64),
                       wait_max, e_min, e_max)
            bands = rollup_bands.stored(*(c.tolist() for c in (columns[1], wait_min, compute_min, compute_max)))
            w.executemany(
                "INSERT INTO rollups (run_id, rank, loader, second, steps, wait_ns, compute_ns, other_ns, samples, "
                "gpu_idle_ns, gpu_steps, wait_max_ns, epoch_min, epoch_max, wait_min_ns, compute_min_ns, "
                "compute_max_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(run_id, loader, rank, second) DO UPDATE SET steps = steps + excluded.steps, "
                "wait_ns = wait_ns + excluded.wait_ns, compute_ns = compute_ns + excluded.compute_ns, "
                "other_ns = other_ns + excluded.other_ns, samples = samples + excluded.samples, "
                "gpu_idle_ns = gpu_idle_ns + excluded.gpu_idle_ns, gpu_steps = gpu_steps + excluded.gpu_steps, "
                "wait_max_ns = max(wait_max_ns, excluded.wait_max_ns), "
                "epoch_min = min(epoch_min, excluded.epoch_min), epoch_max = max(epoch_max, excluded.epoch_max), "
                + rollup_bands.MERGE,
                [(rid, batch.rank, name, *row, *band)
                 for row, band in zip(zip(*(c.tolist() for c in columns)), bands)])
            # The same rows added into the rank-summed rollups (one rank per batch).
            ranks = run_rollups.rank_bit(batch.rank)
            w.executemany(
                f"INSERT INTO run_rollups ({run_rollups.COLUMNS}) "
                "VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) " + run_rollups.MERGE,
                [(rid, name, *row, ranks) for row in zip(*(c.tolist() for c in columns))])
            self._save_stats(w, rid, batch.stream, batch.rank, name, stats)

    def note_rejected_file(self, run_id: str, stream: str, file: str, reason: str, records: int | None) -> None:
        """A spool file that could not be ingested: counted in its run's account (a run row is
        made for it when none exists, so the loss is shown)."""
        now = time.time()
        with self._write_lock:
            w = self._writer
            w.execute("BEGIN IMMEDIATE")
            try:
                w.execute("INSERT OR IGNORE INTO runs (id, name, meta, first_seen, last_seen) VALUES (?, ?, ?, ?, ?)",
                          (run_id, run_id, orjson.dumps({"id": run_id, "name": run_id}).decode(), now, now))
                w.execute("INSERT INTO rejected_files VALUES (?, ?, ?, ?, ?, ?)",
                          (run_id, stream, file, reason[:500], records, now))
                w.execute("COMMIT")
            except BaseException:
                w.execute("ROLLBACK")
                raise
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
        return self.reader().execute("SELECT * FROM runs ORDER BY coalesce(started_at, first_seen) DESC").fetchall()

    def run_row(self, run_id: str):
        return self.reader().execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()

    def stream_rows(self, run_id: str) -> list[sqlite3.Row]:
        return self.reader().execute("SELECT * FROM streams WHERE run_id = ? ORDER BY rank, stream",
                                     (run_id,)).fetchall()

    def loader_rows(self, run_id: str) -> list[sqlite3.Row]:
        return self.reader().execute("SELECT * FROM loaders WHERE run_id = ? ORDER BY rowid",
                                     (run_id,)).fetchall()

    def loader_data(self, run_id: str, rank: int | None = None):
        """Per-loader exact totals and statistics, merged over the run's streams (ranks)."""
        from .analysis import LoaderData
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
            w.execute("INSERT INTO tunings VALUES (?, ?, ?)", (run_id, time.time(), orjson.dumps(document).decode()))
            self.versions[run_id] += 1
            self.version += 1
        return True

    def latest_tuning(self, run_id: str) -> dict | None:
        row = self.reader().execute("SELECT data FROM tunings WHERE run_id = ? ORDER BY created_at DESC, "
                                    "rowid DESC LIMIT 1", (run_id,)).fetchone()
        return orjson.loads(row[0]) if row else None

    def delete_run(self, run_id: str) -> bool:
        with self._write_lock:
            w = self._writer
            w.execute("BEGIN IMMEDIATE")
            try:
                found = w.execute("DELETE FROM runs WHERE id = ?", (run_id,)).rowcount > 0
                for first, last in w.execute("SELECT first_rowid, last_rowid FROM step_blocks WHERE run_id = ?",
                                             (run_id,)).fetchall():
                    w.execute("DELETE FROM steps WHERE rowid BETWEEN ? AND ?", (first, last))
                for table in ("step_blocks", "rollups", "run_rollups", "phases", "events", "loaders", "streams", "tunings",
                              "rejected_files", "rolled_spans", "step_exemplars", "rolled_samples"):
                    w.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
                # `seen` stays: a late replay of a deleted run's batch must not resurrect it.
                w.execute("COMMIT")
            except BaseException:
                w.execute("ROLLBACK")
                raise
            for key in [k for k in self._stats_cache if k[0] == run_id]:
                del self._stats_cache[key]
            # Forgotten, not bumped: `deletions` already voids every cached answer, and a collector
            # whose budget deletes old runs for months must not keep a counter for each of them.
            self.versions.pop(run_id, None)
            self.version += 1
            self.deletions += 1
        return found


def only_records(batch, first: int, ranges: list[tuple[int, int]]):
    """The batch (a part [first, ...) of its sequence, batch_parts.py) keeping only the records
    in `ranges`, and the phases of the step records kept."""
    keep = lambda i: any(a <= i < b for a, b in ranges)  # noqa: E731 - few ranges
    update = {}
    offset = first
    for kind in ("steps", "samples", "workers", "stalls"):
        if kind == "steps":
            n = len(batch.steps)
            mask = [keep(offset + i) for i in range(n)]
            columns = {name: [v for v, m in zip(getattr(batch.steps, name), mask) if m]
                       for name in type(batch.steps).model_fields}
            update["steps"] = batch.steps.model_copy(update=columns)
            kept = set(zip(columns["loader"], columns["epoch"], columns["step"]))
            update["phases"] = [p for p in batch.phases if tuple(p[:3]) in kept]
        else:
            items = getattr(batch, kind)
            n = len(items)
            update[kind] = [item for i, item in enumerate(items) if keep(offset + i)]
        offset += n
    return batch.model_copy(update=update)
