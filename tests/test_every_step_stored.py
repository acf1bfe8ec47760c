"""Every step stored, at any rate (issue 26 item 1): a loop that outruns delivery, with the
collector's limits lowered so that it does so in seconds (STARVEWATCH_MAX_BATCH_RECORDS, read
by both sides through starvewatch/limits.py), with and without the sidecar, the collector up,
down, and restarted mid-run. The truth is what the collector stored (its CSV export), and
`acknowledged` in the process's account never claims more than that."""
import csv
import io
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import free_port, wait_until

LIMIT = 500  # step records per list, both sides: a burst of 6,000 steps is 12 parts at least
BURSTS, BURST_STEPS = 6, 6_000

TRAIN = r"""
import json, os, sys, time, starvewatch
bursts, burst_steps, signals = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def wait_for(name):
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(signals, name)) and time.monotonic() < deadline:
        time.sleep(0.02)
loop = starvewatch.watch(range(bursts * burst_steps), name="train")
for i in loop:  # as fast as Python goes: far faster than 500-record batches can be delivered
    if i and i % burst_steps == 0:
        burst = i // burst_steps
        open(os.path.join(signals, f"burst-{burst}"), "w").close()
        if burst in (2, 4):
            wait_for(f"go-{burst}")  # the test changes the collector here
summary = starvewatch.finish()
print(json.dumps({"run_id": summary["run"]["id"], "steps": summary["loaders"][0]["steps"],
                  "delivery": summary["delivery"]}))
"""


def stored_rows(c, run_id: str) -> list[tuple[int, int]]:
    status, body = c.request("GET", f"/api/v1/runs/{run_id}/export?format=csv")
    if status == 404:
        return []
    assert status == 200, body[:300]
    return [(int(r["epoch"]), int(r["step"])) for r in csv.DictReader(io.StringIO(body.decode()))]


