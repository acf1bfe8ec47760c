"""Dashboard performance: a 1M-step run page, and ingest under 10 polling clients.

    python benchmarks/dashboard.py [--steps 1000000] [--seconds 10] [--quick] [--out PATH]

1. Seeds a store directly with a run of --steps steps, starts the collector on it, and opens
   the run page in headless Chromium: time until the KPIs and the step timeline are drawn
   (target: interactive within 2 s).
2. Runs the ingest producer of benchmarks/ingest.py while 10 clients poll the run page's data
   (summary, step series, rollup series, samples, workers) once a second: records/s ingested
   (target: the collector's 100,000 records/s).
Figures also go to benchmarks/results/dashboard.json; --quick (20,000 steps, 3 s of ingest) is a
smoke run, marked "quick" there.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import results_io  # noqa: E402
from benchmarks.ingest import PRODUCER, running_collector  # noqa: E402


def seed(db: Path, steps: int) -> str:
    from starvewatch.monitor.models import EventBatch
    from starvewatch.monitor.store import Store
    store = Store(db)
    run_id, batch, start = "big-run", 20_000, time.time_ns() - steps * 10_000_000
    for seq, first in enumerate(range(0, steps, batch), 1):
        n = min(batch, steps - first)
        payload = {"schema": "starvewatch.events/1", "run_id": run_id, "stream": "s", "seq": seq,
                   "status": "finished" if first + n >= steps else "live",
                   "run": {"id": run_id, "name": "one-million-steps", "started_at": start / 1e9},
                   "loaders": [{"name": "train", "config": {"num_workers": 2, "batch_size": 64,
                                                            "prefetch_factor": 2, "persistent_workers": True,
                                                            "pin_memory": False},
                                "totals": {"steps": first + n, "epochs": 10, "wait_ns": (first + n) * 3_000_000,
                                           "compute_ns": (first + n) * 7_000_000, "samples": (first + n) * 64}}],
                   "steps": {"loader": ["train"] * n, "epoch": [(first + i) * 10 // steps for i in range(n)],
                             "step": [(first + i) % (steps // 10) for i in range(n)],
                             "start_ns": [start + (first + i) * 10_000_000 for i in range(n)],
                             "wait_ns": [1_000_000 + (first + i) % 5_000_000 for i in range(n)],
                             "compute_ns": [7_000_000] * n, "other_ns": [0] * n, "batch_size": [64] * n,
                             "gpu_idle_ns": [None] * n}}
        store.ingest(EventBatch.model_validate(payload))
    store.close()
    return run_id


def page_time(url: str) -> float:
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page()
        page.goto(url.rsplit("/runs/", 1)[0] + "/")  # warm the browser cache with Dash's bundles
        page.wait_for_selector("#runs-container")
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            page.goto(url)
            page.wait_for_selector("#kpi-steps .value")
            page.wait_for_selector("#timeline-graph .scatterlayer .trace")
            best = min(best, time.perf_counter() - t0)
        browser.close()
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=None, help="steps of the seeded run (1,000,000; 20,000 with --quick)")
    parser.add_argument("--seconds", type=float, default=None, help="ingest under polling (10 s; 3 s with --quick)")
    parser.add_argument("--quick", action="store_true", help="a small run and 3 s of ingest, for a smoke run")
    parser.add_argument("--out", type=Path, default=results_io.RESULTS / "dashboard.json")
    args = parser.parse_args()
    if args.steps is None:
        args.steps = 20_000 if args.quick else 1_000_000
    if args.seconds is None:
        args.seconds = 3.0 if args.quick else 10.0
    record = results_io.started(args, quick=args.quick or args.steps < 1_000_000 or args.seconds < 10.0)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        run_id = seed(Path(tmp) / "starvewatch.db", args.steps)
        record["seed"] = {"steps": args.steps, "seconds": time.perf_counter() - t0}
        print(f"seeded {args.steps:,} steps in {record['seed']['seconds']:.1f} s")
        with running_collector(tmp) as (url, env):
            record["api_ms"] = {}
            for path in ("summary", "steps/series?loader=train&points=1000", "series?points=300"):
                t = time.perf_counter()
                urllib.request.urlopen(f"{url}/api/v1/runs/{run_id}/{path}", timeout=60).read()
                record["api_ms"][path] = 1000 * (time.perf_counter() - t)
                print(f"  GET {path}: {record['api_ms'][path]:.0f} ms")
            page_s = page_time(f"{url}/runs/{run_id}")
            record["page"] = {"steps": args.steps, "seconds": page_s, "target_s": 2.0}
            print(f"run page of a {args.steps:,}-step run interactive in {page_s:.2f} s "
                  f"(target <= 2 s; best of 3, Dash bundles cached)")

            stop = threading.Event()
            polls = [0]

            def client():
                paths = ["summary", "steps/series?loader=train&points=1000", "series?points=300",
                         "events/samples?limit=5000", "events/workers?limit=2000"]
                while not stop.is_set():
                    t = time.monotonic()
                    for p in paths:
                        urllib.request.urlopen(f"{url}/api/v1/runs/{run_id}/{p}", timeout=60).read()
                        polls[0] += 1
                    stop.wait(max(0.0, 1.0 - (time.monotonic() - t)))

            threads = [threading.Thread(target=client, daemon=True) for _ in range(10)]
            for th in threads:
                th.start()
            out = subprocess.run([sys.executable, "-c", PRODUCER, url, str(args.seconds), "20000"], env=env,
                                 capture_output=True, text=True, check=True)
            stop.set()
            for th in threads:
                th.join(30)
            result = json.loads(out.stdout)
            rate = result["records"] / result["seconds"]
            record["polled_ingest"] = {"clients": len(threads), "records": result["records"],
                                       "seconds": result["seconds"], "records_per_s": rate, "polls": polls[0],
                                       "target_records_per_s": 100_000}
            print(f"ingest with 10 clients polling the run page's data: "
                  f"{rate:,.0f} records/s ({polls[0]} polls served; target >= 100,000)")
    results_io.write(record, args.out)


if __name__ == "__main__":
    main()
