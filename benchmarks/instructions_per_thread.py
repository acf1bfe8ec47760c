"""Instructions per batch of the fast loop, per thread (valgrind callgrind, --separate-threads).

    python benchmarks/instructions_per_thread.py 5000 [bare] [watched] [list] [step] [--out FILE]

A mode may name the hot path's core: `watched:c`, `list:python` (STARVEWATCH_CORE; without one,
the default core). --out writes the figures as JSON (benchmarks/results/instructions_per_thread.json).

bare / watched: DataLoader(TensorDataset, batch_size=1, num_workers=0), step `b[0] + 1`;
baretrain / train: the same loader with a tiny train step (nn.Linear(8, 1), SGD);
barelist / list: (watch(...)) list(range(n)) with an empty body (our own per-item code alone); step: the same
with `with starvewatch.step(): pass` as the body (the general path every item). Prints, per
thread (01: the training thread; the others: the monitor's threads), instructions per batch.
Counted around the loop only (and the shipper's work on its records); the monitor's timers are
stretched STRETCH (60) times, like the loop under valgrind. KEEP=1 copies the callgrind files to
/tmp/i20/ for callgrind_annotate. Writes benchmarks/results/instructions_per_thread-<modes>.json. The study that used it: docs/performance.md. ~8 min each.
"""
import gc, json, os, re, subprocess, sys, tempfile, time, glob
from pathlib import Path
def ctl(on): subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(os.getpid())], capture_output=True, check=True)
def child(mode, n, step):
    import torch; torch.set_num_threads(1)
    from torch.utils.data import DataLoader, TensorDataset
    import starvewatch
    data = TensorDataset(torch.randn(n, 8))
    for b in DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=1): b[0] + 1
    if mode in ("list", "step", "barelist"):
        loader = list(range(n))
    else:
        loader = DataLoader(data, batch_size=1, num_workers=0)
    if mode in ("train", "baretrain"):
        model = torch.nn.Linear(8, 1); opt = torch.optim.SGD(model.parameters(), lr=0.01)
    session = None
    if mode in ("watched", "list", "step", "train"):
        session = starvewatch.init("cg"); loader = starvewatch.watch(loader)
    gc.collect(); ctl(True); t = time.perf_counter()
    if mode in ("list", "barelist"):
        for b in loader: pass
    elif mode in ("train", "baretrain"):
        for (b,) in loader:
            opt.zero_grad(); model(b).sum().backward(); opt.step()
    elif mode == "step":
        for b in loader:
            with starvewatch.step(): pass
    else:
        for b in loader: b[0] + 1
    el = time.perf_counter() - t
    if session is not None:
        session.shipper._wake.set()
        while session.shipper.shipped_records < n: time.sleep(0.05)
    ctl(False)
    if session is not None: starvewatch.finish(quiet=True)
    print(json.dumps({"loop_s": el}))
def counted(mode, n, env):
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        p = subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes", f"--callgrind-out-file={out}", sys.executable, __file__, "--child", mode, str(n)], capture_output=True, text=True, env=env)
        if p.returncode: raise SystemExit(p.stderr[-3000:])
        per = {}
        for f in sorted(glob.glob(str(out) + "*")):
            m = re.search(r"^totals: (\d+)", open(f).read(), re.M)
            if m: per[f.rsplit("-", 1)[-1]] = int(m.group(1))
        if os.environ.get("KEEP"): subprocess.run(["cp"] + glob.glob(str(out) + "*") + ["/tmp/i20/"])
        return per, json.loads(p.stdout.strip().splitlines()[-1])["loop_s"]
def _measured_at():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
if __name__ == "__main__":
    if sys.argv[1] == "--child": child(sys.argv[2], int(sys.argv[3]), None); sys.exit()
    import argparse
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks import results_io
    args = sys.argv[1:]; out_file = None
    if "--out" in args: i = args.index("--out"); out_file = args[i + 1]; del args[i:i + 2]
    n = int(args[0]); modes = args[1:] or ["bare", "watched"]
    # Fewer than 5,000 batches is a shortened run (fixed costs weigh more per batch).
    record = results_io.started(argparse.Namespace(batches=n, modes=modes), quick=n < 5000)
    record["modes"] = {}
    results = {"measured_at": _measured_at(), "cpu_count": os.cpu_count(), "load_average": list(os.getloadavg()),
               "batches": n, "per_batch": {}}
    env = dict(os.environ, PYTHONHASHSEED="0", STARVEWATCH_URL="off", STARVEWATCH_AUTOSTART="0", STARVEWATCH_QUIET="1", STARVEWATCH_DIR="/tmp/i20/swcg")
    stretch = float(os.environ.get("STRETCH", "60"))
    for k, d in (("SHIP", 0.5), ("HOST", 0.5), ("GPU", 1.0)): env[f"STARVEWATCH_{k}_INTERVAL_S"] = str(d * stretch)
    for m in modes:
        mode, _, core = m.partition(":")
        run_env = dict(env, STARVEWATCH_CORE=core) if core else env
        per, s = counted(mode, n, run_env)
        threads = {k: round(v / n) for k, v in per.items()}
        print(m, threads, "total/batch", round(sum(per.values()) / n), "loop_s", round(s, 2), flush=True)
        # "01" is the training thread (valgrind numbers threads from 1 in start order), the others the monitor's.
        results["per_batch"][m] = {"training_thread": threads.get("01"), "process": round(sum(per.values()) / n),
                                   "threads": threads, "loop_s": round(s, 2)}
        record["modes"][m] = {"instructions_per_batch_by_thread": threads,
                              "training_thread_instructions_per_batch": threads.get("01", 0),
                              "total_instructions_per_batch": round(sum(per.values()) / n), "loop_s": round(s, 2)}
    if out_file:  # the overhead table's source (benchmarks/readme_table.py reads this layout)
        results["load_average_end"] = list(os.getloadavg())
        Path(out_file).write_text(json.dumps(results, indent=2) + "\n")
    else:  # per mode set: `step list` and `bare watched` runs keep their own files
        results_io.write(record, results_io.RESULTS / f"instructions_per_thread-{'-'.join(modes)}.json")
