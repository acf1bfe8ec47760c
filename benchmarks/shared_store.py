"""The shared store (issue 40 item 5): PostgreSQL against SQLite on this machine.

    python benchmarks/shared_store.py [--quick] [--rounds 3] [--against main] [--out PATH]

Three parts, each figure the best of --rounds, the stores' runs interleaved (A B A B ...):
1. store ingest: records/s of Store.ingest, in one process, batches of 20,000 step records of
   8 ranks (one transaction per batch; PostgreSQL by COPY). Target: PostgreSQL >= 100,000/s.
   With --against REV the SQLite figure is also taken for that revision's tree (a git
   worktree), interleaved with this one's: the SQLite path must stay within 5%.
2. HTTP ingest, 1 and 2 collectors: records/s (one producer per collector posting 20,000-record
   batches as fast as acknowledged) and requests/s (4 producers per collector posting
   100-record batches), SQLite (one collector) against PostgreSQL (one, and two on one database).
3. pages of a 1,000-run project (tests/many_runs.py): the runs list API, a run's summary and
   the runs page HTML, the first answer (computed) and the median of 20 more, on each store.
PostgreSQL is a throw-away cluster (tests/postgres.py) with durable settings comparable to
SQLite's WAL + synchronous=NORMAL: fsync on, synchronous_commit off (a crash loses the last
commits, never consistency). Figures go to benchmarks/results/shared_store.json. The machine
must be quiet for the figures to mean anything: the load averages are recorded.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import results_io  # noqa: E402
from benchmarks.ingest import PRODUCER, free_port, running_collector  # noqa: E402

STORE_INGEST = r"""
import json, sys, tempfile, time
from pathlib import Path
import starvewatch
print(starvewatch.__file__, file=sys.stderr)  # which tree ran
target, batches, batch, ranks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
try:
    from starvewatch.monitor.web.wire_models import EventBatch
except ImportError:  # a revision from before the house move (issue 33)
    from starvewatch.monitor.models import EventBatch
try:
    from starvewatch.monitor.storage.open_store import open_store
except ImportError:  # a revision from before the PostgreSQL store: SQLite only
    try:
        from starvewatch.monitor.storage.store import Store as open_store
    except ImportError:
        from starvewatch.monitor.store import Store as open_store
if target == "sqlite":
    tmp = tempfile.mkdtemp()
    target = str(Path(tmp) / "bench.db")
t0 = 1_700_000_000 * 10**9
work = []
for k in range(batches):
    rank = k % ranks
    seq = k // ranks + 1
    base = t0 + (seq - 1) * batch * 1_000_000
    work.append(EventBatch.model_validate({
        "schema": "starvewatch.events/1", "run_id": "bench", "rank": rank, "stream": f"s-{rank}", "seq": seq,
        "status": "live", "run": {"id": "bench", "name": "bench", "rank": rank, "world_size": ranks},
        "loaders": [{"name": "train", "totals": {"steps": seq * batch}}],
        "steps": {"loader": ["train"] * batch, "epoch": [0] * batch, "step": list(range((seq - 1) * batch, seq * batch)),
                  "start_ns": [base + i * 1_000_000 for i in range(batch)],
                  "wait_ns": [1_000_000 + i % 977 for i in range(batch)],
                  "compute_ns": [5_000_000 + i % 1013 for i in range(batch)], "other_ns": [0] * batch,
                  "batch_size": [64] * batch, "gpu_idle_ns": [None] * batch}}))
store = open_store(target)
start = time.perf_counter()
for b in work:
    assert store.ingest(b)
seconds = time.perf_counter() - start
# Query times on what was stored: the run-wide series and the summary (uncached: new Query each).
try:
    from starvewatch.monitor.storage.query import Query
except ImportError:
    from starvewatch.monitor.query import Query
