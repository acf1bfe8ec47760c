"""Dashboard view builders and callback logic as plain functions, on a real store."""
import orjson

from starvewatch.dashboard import answer_card, callbacks, layout, views
from starvewatch import quantities
from starvewatch.monitor.outputs import figures
from starvewatch.monitor.web.wire_models import EventBatch
from starvewatch.monitor.storage.query import Query
from starvewatch.monitor.storage.store import Store
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
    pickers = compare.children[2].children
    assert pickers[0].id == "compare-a" and pickers[0].value == "x" and pickers[1].value == "y"
    assert callbacks.compare_search("r 1", None) == "?a=r+1" and callbacks.compare_search(None, None) == ""
    # The options' fingerprint goes with the page: the poll sends them again only when they change.
    runs = [{"id": "r-1", "name": "r"}]
    version = callbacks.route("/compare", "?a=r-1", runs).children[-1].data
    assert version == callbacks.options_version(callbacks.run_options(runs, "r-1", None))
    assert version != callbacks.options_version(callbacks.run_options(runs + [{"id": "s", "name": "s"}], "r-1", None))


def test_run_view_has_kpis_figures_and_recommendations(tmp_path):
    store, query = _query(tmp_path, n=300, wait_ns=30_000_000, compute_ns=10_000_000)
    view = callbacks.run_view(query, "run-a", None)
    assert view["loader"] == "train" and not view["missing"]
    assert "75.0%" in _text(view["kpis"])  # 30 ms wait in a 40 ms step
    assert len(view["timeline"].data) >= 2 and view["timeline"].layout.uirevision == "run-a:train"
    assert "num_workers=" in _text(view["recommendations"])
    assert callbacks.run_view(query, "nope", None) == {"missing": True}
    store.close()


def test_an_unchanged_run_is_not_redrawn_and_new_steps_are(tmp_path, monkeypatch):
    monkeypatch.setattr("starvewatch.monitor.storage.query.MAX_STALENESS_S", 0.0)  # new steps show at once
    store, query = _query(tmp_path, n=300, wait_ns=30_000_000, compute_ns=10_000_000)
    first = callbacks.refresh_run_outputs(query, "run-a", None, None)
    assert len(first) == len(callbacks.OUTPUTS) + 1 and isinstance(first[-1], str)
    assert "num_workers=" in _text(first[callbacks.OUTPUTS.index("recommendations")])
    # The next tick finds the same view: nothing goes to the browser, so nothing is redrawn.
    again = callbacks.refresh_run_outputs(query, "run-a", None, first[-1])
    assert all(o is callbacks.no_update for o in again)
    # New steps arrive: the page is drawn again, under a new digest.
    store.ingest(EventBatch.model_validate_json(orjson.dumps(
        batch(seq=2, step0=300, n=100, wait_ns=30_000_000, compute_ns=10_000_000))))
    later = callbacks.refresh_run_outputs(query, "run-a", None, first[-1])
    assert isinstance(later[-1], str) and later[-1] != first[-1]
    assert later[callbacks.OUTPUTS.index("timeline")] is not callbacks.no_update
    # Another loader choice is another view, even with no new data.
    assert callbacks.refresh_run_outputs(query, "run-a", "train", later[-1])[-1] is callbacks.no_update
    assert callbacks.refresh_run_outputs(query, "nope", None, later[-1])[0] is not callbacks.no_update
    store.close()


def test_runs_view_searches_and_sorts():
    runs = [{"id": "a-1", "name": "alpha", "status": "live", "started_at": "2026-01-01T00:00:00Z",
             "duration_s": 5, "verdict": "high", "input_wait_fraction": 0.5, "batches_per_s": 10},
            {"id": "b-1", "name": "beta", "status": "finished", "started_at": "2026-01-02T00:00:00Z",
             "duration_s": 9, "verdict": "not", "input_wait_fraction": 0.01, "batches_per_s": 99}]
    text = _text(views.runs_view(runs, search="alp")["table"])
    assert "alpha" in text and "beta" not in text
    by_wait = _text(views.runs_view(runs, sort="wait")["table"])
    assert by_wait.index("alpha") < by_wait.index("beta")
    by_rate = _text(views.runs_view(runs, sort="throughput")["table"])
    assert by_rate.index("beta") < by_rate.index("alpha")


