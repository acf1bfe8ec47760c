"""The query cache (monitor/storage/query.py `cached`) is a least-recently-used cache bounded by its
number of entries and by an estimate of its size (rows: one `events` answer can hold 50,000
events), on a real SQLite store: many large answers keep it under its size bound, the answers
in use stay, and a 256-rank run page's per-rank summaries all stay cached after one pass."""
import orjson

from starvewatch.dashboard import callbacks
from starvewatch.monitor.web.wire_models import EventBatch
from starvewatch.monitor.storage.query import Query
from starvewatch.monitor.storage.store import Store
from tests.test_collector_api import SECOND, batch

START_S = 1_700_000_000
EVENTS = 6000


def store_with_samples(tmp_path) -> Store:
    store = Store(tmp_path / "db.sqlite")
    payload = batch(n=10)
    payload["samples"] = [{"kind": "host", "t_ns": (START_S + i) * SECOND, "cpu_pct": 10.0 + i % 50}
                          for i in range(EVENTS)]
    store.ingest(EventBatch.model_validate_json(orjson.dumps(payload)))
    return store


def cached_events(query: Query) -> int:
    """The events the cache holds, counted from its entries (not from its own estimate)."""
    return sum(len(entry[2]) for key, entry in query._cache.items() if key[0] == "events")


def test_many_large_events_answers_keep_the_cache_under_its_size_bound(tmp_path):
    store = store_with_samples(tmp_path)
    query = Query(store)
    query.MAX_CACHE_ROWS = 5_000
    in_use = query.events("run-a", "samples", limit=1000)
    assert len(in_use) == 1000
    for i in range(40):  # 40 different answers of 1,000 events each: 40,000 events asked for
        answer = query.events("run-a", "samples", since_ns=(START_S + i) * SECOND, limit=1000)
        assert len(answer) == 1000
        assert query.events("run-a", "samples", limit=1000) is in_use  # used again: kept
        assert cached_events(query) <= 5_000
    assert query.cache_rows <= 5_000
    # The least recently used went first; the latest answer and the one in use are still there.
    assert query.events("run-a", "samples", since_ns=(START_S + 39) * SECOND, limit=1000) is answer
    first = query.events("run-a", "samples", since_ns=START_S * SECOND, limit=1000)
    assert first == query.events("run-a", "samples", since_ns=START_S * SECOND, limit=1000)
    assert sum(1 for key in query._cache if key[0] == "events") >= 3  # evicted one by one, not all at once
    # An answer larger than the whole bound is answered, and not kept.
    everything = query.events("run-a", "samples", limit=50_000)
    assert len(everything) == EVENTS and query.cache_rows <= 5_000
    assert query.events("run-a", "samples", limit=50_000) is not everything
    store.close()


def test_the_size_estimate_counts_rows_and_nested_lists():
    from starvewatch.monitor.storage.query import answer_rows
    events = [{"t_ns": i, "workers": [{"id": k} for k in range(4)]} for i in range(100)]
    assert answer_rows(events) == 1 + 100 + 400
    assert answer_rows({"points": list(range(1000)), "bucket_s": 1}) == 1 + 1000
    assert answer_rows(None) == answer_rows(3) == 1


def test_a_256_rank_run_pages_per_rank_summaries_all_stay_cached(tmp_path):
    store = Store(tmp_path / "db.sqlite")
    for rank in range(256):
        store.ingest(EventBatch.model_validate_json(orjson.dumps(
            batch(stream=f"host{rank // 8}-{rank}-s", rank=rank, n=20))))
    query = Query(store)
    view = callbacks.run_view(query, "run-a", None)
    assert not view["missing"]
    summaries = [key for key in query._cache if key[0] == "summary" and len(key[1]) == 2]
    assert sorted(key[1][1] for key in summaries) == list(range(256))
    assert query.cache_rows <= query.MAX_CACHE_ROWS and len(query._cache) <= query.MAX_CACHE_ENTRIES
    store.close()
