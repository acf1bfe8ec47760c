"""Instructions that `watch()` adds to a DataLoader loop, counted by valgrind (callgrind).

    python benchmarks/instructions.py [--batches 2000] [--quick] [--out PATH]

The wall-time slowdown of benchmarks/overhead.py cannot resolve 1% on a shared VM (single
0.1 s segments of the same loop vary by +-10%). An instruction count does not depend on what
else the host does: this runs the DataLoader(TensorDataset, batch_size=64, num_workers=0)
loop of overhead.py bare and watched under callgrind, counting only the loop (instrumentation
is switched on and off around it with callgrind_control), and reports instructions per batch.

What it counts: every instruction of the training process during the loop, on all its
threads: the hot path, the shipper packing records, the sampler thread. Under valgrind the
loop runs ~60x slower, so the monitor's timers (sampling, shipping) are stretched by the same
factor, measured from the bare run, to fire as often per batch as they do natively. Not
counted: the sidecar process (untraced; it runs on another core), and what instructions do
not show (cache misses, the GIL hand-offs that overhead.py's wall-time figures include).
Needs valgrind (Debian: apt-get install valgrind); takes about 3 minutes. Figures also go to
benchmarks/results/instructions.json; --quick (200 batches) is a smoke run, marked "quick" there
(most of the time is Python and torch starting under valgrind, which --quick does not shorten).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import results_io  # noqa: E402


def _callgrind(on: bool) -> None:
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(os.getpid())],
                   capture_output=True, check=True)


def child(mode: str, batches: int) -> None:
    """One loop under callgrind; prints the loop's wall time as JSON."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import starvewatch
    data = TensorDataset(torch.randn(batches * 64, 8))
    loader = DataLoader(data, batch_size=64, num_workers=0)
    for _ in DataLoader(TensorDataset(torch.randn(640, 8)), batch_size=64):
        pass  # first-use costs (imports, allocator) out of the count
    session = None
    if mode == "watched":
        session = starvewatch.init("instructions")
        loader = starvewatch.watch(loader)
    # Both runs start with the collector's generations empty: a full collection that earlier
    # start-up work made due would otherwise land in one run or the other (~50M instructions).
    gc.collect()
    _callgrind(True)
    start = time.perf_counter()
    for _ in loader:
        pass
    elapsed = time.perf_counter() - start
    if session is not None:
        # Count the shipper's work on these records too: ship now and wait until it is done
        # (a fixed ship interval stretched past the loop would otherwise leave it uncounted).
        session.shipper._wake.set()
        while session.shipper.shipped_records < batches:
            time.sleep(0.05)
    _callgrind(False)
    if session is not None:
        steps = starvewatch.finish(quiet=True)["loaders"][0]["steps"]
        assert steps == batches, steps
    print(json.dumps({"loop_s": elapsed}))


def native_loop_s(batches: int) -> float:
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    loader = DataLoader(TensorDataset(torch.randn(batches * 64, 8)), batch_size=64, num_workers=0)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in loader:
            pass
        best = min(best, time.perf_counter() - start)
    return best


def counted(mode: str, batches: int, env: dict) -> tuple[int, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
             sys.executable, __file__, "--child", mode, "--batches", str(batches)],
            capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"{mode} run failed:\n{proc.stderr[-3000:]}")
        totals = int(re.search(r"^totals: (\d+)", out.read_text(), re.M).group(1))
        loop_s = json.loads(proc.stdout.strip().splitlines()[-1])["loop_s"]
        return totals, loop_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=None, help="batches per loop (2,000; 200 with --quick)")
    parser.add_argument("--quick", action="store_true", help="200 batches, for a smoke run")
    parser.add_argument("--out", type=Path, default=results_io.RESULTS / "instructions.json")
    parser.add_argument("--child", choices=("bare", "watched"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.batches is None:
        args.batches = 200 if args.quick else 2000
    if args.child:
        child(args.child, args.batches)
        return
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        raise SystemExit("needs valgrind: apt-get install valgrind")
    args_recorded = argparse.Namespace(**{k: v for k, v in vars(args).items() if k != "child"})
    record = results_io.started(args_recorded, quick=args.quick or args.batches < 2000)
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONHASHSEED="0", STARVEWATCH_URL="off", STARVEWATCH_AUTOSTART="0",
                   STARVEWATCH_QUIET="1", STARVEWATCH_DIR=tmp)
        native_s = native_loop_s(args.batches)
        bare, bare_s = counted("bare", args.batches, env)
        stretch = max(1.0, bare_s / native_s)
        for name, default in (("SHIP", 0.5), ("HOST", 0.5), ("GPU", 1.0)):
            env[f"STARVEWATCH_{name}_INTERVAL_S"] = str(default * stretch)
        watched, _ = counted("watched", args.batches, env)
    per_bare, per_watched = bare / args.batches, watched / args.batches
    print(f"DataLoader(TensorDataset, batch_size=64, num_workers=0), {args.batches:,} batches under "
          f"callgrind ({stretch:.0f}x slower than native; the monitor's timers stretched alike): "
          f"{per_bare:,.0f} instructions per batch bare, {per_watched:,.0f} watched -> "
          f"{per_watched - per_bare:+,.0f} per batch, {100 * (per_watched / per_bare - 1):+.2f}% (target <= 1%)")
    record.update({"batches": args.batches, "native_loop_s": native_s, "stretch": stretch,
                   "bare_per_batch": per_bare, "watched_per_batch": per_watched,
                   "added_per_batch": per_watched - per_bare, "added_pct": 100 * (per_watched / per_bare - 1),
                   "target_pct": 1.0})
    results_io.write(record, args.out)


if __name__ == "__main__":
    main()
