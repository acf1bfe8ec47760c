"""Several collectors, one PostgreSQL (issue 40 item 2): two real `serve --database-url`
collectors, 8 training ranks (real hooks, each its own process) split between them, one
collector SIGKILLed mid-run. Its ranks' batches wait in the shared spool, which the other
collector sweeps (one sweeper at a time: an advisory lock). Nothing lost, nothing doubled:
the truth is the CSV export, counted per rank; and the pages and API answer alike from any
collector of the database, a third one started at the end included."""
import csv
import io
import json
import os
import subprocess
import sys

from tests.conftest import free_port, wait_until

RANKS = 8
BURSTS, BURST_STEPS = 3, 1_500
RUN_ID = "fleet-run"

TRAIN = r"""
import json, os, sys, time, starvewatch
bursts, burst_steps, signals, rank = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], os.environ["RANK"]
loop = starvewatch.watch(range(bursts * burst_steps), name="train")
for i in loop:
    if i == burst_steps:  # one burst shipped: the test kills a collector here, then lets every rank go on
        open(os.path.join(signals, f"burst-{rank}"), "w").close()
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(signals, "go")) and time.monotonic() < deadline:
            time.sleep(0.02)
summary = starvewatch.finish()
print(json.dumps({"steps": summary["loaders"][0]["steps"], "delivery": summary["delivery"]}))
"""


def stored_rows(c) -> list[tuple[int, int]]:
    status, body = c.request("GET", f"/api/v1/runs/{RUN_ID}/export?format=csv")
    if status == 404:
        return []
    assert status == 200, body[:300]
    return [(int(r["rank"]), int(r["step"])) for r in csv.DictReader(io.StringIO(body.decode()))]


def test_two_collectors_one_killed_mid_run_lose_nothing_and_double_nothing(collector, postgres_url, tmp_path):
    extra = ["--database-url", postgres_url]
    a, b = collector(port=free_port(), extra=extra), collector(port=free_port(), extra=extra)
    signals = tmp_path / "signals"
    signals.mkdir()
    procs = []
    for rank in range(RANKS):
        target = a if rank < RANKS // 2 else b
        env = dict(os.environ, STARVEWATCH_URL=target.url, STARVEWATCH_RUN_ID=RUN_ID, STARVEWATCH_RUN_NAME="fleet",
                   RANK=str(rank), WORLD_SIZE=str(RANKS), STARVEWATCH_SIDECAR="0", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-c", TRAIN, str(BURSTS), str(BURST_STEPS), str(signals)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        wait_until(lambda: all((signals / f"burst-{r}").exists() for r in range(RANKS)), timeout_s=120,
                   what="every rank past its first burst")
        # Both collectors have stored batches of their ranks by now, then one dies mid-run.
        wait_until(lambda: {r for r, _ in stored_rows(b)} == set(range(RANKS)), timeout_s=60,
                   what="every rank's first rows stored, through both collectors")
        a.kill()
        (signals / "go").touch()
        results = []
        for p in procs:
            out, err = p.communicate(timeout=180)
            assert p.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    total = BURSTS * BURST_STEPS
    for result in results:
        assert result["steps"] == total and result["delivery"]["dropped"] == {}, result
    # The dead collector's ranks did spool (what follows is the spool's way in, not a live one).
    assert sum(r["delivery"]["spooled"] for r in results[:RANKS // 2]) > 0, results
    # The killed collector's ranks spooled what it could not take; the survivor sweeps it in.
    wait_until(lambda: len(stored_rows(b)) >= RANKS * total, timeout_s=120, what=f"{RANKS * total} stored rows")
    rows = stored_rows(b)
    assert len(rows) == len(set(rows)) == RANKS * total
    assert sorted(rows) == [(r, s) for r in range(RANKS) for s in range(total)]
    # Any collector of the database answers alike: a third, started now.
    c = collector(port=free_port(), extra=extra)
    assert sorted(stored_rows(c)) == sorted(rows)
    for peer in (b, c):
        detail = peer.get(f"/api/v1/runs/{RUN_ID}")
        assert sorted(r["rank"] for r in detail["ranks"]) == list(range(RANKS))
        summary = peer.get(f"/api/v1/runs/{RUN_ID}/summary")
        assert summary["loaders"][0]["steps"] == RANKS * total
        listed = [r for r in peer.get("/api/v1/runs")["runs"] if r["id"] == RUN_ID]
        assert listed and listed[0]["ranks"] == RANKS and listed[0]["status"] == "finished", listed
        status, page = peer.request("GET", f"/runs/{RUN_ID}")
        assert status == 200 and b"<html" in page.lower()
