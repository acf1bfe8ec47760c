"""Loopback that stays loopback, and a token that guards every route: a real collector, raw
HTTP (so the test sets Host and Origin itself) and a real WebSocket handshake."""
import http.client
import itertools
import json
import re

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.conftest import wait_until

TOKEN = "s3cret-token-for-the-walk"


def call(c, method, path, headers=None, body=None, host=None, source=None):
    """One raw request; `source`: the loopback address it comes from (127.0.0.0/8 is all ours)."""
    conn = http.client.HTTPConnection("127.0.0.1", c.port, timeout=30,
                                      source_address=(source, 0) if source else None)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", host if host is not None else f"127.0.0.1:{c.port}")
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, dict((k.lower(), v) for k, v in resp.getheaders()), resp.read()
    finally:
        conn.close()


def batch(run_id, seq=1, name="sec-run"):
    return json.dumps({
        "schema": "starvewatch.events/1", "run_id": run_id, "stream": f"{run_id}-s", "seq": seq,
        "run": {"id": run_id, "name": name},
        "loaders": [{"name": "train", "totals": {"steps": 1}}],
        "steps": {"loader": ["train"], "epoch": [0], "step": [0], "start_ns": [1], "wait_ns": [5],
                  "compute_ns": [5], "other_ns": [0], "batch_size": [None], "gpu_idle_ns": [None]}}).encode()


JSON = {"Content-Type": "application/json"}
# The smallest `starvewatch tune` result the collector stores (POST /api/v1/runs/{run_id}/tuning).
_CONFIG = {"num_workers": 2, "prefetch_factor": 2, "persistent_workers": False, "pin_memory": False}
TUNING = {"schema": "starvewatch.tuning/1", "created_at": "2026-11-23T12:00:00Z", "host": "box", "cores": 2,
          "loader": "train", "budget_s": 10, "elapsed_s": 9.0, "consumption_batches_per_s": None,
          "consumption_margin": 1.2,
          "trials": [{"config": _CONFIG, "label": "num_workers=2", "status": "measured", "batches_per_s": 50.0,
                      "samples_per_s": 200.0, "worker_uss_bytes": None, "cpu_pct": 20.0}],
          "answer": {"config": _CONFIG, "label": "num_workers=2", "batches_per_s": 50.0, "epoch_batches_per_s": 50.0,
                     "rule": "the fewest workers within 10% of the best",
                     "snippet": "DataLoader(dataset, num_workers=2)", "worker_uss_bytes": None}}


def test_without_a_token_only_loopback_hosts_and_same_origin_writes_are_served(collector):
    c = collector()
    for host in (f"127.0.0.1:{c.port}", f"localhost:{c.port}", f"[::1]:{c.port}", "127.0.0.1"):
        assert call(c, "GET", "/api/v1/runs", host=host)[0] == 200, host
    # DNS rebinding: a page on evil.example resolves its own name to 127.0.0.1.
    for host in (f"evil.example:{c.port}", "evil.example", "127.0.0.1.evil.example", "", "localhost.evil"):
        for path in ("/api/v1/runs", "/", "/healthz", "/_dash-layout", "/metrics"):
            status, headers, body = call(c, "GET", path, host=host)
            assert status == 403 and b"DNS rebinding" in body, (host, path, status)
    assert call(c, "POST", "/api/v1/ingest", JSON, batch("rebound"), host="evil.example")[0] == 403
    # A page of another origin cannot write or delete (the browser sends its Origin).
    assert call(c, "POST", "/api/v1/ingest", {**JSON, "Origin": "http://evil.example"}, batch("x1"))[0] == 403
    assert call(c, "POST", "/api/v1/ingest", {**JSON, "Origin": "null"}, batch("x2"))[0] == 403
    assert c.get("/api/v1/runs")["runs"] == []
    assert call(c, "POST", "/api/v1/ingest", {**JSON, "Origin": f"http://127.0.0.1:{c.port}"}, batch("kept"))[0] == 200
    assert call(c, "DELETE", "/api/v1/runs/kept", {"Origin": "http://evil.example"})[0] == 403
    # The run list is cached for up to 0.25 s while data changes: wait for it, then it must hold
    # exactly the one run written from the same origin (the refused delete removed nothing).
    wait_until(lambda: c.get("/api/v1/runs")["runs"], timeout_s=10, what="the run list to show the new run")
    assert [r["id"] for r in c.get("/api/v1/runs")["runs"]] == ["kept"]
    # CORS stays closed: no Access-Control-Allow-* header, even to a preflight.
    status, headers, _ = call(c, "GET", "/api/v1/runs", {"Origin": "http://evil.example"})
    assert status == 200 and not any(k.startswith("access-control-") for k in headers)
    status, headers, _ = call(c, "OPTIONS", "/api/v1/runs/kept", {
        "Origin": "http://evil.example", "Access-Control-Request-Method": "DELETE"})
    assert status == 405 and not any(k.startswith("access-control-") for k in headers)
    assert call(c, "DELETE", "/api/v1/runs/kept", {"Origin": f"http://localhost:{c.port}"},
                host=f"localhost:{c.port}")[0] == 200


