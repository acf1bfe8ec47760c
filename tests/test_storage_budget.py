"""The storage budget (serve --max-db-size, monitor/budget/retention.py), with budgets of a few MB so
each test runs in seconds: folding keeps every answer, the CSV marks what was folded, the file
keeps to its budget under sustained ingest, ended runs go oldest first with a log line and a
banner, and a database written by the previous version opens and migrates."""
import csv
import io
import json
import logging
import shutil
import sqlite3
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from starvewatch.cli import build_parser
from starvewatch.dashboard import views
from starvewatch.monitor.storage import folded_reads
from starvewatch.monitor.budget import retention
from starvewatch.monitor.web.app import create_app
from starvewatch.monitor.storage.query import Query
from starvewatch.monitor.web.collector_settings import CollectorSettings
from tests.conftest import wait_until
from tests.test_collector_api import SECOND, batch, post
from tests.summary_v1 import as_old

DATA = Path(__file__).parent / "data"
WINDOW = 4000  # raw steps kept per run (the straggler rule reads them), lowered from 100,000


@pytest.fixture
def small_window(monkeypatch):
    monkeypatch.setattr(retention, "RAW_WINDOW_STEPS", WINDOW)
    monkeypatch.setattr(Query, "STRAGGLER_ROWS", WINDOW)


def app_client(tmp_path, max_db_bytes=retention.DEFAULT_MAX_DB_BYTES):
    settings = CollectorSettings(dir=tmp_path, dashboard=False, spool_scan_s=60, lost_after_s=3600,
                                 max_db_bytes=max_db_bytes)
    return TestClient(create_app(settings), base_url="http://127.0.0.1")


def two_rank_run(client, batches=12, n=5000, slow_steps=(), **kwargs):
    """Rank 1 waits 3 ms more per step than rank 0 (a straggler); `slow_steps` of rank 0's
    first batch wait 400 ms (they must stay raw as exemplars)."""
    for i in range(batches):
        for rank in (0, 1):
            payload = batch(stream=f"host-{rank}-s", rank=rank, seq=i + 1, n=n, step0=i * n,
                            wait_ns=2_000_000 + rank * 3_000_000,
                            status="finished" if i == batches - 1 else "live", **kwargs)
            if rank == 0 and i == 0:
                for s in slow_steps:
                    payload["steps"]["wait_ns"][s] = 400_000_000
            assert post(client, payload).status_code == 200


def csv_rows(client, run_id="run-a"):
    response = client.get(f"/api/v1/runs/{run_id}/export?format=csv")
    assert response.status_code == 200
    return list(csv.DictReader(io.StringIO(response.text)))


def fresh(client, path):
    """A summary once it reflects the fold (it says which spans are rolled up)."""
    return wait_until(lambda: (lambda s: s if "rolled_up" in s else None)(client.get(path).json()),
                      timeout_s=10, what=f"{path} after the fold")


def raw_step_rows(store):
    return store.reader().execute("SELECT count(*) FROM steps").fetchone()[0]


@pytest.mark.parametrize("text,size", [("500MB", 500 * 10**6), ("4GB", 4 * 10**9), ("512MiB", 512 * 2**20),
                                       ("4GiB", 4 * 2**30), ("1.5 GB", 1_500_000_000), ("3000000", 3_000_000)])
def test_sizes_parse_in_powers_of_ten_and_of_two(text, size):
    assert retention.parse_size(text) == size
    assert build_parser().parse_args(["serve", "--max-db-size", text]).max_db_size == size


def test_a_bad_size_is_refused_with_a_clear_error(capsys):
    for bad in ("4 gigs", "-5GB", "GB", "12XB", "10kB"):
        with pytest.raises(SystemExit) as exit_info:
            build_parser().parse_args(["serve", f"--max-db-size={bad}"])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert "--max-db-size" in err and repr(bad) in err
        assert ("500MB" in err and "4GiB" in err) or "smallest database size" in err
    assert build_parser().parse_args(["serve"]).max_db_size == 4 * 2**30


