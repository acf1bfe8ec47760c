"""Overhead of `starvewatch.watch()` on the training thread (with vs without).

    python benchmarks/overhead.py [--quick] [--only PARTS] [--rounds R] [--interval S]

Prints: for both hot-path cores, from alternating fresh processes (benchmarks/overhead_fresh.py),
ns per item added over bare iteration of a list, and the % that `watch()` adds to a fast
DataLoader(batch_size=1) loop and to a tiny train step, the sidecar's CPU apart; % slowdown of a
DataLoader(TensorDataset, batch_size=64, num_workers=0) loop over 20k batches; and a 30 s loop
of 1 ms steps (30 s on each side, alternating segments) with the shipping thread busy: p99 step
time against the same loop unwatched, and the longest time the training thread was held up
(the largest gap between two consecutive clock reads of its busy loop), watched vs bare.
Repeats and alternation throughout; these machines are noisy. Figures also go to
benchmarks/results/overhead.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

# What a run with no collector does: batches go through the sidecar into the spool (with a
# collector, the training process does the same work; the sidecar sends instead of writing).
os.environ.setdefault("STARVEWATCH_URL", "off")
os.environ.setdefault("STARVEWATCH_AUTOSTART", "0")
os.environ.setdefault("STARVEWATCH_QUIET", "1")
os.environ.setdefault("STARVEWATCH_DIR", "/tmp/starvewatch-bench")

import starvewatch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script
from benchmarks import overhead_fresh, overhead_loops, results_io  # noqa: E402
from benchmarks.ticker import timed_steps  # noqa: E402


def settle() -> None:
    """Wait for the previous run's shipper to finish, so repeats never overlap."""
    for thread in threading.enumerate():
        if thread.name.startswith("starvewatch"):
            thread.join(30)


def dataloader_slowdown(batches: int, repeats: int) -> tuple[float, float]:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.randn(batches * 64, 8))

    monitor_cpu, sidecar_cpu = [], []
    thread_cpu: dict[bool, list[float]] = {False: [], True: []}  # the training thread's own CPU

    def run(watched: bool) -> float:
        loader = DataLoader(data, batch_size=64, num_workers=0)
        if watched:
            session = starvewatch.init("overhead-dataloader")
            loader = starvewatch.watch(loader)
            ids = [session.shipper.native_id] + [s.native_id for s in session.samplers]
            cpu0, sidecar0 = threads_cpu_s(ids), sidecar_cpu_s(session)
        t, c = time.perf_counter(), time.thread_time()
        for _ in loader:
            pass
        elapsed = time.perf_counter() - t
        thread_cpu[watched].append(time.thread_time() - c)
        if watched:
            monitor_cpu.append((threads_cpu_s(ids) - cpu0) / elapsed)
            sidecar_cpu.append((sidecar_cpu_s(session) - sidecar0) / elapsed)
            starvewatch.finish(quiet=True)
            settle()
        return elapsed

    run(False)  # warm-up: first-touch allocations would count against whichever runs first
    # Pairs run back to back (alternating which goes first) see the same machine: the median of
    # the pairs' ratios is robust to the drift of a shared, noisy host.
    ratios, bare_times, watched_times = [], [], []
    for i in range(repeats):
        order = (False, True) if i % 2 == 0 else (True, False)
        times = {watched: run(watched) for watched in order}
        bare_times.append(times[False])
        watched_times.append(times[True])
        ratios.append(times[True] / times[False])
    cpu_ratios = [w / b for b, w in zip(thread_cpu[False][1:], thread_cpu[True])]
    return (min(bare_times), min(watched_times), statistics.median(ratios),
            statistics.median(monitor_cpu), statistics.median(sidecar_cpu), statistics.median(cpu_ratios))


