"""Host, GPU and worker samples under the storage budget (monitor/budget/sample_rollups.py): folded in
the steps' tiers into per-bucket aggregates, the summary and its diagnosis stay what they were
(the worker-memory series keeps each worker's first and last reading per bucket); the file keeps to its budget under sample-heavy ingest; a schema-3
database opens, migrates and folds; the rank-summed rollups are coarsened with the per-rank ones.
Budgets of a few MB and a lowered MIN_BUCKETS keep each test to seconds."""
import gzip
import json
import logging
import shutil
from pathlib import Path

import orjson
import pytest

from starvewatch.monitor.budget import retention
from starvewatch.monitor.outputs.export import to_markdown
from starvewatch.monitor.storage.query import Query
from starvewatch.monitor.storage.store_schema import SCHEMA_VERSION
from tests.conftest import wait_until
from tests.sample_payloads import T0_S, sample_batch
from tests.test_collector_api import SECOND, batch, post
from tests.test_storage_budget import app_client
from tests.summary_v1 import as_old

DATA = Path(__file__).parent / "data"


@pytest.fixture
def short_runs_fold(monkeypatch):
    """Hours of simulated samples stand for weeks: 20 buckets per run instead of 1,000."""
    monkeypatch.setattr(retention, "MIN_BUCKETS", 20)


