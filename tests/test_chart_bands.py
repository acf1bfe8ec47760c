"""The per-step chart draws a min-max band per bucket (Query.step_series, figures.step_timeline),
so one slow or one fast step stays visible at any length of run and after its raw rows are
folded into rollups (storage budget, monitor/budget/retention.py, rollup_bands.py): the same band
before and after the fold, never a sample."""
import shutil
import sqlite3
from pathlib import Path

import pytest

from starvewatch.monitor.outputs import figures
from starvewatch.monitor.budget import retention
from starvewatch.monitor.storage.query import Query
from tests.test_collector_api import SECOND, batch, post
from tests.test_storage_budget import app_client

DATA = Path(__file__).parent / "data"
STEPS, SPIKE, DIP = 10_000, 4321, 7654  # one 500 ms wait, one 1 ms compute among 10 ms steps (2 + 8 ms)
START_S = 1_700_000_000


def spiky_run(client):
    """10,000 steps 10 ms apart (100 s), in ten batches."""
    for i in range(10):
        payload = batch(seq=i + 1, n=1000, step0=i * 1000, start_s=START_S, wait_ns=2_000_000,
                        compute_ns=8_000_000, every_ns=10_000_000)  # live: folding keeps its raw window
        for index, part, value in ((SPIKE, "wait_ns", 500_000_000), (DIP, "compute_ns", 1_000_000)):
            if i * 1000 <= index < (i + 1) * 1000:
                payload["steps"][part][index - i * 1000] = value
        assert post(client, payload).status_code == 200


def fold_to_window(store, window=2000):
    """The storage budget's fold, budget lowered until only the run's raw window is left (each
    fold stops at its own target)."""
    store.retention.raw_window_steps = window
    for _ in range(10):
        store.retention.max_bytes = retention.file_bytes(store.path) // 2
        store.retention.enforce_now()
        if store.reader().execute("SELECT count(*) FROM steps").fetchone()[0] <= window:
            return
    raise AssertionError("the fold left more than the raw window")


def band(series):
    """Per bucket: (first step, steps, wait min/max, compute min/max) exactly, means rounded."""
    return [(p["index"], p["count"], p["wait_ms"][0], p["wait_ms"][2], p["compute_ms"][0], p["compute_ms"][2],
             round(p["wait_ms"][1], 9), round(p["compute_ms"][1], 9)) for p in series["points"]]


def holding(series, step):
    """The bucket that holds a step."""
    return next(p for p in series["points"] if p["index"] <= step < p["index"] + p["count"])


def assert_spike_and_dip_in_their_buckets(series):
    spike, dip = holding(series, SPIKE), holding(series, DIP)
    assert spike["wait_ms"][2] == 500.0 and spike["count"] > 1
    assert spike["wait_ms"][1] < 500.0 / 2  # the mean alone hides it
    assert dip["compute_ms"][0] == 1.0 and dip["compute_ms"][1] > 4.0
    others = [p for p in series["points"] if p is not spike]
    assert max(p["wait_ms"][2] for p in others) == 2.0
    assert min(p["compute_ms"][0] for p in series["points"] if p is not dip) == 8.0
    assert sum(p["count"] for p in series["points"]) == STEPS


