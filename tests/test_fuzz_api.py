"""Property-based fuzzing of a real `starvewatch serve` (hypothesis).

The ingest body is not in the OpenAPI document, so a schema-driven fuzzer alone would never
reach it: batches are generated in the shape of `EventBatch` and then broken (wrong types,
missing and extra fields, NaN and infinities, huge numbers, deep nesting, unicode, truncated
and oversized gzip). Every other route and method of the OpenAPI document, Dash's endpoints by
name and its WebSocket are fuzzed too. The properties: no 5xx, no crash, a rejected batch
leaves the database exactly as it was, what was accepted can be read back, and the server is
healthy afterwards.

    STARVEWATCH_FUZZ=long python -m pytest -p no:cacheprovider tests/test_fuzz_api.py

The default (`fast`, 25 examples per property, derandomized) is the one CI runs (~30 s); `long`
draws 1,000 fresh examples per property (about 10 minutes on 2 busy cores);
STARVEWATCH_FUZZ_EXAMPLES=N sets any other number.
"""
import gzip
import hashlib
import itertools
import http.client
import json
import math
import os
import sqlite3
from urllib.parse import quote, urlencode

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.conftest import Collector

PROFILE = os.environ.get("STARVEWATCH_FUZZ", "fast")
EXAMPLES = int(os.environ.get("STARVEWATCH_FUZZ_EXAMPLES") or {"fast": 25, "long": 1000}[PROFILE])
pytestmark = pytest.mark.timeout(240 if PROFILE == "fast" else 4 * 3600)
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=PROFILE == "fast",
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])
TABLES = ("runs", "streams", "seen", "loaders", "steps", "step_blocks", "rollups", "phases", "events")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    c = Collector(tmp_path_factory.mktemp("fuzz"), extra=["--body-timeout", "5"]).start()
    yield c
    c.stop()
    log = (c.directory / f"collector-{c.port}.log").read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]


