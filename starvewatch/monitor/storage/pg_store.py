"""The store on PostgreSQL (`serve --database-url postgresql://...`): the same interface as the
SQLite Store (store.py), for any number of collectors on one database.

What differs from SQLite, and why:
- Writes: one transaction per batch on this collector's writer connection; the step rows go in
  by COPY (the batch's rows, with rowids from a reserved block: pg_schema.STEP_ROWID_BLOCK) and
  everything else through the same SQL text as SQLite's (pg_dialect.py translates it).
- Several collectors: a batch takes a transaction-scoped advisory lock on its stream, so a
  batch replayed to two collectors at once is stored once (`seen` decides, as on SQLite); the
  run's row is written last, so two collectors ingesting one run's ranks overlap their COPYs.
  Per-loader statistics are read from the database for each batch, never from this process's
  memory (another collector may have written them since).
- Caches: the query cache keys on `versions` / `version` / `deletions`; each commit NOTIFYs the
  run it changed, and a listener thread bumps them on every collector (LISTEN/NOTIFY), so an
  answer cached here is voided by a batch another collector stored.
- Work done once (the storage budget's folds and deletions, spool sweeps): under a session
  advisory lock (`once`), released when its holder ends or dies; another takes it next time.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from itertools import repeat

import orjson

from ...stats import RecordStats
from . import pg_dialect, pg_schema
from .batch_records import event_rows
from .project_scope import filter_rows
from .step_ingest import ROW_COLUMNS, insert_steps
from .stream_writes import claim_records, upsert_stream
from .store import Store

log = logging.getLogger("starvewatch.store")

CHANNEL = "starvewatch_changes"
LISTED_ROWS_S = 0.5  # how long the streams and loaders read with the runs list answer this thread
INGEST_ATTEMPTS = 3  # a batch ended by a deadlock or a dropped partition is stored again, this many tries in all
COPY_CHUNK_ROWS = 4096  # step rows per COPY buffer


class _IngestConnection(pg_dialect.Connection):
    """The writer during one batch: step_ingest.insert_steps runs unchanged on it, its
    SQLite-specific parts done the PostgreSQL way (the next rowid from a reserved block; the
    rows by COPY, insert_step_rows)."""

    def __init__(self, conn, store: "PgStore") -> None:
        super().__init__(conn)
        self.store = store
        self.block_start = 0
        self._pipeline = None

    # Pipeline mode: statements whose results nobody reads go out together with the next one
    # whose result is read (a fetch syncs), one round trip where there were several; COPY runs
    # outside it (libpq allows no COPY in pipeline mode).
    def pipeline_on(self) -> None:
        if self._pipeline is None:
            self._pipeline = self.raw.pipeline()
            self._pipeline.__enter__()

    def pipeline_off(self, exc: BaseException | None = None) -> None:
        if self._pipeline is not None:
            pipeline, self._pipeline = self._pipeline, None
            if exc is None:
                pipeline.__exit__(None, None, None)
            else:
                pipeline.__exit__(type(exc), exc, exc.__traceback__)

    @contextmanager
    def copy(self, statement: str):
        self.pipeline_off()
        with self.raw.cursor().copy(statement) as copy:
            yield copy
        self.pipeline_on()

    def execute(self, sql: str, params=()):
        if sql == "SELECT max(rowid) FROM steps":
            self.block_start = self.raw.execute("SELECT nextval('step_rowids')").fetchone()[0]
            return _Answer((self.block_start - 1,))
        return super().execute(sql, params)

    def insert_step_rows(self, constants: dict, varying: dict, n: int) -> None:
        """step_ingest's rows (its constant and varying columns), by COPY."""
        rows = zip(*(repeat(constants[name], n) if name in constants else varying[name] for name in ROW_COLUMNS))
        with self.copy(f"COPY steps ({', '.join(ROW_COLUMNS)}, rowid) FROM STDIN") as copy:
            for chunk in copy_text(rows, self.block_start):
                copy.write(chunk)
        self.block_start += n


