"""One run never breaks another (issue 36 item 4).

A sample with `"interval_s": "x"`, or a tuning document with `"consumption_margin": "x"`, once
made /metrics answer 500 for every run (and the tuning one broke every later run of that name).
Such values are now refused at the door (422); a database written before that (the values put
straight into SQLite here, as an older collector stored them) still serves every other run:
/metrics, the runs list, a later run of the same name and its exports, while the broken run's
page and exports say that run alone cannot be shown.
"""
import json
import sqlite3

from tests.browser import page_with_errors
from tests.test_security import JSON, TUNING, call
from tests.test_stored_markup_browser import full_batch


def _post(c, path, doc) -> int:
    return call(c, "POST", path, JSON, json.dumps(doc).encode())[0]


def _corrupt(db, run_id: str) -> None:
    """Wrong-typed values in the stored sample and tuning document of `run_id`."""
    with sqlite3.connect(db) as conn:
        rowid, data = conn.execute("SELECT rowid, data FROM events WHERE run_id = ? AND kind = 'samples' "
                                   "AND data LIKE '%interval_s%'", (run_id,)).fetchone()
        conn.execute("UPDATE events SET data = ? WHERE rowid = ?", (json.dumps({**json.loads(data), "interval_s": "x"}), rowid))
        rowid, data = conn.execute("SELECT rowid, data FROM tunings WHERE run_id = ?", (run_id,)).fetchone()
        conn.execute("UPDATE tunings SET data = ? WHERE rowid = ?",
                     (json.dumps({**json.loads(data), "consumption_margin": "x"}), rowid))


def test_wrong_types_are_refused_at_the_door(collector):
    c = collector()
    batch = full_batch("door")
    batch["samples"][0]["interval_s"] = "x"
    assert _post(c, "/api/v1/ingest", batch) == 422
    assert _post(c, "/api/v1/ingest", full_batch("door")) == 200
    assert _post(c, "/api/v1/runs/door/tuning", dict(TUNING, consumption_margin="x")) == 422
    assert _post(c, "/api/v1/runs/door/tuning", TUNING) == 200


def test_a_run_that_cannot_be_read_breaks_no_other(collector, browser):
    c = collector()
    for run_id in ("broken", "good"):
        batch = full_batch(run_id)
        batch["run"]["name"] = "same-name" if run_id == "broken" else "other"
        assert _post(c, "/api/v1/ingest", batch) == 200
        assert _post(c, f"/api/v1/runs/{run_id}/tuning", TUNING) == 200
    _corrupt(next(c.directory.glob("*.db")), "broken")
    later = full_batch("later")
    later["run"]["name"] = "same-name"  # a later run of the broken run's name
    assert _post(c, "/api/v1/ingest", later) == 200

    status, _, body = call(c, "GET", "/metrics")
    text = body.decode()
    assert status == 200, text[:500]
    assert 'starvewatch_steps{loader="train",name="other",run="good"} 30.0' in text
    assert 'starvewatch_steps{loader="train",name="same-name",run="later"} 30.0' in text
    assert 'starvewatch_run_unreadable{name="same-name",run="broken"} 1.0' in text

    runs = {r["id"]: r for r in c.get("/api/v1/runs")["runs"]}
    assert set(runs) == {"broken", "good", "later"}
    for run_id in ("good", "later"):
        for fmt in ("json", "md", "html", "csv"):
            status, _, body = call(c, "GET", f"/api/v1/runs/{run_id}/export?format={fmt}")
            assert status == 200, (run_id, fmt, body[:300])
    status, _, body = call(c, "GET", "/api/v1/runs/broken/export?format=md")
    assert status == 500 and b"'broken' cannot be exported" in body, body[:300]

    page, errors = page_with_errors(browser)
    page.goto(f"{c.url}/runs/broken")
    page.wait_for_selector("#run-unreadable", timeout=60_000)
    assert "cannot be shown" in page.inner_text("#run-title")
    page.goto(f"{c.url}/runs/later")
    page.wait_for_selector("#timeline-graph .js-plotly-plot .gtitle", timeout=60_000)
    assert "same-name" in page.inner_text("#run-title")
    # The broken run's callback answered (with its error): the browser logged nothing.
    assert errors == [], errors
