"""Dashboard view builders and callback logic as plain functions, on a real store."""
import orjson

from starvewatch.dashboard import callbacks, layout, views
from starvewatch.monitor.models import EventBatch
from starvewatch.monitor.query import Query
from starvewatch.monitor.store import Store
from tests.test_collector_api import batch


def _query(tmp_path, **kwargs):
    store = Store(tmp_path / "db.sqlite")
    store.ingest(EventBatch.model_validate_json(orjson.dumps(batch(**kwargs))))
    return store, Query(store)


def _text(component) -> str:
    """All the text inside a Dash component tree."""
    if component is None:
        return ""
    if isinstance(component, (str, int, float)):
        return str(component)
    if isinstance(component, (list, tuple)):
        return " ".join(_text(c) for c in component)
    return _text(getattr(component, "children", None))


def test_routes_pick_the_page():
    assert _text(callbacks.route("/", "")).startswith("Runs")
    run = callbacks.route("/runs/abc-1", "")
    assert run.children[0].data == "abc-1"
    compare = callbacks.route("/compare", "?a=x&b=y")
    assert compare.children[1].children[0].value == "x" and compare.children[1].children[1].value == "y"


def test_run_view_has_kpis_figures_and_recommendations(tmp_path):
    store, query = _query(tmp_path, n=300, wait_ns=30_000_000, compute_ns=10_000_000)
    view = callbacks.run_view(query, "run-a", None)
    assert view["loader"] == "train" and not view["missing"]
    assert "75.0%" in _text(view["kpis"])  # 30 ms wait in a 40 ms step
    assert len(view["timeline"].data) >= 2 and view["timeline"].layout.uirevision == "run-a:train"
    assert "num_workers=" in _text(view["recommendations"])
    assert callbacks.run_view(query, "nope", None) == {"missing": True}
    store.close()


def test_runs_table_searches_and_sorts():
    runs = [{"id": "a-1", "name": "alpha", "status": "live", "started_at": "2026-01-01T00:00:00Z",
             "duration_s": 5, "verdict": "high", "input_wait_fraction": 0.5, "batches_per_s": 10},
            {"id": "b-1", "name": "beta", "status": "finished", "started_at": "2026-01-02T00:00:00Z",
             "duration_s": 9, "verdict": "not", "input_wait_fraction": 0.01, "batches_per_s": 99}]
    text = _text(views.runs_table(runs, search="alp"))
    assert "alpha" in text and "beta" not in text
    by_wait = _text(views.runs_table(runs, sort="wait"))
    assert by_wait.index("alpha") < by_wait.index("beta")
    by_rate = _text(views.runs_table(runs, sort="throughput"))
    assert by_rate.index("beta") < by_rate.index("alpha")


def test_stall_banner_only_while_stalled():
    summary = {"stalls": [{"loader": "val", "wait_s": 12.5, "step": 3, "ended_ns": None,
                           "workers": [{"id": 0, "state": "zombie"}]}]}
    banner = views.stall_banner(summary, "stalled")
    assert "val has waited 12.5 s" in _text(banner) and "zombie" in _text(banner)
    assert views.stall_banner(summary, "live") is None


def test_compare_panel_shows_verification():
    before = {"loaders": [{"name": "train", "input_wait_fraction": 0.6, "batches_per_s": 10.0,
                           "wait_ms": {"p95": 30.0}, "config": {"num_workers": 0}}],
              "recommendations": [{"loader": "train", "parameter": "num_workers", "suggested": 4,
                                   "expected_speedup": 2.0}], "run": {"id": "a"}}
    after = {"loaders": [{"name": "train", "input_wait_fraction": 0.05, "batches_per_s": 21.0,
                          "wait_ms": {"p95": 2.0}, "config": {"num_workers": 4}}], "run": {"id": "b"}}
    from starvewatch.monitor.diagnosis import verify
    text = _text(views.compare_panel(before, after, verify(before, after)))
    assert "2.10x" in text and "confirmed" in text


def test_layout_polls_every_second():
    root = layout.root_layout()
    interval = next(c for c in root.children if getattr(c, "id", None) == "interval")
    assert interval.interval == 1000  # paused while hidden: tests/test_dashboard_browser.py


def test_workers_panel_shows_each_worker_and_the_queue():
    events = [{"loader": "train", "alive_workers": 1, "configured_workers": 2, "queue_depth": 3, "queue_capacity": 4,
               "workers": [{"id": 0, "pid": 11, "state": "running", "load_ms_mean": 12.5, "cpu_fraction": 0.9,
                            "cpu_pct": 97.0, "batches": 40},
                           {"id": 1, "pid": 12, "state": "gone", "load_ms_mean": None, "cpu_fraction": None,
                            "cpu_pct": None, "batches": 3}]}]
    text = _text(views.workers_panel(events))
    assert "1/2 workers alive" in text and "queue 3/4" in text and "12.50 ms" in text and "gone" in text
    assert "No DataLoader worker data" in _text(views.workers_panel([]))
    assert views.ranks_panel({0: {}}) is None