def _text(value) -> str:
    """One field in COPY's text format: NULL as \\N; text escaped (tab, newline, backslash)."""
    if value is None:
        return "\\N"
    if isinstance(value, str):
        return value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return str(value)


def copy_text(rows, first_rowid: int, chunk_rows: int = COPY_CHUNK_ROWS):
    """The step rows (step_ingest's tuples) as COPY text, each with its rowid, in buffers of
    chunk_rows rows: the server parses one while the next is formatted (write_row per row costs
    more than the server's whole insert)."""
    lines: list[str] = []
    rowid = first_rowid
    names: dict = {}  # run ids and loader names repeat on every row: escaped once each
    null = "\\N"
    for run_id, rank, loader, epoch, step, start_ns, wait_ns, compute_ns, other_ns, size, gpu in rows:
        r = names.get(run_id) or names.setdefault(run_id, _text(run_id))
        name = names.get(loader) or names.setdefault(loader, _text(loader))
        lines.append(f"{r}\t{rank}\t{name}\t{epoch}\t{step}\t{start_ns}\t{wait_ns}\t{compute_ns}\t{other_ns}\t"
                     f"{null if size is None else size}\t{null if gpu is None else gpu}\t{rowid}\n")
        rowid += 1
        if len(lines) == chunk_rows:
            yield "".join(lines).encode()
            lines = []
    if lines:
        yield "".join(lines).encode()


class _Answer:
    def __init__(self, row) -> None:
        self.row = row

    def fetchone(self):
        return self.row


