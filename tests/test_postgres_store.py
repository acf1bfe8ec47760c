"""The store on a real PostgreSQL (issue 40 items 1 and 2): the same batches stored in SQLite
and in PostgreSQL give the same answers (runs list, summary, series, stragglers, raw steps, CSV
rows, deletion); replays are stored once, also when two collectors get the same batch at once;
a change stored by one collector voids another's cached answers (LISTEN/NOTIFY); the schema
is migrated under a lock and a newer one refused; the budget gives space back by TRUNCATE and
DROP of ended runs' partitions, never touching a live run's rows.

The cluster is tests/postgres.py's (a throw-away one per test session, fixture postgres_url)."""
from __future__ import annotations

import json
import threading

import psycopg
import pytest

from starvewatch.monitor.storage.folded_reads import export_rows
from starvewatch.monitor.storage.open_store import open_store
from starvewatch.monitor.storage.pg_store import PgStore
from starvewatch.monitor.storage.query import Query
from starvewatch.monitor.web.wire_models import EventBatch
from tests.sample_payloads import T0_S, sample_batch


def batches(run_id: str = "run-a", ranks: int = 4, per_rank: int = 3, seconds: int = 120, status: str = "live"):
    out = []
    for rank in range(ranks):
        for seq in range(1, per_rank + 1):
            body = sample_batch(rank, seq, T0_S + (seq - 1) * seconds, seconds, 1, run_id=run_id,
                                status=status if seq == per_rank else "live", stream=f"{run_id}-host-{rank}")
            # Rank 2 is slow: a straggler the rule must name alike on both stores.
            if rank == 2:
                body["steps"]["wait_ns"] = [w * 3 for w in body["steps"]["wait_ns"]]
            out.append(EventBatch.model_validate(body))
    return out


def answers(store) -> dict:
    q = Query(store)
    runs = [{k: v for k, v in r.items() if k != "duration_s"} for r in q.list_runs()]
    summary = q.summary("run-a")
    summary["run"].pop("duration_s", None)
    return {
        "runs": runs,
        "summary": summary,
        "run_series": q.rollup_series("run-a"),
        "rank_series": q.rollup_series("run-a", rank=1),
        "step_series": q.step_series("run-a", "train", rank=0),
        "stragglers": q.stragglers("run-a"),
        "steps_page": q.steps_page("run-a", limit=50),
        "export": sorted(row for rows in export_rows(store, "run-a") for row in rows),
        "system": q.system_overview("run-a"),
        # Ties in t_ns (two ranks' samples of one instant) come in either order from PostgreSQL.
        "events": sorted(q.events("run-a", "samples", limit=20), key=lambda e: (e["t_ns"], e.get("rank"), e.get("kind"))),
        "streams": [dict(zip(r.keys(), r)) for r in store.stream_rows("run-a")],
    }


def normalize(value):
    """Floats to 9 significant digits (the two databases sum in different orders); the
    per-stream `last_seen` is the wall clock of each ingest."""
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items() if k not in ("last_seen",)}
    if isinstance(value, (list, tuple)):
        return [normalize(v) for v in value]
    return value


def test_sqlite_and_postgresql_answer_alike(tmp_path, postgres_url):
    sqlite_store = open_store(tmp_path / "a.db")
    pg_store = open_store(postgres_url)
    assert isinstance(pg_store, PgStore)
    try:
        work = batches()
        for store in (sqlite_store, pg_store):
            assert all(store.ingest(b) for b in work)
            # Replays: the same batch again, and one split differently (only its second half is new... none).
            assert not any(store.ingest(b) for b in work[:3])
        a, b = normalize(answers(sqlite_store)), normalize(answers(pg_store))
        for key in a:
            assert a[key] == b[key], key
        assert b["stragglers"]["stragglers"] and b["stragglers"]["stragglers"][0]["rank"] == 2
        assert len(b["export"]) == 4 * 3 * 120
        for store in (sqlite_store, pg_store):
            assert store.delete_run("run-a")
            assert Query(store).list_runs() == []
            # `seen` stays: a late replay of a deleted run's batch does not bring it back.
            assert not store.ingest(work[0])
    finally:
        sqlite_store.close()
        pg_store.close()


