"""End-to-end delivery: a watched loop's steps into a collector's store, two commits interleaved.

    python benchmarks/end_to_end.py [--base REF] [--rounds 5] [--steps 300000] [--tolerance 0.10]
                                    [--quick] [--out PATH]

One measurement: a real collector (uvicorn subprocess, SQLite in a temporary directory) on
loopback; one fresh process runs `for _ in starvewatch.watch(range(steps)): pass` and
`starvewatch.finish()` (the sidecar, the HTTP transport, the spool: everything as shipped). The
figure is `steps` over the time from that process's start until the collector's database holds
every one of its step rows (read from the file, outside both processes: the sum of the run's
rowid blocks, polled every 10 ms), plus how long finish() took and its delivery account
(acknowledged, spooled: nothing should wait in the spool with a collector up). At the end the
stored rows are counted exactly: every step once, or the measurement fails.

Two trees are measured in turn, in pairs, the order swapped every round (ABBA...), so a machine
whose speed drifts moves both alike: the working tree (this checkout) and `--base`, a git ref
checked out with `git worktree` into a temporary directory (its optional C core built there when
it has one), by default the previous release. Each tree's collector and training process run its
own code. The verdict is on the per-pair ratios new/base of steps/s: the run fails (exit 1) when
their median is below 1 - tolerance and at least 4 pairs in 5 are slower (slower beyond noise),
or when the working tree loses or doubles a step. Figures go to benchmarks/results/end_to_end.json; --quick (3 rounds of 100,000
steps) is a smoke run, marked "quick" there.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import results_io  # noqa: E402
from benchmarks.ingest import free_port, wait_up  # noqa: E402

# The previous release, 0.1.0 (2026-11-23): its last commit. The repository has no tags; a tag
# `v<version>` of a later release is preferred when present (previous_release()).
RELEASE_0_1_0 = "69378a156461513e62e765bf586d0ae752505a3e"

LOOP = r"""
import json, sys, time
import starvewatch
steps = int(sys.argv[1])
for _ in starvewatch.watch(range(steps), name="train"):
    pass
t = time.perf_counter()
summary = starvewatch.finish()
print(json.dumps({"finish_s": time.perf_counter() - t, "delivery": summary.get("delivery"),
                  "run_id": summary["run"]["id"]}))
"""

STORED = "SELECT coalesce(sum(last_rowid - first_rowid + 1), 0) FROM step_blocks"


def git(*args: str, cwd: Path = results_io.ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def previous_release() -> str:
    """The newest tag that names a version, else the 0.1.0 release's commit."""
    tags = git("tag", "--list", "v[0-9]*", "--sort=-version:refname").split()
    return tags[0] if tags else RELEASE_0_1_0


@contextlib.contextmanager
def checked_out(ref: str):
    """`ref` in a temporary git worktree, its C core built when it has one; removed after."""
    with tempfile.TemporaryDirectory(prefix="starvewatch-base-") as tmp:
        tree = Path(tmp) / "tree"
        git("worktree", "add", "--detach", str(tree), ref)
        try:
            if (tree / "starvewatch" / "_ccore.c").exists():
                subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-q"], cwd=tree,
                               capture_output=True)  # optional, as at install: pure Python if it fails
            yield tree
        finally:
            git("worktree", "remove", "--force", str(tree))


