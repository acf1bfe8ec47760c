"""Host, GPU and worker samples under the storage budget: bytes per sample raw and folded, and
how fast the real Store folds them (monitor/budget/sample_rollups.py).

    python benchmarks/sample_fold.py [--ranks 2] [--hours 6] [--cores 32] [--gpus 8] [--workers 8]
                                     [--quick] [--out PATH]

Each rank sends what the hooks' samplers send at their default cadence (samplers.py): a host
sample every 0.5 s (with its per-core CPU figures), a GPU sample every 1 s (one entry per
device), a worker snapshot every 1 s (each worker's state; a USS/PSS reading every 5 s), in
batches of 60 s through Store.ingest. Then the whole span is folded into 60 s buckets, then
600 s buckets (Retention.fold_samples, whole run): rows, bytes (SQLite's dbstat, after a
checkpoint; and after a VACUUM, which packs the pages), and the events folded per second. The
run's `system` overview and findings are compared before and after (`summary_unchanged`).
Figures go to benchmarks/results/sample_fold.json.
"""
from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import results_io  # noqa: E402

SECOND = 1_000_000_000
T0_S = 1_700_000_040  # a minute boundary


def batch(rank: int, seq: int, start_s: int, seconds: int, args) -> dict:
    samples, workers = [], []
    for half in range(2 * seconds):
        t_ns = start_s * SECOND + half * SECOND // 2
        i = (start_s - T0_S) * 2 + half
        samples.append({"kind": "host", "t_ns": t_ns, "interval_s": 0.5, "cpu_pct": 40.0 + i % 50,
                        "process_cpu_pct": 95.0 + i % 7, "cpu_per_core_pct": [float((i + c) % 100) for c in range(args.cores)],
                        "iowait_pct": (i % 9) * 0.5, "mem_available_bytes": 200_000_000_000 - (i % 97) * 10_000_000,
                        "mem_total_bytes": 256 * 2**30, "swap_in_bytes_per_s": 0.0, "swap_out_bytes_per_s": 0.0,
                        "disk_read_bytes_per_s": 1e7 * (i % 5), "disk_read_iops": 100.0 * (i % 5),
                        "process_rss_bytes": 8_000_000_000 + i, "shm_used_bytes": 2**26 * (1 + i % 4),
                        "shm_total_bytes": 2**34, "cpu_count": args.cores, "usable_cores": args.cores,
                        "cpu_quota_cores": None})
        if half % 2:
            continue
        second = start_s + half // 2
        samples.append({"kind": "gpu", "t_ns": t_ns + 1000, "devices": [
            {"name": "NVIDIA H100", "gpu_util_pct": float((i + d) % 100), "mem_used_bytes": 60e9 + d * 1e8 + i % 13,
             "mem_total_bytes": 80e9} for d in range(args.gpus)]})
        reading_s = second - second % 5
        served = (reading_s - T0_S) * 40
        workers.append({"t_ns": t_ns + 2000, "loader": "train", "configured_workers": args.workers,
                        "alive_workers": args.workers, "queue_depth": i % 4, "queue_capacity": 2 * args.workers,
                        "workers": [{"id": k, "pid": 5000 + 100 * rank + k, "state": "running", "batches": i + k,
                                     "load_ms_mean": 30.0 + k, "load_ms_interval": 30.0 + (i + k) % 5,
                                     "cpu_fraction": 0.8, "cpu_pct": 80.0 + (i + k) % 20, "rss_bytes": 2_000_000_000 + k,
                                     "uss_bytes": 300_000_000 + k, "pss_bytes": 500_000_000 + k,
                                     "mem_t_ns": reading_s * SECOND, "samples": served, "batch_bytes": 12_582_912}
                                    for k in range(args.workers)]})
    return {"schema": "starvewatch.events/1", "run_id": "samples", "rank": rank, "stream": f"h{rank}", "seq": seq,
            "run": {"id": "samples", "name": "samples", "started_at": T0_S, "rank": rank, "world_size": args.ranks},
            "samples": samples, "workers": workers}


def table_bytes(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT sum(pgsize) FROM dbstat WHERE name IN ('events', 'events_run')").fetchone()[0] or 0
    finally:
        conn.close()


def measure(store, db: Path, samples: int) -> dict:
    with store._write_lock:
        store._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    rows = store._writer.execute("SELECT count(*) FROM events").fetchone()[0]
    paged = table_bytes(db)
    return {"rows": rows, "bytes": paged, "bytes_per_sample": paged / samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--hours", type=float, default=6)
    parser.add_argument("--cores", type=int, default=32)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="1 rank, 1 hour")
    parser.add_argument("--out", type=Path, default=results_io.RESULTS / "sample_fold.json")
    args = parser.parse_args()
    if args.quick:
        args.ranks, args.hours = 1, 1
    from starvewatch.monitor.budget import retention
    from starvewatch.monitor.web.wire_models import EventBatch
    from starvewatch.monitor.storage.query import Query
    from starvewatch.monitor.storage.store import Store

    record = results_io.started(args, quick=args.quick)
    minutes = int(args.hours * 60)
    # Folding into 600 s buckets needs a run of 1,000 of them; hours stand for days here.
    retention.MIN_BUCKETS = max(1, minutes * 60 // 600)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "samples.db"
        store = Store(db, max_db_bytes=2**40)
        started = time.perf_counter()
        for minute in range(minutes):
            for rank in range(args.ranks):
                store.ingest(EventBatch.model_validate(batch(rank, minute + 1, T0_S + 60 * minute, 60, args)))
        ingest_s = time.perf_counter() - started
        samples = store._writer.execute("SELECT count(*) FROM events").fetchone()[0]
        query = Query(store)
        before = query.summary("samples")
        record["ingest"] = {"samples": samples, "seconds": ingest_s, "samples_per_s": samples / ingest_s}
        record["raw"] = measure(store, db, samples)
        for width in (60, 600):
            started = time.perf_counter()
            folded = 0
            with store._write_lock:
                while n := store.retention.fold_samples("samples", width, whole=True):
                    folded += n
            fold_s = time.perf_counter() - started
            record[f"folded_{width}s"] = {**measure(store, db, samples), "rows_folded": folded, "seconds": fold_s,
                                          "rows_folded_per_s": folded / fold_s if fold_s else None}
        after = Query(store).summary("samples")
        after.pop("samples_rolled_up", None)
        record["summary_unchanged"] = {key: before.get(key) == after.get(key)
                                       for key in ("system", "findings", "verdict", "recommendations")}
        store.close()
        conn = sqlite3.connect(db)
        conn.execute("VACUUM")
        conn.close()
        record["folded_600s"]["bytes_after_vacuum"] = table_bytes(db)
    raw, minute, ten = record["raw"], record["folded_60s"], record["folded_600s"]
    print(f"{samples:,} samples ({args.ranks} ranks x {args.hours} h) ingested at {samples / ingest_s:,.0f}/s; "
          f"bytes per sample raw {raw['bytes_per_sample']:.0f}, 60 s buckets {minute['bytes_per_sample']:.1f}, "
          f"600 s buckets {ten['bytes_per_sample']:.2f}; folded {minute['rows_folded_per_s']:,.0f} rows/s (60 s), "
          f"{ten['rows_folded_per_s']:,.0f} rows/s (600 s); summary unchanged: {record['summary_unchanged']}")
    results_io.write(record, args.out)


if __name__ == "__main__":
    main()