def test_every_response_carries_the_security_headers(collector):
    c = collector()
    for method, path, host in (("GET", "/", None), ("GET", "/api/v1/runs", None), ("GET", "/api/v1/runs/no", None),
                               ("GET", "/assets/style.css", None), ("GET", "/", "evil.example")):
        status, headers, _ = call(c, method, path, host=host)
        assert headers.get("x-frame-options") == "DENY", (path, status)
        assert headers.get("x-content-type-options") == "nosniff", (path, status)
        assert "frame-ancestors 'none'" in headers.get("content-security-policy", ""), (path, status)


def _dash_endpoints(c, run_id):
    """The dashboard's pages and Dash's own endpoints, by name, with a script path from the page."""
    status, _, page = call(c, "GET", "/", {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200
    script = re.search(rb'src="(/_dash-component-suites/[^"]+)"', page).group(1).decode()
    update = json.dumps({"output": "page.children", "outputs": {"id": "page", "property": "children"},
                         "inputs": [{"id": "url", "property": "pathname", "value": f"/runs/{run_id}"}],
                         "state": [{"id": "url", "property": "search", "value": ""}],
                         "changedPropIds": ["url.pathname"]}).encode()
    return [("GET", "/", None), ("GET", f"/runs/{run_id}", None), ("GET", "/compare", None),
            ("GET", "/_dash-layout", None), ("GET", "/_dash-dependencies", None),
            ("GET", "/assets/style.css", None), ("GET", script, None), ("GET", "/_favicon.ico", None),
            ("POST", "/_dash-update-component", update)]


def _api_endpoints(c, run_id):
    status, _, body = call(c, "GET", "/api/openapi.json", {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200
    doc = json.loads(body)
    out = []
    for path, methods in doc["paths"].items():
        for method in methods:
            concrete = path.replace("{run_id}", run_id).replace("{kind}", "samples")
            assert "{" not in concrete, path  # a new path parameter: teach this walk its value
            payload = batch(run_id, seq=2) if path == "/api/v1/ingest" else None
            if path == "/api/v1/runs/{run_id}/tuning" and method == "post":
                payload = json.dumps(TUNING).encode()
            out.append((method.upper(), concrete, payload))
    out += [("GET", "/api/openapi.json", None), ("GET", "/api/docs", None)]
    # Deleting goes last: it removes the run the other routes read.
    return sorted(out, key=lambda e: e[0] == "DELETE")


def test_a_token_guards_every_route_the_dashboard_and_its_websocket(collector):
    c = collector(token=TOKEN)
    run_id = "walked-run"
    assert call(c, "POST", "/api/v1/ingest", {**JSON, "Authorization": f"Bearer {TOKEN}"}, batch(run_id))[0] == 200
    routes = _dash_endpoints(c, run_id) + _api_endpoints(c, run_id)
    assert len(routes) >= 20
    methods = {m for m, _, _ in routes}
    assert {"GET", "POST", "DELETE"} <= methods
    # Each wrong guess from its own loopback address: guesses are slowed per client
    # (tests/test_secrets.py), and this walk is about the gate, not the pace.
    sources = (f"127.0.0.{n}" for n in itertools.cycle(range(2, 255)))
    for method, path, body in routes:
        headers = JSON if body is not None else {}
        for label, auth in (("none", {}), ("wrong", {"Authorization": "Bearer not-the-token"}),
                            ("wrong cookie", {"Cookie": f"starvewatch_session_{c.port}=not-the-token"}),
                            ("token as cookie", {"Cookie": f"starvewatch_session_{c.port}={TOKEN}"}),
                            ("wrong query", None)):
            target = path + ("&" if "?" in path else "?") + "token=nope" if auth is None else path
            status, resp_headers, text = call(c, method, target, {**headers, **(auth or {})}, body,
                                              source=next(sources))
            assert status == 401, (label, method, path, status, text[:200])
            assert resp_headers.get("www-authenticate") == "Bearer"
        status, _, text = call(c, method, path, {**headers, "Authorization": f"Bearer {TOKEN}"}, body)
        assert status < 400, (method, path, status, text[:300])
    assert call(c, "GET", f"/api/v1/runs/{run_id}", {"Authorization": f"Bearer {TOKEN}"})[0] == 404  # deleted

    # The WebSocket callback endpoint: refused at the handshake without the right token.
    url = f"ws://127.0.0.1:{c.port}/_dash-ws-callback"
    origin = f"http://127.0.0.1:{c.port}"
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Cookie": f"starvewatch_session_{c.port}=nope"},
                    {"Cookie": f"starvewatch_session_{c.port}={TOKEN}"}):
        with pytest.raises(InvalidStatus) as refused:
            connect(url, additional_headers=headers, origin=origin, open_timeout=10).close()
        assert refused.value.response.status_code == 401
    with pytest.raises(InvalidStatus) as refused:
        connect(url + "?token=nope", origin=origin, open_timeout=10).close()
    assert refused.value.response.status_code == 401
    session = call(c, "GET", f"/?token={TOKEN}")[1]["set-cookie"].split(";")[0]
    with connect(url, additional_headers={"Cookie": session}, origin=origin, open_timeout=10) as ws:
        ws.ping().wait(10)  # the handshake was accepted and the connection is live
    # Another origin is refused even with the token (cross-site WebSocket hijacking).
    with pytest.raises(InvalidStatus) as refused:
        connect(url, additional_headers={"Authorization": f"Bearer {TOKEN}"}, origin="http://evil.example",
                open_timeout=10).close()
    assert refused.value.response.status_code == 403


def test_the_token_never_reaches_logs_urls_or_exports(collector):
    c = collector(token=TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    # A browser logs in once with ?token=: cookie set, token gone from the address.
    status, headers, _ = call(c, "GET", f"/runs/x?token={TOKEN}&a=1")
    assert status == 303 and headers["location"] == "/runs/x?a=1"
    cookie = headers["set-cookie"]
    # The cookie is named for this port (browsers send a host's cookies to all its ports) and
    # holds a value derived from the token, never the token; it opens the pages it is for.
    assert cookie.startswith(f"starvewatch_session_{c.port}=") and "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie and TOKEN not in cookie and "Secure" not in cookie  # plain HTTP
    assert call(c, "GET", "/api/v1/runs", {"Cookie": cookie.split(";")[0]})[0] == 200
    status, headers, _ = call(c, "GET", f"//evil.example/?token={TOKEN}")
    assert status == 303 and headers["location"] == "/evil.example/"  # never another site
    assert call(c, "POST", "/api/v1/ingest", {**JSON, **auth}, batch("exported-run", name=f"n"))[0] == 200
    assert call(c, "GET", "/api/v1/runs/nope?token=" + TOKEN + "x")[0] == 401
    for fmt in ("json", "csv", "md", "html"):
        status, headers, body = call(c, "GET", f"/api/v1/runs/exported-run/export?format={fmt}", auth)
        assert status == 200 and len(body) > 100, fmt
        assert TOKEN.encode() not in body, fmt
        assert headers["content-disposition"].startswith('attachment; filename="starvewatch-exported-run.')
    c.stop()
    log = (c.directory / f"collector-{c.port}.log").read_bytes()
    assert TOKEN.encode() not in log


def test_secrets_on_the_training_command_line_are_never_stored(collector):
    from starvewatch.redact import redact_argv
    assert redact_argv(["t.py", "--hf-token", "abc", "--api-key=xyz", "--lr", "3", "--auth"]) == [
        "t.py", "--hf-token", "***", "--api-key=***", "--lr", "3", "--auth"]
    c = collector()
    payload = json.loads(batch("argv-run"))
    payload["run"]["argv"] = ["train.py", "--hf-token", "hf_SECRET1", "--password=SECRET2", "--epochs", "3"]
    assert call(c, "POST", "/api/v1/ingest", JSON, json.dumps(payload).encode())[0] == 200
    assert c.get("/api/v1/runs/argv-run")["run"]["argv"] == [
        "train.py", "--hf-token", "***", "--password=***", "--epochs", "3"]
    for fmt in ("json", "md", "html"):
        status, _, body = call(c, "GET", f"/api/v1/runs/argv-run/export?format={fmt}")
        assert status == 200 and b"SECRET" not in body, fmt
    stored = [p.read_bytes() for p in c.directory.glob("starvewatch.db*")]  # the WAL too
    assert stored and not any(b"SECRET" in data for data in stored)
    assert any(b"hf-token" in data for data in stored)  # the command line itself is kept


def test_a_token_that_cannot_travel_in_a_header_is_refused_at_start(isolated_starvewatch):
    import subprocess
    import sys
    from tests.conftest import free_port
    for token in ("two words", "naïve", "a;b", "line\nbreak"):
        out = subprocess.run([sys.executable, "-m", "starvewatch", "serve", "--port", str(free_port()),
                              "--token", token], capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "printable ASCII" in out.stderr and "Traceback" not in out.stderr, token