class Client:
    """One keep-alive connection; reopened when the server closes it (after a refusal)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = None

    def call(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            try:
                self.conn.request(method, path, body=body, headers=headers or {})
                resp = self.conn.getresponse()
                data = resp.read()
                if resp.getheader("connection", "").lower() == "close":
                    self.close()
                return resp.status, data
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.close()  # the server closed a kept-alive connection: once more on a new one
                if attempt:
                    raise
            except BaseException:
                self.close()  # interrupted mid-request: the next call must not inherit its state
                raise
        raise AssertionError("unreachable")

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


@pytest.fixture(scope="module")
def client(server):
    c = Client(server.port)
    yield c
    c.close()


def fingerprint(server) -> str:
    """A digest of every row of every table, read from the database file (read-only)."""
    db = sqlite3.connect(f"file:{server.directory / 'starvewatch.db'}?mode=ro", uri=True)
    try:
        digest = hashlib.sha256()
        for table in TABLES:
            for row in sorted(repr(row) for row in db.execute(f"SELECT * FROM {table}")):
                digest.update(row.encode())
        return digest.hexdigest()
    finally:
        db.close()


# ---- strategies ---------------------------------------------------------------------------------
ID_CHARS = st.sampled_from("abcxyz0189_.-:@+=~")
ids = st.text(ID_CHARS, min_size=1, max_size=24).filter(lambda s: set(s) != {"."})
hostile_text = st.one_of(
    st.text(max_size=40),  # any unicode, control characters and NUL included
    st.sampled_from(["../../x", "/etc/passwd", "a\x00b", "x" * 300, "<script>alert(1)</script>", "", ".",
                     "..", "é\u202eevil", "\U0001f600", "%2e%2e/", "a/b"]))
names = st.one_of(st.text(st.characters(min_codepoint=32, blacklist_characters="\x7f"), min_size=1, max_size=30),
                  hostile_text)
# Printable and well-formed: no control character, no lone surrogate (not valid in UTF-8 JSON).
valid_names = names.filter(lambda s: 0 < len(s) <= 200 and not any(
    ord(c) < 32 or c == "\x7f" or 0xD800 <= ord(c) <= 0xDFFF for c in s))
ns = st.integers(0, 2**40)
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                      st.text(max_size=20), st.sampled_from([10**30, -1, 2**63, 2**64, 1e308, -0.0]))
safe_json_values = st.recursive(  # what JSON a well-behaved client sends in a free-form field
    st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=False, allow_infinity=False),
              st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
json_values = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)


@st.composite
def steps_columns(draw, loaders):
    n = draw(st.integers(0, 12))
    col = lambda strategy: [draw(strategy) for _ in range(n)]  # noqa: E731
    return {"loader": col(st.sampled_from(loaders)), "epoch": col(st.integers(0, 5)),
            "step": col(st.integers(0, 10_000)), "start_ns": col(st.integers(1_700_000_000 * 10**9, 1_800_000_000 * 10**9)),
            "wait_ns": col(ns), "compute_ns": col(ns), "other_ns": col(ns),
            "batch_size": col(st.one_of(st.none(), st.integers(1, 512))),
            "gpu_idle_ns": col(st.one_of(st.none(), ns))}


@st.composite
def valid_batches(draw):
    run_id = draw(ids)
    loaders = draw(st.lists(valid_names, min_size=1, max_size=3, unique=True))
    # A stream id is its run's (issue 36): one of another run's is refused, so a valid batch
    # names its stream under its run.
    batch = {"schema": "starvewatch.events/1", "run_id": run_id, "stream": run_id[:63] + "~" + draw(ids)[:63],
             "seq": draw(st.integers(1, 2**31)), "rank": draw(st.integers(0, 7)),
             "status": draw(st.sampled_from(["live", "finished"])),
             "steps": draw(steps_columns(loaders)),
             "loaders": [{"name": name, "kind": "DataLoader",
                          "config": {"num_workers": draw(st.integers(0, 16)), "batch_size": draw(st.integers(1, 64)),
                                     "pin_memory": draw(st.booleans()), "extra": draw(safe_json_values)},
                          "totals": {"steps": draw(st.integers(0, 10**6)), "epochs": draw(st.integers(0, 9)),
                                     "wait_ns": draw(ns), "compute_ns": draw(ns), "samples": draw(st.integers(0, 10**7))}}
                         for name in loaders]}
    if draw(st.booleans()):
        batch["run"] = {"id": run_id, "name": draw(valid_names),
                        "started_at": draw(st.floats(0, 2e9)), "world_size": draw(st.integers(1, 8)),
                        "argv": draw(st.lists(st.text(max_size=10), max_size=3))}
    if draw(st.booleans()):
        batch["samples"] = [{"kind": "host", "t_ns": 1_700_000_000 * 10**9, "cpu_pct": draw(st.floats(0, 100)),
                             "mem_total_bytes": draw(st.integers(0, 2**40))},
                            {"kind": "gpu", "devices": [{"name": draw(valid_names), "gpu_util_pct": draw(st.floats(0, 100))}]}]
    if draw(st.booleans()):
        batch["workers"] = [{"loader": loaders[0], "configured_workers": 2, "alive_workers": 1, "queue_depth": 1.5,
                             "workers": [{"id": 0, "pid": 12, "state": draw(valid_names), "batches": 3, "load_ms_mean": 2.5}]}]
    if draw(st.booleans()):
        batch["stalls"] = [{"loader": loaders[0], "started_ns": 1_700_000_000 * 10**9, "ended_ns": None,
                            "wait_s": draw(st.floats(0, 1e6)), "step": 3, "epoch": 0, "workers": []}]
    return batch


def _paths(obj, prefix=()):
    yield prefix
    if len(prefix) > 12:
        return  # inside a deep nesting made by an earlier mutation
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


@st.composite
def broken_batches(draw):
    """A valid batch with one to three things broken."""
    batch = draw(valid_batches())
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(batch) if p]
        path = draw(st.sampled_from(paths))
        parent = batch
        for key in path[:-1]:
            parent = parent[key]
        how = draw(st.sampled_from(["delete", "replace", "extra", "hostile", "deep", "huge"]))
        if how == "delete":
            del parent[path[-1]]
        elif how == "replace":
            parent[path[-1]] = draw(json_values)
        elif how == "extra" and isinstance(parent, dict):
            parent[draw(st.text(max_size=10))] = draw(json_values)
        elif how == "hostile":
            parent[path[-1]] = draw(hostile_text)
        elif how == "deep":
            value = 0
            for _ in range(draw(st.integers(50, 3000))):
                value = [value]
            parent[path[-1]] = value
        else:
            parent[path[-1]] = draw(st.sampled_from([10**40, -10**40, 2**63, 2**64, math.inf, -math.inf, math.nan, 1e308]))
    return batch


BOMB = gzip.compress(b"[" + b" " * (33 * 1024 * 1024) + b"]", compresslevel=6)  # 33 MB of JSON in ~33 kB
# Under both size limits, but 4 million values in a free-form field of a sample (issue 27).
EXPANDING = gzip.compress(b'{"schema": "starvewatch.events/1", "run_id": "x", "stream": "x", "seq": 1, '
                          b'"samples": [{"kind": "host", "junk": [' + b"{}," * 4_000_000 + b'{}]}]}', compresslevel=6)


def encode(batch) -> bytes:
    import sys
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)  # deep nesting is part of what is sent
    try:
        return json.dumps(batch, allow_nan=True).encode("utf-8", "surrogatepass")
    finally:
        sys.setrecursionlimit(limit)


@st.composite
def wire(draw, batches):
    """(body, headers) of an ingest request: plain or gzip, sometimes truncated or a bomb."""
    body = encode(draw(batches))
    headers = {"Content-Type": draw(st.sampled_from(["application/json"] * 8 + ["application/json; charset=utf-8",
                                                                                  "text/plain", ""]))}
    how = draw(st.sampled_from(["plain"] * 4 + ["gzip"] * 3 + ["truncated", "bomb", "garbage-gzip", "bad-encoding",
                                                                "expanding"]))
    if how == "gzip":
        body = gzip.compress(body, compresslevel=1)
    elif how == "truncated":
        whole = gzip.compress(body, compresslevel=1)
        body = whole[:draw(st.integers(0, len(whole) - 1))]
    elif how == "bomb":
        body = BOMB
    elif how == "expanding":
        body = EXPANDING
    elif how == "garbage-gzip":
        body = draw(st.binary(max_size=64))
    if how in ("gzip", "truncated", "bomb", "garbage-gzip", "expanding"):
        headers["Content-Encoding"] = "gzip"
    elif how == "bad-encoding":
        headers["Content-Encoding"] = draw(st.sampled_from(["br", "deflate", "x" * 50, "gzip, gzip"]))
    return body, headers


def check_readable(client, run_id: str) -> None:
    """An accepted batch can be read back by every view (a 500 here is a crash waiting for a user)."""
    segment = quote(run_id, safe="")
    for path in (f"/api/v1/runs/{segment}", f"/api/v1/runs/{segment}/summary", "/api/v1/runs",
                 f"/api/v1/runs/{segment}/series", f"/api/v1/runs/{segment}/steps",
                 f"/api/v1/runs/{segment}/events/stalls", f"/api/v1/runs/{segment}/export?format=md",
                 f"/api/v1/runs/{segment}/export?format=csv", "/metrics"):
        status, text = client.call("GET", path)
        assert status == 200, (path, status, text[:500])


def ingest_and_check(server, client, body, headers, expect_valid: bool) -> None:
    before = fingerprint(server)
    status, text = client.call("POST", "/api/v1/ingest", body, headers)
    assert status < 500, (status, text[:500])
    if status == 200:
        answer = json.loads(text)
        if answer["stored"]:  # not a replay of a (stream, seq) already stored
            check_readable(client, answer["run_url"].rsplit("/", 1)[1])
    else:
        assert b"detail" in text, text[:200]
        assert fingerprint(server) == before, "a rejected batch changed the database"
    if expect_valid:
        assert status == 200, (status, text[:500])


# ---- the properties -----------------------------------------------------------------------------
# Valid, and found by this test under load: ~18 min of waiting per step against 1 ns of compute
# sized ~10^12 workers, and the summary predicted each count: its GET never answered.
SLOW_LOADING = {"schema": "starvewatch.events/1", "run_id": "slow-loading", "stream": "slow-loading~0", "seq": 1,
                "rank": 0, "status": "live",
                "steps": {"loader": ["train"] * 12, "epoch": [0] * 12, "step": list(range(12)),
                          "start_ns": [1_700_000_000 * 10**9 + i * 10**12 for i in range(12)],
                          "wait_ns": [2**40] * 12, "compute_ns": [1] * 12, "other_ns": [0] * 12,
                          "batch_size": [5] * 12, "gpu_idle_ns": [None] * 12},
                "loaders": [{"name": "train", "kind": "DataLoader",
                             "config": {"num_workers": 2, "batch_size": 5, "pin_memory": False},
                             "totals": {"steps": 1000, "epochs": 1, "wait_ns": 1000 * 2**40, "compute_ns": 1000,
                                        "samples": 5000}}]}


@FUZZ
@given(batch=valid_batches())
@example(batch=SLOW_LOADING)
def test_valid_batches_are_stored_and_readable(server, client, batch):
    ingest_and_check(server, client, encode(batch), {"Content-Type": "application/json"}, expect_valid=True)


@FUZZ
@given(request=wire(broken_batches()))
def test_broken_batches_never_5xx_and_never_write_partially(server, client, request):
    body, headers = request
    ingest_and_check(server, client, body, headers, expect_valid=False)


# Invisible characters (controls, bidi and zero-width format characters, line separators,
# private use): cleaned on the way in, never a reason to refuse a run (issue 27).
hidden_text = st.text(st.characters(categories=["Cc", "Cf", "Zl", "Zp", "Co"]), min_size=1, max_size=5)
_fresh = itertools.count()


@FUZZ
@given(batch=valid_batches(), noise=hidden_text)
def test_invisible_characters_in_names_are_cleaned_never_refused(server, client, batch, noise):
    from starvewatch.ids import HIDDEN_CATEGORIES
    import unicodedata
    batch["run"] = {"id": batch["run_id"], "name": f"a{noise}b{noise}"}
    batch["stream"] = f"invisible-{next(_fresh)}"  # never a replay: this batch is stored
    status, text = client.call("POST", "/api/v1/ingest", encode(batch), {"Content-Type": "application/json"})
    assert status == 200, (status, text[:500])
    status, text = client.call("GET", f"/api/v1/runs/{quote(batch['run_id'], safe='')}")
    assert status == 200
    shown = json.loads(text)["run"]["name"]
    assert not any(unicodedata.category(c) in HIDDEN_CATEGORIES for c in shown), repr(shown)


# (name, value) of a header line; a value is bytes, or a length of filler (kept short in reports).
header_lines = st.one_of(
    st.tuples(st.just(b""), st.binary(max_size=80)),
    st.tuples(st.binary(min_size=1, max_size=10).filter(lambda b: b":" not in b),
              st.one_of(st.sampled_from([b"b" * 10, b"\x00\xff", b"\r", b""]),
                        st.sampled_from([70_000, 300_000]))))


def _header_line(name: bytes, value) -> bytes:
    if not name:
        return value  # a raw line, perhaps not a header at all
    return b"X-" + name + b": " + (b"a" * value if isinstance(value, int) else value)


@FUZZ
@given(lines=st.lists(header_lines, max_size=6), finish=st.booleans())
def test_garbage_and_oversized_headers_never_5xx(server, client, lines, finish):
    import socket
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        head = b"GET /api/v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"".join(
            _header_line(*line) + b"\r\n" for line in lines)
        answer = b""
        try:  # the server may answer 400 and close while the headers are still being sent
            sock.sendall(head + (b"\r\n" if finish else b""))
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        try:
            answer = sock.recv(64)
        except OSError:  # reset: closed without an answer
            pass
    if answer:
        status = int(answer.split(b" ")[1])
        assert status < 500, answer
    assert server.healthy()


def test_huge_integers_in_any_integer_field_are_refused_whole(server, client):
    """Found by the long profile: a sequence number past 64 bits reached SQLite (a 500)."""
    base = {"schema": "starvewatch.events/1", "run_id": "huge", "stream": "huge-s", "seq": 1,
            "steps": {"loader": ["t"], "epoch": [0], "step": [0], "start_ns": [1], "wait_ns": [1],
                      "compute_ns": [1], "other_ns": [0], "batch_size": [None], "gpu_idle_ns": [None]}}
    for path in (("seq",), ("rank",), ("steps", "step", 0), ("steps", "start_ns", 0), ("steps", "wait_ns", 0),
                 ("steps", "batch_size", 0), ("sent_at_ns",)):
        for value in (2**63, 2**64, 10**40):
            batch = json.loads(json.dumps(base))
            parent = batch
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = value
            ingest_and_check(server, client, encode(batch), {"Content-Type": "application/json"}, expect_valid=False)
            assert client.call("GET", "/api/v1/runs/huge")[0] == 404, (path, value)


def _openapi(client):
    status, text = client.call("GET", "/api/openapi.json")
    assert status == 200
    doc = json.loads(text)
    ops = []
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            params = [(p["name"], p["in"]) for p in op.get("parameters", [])]
            ops.append((method.upper(), path, params))
    return ops


param_values = st.one_of(st.text(max_size=30), st.integers(-2**70, 2**70).map(str),
                         st.sampled_from(["", "latest", "../..", "%00", "train", "samples", "csv", "html", "live",
                                          "nan", "inf", "-1", "1e400", "0x10", " 1"]))


@FUZZ
@given(data=st.data())
def test_every_openapi_route_and_method_answers_without_5xx(server, client, data):
    ops = _openapi(client)
    method, path, params = data.draw(st.sampled_from(ops))
    method = data.draw(st.sampled_from([method, method, "PUT", "PATCH", "POST", "DELETE", "GET"]))
    concrete, query = path, {}
    for name, where in params:
        value = data.draw(param_values)
        if where == "path":
            concrete = concrete.replace("{%s}" % name, quote(value, safe="") or "x")
        elif data.draw(st.booleans()):
            query[name] = value
    if data.draw(st.booleans()):
        query[data.draw(st.text(max_size=8))] = data.draw(param_values)
    target = concrete + ("?" + urlencode(query) if query else "")
    body = data.draw(st.one_of(st.none(), st.binary(max_size=200), json_values.map(lambda v: encode(v))))
    status, text = client.call(method, target, body, {"Content-Type": "application/json"} if body else {})
    assert status < 500, (method, target, status, text[:500])


@pytest.fixture(scope="module")
def dash_callbacks(client):
    status, text = client.call("GET", "/_dash-dependencies")
    assert status == 200
    return [c for c in json.loads(text) if not c.get("clientside_function")]


def _spec(dep: str) -> dict:
    component, prop = dep.rsplit(".", 1)
    return {"id": component, "property": prop}


@FUZZ
@given(data=st.data())
def test_dash_endpoints_answer_without_5xx(server, client, dash_callbacks, data):
    for path in ("/_dash-layout", "/_dash-dependencies", "/", "/runs/" + quote(data.draw(hostile_text), safe="")):
        assert client.call("GET", path)[0] < 500, path
    cb = data.draw(st.sampled_from(dash_callbacks))
    broken = data.draw(st.sampled_from(["intact", "intact", "intact", "drop", "replace", "garbage"]))
    # An intact request is valid JSON (no NaN): its values are still anything a client may send.
    values = safe_json_values if broken == "intact" else json_values
    outputs = cb["output"].strip(".").split("...")
    request = {"output": cb["output"],
               "outputs": [_spec(o) for o in outputs] if cb["output"].startswith("..") else _spec(outputs[0]),
               "inputs": [dict(_spec(f"{i['id']}.{i['property']}"), value=data.draw(values)) for i in cb["inputs"]],
               "state": [dict(_spec(f"{s['id']}.{s['property']}"), value=data.draw(values)) for s in cb["state"]],
               "changedPropIds": [f"{i['id']}.{i['property']}" for i in cb["inputs"]]}
    if broken == "drop":
        request.pop(data.draw(st.sampled_from(sorted(request))))
    elif broken == "replace":
        request[data.draw(st.sampled_from(sorted(request)))] = data.draw(json_values)
    body = data.draw(st.binary(max_size=100)) if broken == "garbage" else encode(request)
    status, text = client.call("POST", "/_dash-update-component", body, {"Content-Type": "application/json"})
    assert status < 500, (broken, status, text[:500], body[:300])
    if broken == "intact":
        assert status in (200, 204), (status, text[:500])


GARBAGE_FRAMES = [b"\x00\xff", "not json", "[]", "{}", "[" * 5000, json.dumps({"type": "callback_request"}),
                  json.dumps({"type": "callback_request", "requestId": "1", "payload": {"output": "page.children"}}),
                  json.dumps({"type": "callback_request", "requestId": "1", "payload": []}), "x" * 100_000]


@FUZZ
@given(frames=st.lists(st.one_of(st.sampled_from(GARBAGE_FRAMES), st.binary(max_size=50), st.text(max_size=50),
                                 json_values.map(json.dumps)), min_size=1, max_size=4))
def test_the_dash_websocket_closes_on_garbage_and_stays_available(server, client, frames):
    url = f"ws://127.0.0.1:{server.port}/_dash-ws-callback"
    with connect(url, origin=server.url, open_timeout=10, close_timeout=5) as ws:
        ws.send(json.dumps({"type": "heartbeat"}))
        assert json.loads(ws.recv(timeout=10))["type"] == "heartbeat_ack"  # the renderer's protocol works
        with pytest.raises(ConnectionClosed) as closed:
            for frame in frames:
                ws.send(frame)
            ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    assert server.healthy()


def test_the_server_is_healthy_after_the_fuzzing(server, client):
    assert server.healthy()
    status, text = client.call("GET", "/api/v1/runs")
    assert status == 200 and json.loads(text)["runs"]