def test_a_batch_sent_to_two_collectors_at_once_is_stored_once(postgres_url):
    stores = [PgStore(postgres_url), PgStore(postgres_url)]
    try:
        work = batches(ranks=2, per_rank=4, seconds=60)
        results: list[list[bool]] = [[], []]
        barrier = threading.Barrier(2)

        def send(i):
            barrier.wait()
            results[i] = [stores[i].ingest(b) for b in work]

        threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        # Each batch stored by exactly one of the two.
        assert [x + y for x, y in zip(*results)] == [1] * len(work)
        rows = sorted(r for rows in export_rows(stores[1], "run-a") for r in rows)
        assert len(rows) == len(set(rows)) == 2 * 4 * 60
        assert Query(stores[0]).summary("run-a")["loaders"][0]["steps"] == 2 * 4 * 60
    finally:
        for s in stores:
            s.close()


def test_a_change_stored_by_one_collector_voids_anothers_cached_answer(postgres_url, monkeypatch):
    # A changed answer may lag by MAX_STALENESS_S by design (query.py); here it must not lag at
    # all once the NOTIFY is in, so the lag the design allows is set to none.
    monkeypatch.setattr("starvewatch.monitor.storage.query.MAX_STALENESS_S", 0.0)
    writer, reader = PgStore(postgres_url), PgStore(postgres_url)
    try:
        work = batches(ranks=1, per_rank=2, seconds=60)
        writer.ingest(work[0])
        q = Query(reader)
        before = q.rollup_series("run-a")  # cached with no age bound while the data version holds
        assert sum(p["steps"] for p in before["points"]) == 60
        version = reader.versions["run-a"]
        writer.ingest(work[1])
        from tests.conftest import wait_until
        wait_until(lambda: reader.versions["run-a"] > version, timeout_s=30, what="the NOTIFY of the new batch")
        assert sum(p["steps"] for p in q.rollup_series("run-a")["points"]) == 120
        deletions = reader.deletions
        writer.delete_run("run-a")
        wait_until(lambda: reader.deletions > deletions, timeout_s=30, what="the NOTIFY of the deletion")
        assert Query(reader).list_runs() == []
    finally:
        writer.close()
        reader.close()


def test_collectors_opening_one_database_together_migrate_it_once_and_a_newer_schema_is_refused(postgres_url):
    opened: list = []
    errors: list = []

    def open_one():
        try:
            opened.append(PgStore(postgres_url))
        except Exception as exc:  # noqa: BLE001 - the assertion below shows it
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == [] and len(opened) == 4
    for s in opened:
        s.close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == "6"
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(RuntimeError, match="newer starvewatch"):
        PgStore(postgres_url)


def test_a_database_of_schema_5_gets_projects_and_tokens(postgres_url):
    """Version 6 (issue 40: project tokens): a database written at version 5 gains runs.project
    (NULL for its runs: no project) and the tokens table at the next open."""
    from starvewatch.monitor.storage import access_tokens
    store = PgStore(postgres_url)
    assert store.ingest(EventBatch.model_validate(sample_batch(0, 1, T0_S, 10, 1, run_id="old-run")))
    store.close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE runs DROP COLUMN project")
        conn.execute("DROP TABLE tokens")
        conn.execute("UPDATE meta SET value = '5' WHERE key = 'schema_version'")
    store = PgStore(postgres_url)
    try:
        assert store.run_row("old-run")["project"] is None
        record, token = access_tokens.create(store, "read", ["vision"])
        assert access_tokens.find(store, token) == record
        assert store.reader().execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == "6"
    finally:
        store.close()


