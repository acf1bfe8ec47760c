"""Stage 2 of the storage budget: merge a run's per-rank rollup rows (and its run-wide rollups)
into a coarser tier bucket, in one transaction.

Its own module because the merge is pure bookkeeping of mergeable rows (sums add, maxima and
epoch bounds keep their extremes, bands merge as rollup_bands says); which tier and which span
to merge is the budget's policy (retention.py: TIERS_S, MIN_BUCKETS, TIER_KEEP_RECENT_S)."""
from __future__ import annotations

from . import rollup_bands, rollup_merge, run_rollups
from ..storage.write_transaction import immediate_transaction


def coarsen_rollups(w, run_id: str, width_s: int, before_s: int | None = None) -> int:
    """Merge a run's rollup rows finer than width_s (and before before_s) into width_s buckets;
    returns how many rows were merged. Sums add, maxima and epoch bounds keep their extremes."""
    lo, hi = w.execute("SELECT min(second), max(second) FROM rollups WHERE run_id = ?", (run_id,)).fetchone()
    if lo is None:
        return 0
    cut = hi + 1 if before_s is None else before_s
    cut = cut // width_s * width_s  # a bucket never straddles the cut
    with immediate_transaction(w):
        w.execute("CREATE TEMP TABLE IF NOT EXISTS coarse AS SELECT * FROM rollups WHERE 0")
        w.execute("DELETE FROM temp.coarse")
        w.execute("INSERT INTO temp.coarse SELECT run_id, rank, loader, second / ? * ?, sum(steps), sum(wait_ns), "
                  "sum(compute_ns), sum(other_ns), sum(samples), sum(gpu_idle_ns), sum(gpu_steps), "
                  "max(wait_max_ns), min(epoch_min), max(epoch_max), ?, " + rollup_bands.AGGREGATES + " FROM rollups "
                  "WHERE run_id = ? AND span_s < ? AND second < ? GROUP BY run_id, rank, loader, second / ?",
                  (width_s, width_s, width_s, run_id, width_s, cut, width_s))
        merged = w.execute("DELETE FROM rollups WHERE run_id = ? AND span_s < ? AND second < ?",
                           (run_id, width_s, cut)).rowcount
        w.execute("INSERT INTO rollups SELECT * FROM temp.coarse WHERE true " + rollup_merge.ON_CONFLICT_ADD
                  + "span_s = max(span_s, excluded.span_s), " + rollup_bands.MERGE)
        run_rollups.coarsen(w, run_id, width_s, cut)
    return merged