def sidecar_cpu_s(session) -> float:
    """CPU seconds used so far by the run's sidecar process (another process: not the loop's)."""
    if session.sidecar is None:
        return 0.0
    try:
        fields = open(f"/proc/{session.sidecar.proc.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def threads_cpu_s(native_ids) -> float:
    """CPU seconds used so far by the given threads of this process (Linux /proc)."""
    total = 0.0
    for tid in native_ids:
        try:
            fields = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return total


def step_loop(duration_s: float, watched: bool) -> tuple[list[float], list[float]]:
    """1 ms compute steps (benchmarks/ticker.py). Returns each step's wall time (s) and each
    step's longest hold-up (s). Bare and watched segments see the same OS; what the watched
    side adds is the monitor's pause."""
    source = range(10**9)
    if watched:
        starvewatch.init("overhead-steps")
        source = starvewatch.watch(source)
    times, holdups = timed_steps(source, duration_s)
    if watched:
        starvewatch.finish(quiet=True)
        settle()
    return times, holdups


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--only", help="comma-separated: plain,dataloader,p99,fast,train,startup,cuda "
                        "(the parts not run keep their figures in overhead.json)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds of fresh processes for plain, fast and train (default 8; --quick 2)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between two of those processes")
    parser.add_argument("--driver-ns", type=int, default=2000,
                        help="assumed host cost of one cudaEventRecord for the CUDA stand-in (ns)")
    args = parser.parse_args()
    n, batches, loop_s, repeats = (100_000, 2_000, 3.0, 2) if args.quick else (1_000_000, 20_000, 30.0, 6)
    only = set(args.only.split(",")) if args.only else None
    # fewer rounds of fresh processes than the default 8 is a shortened run too
    results = results_io.started(args, args.quick or (args.rounds is not None and args.rounds < 8))

    fresh_loops(args, only, results)  # plain, fast, train: benchmarks/overhead_fresh.py, both cores
    new_loops(args, only, results)  # issue 20's loops: benchmarks/overhead_loops.py
    if only is not None and not only & {"dataloader", "p99"}:
        finish_report(results, only)
        return

    bare_s, watched_s, ratio, cpu_share, sidecar_share, cpu_ratio = dataloader_slowdown(batches, repeats * 2)
    print(f"DataLoader(TensorDataset, batch_size=64, num_workers=0), {batches:,} batches: best of "
          f"{repeats * 2}: {bare_s:.3f} s bare, {watched_s:.3f} s watched -> {100 * (watched_s / bare_s - 1):+.2f}% "
          f"(target <= 1%); median of paired ratios {100 * (ratio - 1):+.2f}%; the monitor's threads used "
          f"{100 * cpu_share:.2f}% of the loop's time in CPU (the sidecar process, on another core: "
          f"{100 * sidecar_share:.2f}%); the training thread's own CPU time: {100 * (cpu_ratio - 1):+.2f}% "
          f"(median of paired ratios)")

    # 30 s of steps on each side, in short segments that alternate (bare, watched, watched,
    # bare, ...): this shared VM has bursts of noise lasting seconds, and a burst then hits
    # both sides alike instead of deciding a 30 s pair. Each watched segment is a whole run
    # (init, sidecar start-up, finish), so start-up costs are counted more often, not less.
    segment_s = 3.0 if not args.quick else 1.0
    pooled: dict[bool, list[float]] = {False: [], True: []}
    holdups: dict[bool, list[float]] = {False: [], True: []}
    for i in range(max(2, round(loop_s / segment_s))):
        for watched in ((False, True) if i % 2 == 0 else (True, False)):
            times, held = step_loop(segment_s, watched=watched)
            pooled[watched] += times
            holdups[watched] += held
    bare_p99, mon_p99 = p99(pooled[False]), p99(pooled[True])
    median = statistics.median(pooled[False])
    slowed = {w: sum(1 for t in pooled[w] if t > 1.05 * median) / len(pooled[w]) for w in pooled}
    print(f"1 ms steps, {loop_s:.0f} s on each side in alternating {segment_s:.0f} s segments: p99 "
          f"{bare_p99 * 1e3:.3f} ms bare, {mon_p99 * 1e3:.3f} ms watched -> {100 * (mon_p99 / bare_p99 - 1):+.2f}% "
          f"(target <= +5%); steps over 1.05x the bare median: {100 * slowed[False]:.2f}% bare, "
          f"{100 * slowed[True]:.2f}% watched")
    pauses = {w: pause_figures(holdups[w], len(pooled[w]) * 0.001) for w in holdups}
    print(f"longest time the training thread was held up (the gap between two clock reads of its "
          f"busy loop): {pauses[True]['longest_ms']:.2f} ms watched, {pauses[False]['longest_ms']:.2f} ms bare "
          f"(target <= 10 ms watched); 99.9th percentile of each step's longest hold-up: "
          f"{pauses[True]['p999_ms']:.3f} ms watched, {pauses[False]['p999_ms']:.3f} ms bare; hold-ups over "
          f"1 ms per minute: {pauses[True]['over_1ms_per_min']:.1f} watched, "
          f"{pauses[False]['over_1ms_per_min']:.1f} bare")
    results["p99"] = {"bare_ms": bare_p99 * 1e3, "watched_ms": mon_p99 * 1e3,
                      "added_pct": 100 * (mon_p99 / bare_p99 - 1),
                      "text": f"{100 * (mon_p99 / bare_p99 - 1):+.2f}% ({mon_p99 * 1e3:.3f} vs {bare_p99 * 1e3:.3f} ms)"}
    results["pause"] = {"ms": pauses[True]["longest_ms"], "bare_ms": pauses[False]["longest_ms"],
                        "holdups": {"watched": pauses[True], "bare": pauses[False]},
                        "text": f"{pauses[True]['longest_ms']:.2f} ms watched, {pauses[False]['longest_ms']:.2f} ms bare"}
    print(f"threads: {[t.name for t in threading.enumerate()]}", file=sys.stderr)
    finish_report(results, only)