def _partition_rows(url: str, run_id: str) -> int:
    from starvewatch.monitor.storage.pg_schema import partition_name
    with psycopg.connect(url, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass(%s)", (partition_name(run_id),)).fetchone()[0] is None:
            return -1  # dropped
        return conn.execute(f'SELECT count(*) FROM "{partition_name(run_id)}"').fetchone()[0]


def test_the_budget_truncates_then_drops_ended_runs_and_never_touches_a_live_one(postgres_url):
    store = PgStore(postgres_url)
    try:
        for b in batches("old", ranks=2, per_rank=2, seconds=300, status="finished"):
            store.ingest(b)
        for b in batches("live", ranks=2, per_rank=2, seconds=300):
            store.ingest(b)
        live_rows = _partition_rows(postgres_url, "live")
        assert live_rows == 2 * 2 * 300 and _partition_rows(postgres_url, "old") == 2 * 2 * 300
        used = store.retention.used_bytes()
        from starvewatch.monitor.budget.retention import LOW_WATER
        from starvewatch.monitor.storage.pg_schema import partition_name
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            old_bytes = conn.execute("SELECT pg_total_relation_size(%s)", (partition_name("old"),)).fetchone()[0]
        # A budget whose low water is half the ended run's raw rows away: folding them is enough.
        store.retention.max_bytes = int((used - old_bytes // 2) / LOW_WATER)
        done = store.retention.enforce_now()
        assert done["coarsened_runs"] == 1 and done["deleted_runs"] == 0, done
        assert _partition_rows(postgres_url, "old") == 0
        assert _partition_rows(postgres_url, "live") == live_rows
        # Its totals are kept (the summary reads the loaders' statistics and the rollups).
        assert Query(store).summary("old")["loaders"][0]["steps"] == 2 * 600
        # A budget nothing but deletion meets: the ended run goes, the live one stays whole.
        store.retention.max_bytes = 1_000_000
        done = store.retention.enforce_now()
        assert done["deleted_runs"] == 1, done
        assert _partition_rows(postgres_url, "old") == -1
        assert _partition_rows(postgres_url, "live") == live_rows
        assert [r["id"] for r in Query(store).list_runs()] == ["live"]
        assert "deleted" in Query(store).storage_notes()[0]["action"]
    finally:
        store.close()


def test_names_with_copy_s_special_characters_are_stored_as_sent(postgres_url):
    """Step rows go in by COPY's text format: a backslash, or a loader name that looks like its
    NULL marker, must come back exactly as sent."""
    store = PgStore(postgres_url)
    try:
        body = sample_batch(0, 1, T0_S, 10, 1, run_id="run-n")
        body["steps"]["loader"] = ["\\N"] * 5 + ["a\\b é"] * 5
        body["loaders"][0]["name"] = "\\N"
        assert store.ingest(EventBatch.model_validate(body))
        rows = [r for rows in store.step_rows("run-n") for r in rows]
        assert [r[1] for r in rows] == ["\\N"] * 5 + ["a\\b é"] * 5
        assert [r[9] for r in rows] == [None] * 10  # gpu_idle_ns: a real NULL
    finally:
        store.close()


def test_the_budget_drops_a_live_runs_old_hours_but_never_its_straggler_window(postgres_url, monkeypatch):
    monkeypatch.setattr(Query, "STRAGGLER_ROWS", 400)  # the rule reads what the budget keeps
    store = PgStore(postgres_url)
    try:
        hour0 = T0_S + (3600 - T0_S % 3600)  # the first whole hour: one batch per hour and rank
        work = []
        for k in range(4):  # as ranks send: hour by hour, both ranks
            for rank in range(2):
                body = sample_batch(rank, k + 1, hour0 + 3600 * k, 3600, 10, run_id="live",
                                    stream=f"live-host-{rank}")
                if rank == 1:
                    body["steps"]["wait_ns"] = [w * 3 for w in body["steps"]["wait_ns"]]
                work.append(EventBatch.model_validate(body))
        for b in work:
            assert store.ingest(b)
        total = 2 * 4 * 360
        store.retention.raw_window_steps = 400  # 200 steps a rank: inside each rank's last hour
        before = Query(store).stragglers("live")
        loaders_before = Query(store).summary("live")["loaders"]
        store.retention.max_bytes = 1_000_000  # nothing but folding everything would do
        done = store.retention.enforce_now()
        # Hours 0-2 dropped (three partitions of 720 rows), the last hour kept whole.
        assert done["steps"] == 3 * 720 and done["deleted_runs"] == 0, done
        assert _partition_rows(postgres_url, "live") == 720
        from starvewatch.monitor.storage.pg_schema import hour_partition_name
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            kept = [conn.execute("SELECT to_regclass(%s)", (hour_partition_name("live", hour0 // 3600 + k),))
                    .fetchone()[0] is not None for k in range(4)]
        assert kept == [False, False, False, True]
        q = Query(store)
        # The straggler rule reads the window: the same answer as before the fold.
        assert normalize(q.stragglers("live")) == normalize(before) and before["stragglers"][0]["rank"] == 1
        # Totals and percentiles come from the loaders' statistics: unchanged by the fold.
        assert normalize(q.summary("live")["loaders"]) == normalize(loaders_before)
        # The CSV export: the dropped hours as buckets, then the raw rows; every step counted once.
        rows = [r for rows in export_rows(store, "live") for r in rows]
        buckets = sum(r[12] for r in rows if r[10] == "bucket")
        raw_steps = sum(1 for r in rows if r[10] == "step")
        assert raw_steps == 720 and buckets + raw_steps == total
        assert {s["rank"]: s["until_s"] for s in q.steps_page("live", limit=1)["rolled_up"]} == {
            0: hour0 + 3 * 3600 - 10 + 1, 1: hour0 + 3 * 3600 - 10 + 1}
    finally:
        store.close()


def test_the_import_command_takes_a_spool_into_postgresql(tmp_path, monkeypatch, postgres_url):
    import subprocess
    import sys

    import starvewatch
    other = tmp_path / "elsewhere"
    monkeypatch.setenv("STARVEWATCH_DIR", str(other))
    list(starvewatch.watch(range(25)))  # STARVEWATCH_URL=off: everything goes to the spool
    run_id = starvewatch.finish()["run"]["id"]
    out = subprocess.run([sys.executable, "-m", "starvewatch", "import", str(other), "--dir", str(tmp_path / "here"),
                          "--database-url", postgres_url], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"into {postgres_url}" in out.stdout
    store = open_store(postgres_url)
    try:
        assert Query(store).summary(run_id)["loaders"][0]["steps"] == 25
    finally:
        store.close()
    assert not (tmp_path / "here" / "starvewatch.db").exists()  # nothing went to a SQLite file


def test_rollup_tiers_and_sample_folds_answer_alike_on_both_stores(tmp_path, postgres_url):
    """The budget's DELETE-based folds (rollup_tiers.py, sample_rollups.py) run on PostgreSQL
    through the same code: folded alike, they answer alike."""
    work = []
    for k in range(3):  # 18 hours a rank, a step and the samples every 30 s: 60 s tiers allowed
        for rank in range(2):
            work.append(EventBatch.model_validate(
                sample_batch(rank, k + 1, T0_S + 6 * 3600 * k, 6 * 3600, 30, stream=f"fold-{rank}")))
    sqlite_store, pg_store = open_store(tmp_path / "a.db"), PgStore(postgres_url)
    try:
        counts = []
        for store in (sqlite_store, pg_store):
            for b in work:
                assert store.ingest(b)
            assert store.retention.allowed_width_s("run-a") == 60
            with store._write_lock:
                merged = store.retention.coarsen("run-a", 60)
                folded = 0
                while n := store.retention.fold_samples("run-a", 60, whole=True):
                    folded += n
            counts.append((merged, folded))
        assert counts[0] == counts[1] and counts[0][0] > 4000 and counts[0][1] > 10_000, counts
        a, b = normalize(answers(sqlite_store)), normalize(answers(pg_store))
        for key in a:
            assert a[key] == b[key], key
        assert any(r[10] == "bucket" for r in b["export"]) is False  # raw steps stay: only rollups coarsened
        assert b["run_series"]["bucket_s"] >= 60
        # The folded space counts as free until the table grows again (pg_retention._freed).
        before = pg_store.retention.used_bytes()
        pg_store.retention._freed("events", 1000)
        assert pg_store.retention.used_bytes() < before
    finally:
        sqlite_store.close()
        pg_store.close()


@pytest.mark.parametrize("url, code, said", [
    ("mysql://u@127.0.0.1/x", 2, "only PostgreSQL is supported"),
    ("postgresql://postgres@127.0.0.1:{closed}/x", 1, "cannot connect to the database"),
])
def test_serve_refuses_a_database_it_cannot_use_with_one_line(url, code, said):
    import subprocess
    import sys

    from tests.conftest import free_port
    url = url.format(closed=free_port())  # a port nothing listens on
    out = subprocess.run([sys.executable, "-m", "starvewatch", "serve", "--port", str(free_port()),
                          "--database-url", url], capture_output=True, text=True, timeout=120)
    assert out.returncode == code, out.stderr
    assert said in out.stderr and "Traceback" not in out.stderr


def test_the_trace_export_reads_postgresql_as_it_reads_sqlite(tmp_path, postgres_url):
    """`export RUN -f trace` (issue 38 item 3) through the same code on both stores: steps,
    worker records, counters and stalls give the same trace."""
    from starvewatch.monitor.outputs.trace_export import build_trace
    bodies = [sample_batch(rank, seq, T0_S + (seq - 1) * 20, 20, 1, stream=f"run-a-host-{rank}")
              for rank in range(2) for seq in (1, 2)]
    start = (T0_S + 3) * 10**9  # rank 0's worker records and its stall, inside steps 2 to 6
    body = bodies[0]
    body["worker_batches"] = {"loader": ["train"] * 3, "worker": [0, 1, 0], "idx": [0, 1, 2],
                              "wait_start_ns": [start] * 3, "got_ns": [start + 10] * 3,
                              "fetch_start_ns": [start + 20] * 3, "collate_start_ns": [start + 30, 0, start + 40],
                              "collate_end_ns": [start + 35, 0, start + 45], "done_ns": [start + 50] * 3}
    body["stalls"] = [{"t_ns": start + 2 * 10**9, "started_ns": start + 10**9, "loader": "train",
                       "epoch": 0, "step": 4, "wait_s": 1.0}]
    work = [EventBatch.model_validate(b) for b in bodies]
    sqlite_store, pg_store = open_store(tmp_path / "a.db"), open_store(postgres_url)
    assert isinstance(pg_store, PgStore)
    try:
        traces = []
        for store in (sqlite_store, pg_store):
            assert all(store.ingest(b) for b in work)
            traces.append([build_trace(store, "run-a", steps="2:6"), build_trace(store, "run-a", window="3:9", rank=1),
                           build_trace(store, "run-a", max_events=40)])
        # Events of one instant on two ranks come in either order from the two databases.
        def canonical(trace):
            return {**trace, "traceEvents": sorted(trace["traceEvents"], key=lambda e: json.dumps(e, sort_keys=True))}
        for lite, pg in zip(traces[0], traces[1]):
            lite, pg = canonical(lite), canonical(pg)
            assert lite == pg
        ranged, windowed, cut = traces[1]
        cats = [e.get("cat") for e in ranged["traceEvents"]]
        assert cats.count("starvewatch.wait") == 2 * 5 and cats.count("starvewatch.fetch") == 3
        assert cats.count("starvewatch.collate") == 2 and cats.count("starvewatch.stall") == 1
        assert any(e["ph"] == "C" for e in ranged["traceEvents"])
        assert {e["args"]["step"] for e in windowed["traceEvents"] if e.get("cat") == "starvewatch.wait"} == set(range(3, 10))
        assert cut["starvewatch"]["truncated"] is True
    finally:
        sqlite_store.close()
        pg_store.close()
