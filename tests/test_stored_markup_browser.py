"""No stored record ever becomes markup (issue 36 item 1).

A stall's `stack` sent as a JSON object shaped like a Dash component once rendered as that
component (an Iframe whose script ran in the collector's origin). Here a component-shaped object
goes into every free-form field of a batch and of a tuning document (kept, as text) and into
every typed field (refused, 422); a real Chromium loads the run page, and no element the object
describes exists, no script of it ran, and the page's Content-Security-Policy was never broken by
the dashboard itself. A database written before the types (an object stored as a stack) is drawn
as text too.
"""
import copy
import json
import sqlite3
import time

from tests.browser import page_with_errors
from tests.test_security import JSON, call

MARK = "sw-injected"
SCRIPT = f"<script>parent.window.__swInjected = 1; parent.document.title = '{MARK}'</script>"
COMPONENT = {"namespace": "dash_html_components", "type": "Iframe",
             "props": {"id": MARK, "srcDoc": SCRIPT, "children": [
                 {"namespace": "dash_html_components", "type": "Div", "props": {"id": MARK + "-div"}}]}}
INJECTED = f"""() => ({{
    elements: document.querySelectorAll('#{MARK}, #{MARK}-div, iframe').length,
    ran: window.__swInjected === 1 || document.title === '{MARK}',
    shown: document.body.innerText.includes('dash_html_components'),
}})"""


def full_batch(run_id: str) -> dict:
    """A batch with every record kind and every optional field the hooks send."""
    now = time.time_ns()
    n = 30
    worker = {"id": 0, "pid": 10, "state": "running", "batches": 5, "load_ms_mean": 5.0, "cpu_fraction": 0.9,
              "cpu_pct": 80.0, "batches_interval": 2, "load_ms_interval": 5.0, "load_ms_max": 9.0, "samples": 20,
              "rss_bytes": 1e8, "uss_bytes": 5e7, "pss_bytes": 6e7, "mem_t_ns": now, "batch_bytes": 1024.0}
    return {
        "schema": "starvewatch.events/1", "run_id": run_id, "stream": f"{run_id}-s", "seq": 1, "status": "live",
        "run": {"id": run_id, "name": "markup-run", "host": "h", "started_at": now / 1e9, "pid": 1,
                "argv": ["train.py"], "python": "3.11", "cpu_count": 8, "usable_cores": 8, "local_world_size": 1},
        "loaders": [{"name": "train", "kind": "DataLoader",
                     "config": {"num_workers": 2, "batch_size": 4, "sampler": "RandomSampler"},
                     "totals": {"steps": n, "wait_ns": n * 8_000_000, "compute_ns": n * 2_000_000}}],
        "steps": {"loader": ["train"] * n, "epoch": [0] * n, "step": list(range(n)),
                  "start_ns": [now - (n - i) * 10_000_000 for i in range(n)], "wait_ns": [8_000_000] * n,
                  "compute_ns": [2_000_000] * n, "other_ns": [0] * n, "batch_size": [4] * n,
                  "gpu_idle_ns": [None] * n},
        "samples": [{"kind": "host", "t_ns": now, "interval_s": 1.0, "cpu_pct": 50.0, "mem_total_bytes": 1e10,
                     "mem_available_bytes": 5e9},
                    {"kind": "gpu", "t_ns": now, "devices": [{"name": "H100", "gpu_util_pct": 20.0}]}],
        "workers": [{"t_ns": now, "loader": "train", "configured_workers": 2, "alive_workers": 2,
                     "queue_depth": 1, "queue_capacity": 4, "workers": [worker, dict(worker, id=1, pid=11)]}],
        "stalls": [{"t_ns": now, "loader": "train", "started_ns": now - 10**9, "wait_s": 12.0, "step": 3,
                    "epoch": 0, "phase": "next", "worker": 0, "worker_pid": 10, "worker_state": "running",
                    "indices": [1, 2], "stack": "File x.py, line 1", "stack_of": "worker",
                    "workers": [dict(worker)]}],
    }


# The records of a batch that keep unknown fields (free-form), by where they sit.
FREE_FORM = [("run",), ("loaders", 0, "config"), ("samples", 0), ("samples", 1, "devices", 0),
             ("workers", 0), ("workers", 0, "workers", 0), ("stalls", 0), ("stalls", 0, "workers", 0)]


def _at(doc, path):
    for key in path:
        doc = doc[key]
    return doc


def typed_fields(batch: dict):
    """(path, field) of every field the wire model types, in every record of `batch`."""
    from starvewatch.monitor.web.wire_models import (Device, EventBatch, LoaderConfig, LoaderInfo,
                                                      LoaderTotalsModel, RunInfo, Sample, Stall, WorkerInfo,
                                                      WorkerSnapshot)
    records = [((), EventBatch), (("run",), RunInfo), (("loaders", 0), LoaderInfo),
               (("loaders", 0, "config"), LoaderConfig), (("loaders", 0, "totals"), LoaderTotalsModel),
               (("samples", 0), Sample), (("samples", 1, "devices", 0), Device), (("workers", 0), WorkerSnapshot),
               (("workers", 0, "workers", 0), WorkerInfo), (("stalls", 0), Stall),
               (("stalls", 0, "workers", 0), WorkerInfo)]
    for path, model in records:
        for name, field in model.model_fields.items():
            if not _is_record(field.annotation):  # a record's own fields are tried in its turn
                yield path, field.alias or name


def _is_record(annotation) -> bool:
    import typing

    from pydantic import BaseModel
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    return any(_is_record(a) for a in typing.get_args(annotation) if a is not type(None)) and \
        typing.get_origin(annotation) is not list


