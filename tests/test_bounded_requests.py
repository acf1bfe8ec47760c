"""Bounded requests against a real collector: sizes refused before or while reading, gzip bombs,
and a silent body answered 408 while other clients are served (raw sockets: the test controls
every byte and when it is sent)."""
import gzip
import json
import socket
import threading
import time

import pytest

from tests.conftest import Collector, wait_until

LIMIT = 4 * 1024 * 1024
BODY_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # A minimum body rate of 0.5 bytes/s: the slow client below (1 byte/s) stays above it, so
    # what is under test here is the silence timer (the rate is tests/test_front_door.py's).
    c = Collector(tmp_path_factory.mktemp("bounded"), extra=["--body-timeout", str(BODY_TIMEOUT_S),
                                                             "--min-body-rate", "0.5"]).start()
    yield c
    c.stop()


def good_batch(run_id: str, seq: int = 1) -> bytes:
    return json.dumps({
        "schema": "starvewatch.events/1", "run_id": run_id, "stream": f"{run_id}-s", "seq": seq,
        "steps": {"loader": ["train"], "epoch": [0], "step": [seq], "start_ns": [seq], "wait_ns": [5],
                  "compute_ns": [5], "other_ns": [0], "batch_size": [None], "gpu_idle_ns": [None]}}).encode()


def open_request(c, headers: dict, method="POST", path="/api/v1/ingest") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", c.port), timeout=30)
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{c.port}", "Content-Type: application/json"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    return sock


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(head.split(b" ")[1]), body


def store_rows(c) -> int:
    return sum(r["steps"] for r in c.get("/api/v1/runs")["runs"]) + len(c.get("/api/v1/runs")["runs"])


def test_content_length_over_the_limit_is_refused_before_the_body_is_sent(server):
    before = store_rows(server)
    with open_request(server, {"Content-Length": str(LIMIT + 1)}) as sock:
        # Not one byte of the body is sent: the answer cannot have waited for it.
        status, body = read_response(sock)
    assert status == 413 and b"over the limit" in body
    with open_request(server, {"Content-Length": "12abc"}) as sock:
        assert read_response(sock)[0] == 400
    assert store_rows(server) == before and server.healthy()


def test_a_streamed_body_stops_being_read_at_the_limit(server):
    before = store_rows(server)
    with open_request(server, {"Transfer-Encoding": "chunked"}) as sock:
        piece = b"x" * 65536
        for _ in range(LIMIT // len(piece) + 1):  # just past the limit, and no final chunk
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        started = time.monotonic()
        status, body = read_response(sock)
    # Had the server kept reading, it would be waiting for the end of the body (408 after 2 s).
    assert status == 413 and b"over the limit" in body
    assert time.monotonic() - started < BODY_TIMEOUT_S
    assert store_rows(server) == before and server.healthy()


def test_gzip_bombs_and_truncated_gzip_are_refused_whole(server):
    before = store_rows(server)
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    bomb = gzip.compress(b" " * (40 * 1024 * 1024), compresslevel=9)  # 40 MB of spaces in ~40 kB
    assert len(bomb) < LIMIT
    status, text = server.request("POST", "/api/v1/ingest", bomb, headers)
    assert status == 413 and b"decompressed" in text
    whole = gzip.compress(good_batch("truncated-run"))
    status, text = server.request("POST", "/api/v1/ingest", whole[:-12], headers)
    assert status == 400 and b"truncated" in text
    assert store_rows(server) == before and server.healthy()
    assert server.request("POST", "/api/v1/ingest", whole, headers)[0] == 200


def test_a_silent_body_gets_408_while_a_slow_one_and_other_clients_are_served(server):
    body = good_batch("trickled-run")
    slow = open_request(server, {"Content-Length": str(len(body))})
    silent = open_request(server, {"Content-Length": str(len(body))})
    silent.sendall(body[:10])  # ...and then nothing
    silent_sent_at = time.monotonic()
    silent_answer = {}

    def wait_for_silent():
        silent_answer["response"] = read_response(silent)
        silent_answer["after_s"] = time.monotonic() - silent_sent_at

    waiter = threading.Thread(target=wait_for_silent)
    waiter.start()
    # The slow client sends one byte per second, never silent for the whole timeout...
    others_done = []
    for i in range(4):
        slow.sendall(body[i:i + 1])
        # ...and meanwhile other clients' batches are stored at once.
        started = time.monotonic()
        status, answer = server.request("POST", "/api/v1/ingest", good_batch("busy-run", seq=i + 1),
                                        {"Content-Type": "application/json"})
        assert status == 200 and json.loads(answer)["stored"] is True
        others_done.append(time.monotonic() - started)
        time.sleep(1.0)  # the pace of the slow client is what is under test here
    slow.sendall(body[4:])
    assert read_response(slow)[0] == 200
    slow.close()
    waiter.join(30)
    silent.close()
    status, answer = silent_answer["response"]
    assert status == 408 and b"no request data" in answer
    assert BODY_TIMEOUT_S - 0.1 <= silent_answer["after_s"] < BODY_TIMEOUT_S + 5
    assert max(others_done) < BODY_TIMEOUT_S, others_done
    assert server.get("/api/v1/runs/trickled-run/steps")["steps"][0]["step"] == 1
    assert len(server.get("/api/v1/runs/busy-run/steps")["steps"]) == 4
    wait_until(server.healthy, what="the collector to stay healthy")