def test_a_spike_and_a_dip_stay_in_the_band_raw_and_after_folding(tmp_path):
    with app_client(tmp_path) as client:
        spiky_run(client)
        store = client.app.state.store
        raw_fine = Query(store).step_series("run-a", "train")  # 100 s in 1,000 points: 0.1 s buckets
        raw = Query(store).step_series("run-a", "train", points=40)  # 3 s buckets, as the rollups'
        from_rollups = Query(store)
        from_rollups.RAW_STEP_SERIES_MAX = 0  # the same run drawn from its rollups, before any fold
        rolled_before = from_rollups.step_series("run-a", "train", points=40)
        assert (raw_fine["source"], raw["source"], rolled_before["source"]) == ("steps", "steps", "rollups")
        assert raw_fine["bucket_s"] == pytest.approx(0.1, rel=1e-3) and len(raw_fine["points"]) == 1000
        assert raw["bucket_s"] == rolled_before["bucket_s"] == 3 and len(raw["points"]) == 34
        for series in (raw_fine, raw, rolled_before):
            assert_spike_and_dip_in_their_buckets(series)
        assert band(raw) == band(rolled_before)

        fold_to_window(store)
        # The spike's and the dip's rows are gone from the raw steps: what shows them now is the rollups.
        left = store.reader().execute("SELECT count(*), max(wait_ns), min(compute_ns) FROM steps").fetchone()
        assert tuple(left) == (2000, 2_000_000, 8_000_000)
        folded = Query(store)
        after = folded.step_series("run-a", "train", points=40)
        after_fine = folded.step_series("run-a", "train")
        assert after["source"] == after_fine["source"] == "rollups" and after_fine["bucket_s"] == 1
        assert band(after) == band(raw)  # the same figure before and after the fold
        for series in (after, after_fine):
            assert_spike_and_dip_in_their_buckets(series)

        # Coarser tiers (per minute) merge the extremes too: the band's envelope is kept.
        with store._write_lock:
            assert store.retention.coarsen("run-a", 60) > 0
        coarse = Query(store).step_series("run-a", "train", points=40)
        assert max(p["wait_ms"][2] for p in coarse["points"]) == 500.0
        assert min(p["compute_ms"][0] for p in coarse["points"]) == 1.0
        assert sum(p["count"] for p in coarse["points"]) == STEPS

    fig = figures.step_timeline(after_fine)
    filled = [t for t in fig.data if t.fill == "tonexty"]
    assert [t.name for t in filled] == ["compute (min–max)", "data wait (min–max)"]
    lower = {t.legendgroup: t for t in fig.data if t.showlegend is False}
    wait_band, compute_band = filled[1], filled[0]
    assert max(wait_band.y) == 500.0 and min(lower["compute_ms"].y) == 1.0
    mean = next(t for t in fig.data if t.name == "data wait (mean)")
    assert max(mean.y) < 10.0  # the mean line alone would not show the spike
    assert list(wait_band.x) == [p["index"] for p in after_fine["points"]] == list(compute_band.x)


def test_one_step_rollup_rows_store_no_extremes_and_still_merge_exactly(tmp_path):
    """A slow loop's per-second rows hold one step: their extremes are their mean, stored as
    NULL; a replay into the same second and a coarser tier merge them as the values they are."""
    with app_client(tmp_path) as client:
        payload = batch(n=120, every_ns=SECOND, wait_ns=5_000_000, compute_ns=20_000_000)
        payload["steps"]["wait_ns"][30] = 1_000_000
        payload["steps"]["compute_ns"][31] = 90_000_000
        assert post(client, payload).status_code == 200
        store = client.app.state.store
        db = store.reader()
        stored = db.execute("SELECT count(*), count(wait_min_ns), count(compute_min_ns), count(compute_max_ns) "
                            "FROM rollups").fetchone()
        assert tuple(stored) == (120, 0, 0, 0)
        # A second stream's step in second 40 (a late replay lands the same way): merged, then known.
        late = batch(stream="s1", n=1, step0=40, every_ns=SECOND, wait_ns=7_000_000, compute_ns=3_000_000)
        late["steps"]["start_ns"] = [(START_S + 40) * SECOND + 500_000_000]
        assert post(client, late).status_code == 200
        row = db.execute("SELECT steps, wait_min_ns, wait_max_ns, compute_min_ns, compute_max_ns FROM rollups "
                         "WHERE second = ?", (START_S + 40,)).fetchone()
        assert tuple(row) == (2, 5_000_000, 7_000_000, 3_000_000, 20_000_000)
        forced = Query(store)
        forced.RAW_STEP_SERIES_MAX = 0
        series = forced.step_series("run-a", "train", points=12)  # 10 s buckets from the rollups
        assert series["source"] == "rollups"
        raw = Query(store).step_series("run-a", "train", points=12)
        assert raw["source"] == "steps" and band(raw) == band(series)
        assert holding(series, 30)["wait_ms"][0] == 1.0 and holding(series, 31)["compute_ms"][2] == 90.0
        with store._write_lock:
            assert store.retention.coarsen("run-a", 60) > 0
        # The minutes before the cut (hi + 1 floored to a minute, START_S % 60 == 20): two rows.
        merged = db.execute("SELECT min(wait_min_ns), max(compute_max_ns), min(compute_min_ns), sum(steps), "
                            "count(*) FROM rollups WHERE span_s = 60").fetchone()
        assert tuple(merged) == (1_000_000, 90_000_000, 3_000_000, 101, 2)


