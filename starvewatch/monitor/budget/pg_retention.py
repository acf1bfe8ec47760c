"""The storage budget on PostgreSQL (`serve --database-url ... --max-db-size`): what the data
holds is the size of the store's relations (tables, indexes, TOAST; every run's steps
partition), and space comes back only by TRUNCATE or DROP, never by DELETE (a deleted row's
space is reused by later rows after VACUUM, the relation does not shrink).

So the policy moves whole partitions (pg_schema.py: a run's steps by hour of their start),
oldest first, and never one holding a row of a run's straggler window:
1. raw step rows outside each run's raw window (RAW_WINDOW_STEPS, what the straggler rule
   reads; raw_step_fold.window_start finds it as on SQLite): an hour partition of a run that
   ends before the window's earliest step is DROPped, after its exemplars are copied and
   `rolled_spans` says per rank until when the rollups alone hold the steps; the phases
   older than the straggler rule's window are deleted;
2. an ended run's raw step rows, its window too: its steps partition TRUNCATEd (exemplars and
   `rolled_spans` first), its phases deleted;
3. if still over, the oldest ended run is deleted: its partitions DROPped, its other rows
   deleted (logged in retention_log, as on SQLite).
Between 1 and 2, as on SQLite (retention.py): the rollup tiers and the folds of host, GPU and
worker samples (the same code, rollup_tiers.py and sample_rollups.py, through pg_dialect). They
DELETE and INSERT rows: PostgreSQL reuses the freed space for later rows but the relations do
not shrink, so the space a fold freed is counted as free (`_reusable`: rows deleted times the
table's bytes per row) until the table grows again, which says its holes are full; each
enforce() ends with a VACUUM of the tables it folded, which makes that space reusable.

Only one collector folds at a time (PgStore.once("budget"): a session advisory lock, released
when its holder ends or dies), and the relation sizes are asked at most every CHECK_EVERY_S.
"""
from __future__ import annotations

import logging
import time

from .retention import ENDED_AFTER_S, LOW_WATER, RETRY_AFTER_S, Retention

log = logging.getLogger("starvewatch.retention")

CHECK_EVERY_S = 5.0  # relation sizes are catalog reads: asked at most this often, not per batch
TABLES = ("runs", "streams", "seen", "rejected_files", "loaders", "steps", "step_blocks", "rollups", "run_rollups",
          "phases", "events", "tunings", "rolled_spans", "step_exemplars", "retention_log", "rolled_samples", "meta")