def test_folding_keeps_summary_percentiles_verdict_and_stragglers(tmp_path, small_window):
    with app_client(tmp_path) as client:
        two_rank_run(client, slow_steps=(10, 20, 30))
        store = client.app.state.store
        before = client.get("/api/v1/runs/run-a/summary").json()
        per_rank = [client.get(f"/api/v1/runs/run-a/summary?rank={r}").json() for r in (0, 1)]
        series = client.get("/api/v1/runs/run-a/series?points=300").json()
        assert before["stragglers"]["stragglers"], "the test needs a straggler to keep"
        raw_before = raw_step_rows(store)
        assert raw_before == 120_000

        store.retention.max_bytes = retention.file_bytes(store.path) // 3
        done = store.retention.enforce_now()
        assert done["steps"] > 0 and raw_step_rows(store) < raw_before // 2
        assert retention.file_bytes(store.path) <= store.retention.max_bytes

        # Answers are cached for up to Query's MAX_STALENESS_S after a change: poll for the new one.
        after = fresh(client, "/api/v1/runs/run-a/summary")
        rolled = after.pop("rolled_up")
        assert {r["rank"] for r in rolled} == {0, 1} and sum(r["steps"] for r in rolled) == done["steps"]
        assert after == before  # totals, percentiles, verdict, recommendations, stragglers
        for r in (0, 1):
            answer = fresh(client, f"/api/v1/runs/run-a/summary?rank={r}")
            assert [x["rank"] for x in answer.pop("rolled_up")] == [r]
            assert answer == per_rank[r]
        assert client.get("/api/v1/runs/run-a/series?points=300").json() == series
        # The per-step chart of a folded run is drawn from the rollups: every step in a bucket.
        drawn = client.get("/api/v1/runs/run-a/steps/series?loader=train&rank=0").json()
        assert drawn["source"] == "rollups" and sum(p["count"] for p in drawn["points"]) == 60_000
        assert max(p["wait_ms"][2] for p in drawn["points"]) == pytest.approx(400.0)


def test_csv_export_emits_rolled_up_spans_as_marked_buckets(tmp_path, small_window):
    with app_client(tmp_path) as client:
        two_rank_run(client, slow_steps=(10, 20, 30))
        store = client.app.state.store
        store.retention.max_bytes = retention.file_bytes(store.path) // 3
        store.retention.enforce_now()
        rows = csv_rows(client)
        summary = fresh(client, "/api/v1/runs/run-a/summary")
        html_report = client.get("/api/v1/runs/run-a/export?format=html").text
    kinds = {row["kind"] for row in rows}
    assert kinds == {"bucket", "exemplar", "step"}
    for rank, wait_ms in ((0, 2.0), (1, 5.0)):
        mine = [row for row in rows if row["rank"] == str(rank)]
        buckets = [row for row in mine if row["kind"] == "bucket"]
        steps = [row for row in mine if row["kind"] == "step"]
        assert buckets and all(row["step"] == "" and row["bucket_s"] == "1" for row in buckets)
        assert all(row["bucket_s"] == row["bucket_steps"] == "" for row in steps)
        # Every step once: as a row or inside a bucket, and the bucket times are totals.
        assert sum(int(row["bucket_steps"]) for row in buckets) + len(steps) == 60_000
        assert len({int(row["step"]) for row in steps}) == len(steps)
        total_wait = sum(float(row["wait_ms"]) for row in buckets + steps)
        slow_extra = 3 * (400.0 - 2.0) if rank == 0 else 0.0
        assert total_wait == pytest.approx(60_000 * wait_ms + slow_extra, rel=1e-9)
        assert sum(int(row["bucket_steps"]) for row in buckets) == next(
            r["steps"] for r in summary["rolled_up"] if r["rank"] == rank)
    exemplars = [row for row in rows if row["kind"] == "exemplar"]
    assert {(row["rank"], row["step"], row["wait_ms"]) for row in exemplars} >= {
        ("0", "10", "400.0"), ("0", "20", "400.0"), ("0", "30", "400.0")}
    assert "Rolled-up spans" in html_report and "steps before" in html_report