def stored_rows(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return conn.execute(STORED).fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:  # not created yet, or busy past the timeout: ask again
        return 0


def measure(tree: Path, steps: int, timeout_s: float = 60.0) -> dict:
    """One measurement with `tree`'s code on both sides (see the module's docstring)."""
    env = dict(os.environ, PYTHONPATH=str(tree), STARVEWATCH_AUTOSTART="0", STARVEWATCH_QUIET="1")
    env.pop("STARVEWATCH_MAX_BATCH_RECORDS", None)
    # As installed (pip compiles a package's modules): the warm-up run writes both trees' .pyc.
    # With PYTHONDONTWRITEBYTECODE set, each process compiled every module it imported, ~0.04 s
    # of CPU in the training process and ~0.05 s in the sidecar on the path of the first batch.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    with tempfile.TemporaryDirectory(prefix="starvewatch-e2e-") as directory:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env["STARVEWATCH_DIR"] = directory
        db = Path(directory) / "starvewatch.db"
        with open(Path(directory) / "collector.log", "wb") as log:
            server = subprocess.Popen([sys.executable, "-m", "starvewatch", "serve", "--port", str(port),
                                       "--dir", directory], env=env, stdout=log, stderr=log)
        try:
            wait_up(url)
            start = time.perf_counter()
            loop = subprocess.Popen([sys.executable, "-c", LOOP, str(steps)], env=dict(env, STARVEWATCH_URL=url),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            stored, all_stored_s = 0, None
            while time.perf_counter() - start < timeout_s:
                stored = stored_rows(db)
                if stored >= steps:
                    all_stored_s = time.perf_counter() - start
                    break
                time.sleep(0.01)
            out, err = loop.communicate(timeout=timeout_s)
            if loop.returncode != 0:
                raise SystemExit(f"the watched loop failed ({loop.returncode}): {err[-2000:]}")
            process = json.loads(out.strip().splitlines()[-1])
            conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
            try:
                rows = conn.execute("SELECT count(*) FROM steps").fetchone()[0]
                distinct = conn.execute("SELECT count(*) FROM (SELECT DISTINCT epoch, step FROM steps)").fetchone()[0]
            finally:
                conn.close()
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(30)
    delivery = process.get("delivery") or {}
    return {"steps": steps, "all_stored_s": all_stored_s,
            "steps_per_s": steps / all_stored_s if all_stored_s else None,
            "finish_s": process["finish_s"], "acknowledged": delivery.get("acknowledged"),
            "spooled": delivery.get("spooled"), "dropped": delivery.get("dropped"),
            "stored_rows": rows, "distinct_steps": distinct}


def slower_beyond_noise(ratios: list[float], tolerance: float) -> bool:
    """The verdict on the per-pair ratios new/base: the median pair below 1 - tolerance, and
    nearly every pair slower (a sign test: 4 of 5 pairs). One pair hit by another process's
    burst decides nothing."""
    if not ratios:
        return False
    return statistics.median(ratios) < 1 - tolerance and sum(r < 1 for r in ratios) >= math.ceil(0.8 * len(ratios))


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default=None, help="git ref to compare against (default: the previous release)")
    parser.add_argument("--rounds", type=int, default=None, help="pairs of measurements (5; 3 with --quick)")
    parser.add_argument("--steps", type=int, default=None, help="steps of the watched loop (300,000; 100,000 with --quick)")
    parser.add_argument("--tolerance", type=float, default=0.10,
                        help="fail when the median new/base ratio is below 1 - this (default 0.10)")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 100,000 steps, for a smoke run")
    parser.add_argument("--out", type=Path, default=results_io.RESULTS / "end_to_end.json")
    args = parser.parse_args()
    args.base = args.base or previous_release()
    args.rounds = args.rounds or (3 if args.quick else 5)
    args.steps = args.steps or (100_000 if args.quick else 300_000)
    record = results_io.started(args, quick=args.quick or args.steps != 300_000 or args.rounds < 5)
    new_tree = results_io.ROOT
    if (new_tree / "starvewatch" / "_ccore.c").exists() and not list((new_tree / "starvewatch").glob("_ccore*.so")):
        print("note: the working tree's C core is not built (python setup.py build_ext --inplace): "
              "it runs pure Python", file=sys.stderr)
    record["base"] = {"ref": args.base, "commit": git("rev-parse", args.base + "^{commit}")}
    record["new"] = {"commit": git("rev-parse", "HEAD"),
                     "uncommitted_changes": bool(git("status", "--porcelain", "--untracked-files=no"))}
    runs: dict[str, list[dict]] = {"base": [], "new": []}
    with checked_out(args.base) as base_tree:
        trees = {"base": base_tree, "new": new_tree}
        measure(new_tree, min(args.steps, 20_000))  # warm-up: the OS's caches, both trees' .pyc
        measure(base_tree, min(args.steps, 20_000))
        for round_ in range(args.rounds):
            order = ("base", "new") if round_ % 2 == 0 else ("new", "base")
            for name in order:
                result = measure(trees[name], args.steps)
                runs[name].append(result)
                rate = f"{result['steps_per_s']:,.0f} steps/s" if result["steps_per_s"] else "not all stored"
                print(f"round {round_ + 1} {name:4s}: {rate}; finish() {result['finish_s']:.2f} s, "
                      f"acknowledged {result['acknowledged']:,}, spooled {result['spooled']:,}; "
                      f"{result['stored_rows']:,} rows stored", flush=True)
    ratios = [n["steps_per_s"] / b["steps_per_s"] if n["steps_per_s"] and b["steps_per_s"] else 0.0
              for b, n in zip(runs["base"], runs["new"])]
    median_ratio = statistics.median(ratios)
    summary = {name: {"steps_per_s_median": _median([r["steps_per_s"] for r in rs]),
                      "steps_per_s_min": min((r["steps_per_s"] or 0 for r in rs), default=None),
                      "steps_per_s_max": max((r["steps_per_s"] or 0 for r in rs), default=None),
                      "finish_s_median": _median([r["finish_s"] for r in rs]),
                      "spooled_median": _median([r["spooled"] for r in rs])} for name, rs in runs.items()}
    exact = all(r["stored_rows"] == r["steps"] == r["distinct_steps"] for r in runs["new"])
    slower_pairs = sum(r < 1 for r in ratios)
    slower = slower_beyond_noise(ratios, args.tolerance)
    record.update(runs=runs, summary=summary, ratios_new_over_base=ratios, median_ratio=median_ratio,
                  slower_pairs=slower_pairs, every_step_stored_once=exact, slower_beyond_noise=slower)
    for name in ("base", "new"):
        s = summary[name]
        print(f"{name:4s}: median {s['steps_per_s_median'] or 0:,.0f} steps/s (min {s['steps_per_s_min']:,.0f}, "
              f"max {s['steps_per_s_max']:,.0f}); finish() median {s['finish_s_median']:.2f} s, "
              f"spooled median {s['spooled_median']:,.0f}")
    print(f"new/base per pair: {', '.join(f'{r:.2f}' for r in ratios)}; median {median_ratio:.2f}, "
          f"{slower_pairs} of {len(ratios)} pairs slower (fails when the median is below "
          f"{1 - args.tolerance:.2f} and at least {math.ceil(0.8 * len(ratios))} pairs are slower)")
    busy = max(record["load_average"][0], os.getloadavg()[0])
    if busy > (os.cpu_count() or 1):
        print(f"note: load average {busy:.1f} on {os.cpu_count()} CPUs: the machine was busy, and the "
              f"sidecar (nice 10) and the collector waited for cores; take the figures on a quiet machine",
              file=sys.stderr)
    results_io.write(record, args.out)
    if not exact:
        print("FAIL: the working tree did not store every step exactly once", file=sys.stderr)
        return 1
    if slower:
        print(f"FAIL: the working tree is slower than {args.base} beyond noise", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