class PgRetention(Retention):
    def __init__(self, store, max_bytes: int, raw_window_steps: int | None = None) -> None:
        # Not Retention.__init__: its PRAGMAs are SQLite's.
        from .retention import RAW_WINDOW_STEPS
        self.store = store
        self.max_bytes = max_bytes
        self.raw_window_steps = RAW_WINDOW_STEPS if raw_window_steps is None else raw_window_steps
        self.folds = 0
        self._retry_at = 0.0
        self._checked_at = 0.0
        self._live_folded: set[str] = set()
        # Space folds freed inside a table (bytes), and the table's size then: counted free
        # until the table grows past that size (its holes filled by then).
        self._reusable: dict[str, tuple[int, int]] = {}

    def sizes(self) -> dict[str, int]:
        """Bytes of each table of the store (its indexes and TOAST in; every steps partition
        counted under `steps`)."""
        rows = self.store._writer_raw.execute(
            "SELECT CASE WHEN c.relname LIKE 'steps\\_%%' THEN 'steps' ELSE c.relname END, "
            "sum(pg_total_relation_size(c.oid)) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema() "
            "AND c.relkind IN ('r', 'm') AND (c.relname = ANY(%s) OR c.relname LIKE 'steps\\_%%') GROUP BY 1",
            (list(TABLES),)).fetchall()
        return {name: int(size) for name, size in rows}

    def used_bytes(self) -> int:
        """Bytes of the store's relations, less what folds freed inside them and is not yet reused."""
        sizes = self.sizes()
        free = 0
        for table, (freed, size_then) in list(self._reusable.items()):
            if sizes.get(table, 0) > size_then:
                del self._reusable[table]  # grown since: its freed space is full again
            else:
                free += freed
        return sum(sizes.values()) - free

    def _freed(self, table: str, rows: int) -> None:
        """`rows` of `table` deleted by a fold: their bytes (the table's mean row) count as free."""
        if rows <= 0:
            return
        raw = self.store._writer_raw
        size = self.sizes().get(table, 0)
        # reltuples: the planner's count (-1 before the first VACUUM or ANALYZE); counted once then.
        live = raw.execute("SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)", (table,)).fetchone()[0]
        if live is None or live < 0:
            live = raw.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        per_row = size / max(1.0, float(live) + rows)
        freed, _ = self._reusable.get(table, (0, size))
        self._reusable[table] = (min(size, freed + int(rows * per_row)), size)

    def _reclaim(self) -> int:
        return self.used_bytes()

    def after_write(self) -> None:
        now = time.monotonic()
        if now - self._checked_at < CHECK_EVERY_S or now < self._retry_at:
            return
        self._checked_at = now
        try:
            if self.used_bytes() <= self.max_bytes:
                return
            with self.store.once("budget") as mine:
                if mine:
                    self.enforce()
        except Exception as exc:  # noqa: BLE001 - the batch is stored; fold again later
            log.error("storage budget: folding failed (%s); the database may pass its budget of %d bytes "
                      "until it succeeds", exc, self.max_bytes)

    def enforce_now(self) -> dict:
        with self.store._write_lock, self.store.once("budget") as mine:
            return self.enforce() if mine else {"skipped": "another collector holds the budget lock"}

    def enforce(self) -> dict:
        target = int(self.max_bytes * LOW_WATER)
        done = {"steps": 0, "phases": 0, "rollups": 0, "samples": 0, "coarsened_runs": 0, "deleted_runs": 0}
        self.folds += 1
        try:
            for stage in (self._fold_old_hours, self._coarsen_tiers, self._fold_ended_raw, self._fold_live_samples,
                          self._delete_ended_runs):
                while self.used_bytes() > target:
                    rollups, samples = done["rollups"], done["samples"]
                    progressed = stage(done, self.used_bytes() - target)
                    self._freed("rollups", done["rollups"] - rollups)
                    self._freed("events", done["samples"] - samples)
                    if not progressed:
                        break
                if self.used_bytes() <= target:
                    break
            else:
                self._over_budget()
        finally:
            if done["rollups"] or done["samples"]:
                # The folds' dead rows made reusable (not given back: PostgreSQL keeps the pages).
                for table in ("rollups", "run_rollups", "events"):
                    self.store._writer_raw.execute(f"VACUUM {table}")
        return done

    def _over_budget(self) -> None:
        """Nothing left to fold but live runs' windows: said once a while, tried again later."""
        if self.used_bytes() > self.max_bytes:
            self._retry_at = time.monotonic() + RETRY_AFTER_S
            log.error("database over its budget of %d bytes with only live runs left (%d bytes): raise "
                      "--max-db-size", self.max_bytes, self.used_bytes())

    def _runs_oldest_first(self, ended_only: bool = False) -> list[tuple[str, str]]:
        w = self.store._writer_raw
        now = time.time()
        rows = w.execute(
            "SELECT r.id, r.name, r.last_seen, (SELECT count(*) FROM streams s WHERE s.run_id = r.id "
            "AND s.finished = 0) FROM runs r ORDER BY coalesce(r.started_at, r.first_seen)").fetchall()
        return [(r[0], r[1]) for r in rows if not ended_only or r[3] == 0 or now - r[2] > ENDED_AFTER_S]

    def _hour_partitions(self, run_id: str) -> list[tuple[int, str]]:
        """The run's hour partitions, (hour, name), oldest first (its DEFAULT one left out)."""
        from ..storage import pg_schema
        prefix = pg_schema.partition_name(run_id)
        rows = self.store._writer_raw.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = to_regclass(%s)", (prefix,)).fetchall()
        out = []
        for (name,) in rows:
            tail = name[len(prefix) + 1:]
            if tail[:1] in ("h", "m") and tail[1:].isdigit():
                out.append((int(tail[1:]) * (-1 if tail[0] == "m" else 1), name))
        return sorted(out)

    def _fold_old_hours(self, done: dict, excess_bytes: int) -> bool:
        """Stage 1: the oldest hour partition, over all runs, that ends before its run's raw
        window begins: DROPped, its exemplars and rolled spans kept."""
        from ..storage import pg_schema
        from . import raw_step_fold
        from .retention import PHASE_WINDOW_FACTOR
        raw, w = self.store._writer_raw, self.store._writer
        width = pg_schema.STEP_PARTITION_NS
        candidates = []
        for run_id, name in self._runs_oldest_first():
            hours = self._hour_partitions(run_id)
            if not hours:
                continue
            start = raw_step_fold.window_start(w, run_id, self.raw_window_steps)
            if start is None:
                continue  # the whole run is inside its window
            cut_ns = raw.execute("SELECT min(start_ns) FROM steps WHERE run_id = %s AND rowid >= %s",
                                 (run_id, start)).fetchone()[0]
            candidates += [(hour, run_id, name, part) for hour, part in hours
                           if cut_ns is not None and (hour + 1) * width <= cut_ns]
        if not candidates:
            return False
        hour, run_id, run_name, part = min(candidates)
        from psycopg import sql
        ident = sql.Identifier(part)
        with raw.transaction():
            lo, hi = raw.execute(sql.SQL("SELECT min(rowid), max(rowid) FROM {}").format(ident)).fetchone()
            if lo is not None:
                room = [self.exemplar_limit_rows() - raw.execute("SELECT count(*) FROM step_exemplars").fetchone()[0]]
                raw_step_fold.keep_exemplars(w, run_id, lo, hi, raw_step_fold.exemplar_rules(w, run_id), room)
            for rank, count, last_ns in raw.execute(sql.SQL(
                    "SELECT rank, count(*), max(start_ns) FROM {} GROUP BY rank").format(ident)).fetchall():
                raw.execute("INSERT INTO rolled_spans VALUES (%s, %s, %s, %s) ON CONFLICT (run_id, rank) DO "
                            "UPDATE SET until_s = GREATEST(rolled_spans.until_s, excluded.until_s), "
                            "steps = rolled_spans.steps + excluded.steps",
                            (run_id, rank, last_ns // 1_000_000_000 + 1, count))
                done["steps"] += count
            raw.execute(sql.SQL("DROP TABLE {}").format(ident))
            # Blocks wholly before the run's first remaining row point at nothing now.
            first = raw.execute("SELECT min(rowid) FROM steps WHERE run_id = %s", (run_id,)).fetchone()[0]
            if first is not None:
                raw.execute("DELETE FROM step_blocks WHERE run_id = %s AND last_rowid < %s", (run_id, first))
            done["phases"] += raw_step_fold.fold_phases(w, [run_id], PHASE_WINDOW_FACTOR * self.raw_window_steps)
            raw.execute("SELECT pg_notify(%s, %s)", ("starvewatch_changes", f"run:{run_id}"))
        self.store._forget_partitions(run_id)
        self._changed(run_id)
        return True

    def _fold_ended_raw(self, done: dict, excess_bytes: int) -> bool:
        """Stage 1: one ended run's raw steps into its rollups only (exemplars kept), by TRUNCATE."""
        from psycopg import sql
        from ..storage import pg_schema
        from .raw_step_fold import _EXEMPLAR_COLUMNS
        raw = self.store._writer_raw
        for run_id, name in self._runs_oldest_first(ended_only=True):
            if raw.execute("SELECT 1 FROM step_blocks WHERE run_id = %s LIMIT 1", (run_id,)).fetchone() is None:
                continue
            partition = sql.Identifier(pg_schema.partition_name(run_id))
            with raw.transaction():
                raw.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 1))", (run_id,))
                # The slowest steps of each rank, kept raw (at most the exemplar share of the budget).
                per_run = max(100, self.exemplar_limit_rows() // 20)
                raw.execute(sql.SQL(
                    "INSERT INTO step_exemplars (" + _EXEMPLAR_COLUMNS + ", reason) SELECT " + _EXEMPLAR_COLUMNS
                    + ", 'slowest' FROM {} ORDER BY wait_ns DESC LIMIT %s").format(partition), (per_run,))
                spans = raw.execute(sql.SQL(
                    "SELECT rank, max(start_ns) / 1000000000 + 1, count(*) FROM {} GROUP BY rank").format(partition)
                ).fetchall()
                for rank, until_s, steps in spans:
                    raw.execute("INSERT INTO rolled_spans VALUES (%s, %s, %s, %s) ON CONFLICT (run_id, rank) DO "
                                "UPDATE SET until_s = GREATEST(rolled_spans.until_s, excluded.until_s), "
                                "steps = rolled_spans.steps + excluded.steps", (run_id, rank, until_s, steps))
                    done["steps"] += steps
                raw.execute(sql.SQL("TRUNCATE {}").format(partition))
                raw.execute("DELETE FROM step_blocks WHERE run_id = %s", (run_id,))
                done["phases"] += raw.execute("DELETE FROM phases WHERE run_id = %s", (run_id,)).rowcount
                raw.execute("SELECT pg_notify(%s, %s)", ("starvewatch_changes", f"run:{run_id}"))
            self._changed(run_id)
            done["coarsened_runs"] += 1
            self._note(run_id, name, "coarsened",
                       f"raw steps folded into its per-second rollups to keep the database within "
                       f"{self.max_bytes} bytes: totals, percentiles and the verdict are kept, its straggler "
                       f"ranking is no longer computed")
            return True
        return False