# ---- issue 20: the loops where users feel the overhead (benchmarks/overhead_loops.py) -------

RESULTS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "overhead.json")


FRESH = {"plain": "plain_iterator", "fast": "fast_dataloader", "train": "train_step"}  # loop -> results key


def fresh_loops(args, only, results: dict) -> None:
    """The plain iterator and the fast loops, for both cores, from alternating fresh processes."""
    loops = [loop for loop in FRESH if only is None or loop in only]
    if not loops:
        return
    rounds = args.rounds or (2 if args.quick else 8)
    figures = overhead_fresh.measure(loops, rounds, args.interval, args.quick)
    for loop, f in figures.items():
        results[FRESH[loop]] = f
        print(overhead_fresh.describe(loop, f), flush=True)


def new_loops(args, only, results: dict) -> None:
    loops = overhead_loops
    quick = args.quick
    wanted = (lambda key: only is None or key in only)
    if wanted("startup"):
        results["startup"] = loops.startup(2 if quick else 8)
    if wanted("cuda"):
        results["cuda_path"] = loops.cuda_path(50_000 if quick else 300_000, 3 if quick else 5, args.driver_ns)
    print(loops.table(results), flush=True)


def finish_report(results: dict, only=None) -> None:
    print()
    print(overhead_loops.table(results))
    if only is not None and os.path.exists(RESULTS_PATH):
        # a partial run: the parts it did not run keep their figures, each with its own date
        with open(RESULTS_PATH) as f:
            before = json.load(f)
        parts = set(FRESH.values()) | {"dataloader", "p99", "pause", "startup", "cuda_path"}
        dates, quick = before.get("part_measured_at", {}), before.get("part_quick", {})
        for key in parts:
            if key in results:
                dates[key], quick[key] = results["measured_at"], results["quick"]
            elif key in before:
                results[key] = before[key]
                dates.setdefault(key, before.get("measured_at"))
                quick.setdefault(key, bool(before.get("quick")))
        results["part_measured_at"], results["part_quick"] = dates, quick
        results["quick"] = any(quick.values())
    results_io.write(results, RESULTS_PATH)  # adds the load at the end


def pause_figures(holdups: list[float], seconds: float) -> dict:
    ordered = sorted(holdups)
    return {"longest_ms": 1e3 * ordered[-1], "p999_ms": 1e3 * ordered[min(len(ordered) - 1, int(0.999 * len(ordered)))],
            "over_1ms_per_min": 60 * sum(1 for h in holdups if h > 0.001) / max(seconds, 1e-9)}


if __name__ == "__main__":
    main()