def test_stall_banner_only_while_stalled():
    summary = {"stalls": [{"loader": "val", "wait_s": 12.5, "step": 3, "ended_ns": None,
                           "workers": [{"id": 0, "state": "zombie"}]}]}
    banner = views.stall_banner(summary, "stalled")
    assert "val has waited 12.5 s" in _text(banner) and "zombie" in _text(banner)
    assert views.stall_banner(summary, "live") is None


def test_compare_view_shows_verification():
    before = {"loaders": [{"name": "train", "input_wait_fraction": 0.6, "batches_per_s": 10.0,
                           "wait_ms": {"p95": 30.0}, "config": {"num_workers": 0}}],
              "recommendations": [{"loader": "train", "parameter": "num_workers", "suggested": 4,
                                   "expected_speedup": 2.0}], "run": {"id": "a"}}
    after = {"loaders": [{"name": "train", "input_wait_fraction": 0.05, "batches_per_s": 21.0,
                          "wait_ms": {"p95": 2.0}, "config": {"num_workers": 4}}], "run": {"id": "b"}}
    from starvewatch.analysis.compare import comparison
    text = _text(views.compare_view(comparison(before, after)))
    assert "measured 2.10x" in text and "predicted 2.00x" in text and "confirmed" in text
    assert "-93.3% (0.0667x)" in text  # wait p95 30 ms -> 2 ms: a readable change, not "0.07x"


def test_layout_polls_every_second():
    root = layout.root_layout()
    interval = next(c for c in root.children if getattr(c, "id", None) == "interval")
    assert interval.interval == 1000  # paused while hidden: tests/test_dashboard_browser.py


def test_workers_panel_shows_each_worker_over_time_and_the_queue():
    events = [{"loader": "train", "t_ns": t * 10**9, "alive_workers": 1, "configured_workers": 2, "queue_depth": 3,
               "queue_capacity": 4,
               "workers": [{"id": 0, "pid": 11, "state": "running", "load_ms_mean": 12.5, "load_ms_interval": 10.0 + t % 10,
                            "cpu_fraction": 0.9, "cpu_pct": 97.0, "batches": 40, "rss_bytes": (100 + t % 10) * 2**20},
                           {"id": 1, "pid": 12, "state": "gone", "load_ms_mean": None, "cpu_fraction": None,
                            "cpu_pct": None, "batches": 3, "rss_bytes": None}]}
              for t in range(1_700_000_000, 1_700_000_003)]
    panel = views.workers_panel(events, "train")
    text = _text(panel)
    assert "1/2 workers alive" in text and "queue 3/4" in text and "12.50 ms" in text and "gone" in text
    assert "102.0 MiB" in text  # the latest RSS
    load, memory = [g.figure for g in panel.children[1].children]
    assert [t.name for t in load.data] == ["worker 0"] and list(load.data[0].y) == [10.0, 11.0, 12.0]
    assert "RSS" in memory.layout.title.text and list(memory.data[0].y) == [100.0, 101.0, 102.0]
    assert views.workers_panel([]) is None  # no workers: no panel
    assert views.ranks_panel({0: {}}) is None


def _summary(recs=(), **extra):
    return {"run": {"id": "r-1", "name": "r", "status": "finished"},
            "verdict": {"input_bound": "high", "input_wait_fraction": 0.674, "limiting_factor": "input_bound_cpu",
                        "speedup_at_stake": 3.07},
            "loaders": [{"name": "train", "config": {"num_workers": 0, "batch_size": 16, "pin_memory": False}}],
            "stalls": [], "recommendations": list(recs), **extra}


SPEEDUP = {"loader": "train", "parameter": "num_workers", "current": 0, "suggested": 3, "reason": "too few workers",
           "expected_speedup": 2.35, "evidence": {"input_wait_fraction": 0.674, "cpu_bound_loading": True,
                                                  "compute_ms_mean": 12.9, "load_ms_per_batch": 26.71,
                                                  "usable_cores": 2, "workers_needed": 3, "wait_cpu_fraction": None}}
PROTECTIVE = {"loader": "train", "parameter": "pin_memory", "current": False, "suggested": True, "kind": "protective",
              "risk": "pinned copies fail when the GPU is out of memory", "reason": "because", "expected_speedup": None,
              "evidence": {"shm_used_max_bytes": 3 * 2**30, "shm_total_bytes": 4 * 2**30}}