def test_the_file_stays_within_its_budget_under_sustained_ingest(tmp_path, small_window):
    budget = 3_000_000
    sizes = []
    with app_client(tmp_path, max_db_bytes=budget) as client:
        store = client.app.state.store
        assert store._writer.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # INCREMENTAL
        for i in range(40):  # 400,000 steps: ~26 MB of raw rows
            for rank in (0, 1):
                assert post(client, batch(stream=f"h-{rank}", rank=rank, seq=i + 1, n=5000, step0=i * 5000,
                                          wait_ns=2_000_000 + rank * 1_000_000)).status_code == 200
                sizes.append(retention.file_bytes(store.path))
        assert store.retention.folds > 0
        summary = client.get("/api/v1/runs/run-a/summary").json()
        rows = csv_rows(client)
    assert max(sizes) <= budget * 1.10, max(sizes)
    assert summary["loaders"][0]["steps"] == 400_000
    assert sum(int(r["bucket_steps"]) if r["kind"] == "bucket" else r["kind"] == "step" for r in rows) == 400_000


def test_ended_runs_are_coarsened_then_deleted_oldest_first_with_a_log_line_and_a_banner(
        tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(retention, "RAW_WINDOW_STEPS", 500)
    monkeypatch.setattr(Query, "STRAGGLER_ROWS", 500)
    with caplog.at_level(logging.WARNING, logger="starvewatch.retention"), \
            app_client(tmp_path, max_db_bytes=1_000_000) as client:
        store = client.app.state.store
        # Each run: 6,000 steps one second apart, 6,000 per-second rollup rows (too short for
        # the per-minute tier, which must leave 1,000 buckets: only deletion frees them).
        for k in range(6):
            for i in range(3):
                assert post(client, batch(run_id=f"run-{k}", stream=f"s-{k}", seq=i + 1, n=2000, step0=i * 2000,
                                          start_s=1_700_000_000 + k * 10_000, every_ns=SECOND,
                                          status="finished" if i == 2 else "live")).status_code == 200
            assert retention.file_bytes(store.path) <= 1_100_000
        ids = [r["id"] for r in client.get("/api/v1/runs").json()["runs"]]
        notes = folded_reads.recent_notes(store.reader(), limit=100)
        shown = Query(store).storage_notes()  # the banner's: the latest five
        # The newest run kept its steps: counted from what the export reads (raw rows and
        # buckets), not from the loader totals that every batch carries.
        latest = csv_rows(client, "run-5")
    assert "run-0" not in ids and "run-5" in ids
    assert sum(int(r["bucket_steps"]) if r["kind"] == "bucket" else r["kind"] == "step" for r in latest) == 6000
    actions = [(n["run_id"], n["action"]) for n in reversed(notes)]
    assert ("run-0", "deleted") in actions
    # Coarsened (stage 3) before deleted (the last resort): each run once, in that order.
    assert actions.count(("run-0", "coarsened")) == actions.count(("run-0", "deleted")) == 1
    assert actions.index(("run-0", "coarsened")) < actions.index(("run-0", "deleted"))
    deleted = [run for run, action in actions if action == "deleted"]
    assert deleted == sorted(deleted)  # oldest first
    logged = [r.getMessage() for r in caplog.records if r.name == "starvewatch.retention"]
    assert any("run-0" in line and "deleted" in line for line in logged)
    assert shown == notes[:5]
    banner = views.storage_banner(shown)
    assert banner.id == "storage-banner" and shown[0]["run_id"] in str(banner.children)
    assert "deleted" in str(banner.children)
    assert views.storage_banner([]) is None


def test_a_live_run_is_never_coarsened_or_deleted_even_when_it_is_the_oldest(tmp_path, monkeypatch):
    """The oldest run is live (its stream open, heard from just now); five ended runs after it
    push the database past its budget, so ended runs are coarsened and deleted, oldest first.
    The live run keeps every step and its raw window: the CSV export has (at least) its latest
    RAW_WINDOW_STEPS steps as raw rows (the straggler rule reads them) and every older step in
    a bucket. Its step count in the summary would prove nothing: the loader totals ride in
    every batch, so a run deleted and then sent one more batch shows them whole again."""
    window = 500
    monkeypatch.setattr(retention, "RAW_WINDOW_STEPS", window)
    monkeypatch.setattr(Query, "STRAGGLER_ROWS", window)
    with app_client(tmp_path, max_db_bytes=1_000_000) as client:
        store = client.app.state.store
        for k in ["live", 1, 2, 3, 4, 5]:  # started in this order: the live run is the oldest
            start_s = 1_700_000_000 + (0 if k == "live" else k * 10_000)
            for i in range(3):
                status = "live" if k == "live" or i < 2 else "finished"
                assert post(client, batch(run_id=f"run-{k}", stream=f"s-{k}", seq=i + 1, n=2000, step0=i * 2000,
                                          start_s=start_s, every_ns=SECOND, status=status)).status_code == 200
        store.retention.enforce_now()
        notes = [(n["run_id"], n["action"]) for n in folded_reads.recent_notes(store.reader(), limit=100)]
        runs = {r["id"]: r["status"] for r in client.get("/api/v1/runs").json()["runs"]}
        rows = csv_rows(client, "run-live")
    assert ("run-1", "deleted") in notes, "the test needs the budget to delete an ended run"
    assert runs["run-live"] == "live"
    assert [n for n in notes if n[0] == "run-live"] == []
    raw = sorted(int(row["step"]) for row in rows if row["kind"] == "step")
    # Folding goes by stored blocks (a batch's steps), so the raw tail may hold more than the window.
    assert len(raw) >= window and raw == list(range(raw[0], 6000))
    assert sum(int(row["bucket_steps"]) for row in rows if row["kind"] == "bucket") + len(raw) == 6000


def test_rollup_tiers_keep_totals_and_at_least_1000_buckets(tmp_path):
    with app_client(tmp_path) as client:
        store = client.app.state.store
        for i in range(14):  # 70,000 steps one second apart: 70,000 per-second rollup rows
            assert post(client, batch(seq=i + 1, n=5000, step0=i * 5000, every_ns=SECOND,
                                      wait_ns=2_000_000 + (i % 3) * 1_000_000)).status_code == 200
        before = client.get("/api/v1/runs/run-a/series?points=1000").json()
        assert store.retention.allowed_width_s("run-a") == 60
        with store._write_lock:
            merged = store.retention.coarsen("run-a", 60)
        assert merged == 70_000
        rows = store.reader().execute("SELECT count(*), min(span_s), max(span_s) FROM rollups").fetchone()
        assert tuple(rows) == (1167, 60, 60)
        after = client.get("/api/v1/runs/run-a/series?points=1000").json()
    assert len(after["points"]) >= 1000
    for key in ("steps",):
        assert sum(p[key] for p in after["points"]) == sum(p[key] for p in before["points"]) == 70_000
    assert max(p["wait_ms_max"] for p in after["points"]) == max(p["wait_ms_max"] for p in before["points"])
    total = sum(p["wait_ms_mean"] * p["steps"] for p in after["points"])
    assert total == pytest.approx(sum(p["wait_ms_mean"] * p["steps"] for p in before["points"]), rel=1e-9)


def test_a_database_written_by_the_previous_version_opens_and_migrates(tmp_path):
    shutil.copy(DATA / "main-schema-v1.db", tmp_path / "starvewatch.db")
    # Written as summary/1 by that collector: compared field by field as this version reads it.
    old_summary = json.loads((DATA / "main-schema-v1.summary.json").read_text())["summary"]
    old = sqlite3.connect(tmp_path / "starvewatch.db")
    assert old.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
    assert "span_s" not in {r[1] for r in old.execute("PRAGMA table_info(rollups)")}
    old.close()
    with app_client(tmp_path) as client:
        store = client.app.state.store
        assert store._writer.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # converted by one VACUUM
        assert "span_s" in {r[1] for r in store._writer.execute("PRAGMA table_info(rollups)")}
        now, expected = as_old(client.get("/api/v1/runs/old-run/summary").json(), old_summary)
        assert now == expected
        # Its rank-summed rollups were filled from the per-rank ones at open.
        assert drawn(client.get("/api/v1/runs/old-run/series?points=300").json()) == expected_series(
            store, "old-run", 300)
        rows = csv_rows(client, "old-run")
        assert len(rows) == 6000 and {r["kind"] for r in rows} == {"step"}
        # It takes new data and folds like a new one.
        assert post(client, batch(run_id="new-run", n=3000)).status_code == 200
        store.retention.max_bytes = retention.file_bytes(store.path) // 2
        store.retention.raw_window_steps = 500
        store.retention.enforce_now()
        assert retention.file_bytes(store.path) <= store.retention.max_bytes
        rows = csv_rows(client, "old-run")
        assert "bucket" in {r["kind"] for r in rows}
        assert sum(int(r["bucket_steps"]) if r["kind"] == "bucket" else r["kind"] == "step" for r in rows) == 6000


def per_rank_sum_series(store, run_id, points, loader=None):
    """The run-wide series computed the slow way: every per-rank rollup row, bucketed here."""
    rows = [r for r in store.reader().execute(
        "SELECT loader, rank, second, steps, wait_ns, compute_ns, other_ns, samples, wait_max_ns FROM rollups "
        "WHERE run_id = ?", (run_id,)) if loader is None or r[0] == loader]
    lo, hi = min(r[2] for r in rows), max(r[2] for r in rows)
    width = max(1, -(-(hi - lo + 1) // points))
    buckets: dict[int, dict] = {}
    for _, rank, second, steps, wait, compute, other, samples, wait_max in rows:
        b = buckets.setdefault((second - lo) // width, {"t_s": second, "steps": 0, "wait": 0, "compute": 0,
                                                         "other": 0, "samples": 0, "max": 0, "ranks": set()})
        b["t_s"] = min(b["t_s"], second)
        for key, value in (("steps", steps), ("wait", wait), ("compute", compute), ("other", other),
                           ("samples", samples)):
            b[key] += value
        b["max"] = max(b["max"], wait_max)
        b["ranks"].add(rank)
    return width, [(b["t_s"], b["steps"], b["wait"] / 1e6, b["compute"], b["samples"], b["max"] / 1e6,
                    (b["wait"] + b["compute"] + b["other"]) / (width * len(b["ranks"]) * 1e9))
                   for _, b in sorted(buckets.items())]


def drawn(series):
    width = series["bucket_s"]
    return width, [(p["t_s"], p["steps"], round(p["wait_ms_mean"] * p["steps"], 6),
                    round(p["compute_ms_mean"] * p["steps"] * 1e6), round(p["samples_per_s"] * width, 6),
                    p["wait_ms_max"], p["busy_fraction"]) for p in series["points"]]


def expected_series(store, run_id, points, loader=None):
    width, rows = per_rank_sum_series(store, run_id, points, loader)
    return width, [(t, steps, round(wait_ms, 6), compute, samples, wait_max, pytest.approx(busy, rel=1e-12))
                   for t, steps, wait_ms, compute, samples, wait_max, busy in rows]


def test_the_run_wide_series_from_rank_summed_rollups_equals_the_per_rank_sum(tmp_path):
    """70 ranks (more than a 64-bit mask), ranks missing from some seconds, two loaders, a tier
    fold, then a late replay into the folded span: the run-wide series read from `run_rollups`
    equals the per-rank rows summed, bucket by bucket (ranks counted per bucket included)."""
    with app_client(tmp_path) as client:
        store = client.app.state.store
        for rank in range(70):
            n = 3000 if rank % 7 else 1500  # every 7th rank stops halfway: buckets with fewer ranks
            payload = batch(stream=f"h{rank}", rank=rank, n=n, every_ns=SECOND // 2,
                            wait_ns=1_000_000 + rank * 10_000)
            payload["steps"]["loader"] = ["train" if i % 3 else "eval" for i in range(n)]
            payload["steps"]["wait_ns"][rank] = 300_000_000 + rank  # one slow step per rank
            assert post(client, payload).status_code == 200
        for points in (1000, 300, 7):
            for loader in (None, "train"):
                query = f"points={points}" + (f"&loader={loader}" if loader else "")
                assert drawn(client.get(f"/api/v1/runs/run-a/series?{query}").json()) == expected_series(
                    store, "run-a", points, loader)
        # One row per loader and second, whatever the number of ranks.
        db = store.reader()
        summed_rows = db.execute("SELECT count(*) FROM run_rollups").fetchone()[0]
        assert summed_rows == db.execute("SELECT count(*) FROM (SELECT DISTINCT loader, second FROM rollups)"
                                         ).fetchone()[0] == 2500
        assert db.execute("SELECT count(*) FROM rollups").fetchone()[0] > 60 * summed_rows
        with store._write_lock:
            assert store.retention.coarsen("run-a", 60, before_s=1_700_000_000 + 1200) > 0
        late = batch(stream="late", rank=3, seq=1, n=40, step0=100, every_ns=SECOND // 2)  # into the folded span
        assert post(client, late).status_code == 200
        with store._write_lock:
            assert store.retention.coarsen("run-a", 600) > 0
        for points in (1000, 300, 2):
            assert drawn(client.get(f"/api/v1/runs/run-a/series?points={points}").json()) == expected_series(
                store, "run-a", points)
        total = sum(p["steps"] for p in client.get("/api/v1/runs/run-a/series?points=300").json()["points"])
        assert total == 60 * 3000 + 10 * 1500 + 40


def test_a_series_is_reused_while_its_data_has_not_changed_however_old(tmp_path, monkeypatch):
    """A slow answer (the run-wide series of a month-long job) must not be computed again on
    every poll once it is older than the age limit of clock-dependent answers."""
    from starvewatch.monitor.storage import query as query_module
    with app_client(tmp_path) as client:
        assert post(client, batch(n=2000)).status_code == 200
        q = client.app.state.query
        first = q.rollup_series("run-a", points=300)
        clock = query_module.time.monotonic
        monkeypatch.setattr(query_module.time, "monotonic", lambda: clock() + 3600)
        assert q.rollup_series("run-a", points=300) is first  # an hour later, same data: same answer
        assert post(client, batch(seq=2, n=2000, step0=2000)).status_code == 200
        changed = q.rollup_series("run-a", points=300)
        assert changed is not first and sum(p["steps"] for p in changed["points"]) == 4000


def test_a_live_runs_documents_are_reclaimed_before_another_run_is_deleted(tmp_path):
    """Tuning results and stall stacks count toward the budget (issue 36: 303 MB and 232 MB
    of them under a 40 MB budget, while the budget deleted other runs to make room)."""
    from tests.test_security import TUNING
    import random
    import string
    rng = random.Random(7)

    def text(n):  # incompressible, as a real stack is to SQLite (which does not compress)
        return "".join(rng.choices(string.ascii_letters, k=n))

    with app_client(tmp_path, max_db_bytes=1_000_000) as client:
        store = client.app.state.store
        assert post(client, batch(run_id="ended", stream="e", n=200, status="finished")).status_code == 200
        for seq in range(1, 41):  # a live run: 40 stalls with a 20 KB stack each
            payload = batch(run_id="live", stream="l", seq=seq, n=10, step0=seq * 10, start_s=1_700_100_000)
            payload["stalls"] = [{"t_ns": (1_700_100_000 + seq) * SECOND, "loader": "train", "wait_s": 11.0,
                                  "started_ns": (1_700_100_000 + seq) * SECOND, "stack": text(20_000)}]
            assert post(client, payload).status_code == 200
        for _ in range(10):  # and 10 tuning results of 60 KB
            doc = dict(TUNING, notes=[text(20_000) for _ in range(3)])
            assert client.post("/api/v1/runs/live/tuning", content=json.dumps(doc),
                               headers={"Content-Type": "application/json"}).status_code == 200
        ids = {r["id"] for r in client.get("/api/v1/runs").json()["runs"]}
        assert ids == {"ended", "live"}  # the other run was not deleted for them
        assert retention.file_bytes(store.path) <= 1_100_000
        tunings, stacks = store.reader().execute(
            "SELECT (SELECT count(*) FROM tunings WHERE run_id = 'live'), (SELECT count(*) FROM events WHERE "
            "run_id = 'live' AND kind = 'stalls' AND json_type(data, '$.stack') = 'text')").fetchone()
        assert tunings >= 1 and stacks >= 20 and (tunings < 10 or stacks < 40)
        stalls = client.get("/api/v1/runs/live/events/stalls?limit=100").json()["events"]
        assert len(stalls) == 40  # every stall kept, the older ones without their stack
        assert client.get("/api/v1/runs/live/tuning").status_code == 200  # the latest result kept
