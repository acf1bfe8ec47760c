"""What one run may hold (issue 36 item 3): loader names, ranks, the hostname's size, tuning
documents and stall events are bounded per run (starvewatch/limits.py); past a bound a batch
is refused whole with a 422 that names it, and the hooks keep within the same bounds."""
import json

import starvewatch
from starvewatch import limits
from tests.test_security import JSON, TUNING, call
from tests.test_stored_markup_browser import full_batch


def _post(c, path, doc):
    status, _, body = call(c, "POST", path, JSON, json.dumps(doc).encode())
    return status, body.decode()


def _batch(run_id, seq, *, rank=0, loaders=("train",), stalls=0):
    b = full_batch(run_id)
    b.update(seq=seq, rank=rank, stream=f"{run_id}-{rank}")
    b["run"]["rank"] = rank
    b["samples"], b["workers"] = [], []
    n = len(b["steps"]["step"])
    b["steps"]["loader"] = [loaders[i % len(loaders)] for i in range(n)]
    b["loaders"] = [dict(b["loaders"][0], name=name) for name in loaders]
    b["stalls"] = [dict(b["stalls"][0], started_ns=b["stalls"][0]["started_ns"] + i) for i in range(stalls)]
    return b


def test_each_run_bound_is_refused_with_a_reason(collector):
    c = collector()
    many = [f"l{i}" for i in range(limits.MAX_LOADERS_PER_RUN)]
    assert _post(c, "/api/v1/ingest", _batch("names", 1, loaders=many[:-1]))[0] == 200
    status, body = _post(c, "/api/v1/ingest", _batch("names", 2, loaders=many[-2:] + ["one-too-many"]))
    assert status == 422 and f"over the limit of {limits.MAX_LOADERS_PER_RUN}" in body, body
    assert _post(c, "/api/v1/ingest", _batch("names", 3, loaders=many[-1:]))[0] == 200  # exactly at it

    host = full_batch("host")
    host["run"]["host"] = "h" * (limits.MAX_HOST_CHARS + 1)
    status, body = _post(c, "/api/v1/ingest", host)
    assert status == 422 and "host" in body, body

    per_batch = limits.MAX_LIST_RECORDS["stalls"]
    for seq in range(1, limits.MAX_STALL_ROWS_PER_RANK // per_batch + 1):
        assert _post(c, "/api/v1/ingest", _batch("stalls", seq, stalls=per_batch))[0] == 200
    status, body = _post(c, "/api/v1/ingest", _batch("stalls", 99, stalls=1))
    assert status == 422 and "stall events" in body, body
    assert _post(c, "/api/v1/ingest", _batch("stalls", 100, stalls=0))[0] == 200  # the run goes on

    assert _post(c, "/api/v1/ingest", full_batch("tuned"))[0] == 200
    for _ in range(limits.MAX_TUNINGS_PER_RUN):
        assert _post(c, "/api/v1/runs/tuned/tuning", TUNING)[0] == 200
    status, body = _post(c, "/api/v1/runs/tuned/tuning", TUNING)
    assert status == 422 and "tuning results already" in body, body


def test_ranks_per_run_are_bounded(isolated_starvewatch, monkeypatch):
    assert limits.MAX_RANKS_PER_RUN >= 4096  # the team collector's target fits
    from starvewatch.monitor.storage import run_bounds
    from starvewatch.monitor.storage.store import Store
    from starvewatch.monitor.web.wire_models import EventBatch
    monkeypatch.setattr(run_bounds, "MAX_RANKS_PER_RUN", 3)  # the same check, in seconds
    isolated_starvewatch.mkdir(parents=True)
    store = Store(isolated_starvewatch / "ranks.db")
    for rank in range(3):
        assert store.ingest(EventBatch.model_validate(_batch("ranks", 1, rank=rank)))
    try:
        store.ingest(EventBatch.model_validate(_batch("ranks", 1, rank=3)))
    except ValueError as exc:
        assert "3 ranks already" in str(exc)
    else:
        raise AssertionError("a rank past the bound was stored")
    assert store.ingest(EventBatch.model_validate(_batch("ranks", 2, rank=2)))  # a known rank still is
    store.close()


def test_the_hooks_keep_within_the_loader_bound(memory_run):
    session, transport = memory_run
    for i in range(limits.MAX_LOADERS_PER_RUN + 5):
        list(starvewatch.watch(range(2), name=f"loader-{i}"))
    starvewatch.finish()
    names = {n for p in transport.payloads for n in p["steps"]["loader"]}
    assert len(names) == limits.MAX_LOADERS_PER_RUN and limits.OVERFLOW_LOADER in names


def test_a_stream_id_is_its_runs(collector):
    """Issue 36: run B reusing run A's stream id (the API shows it) made A's next batch a
    "duplicate" and marked A finished."""
    c = collector()
    a1 = _batch("run-a", 1)
    a1["stream"] = "shared-stream"
    assert _post(c, "/api/v1/ingest", a1)[0] == 200
    b = _batch("run-b", 2, stalls=0)
    b.update(stream="shared-stream", status="finished")
    status, body = _post(c, "/api/v1/ingest", b)
    assert status == 422 and "belongs to another run" in body, body
    a2 = _batch("run-a", 2)
    a2["stream"] = "shared-stream"
    a2["steps"]["step"] = [s + 100 for s in a2["steps"]["step"]]
    assert _post(c, "/api/v1/ingest", a2)[0] == 200
    run = c.get("/api/v1/runs/run-a")
    assert run["run"]["status"] != "finished", run["run"]
    csv_rows = call(c, "GET", "/api/v1/runs/run-a/export?format=csv")[2].decode().strip().splitlines()
    assert len(csv_rows) == 1 + 60, len(csv_rows)  # both of A's batches stored, none taken for B's


def test_the_hooks_keep_within_the_stall_bound():
    """A process sends at most a quarter of the collector's stall events per rank (a restarted
    rank stays in its run), counting the rest as dropped events."""
    from types import SimpleNamespace

    from starvewatch.hooks.samplers import StallDetector
    sent = []
    session = SimpleNamespace(stalls=[], dropped_events=0, emit=lambda kind, event: sent.append(event))
    detector = StallDetector(session)
    per_process = limits.MAX_STALL_ROWS_PER_RANK // 4
    for i in range(per_process + 50):
        detector._emit({"loader": "train", "started_ns": i, "wait_s": 11.0})
    assert len(sent) == per_process and session.dropped_events == 50