class PgStore(Store):
    """Store on PostgreSQL; `url` is a libpq URL (postgresql://user@host:port/database)."""

    def __init__(self, url: str, max_db_bytes: int | None = None) -> None:
        from ..budget import pg_retention, retention
        self.url = url
        self.path = None  # no file: the budget measures relations (pg_retention.py)
        self._write_lock = threading.RLock()
        self._writer_raw = pg_dialect.connect(url, application_name="starvewatch-writer")
        self._writer = pg_dialect.Connection(self._writer_raw)
        try:
            self.migrate_schema()
        except BaseException:
            self._writer_raw.close()
            raise
        self._local = threading.local()
        self._readers: list = []
        self._readers_lock = threading.Lock()
        self._stats_cache: dict = {}  # unused: statistics are read per batch (another collector writes them too)
        self._partitions: set[str] = set()
        self.ingested_records = 0
        self.versions: dict[str, int] = defaultdict(int)
        self.version = 0
        self.deletions = 0
        self._closed = threading.Event()
        self._listener = threading.Thread(target=self._listen, daemon=True, name="starvewatch-pg-listen")
        self._listener.start()
        self.retention = pg_retention.PgRetention(
            self, retention.DEFAULT_MAX_DB_BYTES if max_db_bytes is None else max_db_bytes)

    def __repr__(self) -> str:
        return f"PgStore({self.describe()})"

    def describe(self) -> str:
        """The URL without its password (for logs and the banner)."""
        from urllib.parse import urlsplit, urlunsplit
        parts = urlsplit(self.url)
        if parts.password:
            netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
            return urlunsplit(parts._replace(netloc=netloc))
        return self.url

    def migrate_schema(self, vacuum: bool = True) -> None:
        pg_schema.migrate(self._writer_raw)

    def reader(self):
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.raw.closed:
            conn = self._local.conn = pg_dialect.Connection(
                pg_dialect.connect(self.url, application_name="starvewatch-reader"))
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    def close(self) -> None:
        self._closed.set()
        with self._write_lock:
            self._writer.close()
        with self._readers_lock:
            for conn in self._readers:
                try:
                    conn.close()
                except Exception:  # noqa: BLE001 - a reader of a thread that is gone
                    pass
        self._listener.join(5)

    # ---- coherence between collectors ----------------------------------------------------------
    def _listen(self) -> None:
        """Bump the data versions for every change any collector commits (LISTEN/NOTIFY)."""
        while not self._closed.is_set():
            try:
                conn = pg_dialect.connect(self.url, application_name="starvewatch-listen")
            except Exception as exc:  # noqa: BLE001 - the database restarting: try again
                log.warning("LISTEN connection failed (%s); the query cache keeps its 5 s bound", exc)
                self._closed.wait(1.0)
                continue
            try:
                conn.execute(f"LISTEN {CHANNEL}")
                while not self._closed.is_set():
                    for note in conn.notifies(timeout=0.5):
                        self._changed(note.payload)
            except Exception as exc:  # noqa: BLE001
                if not self._closed.is_set():
                    log.warning("LISTEN connection lost (%s); reconnecting", exc)
                    # Whatever changed meanwhile is unknown: void every cached answer.
                    self.deletions += 1
            finally:
                conn.close()

    def _changed(self, payload: str) -> None:
        kind, _, run_id = payload.partition(":")
        if kind == "delete":
            self.versions.pop(run_id, None)
            self.deletions += 1
        else:
            self.versions[run_id] += 1
        self.version += 1

    @contextmanager
    def once(self, what: str):
        """Yields True in the one collector holding `what`'s lock (others get False and skip the
        work); the lock is the session's, so a collector that dies holding it lets it go."""
        conn = self._writer_raw
        with self._write_lock:
            got = conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 7))", (what,)).fetchone()[0]
        try:
            yield got
        finally:
            if got:
                with self._write_lock:
                    conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 7))", (what,))

    # ---- ingest --------------------------------------------------------------------------------
    def _ensure_partitions(self, run_id: str, start_ns) -> None:
        """The run's steps partition and the hour partitions of this batch's steps (at most
        MAX_HOURS_PER_BATCH; a batch's other hours land in the run's DEFAULT partition). DDL in
        its own short transactions, before the batch's: it locks the parent table a moment."""
        from psycopg import errors, sql
        names = self._partitions
        run_part = pg_schema.partition_name(run_id)
        raw = self._writer_raw
        if run_part not in names:
            try:
                raw.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} PARTITION OF steps FOR VALUES IN ({}) "
                                    "PARTITION BY RANGE (start_ns)").format(sql.Identifier(run_part),
                                                                            sql.Literal(run_id)))
                raw.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} PARTITION OF {} DEFAULT").format(
                    sql.Identifier(pg_schema.default_partition_name(run_id)), sql.Identifier(run_part)))
            except (errors.DuplicateTable, errors.UniqueViolation):
                pass  # another collector made it at the same moment
            names.add(run_part)
        width = pg_schema.STEP_PARTITION_NS
        hours = sorted({int(t) // width for t in (min(start_ns), max(start_ns))})
        if len(hours) == 2 and hours[1] - hours[0] > 1:  # more than two hours in one batch: each one
            hours = sorted({int(t) // width for t in start_ns})[:pg_schema.MAX_HOURS_PER_BATCH]
        for hour in hours:
            name = pg_schema.hour_partition_name(run_id, hour)
            if name in names:
                continue
            try:
                raw.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})")
                            .format(sql.Identifier(name), sql.Identifier(run_part), sql.Literal(hour * width),
                                    sql.Literal((hour + 1) * width)))
            except (errors.DuplicateTable, errors.UniqueViolation):
                pass
            except errors.CheckViolation:
                pass  # the DEFAULT partition holds rows of this hour already: they stay there
            names.add(name)

    def _forget_partitions(self, run_id: str) -> None:
        prefix = pg_schema.partition_name(run_id)
        self._partitions = {n for n in self._partitions if not n.startswith(prefix)}

    def ingest(self, batch, projects=None) -> bool:
        from psycopg import errors
        for attempt in range(1, INGEST_ATTEMPTS + 1):
            try:
                return self._ingest(batch, projects)
            except errors.CheckViolation:
                # "no partition of relation steps found": the run was deleted (its partition
                # dropped) by another collector since this one made it; make it again.
                self._forget_partitions(batch.run_id)
                if attempt == INGEST_ATTEMPTS:
                    raise
            except errors.DeadlockDetected:
                # Two collectors storing ranks of one run lock its run-wide rollup rows in the
                # order of each batch's loaders: PostgreSQL ends one transaction; store it again.
                if attempt == INGEST_ATTEMPTS:
                    raise
        return False

    def _ingest(self, batch, projects) -> bool:
        now = time.time()
        first, end = batch.record_range()
        with self._write_lock:
            if len(batch.steps):
                self._ensure_partitions(batch.run_id, batch.steps.start_ns)
            w = _IngestConnection(self._writer_raw, self)
            raw = self._writer_raw
            try:
                with raw.transaction():
                    w.pipeline_on()
                    try:
                        if not self._ingest_statements(w, batch, first, end, now, projects):
                            return False
                    except BaseException as exc:
                        w.pipeline_off(exc)
                        raise
                    w.pipeline_off()
            except orjson.JSONEncodeError as exc:  # an integer past 64 bits in a free-form field
                raise ValueError(f"batch cannot be stored: {exc}") from None
            self.retention.after_write()
        self.ingested_records += len(batch.steps)
        self.versions[batch.run_id] += 1
        self.version += 1
        return True

    def _ingest_statements(self, w: _IngestConnection, batch, first: int, end: int, now: float,
                           projects=None) -> bool:
        """The batch's statements, inside its transaction; False for a replay (nothing new).
        The same checks as the SQLite store's, by the same code (run_bounds.py, project_scope.py),
        in the same order: a stream id is its run's, the run is the token's project's, and past a
        bound of its run the batch is refused whole (422) before anything is written."""
        raw = self._writer_raw
        # One collector at a time per stream: a batch sent to two collectors is stored once.
        raw.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (batch.stream,))
        # (Ranks of one run stored by two collectors at once may each pass the rank bound by one:
        # the bounds guard the views' cost, which one rank more does not change.)
        claimed = claim_records(w, raw.execute, "postgresql", batch, first, end, projects)
        if claimed is None:
            w.pipeline_off()
            return False
        batch, stored = claimed
        upsert_stream(raw.execute, "postgresql", batch, now)
        if len(batch.steps):
            insert_steps(w, batch, self._stats, self._save_stats)
        for loader in batch.loaders:
            self._upsert_loader(w, batch, loader)
        if batch.phases:
            with w.copy("COPY phases (run_id, rank, loader, epoch, step, name, ns) FROM STDIN") as copy:
                for p in batch.phases:
                    copy.write_row((batch.run_id, batch.rank, *p))
        events = event_rows(batch, first, stored)
        if events:
            with w.copy("COPY events (run_id, rank, kind, t_ns, data) FROM STDIN") as copy:
                for kind, e in events:
                    copy.write_row((batch.run_id, batch.rank, kind, int(e.get("t_ns") or time.time_ns()),
                                    orjson.dumps(e).decode()))
        # Last: the run's row lock is held from here to the commit only, so collectors
        # storing other ranks of this run overlap all of the above.
        raw.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 1))", (batch.run_id,))
        self._upsert_run(w, batch, now, projects)
        raw.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"run:{batch.run_id}"))
        return True

    def _stats(self, w, run_id: str, stream: str, loader: str) -> RecordStats:
        # Read each time (and row-locked): another collector may have stored this stream's last batch.
        row = w.execute("SELECT stats FROM loaders WHERE run_id = ? AND stream = ? AND name = ? FOR UPDATE",
                        (run_id, stream, loader)).fetchone()
        return RecordStats.from_dict(orjson.loads(row[0])) if row and row[0] else RecordStats()

    def note_rejected_file(self, run_id: str, stream: str, file: str, reason: str, records: int | None) -> None:
        super().note_rejected_file(run_id, stream, file, reason, records)
        with self._write_lock:
            self._writer_raw.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"run:{run_id}"))

    def save_tuning(self, run_id: str, document: dict) -> bool:
        saved = super().save_tuning(run_id, document)
        if saved:
            with self._write_lock:
                self._writer_raw.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"run:{run_id}"))
        return saved

    # ---- reads -----------------------------------------------------------------------------------
    def run_rows(self):
        """Every run, and (for this thread, LISTED_ROWS_S) every run's streams and loaders read
        with it in two queries: the runs list reads both per run, which is thousands of round
        trips to PostgreSQL where SQLite reads its page cache."""
        db = self.reader()
        runs = filter_rows(db.execute("SELECT * FROM runs ORDER BY coalesce(started_at, first_seen) DESC").fetchall())
        streams: dict[str, list] = defaultdict(list)
        for row in db.execute("SELECT * FROM streams ORDER BY rank, stream").fetchall():
            streams[row["run_id"]].append(row)
        loaders: dict[str, list] = defaultdict(list)
        for row in db.execute("SELECT * FROM loaders ORDER BY rowid").fetchall():
            loaders[row["run_id"]].append(row)
        self._local.listed = (time.monotonic(), streams, loaders)
        return runs

    def _listed(self, index: int, run_id: str):
        listed = getattr(self._local, "listed", None)
        if listed is None or time.monotonic() - listed[0] > LISTED_ROWS_S:
            return None
        return listed[index].get(run_id, [])

    def stream_rows(self, run_id: str):
        rows = self._listed(1, run_id)
        return rows if rows is not None else super().stream_rows(run_id)

    def loader_rows(self, run_id: str):
        rows = self._listed(2, run_id)
        return rows if rows is not None else super().loader_rows(run_id)

    def step_rows(self, run_id: str, batch: int = 5000):
        """Every step row of a run in rowid order, `batch` at a time, from a server-side cursor
        on a connection of its own (as the SQLite store's: a streamed export moves between threads)."""
        span = self.step_range(run_id)
        if span is None:
            return
        conn = pg_dialect.connect(self.url, application_name="starvewatch-export")
        try:
            with conn.transaction(), conn.cursor(name="steps_export") as cursor:
                cursor.itersize = batch
                cursor.execute(f"SELECT {', '.join(self.STEP_ROW_COLUMNS)} FROM steps "
                               "WHERE rowid BETWEEN %s AND %s AND run_id = %s ORDER BY rowid", (*span, run_id))
                while rows := cursor.fetchmany(batch):
                    yield [tuple(r) for r in rows]
        finally:
            conn.close()

    def read_only_connection(self):
        """A connection of its own for a streamed read (folded_reads.export_rows)."""
        return pg_dialect.Connection(pg_dialect.connect(self.url, application_name="starvewatch-export"))

    # ---- deletion --------------------------------------------------------------------------------
    def delete_run(self, run_id: str) -> bool:
        """Every row of the run; its step rows by DROP of its partition (the space comes back at once)."""
        from psycopg import sql
        with self._write_lock:
            raw = self._writer_raw
            with raw.transaction():
                raw.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 1))", (run_id,))
                found = raw.execute("DELETE FROM runs WHERE id = %s", (run_id,)).rowcount > 0
                raw.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(pg_schema.partition_name(run_id))))
                for table in ("step_blocks", "rollups", "run_rollups", "phases", "events", "loaders", "streams",
                              "tunings", "rejected_files", "rolled_spans", "step_exemplars", "rolled_samples"):
                    raw.execute(f"DELETE FROM {table} WHERE run_id = %s", (run_id,))
                # `seen` stays: a late replay of a deleted run's batch must not resurrect it.
                raw.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"delete:{run_id}"))
            self._forget_partitions(run_id)
            self.versions.pop(run_id, None)
            self.version += 1
            self.deletions += 1
        return found
