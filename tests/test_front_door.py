"""Before the token: what a stranger on the network can make one collector hold or keep open
(issue 27, item 1), and errors that are answers (item 6). A real `serve`, raw sockets: the test
decides every byte and when it is sent."""
import json
import socket
import sqlite3
import threading
import time

import pytest

from benchmarks.procfs import peak_rss_bytes
from tests.conftest import Collector, wait_until

TOKEN = "front-door-token-0123456789"

def closed_after(sock: socket.socket, limit_s: float) -> float:
    """Seconds until the server closes `sock` (reads and drops whatever it answers first)."""
    started = time.monotonic()
    sock.settimeout(limit_s)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - started


def healthy_with_token(c) -> bool:
    return c.get("/healthz")["service"] == "starvewatch"


@pytest.fixture
def strict_collector(collector):
    return collector(token=TOKEN, extra=["--header-timeout", "1.5", "--keep-alive-timeout", "1",
                                         "--body-timeout", "1.5", "--min-body-rate", "200"])


def test_unfinished_giant_headers_from_8_connections_cost_little_memory_and_no_token(collector):
    c = collector(token=TOKEN)
    healthy_with_token(c)
    before = peak_rss_bytes(c.proc.pid)
    sent = [0] * 8
    closed_by_server = [False] * 8

    def attack(i):
        # 32 MiB of one header line that never ends, without a token.
        with socket.create_connection(("127.0.0.1", c.port), timeout=30) as sock:
            sock.sendall(b"GET /api/v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Fill: ")
            piece = b"a" * 65536
            try:
                while sent[i] < 32 * 2**20:
                    sock.sendall(piece)
                    sent[i] += len(piece)
            except (BrokenPipeError, ConnectionResetError):
                closed_by_server[i] = True

    threads = [threading.Thread(target=attack, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    served_meanwhile = healthy_with_token(c)  # a normal client, while the attack is under way
    for t in threads:
        t.join(120)
    grown = peak_rss_bytes(c.proc.pid) - before
    assert served_meanwhile
    assert all(closed_by_server), (closed_by_server, sent)  # cut off, not read to the end
    assert max(sent) < 32 * 2**20
    assert grown < 32 * 2**20, f"the collector grew by {grown / 2**20:.1f} MiB"
    assert healthy_with_token(c)
    log = (c.directory / f"collector-{c.port}.log").read_text()
    assert log.count("Invalid HTTP request received") == 1  # the first of 8, then quiet for a minute


def test_idle_half_header_keepalive_and_dripping_connections_are_closed_in_time(strict_collector):
    c = strict_collector
    idle = socket.create_connection(("127.0.0.1", c.port))
    half = socket.create_connection(("127.0.0.1", c.port))
    half.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    kept = socket.create_connection(("127.0.0.1", c.port))
    kept.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
    assert kept.recv(65536).startswith(b"HTTP/1.1 200")
    results = {}
    threads = [threading.Thread(target=lambda n=n, s=s: results.__setitem__(n, closed_after(s, 30)))
               for n, s in (("idle", idle), ("keep-alive", kept))]
    for t in threads:
        t.start()

    # A header dripped one byte at a time is still cut at the header timeout.
    started = time.monotonic()
    try:
        while time.monotonic() - started < 10:
            half.sendall(b"x")
            time.sleep(0.2)  # the drip's pace is what is under test
    except (BrokenPipeError, ConnectionResetError):
        pass
    results["half-header"] = time.monotonic() - started

    # A body dripped at 5 bytes/s (never silent for the 1.5 s body timeout) gets 408.
    drip = socket.create_connection(("127.0.0.1", c.port), timeout=30)
    drip.sendall(f"POST /api/v1/ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: 5000\r\n\r\n".encode())
    started, answer = time.monotonic(), b""
    drip.setblocking(False)
    while time.monotonic() - started < 15 and not answer:
        try:
            drip.sendall(b" ")
            answer = drip.recv(65536)
        except BlockingIOError:
            pass
        except (BrokenPipeError, ConnectionResetError):
            break
        time.sleep(0.2)  # the drip's pace is what is under test
    results["drip"] = time.monotonic() - started
    assert healthy_with_token(c)  # normal clients are served meanwhile
    for t in threads:
        t.join(30)
    assert answer.startswith(b"HTTP/1.1 408") and b"slower than 200 bytes/s" in answer, answer[:300]
    # Each is closed after its timeout (not before), with slack for a loaded machine.
    assert 1.4 <= results["idle"] < 6, results
    assert 0.9 <= results["keep-alive"] < 6, results
    assert 1.4 <= results["half-header"] < 6, results
    assert 1.4 <= results["drip"] < 7, results
    for s in (idle, half, kept, drip):
        s.close()


def test_connections_beyond_the_cap_are_closed_at_once_and_the_cap_frees_up(collector):
    c = collector(token=TOKEN, extra=["--max-connections", "4", "--header-timeout", "60"])
    held = [socket.create_connection(("127.0.0.1", c.port)) for _ in range(4)]
    # The server counts a connection once it has accepted it: wait until the fifth is refused.
    def fifth_refused():
        extra = socket.create_connection(("127.0.0.1", c.port))
        try:
            return closed_after(extra, 5) < 2
        finally:
            extra.close()
    wait_until(fifth_refused, timeout_s=20, what="a fifth connection to be closed at once")
    for sock in held:
        sock.close()
    wait_until(lambda: c.request("GET", "/healthz")[0] == 200, timeout_s=20, what="room for a new client")


# ---- item 6: errors are answers ------------------------------------------------------------

def _int_query_params(c) -> list[tuple[str, str]]:
    doc = c.get("/api/openapi.json")
    found = []
    for path, methods in doc["paths"].items():
        for op in methods.values():
            for p in op.get("parameters", []):
                schema = p.get("schema", {})
                types = [schema.get("type")] + [s.get("type") for s in schema.get("anyOf", [])]
                if p["in"] == "query" and "integer" in types:
                    found.append((path, p["name"]))
    return found


def test_out_of_range_integers_in_any_query_parameter_are_422_with_the_security_headers(collector):
    c = collector()
    params = _int_query_params(c)
    assert {"rank", "after", "since_ns", "limit", "points"} <= {name for _, name in params}, params
    for path, name in params:
        concrete = path.replace("{run_id}", "r").replace("{kind}", "samples")
        for value in (2**63, 10**30, -(2**63) - 1):
            conn = socket.create_connection(("127.0.0.1", c.port), timeout=30)
            conn.sendall(f"GET {concrete}?{name}={value} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         f"Connection: close\r\n\r\n".encode())
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
            conn.close()
            head = data.split(b"\r\n\r\n")[0].lower()
            assert data.startswith(b"HTTP/1.1 422"), (path, name, value, data[:300])
            assert b"x-frame-options: deny" in head and b"x-content-type-options: nosniff" in head
    log = (c.directory / f"collector-{c.port}.log").read_text()
    assert "Traceback" not in log and "OverflowError" not in log


def test_an_internal_error_is_a_500_with_the_security_headers_and_a_short_log(collector):
    c = collector()
    body = json.dumps({"schema": "starvewatch.events/1", "run_id": "broken", "stream": "s", "seq": 1,
                       "run": {"id": "broken", "name": "broken"}}).encode()
    assert c.request("POST", "/api/v1/ingest", body, {"Content-Type": "application/json"})[0] == 200
    # A damaged row (as a disk error or a hand edit would leave): reading it fails inside.
    with sqlite3.connect(c.directory / "starvewatch.db") as db:
        db.execute("INSERT INTO tunings VALUES ('broken', 1.0, 'not json {')")
    for _ in range(3):
        conn = socket.create_connection(("127.0.0.1", c.port), timeout=30)
        conn.sendall(b"GET /api/v1/runs/broken/tuning HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
        conn.close()
        head, _, text = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 500"), data[:300]
        assert b"x-frame-options: DENY" in head and b"content-security-policy:" in head
        assert json.loads(text)["detail"].startswith("internal error")
    assert c.healthy()
    log = (c.directory / f"collector-{c.port}.log").read_text()
    assert log.count("internal error on GET '/api/v1/runs/broken/tuning'") == 3
    assert log.count("Traceback") == 1  # one traceback per kind of error, then one line each


def test_a_client_leaving_mid_body_is_one_log_line(collector):
    c = collector()
    log_path = c.directory / f"collector-{c.port}.log"
    before = log_path.read_text().count("\n")
    sock = socket.create_connection(("127.0.0.1", c.port), timeout=30)
    sock.sendall(b"POST /api/v1/ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n{\"schema\":")
    wait_until(lambda: c.request("GET", "/healthz")[0] == 200, what="the request to be under way")
    sock.close()
    wait_until(lambda: "disconnected before sending the whole body" in log_path.read_text(),
               what="the disconnect to be logged")
    assert c.healthy()
    new_lines = log_path.read_text().splitlines()[before:]
    assert len(new_lines) == 1 and "Traceback" not in log_path.read_text(), new_lines


def test_the_api_page_loads_nothing_from_another_origin(collector):
    c = collector()
    status, page = c.request("GET", "/api/docs")
    assert status == 200 and b"/api/v1/ingest" in page and b"/api/openapi.json" in page
    assert b"<script" not in page and b"http://" not in page and b"https://" not in page
