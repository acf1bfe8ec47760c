"""A month-long job under the storage budget: 30 days, 64 ranks, 10 steps/s per rank.

    python benchmarks/long_run.py [--days 30] [--ranks 64] [--budget 4GiB] [--ingest-seconds 60]
                                  [--quick] [--out PATH]

The job makes 1.66 billion steps; the real ingest path would need hours for them, so time is
compressed (the whole script takes well under 20 minutes; --quick, about one):

1. Real path, scaled down: a real collector (uvicorn subprocess) with a small budget (--fold-budget,
   so folding runs all along) takes the job's batches (each rank's steps of 5 s, one POST per rank
   and batch, gzip JSON) from a producer process for --ingest-seconds: steps/s ingested with
   folding, extrapolated to one simulated day. Then, in this process, the real Store folds a
   freshly ingested span (Retention.enforce): steps folded per second. Bytes per step are read
   from SQLite's dbstat: raw (steps + step_blocks), per-second rollups, per-minute rollups.
2. Steady state written directly: the database the budget leaves at the end of the 30 days
   (per-minute rollups for all but the last hour, per-second rollups for the last hour, per rank
   and summed over ranks, the
   rolled-up spans, and raw rows of the latest steps up to LOW_WATER of the budget), with the
   run's exact totals and histograms. A real collector opens it: summary latency (computed, then
   cached), the run page in headless Chromium until its charts are drawn (benchmarks/dashboard.py),
   and the collector's resident memory.
Figures go to benchmarks/results/long_run.json (docs/reliability.md quotes them).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import results_io  # noqa: E402
from benchmarks.ingest import free_port, wait_up  # noqa: E402

STEPS_PER_S = 10
SHIP_S = 5           # each rank's batch holds its steps of this many seconds
WAIT_NS, COMPUTE_NS = 3_000_000, 97_000_000  # a 100 ms step, 3% input wait

PRODUCER = r"""
import gzip, json, sys, time, urllib.request
url, seconds, ranks, steps_per_s, ship_s = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
n = steps_per_s * ship_s
t0_ns = time.time_ns()
sent = requests = 0
seq = 0
deadline = time.monotonic() + seconds
started = time.monotonic()
while time.monotonic() < deadline:
    seq += 1
    for rank in range(ranks):
        first = (seq - 1) * n
        body = {"schema": "starvewatch.events/1", "run_id": "long-job", "rank": rank, "stream": f"host{rank}-1-{rank:04x}",
                "seq": seq, "status": "live",
                "run": {"id": "long-job", "name": "thirty-days", "started_at": t0_ns / 1e9, "rank": rank, "world_size": ranks},
                "loaders": [{"name": "train", "config": {"num_workers": 8}, "totals": {"steps": first + n, "epochs": 1,
                             "wait_ns": (first + n) * 3_000_000, "compute_ns": (first + n) * 97_000_000}}],
                "steps": {"loader": ["train"] * n, "epoch": [0] * n, "step": list(range(first, first + n)),
                          "start_ns": [t0_ns + (first + i) * 100_000_000 for i in range(n)],
                          "wait_ns": [2_000_000 + (first + i) * 7919 % 2_000_000 for i in range(n)],
                          "compute_ns": [97_000_000] * n, "other_ns": [0] * n, "batch_size": [64] * n,
                          "gpu_idle_ns": [None] * n}}
        req = urllib.request.Request(url + "/api/v1/ingest", data=gzip.compress(json.dumps(body).encode(), 1),
                                     headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        urllib.request.urlopen(req, timeout=120).read()
        sent += n
        requests += 1
print(json.dumps({"steps": sent, "requests": requests, "seconds": time.monotonic() - started}))
"""


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Collector:
    def __init__(self, directory: Path, budget: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, STARVEWATCH_AUTOSTART="0", STARVEWATCH_QUIET="1")
        self.log = open(directory / "collector.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "starvewatch", "serve", "--port", str(self.port),
                                     "--dir", str(directory), "--max-db-size", budget],
                                    env=env, stdout=self.log, stderr=self.log)
        wait_up(self.url)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)
        self.log.close()


def table_bytes(db: Path) -> dict[str, int]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return dict(conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").fetchall())
    finally:
        conn.close()


def page_time(url: str, timeout_s: float = 180.0) -> float:
    """benchmarks/dashboard.py's measure (Dash bundles cached, until the KPIs and the step
    timeline are drawn, best of 2) with a longer timeout: a slow page is measured, not cut."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page()
        page.set_default_timeout(timeout_s * 1000)
        page.goto(url.rsplit("/runs/", 1)[0] + "/")
        page.wait_for_selector("#runs-container")
        best = float("inf")
        for _ in range(2):
            t0 = time.perf_counter()
            page.goto(url)
            page.wait_for_selector("#kpi-steps .value")
            # Drawn, not "visible": Playwright calls a flat line's trace (steady data) invisible,
            # its bounding box having no height.
            page.wait_for_selector("#timeline-graph .scatterlayer .trace", state="attached")
            best = min(best, time.perf_counter() - t0)
        browser.close()
    return best


