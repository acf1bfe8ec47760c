"""The storage budget (`serve --max-db-size`): fold old raw rows into rollups, never lose a total.

What the summary, the verdict, the recommendations and verify-after-change read never leaves the
database: the per-loader exact totals and mergeable histograms (`loaders` table, stats.py). What
grows with a run's length is folded, oldest first, once the file (with its -wal and -shm files)
passes the budget, down to LOW_WATER of it:

1. raw step rows outside each run's raw window (the latest RAW_WINDOW_STEPS steps, which the
   straggler rule reads) are deleted: their per-second rollups already hold them. The slowest
   steps and the steps around stalls are first copied to `step_exemplars` (at most 1% of the
   budget). Phases older than the window the straggler rule reads go too.
2. per-second rollups are merged into coarser tiers (TIERS_S), oldest span first, never coarser
   than a run's length / MIN_BUCKETS: a whole run stays drawable with at least 1,000 buckets.
3. the oldest ended runs are coarsened further (their raw window dropped), then live runs'
   samples are folded whole (their recent span too: charts coarser, figures kept), then every
   run's older tuning results and stall stacks are reclaimed (document_trim.py), then as a
   last resort the oldest ended runs are deleted; each is logged, a coarsened or deleted run
   listed in `retention_log` (the runs page shows it as a banner).

Which spans of a run are rolled up is kept in `rolled_spans` (per rank: every step before
`until_s` is in the rollups only); the CSV export emits those spans as marked buckets.

Host, GPU and worker samples follow the same tiers (monitor/budget/sample_rollups.py): in stage 2 each
run's samples older than the tier's recent span merge into per-bucket aggregates (min / mean /
max per field, and what the findings read), never coarser than the run's length / MIN_BUCKETS;
stage 3 folds an ended run's samples whole. `rolled_samples` says per rank until when.

This module is the policy (when to fold, which stage, how much, which tier, which run) and its
log; the moves of rows are each in their own module: raw_step_fold.py (stage 1, exemplars,
`rolled_spans`), rollup_tiers.py (stage 2's merge of rollups), sample_rollups.py (samples),
database_file.py (the file's size, auto-vacuum, the retention tables), and folded_reads.py
(what readers and the CSV export read of the folded spans).
"""
from __future__ import annotations

import logging
import re
import sqlite3
import time

from ...logonce import RateLimitedLog
from . import document_trim, raw_step_fold, rollup_tiers, sample_rollups
from ..storage.database_file import file_bytes
from ..storage.write_transaction import immediate_transaction

log = logging.getLogger("starvewatch.retention")
_errors = RateLimitedLog(log)

