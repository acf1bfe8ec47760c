"""The exported HTML report's "wait per batch" histogram is drawn from the run's mergeable
histograms (Query.distributions, the ones the summary's percentiles use), so a 500 ms spike
among 10 ms steps is a bar of its own, raw and after the storage budget folds the run's rows
into rollups: the same histogram before and after the fold. The compare report reads the same
histograms."""
import re

import orjson
import pytest

from starvewatch.monitor.storage.query import Query
from tests.test_chart_bands import fold_to_window, spiky_run
from tests.test_storage_budget import app_client


def histogram_metas(page: str) -> list[dict]:
    """The layout `meta` of each clipped histogram in a report page (figures.clipped_histogram
    records where its axis was clipped, how many steps lie beyond, and the maximum)."""
    return [orjson.loads(m) for m in re.findall(r'"meta":(\{"clip":[^}]*\})', page)]


def test_the_report_histogram_shows_the_spike_and_is_the_same_after_a_fold(tmp_path):
    with app_client(tmp_path) as client:
        spiky_run(client)
        store = client.app.state.store
        before = client.get("/api/v1/runs/run-a/export?format=html")
        dists_before = Query(store).distributions("run-a", "train")
        fold_to_window(store)
        assert store.reader().execute("SELECT count(*) FROM steps").fetchone()[0] <= 2000
        after = client.get("/api/v1/runs/run-a/export?format=html")
        dists_after = Query(store).distributions("run-a", "train")
    assert before.status_code == after.status_code == 200
    metas_before, metas_after = histogram_metas(before.text), histogram_metas(after.text)
    assert len(metas_before) == 1  # one loader, one wait histogram
    assert metas_before == metas_after
    (meta,) = metas_after
    # 9,999 waits of 2 ms and one of 500 ms: the axis stops at 3 x p95, the spike is the one
    # step beyond it, and its value (not a bucket's mean) is the maximum.
    assert meta["overflow"] == 1
    assert meta["max"] == pytest.approx(500.0, rel=0.02)
    assert meta["clip"] == pytest.approx(6.0, rel=0.02)
    # The compare report draws its overlaid histograms from the same answers: unchanged too.
    assert dists_before == dists_after
    assert dists_after["wait"]["count"] == 10_000