q0 = time.perf_counter(); Query(store).rollup_series("bench"); series_s = time.perf_counter() - q0
q0 = time.perf_counter(); Query(store).summary("bench"); summary_s = time.perf_counter() - q0
store.close()
print(json.dumps({"records": batches * batch, "seconds": seconds, "series_s": series_s, "summary_s": summary_s}))
"""

def env_for(tree: Path) -> dict:
    return dict(os.environ, PYTHONPATH=str(tree), STARVEWATCH_AUTOSTART="0", STARVEWATCH_QUIET="1")


def store_ingest(tree: Path, target: str, batches: int, batch: int) -> dict:
    # Run from the tree: `python -c` puts the working directory first on sys.path, before PYTHONPATH.
    out = subprocess.run([sys.executable, "-c", STORE_INGEST, target, str(batches), str(batch), "8"],
                         env=env_for(tree), cwd=str(tree), capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["records_per_s"] = result["records"] / result["seconds"]
    return result


def http_ingest(urls: list[str], env: dict, seconds: float, batch: int, producers: int) -> dict:
    procs = [subprocess.Popen([sys.executable, "-c", PRODUCER, url, str(seconds), str(batch), f"p{i}-{j}", "http-bench"],
                              env=env, stdout=subprocess.PIPE, text=True)
             for i, url in enumerate(urls) for j in range(producers)]
    results = [json.loads(p.communicate(timeout=seconds + 120)[0].strip().splitlines()[-1]) for p in procs]
    wall = max(r["seconds"] for r in results)
    return {"records_per_s": sum(r["records"] for r in results) / wall,
            "requests_per_s": sum(r["requests"] for r in results) / wall}


def page_times(url: str, run_id: str, tries: int = 20) -> dict:
    """Per page: the first answer (computed: the collector just started) and the median of
    `tries` more (within the query cache's 5 s, mostly cached answers)."""
    def timed(path: str) -> dict:
        times = []
        for _ in range(tries + 1):
            start = time.perf_counter()
            with urllib.request.urlopen(url + path, timeout=120) as r:
                r.read()
            times.append(time.perf_counter() - start)
        return {"first_s": times[0], "median_s": statistics.median(times[1:])}
    return {"runs_api": timed("/api/v1/runs"), "summary_api": timed(f"/api/v1/runs/{run_id}/summary"),
            "runs_page": timed("/")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small and short: a smoke run")
    parser.add_argument("--rounds", type=int, default=None, help="best of this many (3; 1 with --quick)")
    parser.add_argument("--against", default=None, metavar="REV",
                        help="also take the SQLite store figures of this git revision, interleaved")
    parser.add_argument("--out", type=Path, default=results_io.RESULTS / "shared_store.json")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    batches, batch = (8, 5_000) if args.quick else (40, 20_000)
    seconds = 3.0 if args.quick else 10.0
    record = results_io.started(args, quick=args.quick)
    sys.path.insert(0, str(ROOT / "tests"))
    from postgres import Cluster
    cluster = Cluster(settings={"fsync": "on", "synchronous_commit": "off", "full_page_writes": "on",
                                "shared_buffers": "512MB", "max_wal_size": "4GB"}).start()
    worktree = None
    try:
        trees = {"this": ROOT}
        if args.against:
            worktree = Path(tempfile.mkdtemp(prefix="sw-against-")) / "tree"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), args.against],
                           check=True, capture_output=True)
            subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-q"], cwd=worktree,
                           capture_output=True)
            trees["against"] = worktree
        # 1. store ingest, interleaved.
        best: dict[str, dict] = {}
        for r in range(rounds):
            for label, tree, target in ([("sqlite", ROOT, "sqlite")]
                                        + ([("sqlite_against", trees["against"], "sqlite")] if worktree else [])
                                        + [("postgres", ROOT, None)]):
                if target is None:
                    target = cluster.database(f"ingest_{r}")
                result = store_ingest(tree, target, batches, batch)
                print(f"store ingest {label}: {result['records_per_s']:,.0f} records/s "
                      f"(series {result['series_s'] * 1e3:.0f} ms, summary {result['summary_s'] * 1e3:.0f} ms)",
                      flush=True)
                kept = best.get(label)
                best[label] = {"records_per_s": max(result["records_per_s"], kept["records_per_s"] if kept else 0),
                               "series_s": min(result["series_s"], kept["series_s"] if kept else 1e9),
                               "summary_s": min(result["summary_s"], kept["summary_s"] if kept else 1e9)}
        record["store_ingest"] = {**best, "batch_records": batch, "batches": batches, "ranks": 8,
                                  "target_postgres_records_per_s": 100_000}
        if worktree:
            s, a = best["sqlite"], best["sqlite_against"]
            record["sqlite_vs_against"] = {"ingest_ratio": s["records_per_s"] / a["records_per_s"],
                                           "series_ratio": s["series_s"] / a["series_s"],
                                           "summary_ratio": s["summary_s"] / a["summary_s"], "against": args.against}
            print(f"SQLite, this tree / {args.against}: ingest x{record['sqlite_vs_against']['ingest_ratio']:.3f}, "
                  f"series x{record['sqlite_vs_against']['series_ratio']:.3f}, "
                  f"summary x{record['sqlite_vs_against']['summary_ratio']:.3f} (within 5%: 0.95 / 1.05)")
        # 2. HTTP ingest: one SQLite collector; one and two PostgreSQL collectors on one database.
        http: dict[str, dict] = {}
        for r in range(rounds):
            for label, count, pg in (("sqlite_1", 1, False), ("postgres_1", 1, True), ("postgres_2", 2, True)):
                url_db = cluster.database(f"http_{label}_{r}") if pg else None
                with tempfile.TemporaryDirectory() as tmp, contextlib_collectors(tmp, count, url_db) as (urls, env):
                    big = http_ingest(urls, env, seconds, batch, producers=1)
                    small = http_ingest(urls, env, seconds, 100, producers=4)
                kept = http.get(label, {"records_per_s": 0, "requests_per_s": 0})
                http[label] = {"records_per_s": max(kept["records_per_s"], big["records_per_s"]),
                               "requests_per_s": max(kept["requests_per_s"], small["requests_per_s"])}
                print(f"HTTP {label}: {big['records_per_s']:,.0f} records/s (20,000-record batches), "
                      f"{small['requests_per_s']:,.0f} requests/s (100-record batches)", flush=True)
        record["http"] = http
        # 3. pages of a 1,000-run project.
        from tests.many_runs import seed_runs
        from starvewatch.monitor.storage.open_store import open_store
        pages = {}
        runs = 200 if args.quick else 1000
        for label in ("sqlite", "postgres"):
            with tempfile.TemporaryDirectory() as tmp:
                target = str(Path(tmp) / "starvewatch.db") if label == "sqlite" else cluster.database("pages")
                store = open_store(target)
                plans = seed_runs(store, runs)
                store.close()
                extra = ("--database-url", target) if label == "postgres" else ()
                with running_collector(tmp, extra) as (url, _):
                    pages[label] = page_times(url, plans[-1]["id"], tries=5 if args.quick else 20)
            print(f"pages of a {runs}-run project, {label}: " + ", ".join(
                f"{k} first {v['first_s'] * 1e3:.0f} ms, then {v['median_s'] * 1e3:.0f} ms"
                for k, v in pages[label].items()), flush=True)
        record["pages"] = {**pages, "runs": runs}
    finally:
        cluster.stop()
        if worktree is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
                           capture_output=True)
    results_io.write(record, args.out)


class contextlib_collectors:
    """`count` real collectors (uvicorn subprocesses): on SQLite (one file) or on one
    PostgreSQL database; stopped at the end."""

    def __init__(self, directory: str, count: int, database_url: str | None) -> None:
        self.directory, self.count, self.database_url = directory, count, database_url
        self.stack = None

    def __enter__(self):
        import contextlib
        self.stack = contextlib.ExitStack()
        urls, env = [], None
        for i in range(self.count):
            d = Path(self.directory) / f"c{i}"
            d.mkdir()
            extra = ("--database-url", self.database_url) if self.database_url else ()
            url, env = self.stack.enter_context(running_collector(str(d), extra))
            urls.append(url)
        return urls, env

    def __exit__(self, *exc):
        return self.stack.__exit__(*exc)


if __name__ == "__main__":
    _ = free_port
    main()