def test_a_database_from_before_the_band_columns_draws_its_rollups_at_their_mean(tmp_path):
    shutil.copy(DATA / "main-schema-v1.db", tmp_path / "starvewatch.db")
    old = sqlite3.connect(tmp_path / "starvewatch.db")
    assert "wait_min_ns" not in {r[1] for r in old.execute("PRAGMA table_info(rollups)")}
    old.close()
    with app_client(tmp_path) as client:
        store = client.app.state.store
        forced = Query(store)
        forced.RAW_STEP_SERIES_MAX = 0
        series = forced.step_series("old-run", "train", points=50)
        assert series["source"] == "rollups" and sum(p["count"] for p in series["points"]) == 3000  # rank 0
        for p in series["points"]:
            for low, mean, high in (p["wait_ms"], p["compute_ms"]):
                assert low <= mean + 1e-6 and mean <= high + 1e-6
        # Its rows fold into coarser tiers like new ones (the added columns sit after span_s).
        with store._write_lock:
            assert store.retention.coarsen("old-run", 10) > 0
        assert sum(p["count"] for p in Query(store).step_series("old-run", "train", points=50)["points"]) == 3000


def test_the_run_page_draws_the_bands_of_a_folded_run_in_chromium(collector, isolated_starvewatch, browser):
    with app_client(isolated_starvewatch) as client:
        spiky_run(client)
        store = client.app.state.store
        fold_to_window(store)
        assert store.reader().execute("SELECT count(*) FROM steps WHERE wait_ns = 500000000").fetchone()[0] == 0
    c = collector()
    page = browser.new_page(viewport={"width": 1300, "height": 1600})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(c.url + "/runs/run-a")
    page.wait_for_selector("#timeline-graph path.js-fill", timeout=60_000, state="attached")
    # As plotly.js holds them (_fullData: the arrays decoded from the binary the server sent).
    traces = page.evaluate("""() => document.querySelector('#timeline-graph .js-plotly-plot')._fullData
        .map(t => ({name: t.name, fill: t.fill, top: Math.max(...t.y)}))""")
    # The fills as drawn: an SVG path per band, with a shape.
    fills = page.evaluate("""() => [...document.querySelectorAll('#timeline-graph path.js-fill')]
        .map(p => (p.getAttribute('d') || '').length)""")
    bands = {t["name"]: t for t in traces if t["fill"] == "tonexty"}
    assert set(bands) == {"compute (min–max)", "data wait (min–max)"}
    assert bands["data wait (min–max)"]["top"] == 500.0
    assert next(t for t in traces if t["name"] == "data wait (mean)")["top"] < 10.0
    assert len([d for d in fills if d > 10]) >= 2, fills
    assert errors == []


def test_the_raw_steps_api_says_which_spans_are_rolled_up(tmp_path):
    with app_client(tmp_path) as client:
        spiky_run(client)
        assert client.get("/api/v1/runs/run-a/steps?limit=10").json()["rolled_up"] == []
        fold_to_window(client.app.state.store)
        page = client.get("/api/v1/runs/run-a/steps?limit=100000").json()
    (span,) = page["rolled_up"]
    assert span["rank"] == 0 and span["steps"] == 10_000 - len(page["steps"])  # every step: raw or listed
    assert min(s["start_ns"] for s in page["steps"]) >= span["until_s"] * SECOND  # the raw rows come after
