"""What one run may hold (issue 36 item 3): loader names, ranks, the hostname's size, tuning
documents and stall events are bounded per run (starvewatch/limits.py); past a bound a batch
is refused whole with a 422 that names it, and the hooks keep within the same bounds."""
import json

import pytest

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


def _bound_walk(c) -> list[tuple[int, str]]:
    """One sequence of batches and tuning documents that meets every bound a collector checks
    at ingest, and each answer (status, message)."""
    answers = []
    many = [f"l{i}" for i in range(limits.MAX_LOADERS_PER_RUN)]
    for doc in (_batch("names", 1, loaders=many[:-1]), _batch("names", 2, loaders=many[-2:] + ["one-too-many"]),
                _batch("names", 3, loaders=many[-1:])):
        answers.append(_post(c, "/api/v1/ingest", doc))
    per_batch = limits.MAX_LIST_RECORDS["stalls"]
    for seq in range(1, limits.MAX_STALL_ROWS_PER_RANK // per_batch + 1):
        answers.append(_post(c, "/api/v1/ingest", _batch("stalls", seq, stalls=per_batch)))
    answers.append(_post(c, "/api/v1/ingest", _batch("stalls", 99, stalls=1)))
    a1, b = _batch("run-a", 1), _batch("run-b", 2)
    a1["stream"] = b["stream"] = "shared-stream"
    answers += [_post(c, "/api/v1/ingest", a1), _post(c, "/api/v1/ingest", b)]
    answers.append(_post(c, "/api/v1/ingest", full_batch("tuned")))
    for _ in range(limits.MAX_TUNINGS_PER_RUN + 1):
        answers.append(_post(c, "/api/v1/runs/tuned/tuning", TUNING))
    return answers


def test_postgresql_refuses_a_run_over_its_bounds_as_sqlite_does(collector, postgres_url):
    """Issue 40: the PostgreSQL store applies issue 36's bounds and the stream id's ownership
    through the same code (run_bounds.py) and answers each batch as the SQLite store does."""
    on_sqlite = _bound_walk(collector())
    on_postgres = _bound_walk(collector(extra=["--database-url", postgres_url]))
    refused = [a for a in on_sqlite if a[0] == 422]
    assert len(refused) == 4, refused  # loader names, stall events, the stream's run, tuning results
    assert [a[0] for a in on_postgres] == [a[0] for a in on_sqlite]
    assert [a[1] for a in on_postgres if a[0] == 422] == [a[1] for a in refused]


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_ranks_per_run_are_bounded(isolated_starvewatch, monkeypatch, request, database):
    assert limits.MAX_RANKS_PER_RUN >= 4096  # the team collector's target fits
    from starvewatch.monitor.storage import run_bounds
    from starvewatch.monitor.storage.open_store import open_store
    from starvewatch.monitor.web.wire_models import EventBatch
    monkeypatch.setattr(run_bounds, "MAX_RANKS_PER_RUN", 3)  # the same check, in seconds
    isolated_starvewatch.mkdir(parents=True)
    store = open_store(str(isolated_starvewatch / "ranks.db") if database == "sqlite"
                       else request.getfixturevalue("postgres_url"))
    try:
        for rank in range(3):
            assert store.ingest(EventBatch.model_validate(_batch("ranks", 1, rank=rank)))
        with pytest.raises(ValueError, match="3 ranks already"):
            store.ingest(EventBatch.model_validate(_batch("ranks", 1, rank=3)))
        assert store.ingest(EventBatch.model_validate(_batch("ranks", 2, rank=2)))  # a known rank still is
        assert store.reader().execute("SELECT count(*) FROM streams WHERE rank = 3").fetchone()[0] == 0
    finally:
        store.close()


def test_postgresql_out_of_space_is_a_507_and_the_batch_is_taken_later(collector, postgres_url):
    """The database's disk_full (SQLSTATE 53100, raised here by a trigger as PostgreSQL raises it
    when it cannot extend a file) answers 507 as SQLite's full disk does: nothing stored, and
    the same batch sent again once there is room is stored, once."""
    import psycopg
    c = collector(extra=["--database-url", postgres_url])
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION no_room() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION "
                     "'could not extend file: No space left on device' USING ERRCODE = 'disk_full'; END $$ "
                     "LANGUAGE plpgsql")
        conn.execute("CREATE TRIGGER no_room BEFORE INSERT ON seen FOR EACH ROW EXECUTE FUNCTION no_room()")
        status, body = _post(c, "/api/v1/ingest", _batch("full", 1))
        assert status == 507 and "send it again later" in body, body
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
        conn.execute("DROP TRIGGER no_room ON seen")
    status, body = _post(c, "/api/v1/ingest", _batch("full", 1))
    assert status == 200 and '"duplicate":false' in body, body
    csv_rows = call(c, "GET", "/api/v1/runs/full/export?format=csv")[2].decode().strip().splitlines()
    assert len(csv_rows) == 1 + 30, len(csv_rows)
