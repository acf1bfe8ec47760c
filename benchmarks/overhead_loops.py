"""The loops where users feel `watch()` (issue 20), for benchmarks/overhead.py: start-up and the
CUDA-event path here; the plain iterator and the fast loops are measured for both hot-path cores
in alternating fresh processes by benchmarks/overhead_fresh.py (issue 29: an in-process
alternation left each watched run's threads and memory to the bare run after it).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time

import starvewatch
import starvewatch.hooks.session


def _settle() -> None:
    for thread in threading.enumerate():
        if thread.name.startswith("starvewatch"):
            thread.join(30)


_STARTUP = r"""
import os, sys, time, json
import torch
from torch.utils.data import DataLoader, TensorDataset
import starvewatch
data = TensorDataset(torch.randn(64, 8))
next(iter(DataLoader(data, batch_size=1)))  # torch's own first-iteration costs: not ours
loader = DataLoader(data, batch_size=1)
t = time.perf_counter()
if sys.argv[1] == "watched":
    loader = starvewatch.watch(loader)
next(iter(loader))
ms = (time.perf_counter() - t) * 1e3
print(json.dumps({"ms": ms}))
"""


def startup(repeats: int) -> dict:
    """From `watch()` to the first batch, in fresh processes (bare: from the same point)."""
    times: dict[str, list[float]] = {"bare": [], "watched": []}
    for i in range(repeats):
        for mode in (("bare", "watched") if i % 2 == 0 else ("watched", "bare")):
            out = subprocess.run([sys.executable, "-c", _STARTUP, mode], capture_output=True, text=True,
                                 env=dict(os.environ), check=True).stdout
            times[mode].append(json.loads(out.strip().splitlines()[-1])["ms"])
    bare, watched = statistics.median(times["bare"]), statistics.median(times["watched"])
    return {"repeats": repeats, "bare_ms": bare, "watched_ms": watched, "added_ms": watched - bare,
            "added_ms_max": max(times["watched"]) - statistics.median(times["bare"])}


def cuda_path(batches: int, repeats: int, driver_ns: int) -> dict:
    """Per-batch cost of the GPU-visible path (CUDA events) on a plain iterator, against the
    CPU-only path. Without a GPU, torch.cuda.Event is replaced by a stand-in with its host-side
    Python-level work (tests/standins/fake_cuda.py): that part is measured; the driver calls
    (cudaEventRecord) are counted, and their cost is `driver_ns` each (an assumption, stated)."""
    from starvewatch.hooks import cuda
    real = False
    try:
        import torch
        real = torch.cuda.is_available()
    except ImportError:
        pass
    if real:
        torch.cuda.init()
        factory = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
        counter = None
    else:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from tests.standins.fake_cuda import StandInCuda
        counter = StandInCuda(driver_ns=0)
        factory = counter.event
    items = list(range(batches))
    detect = cuda.detect_event_factory

    def per_batch_ns(every: int | None) -> tuple[float, int]:
        best, records = float("inf"), 0
        for _ in range(repeats):
            if every is None:
                t = time.perf_counter_ns()
                for _ in items:
                    pass
                best = min(best, (time.perf_counter_ns() - t) / batches)
                continue
            cuda.detect_event_factory = (lambda: factory) if every else (lambda: None)
            try:
                session = starvewatch.init("overhead-cuda")
                if every:
                    # A pool that never runs dry, so that each row measures `every` itself (a
                    # run's pool of 128 pairs caps measured steps at 128 per ship interval).
                    session._gpu_timer = cuda.CudaEventTimer(factory, pool_size=2 * batches // every + 8,
                                                             every=every)
                before = counter.calls["record"] if counter else 0
                watched = starvewatch.watch(items)
                t = time.perf_counter_ns()
                for _ in watched:
                    pass
                best = min(best, (time.perf_counter_ns() - t) / batches)
                records = (counter.calls["record"] - before) if counter else 0
                starvewatch.finish(quiet=True)
                _settle()
            finally:
                cuda.detect_event_factory = detect
        return best, records

    bare, _ = per_batch_ns(None)
    cpu_only, _ = per_batch_ns(0)
    out = {"device": "cuda" if real else "stand-in", "batches": batches,
           "assumed_driver_ns_per_record": None if real else driver_ns,
           "cpu_path_added_ns": cpu_only - bare, "rows": []}
    for every in (1, 4, 16):
        ns, records = per_batch_ns(every)
        row = {"every": every, "added_ns": ns - bare, "python_level_added_ns": ns - bare,
               "event_records_per_batch": records / batches if not real else 2 / every}
        if not real:
            row["with_driver_ns"] = ns - bare + row["event_records_per_batch"] * driver_ns
        out["rows"].append(row)
    return out


def table(results: dict) -> str:
    """The README's table format: | what | measured | target | command |."""
    rows = []
    cmd = "`python benchmarks/overhead.py`"
    plain = results.get("plain_iterator")
    if plain and "cores" in plain:
        rows.append(("`watch()` cost per item over bare iteration of a list (fresh processes)",
                     "; ".join(f"{core} core **{c['added_ns']:+.0f} ns** wall ({c['thread_cpu_added_ns']:+.0f} ns "
                               f"training thread's CPU)" for core, c in plain["cores"].items()), "C core ≤ 100 ns"))
    for key, what in (("fast_dataloader", "`DataLoader(TensorDataset, batch_size=1, num_workers=0)`, step `b[0] + 1`"),
                      ("train_step", "same loader + a tiny `nn.Linear` train step")):
        r = results.get(key)
        if r and "cores" in r:
            rows.append((f"{what}: what `watch()` adds ({r['bare_ns_per_batch'] / 1e3:.1f} µs per batch bare)",
                         "; ".join(f"{core} core **{c['added_pct']:+.2f}%** wall (training thread's CPU "
                                   f"{c['thread_cpu_added_pct']:+.2f}%; sidecar {c['sidecar_cpu_us_per_batch']:.2f} µs "
                                   f"CPU per batch)" for core, c in r["cores"].items())
                         + f", median of {r['rounds']} rounds of fresh processes", "≤ +1%"))
    s = results.get("startup")
    if s:
        rows.append(("from `watch()` to the first batch, over bare (fresh processes)",
                     f"**+{s['added_ms']:.1f} ms** (median of {s['repeats']}; {s['watched_ms']:.1f} vs {s['bare_ms']:.1f} ms)",
                     "≤ 50 ms"))
    c = results.get("cuda_path")
    if c:
        parts = []
        for row in c["rows"]:
            text = f"{row['event_records_per_batch']:.2f} event records per batch: +{row['added_ns']:.0f} ns"
            if c["device"] == "stand-in":
                text += f" Python-level, ~{row['with_driver_ns']:.0f} ns with the driver calls"
            parts.append(text)
        rows.append((f"CUDA-event path per batch ({c['device']}"
                     + (f", driver call assumed {c['assumed_driver_ns_per_record']} ns)" if c["device"] == "stand-in" else ")"),
                     "; ".join(parts) + f" (CPU-only path: +{c['cpu_path_added_ns']:.0f} ns)", "—"))
    for key, what, target in (("p99", "1 ms steps, p99 step time watched vs bare", "≤ +5%"),
                              ("pause", "longest pause the monitor caused in that loop", "≤ 10 ms")):
        r = results.get(key)
        if r:
            rows.append((what, f"**{r['text']}**", target))
    lines = ["| what | measured | target | command |", "|---|---|---|---|"]
    lines += [f"| {w} | {m} | {t} | {cmd} |" for w, m, t in rows]
    return "\n".join(lines)