def test_evidence_reads_as_named_quantities_with_units():
    rows = quantities.rows(SPEEDUP["evidence"])
    assert rows[:4] == [("load per batch", "26.7 ms"), ("compute per batch", "12.9 ms"), ("cores", "2"),
                        ("workers needed", "3")]
    assert ("input wait", "67.4%") in rows and ("loading is CPU-bound", "yes") in rows
    assert all(label != "CPU busy while waiting" for label, _ in rows)  # unknown (None): left out
    assert quantities.value("shm_used_max_bytes", 3 * 2**30) == "3.0 GiB"
    assert quantities.value("detail", {"uss_growth_bytes": 2**20, "workers": [0, 2]}) == "uss growth 1.0 MiB, workers 0, 2"


def test_answer_first_verdict_change_line_and_evidence():
    summary = _summary([SPEEDUP, PROTECTIVE])
    card = answer_card.answer(summary)
    text = _text(card)
    assert text.startswith("Input-bound: the loop waited for data 67.4% of its wall time; up to 3.07x faster if the "
                           "loop never waited for data (the limit: loading is CPU work (decoding, transforms)).")
    assert "num_workers: 0 → 3" in text and "expected 2.35x faster" in text
    # The line to copy carries every change for the loader; the risk is explained in its own place.
    assert "DataLoader(dataset, batch_size=16, num_workers=3, pin_memory=True)" in text
    assert "pinned copies fail" not in text
    protective = _text(answer_card.protective_card(summary))
    assert "pinned copies fail" in protective and "3.0 GiB" in protective
    assert answer_card.protective_card(_summary([SPEEDUP])) is None
    assert "not waiting for data" in _text(answer_card.answer({**_summary(), "verdict": {
        "input_bound": "not", "input_wait_fraction": 0.01}}))
    moderate = {"input_bound": "moderate", "input_wait_fraction": 0.15}
    assert "See the protective" not in _text(answer_card.answer({**_summary(), "verdict": moderate}))
    assert "See the protective" in _text(answer_card.answer({**_summary([PROTECTIVE]), "verdict": moderate}))


def test_each_loader_with_changes_gets_its_own_line_to_copy():
    summary = _summary([SPEEDUP, {**SPEEDUP, "loader": "val", "suggested": 2, "expected_speedup": 1.5}])
    summary["loaders"].append({"name": "val", "config": {"num_workers": 0, "batch_size": 64}})
    text = _text(answer_card.answer(summary))
    assert "DataLoader(dataset, batch_size=16, num_workers=3)" in text
    assert "val loader: DataLoader(dataset, batch_size=64, num_workers=2)" in " ".join(text.split())


def test_recommendations_without_kind_are_speedups():
    old = {k: v for k, v in SPEEDUP.items()}
    assert answer_card.speedups(_summary([old])) == [old] and answer_card.protective(_summary([old])) == []


def test_config_table_highlights_what_the_recommendations_change():
    summary = _summary([SPEEDUP, {**PROTECTIVE, "parameter": "prefetch_factor", "current": None, "suggested": 4}])
    rows = answer_card.config_table(summary).children[1].children[1].children
    changed = {_text(r.children[0]): " ".join(_text(r.children[1:]).split()) for r in rows
               if r.className == "sw-changed"}
    assert set(changed) == {"num_workers", "prefetch_factor"}
    assert "→ 3" in changed["num_workers"] and "2.35x" in changed["num_workers"]
    assert "(default)" in changed["prefetch_factor"] and "protective" in changed["prefetch_factor"]


def test_findings_render_the_contract_fields_and_nothing_when_absent():
    assert answer_card.findings_card(_summary()) is None
    stall = {"loader": "train", "wait_s": 31.5, "step": 7, "ended_ns": None, "worker": 2, "worker_pid": 4242,
             "worker_state": "disk-sleep", "phase": "next", "indices": [14, 15],
             "stack": 'Thread 0x1 (most recent call first):\n  File "data.py", line 9 in __getitem__'}
    finding = {"kind": "worker_memory_growth", "loader": "train", "severity": "critical",
               "title": "Worker memory grows 80 MiB per epoch.", "detail": {"growth_bytes_per_epoch": 80 * 2**20},
               "fix": "store the list as a numpy array"}
    text = _text(answer_card.findings_card(_summary(stalls=[stall], findings=[finding])))
    assert "waiting 31.5 s for batch 7 (worker 2, pid 4242, state disk-sleep, fetching the next batch)" in text
    assert "dataset indices of that batch: 14, 15" in text and 'File "data.py", line 9' in text
    assert "Worker memory grows 80 MiB per epoch." in text and "numpy array" in text
    assert "growth per epoch 80.0 MiB" in text


