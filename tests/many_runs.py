"""A store with many small runs, filled through the Store API (a second for 1,000 runs): the
runs page's test and benchmarks/dashboard.py. Run i is named job-(i % groups) and starts a
minute after run i-1; every fifth run is still live, every tenth has too few steps for a
verdict, and its wait per batch is (i % 7) ms against 5 ms of compute."""
from __future__ import annotations

import time

START_S = time.time() - 86_400  # a day ago: the newest run started 1,000 minutes later


def plan(i: int, groups: int) -> dict:
    return {"id": f"run-{i:04d}", "name": f"job-{i % groups}", "started_s": START_S + 60 * i,
            "live": i % 5 == 0, "steps": 10 if i % 10 == 9 else 20, "wait_ms": i % 7}


def seed_runs(store, n: int = 1000, groups: int = 20) -> list[dict]:
    """Store n runs; returns their plans (oldest first)."""
    from starvewatch.monitor.web.wire_models import EventBatch
    plans = [plan(i, groups) for i in range(n)]
    for p in plans:
        k, start_ns = p["steps"], int(p["started_s"] * 1e9)
        store.ingest(EventBatch.model_validate({
            "schema": "starvewatch.events/1", "run_id": p["id"], "stream": f"stream-{p['id']}", "seq": 1,
            "status": "live" if p["live"] else "finished",
            "run": {"id": p["id"], "name": p["name"], "started_at": p["started_s"]},
            "loaders": [{"name": "train", "config": {"num_workers": 0, "batch_size": 8},
                         "totals": {"steps": k, "epochs": 1, "wait_ns": k * p["wait_ms"] * 1_000_000,
                                    "compute_ns": k * 5_000_000, "samples": k * 8}}],
            "steps": {"loader": ["train"] * k, "epoch": [0] * k, "step": list(range(k)),
                      "start_ns": [start_ns + j * 10_000_000 for j in range(k)],
                      "wait_ns": [p["wait_ms"] * 1_000_000] * k, "compute_ns": [5_000_000] * k,
                      "other_ns": [0] * k, "batch_size": [8] * k, "gpu_idle_ns": [None] * k}}))
    return plans
