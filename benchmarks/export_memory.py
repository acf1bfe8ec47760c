"""Collector memory while the API exports a 1M-step run as CSV (streamed).

    python benchmarks/export_memory.py [--steps 1000000]

Builds a database holding one run of `--steps` step records (through the real Store), starts a
real collector on it (`starvewatch serve`, uvicorn subprocess), downloads
`/api/v1/runs/<run>/export?format=csv` while sampling the collector's resident memory
(/proc/<pid>/status VmRSS every 5 ms, and VmHWM, the kernel's own peak), and checks the CSV
(one header plus one row per step). For comparison it also measures the whole-file approach
(`export_text`, the CSV built in memory, as the API did before) in a separate process.
Writes benchmarks/results/export_memory.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.procfs import status_kib  # noqa: E402

BATCH = 20_000
RUN_ID = "export-bench"


def build_database(directory: Path, steps: int) -> None:
    from starvewatch.monitor.web.wire_models import EventBatch
    from starvewatch.monitor.storage.store import Store

    store = Store(directory / "starvewatch.db")
    start_ns = 1_700_000_000 * 10**9
    seq = 0
    for first in range(0, steps, BATCH):
        n = min(BATCH, steps - first)
        seq += 1
        store.ingest(EventBatch.model_validate({
            "schema": "starvewatch.events/1", "run_id": RUN_ID, "stream": "bench", "seq": seq,
            "run": {"id": RUN_ID, "name": "export-bench"},
            "loaders": [{"name": "train", "totals": {"steps": first + n}}],
            "steps": {"loader": ["train"] * n, "epoch": [0] * n, "step": list(range(first, first + n)),
                      "start_ns": [start_ns + (first + i) * 1_000_000 for i in range(n)],
                      "wait_ns": [100_000 + i % 977 for i in range(n)], "compute_ns": [900_000 + i % 1013 for i in range(n)],
                      "other_ns": [0] * n, "batch_size": [64] * n, "gpu_idle_ns": [None] * n}}))
    store.close()

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"collector exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("collector did not start")


def streamed_export(directory: Path, steps: int) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "starvewatch", "serve", "--port", str(port),
                             "--dir", str(directory)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(url, proc)
        with urllib.request.urlopen(f"{url}/api/v1/runs/{RUN_ID}/summary", timeout=120) as resp:
            resp.read()  # warm: the run's summary and caches, as a user's first look would
        before = status_kib(proc.pid)
        peak = {"rss": before["VmRSS"]}
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                peak["rss"] = max(peak["rss"], status_kib(proc.pid)["VmRSS"])
                time.sleep(0.005)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.perf_counter()
        size, lines, head = 0, 0, b""
        with urllib.request.urlopen(f"{url}/api/v1/runs/{RUN_ID}/export?format=csv", timeout=600) as resp:
            while chunk := resp.read(1 << 16):
                size += len(chunk)
                lines += chunk.count(b"\n")
                if len(head) < 200:
                    head += chunk[:200]
        seconds = time.perf_counter() - started
        stop.set()
        sampler.join()
        after = status_kib(proc.pid)
        assert lines == steps + 1, (lines, steps)
        assert head.startswith(b"run,rank,loader,epoch,step,"), head[:80]
        return {"csv_bytes": size, "csv_lines": lines, "seconds": round(seconds, 2),
                "rss_before_mib": round(before["VmRSS"] / 1024, 1),
                "rss_peak_during_export_mib": round(peak["rss"] / 1024, 1),
                "rss_growth_mib": round((peak["rss"] - before["VmRSS"]) / 1024, 1),
                "vmhwm_before_mib": round(before["VmHWM"] / 1024, 1),
                "vmhwm_after_mib": round(after["VmHWM"] / 1024, 1)}
    finally:
        proc.terminate()
        proc.wait(30)


WHOLE_FILE = r"""
import json, sys
from benchmarks.procfs import status_kib
from starvewatch.monitor.outputs.export import export_text
from starvewatch.monitor.storage.sources import LocalSource
from starvewatch.monitor.storage.store import Store
store = Store(sys.argv[1])
source = LocalSource(store, "bench")
source.summary(sys.argv[2])
before = status_kib()["VmHWM"]
text = export_text(source, sys.argv[2], "csv")
after = status_kib()["VmHWM"]
print(json.dumps({"csv_chars": len(text), "rss_peak_before_mib": round(before / 1024, 1),
                  "rss_peak_after_mib": round(after / 1024, 1), "rss_growth_mib": round((after - before) / 1024, 1)}))
"""


def whole_file_export(directory: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", WHOLE_FILE, str(directory / "starvewatch.db"), RUN_ID],
                         capture_output=True, text=True, check=True, cwd=ROOT)  # cwd: benchmarks.procfs
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="starvewatch-export-bench-") as tmp:
        directory = Path(tmp)
        started = time.perf_counter()
        build_database(directory, args.steps)
        print(f"built a {args.steps:,}-step run in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        streamed = streamed_export(directory, args.steps)
        whole = whole_file_export(directory)
    result = {"benchmark": "export_memory", "steps": args.steps, "streamed_api_export": streamed,
              "whole_file_in_memory": whole, "python": platform.python_version(),
              "cpus": os.cpu_count(), "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    out = Path(__file__).with_name("results") / "export_memory.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