def real_path(tmp: Path, args, record: dict) -> None:
    """Ingest with folding through a real collector, then a timed fold in this process."""
    from starvewatch.monitor.budget.retention import file_bytes
    directory = tmp / "ingest"
    directory.mkdir()
    collector = Collector(directory, args.fold_budget)
    try:
        out = subprocess.run([sys.executable, "-c", PRODUCER, collector.url, str(args.ingest_seconds),
                              str(args.ranks), str(STEPS_PER_S), str(SHIP_S)], capture_output=True, text=True,
                             check=True)
        produced = json.loads(out.stdout)
        rss = rss_bytes(collector.proc.pid)
        summary = json.loads(urllib.request.urlopen(f"{collector.url}/api/v1/runs/long-job/summary", timeout=120).read())
    finally:
        collector.close()
    rate = produced["steps"] / produced["seconds"]
    day_steps = args.ranks * STEPS_PER_S * 86_400
    stored = sum(loader["steps"] for loader in summary["loaders"])
    record["ingest"] = {
        "steps": produced["steps"], "requests": produced["requests"], "seconds": produced["seconds"],
        "steps_per_s": rate, "requests_per_s": produced["requests"] / produced["seconds"],
        "steps_per_batch": STEPS_PER_S * SHIP_S, "budget": args.fold_budget,
        "db_bytes_at_end": file_bytes(directory / "starvewatch.db"), "steps_in_summary": stored,
        "job_steps_per_s": args.ranks * STEPS_PER_S,
        "seconds_per_simulated_day": day_steps / rate, "collector_rss_bytes": rss}
    print(f"ingest with folding (budget {args.fold_budget}): {rate:,.0f} steps/s "
          f"({record['ingest']['requests_per_s']:.0f} requests/s); one simulated day of the job "
          f"({day_steps / 1e6:.1f} M steps) takes {day_steps / rate / 60:.0f} min; collector RSS {rss / 2**20:.0f} MiB")

    # Folding throughput and bytes per step, on the real Store: ingest raw, then fold it.
    from starvewatch.monitor.web.wire_models import EventBatch
    from starvewatch.monitor.storage.store import Store
    db = tmp / "fold.db"
    store = Store(db, max_db_bytes=2**40)
    store.retention.raw_window_steps = 1000
    n = STEPS_PER_S * SHIP_S * 20  # 1,000 steps per batch
    # On a minute boundary: the per-minute figure below must not depend on when the script runs.
    t0 = time.time_ns() // 60_000_000_000 * 60_000_000_000
    steps = 0
    for seq in range(1, args.fold_batches + 1):
        for rank in range(args.ranks):
            first = (seq - 1) * n
            store.ingest(EventBatch.model_validate({
                "schema": "starvewatch.events/1", "run_id": "fold", "rank": rank, "stream": f"s{rank}", "seq": seq,
                "run": {"id": "fold", "name": "fold", "started_at": t0 / 1e9, "rank": rank},
                "steps": {"loader": ["train"] * n, "epoch": [0] * n, "step": list(range(first, first + n)),
                          "start_ns": [t0 + (first + i) * 100_000_000 for i in range(n)],
                          "wait_ns": [2_000_000 + (first + i) * 7919 % 2_000_000 for i in range(n)],
                          "compute_ns": [97_000_000] * n, "other_ns": [0] * n, "batch_size": [64] * n,
                          "gpu_idle_ns": [None] * n}}))
            steps += n
    with store._write_lock:
        store._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    sizes = table_bytes(db)
    raw_bytes = sizes.get("steps", 0) + sizes.get("step_blocks", 0)
    per_second_bytes = sizes.get("rollups", 0)
    store.retention.max_bytes = max(1_000_000, file_bytes(db) // 10)
    started = time.perf_counter()
    done = store.retention.enforce_now()
    fold_s = time.perf_counter() - started
    with store._write_lock:
        # The whole span, its last partial minute included (as for an ended run): coarsen() never
        # cuts a bucket, so by default the seconds after the last minute boundary stay per-second
        # rows (0 to 59 per rank, depending on the start time's place in its minute), which made
        # this figure vary 0.15 - 0.40 bytes per step between runs.
        last_s = store._writer.execute("SELECT max(second) FROM rollups WHERE run_id = 'fold'").fetchone()[0]
        minute = store.retention.coarsen("fold", 60, before_s=last_s + 60)
        minute_rows = store._writer.execute("SELECT count(*) FROM rollups WHERE run_id = 'fold'").fetchone()[0]
    store.close()
    per_minute_bytes = table_bytes(db).get("rollups", 0)
    record["fold"] = {"steps": steps, "folded_steps": done["steps"], "seconds": fold_s,
                      "steps_per_s": done["steps"] / fold_s if fold_s else None, "rollup_rows_merged": minute,
                      "bytes_per_step_raw": raw_bytes / steps,
                      "bytes_per_step_per_second_rollups": per_second_bytes / steps,
                      "bytes_per_step_per_minute_rollups": per_minute_bytes / steps,
                      "per_minute_rollup_rows": minute_rows}
    print(f"fold: {done['steps']:,} raw steps folded in {fold_s:.2f} s ({record['fold']['steps_per_s']:,.0f} steps/s); "
          f"bytes per step: raw {raw_bytes / steps:.1f}, per-second rollups {per_second_bytes / steps:.2f}, "
          f"per-minute rollups {per_minute_bytes / steps:.3f}")


def steady_state(tmp: Path, args, record: dict) -> None:
    """The database at the end of the job, written directly; then timed through a collector."""
    from starvewatch.monitor.web.wire_models import EventBatch
    from starvewatch.monitor.budget.retention import LOW_WATER, file_bytes, parse_size
    from starvewatch.monitor.storage.store import Store
    from starvewatch.stats import RecordStats
    budget = parse_size(args.budget)
    directory = tmp / "steady"
    directory.mkdir()
    db = directory / "starvewatch.db"
    started = time.perf_counter()
    end_s = int(time.time())
    length_s = int(args.days * 86_400)
    start_s = end_s - length_s
    per_rank = length_s * STEPS_PER_S
    store = Store(db, max_db_bytes=budget)
    # Runs, streams and loaders through the real ingest (one small batch per rank) ...
    sample = RecordStats()
    waits = [2_000_000 + i * 7919 % 2_000_000 for i in range(10_000)]
    sample.add_columns(list(range(1, 10_001)), waits, [COMPUTE_NS] * 10_000, [None] * 10_000, vectorized=True)
    for rank in range(args.ranks):
        store.ingest(EventBatch.model_validate({
            "schema": "starvewatch.events/1", "run_id": "long-job", "rank": rank, "stream": f"host{rank}-1-{rank:04x}",
            "seq": 1, "status": "live",
            "run": {"id": "long-job", "name": "thirty-days", "started_at": start_s, "rank": rank,
                    "world_size": args.ranks},
            "loaders": [{"name": "train", "config": {"num_workers": 8}, "totals": {
                "steps": per_rank, "epochs": 30, "wait_ns": per_rank * WAIT_NS, "compute_ns": per_rank * COMPUTE_NS}}],
            "steps": {"loader": ["train"], "epoch": [0], "step": [0], "start_ns": [start_s * 10**9],
                      "wait_ns": [WAIT_NS], "compute_ns": [COMPUTE_NS], "other_ns": [0], "batch_size": [64],
                      "gpu_idle_ns": [None]}}))
    # ... then the whole month's histograms (each rank's 25.9 M steps, the sample's shape).
    scale = per_rank // 10_000
    stats = sample.to_dict()
    for part in ("wait", "compute", "first_wait"):
        h = stats[part]
        h["counts"] = {k: v * scale for k, v in h["counts"].items()}
        h["count"], h["total"] = h["count"] * scale, h["total"] * scale
    w = store._writer
    with store._write_lock:
        w.execute("BEGIN")
        w.execute("UPDATE loaders SET stats = ?", (json.dumps(stats),))
        w.execute("DELETE FROM steps")
        w.execute("DELETE FROM step_blocks")
        w.execute("DELETE FROM rollups")
        recent_s = 3600
        minute_rows = (length_s - recent_s) // 60
        # Per-minute rollups for all but the last hour, per-second for the last hour.
        w.execute("WITH RECURSIVE i(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM i WHERE n + 1 < ?), "
                  "r(rank) AS (SELECT 0 UNION ALL SELECT rank + 1 FROM r WHERE rank + 1 < ?) "
                  "INSERT INTO rollups SELECT 'long-job', rank, 'train', ? + n * 60, 600, 600 * ?, 600 * ?, 0, "
                  "600 * 64, 0, 0, 4000000, 0, 0, 60, ?, ?, ? FROM i, r",  # then wait min, compute min, max
                  (minute_rows, args.ranks, start_s, WAIT_NS, COMPUTE_NS, WAIT_NS, COMPUTE_NS, COMPUTE_NS))
        w.execute("WITH RECURSIVE i(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM i WHERE n + 1 < ?), "
                  "r(rank) AS (SELECT 0 UNION ALL SELECT rank + 1 FROM r WHERE rank + 1 < ?) "
                  "INSERT INTO rollups SELECT 'long-job', rank, 'train', ? + n, 10, 10 * ?, 10 * ?, 0, "
                  "640, 0, 0, 4000000, 0, 0, 1, ?, ?, ? FROM i, r",
                  (recent_s, args.ranks, end_s - recent_s, WAIT_NS, COMPUTE_NS, WAIT_NS, COMPUTE_NS, COMPUTE_NS))
        # The same rows summed over ranks (run_rollups.py), as ingest and folding keep them.
        all_ranks = ((1 << args.ranks) - 1).to_bytes((args.ranks + 7) // 8, "little")
        w.execute("DELETE FROM run_rollups")
        w.execute("WITH RECURSIVE i(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM i WHERE n + 1 < ?) "
                  "INSERT INTO run_rollups SELECT 'long-job', 'train', ? + n * 60, 60, 600 * ?, 600 * ? * ?, "
                  "600 * ? * ?, 0, 600 * 64 * ?, 0, 0, 4000000, 0, 0, ? FROM i",
                  (minute_rows, start_s, args.ranks, args.ranks, WAIT_NS, args.ranks, COMPUTE_NS, args.ranks,
                   all_ranks))
        w.execute("WITH RECURSIVE i(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM i WHERE n + 1 < ?) "
                  "INSERT INTO run_rollups SELECT 'long-job', 'train', ? + n, 1, 10 * ?, 10 * ? * ?, 10 * ? * ?, 0, "
                  "640 * ?, 0, 0, 4000000, 0, 0, ? FROM i",
                  (recent_s, end_s - recent_s, args.ranks, args.ranks, WAIT_NS, args.ranks, COMPUTE_NS, args.ranks,
                   all_ranks))
        w.execute("COMMIT")
    store.retention._reclaim()
    rollup_bytes = file_bytes(db)
    # Raw rows of the latest steps up to the budget, in the shape the shipper gives them (blocks
    # of one rank's 5 s of steps); then the real fold takes the file down to LOW_WATER of it.
    raw_target = budget - rollup_bytes
    raw_steps = max(0, int(raw_target / args.raw_bytes_per_step))
    block = STEPS_PER_S * SHIP_S
    raw_steps -= raw_steps % (block * args.ranks)
    raw_span_s = raw_steps // (args.ranks * STEPS_PER_S)
    raw_from_ns = (end_s - raw_span_s) * 10**9
    with store._write_lock:
        w.execute("BEGIN")
        w.execute("WITH RECURSIVE i(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM i WHERE n + 1 < ?) "
                  "INSERT INTO steps SELECT 'long-job', (n / ?) % ?, 'train', 29, "
                  "? + ((n / ?) / ?) * ? + n % ?, "
                  "? + (((n / ?) / ?) * ? + n % ?) * 100000000, 2000000 + n * 7919 % 2000000, ?, 0, 64, NULL FROM i",
                  (raw_steps, block, args.ranks, per_rank - raw_steps // args.ranks, block, args.ranks, block, block,
                   raw_from_ns, block, args.ranks, block, block, COMPUTE_NS))
        w.execute("WITH RECURSIVE b(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM b WHERE k + 1 < ?) "
                  "INSERT INTO step_blocks SELECT 'long-job', 1 + k * ?, k * ? + ? FROM b",
                  (raw_steps // block, block, block, block))
        w.executemany("INSERT INTO rolled_spans VALUES ('long-job', ?, ?, ?)",
                      [(rank, end_s - raw_span_s, per_rank - raw_steps // args.ranks) for rank in range(args.ranks)])
        w.execute("COMMIT")
    store.retention._reclaim()
    filled = file_bytes(db)
    t = time.perf_counter()
    store.retention.max_bytes = min(budget, int(filled / 1.02))  # just past the budget, as an ingest finds it
    folded = store.retention.enforce_now()
    fold_at_size_s = time.perf_counter() - t
    store.close()
    size = file_bytes(db)
    written_s = time.perf_counter() - started
    record["steady_state"] = {
        "days": args.days, "ranks": args.ranks, "steps": per_rank * args.ranks, "budget": args.budget,
        "budget_bytes": budget, "db_bytes": size, "rollup_bytes": rollup_bytes, "raw_steps": raw_steps,
        "raw_span_s": raw_span_s, "rollup_rows": minute_rows * args.ranks + recent_s * args.ranks,
        "run_rollup_rows": minute_rows + recent_s,
        "bytes_per_step_overall": size / (per_rank * args.ranks), "written_in_s": written_s,
        "filled_bytes": filled, "fold_at_size": {**folded, "seconds": fold_at_size_s}, "low_water": LOW_WATER}
    print(f"steady state: {per_rank * args.ranks / 1e9:.2f} G steps in {size / 2**30:.2f} GiB "
          f"(budget {args.budget}; rollups {rollup_bytes / 2**20:.0f} MiB, raw window {raw_steps / 1e6:.1f} M steps = "
          f"the last {raw_span_s / 3600:.1f} h before the fold); a fold from {filled / 2**30:.2f} GiB took "
          f"{fold_at_size_s:.1f} s ({folded['steps'] / 1e6:.1f} M steps); written in {written_s:.0f} s")

    collector = Collector(directory, args.budget)
    try:
        rss_start = rss_bytes(collector.proc.pid)
        # The first call computes the summary (the run's data has not moved since: later calls
        # are answered from the query cache, shown as "cached").
        timings = []
        for _ in range(3):
            t = time.perf_counter()
            summary = json.loads(urllib.request.urlopen(f"{collector.url}/api/v1/runs/long-job/summary",
                                                        timeout=300).read())
            timings.append(time.perf_counter() - t)
        assert summary["loaders"][0]["steps"] == per_rank * args.ranks, summary["loaders"][0]["steps"]
        api_s = {}
        for path in ("steps/series?loader=train&points=1000", "series?points=300", "summary?rank=0"):
            t = time.perf_counter()
            urllib.request.urlopen(f"{collector.url}/api/v1/runs/long-job/{path}", timeout=300).read()
            api_s[path] = time.perf_counter() - t
        print("  API: " + ", ".join(f"{p} {v:.2f} s" for p, v in api_s.items()))
        try:
            page_s, page_error = page_time(f"{collector.url}/runs/long-job"), None
        except Exception as exc:  # a page past the 3-minute timeout is a figure too
            page_s, page_error = None, f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        rss_end = rss_bytes(collector.proc.pid)
        size_after = file_bytes(db)
    finally:
        collector.close()
    record["steady_state"].update(
        summary_s=timings[0], summary_s_cached=min(timings[1:]), summary_target_s=1.0,
        run_page_s=page_s, run_page_error=page_error, run_page_target_s=2.0, api_s=api_s, collector_rss_bytes_start=rss_start,
        collector_rss_bytes_after_page=rss_end, db_bytes_after_open=size_after,
        stragglers=summary.get("stragglers") is not None, verdict=summary["verdict"]["input_bound"])
    print(f"summary {timings[0]:.2f} s (target <= 1 s; {min(timings[1:]):.3f} s from the cache); run page "
          f"{page_s if page_s is None else round(page_s, 2)} s until charts drawn (target <= 2 s) {page_error or ''}; "
          f"collector RSS {rss_start / 2**20:.0f} -> "
          f"{rss_end / 2**20:.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=float, default=30)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--budget", default="4GiB", help="the steady state's budget (default 4GiB, serve's default)")
    parser.add_argument("--fold-budget", default="64MiB", help="the real-path collector's budget (folds all along)")
    parser.add_argument("--ingest-seconds", type=float, default=60.0)
    parser.add_argument("--fold-batches", type=int, default=10, help="batches of 1,000 steps per rank to fold")
    parser.add_argument("--raw-bytes-per-step", type=float, default=None,
                        help="on-disk bytes of a raw step (default: as measured in part 1)")
    parser.add_argument("--quick", action="store_true", help="3 days, 8 ranks, 256MiB, 10 s of ingest")
    parser.add_argument("--out", type=Path, default=results_io.RESULTS / "long_run.json")
    args = parser.parse_args()
    if args.quick:
        args.days, args.ranks, args.budget, args.ingest_seconds, args.fold_batches = 3, 8, "256MiB", 10.0, 3
    record = results_io.started(args, quick=args.quick)
    wall = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        real_path(Path(tmp), args, record)
        if args.raw_bytes_per_step is None:
            args.raw_bytes_per_step = record["fold"]["bytes_per_step_raw"]
        steady_state(Path(tmp), args, record)
    record["wall_s"] = time.perf_counter() - wall
    print(f"wall time {record['wall_s'] / 60:.1f} min")
    results_io.write(record, args.out)


if __name__ == "__main__":
    main()
