"""Acceptance benchmark of live tuning (issue 39 item 7): a tuned run against a sweep.

    python -m benchmarks.live_tuning [--quick] [--docs] [--only NAME ...]

On the scenario harness's starved cases (benchmarks/scenarios/cases.py: its datasets, step
times, CPU hog and worker start-up), each run on the whole training loop (loading and the
sleeping, GPU-like step):

- io_latency: 4 ms reads an item, num_workers=0 (cases' workers0_slow_getitem);
- cpu_bound_pinned: 2 ms of CPU an item, num_workers=0, the process (and so its workers)
  fixed by affinity to the scenario's 2 cores (cases' cpu_bound_workers0_capped);
- cpu_beside_hog: the same CPU-bound items on the same 2 pinned cores beside a CPU hog of one
  core (cases.hog, as the harness's --hog runs it), so workers share the cores with it;
- startup_bound: 16 short batches an epoch, 2 workers that take 0.25 s each to start and are
  not persistent (cases' persistent_off_slow_startup).

Per case: a bounded sweep of the whole loop over num_workers {0, 1, 2, 4} x persistent_workers
x prefetch_factor {2, 4} (13 configurations: the last two mean nothing at 0 workers), measured
before and after the tuned run and the mean taken (the host's load moves); then the tuned run
(watch(tune=True), a few epochs from the case's own configuration) and the found (final)
configuration measured untuned in both passes beside the sweep. It passes when the final
configuration reaches within 10% of the sweep's best (mean samples/s >= 0.9 x best) and the
tuned run never ended slower than it started (its measured gain, final windows over start
windows, not below 1 beyond noise: the interval's high end >= 1).

--quick: 5 configurations (0, 1, 2 workers; 2 persistent; 2 prefetch 4), shorter epochs and
fewer tuned epochs: checks that the benchmark works, not the acceptance figures. Results go to
benchmarks/results/live_tuning.json (or live_tuning-quick.json) with the date, the load average
before and after, every rate; --docs writes the table into docs/tuning.md between the markers.
A full run takes about 4 minutes on 2 cores at a load of 3 (6 at a load of 8), estimated from
the quick runs' rates (--quick: 46-131 s wall): per case 28 measurements of 1-2 s and a tuned run of
10-14 epochs. Exit status 1 when a case fails.
"""
from __future__ import annotations

import argparse
import gc
import itertools
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass

os.environ.setdefault("STARVEWATCH_URL", "off")
os.environ.setdefault("STARVEWATCH_AUTOSTART", "0")
os.environ.setdefault("STARVEWATCH_QUIET", "1")
os.environ.setdefault("STARVEWATCH_DIR", tempfile.mkdtemp(prefix="starvewatch-live-tuning-"))
warnings.filterwarnings("ignore", message="This DataLoader will create")

from benchmarks import results_io  # noqa: E402  (after the environment above)

WITHIN = 0.9  # the final configuration reaches 90% of the sweep's best
DOCS = results_io.ROOT / "docs" / "tuning.md"
BEGIN, END = "<!-- live-tuning:begin -->", "<!-- live-tuning:end -->"


@dataclass
class Case:
    name: str
    description: str
    dataset: object            # () -> Dataset
    kwargs: dict               # the DataLoader arguments the tuned run starts from
    compute_s: float           # the step's (sleeping, GPU-like) time
    epochs: int                # epochs of one sweep measurement
    tuned_epochs: int          # epochs of the tuned run
    pinned_cores: int = 0      # the process fixed to this many cores by affinity (0: not pinned)
    hog_cores: float = 0.0     # beside a CPU hog of this many cores


def cases(quick: bool) -> list[Case]:
    from benchmarks.scenarios.cases import Items, slow_worker_start
    n = 96 if quick else 192  # items an epoch: 12 (24) batches of 8
    return [
        Case("io_latency", "4 ms reads an item, num_workers=0, 16 ms steps",
             lambda: Items(n, sleep_s=0.004), {"batch_size": 8, "num_workers": 0}, 0.016,
             epochs=2, tuned_epochs=6 if quick else 10),
        Case("cpu_bound_pinned", "2 ms of CPU an item, num_workers=0, 8 ms steps, pinned to 2 cores",
             lambda: Items(n, spin_s=0.002), {"batch_size": 8, "num_workers": 0}, 0.008,
             epochs=2, tuned_epochs=6 if quick else 10, pinned_cores=2),
        Case("cpu_beside_hog", "the same CPU-bound items on 2 pinned cores beside a CPU hog of 1 core",
             lambda: Items(n, spin_s=0.002), {"batch_size": 8, "num_workers": 0}, 0.008,
             epochs=2, tuned_epochs=6 if quick else 10, pinned_cores=2, hog_cores=1.0),
        Case("startup_bound", "16 batches an epoch, 2 workers starting in 0.25 s each, not persistent",
             lambda: Items(64, sleep_s=0.0005),
             {"batch_size": 4, "num_workers": 2, "worker_init_fn": slow_worker_start}, 0.005,
             epochs=3 if quick else 4, tuned_epochs=8 if quick else 14),
    ]