def test_no_raw_json_on_the_run_page(tmp_path):
    store, query = _query(tmp_path, n=300, wait_ns=30_000_000, compute_ns=10_000_000)
    view = callbacks.run_view(query, "run-a", None)
    text = _text([view[k] for k in ("title", "recommendations", "advice", "kpis", "config")])
    assert "{" not in text and '":' not in text and "load per batch" in text
    store.close()


def test_histogram_clips_outliers_and_counts_them():
    pairs = [(5.0 + i % 3, 10) for i in range(30)] + [(2_000.0, 2)]
    fig = figures.clipped_histogram(pairs, "wait")
    meta = fig.layout.meta
    assert meta["overflow"] == 2 and meta["max"] == 2_000.0 and meta["clip"] < 25
    assert sum(fig.data[0].y) == 300 and list(fig.data[1].y) == [2]
    assert fig.layout.xaxis.range[1] < 30
    tight = figures.clipped_histogram([(5.0, 10), (9.0, 3)], "wait")
    assert len(tight.data) == 1 and tight.layout.meta["overflow"] == 0 and tight.layout.meta["clip"] == 9.0
    assert len(figures.clipped_histogram([], "wait").data) == 0


def test_compare_pickers_keep_runs_from_the_url_and_run_links_to_previous(tmp_path):
    runs = [{"id": "r-1", "name": "r"}, {"id": "x", "name": "other"}]
    options = callbacks.run_options(runs, "r-1", "gone")
    assert options == [{"label": "r-1", "value": "r-1"}, {"label": "other — x", "value": "x"},
                       {"label": "gone (unknown)", "value": "gone"}]
    store = Store(tmp_path / "db.sqlite")
    for run_id, start in (("run-a", 1_700_000_000), ("run-b", 1_700_000_100), ("run-c", 1_700_000_200)):
        store.ingest(EventBatch.model_validate_json(orjson.dumps(batch(run_id=run_id, stream=run_id, start_s=start))))
    query = Query(store)
    assert query.previous_run_id("run-c") == "run-b" and query.previous_run_id("run-a") is None
    title = callbacks.run_view(query, "run-c", None)["title"]
    link = title[1].children[2]
    assert link.id == "compare-previous" and link.href == "/compare?a=run-b&b=run-c"
    assert "no earlier run" in _text(callbacks.run_view(query, "run-a", None)["title"])
    store.close()


def test_the_run_page_shows_the_latest_workers_and_host_samples_of_a_long_run(tmp_path):
    """More snapshots than the page reads (2,000 workers, 5,000 samples): the page shows the
    last of them, what the workers and host do now, not the run's first half hour."""
    store, query = _query(tmp_path)
    start_s = 1_700_000_000
    payload = batch(seq=2, step0=100, n=1)
    payload["workers"] = [{"loader": "train", "t_ns": (start_s + i) * 10**9, "configured_workers": 2,
                           "alive_workers": 1 if i == 2499 else 2, "queue_depth": 0, "queue_capacity": 4,
                           "workers": [{"id": 0, "pid": 11, "state": "running", "batches": i}]}
                          for i in range(2500)]
    payload["samples"] = [{"kind": "host", "t_ns": (start_s + i) * 10**9, "cpu_pct": 99.0 if i == 5999 else 10.0}
                          for i in range(6000)]
    store.ingest(EventBatch.model_validate_json(orjson.dumps(payload)))
    view = callbacks.run_view(query, "run-a", None)
    assert "now: 1/2 workers alive" in _text(view["workers"])
    cpu = next(t for t in view["system"].data if t.name == "CPU %")
    assert len(cpu.y) == 5000 and cpu.y[-1] == 99.0  # the newest 5,000, oldest first
    assert [e["t_ns"] for e in query.events("run-a", "samples", limit=3)] == \
        [(start_s + i) * 10**9 for i in range(3)]  # the API's default: from the start
    assert [e["t_ns"] for e in query.events("run-a", "samples", limit=3, newest=True)] == \
        [(start_s + i) * 10**9 for i in range(5997, 6000)]