def ingest(client, hours: float, every_s: int, ranks=(0, 1), **kwargs) -> int:
    """Batches of 1,000 simulated seconds per rank; returns how many batches each rank sent."""
    batches = int(hours * 3600 // 1000)
    for i in range(batches):
        for rank in ranks:
            response = post(client, sample_batch(rank, i + 1, T0_S + i * 1000, 1000, every_s, **kwargs))
            assert response.status_code == 200, response.text
    return batches


def fresh_summary(client, path="/api/v1/runs/run-a/summary"):
    return wait_until(lambda: (lambda s: s if "samples_rolled_up" in s else None)(client.get(path).json()),
                      timeout_s=10, what=f"{path} after the fold")


def event_rows(store, where="1"):
    return store.reader().execute(f"SELECT count(*) FROM events WHERE {where}").fetchone()[0]


def test_folding_samples_keeps_the_summary_and_its_diagnosis(
        tmp_path, short_runs_fold, monkeypatch):
    # The minute tier keeps the last hour raw, the 10-minute tier the last two hours at a minute:
    # older samples go through both (a bucket of buckets).
    monkeypatch.setattr(retention, "TIER_KEEP_RECENT_S", {60: 3600, 600: 7200, 3600: 86_400, 86_400: 10**7})
    with app_client(tmp_path) as client:
        store = client.app.state.store
        ingest(client, hours=6, every_s=10)
        before = client.get("/api/v1/runs/run-a/summary").json()
        per_rank = [client.get(f"/api/v1/runs/run-a/summary?rank={r}").json() for r in (0, 1)]
        memory = client.get("/api/v1/runs/run-a/workers/memory").json()
        raw = event_rows(store)
        assert raw == 2 * 21 * 100 * 3  # host, GPU and worker samples
        # What the comparison rests on: a diagnosis that reads the samples.
        system = before["system"]
        assert system["host_samples"] == system["gpu_samples"] == 2 * 2100
        assert system["gpu_util_mean"] is not None and system["cpu_pct_max"] > system["cpu_pct_mean"]
        assert before["recommendations"] and [f["kind"] for f in before["findings"]] == ["worker_memory_growth"]
        assert system["loaders"]["train"]["alive_workers_min"] == 3  # one snapshot in 97 lacks a worker

        store.retention.max_bytes = retention.file_bytes(store.path) // 3
        done = store.retention.enforce_now()
        assert done["samples"] > 0
        spans = dict(store.reader().execute("SELECT span_s, count(*) FROM events GROUP BY span_s").fetchall())
        assert set(spans) == {0, 60, 600} and sum(spans.values()) < raw / 3
        assert retention.file_bytes(store.path) <= store.retention.max_bytes

        after = fresh_summary(client)
        rolled = after.pop("samples_rolled_up")
        assert {r["rank"] for r in rolled} == {0, 1}
        assert sum(r["events"] for r in rolled) == raw - spans[0]  # every sample folded is counted
        assert after == before  # system overview, findings, verdict, recommendations, stragglers
        for r in (0, 1):
            answer = fresh_summary(client, f"/api/v1/runs/run-a/summary?rank={r}")
            assert [x["rank"] for x in answer.pop("samples_rolled_up")] == [r]
            assert answer == per_rank[r]
        # Every sample before the 10-minute tier's recent span into 10-minute buckets: the same again.
        with store._write_lock:
            while store.retention.fold_samples("run-a", 600):
                pass
        again = json.loads(json.dumps(Query(store).summary("run-a")))  # a new Query: no cached answer
        again.pop("samples_rolled_up")
        assert again == before
        assert event_rows(store, "kind = 'workers' AND span_s = 600") > 0
        # The memory series keeps each worker's first and last reading per bucket: the same
        # workers, readings that were sent, each worker's first and last, fewer in folded spans.
        thinned = client.get("/api/v1/runs/run-a/workers/memory").json()["series"]
        assert [(e["rank"], e["worker"], e["pid"]) for e in thinned] == [
            (e["rank"], e["worker"], e["pid"]) for e in memory["series"]]
        for kept, sent in zip(thinned, memory["series"]):
            readings = lambda e: list(zip(e["t"], e["uss_bytes"], e["pss_bytes"], e["samples"]))  # noqa: E731
            assert set(readings(kept)) < set(readings(sent))
            assert readings(kept)[0] == readings(sent)[0] and readings(kept)[-1] == readings(sent)[-1]
            assert len(kept["t"]) < len(sent["t"])

        # The API's samples say which are buckets: a host bucket's means lie within its extremes.
        events = client.get("/api/v1/runs/run-a/events/samples?limit=50000").json()["events"]
        buckets = [e for e in events if "bucket" in e]
        assert {e["bucket"]["span_s"] for e in buckets} == {60, 600}
        assert sum(e["bucket"]["events"] if "bucket" in e else 1 for e in events) == 2 * 2 * 2100
        for e in buckets:
            if e["kind"] == "host":
                weight, total, low, high = e["bucket"]["agg"]["cpu_pct"]
                assert low <= e["cpu_pct"] <= high and e["cpu_pct"] == pytest.approx(total / weight)
        markdown = to_markdown(after | {"samples_rolled_up": rolled})
        assert "Rolled-up spans" in markdown and f"{rolled[0]['events']} samples before" in markdown


def test_the_file_stays_within_its_budget_under_sample_heavy_ingest(tmp_path, short_runs_fold, caplog):
    """The tiers' recent spans (an hour raw, a day per minute) alone would pass this budget:
    the live run's samples are folded whole before any run would be deleted, and it says so."""
    budget = 4_000_000
    sizes = []
    with caplog.at_level(logging.WARNING, logger="starvewatch.retention"), \
            app_client(tmp_path, max_db_bytes=budget) as client:
        store = client.app.state.store
        sent = sample_bytes = 0
        for i in range(60):  # 60,000 simulated seconds per rank, a sample of each kind every 20 s
            for rank in (0, 1):
                # 64 cores: each host sample carries 64 per-core figures (~1.5 KB)
                payload = sample_batch(rank, i + 1, T0_S + i * 1000, 1000, 20, cores=64)
                assert post(client, payload).status_code == 200
                sent += len(payload["workers"])
                sample_bytes += len(orjson.dumps(payload["samples"])) + len(orjson.dumps(payload["workers"]))
                sizes.append(retention.file_bytes(store.path))
        assert store.retention.folds > 0 and event_rows(store, "span_s > 0") > 0
        summary = client.get("/api/v1/runs/run-a/summary").json()
    assert max(sizes) <= budget * 1.10, max(sizes)
    assert sample_bytes > 2.5 * budget  # the samples alone, as sent, pass the budget 2.5 times over
    assert summary["system"]["host_samples"] == summary["system"]["gpu_samples"] == sent
    assert summary["loaders"][0]["steps"] == sent
    assert sum(r["events"] for r in summary["samples_rolled_up"]) > sent
    logged = [r.getMessage() for r in caplog.records if r.name == "starvewatch.retention"]
    assert any("run-a" in line and "recent host, GPU and worker samples folded" in line for line in logged)


def test_a_schema_3_database_opens_migrates_and_folds_its_samples(tmp_path, short_runs_fold):
    with gzip.open(DATA / "main-schema-v3.db.gz") as packed, open(tmp_path / "starvewatch.db", "wb") as out:
        shutil.copyfileobj(packed, out)
    # Written as summary/1 by that collector: compared field by field as this version reads it.
    old_summary = json.loads((DATA / "main-schema-v3.summary.json").read_text())["summary"]
    with app_client(tmp_path) as client:
        store = client.app.state.store
        w = store._writer
        assert w.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
        assert "span_s" in {r[1] for r in w.execute("PRAGMA table_info(events)")}
        assert {"wait_min_ns", "compute_min_ns", "compute_max_ns"} <= {r[1] for r in w.execute("PRAGMA table_info(rollups)")}
        assert event_rows(store, "span_s = 0") == event_rows(store) == 2160
        before = client.get("/api/v1/runs/old-run/summary").json()
        # What the old code measured from this data, the migrated file still gives; the advice
        # (recommendations, plans) is the current model's over the same figures.
        advice = ("recommendations", "plans")
        measured, expected = as_old(before, old_summary)
        assert {k: v for k, v in measured.items() if k not in advice} == \
            {k: v for k, v in expected.items() if k not in advice}
        assert [r["parameter"] for r in before["recommendations"]] == \
            [r["parameter"] for r in expected["recommendations"]]
        with store._write_lock:
            while store.retention.fold_samples("old-run", 60):
                pass
        # Two hours of samples every 30 s as minute buckets, the last hour raw: 2,160 rows -> about 1,440.
        assert event_rows(store, "span_s = 60") > 0 and event_rows(store) < 2160 * 0.7
        after = fresh_summary(client, "/api/v1/runs/old-run/summary")
        last_sample_s = T0_S + 3 * 3600 - 30
        # Buckets on minute boundaries, all before the last hour (it stays raw).
        assert after.pop("samples_rolled_up")[0]["until_s"] == (last_sample_s - 3600) // 60 * 60
        assert after == before
        # It takes new samples beside the folded ones.
        assert post(client, sample_batch(0, 1, T0_S + 20_000, 100, 10, run_id="new-run",
                                                 stream="new-0-s")).status_code == 200
        new = client.get("/api/v1/runs/new-run/summary").json()
        assert new.get("system", {}).get("host_samples") == 10, new


def test_rank_summed_rollups_are_coarsened_with_the_per_rank_tiers_and_stay_bounded(tmp_path):
    """A run that is folded: `run_rollups` follows the per-rank tiers row for row (same buckets,
    same span_s), holds one row per loader and bucket whatever the ranks, and the run stays
    drawable in at least 1,000 buckets. A run that is never folded keeps per-second rows, which
    the budget bounds (they are counted in the file, and summed over ranks: fewer than the
    per-rank rows they come from)."""
    with app_client(tmp_path) as client:
        store = client.app.state.store
        for i in range(15):  # 75,000 s at one step per second on each of 4 ranks
            for rank in range(4):
                assert post(client, batch(stream=f"h{rank}", rank=rank, seq=i + 1, n=5000, step0=i * 5000,
                                          every_ns=SECOND, wait_ns=1_000_000 + rank * 500_000)).status_code == 200
        db = store.reader()
        before = client.get("/api/v1/runs/run-a/series?points=1000").json()
        assert db.execute("SELECT count(*) FROM run_rollups").fetchone()[0] == 75_000
        store.retention.max_bytes = retention.file_bytes(store.path) // 6  # past the raw rows: tiers too
        store.retention.raw_window_steps = 4000
        store.retention.enforce_now()
        per_rank = db.execute("SELECT loader, second, max(span_s), min(span_s) FROM rollups "
                              "GROUP BY loader, second ORDER BY loader, second").fetchall()
        summed = db.execute("SELECT loader, second, span_s, span_s FROM run_rollups ORDER BY loader, second").fetchall()
        assert [tuple(r) for r in summed] == [tuple(r) for r in per_rank]  # the same buckets, the same tiers
        widths = {r[2] for r in summed}
        assert widths == {1, 60}  # the last hour per second, the rest per minute
        # Bounded: the minute buckets plus the hour kept per second.
        assert 1000 <= len(summed) <= 75_000 // 60 + retention.TIER_KEEP_RECENT_S[60] + 2
        # A chart of 1,000 points: its bucket width is rounded up to whole seconds from the first
        # bucket's start (a minute boundary after the fold): ask for a few more to draw 1,000.
        after = client.get("/api/v1/runs/run-a/series?points=1020").json()
    assert len(after["points"]) >= 1000
    assert sum(p["steps"] for p in after["points"]) == sum(p["steps"] for p in before["points"]) == 300_000
    assert len(before["points"]) == 1000
    assert max(p["wait_ms_max"] for p in after["points"]) == max(p["wait_ms_max"] for p in before["points"])
