"""A streamed export to a client that stops reading (issue 36 item 6): the CSV export's read
transaction once stayed open for as long as the client waited, pinning the WAL (no checkpoint
could finish, the -wal file grew with every batch). Now the answer is cut after the body
timeout, and the WAL can be checkpointed again."""
import socket
import sqlite3
import time

from tests.conftest import wait_until
from tests.test_collector_api import batch
from tests.test_security import JSON, call


def test_a_reader_that_stops_reading_does_not_pin_the_wal(collector):
    import json
    c = collector(extra=["--body-timeout", "3"])
    for i in range(4):  # 200,000 steps: a CSV of ~14 MB, far more than the sockets buffer
        body = json.dumps(batch(run_id="big", stream="s", seq=i + 1, n=50_000, step0=i * 50_000)).encode()
        assert call(c, "POST", "/api/v1/ingest", JSON, body)[0] == 200
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader.connect(("127.0.0.1", c.port))
    reader.sendall(f"GET /api/v1/runs/big/export?format=csv HTTP/1.1\r\nHost: 127.0.0.1:{c.port}\r\n\r\n".encode())
    assert reader.recv(1024).startswith(b"HTTP/1.1 200")  # the export started; then we read no more
    # Writes go on meanwhile, into the WAL.
    body = json.dumps(batch(run_id="other", stream="o", seq=1, n=1000)).encode()
    assert call(c, "POST", "/api/v1/ingest", JSON, body)[0] == 200
    db = next(c.directory.glob("*.db"))
    started = time.monotonic()

    def checkpointed():
        conn = sqlite3.connect(db, timeout=5)
        try:
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            return busy == 0
        finally:
            conn.close()

    # The body timeout (3 s), then the export's transaction is gone (a deadline, not a measure).
    wait_until(checkpointed, timeout_s=40, what="a WAL checkpoint past the stalled export")
    assert time.monotonic() - started >= 1.0  # (it was pinned at first: the reader held it)
    reader.close()
