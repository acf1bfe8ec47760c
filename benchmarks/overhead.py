"""Overhead of `starvewatch.watch()` on the training thread (with vs without, in one run).

    python benchmarks/overhead.py [--quick]

Prints: ns per batch added over bare iteration of a 1M-item iterator; % slowdown of a
DataLoader(TensorDataset, batch_size=64, num_workers=0) loop over 20k batches; and a 30 s loop
of 1 ms steps with the shipping thread busy: p99 step time against the same loop unwatched and
the longest pause the monitor caused. Best of several repeats; these machines are noisy.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

os.environ.setdefault("STARVEWATCH_URL", "off")
os.environ.setdefault("STARVEWATCH_AUTOSTART", "0")
os.environ.setdefault("STARVEWATCH_QUIET", "1")
os.environ.setdefault("STARVEWATCH_DIR", "/tmp/starvewatch-bench")

import starvewatch  # noqa: E402
from starvewatch.hooks.transport import MemoryTransport  # noqa: E402


def settle() -> None:
    """Wait for the previous run's shipper to finish, so repeats never overlap."""
    for thread in threading.enumerate():
        if thread.name.startswith("starvewatch"):
            thread.join(30)


def bare_iteration_ns(n: int, repeats: int) -> tuple[float, float]:
    items = list(range(n))
    best_bare = best_watched = float("inf")
    for _ in range(repeats):
        t = time.perf_counter_ns()
        for _ in items:
            pass
        best_bare = min(best_bare, (time.perf_counter_ns() - t) / n)
        starvewatch.init("overhead-bare", transport=MemoryTransport())
        watched = starvewatch.watch(items)
        t = time.perf_counter_ns()
        for _ in watched:
            pass
        best_watched = min(best_watched, (time.perf_counter_ns() - t) / n)
        starvewatch.finish(quiet=True)
        settle()
    return best_bare, best_watched


def dataloader_slowdown(batches: int, repeats: int) -> tuple[float, float]:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.randn(batches * 64, 8))

    def run(watched: bool) -> float:
        loader = DataLoader(data, batch_size=64, num_workers=0)
        if watched:
            starvewatch.init("overhead-dataloader", transport=MemoryTransport())
            loader = starvewatch.watch(loader)
        t = time.perf_counter()
        for _ in loader:
            pass
        elapsed = time.perf_counter() - t
        if watched:
            starvewatch.finish(quiet=True)
            settle()
        return elapsed

    run(False)  # warm-up: first-touch allocations would count against whichever runs first
    best = {False: float("inf"), True: float("inf")}
    for i in range(repeats):
        for watched in ((False, True) if i % 2 == 0 else (True, False)):
            best[watched] = min(best[watched], run(watched))
    return best[False], best[True]


def busy_wait(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def step_loop(duration_s: float, watched: bool) -> list[float]:
    """1 ms compute steps; returns each step's wall time (s)."""
    source = range(10**9)
    if watched:
        # The spool transport makes the shipper thread do real work (serialize, gzip, write).
        os.environ["STARVEWATCH_URL"] = "off"
        starvewatch.init("overhead-steps")
        source = starvewatch.watch(source)
    times = []
    end = time.perf_counter() + duration_s
    last = time.perf_counter()
    for _ in source:
        busy_wait(0.001)
        now = time.perf_counter()
        times.append(now - last)
        last = now
        if now > end:
            break
    if watched:
        starvewatch.finish(quiet=True)
        settle()
    return times


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args()
    n, batches, loop_s, repeats = (100_000, 2_000, 3.0, 2) if args.quick else (1_000_000, 20_000, 30.0, 7)

    bare, watched = bare_iteration_ns(n, repeats)
    print(f"bare iteration of {n:,} items: {bare:.0f} ns/item bare, {watched:.0f} ns/item watched "
          f"-> {watched - bare:.0f} ns added per batch (target <= 1000)")

    bare_s, watched_s = dataloader_slowdown(batches, repeats)
    print(f"DataLoader(TensorDataset, batch_size=64, num_workers=0), {batches:,} batches: "
          f"{bare_s:.3f} s bare, {watched_s:.3f} s watched -> {100 * (watched_s / bare_s - 1):+.2f}% "
          f"(target <= 1%)")

    # Alternate bare and watched loops; keep each one's best p99 (noise only ever adds).
    runs = {False: [], True: []}
    for _ in range(max(2, repeats // 2)):
        for watched in (False, True):
            runs[watched].append(step_loop(loop_s, watched=watched))
    base_p99 = min(p99(r) for r in runs[False])
    mon_p99 = min(p99(r) for r in runs[True])
    base_max = min(max(r) for r in runs[False])
    mon_max = min(max(r) for r in runs[True])
    pause_ms = (mon_max - base_max) * 1000
    print(f"1 ms steps for {loop_s:.0f} s: p99 {base_p99 * 1e3:.3f} ms bare, {mon_p99 * 1e3:.3f} ms watched "
          f"-> {100 * (mon_p99 / base_p99 - 1):+.2f}% (target <= +5%); longest step "
          f"{mon_max * 1e3:.2f} ms watched vs {base_max * 1e3:.2f} ms bare: the monitor's longest pause "
          f"{max(0.0, pause_ms):.2f} ms (target <= 10 ms)")
    print(f"threads: {[t.name for t in threading.enumerate()]}", file=sys.stderr)


if __name__ == "__main__":
    main()
