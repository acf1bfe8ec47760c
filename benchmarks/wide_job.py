"""A wide job: 256 ranks of one run streaming into one collector (issue 26 item 4).

    python benchmarks/wide_job.py [--ranks 256] [--seconds 30] [--clients 16] [--quick] [--out PATH]

Starts a real collector (uvicorn subprocess, SQLite in a temporary directory), then `--clients`
client processes that share the ranks between them: each rank is its own stream (the hooks'
HttpTransport, one keep-alive connection per client), sending one batch of 10 step records
every 0.5 s (the default shipping interval): 20 steps/s per rank, 512 requests/s for 256
ranks. Rank 7 waits 15 ms per step for its data, the others 1 ms (a straggler to find). Everything
shares this machine's cores: the collector's share is measured from /proc (its CPU seconds over
the wall time), and so is the clients'.

It reports: the requests and records sent and acknowledged per second against the schedule
(ingest keeps up when the clients stay on schedule: `tick_lag_s` is how late each 0.5 s tick
began, `ticks_late_fraction` the share of ticks that began more than one interval late), the request latency percentiles, the rows the collector stored (its CSV export: every
record once), and the latency of the run detail, the per-rank summary and the straggler rule
at the end (target < 2 s). Figures go to benchmarks/results/wide_job.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import results_io  # noqa: E402
from benchmarks.ingest import running_collector  # noqa: E402

CLIENT = r"""
import json, sys, time
from starvewatch.hooks.delivery.transport import HttpTransport
url, ranks, world, seconds, interval, steps_per_batch = (
    sys.argv[1], [int(r) for r in sys.argv[2].split(",")], int(sys.argv[3]), float(sys.argv[4]),
    float(sys.argv[5]), int(sys.argv[6]))
transport = HttpTransport(url, timeout_s=60)
transport.request("GET", "/healthz")  # connected
print("ready", flush=True)
start_at = float(sys.stdin.readline())  # the same start for every client, once all are ready
latencies, sent, lags = [], 0, []
seq = {r: 0 for r in ranks}
step = {r: 0 for r in ranks}
while time.time() < start_at:
    time.sleep(0.005)
ticks = int(seconds / interval)
for tick in range(ticks):
    due = start_at + tick * interval
    now = time.time()
    if now < due:
        time.sleep(due - now)
    lags.append(max(0.0, time.time() - due))
    for r in ranks:
        seq[r] += 1
        n = steps_per_batch
        first = step[r]
        t0 = int(due * 1e9)
        wait = 15_000_000 if r == 7 else 1_000_000
        batch = {"schema": "starvewatch.events/1", "run_id": "wide-job", "rank": r, "stream": f"wide-rank-{r}",
                 "seq": seq[r], "status": "finished" if tick == ticks - 1 else "live",
                 "loaders": [{"name": "train", "totals": {"steps": first + n, "epochs": 1,
                                                          "wait_ns": (first + n) * wait,
                                                          "compute_ns": (first + n) * 45_000_000}}],
                 "steps": {"loader": ["train"] * n, "epoch": [0] * n, "step": list(range(first, first + n)),
                           "start_ns": [t0 + i * 50_000_000 for i in range(n)],
                           "wait_ns": [wait + (i * 7919) % 100_000 for i in range(n)],
                           "compute_ns": [45_000_000] * n, "other_ns": [0] * n, "batch_size": [64] * n,
                           "gpu_idle_ns": [None] * n}}
        if seq[r] == 1:
            batch["run"] = {"id": "wide-job", "name": "wide-job", "rank": r, "world_size": world,
                            "host": f"node{r // 8}", "started_at": start_at}
        begin = time.perf_counter()
        transport.send(batch)
        latencies.append(time.perf_counter() - begin)
        sent += n
        step[r] += n
print(json.dumps({"sent": sent, "requests": len(latencies), "latencies": latencies, "lags": lags}))
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_get(url: str) -> tuple[float, dict]:
    begin = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as r:
        body = json.loads(r.read())
    return time.perf_counter() - begin, body


