"""Collector API through TestClient: statuses, multi-rank, series downsampling, metrics."""
import gzip

import orjson
import pytest
from fastapi.testclient import TestClient

from starvewatch.monitor.web.app import create_app
from starvewatch.monitor.web.collector_settings import CollectorSettings
from tests.conftest import wait_until

SECOND = 1_000_000_000


def batch(run_id="run-a", stream="s0", seq=1, rank=0, n=100, start_s=1_700_000_000, step0=0,
          status="live", epoch=0, wait_ns=2_000_000, compute_ns=8_000_000, every_ns=10_000_000):
    return {
        "schema": "starvewatch.events/1", "run_id": run_id, "rank": rank, "stream": stream, "seq": seq,
        "status": status,
        "run": {"id": run_id, "name": "api-test", "started_at": start_s, "rank": rank, "world_size": 2},
        "loaders": [{"name": "train", "config": {"num_workers": 0}, "totals": {
            "steps": step0 + n, "epochs": epoch + 1, "wait_ns": (step0 + n) * wait_ns,
            "compute_ns": (step0 + n) * compute_ns, "samples": (step0 + n) * 32}}],
        "steps": {"loader": ["train"] * n, "epoch": [epoch] * n, "step": list(range(step0, step0 + n)),
                  "start_ns": [start_s * SECOND + (step0 + i) * every_ns for i in range(n)],
                  "wait_ns": [wait_ns] * n, "compute_ns": [compute_ns] * n, "other_ns": [0] * n,
                  "batch_size": [32] * n, "gpu_idle_ns": [None] * n},
    }


@pytest.fixture
def client(tmp_path):
    settings = CollectorSettings(dir=tmp_path, lost_after_s=0.3, dashboard=False, spool_scan_s=60)
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as c:
        yield c


def post(client, payload, gz=False):
    body = orjson.dumps(payload)
    headers = {"Content-Type": "application/json"}
    if gz:
        body, headers["Content-Encoding"] = gzip.compress(body), "gzip"
    return client.post("/api/v1/ingest", content=body, headers=headers)


def test_live_run_without_heartbeats_becomes_lost(client):
    assert post(client, batch()).status_code == 200
    assert client.get("/api/v1/runs").json()["runs"][0]["status"] == "live"
    wait_until(lambda: client.get("/api/v1/runs").json()["runs"][0]["status"] == "lost", timeout_s=10,
               what="the run to be reported lost")
    assert client.get("/api/v1/runs?status=lost").json()["runs"][0]["id"] == "run-a"
    assert client.get("/api/v1/runs?status=live").json()["runs"] == []
    assert client.get("/api/v1/runs?status=bogus").status_code == 422


def test_ranks_of_one_job_land_in_one_run(client):
    for rank in (0, 1):
        assert post(client, batch(stream=f"s{rank}", rank=rank, status="finished"), gz=True).status_code == 200
    summary = client.get("/api/v1/runs/run-a/summary").json()
    loader = summary["loaders"][0]
    assert loader["steps"] == 200 and loader["ranks"] == [0, 1] and loader["epochs"] == 1
    assert loader["input_wait_fraction"] == pytest.approx(0.2)
    assert summary["run"]["status"] == "finished"
    rank1 = client.get("/api/v1/runs/run-a/summary?rank=1").json()
    assert rank1["loaders"][0]["steps"] == 100
    detail = client.get("/api/v1/runs/run-a").json()
    assert sorted(r["rank"] for r in detail["ranks"]) == [0, 1]
    runs = client.get("/api/v1/runs").json()["runs"]
    assert runs[0]["ranks"] == 2


def test_series_are_downsampled_on_the_server(client):
    seq = 0
    for step0 in range(0, 5000, 1000):
        seq += 1
        assert post(client, batch(seq=seq, n=1000, step0=step0, every_ns=20_000_000)).status_code == 200
    series = client.get("/api/v1/runs/run-a/series?points=10").json()
    assert 0 < len(series["points"]) <= 10
    assert sum(p["steps"] for p in series["points"]) == 5000
    assert all(p["input_wait_fraction"] == pytest.approx(0.2) for p in series["points"])
    steps = client.get("/api/v1/runs/run-a/steps/series?loader=train&points=100").json()
    assert 0 < len(steps["points"]) <= 100
    assert sum(p["count"] for p in steps["points"]) == 5000
    for p in steps["points"]:
        low, mean, high = p["wait_ms"]
        assert low <= mean <= high
    assert client.get("/api/v1/runs/run-a/series?points=0").status_code == 422


