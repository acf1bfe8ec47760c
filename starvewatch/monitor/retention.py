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
   samples are folded whole (their recent span too: charts coarser, figures kept), then as a
   last resort the oldest ended runs are deleted; each is logged, a coarsened or deleted run
   listed in `retention_log` (the runs page shows it as a banner).

Which spans of a run are rolled up is kept in `rolled_spans` (per rank: every step before
`until_s` is in the rollups only); the CSV export emits those spans as marked buckets.

Host, GPU and worker samples follow the same tiers (monitor/sample_rollups.py): in stage 2 each
run's samples older than the tier's recent span merge into per-bucket aggregates (min / mean /
max per field, and what the findings read), never coarser than the run's length / MIN_BUCKETS;
stage 3 folds an ended run's samples whole. `rolled_samples` says per rank until when.
"""
from __future__ import annotations

import logging
import os
import re
import time

import sqlite3

import orjson

from ..logonce import RateLimitedLog
from . import rollup_bands, run_rollups, sample_rollups

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
VACUUM_ON_MIGRATE_MAX_BYTES = 256 * 2**20  # an older file up to this size is VACUUMed once at open

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}

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
                      self._delete_ended_runs):
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
    def _window_start(self, run_id: str) -> int | None:
        """The first rowid of the run's raw window: the blocks the straggler rule reads
        (query.Query._recent_step_ranges takes the same blocks, newest first, per rank)."""
        w = self.store._writer
        ranks = len({r for (r,) in w.execute("SELECT rank FROM streams WHERE run_id = ?", (run_id,))}) or 1
        quota = self.raw_window_steps // ranks
        taken: dict[int, int] = {}
        start = None
        for first, last, rank in w.execute(
                "SELECT b.first_rowid, b.last_rowid, s.rank FROM step_blocks b JOIN steps s "
                "ON s.rowid = b.first_rowid WHERE b.run_id = ? ORDER BY b.first_rowid DESC", (run_id,)):
            if taken.get(rank, 0) < quota:
                taken[rank] = taken.get(rank, 0) + last - first + 1
                start = first
            elif len(taken) >= ranks and all(n >= quota for n in taken.values()):
                return start
        return None  # the whole run is inside its window

    def _fold_raw(self, done: dict, excess_bytes: int, run_ids=None, keep_window: bool = True) -> bool:
        w = self.store._writer
        runs = run_ids if run_ids is not None else [
            r for (r,) in w.execute("SELECT DISTINCT run_id FROM step_blocks")]
        limits = {}
        for run_id in runs:
            start = self._window_start(run_id) if keep_window else None
            if start is not None or not keep_window:
                limits[run_id] = start if keep_window else None
        if not limits:
            return False
        # Rows to fold in this pass: about the excess at ~64 bytes a row, and at most 1% of the
        # budget: each transaction's pages pass through the WAL, which counts against the budget.
        budget_rows = max(2000, min(excess_bytes, self.max_bytes // 100) // 64)
        blocks = []
        for run_id, limit in limits.items():
            sql = "SELECT rowid, first_rowid, last_rowid FROM step_blocks WHERE run_id = ?"
            args: tuple = (run_id,)
            if limit is not None:
                sql, args = sql + " AND last_rowid < ?", (run_id, limit)
            blocks += [(first, last, rowid, run_id) for rowid, first, last in
                       w.execute(sql + " ORDER BY first_rowid LIMIT ?", (*args, budget_rows))]
        blocks.sort()
        picked, rows = [], 0
        for block in blocks:
            if rows >= budget_rows:
                break
            picked.append(block)
            rows += block[1] - block[0] + 1
        if not picked:
            phases = self._fold_phases(w, runs)
            done["phases"] += phases
            return phases > 0
        # Adjacent blocks of one run (one ingest after another) are folded as one rowid range.
        ranges: list[list] = []
        for first, last, block_id, run_id in picked:
            if ranges and ranges[-1][3] == run_id and ranges[-1][0] <= first == ranges[-1][1] + 1:
                ranges[-1][1] = last
            else:
                ranges.append([first, last, None, run_id])
        w.execute("BEGIN IMMEDIATE")
        try:
            thresholds = {}
            room = [self.exemplar_limit_rows() - w.execute("SELECT count(*) FROM step_exemplars").fetchone()[0]]
            for first, last, _, run_id in ranges:
                if run_id not in thresholds:
                    thresholds[run_id] = self._exemplar_rules(w, run_id)
                self._keep_exemplars(w, run_id, first, last, thresholds[run_id], room)
                for rank, count, last_ns in w.execute(
                        "SELECT rank, count(*), max(start_ns) FROM steps WHERE rowid BETWEEN ? AND ? "
                        "AND run_id = ? GROUP BY rank", (first, last, run_id)).fetchall():
                    w.execute("INSERT INTO rolled_spans VALUES (?, ?, ?, ?) ON CONFLICT(run_id, rank) DO "
                              "UPDATE SET until_s = max(until_s, excluded.until_s), steps = steps + excluded.steps",
                              (run_id, rank, last_ns // 1_000_000_000 + 1, count))
                w.execute("DELETE FROM steps WHERE rowid BETWEEN ? AND ? AND run_id = ?", (first, last, run_id))
            w.executemany("DELETE FROM step_blocks WHERE rowid = ?", [(block[2],) for block in picked])
            done["phases"] += self._fold_phases(w, list(thresholds), in_transaction=True)
            w.execute("COMMIT")
        except BaseException:
            w.execute("ROLLBACK")
            raise
        done["steps"] += rows
        for run_id in thresholds:
            self._changed(run_id)
        return True

    def _fold_phases(self, w, runs, in_transaction: bool = False, keep_window: bool = True) -> int:
        window = PHASE_WINDOW_FACTOR * self.raw_window_steps if keep_window else -1
        removed = 0
        for run_id in runs:
            last = w.execute("SELECT max(rowid) FROM phases WHERE run_id = ?", (run_id,)).fetchone()[0]
            if last is None:
                continue
            # The straggler rule reads phases with rowid > last - window: keep exactly those.
            removed += w.execute("DELETE FROM phases WHERE run_id = ? AND rowid <= ?",
                                 (run_id, last - window if keep_window else last)).rowcount
        if removed and not in_transaction:
            for run_id in runs:
                self._changed(run_id)
        return removed

    def _exemplar_rules(self, w, run_id: str) -> dict:
        """Which rows of a run stay raw inside a folded span: the slowest (wait at or above the
        run's 99.9th percentile, per loader) and those within 5 s of a stall."""
        from ..stats import RecordStats, LogHistogram
        waits: dict[str, LogHistogram] = {}
        for name, stats in w.execute("SELECT name, stats FROM loaders WHERE run_id = ? AND stats IS NOT NULL",
                                     (run_id,)):
            hist = RecordStats.from_dict(orjson.loads(stats)).wait
            waits.setdefault(name, LogHistogram()).merge(hist)
        slow = {name: int(h.quantile(0.999) or 0) for name, h in waits.items() if h.count}
        stalls = []
        for (data,) in w.execute("SELECT data FROM events WHERE run_id = ? AND kind = 'stalls'", (run_id,)):
            e = orjson.loads(data)
            began = e.get("started_ns")
            if isinstance(began, int):
                ended = e.get("ended_ns") or e.get("t_ns") or began
                stalls.append((began - 5_000_000_000, int(ended) + 5_000_000_000))
        return {"slow": slow, "stalls": stalls}

    def _keep_exemplars(self, w, run_id: str, first: int, last: int, rules: dict, left: list[int]) -> None:
        """Copy a range's exemplars, within the room `left[0]` (rows), which it decreases."""
        room = left[0]
        if room <= 0:
            return
        columns = "run_id, rank, loader, epoch, step, start_ns, wait_ns, compute_ns, other_ns, batch_size, gpu_idle_ns"
        for lo, hi in rules["stalls"][:100]:
            if room <= 0:
                break
            room -= w.execute(f"INSERT INTO step_exemplars SELECT {columns}, 'stall' FROM steps WHERE rowid "
                              "BETWEEN ? AND ? AND run_id = ? AND start_ns BETWEEN ? AND ? LIMIT ?",
                              (first, last, run_id, lo, hi, max(0, room))).rowcount
        for loader, threshold in rules["slow"].items():
            if room <= 0:
                break
            room -= w.execute(f"INSERT INTO step_exemplars SELECT {columns}, 'slowest' FROM steps WHERE rowid "
                              "BETWEEN ? AND ? AND run_id = ? AND loader = ? AND wait_ns >= ? AND wait_ns > 0 "
                              "ORDER BY wait_ns DESC LIMIT ?", (first, last, run_id, loader, threshold, room)).rowcount
        left[0] = room

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
        returns how many rows were merged. Sums add, maxima and epoch bounds keep their extremes."""
        w = self.store._writer
        lo, hi = w.execute("SELECT min(second), max(second) FROM rollups WHERE run_id = ?", (run_id,)).fetchone()
        if lo is None:
            return 0
        cut = hi + 1 if before_s is None else before_s
        cut = cut // width_s * width_s  # a bucket never straddles the cut
        w.execute("BEGIN IMMEDIATE")
        try:
            w.execute("CREATE TEMP TABLE IF NOT EXISTS coarse AS SELECT * FROM rollups WHERE 0")
            w.execute("DELETE FROM temp.coarse")
            w.execute("INSERT INTO temp.coarse SELECT run_id, rank, loader, second / ? * ?, sum(steps), sum(wait_ns), "
                      "sum(compute_ns), sum(other_ns), sum(samples), sum(gpu_idle_ns), sum(gpu_steps), "
                      "max(wait_max_ns), min(epoch_min), max(epoch_max), ?, " + rollup_bands.AGGREGATES + " FROM rollups "
                      "WHERE run_id = ? AND span_s < ? AND second < ? GROUP BY rank, loader, second / ?",
                      (width_s, width_s, width_s, run_id, width_s, cut, width_s))
            merged = w.execute("DELETE FROM rollups WHERE run_id = ? AND span_s < ? AND second < ?",
                               (run_id, width_s, cut)).rowcount
            w.execute("INSERT INTO rollups SELECT * FROM temp.coarse WHERE true "
                      "ON CONFLICT(run_id, loader, rank, second) DO UPDATE SET steps = steps + excluded.steps, "
                      "wait_ns = wait_ns + excluded.wait_ns, compute_ns = compute_ns + excluded.compute_ns, "
                      "other_ns = other_ns + excluded.other_ns, samples = samples + excluded.samples, "
                      "gpu_idle_ns = gpu_idle_ns + excluded.gpu_idle_ns, gpu_steps = gpu_steps + excluded.gpu_steps, "
                      "wait_max_ns = max(wait_max_ns, excluded.wait_max_ns), "
                      "epoch_min = min(epoch_min, excluded.epoch_min), epoch_max = max(epoch_max, excluded.epoch_max), "
                      "span_s = max(span_s, excluded.span_s), " + rollup_bands.MERGE)
            run_rollups.coarsen(w, run_id, width_s, cut)
            w.execute("COMMIT")
        except BaseException:
            w.execute("ROLLBACK")
            raise
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
        w.execute("BEGIN IMMEDIATE")
        try:
            folded = sample_rollups.fold(w, run_id, width_s, cut, limit)
            w.execute("COMMIT")
        except BaseException:
            w.execute("ROLLBACK")
            raise
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
            with_phases = self._fold_phases(w, [run_id], keep_window=False)
            done["phases"] += with_phases
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


def rolled_spans(db, run_id: str) -> list[dict]:
    """Per rank: steps before `until` live only in the rollups (and exemplars)."""
    from .analysis import iso
    return [{"rank": rank, "until": iso(until_s), "until_s": until_s, "steps": steps}
            for rank, until_s, steps in db.execute(
                "SELECT rank, until_s, steps FROM rolled_spans WHERE run_id = ? ORDER BY rank", (run_id,))]


def samples_rolled(db, run_id: str) -> list[dict]:
    """Per rank: its host, GPU and worker samples before `until` are per-bucket aggregates
    (`events`: how many samples were folded), monitor/sample_rollups.py."""
    from .analysis import iso
    return [{"rank": rank, "until": iso(until_s), "until_s": until_s, "events": events}
            for rank, until_s, events in db.execute(
                "SELECT rank, until_s, events FROM rolled_samples WHERE run_id = ? ORDER BY rank", (run_id,))]


def recent_notes(db, limit: int = 5) -> list[dict]:
    """The latest coarsened or deleted runs (for the runs page's banner)."""
    from .analysis import iso
    return [{"t": iso(t), "run_id": run_id, "name": name, "action": action, "detail": detail}
            for t, run_id, name, action, detail in db.execute(
                "SELECT t, run_id, run_name, action, detail FROM retention_log ORDER BY t DESC LIMIT ?", (limit,))]


EXPORT_ROW_KEYS = ("rank", "loader", "epoch", "step", "start_ns", "wait_ns", "compute_ns", "other_ns",
                   "batch_size", "gpu_idle_ns", "kind", "bucket_s", "bucket_steps")


def export_rows(store, run_id: str, batch: int = 5000):
    """Every step of a run for the CSV export, in batches of tuples: Store.STEP_ROW_COLUMNS plus
    (kind, bucket_s, bucket_steps). A rolled-up span comes as its rollup buckets (kind "bucket":
    epoch is the bucket's first, step is empty, the times are the bucket's totals, batch_size its
    samples), then the exemplars kept raw inside it (kind "exemplar": already counted in their
    bucket), then the raw steps after it (kind "step")."""
    conn = sqlite3.connect(f"file:{store.path}?mode=ro", uri=True, check_same_thread=False)
    try:
        spans = dict(conn.execute("SELECT rank, until_s FROM rolled_spans WHERE run_id = ?", (run_id,)).fetchall())
        boundary_ns: dict[int, int] = {}
        for rank, until_s in spans.items():
            cursor = conn.execute(
                "SELECT rank, loader, epoch_min, NULL, second * 1000000000, wait_ns, compute_ns, other_ns, "
                "samples, CASE WHEN gpu_steps > 0 THEN gpu_idle_ns END, 'bucket', span_s, steps FROM rollups "
                "WHERE run_id = ? AND rank = ? AND second < ? ORDER BY second, loader", (run_id, rank, until_s))
            end_s = until_s
            while rows := cursor.fetchmany(batch):
                end_s = max(end_s, max(r[4] // 1_000_000_000 + r[11] for r in rows))
                yield rows
            boundary_ns[rank] = end_s * 1_000_000_000
        if spans:
            cursor = conn.execute(
                "SELECT rank, loader, epoch, step, start_ns, wait_ns, compute_ns, other_ns, batch_size, "
                "gpu_idle_ns, 'exemplar', NULL, NULL FROM step_exemplars WHERE run_id = ? ORDER BY start_ns",
                (run_id,))
            while rows := cursor.fetchmany(batch):
                yield rows
    finally:
        conn.close()
    for rows in store.step_rows(run_id, batch):
        # A raw row inside a rolled-up span (a late replay not folded yet) is in its bucket.
        kept = [(*r, "step", None, None) for r in rows if r[4] >= boundary_ns.get(r[0], 0)]
        if kept:
            yield kept