def stored_rows(url: str) -> int:
    with urllib.request.urlopen(f"{url}/api/v1/runs/wide-job/export?format=csv", timeout=300) as r:
        return sum(1 for _ in r) - 1  # the header line


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=None, help="sending time (30 s; 8 s with --quick)")
    parser.add_argument("--clients", type=int, default=16, help="client processes sharing the ranks")
    parser.add_argument("--interval", type=float, default=0.5, help="shipping interval per rank, s")
    parser.add_argument("--steps-per-batch", type=int, default=10)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=results_io.RESULTS / "wide_job.json")
    args = parser.parse_args()
    if args.seconds is None:
        args.seconds = 8.0 if args.quick else 30.0
    record = results_io.started(args, quick=args.quick or args.seconds < 30.0)
    with tempfile.TemporaryDirectory() as tmp, running_collector(tmp) as (url, env):
        with urllib.request.urlopen(url + "/api/v1/runs", timeout=30):
            pass
        collector_pid = int(json.loads((Path(tmp) / "collector.json").read_text())["pid"]) \
            if (Path(tmp) / "collector.json").exists() else None
        if collector_pid is None:  # not written by a collector that was not auto-started: find it by port
            collector_pid = _pid_listening(url)
        groups = [list(range(c, args.ranks, args.clients)) for c in range(args.clients)]
        clients = [subprocess.Popen([sys.executable, "-c", CLIENT, url, ",".join(map(str, g)), str(args.ranks),
                                     str(args.seconds), str(args.interval), str(args.steps_per_batch)],
                                    env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                   for g in groups]
        for proc in clients:  # every client imported and connected
            if proc.stdout.readline().strip() != "ready":
                raise SystemExit("a client failed to start")
        start_at = time.time() + 0.2
        for proc in clients:
            proc.stdin.write(f"{start_at}\n")
            proc.stdin.flush()
        cpu_before, wall_before = cpu_seconds(collector_pid), time.time()
        client_cpu_before = _children_cpu()
        results = []
        for proc in clients:
            out, _ = proc.communicate(timeout=args.seconds + 600)
            if proc.returncode != 0:
                raise SystemExit(f"a client failed ({proc.returncode})")
            results.append(json.loads(out))
        wall = time.time() - max(start_at, wall_before)
        collector_cpu = cpu_seconds(collector_pid) - cpu_before
        client_cpu = _children_cpu() - client_cpu_before
        sent = sum(r["sent"] for r in results)
        requests = sum(r["requests"] for r in results)
        latencies = [x for r in results for x in r["latencies"]]
        lags = [x for r in results for x in r["lags"]]
        lag, late = max(lags), sum(x > args.interval for x in lags) / len(lags)
        expected = args.ranks * int(args.seconds / args.interval) * args.steps_per_batch
        print(f"{args.ranks} ranks x {args.steps_per_batch / args.interval:.0f} steps/s for {args.seconds:.0f} s: "
              f"{requests:,} requests ({requests / wall:,.0f}/s), {sent:,} records ({sent / wall:,.0f}/s) "
              f"of {expected:,} scheduled; ticks late by p95 {percentile(lags, 0.95):.2f} s, at most {lag:.2f} s; "
              f"{late:.1%} of ticks began more than one interval late")
        print(f"request latency p50 {percentile(latencies, 0.5) * 1e3:.1f} ms, p95 "
              f"{percentile(latencies, 0.95) * 1e3:.1f} ms, p99 {percentile(latencies, 0.99) * 1e3:.1f} ms")
        print(f"CPU over {wall:.1f} s on {os.cpu_count()} cores: collector {collector_cpu:.1f} s "
              f"({collector_cpu / wall:.2f} cores), clients {client_cpu:.1f} s ({client_cpu / wall:.2f} cores)")
        stored = stored_rows(url)
        detail_s, detail = timed_get(f"{url}/api/v1/runs/wide-job")
        rank_s, _ = timed_get(f"{url}/api/v1/runs/wide-job/summary?rank=7")
        straggler_s, stragglers = timed_get(f"{url}/api/v1/runs/wide-job/stragglers")
        summary_s, _ = timed_get(f"{url}/api/v1/runs/wide-job/summary")
        ranks_seen = len({r["rank"] for r in detail["ranks"]})
        print(f"stored {stored:,} rows of {sent:,} sent; {ranks_seen} ranks in one run")
        print(f"run detail {detail_s:.2f} s, per-rank summary {rank_s:.2f} s, straggler rule {straggler_s:.2f} s, "
              f"whole-run summary {summary_s:.2f} s (target < 2 s)")
        record.update({
            "ranks": args.ranks, "clients": args.clients, "seconds": args.seconds, "wall_s": wall,
            "requests": requests, "requests_per_s": requests / wall, "records_sent": sent,
            "records_per_s": sent / wall, "records_scheduled": expected,
            "tick_lag_s": {"p50": percentile(lags, 0.5), "p95": percentile(lags, 0.95), "max": lag},
            "ticks_late_fraction": late, "keeps_up": late < 0.01 and sent == expected == stored,
            "latency_ms": {"p50": percentile(latencies, 0.5) * 1e3, "p95": percentile(latencies, 0.95) * 1e3,
                           "p99": percentile(latencies, 0.99) * 1e3},
            "cpu": {"cores": os.cpu_count(), "collector_s": collector_cpu, "collector_cores": collector_cpu / wall,
                    "clients_s": client_cpu, "clients_cores": client_cpu / wall},
            "stored_rows": stored, "ranks_in_run": ranks_seen,
            "answer_s": {"run_detail": detail_s, "rank_summary": rank_s, "stragglers": straggler_s,
                         "summary": summary_s, "target": 2.0},
            "stragglers": stragglers["stragglers"], "straggler_found": any(
                str(entry.get("rank")) == "7" for entry in stragglers["stragglers"]),
        })
    results_io.write(record, args.out)


def _children_cpu() -> float:
    usage = os.times()
    return usage.children_user + usage.children_system


def _pid_listening(url: str) -> int:
    """The collector's pid from /proc: the process whose socket listens on the URL's port."""
    port = int(url.rsplit(":", 1)[1])
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                inodes.add(fields[9])
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return int(pid)
        except OSError:
            continue
    raise SystemExit(f"no process listens on port {port}")


if __name__ == "__main__":
    main()
