"""How two per-rank rollup rows of one bucket merge, as an upsert's SQL: sums add, the greatest
wait and the epoch bounds keep their extremes (the bands' columns: rollup_bands.MERGE).

Its own module because two writers must merge alike: the ingest adding a batch's per-second
rows (step_ingest.py) and the storage budget's coarsening into tiers (rollup_tiers.py), which
appends its own `span_s` clause. One text, so the two cannot drift apart.
"""
from __future__ import annotations

# Ends with ", ": the caller appends its further SET clauses (rollup_bands.MERGE last).
ON_CONFLICT_ADD = (
    "ON CONFLICT(run_id, loader, rank, second) DO UPDATE SET steps = steps + excluded.steps, "
    "wait_ns = wait_ns + excluded.wait_ns, compute_ns = compute_ns + excluded.compute_ns, "
    "other_ns = other_ns + excluded.other_ns, samples = samples + excluded.samples, "
    "gpu_idle_ns = gpu_idle_ns + excluded.gpu_idle_ns, gpu_steps = gpu_steps + excluded.gpu_steps, "
    "wait_max_ns = max(wait_max_ns, excluded.wait_max_ns), "
    "epoch_min = min(epoch_min, excluded.epoch_min), epoch_max = max(epoch_max, excluded.epoch_max), ")
