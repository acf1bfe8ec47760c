"""Collector ingest: sustained step records/s over HTTP, and record-to-summary delay.

    python benchmarks/ingest.py [--seconds 10] [--quick] [--out PATH]

Starts a real collector (uvicorn subprocess, SQLite in a temporary directory). Then:
1. a separate producer process posts gzip JSON batches of 20,000 step records as fast as the
   collector acknowledges them: sustained records/s (target >= 100,000);
2. a real watched training loop (another process, the real hooks and HTTP transport) runs
   ~2,000 steps/s while this process polls the summary API: p95 delay from a step ending to it
   being counted in the summary (target <= 1.5 s).
Figures also go to benchmarks/results/ingest.json; --quick (3 s each) is a smoke run, marked
"quick" there.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import results_io  # noqa: E402

# One producer process: sends batches of `batch` step records over HTTP for `seconds`.
# argv: url seconds batch [stream] [run_id]; prints records, requests and seconds as JSON.
# (benchmarks/shared_store.py and dashboard.py run it too.)
PRODUCER = r"""
import sys, time, json
from starvewatch.hooks.delivery.transport import HttpTransport
url, seconds, batch = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
stream = sys.argv[4] if len(sys.argv) > 4 else "producer"
run_id = sys.argv[5] if len(sys.argv) > 5 else "ingest-bench"
t = HttpTransport(url, timeout_s=60)
now = time.time_ns()
cols = {"loader": ["train"] * batch, "epoch": [0] * batch, "step": list(range(batch)),
        "start_ns": [now + i * 1000 for i in range(batch)], "wait_ns": [1_000_000 + i % 977 for i in range(batch)],
        "compute_ns": [5_000_000 + i % 1013 for i in range(batch)], "other_ns": [0] * batch,
        "batch_size": [64] * batch, "gpu_idle_ns": [None] * batch}
seq, sent, start = 0, 0, time.perf_counter()
while time.perf_counter() - start < seconds:
    seq += 1
    t.send({"schema": "starvewatch.events/1", "run_id": run_id, "stream": stream, "seq": seq,
            "status": "live", "steps": cols,
            "loaders": [{"name": "train", "totals": {"steps": seq * batch}}]})
    sent += batch
print(json.dumps({"records": sent, "requests": seq, "seconds": time.perf_counter() - start}))
"""

LOOP = r"""
import sys, time, starvewatch
seconds = float(sys.argv[1])
loader = starvewatch.watch(range(10**9), name="train")
end = time.perf_counter() + seconds
for i in loader:
    t = time.perf_counter() + 0.0005
    while time.perf_counter() < t:
        pass
    if time.perf_counter() > end:
        break
print(starvewatch.finish()["run"]["id"])
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def wait_up(url: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            get(url + "/healthz")
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("collector did not start")


@contextlib.contextmanager
def running_collector(directory: str, extra: tuple = ()):
    """A real collector (uvicorn subprocess) on a free loopback port; stopped by PID on exit."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, STARVEWATCH_DIR=directory, STARVEWATCH_AUTOSTART="0", STARVEWATCH_QUIET="1")
    with open(Path(directory) / "collector.log", "wb") as log:
        server = subprocess.Popen([sys.executable, "-m", "starvewatch", "serve", "--port", str(port),
                                   "--dir", directory, *extra], env=env, stdout=log, stderr=log)
        try:
            wait_up(url)
            yield url, env
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=None, help="each part's length (10 s; 3 s with --quick)")
    parser.add_argument("--batch", type=int, default=20_000)
    parser.add_argument("--quick", action="store_true", help="3 s each, for a smoke run")
    parser.add_argument("--out", type=Path, default=results_io.RESULTS / "ingest.json")
    args = parser.parse_args()
    if args.seconds is None:
        args.seconds = 3.0 if args.quick else 10.0
    record = results_io.started(args, quick=args.quick or args.seconds < 10.0)
    with tempfile.TemporaryDirectory() as tmp, running_collector(tmp) as (url, env):
        out = subprocess.run([sys.executable, "-c", PRODUCER, url, str(args.seconds), str(args.batch)],
                             env=env, capture_output=True, text=True, check=True)
        result = json.loads(out.stdout)
        rate = result["records"] / result["seconds"]
        print(f"ingest: {result['records']:,} records in {result['seconds']:.1f} s -> "
              f"{rate:,.0f} records/s sustained (target >= 100,000)")
        record["ingest"] = {"records": result["records"], "seconds": result["seconds"], "records_per_s": rate,
                            "target_records_per_s": 100_000}

        loop = subprocess.Popen([sys.executable, "-c", LOOP, str(args.seconds)],
                                env=dict(env, STARVEWATCH_URL=url, STARVEWATCH_RUN_NAME="latency"),
                                stdout=subprocess.PIPE, text=True)
        polls: list[tuple[int, int]] = []  # (wall ns, steps counted by the summary API)
        run_id = None
        while loop.poll() is None:
            if run_id is None:
                runs = [r for r in get(url + "/api/v1/runs")["runs"] if r["name"] == "latency"]
                run_id = runs[0]["id"] if runs else None
            if run_id is not None:
                summary = get(f"{url}/api/v1/runs/{run_id}/summary")
                steps = summary["loaders"][0]["steps"] if summary["loaders"] else 0
                polls.append((time.time_ns(), steps))
            time.sleep(0.05)
        run_id = loop.stdout.read().strip() or run_id
        ends, after = [], 0
        while after is not None:
            page = get(f"{url}/api/v1/runs/{run_id}/steps?limit=100000&after={after}")
            ends.extend(s["start_ns"] + s["wait_ns"] + s["compute_ns"] for s in page["steps"])
            after = page["next_after"]
        delays = []
        poll_index = 0
        for k, end_ns in enumerate(ends):
            while poll_index < len(polls) and polls[poll_index][1] < k + 1:
                poll_index += 1
            if poll_index == len(polls):
                break  # counted only after the loop ended: not a live measurement
            delays.append((polls[poll_index][0] - end_ns) / 1e9)
        delays.sort()
        p95 = delays[int(0.95 * (len(delays) - 1))] if delays else None
        p50 = delays[len(delays) // 2] if delays else None
        print(f"delay from a step ending to the summary API counting it: p50 "
              f"{_seconds(p50)}, p95 {_seconds(p95)} over {len(delays):,} steps "
              f"(target <= 1.5 s; includes the 0.5 s ship interval and the 50 ms poll)")
        record["delay"] = {"steps": len(delays), "p50_s": p50, "p95_s": p95, "target_p95_s": 1.5}
    results_io.write(record, args.out)


def _seconds(value: float | None) -> str:
    return "none (no step counted while the loop ran)" if value is None else f"{value:.2f} s"


if __name__ == "__main__":
    main()
