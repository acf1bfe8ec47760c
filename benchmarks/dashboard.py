"""Dashboard performance: a 1M-step run page, ingest under 10 polling clients, and the runs
page with 1,000 runs.

    python benchmarks/dashboard.py [--steps 1000000] [--seconds 10] [--quick] [--out PATH]
    python benchmarks/dashboard.py --only runs-page [--runs 1000] [--runs-out PATH]

1. Seeds a store directly with a run of --steps steps, starts the collector on it, and opens
   the run page in headless Chromium: time until the KPIs and the step timeline are drawn
   (target: interactive within 2 s).
2. Runs the ingest producer of benchmarks/ingest.py while 10 clients poll the run page's data
   (summary, step series, rollup series, samples, workers) once a second: records/s ingested
   (target: the collector's 100,000 records/s).
3. Seeds a store with --runs small runs (tests/many_runs.py: 20 names, some live, some too short
   for a verdict), starts the collector on it and opens the runs page: time until the first
   page of groups is drawn (target: 1 s), and from ticking a status or verdict filter until the
   filtered list is drawn (target: 300 ms); median and worst of several, Dash bundles cached,
   timed by the page itself (navigation start or the click, to the next frame after the list).
Figures also go to benchmarks/results/dashboard.json (parts 1 and 2; --quick: 20,000 steps, 3 s
of ingest, a smoke run marked "quick" there) and benchmarks/results/runs_page.json (part 3).
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
    from starvewatch.monitor.web.wire_models import EventBatch
    from starvewatch.monitor.storage.store import Store
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
            # Drawn, not "visible": Playwright calls a flat line's trace (steady data) invisible,
            # its bounding box having no height.
            page.wait_for_selector("#timeline-graph .scatterlayer .trace", state="attached")
            best = min(best, time.perf_counter() - t0)
        browser.close()
    return best


# In the page: when the first run row is drawn (ms from the navigation's start), and after a
# filter's click, when the filtered list is drawn, both taken at the next animation frame (painted).
PAINTED = """
new MutationObserver((_, obs) => {
    if (document.querySelector('#runs-table tr.sw-run')) {
        obs.disconnect();
        requestAnimationFrame(() => { window.__swPainted = performance.now(); });
    }
}).observe(document, {subtree: true, childList: true});
"""
FILTERED = """([radio, value, prefix]) => new Promise(done => {
    const t0 = performance.now();
    const obs = new MutationObserver(() => {
        const table = document.querySelector('#runs-table');
        if (table && table.dataset.view.startsWith(prefix)) {
            obs.disconnect();
            requestAnimationFrame(() => done(performance.now() - t0));
        }
    });
    obs.observe(document.querySelector('#runs-container'), {subtree: true, childList: true, attributes: true});
    document.querySelector(`#${radio} input[value='${value}']`).click();
})"""


def runs_page_times(url: str, repeats: int = 7) -> dict:
    """Paint and filter times of the runs page, in seconds, as the page itself sees them."""
    import statistics

    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        page.add_init_script(PAINTED)
        page.goto(url + "/compare")  # warm the browser cache with Dash's bundles
        page.wait_for_selector("#compare-result")
        paints = []
        for _ in range(repeats):
            page.goto(url + "/")
            page.wait_for_function("window.__swPainted !== undefined")
            paints.append(page.evaluate("window.__swPainted") / 1000)
        filters = []
        for _ in range(repeats):
            for radio, value, prefix in (("runs-status", "live", "live|any|"), ("runs-status", "", "any|any|"),
                                         ("runs-verdict", "high", "any|high|"), ("runs-verdict", "", "any|any|")):
                filters.append(page.evaluate(FILTERED, [radio, value, prefix]) / 1000)
        browser.close()
    return {"paint_s": {"median": statistics.median(paints), "max": max(paints), "samples": len(paints),
                        "target": 1.0},
            "filter_s": {"median": statistics.median(filters), "max": max(filters), "samples": len(filters),
                         "target": 0.3}}


def runs_page(args) -> None:
    from starvewatch.monitor.storage.query import Query
    from starvewatch.monitor.storage.store import Store
    from tests.many_runs import seed_runs
    record = results_io.started(args, quick=args.quick or args.runs < 1000)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "starvewatch.db")
        t0 = time.perf_counter()
        seed_runs(store, args.runs)
        seeded_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        Query(store).list_runs()
        record["list_runs_s"] = time.perf_counter() - t0
        store.close()
        print(f"seeded {args.runs:,} runs in {seeded_s:.1f} s; listing them (uncached): "
              f"{1000 * record['list_runs_s']:.0f} ms")
        # Long enough a silence before a run counts as lost: the seeded live runs stay live.
        with running_collector(tmp, extra=("--lost-after", "3600")) as (url, _):
            record.update(runs=args.runs, **runs_page_times(url, 3 if args.quick else 7))
    paint, filt = record["paint_s"], record["filter_s"]
    print(f"runs page with {args.runs:,} runs: painted in {paint['median']:.2f} s median, {paint['max']:.2f} s "
          f"worst (target <= 1 s); filtered in {1000 * filt['median']:.0f} ms median, "
          f"{1000 * filt['max']:.0f} ms worst (target <= 300 ms)")
    results_io.write(record, args.runs_out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=None, help="steps of the seeded run (1,000,000; 20,000 with --quick)")
    parser.add_argument("--seconds", type=float, default=None, help="ingest under polling (10 s; 3 s with --quick)")
    parser.add_argument("--quick", action="store_true", help="a small run and 3 s of ingest, for a smoke run")
    parser.add_argument("--out", type=Path, default=results_io.RESULTS / "dashboard.json")
    parser.add_argument("--only", choices=("run-page", "runs-page"), help="one part: the run page and ingest "
                        "(parts 1 and 2), or the runs page (part 3)")
    parser.add_argument("--runs", type=int, default=1000, help="runs in the store for the runs page (1,000)")
    parser.add_argument("--runs-out", type=Path, default=results_io.RESULTS / "runs_page.json")
    args = parser.parse_args()
    if args.only != "run-page":
        runs_page(args)
    if args.only == "runs-page":
        return
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
