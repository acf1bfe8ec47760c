"""Rank-summed rollups (`run_rollups`): the per-rank `rollups` added over ranks, kept at ingest
and when folding, so run-wide charts read thousands of rows, not millions.

One row per (run, loader, second) holds the sums of every per-rank row with that key, the
maxima and epoch bounds, the widest tier among them (`span_s`), and which ranks it covers
(`ranks`: a bitmap, little-endian bytes, bit r for rank r). Everything is mergeable: sums add,
extremes keep their extremes, bitmaps OR, so a chart drawn from it equals the per-rank sum.
"""
from __future__ import annotations

DDL = """
CREATE TABLE IF NOT EXISTS run_rollups (
    run_id TEXT NOT NULL, loader TEXT NOT NULL, second INTEGER NOT NULL, span_s INTEGER NOT NULL,
    steps INTEGER NOT NULL, wait_ns INTEGER NOT NULL, compute_ns INTEGER NOT NULL,
    other_ns INTEGER NOT NULL, samples INTEGER NOT NULL, gpu_idle_ns INTEGER NOT NULL,
    gpu_steps INTEGER NOT NULL, wait_max_ns INTEGER NOT NULL, epoch_min INTEGER NOT NULL,
    epoch_max INTEGER NOT NULL, ranks BLOB NOT NULL, PRIMARY KEY (run_id, loader, second)) WITHOUT ROWID;
"""

COLUMNS = ("run_id, loader, second, span_s, steps, wait_ns, compute_ns, other_ns, samples, gpu_idle_ns, "
           "gpu_steps, wait_max_ns, epoch_min, epoch_max, ranks")

# An upsert adds a row into the one with its key.
MERGE = ("ON CONFLICT(run_id, loader, second) DO UPDATE SET steps = steps + excluded.steps, "
         "wait_ns = wait_ns + excluded.wait_ns, compute_ns = compute_ns + excluded.compute_ns, "
         "other_ns = other_ns + excluded.other_ns, samples = samples + excluded.samples, "
         "gpu_idle_ns = gpu_idle_ns + excluded.gpu_idle_ns, gpu_steps = gpu_steps + excluded.gpu_steps, "
         "wait_max_ns = max(wait_max_ns, excluded.wait_max_ns), "
         "epoch_min = min(epoch_min, excluded.epoch_min), epoch_max = max(epoch_max, excluded.epoch_max), "
         "span_s = max(span_s, excluded.span_s), ranks = rank_set_union(ranks, excluded.ranks)")


def rank_bit(rank: int) -> bytes:
    value = 1 << rank
    return value.to_bytes((value.bit_length() + 7) // 8, "little")


def _union(a: bytes, b: bytes) -> bytes:
    value = int.from_bytes(a, "little") | int.from_bytes(b, "little")
    return value.to_bytes((value.bit_length() + 7) // 8, "little")


class _RankSet:
    """Aggregate: the union of rank bitmaps."""

    def __init__(self) -> None:
        self.value = 0

    def step(self, ranks) -> None:
        if ranks is not None:
            self.value |= int.from_bytes(ranks, "little")

    def finalize(self) -> bytes:
        return self.value.to_bytes((self.value.bit_length() + 7) // 8, "little")


class _RankCount(_RankSet):
    """Aggregate: how many distinct ranks the bitmaps cover."""

    def finalize(self) -> int:
        return bin(self.value).count("1")


class _RankOf(_RankSet):
    """Aggregate over plain rank numbers: their bitmap."""

    def step(self, rank) -> None:
        self.value |= 1 << rank


def register(conn) -> None:
    """The functions the table's SQL uses, on every connection that reads or writes it."""
    conn.create_function("rank_set_union", 2, _union, deterministic=True)
    conn.create_aggregate("rank_set", 1, _RankSet)
    conn.create_aggregate("rank_set_count", 1, _RankCount)
    conn.create_aggregate("rank_set_of", 1, _RankOf)


def migrate(w) -> None:
    """Create the table; a database from before it gets it filled from its per-rank rollups."""
    if w.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'run_rollups'").fetchone():
        return
    w.execute("BEGIN IMMEDIATE")
    try:
        w.execute(DDL)
        w.execute(f"INSERT INTO run_rollups ({COLUMNS}) SELECT run_id, loader, second, max(span_s), sum(steps), "
                  "sum(wait_ns), sum(compute_ns), sum(other_ns), sum(samples), sum(gpu_idle_ns), sum(gpu_steps), "
                  "max(wait_max_ns), min(epoch_min), max(epoch_max), rank_set_of(rank) FROM rollups "
                  "GROUP BY run_id, loader, second")
        w.execute("COMMIT")
    except BaseException:
        w.execute("ROLLBACK")
        raise


def coarsen(w, run_id: str, width_s: int, cut_s: int) -> None:
    """Retention.coarsen's step on this table, inside its transaction: rows finer than width_s
    before cut_s merge into width_s buckets, as the per-rank rows did."""
    w.execute("CREATE TEMP TABLE IF NOT EXISTS coarse_run AS SELECT * FROM run_rollups WHERE 0")
    w.execute("DELETE FROM temp.coarse_run")
    w.execute(f"INSERT INTO temp.coarse_run ({COLUMNS}) SELECT run_id, loader, second / ? * ?, ?, sum(steps), "
              "sum(wait_ns), sum(compute_ns), sum(other_ns), sum(samples), sum(gpu_idle_ns), sum(gpu_steps), "
              "max(wait_max_ns), min(epoch_min), max(epoch_max), rank_set(ranks) FROM run_rollups "
              "WHERE run_id = ? AND span_s < ? AND second < ? GROUP BY run_id, loader, second / ?",
              (width_s, width_s, width_s, run_id, width_s, cut_s, width_s))
    w.execute("DELETE FROM run_rollups WHERE run_id = ? AND span_s < ? AND second < ?", (run_id, width_s, cut_s))
    w.execute(f"INSERT INTO run_rollups ({COLUMNS}) SELECT {COLUMNS} FROM temp.coarse_run WHERE true " + MERGE)
