"""How long the monitor delays a training step under each delivery fault (target: 10 ms at most).

    python benchmarks/faults.py [--seconds 10] [--only slow,500]

For each fault, a real watched training process (1 ms busy steps, the real sidecar and HTTP
delivery) runs for --seconds against a real collector that misbehaves:
  none          a healthy collector (the reference)
  down          no collector at all (records go to the spool)
  killed        the collector is SIGKILLed a third of the way in and restarted 2 s later
  slow          every request answered after 2 s (a proxy in front of the collector)
  500           every request answered 500 until two thirds of the way, then healthy
  token         the collector wants another token (401)
  read_only     the spool directory is a read-only mount (tmpfs, ro), no collector
  disk_full     the spool directory is a 64 KiB tmpfs, no collector
plus `bare`, the same loop unwatched. Per fault: the slowest step beyond its 1 ms of work,
the 99.9th percentile, the longest time the training thread was held up (the largest gap
between two clock reads of its busy loop, the `next()` call included), how long `finish()`
took, and the delivery account. Figures also go to benchmarks/results/faults.json.
This is a benchmark: the tests (tests/test_faults.py) check what is lost, not the timing.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.faultproxy import FaultProxy  # noqa: E402
from benchmarks.ingest import free_port, wait_up  # noqa: E402

TICKER = r"""
import json, sys, time, starvewatch
sys.path.insert(0, sys.argv[2])
from benchmarks.ticker import timed_steps
seconds = float(sys.argv[1])
clock = time.perf_counter
times, holdups = timed_steps(starvewatch.watch(range(10**9), name="train"), seconds)
t = clock()
summary = starvewatch.finish()
finish_s = clock() - t
times.sort(); holdups.sort()
print(json.dumps({"steps": len(times), "step_extra_max_ms": (times[-1] - 0.001) * 1e3,
                  "step_extra_p999_ms": (times[int(0.999 * (len(times) - 1))] - 0.001) * 1e3,
                  "holdup_max_ms": holdups[-1] * 1e3, "finish_s": finish_s,
                  "delivery": (summary or {}).get("delivery")}))
"""

FAULTS = ("bare", "none", "down", "killed", "slow", "500", "token", "read_only", "disk_full")


class Collector:
    def __init__(self, directory: Path, token: str | None = None) -> None:
        self.directory, self.token, self.port = directory, token, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def start(self) -> "Collector":
        cmd = [sys.executable, "-m", "starvewatch", "serve", "--port", str(self.port), "--dir", str(self.directory)]
        if self.token:
            cmd += ["--token", self.token]
        env = dict(os.environ, STARVEWATCH_TOKEN="")
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_up(self.url) if not self.token else _wait_port(self.port)
        return self

    def kill(self, sig=signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)


def _wait_port(port: int, timeout_s: float = 30) -> None:
    import socket
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listens on port {port}")


def _mount(path: Path, options: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def run_fault(fault: str, seconds: float, tmp: Path) -> dict:
    data_dir = tmp / fault
    data_dir.mkdir()
    env = dict(os.environ, STARVEWATCH_DIR=str(data_dir), STARVEWATCH_QUIET="1", STARVEWATCH_AUTOSTART="0",
               STARVEWATCH_RUN_NAME=f"fault-{fault}")
    env.pop("STARVEWATCH_TOKEN", None)
    collector = proxy = None
    mounted = None
    timers: list[threading.Timer] = []
    try:
        if fault == "bare":
            env["STARVEWATCH_DISABLED"] = "1"
        elif fault in ("down", "read_only", "disk_full"):
            env["STARVEWATCH_URL"] = f"http://127.0.0.1:{free_port()}"
            if fault != "down":
                mounted = data_dir / "mnt"
                if not _mount(mounted, "size=1m,ro" if fault == "read_only" else "size=64k"):
                    return {"skipped": "mounting a tmpfs needs root"}
                env["STARVEWATCH_DIR"] = str(mounted)
        else:
            collector = Collector(tmp / f"{fault}-collector", token="other" if fault == "token" else None).start()
            env["STARVEWATCH_URL"] = collector.url
            if fault in ("slow", "500"):
                proxy = FaultProxy(collector.port, delay_s=2.0)
                proxy.mode = fault
                env["STARVEWATCH_URL"] = proxy.url
                if fault == "500":
                    timers.append(threading.Timer(2 * seconds / 3, lambda: setattr(proxy, "mode", "pass")))
            if fault == "killed":
                def restart():
                    collector.kill()
                    time.sleep(2.0)
                    collector.start()
                timers.append(threading.Timer(seconds / 3, restart))
        proc = subprocess.Popen([sys.executable, "-c", TICKER, str(seconds), str(ROOT)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for timer in timers:
            timer.start()
        out, err = proc.communicate(timeout=seconds + 120)
        if proc.returncode != 0:
            return {"error": err[-2000:]}
        return json.loads(out.strip().splitlines()[-1])
    finally:
        for timer in timers:
            timer.cancel()
        if proxy is not None:
            proxy.close()
        if collector is not None:
            collector.kill()
        if mounted is not None:
            subprocess.run(["umount", "-l", str(mounted)], capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--only", help="comma-separated faults (default: all)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "faults.json")
    args = parser.parse_args()
    faults = args.only.split(",") if args.only else FAULTS
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fault in faults:
            results[fault] = result = run_fault(fault, args.seconds, Path(tmp))
            if "steps" not in result:
                print(f"{fault:<10} {result}")
                continue
            account = result["delivery"] or {}
            print(f"{fault:<10} {result['steps']:>6} steps  slowest step +{result['step_extra_max_ms']:6.2f} ms  "
                  f"p99.9 +{result['step_extra_p999_ms']:5.2f} ms  longest hold-up {result['holdup_max_ms']:6.2f} ms  "
                  f"finish() {result['finish_s']:.2f} s  account {json.dumps(account) if account else '-'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                    "seconds": args.seconds, "target_ms": 10, "faults": results}, indent=1) + "\n")
    print(f"target: no step delayed more than 10 ms by the monitor; figures written to {args.out}")


if __name__ == "__main__":
    main()
