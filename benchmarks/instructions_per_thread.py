"""Instructions per batch of a loop, on its training thread and in the whole process (valgrind callgrind).

    python benchmarks/instructions_per_thread.py N [MODE ...] [--repeats R] [--warm W] [--out FILE]

MODE is one of the loops below, watched ones optionally naming the hot path's core (`watched:c`,
`list:python`: STARVEWATCH_CORE; without one, the default core):

    bare / watched          DataLoader(TensorDataset, batch_size=1, num_workers=0), step `b[0] + 1`
    baretrain / train       the same loader with a tiny train step (nn.Linear(8, 1), SGD)
    barelist / list         list(range(N)), empty body (our own per-item code alone)
    baretensors / tensors   a list of N (4, 8) tensors, empty body: a loader whose settings give no
                            batch size, so each batch's is read (the batch-size probe)
    step                    list(range(N)) with `with starvewatch.step(): pass` as the body

How the count is kept quiet (issue 29): the epoch is started and W batches (default 200) taken
before counting, so that only the steady state is counted (not worker or iterator start-up, nor
the first step's general path); every object is then frozen out of the garbage collector's
scans (gc.freeze: a collection in the window costs what the young objects cost, not a scan of
all of torch's); the N batches counted run inside one `functools.reduce` call,
and the training thread's figure is callgrind's inclusive cost of that call on that thread alone
(--separate-threads): nothing of the monitor's threads, of the toggling, of the wait for the
shipper. The process figure is everything counted in the window (all threads: the shipper's
work on these records included). Each mode runs R times (default 3), alternating with the
others, in fresh processes; the figure is the minimum, and `spread` (max - min over the
repeats) says how quiet it was: the bare loop's spread is the noise floor of a difference.
With --perturb each repeat runs with an environment of another size, which moves the memory
layout: torch's per-batch cost moves with it (hashing by address) by hundreds to thousands of
instructions, a floor that identical repeats would hide (docs/performance.md).

Writes benchmarks/results/instructions_per_thread.json with --out; else
benchmarks/results/instructions_per_thread-<modes>.json. KEEP=1 copies the callgrind files to
/tmp/i20/ for callgrind_annotate. The study that used it: docs/performance.md.
"""
import functools
import gc
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

WINDOW_FN = "functools_reduce"  # the C function the counted loop runs inside (called once)


def ctl(on):
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(os.getpid())], capture_output=True, check=True)


def child(mode, n, warm):
    import starvewatch
    total = n + warm + 10  # never the end of the epoch inside the window
    if mode in ("list", "step", "barelist"):  # no torch: its import is most of a run's time
        loader = list(range(total))
        return _counted_child(mode, n, warm, loader, None, starvewatch)
    import torch
    torch.set_num_threads(1)
    from torch.utils.data import DataLoader, TensorDataset
    for b in DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=1):
        b[0] + 1
    if mode in ("tensors", "baretensors"):
        loader = [torch.zeros(4, 8) for _ in range(total)]
    else:
        loader = DataLoader(TensorDataset(torch.randn(total, 8)), batch_size=1, num_workers=0)
    model = opt = None
    if mode in ("train", "baretrain"):
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
    return _counted_child(mode, n, warm, loader, (model, opt), starvewatch)


