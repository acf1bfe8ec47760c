"""Workers are per process: a 2-rank run whose ranks run different numbers of DataLoader
workers gets one rank's workers in its run-wide system overview (rank 0's, named), each rank
its own in its per-rank summary, and the run page's workers panel shows one rank's workers
(rank 0's, or the straggler's) and says which, never the latest snapshot of any rank."""
import orjson

from starvewatch.dashboard import callbacks
from starvewatch.monitor.web.wire_models import EventBatch
from starvewatch.monitor.storage.query import Query
from starvewatch.monitor.storage.store import Store
from tests.test_collector_api import SECOND, batch
from tests.test_dashboard_views import _text

START_S = 1_700_000_000
WORKERS = {0: 4, 1: 2}


def snapshots(rank: int, count: int = 5) -> list[dict]:
    """Rank 1's snapshots are each taken 0.5 s after rank 0's: the run's latest is rank 1's."""
    n = WORKERS[rank]
    return [{"loader": "train", "t_ns": (START_S + i) * SECOND + rank * SECOND // 2, "configured_workers": n,
             "alive_workers": n, "queue_depth": 1, "queue_capacity": 2 * n,
             "workers": [{"id": k, "pid": 1000 * (rank + 1) + k, "state": "running", "batches": 10 * i + k,
                          "load_ms_mean": 10.0 * (rank + 1), "cpu_fraction": 0.5} for k in range(n)]}
            for i in range(count)]


def two_rank_store(tmp_path, straggler_wait_ns=0):
    store = Store(tmp_path / "db.sqlite")
    for rank in (0, 1):
        payload = batch(stream=f"host-{rank}-s", rank=rank, n=400,
                        wait_ns=2_000_000 + (straggler_wait_ns if rank == 1 else 0))
        payload["workers"] = snapshots(rank)
        store.ingest(EventBatch.model_validate_json(orjson.dumps(payload)))
    return store, Query(store)


def test_the_run_wide_overview_takes_rank_0s_workers_and_names_the_rank(tmp_path):
    store, query = two_rank_store(tmp_path)
    newest = query.events("run-a", "workers", limit=1, newest=True)[0]
    assert newest["rank"] == 1  # what the run-wide answer used to show
    run_wide = query.summary("run-a")["system"]["loaders"]["train"]
    assert (run_wide["rank"], run_wide["ranks"]) == (0, [0, 1])
    assert run_wide["configured_workers"] == 4 and [w["pid"] for w in run_wide["workers"]] == [1000, 1001, 1002, 1003]
    assert run_wide["alive_workers_min"] == 4 and run_wide["worker_load_ms_mean"] == 10.0
    for rank in (0, 1):
        own = query.summary("run-a", rank)["system"]["loaders"]["train"]
        assert (own["rank"], own["configured_workers"], len(own["workers"])) == (rank, WORKERS[rank], WORKERS[rank])
        assert {w["pid"] // 1000 for w in own["workers"]} == {rank + 1}
    store.close()


def test_the_workers_panel_shows_one_ranks_workers_and_says_which(tmp_path):
    store, query = two_rank_store(tmp_path)
    panel = callbacks.run_view(query, "run-a", None)["workers"]
    text = _text(panel)
    assert "DataLoader workers: train, rank 0" in text and "2 of 2 ranks sent worker snapshots" in text
    assert "now: 4/4 workers alive" in text and "queue 1/8" in text
    load = panel.children[1].children[0].figure
    assert sorted(t.name for t in load.data) == [f"worker {k}" for k in range(4)]
    assert all(len(t.y) == 5 for t in load.data)  # rank 0's five snapshots, none of rank 1's
    store.close()


def test_the_workers_panel_shows_the_stragglers_workers(tmp_path):
    store, query = two_rank_store(tmp_path, straggler_wait_ns=6_000_000)
    assert [s["rank"] for s in query.stragglers("run-a")["stragglers"]] == [1]
    text = _text(callbacks.run_view(query, "run-a", None)["workers"])
    assert "DataLoader workers: train, rank 1 (the straggler)" in text
    assert "now: 2/2 workers alive" in text and "queue 1/4" in text
    store.close()


def test_one_rank_is_not_labelled(tmp_path):
    store = Store(tmp_path / "db.sqlite")
    payload = batch(n=50)
    payload["workers"] = snapshots(0)
    store.ingest(EventBatch.model_validate_json(orjson.dumps(payload)))
    text = _text(callbacks.run_view(Query(store), "run-a", None)["workers"])
    assert "DataLoader workers: train" in text and "now: 4/4 workers alive" in text and "rank" not in text
    store.close()
