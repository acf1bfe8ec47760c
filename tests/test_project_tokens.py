"""Tokens scoped to a project and a role (issue 40 item 3): a real collector (uvicorn), a real
SQLite file and one PostgreSQL case; tokens made by the real CLI (`starvewatch token`).

The walk is table-driven over the app's own route list: every route x every role x a run of the
token's project and a run of another project. A route without a rule in access_rules.RULES
fails it, so a new route is never open to project tokens by accident."""
import json
import subprocess
import sys

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from starvewatch.monitor.web import access_rules
from tests.test_security import JSON, TUNING, batch, call

TOKEN = "the-collectors-own-token-0123456789"
ROLES = ("write", "read", "admin")


def _cli(directory, *args, url=None):
    where = ["--database-url", url] if url else ["--dir", str(directory)]
    done = subprocess.run([sys.executable, "-m", "starvewatch", "token", *where, *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _make_token(directory, role, project, url=None) -> str:
    token = _cli(directory, "create", "--project", project, "--role", role, url=url).strip()
    assert token.startswith("swt_") and len(token) > 40, token
    return token


def _bearer(token):
    return {"Authorization": f"Bearer {token}"}


def _app_routes():
    """(method, path template) of every route `serve` builds (the dashboard's included), once
    started (Dash adds its pages' route at startup)."""
    from fastapi.testclient import TestClient

    from starvewatch.dashboard import mount
    from starvewatch.monitor.web.app import create_app
    from starvewatch.monitor.web.collector_settings import CollectorSettings
    app = create_app(CollectorSettings(), ui=mount)
    with TestClient(app):
        pass
    return [(method, route.path) for route in app.routes for method in access_rules.route_methods(route)]


def _concrete(path: str, run_id: str) -> str:
    return (path.replace("{run_id}", run_id).replace("{kind}", "samples")
            .replace("{package_name}", "dash").replace("{fingerprinted_path:path}", "nothing.js"))


def test_every_route_has_a_rule():
    routes = _app_routes()
    assert len(routes) >= 25
    missing = [r for r in routes if access_rules.action_for(r[0], _Route(r[1])) is None]
    assert not missing, f"routes without an access rule (monitor/web/access_rules.py): {missing}"


class _Route:
    def __init__(self, path):
        self.path = path


def _handshake(c, path, token):
    """A real WebSocket handshake: 101 when accepted, else the refusal's status."""
    try:
        with connect(f"ws://127.0.0.1:{c.port}{path}", additional_headers=_bearer(token),
                     origin=f"http://127.0.0.1:{c.port}", open_timeout=10) as ws:
            ws.ping().wait(10)
        return 101, b""
    except InvalidStatus as refused:
        return refused.response.status_code, refused.response.body or b""


def _body(method, path, run_id):
    if path == "/api/v1/ingest":
        return batch(run_id, seq=2, name=run_id)
    if path.endswith("/tuning") and method == "POST":
        return json.dumps(TUNING).encode()
    return b"{}" if method == "POST" else None


def test_every_route_every_role_and_another_projects_run(collector):
    c = collector(token=TOKEN)
    d = c.directory
    tokens = {role: _make_token(d, role, "vision") for role in ROLES}
    other = _make_token(d, "write", "nlp")
    # Runs of each project, each sent first by its project's write token (its project is the token's).
    for run_id, token in (("mine", tokens["write"]), ("doomed", tokens["write"]), ("theirs", other)):
        assert call(c, "POST", "/api/v1/ingest", {**JSON, **_bearer(token)}, batch(run_id, name=run_id))[0] == 200
        assert call(c, "POST", f"/api/v1/runs/{run_id}/tuning", {**JSON, **_bearer(token)},
                    json.dumps(TUNING).encode())[0] == 200
    assert call(c, "POST", "/api/v1/ingest", {**JSON, **_bearer(TOKEN)}, batch("nobodys", name="nobodys"))[0] == 200

    checked = 0
    for method, path in _app_routes():
        action = access_rules.action_for(method, _Route(path))
        names_run = "{run_id}" in path or path == "/api/v1/ingest"
        for role in ROLES:
            for whose in (("mine", "theirs") if names_run else ("mine",)):
                run_id = "doomed" if (method == "DELETE" and whose == "mine") else whose
                body = _body(method, path, run_id)
                if method == "WEBSOCKET":
                    status, text = _handshake(c, path, tokens[role])
                else:
                    status, _, text = call(c, method, _concrete(path, run_id),
                                           {**(JSON if body is not None else {}), **_bearer(tokens[role])}, body)
                where = (role, method, path, whose, status, text[:200])
                checked += 1
                if not access_rules.allowed(role, action):
                    assert status == 403, where
                elif whose == "theirs":
                    # Another project's run: unknown to reads and deletes, refused to ingest.
                    assert status == (403 if path == "/api/v1/ingest" else 404), where
                else:
                    assert status not in (401, 403, 404), where
    assert checked > 3 * 30
    # What each walk left: only the admin deleted, and only its own project's run.
    own = _bearer(TOKEN)
    assert call(c, "GET", "/api/v1/runs/doomed", own)[0] == 404
    assert call(c, "GET", "/api/v1/runs/theirs", own)[0] == 200


def test_a_token_sees_only_its_projects_everywhere(collector):
    c = collector(token=TOKEN)
    d = c.directory
    vision_w, nlp_w = _make_token(d, "write", "vision"), _make_token(d, "write", "nlp")
    reader = _make_token(d, "read", "vision")
    for run_id, token in (("v-run", vision_w), ("n-run", nlp_w)):
        assert call(c, "POST", "/api/v1/ingest", {**JSON, **_bearer(token)}, batch(run_id, name="same-name"))[0] == 200
    # A write token never sends into another project's run, not even a replay of its batch.
    status, _, text = call(c, "POST", "/api/v1/ingest", {**JSON, **_bearer(vision_w)}, batch("n-run", name="x"))
    assert status == 403 and b"another project" in text, text

    runs = json.loads(call(c, "GET", "/api/v1/runs", _bearer(reader))[2])["runs"]
    assert [(r["id"], r["project"]) for r in runs] == [("v-run", "vision")]
    everything = json.loads(call(c, "GET", "/api/v1/runs", _bearer(TOKEN))[2])["runs"]
    assert {r["id"] for r in everything} == {"v-run", "n-run"}  # the collector's token: every run
    metrics = call(c, "GET", "/metrics", _bearer(reader))[2].decode()
    assert "v-run" in metrics
    assert "n-run" not in metrics
    assert "n-run" in call(c, "GET", "/metrics", _bearer(TOKEN))[2].decode()
    summary = json.loads(call(c, "GET", "/api/v1/runs/v-run/summary", _bearer(reader))[2])
    assert "n-run" not in json.dumps(summary)  # the earlier run of its name is not another project's

    # A browser: ?token= once, then a cookie carrying the token's id, role, projects and expiry.
    status, headers, _ = call(c, "GET", f"/?token={reader}")
    assert status == 303
    cookie = headers["set-cookie"].split(";")[0]
    assert reader not in cookie and cookie.split("=", 1)[1].startswith("p.")
    listed = json.loads(call(c, "GET", "/api/v1/runs", {"Cookie": cookie})[2])["runs"]
    assert [r["id"] for r in listed] == ["v-run"]
    assert call(c, "GET", "/api/v1/runs/n-run/summary", {"Cookie": cookie})[0] == 404
    assert call(c, "GET", "/api/v1/runs/n-run/export?format=csv", {"Cookie": cookie})[0] == 404
    # Every login cookie reads only, an admin token's too: a script in the page deletes nothing.
    admin_cookie = call(c, "GET", f"/?token={_make_token(d, 'admin', 'vision')}")[1]["set-cookie"].split(";")[0]
    assert call(c, "DELETE", "/api/v1/runs/v-run", {"Cookie": admin_cookie, "Origin": f"http://127.0.0.1:{c.port}"})[0] == 403
    assert call(c, "GET", "/api/v1/runs/v-run", {"Cookie": admin_cookie})[0] == 200
    # The dashboard's WebSocket: a read token's cookie opens it, a write token's bearer does not.
    url, origin = f"ws://127.0.0.1:{c.port}/_dash-ws-callback", f"http://127.0.0.1:{c.port}"
    with connect(url, additional_headers={"Cookie": cookie}, origin=origin, open_timeout=10) as ws:
        ws.ping().wait(10)
    with pytest.raises(InvalidStatus) as refused:
        connect(url, additional_headers=_bearer(vision_w), origin=origin, open_timeout=10).close()
    assert refused.value.response.status_code == 403

    # Revoked: the token and its logins are refused from then on.
    token_id = reader.split("_")[1]
    listed = json.loads(_cli(d, "list", "--json"))
    assert {t["id"] for t in listed} >= {token_id} and not any("swt_" in json.dumps(t) for t in listed)
    _cli(d, "revoke", token_id)
    assert call(c, "GET", "/api/v1/runs", _bearer(reader))[0] == 401
    assert call(c, "GET", "/api/v1/runs", _bearer(reader[:-4] + "AAAA"))[0] == 401  # one never made
    assert call(c, "GET", "/api/v1/runs", {"Cookie": cookie})[0] == 401
    assert [t["revoked"] for t in json.loads(_cli(d, "list", "--json")) if t["id"] == token_id] == [True]


def test_a_token_is_never_stored_in_clear(collector):
    c = collector(token=TOKEN)
    tokens = [_make_token(c.directory, role, "vision") for role in ROLES]
    assert call(c, "GET", "/api/v1/runs", _bearer(tokens[1]))[0] == 200
    c.stop()
    stored = b"".join(p.read_bytes() for p in c.directory.glob("starvewatch.db*"))
    import hashlib
    for token in tokens:
        secret = token.rsplit("_", 1)[1]
        assert secret.encode() not in stored and token.encode() not in stored
        assert hashlib.sha256(token.encode()).hexdigest().encode() in stored  # its digest is what is kept


def test_project_tokens_on_postgresql(collector, postgres_url):
    c = collector(token=TOKEN, extra=["--database-url", postgres_url])
    vision_w = _make_token(None, "write", "vision", url=postgres_url)
    nlp_w = _make_token(None, "write", "nlp", url=postgres_url)
    reader = _make_token(None, "read", "nlp", url=postgres_url)
    assert call(c, "POST", "/api/v1/ingest", {**JSON, **_bearer(vision_w)}, batch("pg-v", name="pg-v"))[0] == 200
    assert call(c, "POST", "/api/v1/ingest", {**JSON, **_bearer(nlp_w)}, batch("pg-n", name="pg-n"))[0] == 200
    assert call(c, "POST", "/api/v1/ingest", {**JSON, **_bearer(nlp_w)}, batch("pg-v", seq=3))[0] == 403
    runs = json.loads(call(c, "GET", "/api/v1/runs", _bearer(reader))[2])["runs"]
    assert [(r["id"], r["project"]) for r in runs] == [("pg-n", "nlp")]
    assert call(c, "GET", "/api/v1/runs/pg-v", _bearer(reader))[0] == 404
    assert call(c, "DELETE", "/api/v1/runs/pg-n", _bearer(reader))[0] == 403  # deleting needs admin
    _cli(None, "revoke", reader.split("_")[1], url=postgres_url)
    assert call(c, "GET", "/api/v1/runs", _bearer(reader))[0] == 401


def _dash_call(c, cookie, wanted_output: str, values: dict):
    """A callback request built from the dashboard's own /_dash-dependencies (the one whose
    outputs include `wanted_output`), each input and state given its value from `values`."""
    deps = json.loads(call(c, "GET", "/_dash-dependencies", {"Cookie": cookie})[2])
    dep = next(d for d in deps if wanted_output in d["output"] and not d.get("clientside_function"))
    multi = dep["output"].startswith("..")
    parts = dep["output"].strip(".").split("...") if multi else [dep["output"]]
    outputs = [dict(zip(("id", "property"), p.rsplit(".", 1))) for p in parts]
    request = {"output": dep["output"], "outputs": outputs if multi else outputs[0],
               "inputs": [{**i, "value": values.get(i["id"])} for i in dep["inputs"]],
               "state": [{**s, "value": values.get(s["id"])} for s in dep["state"]],
               "changedPropIds": [f"{dep['inputs'][0]['id']}.{dep['inputs'][0]['property']}"]}
    status, _, body = call(c, "POST", "/_dash-update-component", {**JSON, "Cookie": cookie,
                                                                   "Origin": f"http://127.0.0.1:{c.port}"},
                           json.dumps(request).encode())
    assert status in (200, 204), (status, body[:300])
    return body.decode()


def test_the_dashboards_callbacks_show_a_token_only_its_projects(collector):
    c = collector(token=TOKEN)
    d = c.directory
    for run_id, project in (("seen-run", "vision"), ("hidden-run", "nlp")):
        token = _make_token(d, "write", project)
        assert call(c, "POST", "/api/v1/ingest", {**JSON, **_bearer(token)}, batch(run_id, name=run_id))[0] == 200
    cookie = call(c, "GET", f"/?token={_make_token(d, 'read', 'vision')}")[1]["set-cookie"].split(";")[0]
    runs_table = _dash_call(c, cookie, "runs-container.children", {"runs-version": "x", "runs-page": 0})
    assert "seen-run" in runs_table and "hidden-run" not in runs_table
    compare = _dash_call(c, cookie, "page.children", {"url": "/compare", "search": ""})
    assert "seen-run" in compare and "hidden-run" not in compare
    own = _dash_call(c, cookie, "run-title.children", {"tick": 1, "run-id": "seen-run"})
    assert "seen-run" in own
    other = _dash_call(c, cookie, "run-title.children", {"tick": 1, "run-id": "hidden-run"})
    # Another project's run answers exactly as a run that does not exist (its id only echoed).
    missing = _dash_call(c, cookie, "run-title.children", {"tick": 1, "run-id": "nowhere-run"})
    assert "Unknown run" in other and other == missing.replace("nowhere-run", "hidden-run"), other[:500]