def _counted_child(mode, n, warm, loader, train, starvewatch):
    model, opt = train or (None, None)
    session = None
    if not mode.startswith("bare"):
        session = starvewatch.init("cg")
        loader = starvewatch.watch(loader)
    it = iter(loader)

    def run(count):
        if mode in ("train", "baretrain"):
            for (b,) in islice(it, count):
                opt.zero_grad()
                model(b).sum().backward()
                opt.step()
        elif mode == "step":
            for b in islice(it, count):
                with starvewatch.step():
                    pass
        elif mode in ("bare", "watched"):
            for b in islice(it, count):
                b[0] + 1
        else:
            for b in islice(it, count):
                pass

    run(warm)  # the steady state: the fast path entered, the shipper's segments begun
    if session is not None:  # the warm-up's records shipped before the window
        session.shipper._wake.set()
        deadline = time.monotonic() + 60
        while session.shipper.shipped_records < warm - 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    # Every object so far out of the collector's reach: a collection in the window (the shipper's
    # allocations trigger them too) scans the young objects only, not torch's hundreds of
    # thousands, whichever thread it lands on (a full one is millions of instructions: one more
    # or less in a run moved the train step's figure by thousands per batch).
    gc.collect()
    gc.freeze()
    ctl(True)
    t = time.perf_counter()
    functools.reduce(lambda _a, _b: run(n), (0, 0))  # the window: WINDOW_FN's inclusive cost
    el = time.perf_counter() - t
    if session is not None:
        session.shipper._wake.set()
        deadline = time.monotonic() + 120
        while session.shipper.shipped_records < warm + n - 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    ctl(False)
    if session is not None:
        starvewatch.finish(quiet=True)
    print(json.dumps({"loop_s": el}))


def inclusive(path, fn):
    """The inclusive instructions of `fn` in one thread's callgrind file."""
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", path],
                         capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if re.search(rf"[:\s]{fn}\b", line):
            m = re.match(r"\s*([\d,]+)", line)
            if m:
                return int(m.group(1).replace(",", ""))
    return None


def calls_of(path, fn):
    """How many times `fn` was called in one thread's callgrind file (it must be 1)."""
    text = Path(path).read_text()
    ids = set(re.findall(rf"^c?fn=\((\d+)\) {fn}$", text, re.M))
    calls = 0
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^cfn=\((\d+)\)", line)
        if m and m.group(1) in ids and i + 1 < len(lines) and lines[i + 1].startswith("calls="):
            calls += int(lines[i + 1].split("=")[1].split()[0])
    return calls


def counted(mode, n, warm, env):
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        p = subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
                            "--compress-strings=yes", f"--callgrind-out-file={out}", sys.executable, __file__,
                            "--child", mode, str(n), str(warm)], capture_output=True, text=True, env=env)
        if p.returncode:
            raise SystemExit(p.stderr[-3000:])
        per, loop = {}, None
        for f in sorted(glob.glob(str(out) + "*")):
            text = Path(f).read_text()
            m = re.search(r"^totals: (\d+)", text, re.M)
            if not m:
                continue
            thread = f.rsplit("-", 1)[-1]
            per[thread] = int(m.group(1))
            if thread == "01":
                calls = calls_of(f, WINDOW_FN)
                if calls != 1:  # the loop itself called it: the window would toggle off inside
                    raise SystemExit(f"{WINDOW_FN} called {calls} times on the training thread, not once")
                loop = inclusive(f, WINDOW_FN)
        if os.environ.get("KEEP"):
            os.makedirs("/tmp/i20", exist_ok=True)
            subprocess.run(["cp"] + glob.glob(str(out) + "*") + ["/tmp/i20/"])
        return per, loop, json.loads(p.stdout.strip().splitlines()[-1])["loop_s"]


def _bare_of(mode):
    base = mode.partition(":")[0]
    return {"watched": "bare", "train": "baretrain", "list": "barelist", "step": "barelist",
            "tensors": "baretensors"}.get(base)


