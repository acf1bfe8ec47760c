"""The storage budget on PostgreSQL (`serve --database-url ... --max-db-size`): what the data
holds is the size of the store's relations (tables, indexes, TOAST; every run's steps
partition), and space comes back only by TRUNCATE or DROP, never by DELETE (a deleted row's
space is reused by later rows after VACUUM, the relation does not shrink).

So the policy is by whole runs, ended ones only, oldest first: a live run's rows and its
straggler window are never touched.
1. an ended run's raw step rows are folded: its exemplars kept (step_exemplars), `rolled_spans`
   said per rank (its rollups hold every step), then its steps partition TRUNCATEd and its
   phases deleted;
2. if still over, the oldest ended run is deleted: its partition DROPped, its other rows
   deleted (logged in retention_log, as on SQLite).
The per-rank tiers of stage 2 and the live-sample folds of SQLite's budget (retention.py) are
not done here: on PostgreSQL live runs keep their per-second rollups and raw rows; size the
database for them (docs/fleets.md).

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

    def used_bytes(self) -> int:
        """Bytes of every relation of the store in its schema (partitions, indexes and TOAST in)."""
        row = self.store._writer_raw.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema() "
            "AND c.relkind IN ('r', 'm') AND (c.relname = ANY(%s) OR c.relname LIKE 'steps\\_%%')",
            (list(TABLES),)).fetchone()
        return int(row[0])

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
        for stage in (self._fold_ended_raw, self._delete_ended_runs):
            while self.used_bytes() > target:
                if not stage(done, self.used_bytes() - target):
                    break
            if self.used_bytes() <= target:
                break
        else:
            if self.used_bytes() > self.max_bytes:
                self._retry_at = time.monotonic() + RETRY_AFTER_S
                log.error("database over its budget of %d bytes with only live runs left (%d bytes): raise "
                          "--max-db-size", self.max_bytes, self.used_bytes())
        return done

    def _runs_oldest_first(self, ended_only: bool = False) -> list[tuple[str, str]]:
        w = self.store._writer_raw
        now = time.time()
        rows = w.execute(
            "SELECT r.id, r.name, r.last_seen, (SELECT count(*) FROM streams s WHERE s.run_id = r.id "
            "AND s.finished = 0) FROM runs r ORDER BY coalesce(r.started_at, r.first_seen)").fetchall()
        return [(r[0], r[1]) for r in rows if not ended_only or r[3] == 0 or now - r[2] > ENDED_AFTER_S]

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
