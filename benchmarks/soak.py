"""Soak: one collector under 2 real watched trainings and 30 HTTP clients, for a long time.

    python benchmarks/soak.py [--seconds 600] [--clients 30] [--trainers 2]

Against one real collector (uvicorn subprocess, SQLite in a temporary directory):
- `--trainers` real watched training processes (the real hooks, sidecar and HTTP delivery),
  each doing 1,000 steps/s (10x a job doing 100 steps/s);
- `--clients` HTTP clients (threads of one separate process), each replaying realistic batches
  (500 step records every 0.5 s, gzip JSON, as the sidecar sends them: 1,000 records/s, 10x a
  100 steps/s job), resending a batch until it is acknowledged, as the sidecar does;
- this process polls one training's run page once a second (the page and the data its
  callbacks read: summary, step series, rollup series, samples, workers) and samples the RSS
  of the collector and of the training processes (with their sidecars).

At the end: records lost per producer (records run or acknowledged minus the records the
collector stored, from its rollups), RSS over time (`rss`: every sample, with the 1-minute load
average beside it; `collector_rss`: start, plateau, max, end and the slope per hour over each
half of the run, see `rss_trend`), and the run page's slowest answer (target: within 2 s
throughout). Figures go to benchmarks/results/soak.json (or --out). The README's figures are
from a 600 s run; `--seconds 5` is the smoke test.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import results_io  # noqa: E402
from benchmarks.ingest import running_collector  # noqa: E402

TRAINER = r"""
import json, sys, time, starvewatch
seconds, rate = float(sys.argv[1]), float(sys.argv[2])
loader = starvewatch.watch(range(10**12), name="train")
start = time.perf_counter()
for i in loader:
    # paced, not busy: two trainings, their sidecars, 30 clients and the collector share the cores
    delay = start + (i + 1) / rate - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
    if time.perf_counter() - start > seconds:
        break
summary = starvewatch.finish()
print(json.dumps({"run_id": summary["run"]["id"], "steps": summary["loaders"][0]["steps"],
                  "delivery": summary.get("delivery")}))
"""

CLIENTS = r"""
import gzip, json, sys, threading, time, urllib.request, urllib.error
url, seconds, clients, per_batch, interval = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
results = {}

def client(k):
    run_id, sent, retries, seq, step = f"soak-client-{k:02d}", 0, 0, 0, 0
    started = time.time()
    deadline = time.monotonic() + seconds
    next_at = time.monotonic()
    while time.monotonic() < deadline:
        seq += 1
        now = time.time_ns()
        steps = list(range(step, step + per_batch))
        payload = {"schema": "starvewatch.events/1", "run_id": run_id, "stream": f"{run_id}-p0", "seq": seq,
                   "status": "live", "run": {"id": run_id, "name": "soak-client", "started_at": started},
                   "loaders": [{"name": "train", "config": {"num_workers": 4, "batch_size": 64},
                                "totals": {"steps": step + per_batch, "epochs": 1}}],
                   "steps": {"loader": ["train"] * per_batch, "epoch": [0] * per_batch, "step": steps,
                             "start_ns": [now - (per_batch - i) * 1_000_000 for i in range(per_batch)],
                             "wait_ns": [200_000 + (i * 7919) % 300_000 for i in steps],
                             "compute_ns": [700_000 + (i * 104729) % 200_000 for i in steps],
                             "other_ns": [0] * per_batch, "batch_size": [64] * per_batch,
                             "gpu_idle_ns": [None] * per_batch},
                   "samples": [{"t_ns": now, "cpu_pct": 50.0, "rss_bytes": 10**9}]}
        body = gzip.compress(json.dumps(payload).encode(), 1)
        while True:  # resend until acknowledged, as the sidecar does (same seq: idempotent)
            req = urllib.request.Request(url + "/api/v1/ingest", data=body, method="POST", headers={
                "Content-Type": "application/json", "Content-Encoding": "gzip"})
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    resp.read()
                break
            except (OSError, urllib.error.HTTPError):
                retries += 1
                time.sleep(0.5)
        sent += per_batch
        step += per_batch
        next_at += interval
        time.sleep(max(0.0, next_at - time.monotonic()))
    results[run_id] = {"acknowledged": sent, "retries": retries}

threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(results))
"""


def get(url: str, timeout: float = 30.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def stored_steps(url: str, run_id: str) -> int:
    """Step records the collector stored for a run (summed from its per-second rollups)."""
    series = json.loads(get(f"{url}/api/v1/runs/{run_id}/series?points=10000"))
    return sum(p["steps"] for p in series["points"])


def rss_bytes(pids: list[int]) -> int:
    import psutil
    total = 0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            total += proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(recursive=True))
        except psutil.Error:
            pass
    return total


def slope_per_hour(t_s: list[float], values: list[int]) -> float | None:
    """Least-squares slope of `values` over `t_s`, per hour (None under 2 distinct times)."""
    n = len(t_s)
    if n < 2 or max(t_s) == min(t_s):
        return None
    mean_t, mean_v = sum(t_s) / n, sum(values) / n
    cov = sum((t - mean_t) * (v - mean_v) for t, v in zip(t_s, values))
    var = sum((t - mean_t) ** 2 for t in t_s)
    return cov / var * 3600.0


def rss_trend(t_s: list[float], values: list[int]) -> dict:
    """Bounded or not, from the samples: `start` (the idle collector, before the load reached
    it), `plateau` (median of the second half), `max`, `end`, and the least-squares slope per
    hour over the first half (the warm-up: arenas and caches filling) and over the second half
    (what is left once warm: near 0 for a bounded collector, the leak rate otherwise)."""
    if not values:
        return {}
    half = len(values) // 2
    second = sorted(values[half:])
    return {"start_bytes": values[0], "plateau_bytes": second[len(second) // 2], "max_bytes": max(values),
            "end_bytes": values[-1], "samples": len(values),
            "slope_first_half_bytes_per_h": slope_per_hour(t_s[:half + 1], values[:half + 1]),
            "slope_second_half_bytes_per_h": slope_per_hour(t_s[half:], values[half:])}


def collector_pid(directory: str) -> int | None:
    import psutil
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "serve" in cmd and directory in cmd:
            return proc.pid
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--trainers", type=int, default=2)
    parser.add_argument("--steps-per-s", type=float, default=1000.0, help="per trainer and per client")
    parser.add_argument("--sample-s", type=float, default=5.0, help="RSS sampling period")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "soak.json")
    args = parser.parse_args()
    per_batch, interval = max(1, round(args.steps_per_s * 0.5)), 0.5
    record = results_io.started(args, quick=args.seconds < 600.0)

    with tempfile.TemporaryDirectory() as tmp, running_collector(tmp) as (url, env):
        env = dict(env, STARVEWATCH_URL=url, STARVEWATCH_RUN_NAME="soak-train")
        trainers = [subprocess.Popen([sys.executable, "-c", TRAINER, str(args.seconds), str(args.steps_per_s)],
                                     env=env, stdout=subprocess.PIPE, text=True) for _ in range(args.trainers)]
        clients = subprocess.Popen([sys.executable, "-c", CLIENTS, url, str(args.seconds), str(args.clients),
                                    str(per_batch), str(interval)], env=env, stdout=subprocess.PIPE, text=True)
        server = collector_pid(tmp)
        rss = {"t_s": [], "collector_bytes": [], "trainers_bytes": [], "load_1m": []}
        pages: list[float] = []
        page_errors: list[str] = []
        stop = threading.Event()

        def sample_rss():
            t0 = time.monotonic()
            while True:
                rss["t_s"].append(round(time.monotonic() - t0, 1))
                rss["collector_bytes"].append(rss_bytes([server] if server else []))
                rss["trainers_bytes"].append(rss_bytes([p.pid for p in trainers if p.poll() is None]))
                rss["load_1m"].append(round(os.getloadavg()[0], 2))
                if stop.wait(args.sample_s):
                    return

        sampler = threading.Thread(target=sample_rss, daemon=True)
        sampler.start()
        run_id = None
        while any(p.poll() is None for p in trainers) or clients.poll() is None:
            t = time.monotonic()
            try:
                if run_id is None:
                    runs = json.loads(get(url + "/api/v1/runs"))["runs"]
                    run_id = next((r["id"] for r in runs if r["name"] == "soak-train"), None)
                if run_id is not None:
                    get(f"{url}/runs/{run_id}")
                    for path in ("summary", "steps/series?loader=train&points=1000", "series?points=300",
                                 "events/samples?limit=5000", "events/workers?limit=2000"):
                        get(f"{url}/api/v1/runs/{run_id}/{path}")
                    pages.append(time.monotonic() - t)
            except OSError as exc:
                page_errors.append(f"{time.monotonic() - t:.1f} s: {exc}")
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t)))
        stop.set()
        sampler.join(10)

        producers = {}
        for proc in trainers:
            out = json.loads(proc.stdout.read().strip().splitlines()[-1])
            producers[out["run_id"]] = {"kind": "training", "run": out["steps"], "delivery": out["delivery"]}
        for run, out in json.loads(clients.stdout.read()).items():
            producers[run] = {"kind": "http client", "run": out["acknowledged"], "retries": out["retries"]}
        # Everything run has been handed over (finish() flushed, clients were acknowledged):
        # give the collector a moment to have stored the last batches, then count.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for run, p in producers.items():
                p["stored"] = stored_steps(url, run)
            if all(p["stored"] >= p["run"] for p in producers.values()):
                break
            time.sleep(0.5)
        for p in producers.values():
            p["lost"] = p["run"] - p["stored"]

    lost = sum(max(0, p["lost"]) for p in producers.values())
    doubled = sum(max(0, -p["lost"]) for p in producers.values())
    mib = lambda b: b / 2**20  # noqa: E731
    result = dict(record, **{
        "records_run": sum(p["run"] for p in producers.values()), "records_lost": lost,
        "records_doubled": doubled, "producers": producers,
        "page_s": {"polls": len(pages), "max": max(pages, default=None),
                   "p50": sorted(pages)[len(pages) // 2] if pages else None, "errors": page_errors},
        "rss": rss, "collector_rss": rss_trend(rss["t_s"], rss["collector_bytes"]),
        "load_1m_max": max(rss["load_1m"], default=None),
    })
    results_io.write(result, args.out)
    c, tr = rss["collector_bytes"], rss["trainers_bytes"]
    trend = result["collector_rss"]
    print(f"soak {args.seconds:.0f} s: {args.trainers} trainings and {args.clients} HTTP clients at "
          f"{args.steps_per_s:.0f} steps/s each -> {result['records_run']:,} records, "
          f"{lost} lost, {doubled} doubled")
    print(f"collector RSS {mib(c[0]):.0f} MiB at start, {mib(max(c)):.0f} MiB max, {mib(c[-1]):.0f} MiB at end; "
          f"trainings (with sidecars) {mib(tr[0]):.0f} MiB at start, {mib(max(tr)):.0f} MiB max")
    if trend.get("slope_second_half_bytes_per_h") is not None:
        print(f"collector RSS plateau {mib(trend['plateau_bytes']):.0f} MiB (median of the second half); slope "
              f"{mib(trend['slope_first_half_bytes_per_h']):+.0f} MiB/h in the first half, "
              f"{mib(trend['slope_second_half_bytes_per_h']):+.0f} MiB/h in the second")
    print(f"load average {record['load_average'][0]:.1f} at start, {max(rss['load_1m']):.1f} max, "
          f"{result['load_average_end'][0]:.1f} at end on {record['cpu_count']} CPUs")
    if pages:
        print(f"run page and its data: p50 {result['page_s']['p50']:.2f} s, slowest {result['page_s']['max']:.2f} s "
              f"over {len(pages)} polls (target <= 2 s); {len(page_errors)} errors")


if __name__ == "__main__":
    main()