def main(argv):
    import argparse
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks import results_io
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("batches", type=int)
    parser.add_argument("modes", nargs="*", default=["bare", "watched"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warm", type=int, default=200)
    parser.add_argument("--out")
    parser.add_argument("--perturb", action="store_true",
                        help="each repeat with an environment of another size (a dummy variable): the memory "
                             "layout moves, and with it what hashing by address costs; the spread then shows it")
    parser.add_argument("--merge", action="store_true",
                        help="keep the other modes of an existing --out file (modes run with another N)")
    args = parser.parse_args(argv)
    n = args.batches
    record = results_io.started(args, quick=n < 1000 or args.repeats < 2)
    results = {"measured_at": record["measured_at"], "cpu_count": os.cpu_count(), "perturbed": args.perturb,
               "load_average": list(os.getloadavg()), "batches": n, "repeats": args.repeats, "warm": args.warm,
               "quick": record["quick"], "method": "training thread: inclusive instructions of the counted loop "
               "(steady state, after warm-up) on its own thread; min over repeats in fresh processes",
               "per_batch": {}}
    env = dict(os.environ, PYTHONHASHSEED="0", STARVEWATCH_URL="off", STARVEWATCH_AUTOSTART="0", STARVEWATCH_QUIET="1",
               STARVEWATCH_DIR="/tmp/i20/swcg")
    stretch = float(os.environ.get("STRETCH", "60"))  # the monitor's timers, as slowed as the loop under valgrind
    for k, d in (("SHIP", 0.5), ("HOST", 0.5), ("GPU", 1.0)):
        env[f"STARVEWATCH_{k}_INTERVAL_S"] = str(d * stretch)
    runs = {m: [] for m in args.modes}
    for r in range(args.repeats):
        for m in args.modes:  # alternating: a drift of the machine touches every mode alike
            mode, _, core = m.partition(":")
            run_env = dict(env, STARVEWATCH_CORE=core) if core else dict(env)
            if args.perturb:
                run_env["STARVEWATCH_BENCH_PAD"] = "x" * (4099 * r + 13 * len(m))
            per, loop, s = counted(mode, n, args.warm, run_env)
            runs[m].append({"loop": loop, "process": sum(per.values()), "threads": per, "loop_s": s})
            print(f"repeat {r + 1} {m}: training thread {loop / n:,.1f}/batch, process {sum(per.values()) / n:,.1f}"
                  f"/batch, loop {s:.2f} s", flush=True)
    for m, rs in runs.items():
        loops = [x["loop"] / n for x in rs]
        procs = [x["process"] / n for x in rs]
        best = min(rs, key=lambda x: x["loop"])
        results["per_batch"][m] = {
            "batches": n, "repeats": args.repeats, "training_thread": round(min(loops)), "training_thread_runs": [round(v, 1) for v in loops],
            "spread": round(max(loops) - min(loops), 1), "process": round(min(procs)),
            "process_runs": [round(v, 1) for v in procs],
            "threads": {k: round(v / n) for k, v in best["threads"].items()},
            "loop_s": round(min(x["loop_s"] for x in rs), 2)}
    path = Path(args.out) if args.out else results_io.RESULTS / f"instructions_per_thread-{'-'.join(args.modes)}.json"
    if args.merge and path.exists():  # this run's modes replace theirs; the others are kept
        before = json.loads(path.read_text())
        results["per_batch"] = {**{m: row for m, row in before.get("per_batch", {}).items()
                                   if m not in results["per_batch"]}, **results["per_batch"]}
        results["load_average"] = [max(a, b) for a, b in zip(before.get("load_average", [0] * 3),
                                                             results["load_average"])]
        results["measured_at"] = min(before.get("measured_at", results["measured_at"]), results["measured_at"])
        results["batches"] = min(before.get("batches", n), n)
        results["quick"] = results["quick"] or bool(before.get("quick"))
    for m, row in results["per_batch"].items():  # the difference and its noise floor, for the record
        bare = _bare_of(m)
        if bare and bare in results["per_batch"] and results["per_batch"][bare].get("batches") == row.get("batches"):
            b = results["per_batch"][bare]
            row["added_training_thread"] = row["training_thread"] - b["training_thread"]
            row["added_process"] = row["process"] - b["process"]
            row["noise_floor"] = max(b["spread"], row["spread"])
            print(f"{m}: {row['added_training_thread']:+,} per batch on the training thread (noise floor "
                  f"{row['noise_floor']:,.1f}), {row['added_process']:+,} in the process", flush=True)
    results["load_average_end"] = list(os.getloadavg())
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {path}")


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        sys.exit()
    main(sys.argv[1:])
