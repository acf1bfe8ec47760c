"""Acceptance benchmark of `starvewatch tune`: its answers against an exhaustive sweep.

    python -m benchmarks.tune [--budget 60] [--sweep-s 3] [--repeats 3] [--only io cpu bursty]

For an I/O-bound dataset (sleeping __getitem__), a CPU-bound one and a bursty one (and, with
`--only periodic`, a hard case whose throughput is not monotonic in the workers count):

1. the exhaustive sweep: num_workers in 0, 1, 2, 3, 4, 6, 8, 12, 16 x prefetch_factor 2 and 4,
   each measured `--repeats` times for `--sweep-s` seconds (best kept), in rounds so that the
   host's drift touches every configuration alike;
2. the tuner within `--budget`, without a consumption rate, then with one (half the sweep's
   best throughput), its wall time measured around the call;
3. the tuner's answers measured the sweep's way (they may be counts the sweep does not have).

Checks: without a consumption rate the answer reaches 90% of the sweep's best; with one it
covers consumption x 1.2 with no more workers than the sweep says are needed; every tuner
call ends within its budget + 5%. Writes benchmarks/results/tune.json and tune.md
(tune-<datasets>.* with --only).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("STARVEWATCH_URL", "off")
os.environ.setdefault("STARVEWATCH_AUTOSTART", "0")
warnings.filterwarnings("ignore", message="This DataLoader will create")

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

RESULTS = Path(__file__).with_name("results")
SWEEP_WORKERS = (0, 1, 2, 3, 4, 6, 8, 12, 16)
SWEEP_PREFETCH = (2, 4)
CONSUMPTION_SHARE = 0.5   # the consumption rate given to the tuner: half the sweep's best


class IOBound(Dataset):
    """Every item waits 4 ms (a read from slow or remote storage); no CPU."""

    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        time.sleep(0.004)
        return torch.zeros(64)


class CPUBound(Dataset):
    """Every item is ~2 ms of pure-Python work (decoding, augmentation)."""

    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        acc = 0
        for k in range(12_000):
            acc += (k * i) % 7
        return torch.full((64,), float(acc % 5))


class Bursty(Dataset):
    """Mostly fast items (0.5 ms), but one item in 128, at random (seeded), hits cold storage
    (80 ms): waits come in bursts."""

    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        slow = (i * 2654435761) % 2**32 < 2**32 // 128  # a fixed pseudo-random 1/128 of the items
        time.sleep(0.08 if slow else 0.0005)
        return torch.zeros(64)


class Periodic(Dataset):
    """A hard case: one batch in 16 is slow (80 ms). DataLoader hands batches to workers in
    turn, so with 8 or 16 workers every slow batch lands on the same worker: throughput is not
    monotonic in the workers count."""

    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        time.sleep(0.08 if (i // 8) % 16 == 0 and i % 8 == 0 else 0.0005)
        return torch.zeros(64)


DATASETS = {"io": IOBound, "cpu": CPUBound, "bursty": Bursty, "periodic": Periodic}
DEFAULT_DATASETS = ["io", "cpu", "bursty"]
BATCH_SIZE = 8


def factory(name: str):
    cls = DATASETS[name]

    def make(**kwargs):
        return DataLoader(cls(), batch_size=BATCH_SIZE, **kwargs)
    return make


def measure(make, workers: int, prefetch: int | None, seconds: float) -> float:
    """Loader-only batches/s over `seconds`, after a warm-up past the prefetched burst."""
    kwargs = {"num_workers": workers}
    if workers:
        kwargs["prefetch_factor"] = prefetch
    loader = make(**kwargs)
    it = iter(loader)
    try:
        for _ in range(2 + workers * (prefetch or 0)):
            next(it)
        start, n = time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            next(it)
            n += 1
        return n / (time.perf_counter() - start)
    finally:
        it._shutdown_workers() if hasattr(it, "_shutdown_workers") else None
        del it


def sweep_configs():
    out = [(0, None)]
    for w in SWEEP_WORKERS[1:]:
        out += [(w, p) for p in SWEEP_PREFETCH]
    return out


def sweep(make, configs, seconds: float, repeats: int, log) -> dict:
    best: dict = {}
    for round_ in range(repeats):
        for w, p in configs:
            rate = measure(make, w, p, seconds)
            best[(w, p)] = max(rate, best.get((w, p), 0.0))
        log(f"    sweep round {round_ + 1}/{repeats} done")
    return best


def run_tuner(make, budget: float, consumption: float | None):
    import starvewatch
    start = time.perf_counter()
    result = starvewatch.tune(make, budget_s=budget, consumption_batches_per_s=consumption, out=False)
    wall = time.perf_counter() - start
    cfg = result.config
    return {"answer": cfg.to_dict() if cfg else None, "label": cfg.label() if cfg else None,
            "tuner_batches_per_s": result.answer.batches_per_s if result.answer else None,
            "trials": len(result.trials), "wall_s": round(wall, 2), "budget_s": budget,
            "within_budget": wall <= budget * 1.05, "rule": result.rule,
            "table": result.table()}


def bench(name: str, args, log) -> dict:
    make = factory(name)
    configs = sweep_configs()
    log(f"[{name}] sweep: {len(configs)} configurations x {args.repeats} x {args.sweep_s} s")
    best = sweep(make, configs, args.sweep_s, args.repeats, log)
    top_cfg, top = max(best.items(), key=lambda kv: kv[1])
    consumption = CONSUMPTION_SHARE * top
    needed = consumption * 1.2
    covering = [w for (w, _), r in best.items() if r >= needed]
    sweep_needed = min(covering) if covering else None
    log(f"[{name}] sweep best {top:.1f} batches/s at {top_cfg}; tuner without consumption")
    free = run_tuner(make, args.budget, None)
    log(f"[{name}] tuner with consumption {consumption:.1f} batches/s")
    paced = run_tuner(make, args.budget, consumption)
    # The answers measured the sweep's way.
    for result in (free, paced):
        cfg = result["answer"]
        key = (cfg["num_workers"], cfg["prefetch_factor"])
        rates = [measure(make, key[0], key[1], args.sweep_s) for _ in range(args.repeats)]
        result["sweep_method_batches_per_s"] = max(rates + ([best[key]] if key in best else []))
    free["reaches_90pct_of_best"] = free["sweep_method_batches_per_s"] >= 0.9 * top
    paced["covers_consumption_x1_2"] = paced["sweep_method_batches_per_s"] >= needed
    paced["workers_le_sweep_needed"] = sweep_needed is not None and paced["answer"]["num_workers"] <= sweep_needed
    return {"dataset": name, "sweep": {f"{w},{p}": round(r, 2) for (w, p), r in best.items()},
            "sweep_best": {"config": list(top_cfg), "batches_per_s": round(top, 2)},
            "consumption_batches_per_s": round(consumption, 2), "needed_batches_per_s": round(needed, 2),
            "sweep_workers_needed": sweep_needed, "without_consumption": free, "with_consumption": paced,
            "ok": bool(free["reaches_90pct_of_best"] and paced["covers_consumption_x1_2"]
                       and paced["workers_le_sweep_needed"] and free["within_budget"] and paced["within_budget"])}


def markdown(results: list[dict], args) -> str:
    lines = [f"Measured on {platform.node()} ({os.cpu_count()} cores), "
             f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; tuner budget {args.budget:g} s, sweep best of "
             f"{args.repeats} x {args.sweep_s:g} s.", "",
             "| dataset | sweep best | tuner answer (no rate) | its batches/s | of best | consumption x1.2 | "
             "sweep needs | tuner answer (with rate) | its batches/s | wall / budget | ok |",
             "|---|---|---|---:|---:|---:|---:|---|---:|---|---|"]
    for r in results:
        free, paced = r["without_consumption"], r["with_consumption"]
        w, p = r["sweep_best"]["config"]
        lines.append(
            f"| {r['dataset']} | {r['sweep_best']['batches_per_s']:.1f} (w={w}, pf={p}) | {free['label']} | "
            f"{free['sweep_method_batches_per_s']:.1f} | "
            f"{100 * free['sweep_method_batches_per_s'] / r['sweep_best']['batches_per_s']:.0f}% | "
            f"{r['needed_batches_per_s']:.1f} | {r['sweep_workers_needed']} workers | {paced['label']} | "
            f"{paced['sweep_method_batches_per_s']:.1f} | {free['wall_s']:.1f} s, {paced['wall_s']:.1f} s / "
            f"{args.budget:g} s | {'yes' if r['ok'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=60.0, help="tuner budget in seconds (default 60)")
    parser.add_argument("--sweep-s", type=float, default=3.0, help="seconds per sweep measurement (default 3)")
    parser.add_argument("--repeats", type=int, default=3, help="sweep measurements per configuration (best kept)")
    parser.add_argument("--only", nargs="*", choices=sorted(DATASETS), help="datasets to run (default all)")
    parser.add_argument("--out", default=str(RESULTS), help="directory for tune.json and tune.md")
    args = parser.parse_args(argv)
    log = lambda s: print(s, flush=True)  # noqa: E731
    names = args.only or DEFAULT_DATASETS
    results = [bench(name, args, log) for name in names]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "tune" if names == DEFAULT_DATASETS else "tune-" + "-".join(names)
    (out / f"{stem}.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=2) + "\n")
    table = markdown(results, args)
    (out / f"{stem}.md").write_text(table)
    print(table)
    for r in results:
        print(f"[{r['dataset']}] tuner without a rate:\n{r['without_consumption']['table']}\n")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
