"""The two-run CPU-hog scenario (issue 34 items 3-4), a benchmark, not a CI test.

A CPU-bound Pillow pipeline (benchmarks/scenarios/cases.Photos) with a CPU-bound training step,
on a host whose other processes use about 1.6 of its cores (two spinning processes at 80%):

1. `num_workers=0`: input-bound, and no DataLoader setting is expected to help (the cores are
   taken): the summary must say why in measured numbers (`no_recommendation_reason`);
2. the same run name with `num_workers=2` anyway: the wait goes, the step slows (the workers
   take the cores the step needed): the second run must be reported slower than the first,
   with the likely cause.

Each training run is a process of its own session (another job than the hog, as on a shared
host: its own autogroup). On a host other jobs load too, the cores the workers would get swing
with that load (three pairs without it at load 7 on the shared 2-core host measured 1.01x, 2.25x
(a 120 ms step) and 1.54x for the second run); `--cpus 1` holds the training process and its workers to one CPU, so the
workers compete with the step for that core whatever the rest of the host does (measured 0.64x,
compute per batch 71 -> 141 ms, at load 6.5).

Both runs spool offline (STARVEWATCH_URL=off); their records are imported into one collector
database, written to `--out` (gzipped): tests/test_said_on_stored_runs.py reads the stored
records of these real runs, without timing anything itself. The fixture was taken with:

    python -m benchmarks.scenarios.cpu_hog_pair --cpus 1 --out tests/data/cpu-hog-pair.db.gz
"""
from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

RUN_NAME = "pillow-under-cpu-hog"


def _train(workers: int, epochs: int, step_cpu_s: float, cpus: int = 0) -> None:
    """One run: the Pillow pipeline with `workers`, a CPU-bound step of `step_cpu_s`; with
    `cpus`, the training process (and the workers it forks) held to that many CPUs."""
    if cpus:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cpus])
    import torch
    from torch.utils.data import DataLoader

    import starvewatch
    from benchmarks.scenarios.cases import Photos, jpeg_folder, spin
    torch.set_num_threads(1)
    folder = jpeg_folder(256)
    dataset = Photos(paths=sorted(os.path.join(folder, p) for p in os.listdir(folder)))
    starvewatch.init(RUN_NAME)
    loader = starvewatch.watch(DataLoader(dataset, batch_size=16, shuffle=True, num_workers=workers), name="train")
    for _ in range(epochs):
        for _batch in loader:
            spin(step_cpu_s)
    summary = starvewatch.finish(quiet=True)
    print(json.dumps({k: summary[k] for k in ("verdict", "no_recommendation_reason", "regression")}, default=str))


def main() -> None:
    from benchmarks.scenarios.cases import hog
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the collector database, gzipped")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--step-cpu-s", type=float, default=0.03)
    parser.add_argument("--hog-duty", type=float, default=0.8, help="each of 2 hog processes' share of a core")
    parser.add_argument("--cpus", type=int, default=0,
                        help="hold the training process to this many CPUs (0: all): the cores the workers "
                             "and the training step share, whatever the host's other load does")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="starvewatch-hog-"))
    stop = multiprocessing.Event()
    hogs = [multiprocessing.Process(target=hog, args=(stop, args.hog_duty), daemon=True) for _ in range(2)]
    for h in hogs:
        h.start()
    env = {**os.environ, "STARVEWATCH_DIR": str(directory), "STARVEWATCH_URL": "off",
           "STARVEWATCH_AUTOSTART": "0", "STARVEWATCH_QUIET": "1"}
    try:
        for workers in (0, 2):
            code = (f"from benchmarks.scenarios.cpu_hog_pair import _train; "
                    f"_train({workers}, {args.epochs}, {args.step_cpu_s}, {args.cpus})")
            done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900,
                                  start_new_session=True)  # its own session: another job than the hog
            if done.returncode:
                raise SystemExit(done.stderr[-3000:])
            print(f"num_workers={workers}: {done.stdout.strip().splitlines()[-1]}", flush=True)
    finally:
        stop.set()
        for h in hogs:
            h.join(5)
    from starvewatch.monitor.storage.sources import LocalSource
    source = LocalSource.offline(directory=directory)
    runs = sorted(source.list_runs(), key=lambda r: r["started_at"])
    for run in runs:
        summary = source.summary(run["id"])
        print(run["id"], summary["answer"]["headline"])
        print("  ", summary.get("no_recommendation_reason") or summary["answer"].get("regression"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    packed = directory / "pair.db"
    source.store._writer.execute("VACUUM INTO ?", (str(packed),))  # one consistent, compact file
    with open(packed, "rb") as db, gzip.open(args.out, "wb") as out:
        shutil.copyfileobj(db, out)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes), load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
