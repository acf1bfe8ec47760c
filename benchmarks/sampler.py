"""CPU cost of system sampling (host + workers every 0.5 s, NVML every 1 s).

    python benchmarks/sampler.py [--seconds 30] [--quick] [--out PATH]

Runs a watched DataLoader with 2 workers (so worker telemetry is read too) and reports, in
steady state (after the first batch), the CPU time (user + system, from /proc via psutil) as %
of one core of: the sampler thread in the training process, and the sidecar process that takes
the psutil/NVML readings and delivers the batches (spool here: STARVEWATCH_URL=off).
Target: under 1%. Figures also go to benchmarks/results/sampler.json; --quick (5 s) is a smoke run,
marked "quick" there.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("STARVEWATCH_URL", "off")
os.environ.setdefault("STARVEWATCH_AUTOSTART", "0")
os.environ.setdefault("STARVEWATCH_QUIET", "1")
os.environ.setdefault("STARVEWATCH_DIR", "/tmp/starvewatch-bench")

import psutil  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

import starvewatch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import results_io  # noqa: E402


class Slow(Dataset):
    def __len__(self):
        return 10**6

    def __getitem__(self, i):
        time.sleep(0.001)
        return torch.zeros(8)


def thread_cpu_s(native_id: int) -> float:
    for t in psutil.Process().threads():
        if t.id == native_id:
            return t.user_time + t.system_time
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=None, help="steady-state span (30 s; 5 s with --quick)")
    parser.add_argument("--quick", action="store_true", help="5 s, for a smoke run")
    parser.add_argument("--out", type=Path, default=results_io.RESULTS / "sampler.json")
    args = parser.parse_args()
    if args.seconds is None:
        args.seconds = 5.0 if args.quick else 30.0
    record = results_io.started(args, quick=args.quick or args.seconds < 30.0)
    session = starvewatch.init("sampler-bench")
    loader = starvewatch.watch(DataLoader(Slow(), batch_size=8, num_workers=2, persistent_workers=True))
    sampler = session.samplers[0]
    it = iter(loader)
    next(it)
    sidecar = psutil.Process(session.sidecar.proc.pid)
    cpu0, t0 = thread_cpu_s(sampler.native_id), time.monotonic()
    side0 = sum(sidecar.cpu_times()[:2])
    while time.monotonic() - t0 < args.seconds:
        next(it)
        time.sleep(0.01)
    cpu1, t1 = thread_cpu_s(sampler.native_id), time.monotonic()
    side1 = sum(sidecar.cpu_times()[:2])
    ticks = sum(1 for k, e in sampler.history if k == "samples" and e["kind"] == "host")
    del it
    starvewatch.finish(quiet=True)
    share = 100 * (cpu1 - cpu0) / (t1 - t0)
    side_share = 100 * (side1 - side0) / (t1 - t0)
    print(f"sampler thread: {cpu1 - cpu0:.3f} s CPU over {t1 - t0:.1f} s ({ticks} host samples at "
          f"{session.settings.host_interval_s} s) -> {share:.2f}% of one core; sidecar process: "
          f"{side1 - side0:.3f} s -> {side_share:.2f}% of one core (target < 1%)")
    record.update({"seconds": t1 - t0, "host_samples": ticks, "host_interval_s": session.settings.host_interval_s,
                   "thread_cpu_s": cpu1 - cpu0, "thread_pct": share,
                   "sidecar_cpu_s": side1 - side0, "sidecar_pct": side_share, "target_pct": 1.0})
    results_io.write(record, args.out)


if __name__ == "__main__":
    main()