DEFAULT_MAX_DB_BYTES = 4 * 2**30
MIN_DB_BYTES = 1_000_000
LOW_WATER = 0.85            # fold down to this share of the budget: folding runs in chunks, not per batch
EXEMPLAR_SHARE = 0.01       # the raw rows kept inside folded spans, as a share of the budget
EXEMPLAR_ROW_BYTES = 80     # on-disk bytes of one exemplar row (measured: 60-75 for a step row)
RAW_WINDOW_STEPS = 100_000  # the latest steps of a run kept raw (the straggler rule reads them)
PHASE_WINDOW_FACTOR = 4     # the straggler rule reads the last 4 x RAW_WINDOW_STEPS phase rows
TIERS_S = (60, 600, 3600, 86_400)
MIN_BUCKETS = 1000
# A tier keeps the latest span of a run at the finer resolution (live views zoom there).
TIER_KEEP_RECENT_S = {60: 3600, 600: 86_400, 3600: 7 * 86_400, 86_400: 60 * 86_400}
ENDED_AFTER_S = 3600        # a run silent this long counts as ended (may be coarsened or deleted)
RETRY_AFTER_S = 30.0        # after a fold that could not get under the budget

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str) -> int:
    """'500MB', '4GB' (powers of ten), '512MiB', '4GiB' (powers of two), or bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size: write it like 500MB or 4GB (powers of ten) "
                         f"or 512MiB or 4GiB (powers of two)")
    size = int(float(match.group(1)) * _UNITS[unit])
    if size < MIN_DB_BYTES:
        raise ValueError(f"{text!r} is below the smallest database size, {MIN_DB_BYTES // 10**6}MB")
    return size


class Retention:
    """Keeps one store within its budget. Every method runs on the store's writer connection,
    under its write lock, between transactions."""

    def __init__(self, store, max_bytes: int = DEFAULT_MAX_DB_BYTES,
                 raw_window_steps: int | None = None) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self.raw_window_steps = RAW_WINDOW_STEPS if raw_window_steps is None else raw_window_steps
        self.folds = 0
        self._retry_at = 0.0  # after a fold that could not get under the budget: not before this
        self._live_folded: set[str] = set()  # runs whose recent samples were folded (said once each)
        w = store._writer
        page = w.execute("PRAGMA page_size").fetchone()[0]
        # The WAL counts against the budget: checkpoint and truncate it at 1/50 of it.
        wal_bytes = max(64 * 1024, min(64 * 2**20, max_bytes // 50))
        w.execute(f"PRAGMA wal_autocheckpoint={max(16, wal_bytes // page)}")
        w.execute(f"PRAGMA journal_size_limit={wal_bytes}")

    # ---- accounting -----------------------------------------------------------------------
    def used_bytes(self) -> int:
        """Bytes the data holds: the file less its free pages (a file from before incremental
        auto-vacuum keeps them, and reuses them), plus the -wal and -shm files."""
        w = self.store._writer
        free = w.execute("PRAGMA freelist_count").fetchone()[0] * w.execute("PRAGMA page_size").fetchone()[0]
        return file_bytes(self.store.path) - free

    def exemplar_limit_rows(self) -> int:
        return int(self.max_bytes * EXEMPLAR_SHARE / EXEMPLAR_ROW_BYTES)

    def after_write(self) -> None:
        """Called after each stored batch: a few stat() calls, and a fold when over budget. The
        batch is stored already: a failing fold (a full disk) is logged, and tried again later."""
        if file_bytes(self.store.path) <= self.max_bytes or time.monotonic() < self._retry_at:
            return
        try:
            # Rewritten rows (statistics, rollups) leave free pages: give them back first.
            if self._reclaim() > self.max_bytes:
                self.enforce()
        except sqlite3.Error as exc:
            _errors.error("fold", "storage budget: folding old rows failed (%s); the database may pass "
                                  "its budget of %d bytes until it succeeds", exc, self.max_bytes)

    def enforce_now(self) -> dict:
        """enforce() from outside an ingest (tests, benchmarks, a lowered budget)."""
        with self.store._write_lock:
            self._reclaim()
            return self.enforce()

    def enforce(self) -> dict:
        """Fold until the data is under LOW_WATER of the budget; returns what was done."""
        target = int(self.max_bytes * LOW_WATER)
        done = {"steps": 0, "phases": 0, "rollups": 0, "samples": 0, "coarsened_runs": 0, "deleted_runs": 0}
        self.folds += 1
        for stage in (self._fold_raw, self._coarsen_tiers, self._coarsen_ended_runs, self._fold_live_samples,
                      self._trim_documents, self._delete_ended_runs):
            while self._reclaim() > target:
                if not stage(done, self._reclaim() - target):
                    break
            if self._reclaim() <= target:
                break
        else:
            if self._reclaim() > self.max_bytes:
                # Nothing left to fold but live runs' windows: try again in a while, say it once.
                self._retry_at = time.monotonic() + RETRY_AFTER_S
                _errors.error("over", "database over its budget of %d bytes with only live runs left to fold "
                                      "(%d bytes): raise --max-db-size", self.max_bytes, self.used_bytes())
        if done["steps"] or done["rollups"] or done["samples"]:
            log.info("storage budget: folded %d raw step rows, %d rollup rows and %d host/GPU/worker sample "
                     "rows into coarser buckets (budget %d bytes)", done["steps"], done["rollups"],
                     done["samples"], self.max_bytes)
        return done

    def _reclaim(self) -> int:
        w = self.store._writer
        w.executescript("PRAGMA incremental_vacuum;")  # execute() would step once: one page
        w.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return self.used_bytes()

    # ---- stage 1: raw rows ------------------------------------------------------------------
    def _fold_raw(self, done: dict, excess_bytes: int, run_ids=None, keep_window: bool = True) -> bool:
        """One pass of stage 1 (monitor/budget/raw_step_fold.py): the runs' raw steps outside their raw
        window (keep_window=False: all of them)."""
        w = self.store._writer
        runs = run_ids if run_ids is not None else [
            r for (r,) in w.execute("SELECT DISTINCT run_id FROM step_blocks")]
        limits = {}
        for run_id in runs:
            start = raw_step_fold.window_start(w, run_id, self.raw_window_steps) if keep_window else None
            if start is not None or not keep_window:
                limits[run_id] = start if keep_window else None
        if not limits:
            return False
        # Rows to fold in this pass: about the excess at ~64 bytes a row, and at most 1% of the
        # budget: each transaction's pages pass through the WAL, which counts against the budget.
        budget_rows = max(2000, min(excess_bytes, self.max_bytes // 100) // 64)
        return raw_step_fold.fold_steps(w, runs, limits, budget_rows, self.exemplar_limit_rows(),
                                        PHASE_WINDOW_FACTOR * self.raw_window_steps, done, self._changed)

    # ---- stage 2: rollup tiers --------------------------------------------------------------
    def _runs_oldest_first(self, ended_only: bool = False) -> list[tuple[str, str]]:
        w = self.store._writer
        rows = w.execute("SELECT id, name, last_seen FROM runs ORDER BY coalesce(started_at, first_seen)").fetchall()
        if not ended_only:
            return [(r[0], r[1]) for r in rows]
        now = time.time()
        out = []
        for run_id, name, last_seen in rows:
            open_streams = w.execute("SELECT count(*) FROM streams WHERE run_id = ? AND finished = 0",
                                     (run_id,)).fetchone()[0]
            if open_streams == 0 or now - last_seen > ENDED_AFTER_S:
                out.append((run_id, name))
        return out

    def coarsen(self, run_id: str, width_s: int, before_s: int | None = None) -> int:
        """Merge a run's rollup rows finer than width_s (and before before_s) into width_s buckets;
        returns how many rows were merged (monitor/budget/rollup_tiers.py)."""
        merged = rollup_tiers.coarsen_rollups(self.store._writer, run_id, width_s, before_s)
        if merged:
            self._changed(run_id)
        return merged

    def allowed_width_s(self, run_id: str) -> int:
        """The coarsest tier that still draws the whole run in MIN_BUCKETS buckets (1: none)."""
        lo, hi = self.store._writer.execute("SELECT min(second), max(second) FROM rollups WHERE run_id = ?",
                                            (run_id,)).fetchone()
        if lo is None:
            return 1
        fitting = [t for t in TIERS_S if t * MIN_BUCKETS <= hi - lo + 1]
        return fitting[-1] if fitting else 1

    def _coarsen_tiers(self, done: dict, excess_bytes: int) -> bool:
        w = self.store._writer
        for width in TIERS_S:
            for run_id, _ in self._runs_oldest_first():
                merged = 0
                if self.allowed_width_s(run_id) >= width:
                    hi = w.execute("SELECT max(second) FROM rollups WHERE run_id = ?", (run_id,)).fetchone()[0]
                    merged = self.coarsen(run_id, width, hi - TIER_KEEP_RECENT_S[width])
                    done["rollups"] += merged
                # The run's samples, in the same tier and keeping the same recent span at finer grain.
                folded = self.fold_samples(run_id, width)
                done["samples"] += folded
                if merged or folded:
                    return True
        return False

    def samples_width_s(self, run_id: str) -> int:
        """The coarsest tier that still draws the run's samples in MIN_BUCKETS buckets (1: none)."""
        span = sample_rollups.span(self.store._writer, run_id)
        if span is None:
            return 1
        fitting = [t for t in TIERS_S if t * MIN_BUCKETS <= span[1] - span[0] + 1]
        return fitting[-1] if fitting else 1

    def fold_samples(self, run_id: str, width_s: int, whole: bool = False) -> int:
        """One pass merging a run's samples into width_s buckets: those older than the tier's
        recent span (whole: all), when the run is long enough for width_s. Returns the rows folded."""
        if self.samples_width_s(run_id) < width_s:
            return 0
        hi = sample_rollups.span(self.store._writer, run_id)[1]
        cut = (hi + 1 if whole else hi - TIER_KEEP_RECENT_S[width_s]) // width_s * width_s
        # Rows per pass: about a hundredth of the budget at ~1 KB a sample (the WAL counts too).
        limit = max(100, min(sample_rollups.MAX_EVENTS_PER_PASS, self.max_bytes // 100 // 1000))
        w = self.store._writer
        with immediate_transaction(w):
            folded = sample_rollups.fold(w, run_id, width_s, cut, limit)
        if folded:
            self._changed(run_id)
        return folded

    # ---- stage 3: ended runs ----------------------------------------------------------------
    def _coarsen_ended_runs(self, done: dict, excess_bytes: int) -> bool:
        w = self.store._writer
        for run_id, name in self._runs_oldest_first(ended_only=True):
            has_raw = w.execute("SELECT 1 FROM step_blocks WHERE run_id = ? LIMIT 1", (run_id,)).fetchone()
            has_phases = w.execute("SELECT 1 FROM phases WHERE run_id = ? LIMIT 1", (run_id,)).fetchone()
            width = self.allowed_width_s(run_id)
            finer = w.execute("SELECT 1 FROM rollups WHERE run_id = ? AND span_s < ? LIMIT 1",
                              (run_id, width)).fetchone() if width > 1 else None
            sample_width = self.samples_width_s(run_id)
            finer_samples = w.execute(
                "SELECT 1 FROM events WHERE run_id = ? AND kind IN ('samples', 'workers') AND span_s < ? "
                "AND t_ns < ? LIMIT 1", (run_id, sample_width, self._whole_cut_ns(run_id, sample_width))
            ).fetchone() if sample_width > 1 else None
            if not (has_raw or has_phases or finer or finer_samples):
                continue
            while self._fold_raw(done, 1 << 40, run_ids=[run_id], keep_window=False):
                pass
            done["phases"] += raw_step_fold.fold_phases(w, [run_id], 0, self._changed)
            if finer:
                done["rollups"] += self.coarsen(run_id, width)
            if finer_samples:
                while folded := self.fold_samples(run_id, sample_width, whole=True):
                    done["samples"] += folded
            done["coarsened_runs"] += 1
            self._note(run_id, name, "coarsened",
                       f"raw steps folded into rollups of {width} s buckets (host, GPU and worker samples into "
                       f"{max(sample_width, 1)} s buckets) to keep the database within "
                       f"{self.max_bytes} bytes: totals, percentiles and the verdict are kept, its straggler "
                       f"ranking is no longer computed")
            return True
        return False

    def _fold_live_samples(self, done: dict, excess_bytes: int) -> bool:
        """Before an ended run is deleted: live runs' samples folded whole into their coarsest
        tier, their recent span too (a host sample every 0.5 s on 64 ranks keeps an hour in
        ~1 GB). Nothing the summary or the diagnosis reads is lost; the charts get coarser."""
        for run_id, name in self._runs_oldest_first():
            width = self.samples_width_s(run_id)
            if width <= 1:
                continue
            folded = self.fold_samples(run_id, width, whole=True)
            if folded:
                done["samples"] += folded
                if run_id not in self._live_folded:
                    self._live_folded.add(run_id)
                    log.warning("storage budget: run %s (%s): its recent host, GPU and worker samples folded into "
                                "%d s buckets too, to keep the database within %d bytes", name, run_id, width,
                                self.max_bytes)
                return True
        return False

    def _trim_documents(self, done: dict, excess_bytes: int) -> bool:
        """Before an ended run is deleted: older tuning results and stall stacks of every run,
        a live one's included (document_trim.py)."""
        with immediate_transaction(self.store._writer):
            changed = document_trim.trim(self.store._writer)
        if changed:
            done["documents"] = done.get("documents", 0) + changed
            log.warning("storage budget: %d older tuning results and stall stacks reclaimed, to keep the "
                        "database within %d bytes", changed, self.max_bytes)
            self.store.version += 1
            self.store.deletions += 1  # cached answers of any run may hold them
        return changed > 0

    def _whole_cut_ns(self, run_id: str, width_s: int) -> int:
        hi = sample_rollups.span(self.store._writer, run_id)[1]
        return (hi + 1) // width_s * width_s * 1_000_000_000

    def _delete_ended_runs(self, done: dict, excess_bytes: int) -> bool:
        ended = self._runs_oldest_first(ended_only=True)
        if not ended:
            return False
        run_id, name = ended[0]
        self.store.delete_run(run_id)
        done["deleted_runs"] += 1
        self._note(run_id, name, "deleted", f"the oldest ended run, deleted to keep the database within "
                                            f"{self.max_bytes} bytes (budget: serve --max-db-size)")
        return True

    # ---- bookkeeping -------------------------------------------------------------------------
    def _note(self, run_id: str, name: str, action: str, detail: str) -> None:
        log.warning("storage budget: run %s (%s) %s: %s", name, run_id, action, detail)
        self.store._writer.execute("INSERT INTO retention_log VALUES (?, ?, ?, ?, ?)",
                                   (time.time(), run_id, name, action, detail))
        self.store.version += 1

    def _changed(self, run_id: str) -> None:
        self.store.versions[run_id] += 1
        self.store.version += 1

