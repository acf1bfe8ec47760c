"""Reads of what the storage budget folded: which spans of a run are rollups only (steps and
samples), the latest coarsened or deleted runs (the runs page's banner), and every step of a
run for the CSV export with its rolled-up spans as marked buckets.

Its own module because these are the readers' side (query.py, the CSV export) of the tables the
budget writes (retention.py, raw_step_fold.py): they run on reader connections, never fold."""
from __future__ import annotations


def rolled_spans(db, run_id: str) -> list[dict]:
    """Per rank: steps before `until` live only in the rollups (and exemplars)."""
    from ...analysis.summary import iso
    return [{"rank": rank, "until": iso(until_s), "until_s": until_s, "steps": steps}
            for rank, until_s, steps in db.execute(
                "SELECT rank, until_s, steps FROM rolled_spans WHERE run_id = ? ORDER BY rank", (run_id,))]


def samples_rolled(db, run_id: str) -> list[dict]:
    """Per rank: its host, GPU and worker samples before `until` are per-bucket aggregates
    (`events`: how many samples were folded), monitor/budget/sample_rollups.py."""
    from ...analysis.summary import iso
    return [{"rank": rank, "until": iso(until_s), "until_s": until_s, "events": events}
            for rank, until_s, events in db.execute(
                "SELECT rank, until_s, events FROM rolled_samples WHERE run_id = ? ORDER BY rank", (run_id,))]


def recent_notes(db, limit: int = 5) -> list[dict]:
    """The latest coarsened or deleted runs (for the runs page's banner)."""
    from ...analysis.summary import iso
    return [{"t": iso(t), "run_id": run_id, "name": name, "action": action, "detail": detail}
            for t, run_id, name, action, detail in db.execute(
                "SELECT t, run_id, run_name, action, detail FROM retention_log ORDER BY t DESC LIMIT ?", (limit,))]


def export_rows(store, run_id: str, batch: int = 5000):
    """Every step of a run for the CSV export, in batches of tuples: Store.STEP_ROW_COLUMNS plus
    (kind, bucket_s, bucket_steps). A rolled-up span comes as its rollup buckets (kind "bucket":
    epoch is the bucket's first, step is empty, the times are the bucket's totals, batch_size its
    samples), then the exemplars kept raw inside it (kind "exemplar": already counted in their
    bucket), then the raw steps after it (kind "step")."""
    conn = store.read_only_connection()
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