def test_replayed_batches_are_ignored_and_totals_take_the_latest(client):
    first = batch(seq=1, n=50)
    second = batch(seq=2, n=50, step0=50)
    assert post(client, second).json()["stored"] is True
    assert post(client, first).json()["stored"] is True  # out of order: still stored once
    assert post(client, first).json()["duplicate"] is True
    loader = client.get("/api/v1/runs/run-a/summary").json()["loaders"][0]
    assert loader["steps"] == 100  # the totals of seq 2, not the older seq 1
    page = client.get("/api/v1/runs/run-a/steps?limit=1000").json()
    assert len(page["steps"]) == 100


def test_metrics_are_bounded_to_live_and_recent_runs(client):
    post(client, batch(run_id="live-run"))
    text = client.get("/metrics").text
    assert 'starvewatch_input_wait_fraction{loader="train",name="api-test",run="live-run"} 0.2' in text
    assert 'starvewatch_run_live{name="api-test",run="live-run",status="live"} 1.0' in text


def test_cores_are_divided_by_the_ranks_on_each_host_not_by_the_world(client):
    """8 ranks on 2 hosts of 16 cores (4 per host): CPU-bound workers are capped at 16 / 4."""
    for rank in range(8):
        payload = batch(stream=f"s{rank}", rank=rank, status="finished", wait_ns=30_000_000, compute_ns=5_000_000)
        payload["run"].update(host=f"node{rank // 4}", world_size=8)
        payload["loaders"][0]["config"] = {"num_workers": 1, "batch_size": 32, "persistent_workers": True,
                                           "prefetch_factor": 2}
        payload["samples"] = [{"kind": "host", "t_ns": 1, "cpu_count": 16, "cpu_pct": 50.0}]
        payload["workers"] = [{"loader": "train", "t_ns": 1, "configured_workers": 1, "workers": [
            {"id": 0, "pid": 100 + rank, "load_ms_mean": 35.0, "cpu_fraction": 0.95}]}]
        assert post(client, payload).status_code == 200
    summary = client.get("/api/v1/runs/run-a/summary").json()
    top = summary["recommendations"][0]
    assert (top["parameter"], top["suggested"]) == ("num_workers", 4)  # ceil(35 / 5 x 1.2) = 9, 4 cores
    assert top["evidence"]["cores"] == 4 and top["evidence"]["ranks_per_host"] == 4
    assert summary["loaders"][0]["ranks"] == list(range(8))


def test_every_loader_totals_field_survives_the_wire_and_a_rank_merge(client):
    """Each field of LoaderTotals (the one list: starvewatch/stats.py), with a value of its own
    on each rank, arrives through the ingest route (the wire model) and comes out of the
    collector's rank merge as the sum (a flag: true only where both ranks say so; epochs: the
    ranks run the same ones). A field added to the dataclass is sent and checked here too."""
    from dataclasses import fields

    from starvewatch.stats import LoaderTotals
    names = [f.name for f in fields(LoaderTotals)]
    sent = []
    for rank in (0, 1):
        # A per-worker list (issue 38) has as many counts as the rank has workers: 1 and 2.
        totals = {name: (rank == 0) if isinstance(f.default, bool)
                  else [1000 * (rank + 1) + i] * (rank + 1) if f.default_factory is list
                  else 1000 * (rank + 1) + i
                  for i, (name, f) in enumerate(LoaderTotals.__dataclass_fields__.items())}
        payload = batch(stream=f"s{rank}", rank=rank, n=1, status="finished")
        payload["loaders"][0]["totals"] = totals
        assert post(client, payload).status_code == 200
        sent.append(totals)
    merged = {d.name: d for d in client.app.state.store.loader_data("run-a")}["train"].totals.to_dict()
    assert sorted(merged) == sorted(names)
    for name in names:
        a, b = sent[0][name], sent[1][name]
        want = (a and b) if isinstance(a, bool) else max(a, b) if name == "epochs" else \
            [a[0] + b[0], b[1]] if isinstance(a, list) else a + b
        assert merged[name] == want, (name, merged[name], want)