@pytest.mark.parametrize("sidecar", ["1", "0"])
@pytest.mark.parametrize("collector_state", ["up", "down", "restarted"])
def test_a_loop_that_outruns_delivery_has_every_step_stored(collector_state, sidecar, collector, tmp_path,
                                                            isolated_starvewatch, monkeypatch):
    monkeypatch.setenv("STARVEWATCH_MAX_BATCH_RECORDS", str(LIMIT))  # the collector's, and the training's
    port = free_port()
    c = collector(port=port) if collector_state != "down" else None
    signals = tmp_path / "signals"
    signals.mkdir()
    env = dict(os.environ, STARVEWATCH_URL=f"http://127.0.0.1:{port}", STARVEWATCH_SIDECAR=sidecar,
               STARVEWATCH_RUN_NAME="fast")
    proc = subprocess.Popen([sys.executable, "-c", TRAIN, str(BURSTS), str(BURST_STEPS), str(signals)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for burst in (2, 4):
            wait_until((signals / f"burst-{burst}").exists, timeout_s=60, what=f"burst {burst}")
            if collector_state == "restarted" and burst == 2:
                c.kill()  # down from here to burst 4: batches go to the spool
            if collector_state == "restarted" and burst == 4:
                c.start()
            (signals / f"go-{burst}").touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    total = BURSTS * BURST_STEPS
    account = result["delivery"]
    assert result["steps"] == total
    assert account["dropped"] == {}, account
    assert account["acknowledged"] + account["spooled"] == total, account
    if c is None:
        assert account["acknowledged"] == 0
        c = collector(port=port)  # started later on the same directory: its sweep takes the spool
    else:
        # Acknowledged means stored: the collector holds at least that many rows already.
        assert len(stored_rows(c, result["run_id"])) >= account["acknowledged"], account
    # What waited in the spool is swept in (every 5 s): then every step is stored, once.
    wait_until(lambda: len(stored_rows(c, result["run_id"])) >= total, timeout_s=60,
               what=f"{total} stored rows")
    rows = stored_rows(c, result["run_id"])
    assert len(rows) == len(set(rows)) == total
    assert sorted(rows) == [(0, i) for i in range(total)]
    assert not list(isolated_starvewatch.glob("spool/*/*/*.json.gz"))
    assert not list(isolated_starvewatch.glob("rejected/**/*.json.gz"))


def test_a_fast_loop_ships_batches_within_the_limit(memory_run):
    """Before: the shipper checked its limit only after adding a chunk of up to 2,048 records,
    each holding up to 4,096 steps: a loop faster than one shipping cycle went out as one
    batch of its whole backlog, far over what the collector accepts."""
    import starvewatch
    from starvewatch.hooks.delivery.shipper import SEGMENT_TAKE_STEPS
    from starvewatch.limits import MAX_STEP_RECORDS
    session, transport = memory_run
    n = 400_000
    for _ in starvewatch.watch(range(n), name="train"):
        pass
    summary = starvewatch.finish()
    sizes = [len(p["steps"]["step"]) for p in transport.payloads]
    assert sum(sizes) == n and summary["delivery"]["acknowledged"] == n
    assert max(sizes) <= min(MAX_STEP_RECORDS, session.settings.max_batch_records + SEGMENT_TAKE_STEPS), sizes


def _batch(stream: str, seq: int, steps: list[int], samples: int = 0, part=None) -> dict:
    n = len(steps)
    out = {"schema": "starvewatch.events/1", "run_id": "ranges", "stream": stream, "seq": seq,
           "steps": {"loader": ["train"] * n, "epoch": [0] * n, "step": steps,
                     "start_ns": [10**18 + s for s in steps], "wait_ns": [1] * n, "compute_ns": [1] * n,
                     "other_ns": [0] * n, "batch_size": [None] * n, "gpu_idle_ns": [None] * n},
           "phases": [["train", 0, s, "load", 5] for s in steps],
           "samples": [{"kind": "host", "t_ns": 10**18 + i, "cpu_pct": 1.0} for i in range(samples)]}
    if part is not None:
        out["part"] = part
    return out


def test_parts_split_differently_are_stored_once(tmp_path):
    """The collector keeps the record ranges it stored of each batch: parts cut at 300, then the
    whole batch, then parts cut at 70 and overlapping the first ones, store each record once."""
    from starvewatch.batch_parts import split
    from starvewatch.limits import MAX_LIST_RECORDS
    from starvewatch.monitor.web.wire_models import EventBatch
    from starvewatch.monitor.storage.store import Store
    store = Store(tmp_path / "db.sqlite")
    whole = _batch("s1", 7, list(range(1000)), samples=30)
    limits = dict(MAX_LIST_RECORDS, samples=20)
    first = split(whole, limits, max_steps=300)
    assert [p["part"] for p in first] == [[0, 300], [300, 600], [600, 900], [900, 1020], [1020, 1030]]
    assert store.ingest(EventBatch.model_validate(first[1])) is True
    assert store.ingest(EventBatch.model_validate(first[1])) is False  # the same part again: a replay
    assert store.ingest(EventBatch.model_validate(first[3])) is True
    for part in split(whole, limits, max_steps=70):  # smaller parts, some overlapping the stored ones
        store.ingest(EventBatch.model_validate(part))
    assert store.ingest(EventBatch.model_validate(whole)) is False  # everything stored already
    steps = [row[3] for rows in store.step_rows("ranges") for row in rows]
    assert sorted(steps) == list(range(1000))
    reader = store.reader()
    assert reader.execute("SELECT count(*) FROM phases WHERE run_id = 'ranges'").fetchone()[0] == 1000
    assert reader.execute("SELECT count(*) FROM events WHERE run_id = 'ranges'").fetchone()[0] == 30
    assert store.loader_data("ranges")[0].records.wait.count == 1000  # the statistics, once each
    assert reader.execute("SELECT sum(steps) FROM rollups WHERE run_id = 'ranges'").fetchone()[0] == 1000
    store.close()


def test_a_part_that_does_not_match_its_records_is_refused():
    from pydantic import ValidationError

    from starvewatch.monitor.web.wire_models import EventBatch
    with pytest.raises(ValidationError, match="does not match"):
        EventBatch.model_validate(_batch("s1", 1, [1, 2, 3], part=[0, 5]))


def test_a_database_of_schema_1_opens_and_keeps_its_replays_out(tmp_path):
    import sqlite3

    from starvewatch.monitor.web.wire_models import EventBatch
    from starvewatch.monitor.storage.store import Store
    from starvewatch.monitor.storage.store_schema import SCHEMA_VERSION
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
        INSERT INTO meta VALUES ('schema_version', '1');
        CREATE TABLE seen (stream TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (stream, seq)) WITHOUT ROWID;
        INSERT INTO seen VALUES ('old-stream', 1);""")
    old.commit()
    old.close()
    store = Store(path)
    # 2: `seen` by record range; 3: rank-summed rollups; 4: folded samples; 5: chart bands; 6: projects, tokens
    assert SCHEMA_VERSION == 6
    assert store.reader().execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == "6"
    # The batch stored before the upgrade, replayed whole or in parts: nothing stored again.
    old_batch = _batch("old-stream", 1, list(range(10)))
    assert store.ingest(EventBatch.model_validate(old_batch)) is False
    assert store.ingest(EventBatch.model_validate(dict(_batch("old-stream", 1, [3, 4]), part=[3, 5]))) is False
    assert store.ingest(EventBatch.model_validate(_batch("old-stream", 2, [10, 11]))) is True
    assert [row[3] for rows in store.step_rows("ranges") for row in rows] == [10, 11]
    store.close()
    Store(path).close()  # opens again as version 4