def test_throughput_is_a_rate_over_a_window_not_a_bucket_count():
    """A job at 1.5 batches/s fills 1 s buckets with 1, 2, 1, 2...: the charts draw the rate over
    5 s, never the saw-tooth."""
    from starvewatch.monitor.outputs import figures
    series = {"bucket_s": 1, "points": [{"t_s": 1000 + i, "t": "", "steps": 1 + i % 2, "batches_per_s": 1 + i % 2}
                                        for i in range(40)]}
    middles, rates, window = figures.windowed_rate(series)
    assert window == 5 and len(rates) == 40 and middles[0] == 1000.5
    assert all(1.3 <= r <= 1.7 for r in rates), rates
    assert abs(sum(rates[5:-5]) / len(rates[5:-5]) - 1.5) < 0.05
    fig = figures.throughput_over_time(series)
    assert list(fig.data[0].y) == rates and fig.data[0].name == "batches/s (5 s window)"
    # A run longer than the page's points: buckets of 8 s, a window of 5 buckets.
    long = {"bucket_s": 8, "points": [{"t_s": 8 * i, "steps": 80} for i in range(20)]}
    assert figures.windowed_rate(long)[2] == 40 and set(figures.windowed_rate(long)[1]) == {10.0}


def test_log_axis_ticks_read_as_numbers():
    from starvewatch.monitor.outputs.figures import log_ticks
    assert log_ticks(0.8, 230) == ([1, 2, 5, 10, 20, 50, 100, 200], ["1", "2", "5", "10", "20", "50", "100", "200"])
    assert log_ticks(0.15, 3)[1] == ["0.2", "0.5", "1", "2"]
    assert log_ticks(0.01, 5000)[1] == ["0.01", "0.1", "1", "10", "100", "1,000"]  # many decades: powers of ten


def test_a_finished_runs_workers_show_no_now():
    events = [{"loader": "train", "t_ns": 10**18, "configured_workers": 1, "alive_workers": 0, "queue_depth": None,
               "queue_capacity": 2, "workers": [{"id": 0, "pid": 11, "state": "gone", "load_ms_mean": 12.5,
                                                 "batches": 40}]}]
    live = _text(views.workers_panel(events, "train"))
    assert "now: 0/1 workers alive" in live
    finished = _text(views.workers_panel(events, "train", live=False))
    assert "now:" not in finished and "alive" not in finished and "gone" not in finished
    assert "1 workers, as last seen" in finished and "12.50 ms" in finished


def test_compare_colours_better_and_worse():
    def row(metric, kind, **change):
        return {"metric": metric, "kind": kind, "change_pct": None, "change_points": None, **change}
    assert views.direction(row("batches/s", "rate", change_pct=40.0)) == "better"
    assert views.direction(row("batches/s", "rate", change_pct=-29.0)) == "worse"
    assert views.direction(row("input wait", "fraction", change_points=-20.0, change_pct=-60.0)) == "better"
    assert views.direction(row("wait p95 (ms)", "ms", change_pct=18.6)) == "worse"
    assert views.direction(row("compute mean (ms)", "ms", change_pct=-30.0)) is None  # neither
    assert views.direction(row("batches/s", "rate", change_pct=1.0)) is None  # noise


def test_compare_opens_with_the_comparisons_sentence_when_it_has_one():
    before = {"loaders": [{"name": "train", "input_wait_fraction": 0.6, "batches_per_s": 10.0,
                           "config": {"num_workers": 0, "batch_size": 8}}], "run": {"id": "a"}}
    after = {"loaders": [{"name": "train", "input_wait_fraction": 0.05, "batches_per_s": 21.0,
                          "config": {"num_workers": 4, "batch_size": 8}}], "run": {"id": "b"}}
    from starvewatch.analysis.compare import comparison
    comp = comparison(before, after)
    view = views.compare_view(comp)
    assert getattr(view.children[0], "id", None) != "compare-headline"  # no sentence: no empty slot
    changed = next(c for c in view.children if getattr(c, "id", None) == "config-diff")
    assert "num_workers" in _text(changed) and "batch_size" not in _text(changed)
    unchanged = next(c for c in view.children if getattr(c, "id", None) == "config-unchanged-details")
    assert "batch_size" in _text(unchanged) and not getattr(unchanged, "open", False)  # collapsed
    comp["headline"] = "after is 2.10x faster; predicted 2.00x; confirmed"
    first = views.compare_view(comp).children[0]
    assert first.id == "compare-headline" and first.children == comp["headline"]