def test_component_shaped_values_stay_text_in_the_browser(collector, browser):
    c = collector()
    # Free-form fields: kept, as inert text, in every record that keeps unknown fields.
    batch = full_batch("free-form")
    for path in FREE_FORM:
        _at(batch, path)["note"] = COMPONENT
        _at(batch, path)["notes"] = [COMPONENT]
    assert call(c, "POST", "/api/v1/ingest", JSON, json.dumps(batch).encode())[0] == 200
    tuning = {"schema": "starvewatch.tuning/1", "loader": "train", "note": COMPONENT, "budget_s": 5.0,
              "trials": [{"config": {"num_workers": 2, "note": COMPONENT}, "status": "measured",
                          "batches_per_s": 100.0, "note": COMPONENT}],
              "answer": {"config": {"num_workers": 2}, "batches_per_s": 100.0, "rule": "r", "note": COMPONENT}}
    assert call(c, "POST", "/api/v1/runs/free-form/tuning", JSON, json.dumps(tuning).encode())[0] == 200

    # A database written before the types: an object stored as a stall's stack.
    db = next(c.directory.glob("*.db"))
    assert call(c, "POST", "/api/v1/ingest", JSON, json.dumps(full_batch("old-row")).encode())[0] == 200
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT rowid, data FROM events WHERE run_id = 'old-row' AND kind = 'stalls'").fetchone()
        data = json.loads(row[1])
        data["stack"] = COMPONENT
        conn.execute("UPDATE events SET data = ? WHERE rowid = ?", (json.dumps(data), row[0]))

    for run_id in ("free-form", "old-row"):
        page, errors = page_with_errors(browser, height=2400)
        alerts = []
        page.on("dialog", lambda d: (alerts.append(d.message), d.dismiss()))
        page.goto(f"{c.url}/runs/{run_id}")
        page.wait_for_selector("#timeline-graph .js-plotly-plot", timeout=60_000)
        page.wait_for_selector(".sw-stall", state="attached", timeout=60_000)
        found = page.evaluate(INJECTED)
        assert found["elements"] == 0 and not found["ran"], (run_id, found)
        assert alerts == [] and errors == [], (run_id, alerts, errors)  # no CSP violation either
        page.close()
    # The old row's object was drawn as the text it is (the second wall: dashboard/inert.py).
    page, errors = page_with_errors(browser, height=2400)
    page.goto(f"{c.url}/runs/old-row")
    page.wait_for_selector(".sw-stall", state="attached", timeout=60_000)
    assert "dash_html_components" in page.text_content(".sw-stall pre")
    assert page.evaluate(INJECTED)["elements"] == 0 and errors == []

    stall = c.get("/api/v1/runs/free-form/events/stalls")["events"][0]
    assert json.loads(stall["note"]) == COMPONENT  # kept whole, as its JSON text

    # Typed fields: an object where a name, a number or a list belongs is refused at the door.
    base = full_batch("typed")
    accepted = []
    for i, (path, name) in enumerate(typed_fields(base)):
        batch = copy.deepcopy(base)
        batch["run_id"] = batch["run"]["id"] = f"typed-{i}"
        _at(batch, path)[name] = COMPONENT
        status = call(c, "POST", "/api/v1/ingest", JSON, json.dumps(batch).encode())[0]
        if status != 422:
            accepted.append((path, name, status))
    assert not accepted, accepted
    assert len(list(typed_fields(base))) > 100  # every typed field was tried
    for name in ("loader", "created_at", "host", "consumption_margin", "budget_s"):
        bad = dict(tuning, **{name: COMPONENT})
        assert call(c, "POST", "/api/v1/runs/free-form/tuning", JSON, json.dumps(bad).encode())[0] == 422, name


def test_pages_carry_a_script_policy_that_allows_only_dash_itself(collector):
    import urllib.request
    c = collector()
    for path in ("/", "/runs/x", "/api/v1/runs"):
        with urllib.request.urlopen(f"{c.url}{path}", timeout=30) as resp:
            policy = resp.headers["content-security-policy"]
            page = resp.read().decode()
        directives = {d.split()[0]: d.split()[1:] for d in policy.split("; ")}
        scripts = directives["script-src"]
        assert scripts[0] == "'self'" and "'unsafe-inline'" not in scripts and "'unsafe-eval'" not in scripts
        assert all(s.startswith("'sha256-") for s in scripts[1:]), scripts
        assert directives["object-src"] == ["'none'"] and directives["base-uri"] == ["'none'"]
        if path != "/api/v1/runs":
            # Dash's page has exactly the inline scripts the hashes allow (the renderer's start).
            import base64
            import hashlib
            import re
            page = re.sub(r"<!--.*?-->", "", page, flags=re.S)  # (Dash's note for Internet Explorer)
            inline = [m for m in re.findall(r"<script(?![^>]*\bsrc=)([^>]*)>(.*?)</script>", page, re.S)
                      if "application/json" not in m[0]]
            hashes = {"'sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() + "'"
                      for _, body in inline}
            assert inline and hashes <= set(scripts[1:]), (inline, scripts)


def test_a_stall_whose_stored_stack_is_no_text_names_no_frames():
    """An old row may hold any JSON as a stall's stack: the run page's stall banner read it as
    a faulthandler dump and raised (the page never showed its stalls; the browser test above
    failed whenever the summary was computed after the row changed)."""
    from starvewatch.analysis.findings.stall_text import stack_frames, stall_where
    assert stack_frames(COMPONENT) == [] and stack_frames(["File x"]) == []
    assert stall_where({"stack": COMPONENT}) in (None, "")