def sweep_configs(quick: bool) -> list[dict]:
    """The bounded sweep: num_workers {0, 1, 2, 4} x persistent_workers x prefetch_factor {2, 4}."""
    if quick:
        return [{"num_workers": 0}, {"num_workers": 1, "persistent_workers": False, "prefetch_factor": 2},
                {"num_workers": 2, "persistent_workers": False, "prefetch_factor": 2},
                {"num_workers": 2, "persistent_workers": True, "prefetch_factor": 2},
                {"num_workers": 2, "persistent_workers": False, "prefetch_factor": 4}]
    return [{"num_workers": 0}] + [{"num_workers": w, "persistent_workers": p, "prefetch_factor": f}
                                   for w, p, f in itertools.product((1, 2, 4), (False, True), (2, 4))]


def label(config: dict) -> str:
    workers = config.get("num_workers") or 0
    if not workers:
        return "0 workers"
    return (f"{workers} worker{'s' if workers != 1 else ''}, prefetch {config.get('prefetch_factor') or 2}"
            + (", persistent" if config.get("persistent_workers") else ""))


def _loader(case: Case, config: dict, dataset):
    from torch.utils.data import DataLoader
    kwargs = dict(case.kwargs)
    kwargs.update({k: v for k, v in config.items() if k in ("num_workers", "persistent_workers", "prefetch_factor")})
    if not kwargs.get("num_workers"):
        for key in ("worker_init_fn", "persistent_workers", "prefetch_factor"):
            kwargs.pop(key, None)
    return DataLoader(dataset, **kwargs)


def _loop(case: Case, loader, epochs: int) -> float:
    """The whole training loop over `epochs` epochs (each iter() included): samples/s."""
    samples = 0
    t0 = time.perf_counter()
    for _ in range(epochs):
        for batch in loader:
            samples += batch.shape[0]
            time.sleep(case.compute_s)
    return samples / (time.perf_counter() - t0)


def measure(case: Case, config: dict) -> float:
    dataset = case.dataset()
    loader = _loader(case, config, dataset)
    try:
        return _loop(case, loader, case.epochs)
    finally:
        del loader  # persistent workers end with their loader
        gc.collect()  # now, not in a later worker forked with the dead iterator in its memory


def tuned_run(case: Case) -> dict:
    """watch(tune=True) from the case's own configuration: the outcome (start, final, gain),
    the windows, and the tuned run's own samples/s."""
    import starvewatch
    from starvewatch.analysis.live_tuning import tuned_part
    starvewatch.init(f"live-tuning-{case.name}")
    loader = starvewatch.watch(_loader(case, {}, case.dataset()), name="train", tune=True)
    rate = _loop(case, loader, case.tuned_epochs)
    summary = starvewatch.finish(quiet=True) or {}
    del loader
    gc.collect()
    tuning = summary.get("live_tuning") or {}
    outcome = next(iter(tuning.get("loaders") or []), None) or {
        "start": tuned_part(case.kwargs), "final": tuned_part(case.kwargs), "gain": None}
    return {"outcome": {k: outcome.get(k) for k in ("start", "final", "gain", "windows", "stopped", "disabled")},
            "decisions": [(r.get("window"), label(r.get("config") or {}), r.get("decision"))
                          for r in tuning.get("records") or []],
            "samples_per_s": rate}


def _pinned(cores: int):
    """Fix this process (its workers and hog after it) to its first `cores` CPUs; the undo."""
    if not cores or not hasattr(os, "sched_setaffinity"):
        return lambda: None
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(before)[:cores])
    return lambda: os.sched_setaffinity(0, before)


def start_hog(cores: float):
    """cases.hog in `cores` processes (whole cores, then a part) until the returned stop. Spawned,
    not forked as the harness's are: a forked child would inherit the loaders of the cases
    before and run their iterators' finalizers at its exit."""
    import math
    import multiprocessing

    from benchmarks.scenarios.cases import hog
    if cores <= 0:
        return lambda: None
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=hog, args=(stop, min(1.0, cores - i)), daemon=True) for i in range(math.ceil(cores))]
    for proc in procs:
        proc.start()

    def halt():
        stop.set()
        for proc in procs:
            proc.join(10)
    return halt


def run_case(case: Case, configs: list[dict]) -> dict:
    from starvewatch.analysis.live_tuning import tuned_part
    unpin = _pinned(case.pinned_cores)
    halt = start_hog(case.hog_cores)  # after pinning: the hog shares the scenario's cores
    t0 = time.perf_counter()
    try:
        before = [measure(case, c) for c in configs]
        tuned = tuned_run(case)
        final = dict(tuned["outcome"]["final"])
        # The found configuration, untuned, beside the sweep's second pass
        final_rates = [measure(case, final)]
        after = [measure(case, c) for c in configs]
        final_rates.append(measure(case, final))
    finally:
        halt()
        unpin()
    sweep = [{"config": label(c), "before": b, "after": a, "mean": (a + b) / 2}
             for c, b, a in zip(configs, before, after)]
    best = max(sweep, key=lambda s: s["mean"])
    start = next((s for s, c in zip(sweep, configs) if tuned_part(c) == tuned_part(case.kwargs)), None)
    final_mean = sum(final_rates) / 2
    gain = tuned["outcome"].get("gain")
    not_slower = gain is None and final == tuned["outcome"]["start"] or bool(gain and gain["high"] >= 1.0)
    return {"name": case.name, "description": case.description, "pinned_cores": case.pinned_cores,
            "hog_cores": case.hog_cores, "sweep": sweep, "best": best,
            "start_samples_per_s": start["mean"] if start else None,
            "tuned": tuned, "final": label(final), "final_samples_per_s": final_mean,
            "final_over_best": final_mean / best["mean"],
            "checks": {"within_10pct_of_best": final_mean >= WITHIN * best["mean"], "never_slower": not_slower},
            "ok": final_mean >= WITHIN * best["mean"] and not_slower,
            "seconds": time.perf_counter() - t0}


def markdown(report: dict) -> str:
    lines = [f"Measured {report['measured_at']} on {report['cpu_count']} CPUs (load average "
             f"{report['load_average'][0]:.1f} before, {report['load_average_end'][0]:.1f} after)"
             + (", **quick run** (fewer configurations, shorter epochs)" if report["quick"] else "")
             + f"; {report['configurations']} configurations swept before and after the tuned run, mean taken.", "",
             "| case | start | sweep's best | found by tuning | found / best | tuned run's gain | pass |",
             "|---|---|---|---|---:|---|---|"]
    for r in report["cases"]:
        gain = r["tuned"]["outcome"].get("gain")
        gain_text = f"{gain['speedup']:.2f}x [{gain['low']:.2f}, {gain['high']:.2f}]" if gain else "kept its start"
        start = f"{r['start_samples_per_s']:.0f}/s" if r["start_samples_per_s"] else "n/a"
        lines.append(f"| {r['name']} | {label(r['tuned']['outcome']['start'])} ({start}) | "
                     f"{r['best']['config']} ({r['best']['mean']:.0f}/s) | {r['final']} "
                     f"({r['final_samples_per_s']:.0f}/s) | {r['final_over_best']:.2f} | {gain_text} | "
                     f"{'yes' if r['ok'] else '**no**'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer configurations, shorter runs")
    parser.add_argument("--docs", action="store_true", help="write the table into docs/tuning.md")
    parser.add_argument("--only", nargs="*", help="only these cases")
    args = parser.parse_args()
    report = results_io.started(args, args.quick)
    configs = sweep_configs(args.quick)
    report["configurations"] = len(configs)
    report["cases"] = []
    for case in cases(args.quick):
        if args.only and case.name not in args.only:
            continue
        row = run_case(case, configs)
        report["cases"].append(row)
        print(f"{case.name}: start {label(row['tuned']['outcome']['start'])}, best {row['best']['config']} "
              f"{row['best']['mean']:.0f}/s, found {row['final']} {row['final_samples_per_s']:.0f}/s "
              f"({row['final_over_best']:.2f} of best), {'ok' if row['ok'] else 'FAIL'} "
              f"in {row['seconds']:.0f} s (load {os.getloadavg()[0]:.1f})", flush=True)
    report["ok"] = all(r["ok"] for r in report["cases"])
    name = "live_tuning-quick.json" if args.quick else "live_tuning.json"
    results_io.write(report, results_io.RESULTS / name)
    table = markdown(report)
    print(table)
    if args.docs:
        DOCS.write_text(results_io.replace_section(DOCS.read_text(), BEGIN, END, table))
        print(f"written into {DOCS}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
