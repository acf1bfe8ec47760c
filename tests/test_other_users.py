"""Your collector is yours (issue 36 item 2), checked with a real second uid (tests/other_user.py).

Another account of the machine once read a run's command line and deleted runs through the
collector that training had started on loopback without a token. Now a loopback collector
answers only its own user (and root), told apart by the uid owning the client's socket, so
the browser, the notebook's frame and the CLI of the user get in as before; and training sends
nothing, token or record, to whatever holds the port until it proves it holds the user's
collector key (a squatter answering `{"service": "starvewatch"}` gets neither).
"""
import json
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.conftest import free_port
from tests.other_user import run_as_other
from tests.test_security import JSON, call
from tests.test_stored_markup_browser import full_batch

OTHER_CLIENT = r"""
import http.client, json, sys
port = int(sys.argv[1])
out = {}
for method, path in (("GET", "/api/v1/runs"), ("GET", "/api/v1/runs/mine"), ("DELETE", "/api/v1/runs/mine"),
                     ("GET", "/runs/mine"), ("GET", "/metrics"), ("GET", "/healthz")):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request(method, path, headers={"Host": "127.0.0.1:%d" % port})
    r = c.getresponse()
    out[method + " " + path] = [r.status, r.read(2000).decode("utf-8", "replace")]
print(json.dumps(out))
"""


def test_another_local_user_is_refused_and_the_owner_is_served(collector):
    c = collector()
    assert call(c, "POST", "/api/v1/ingest", JSON, json.dumps(full_batch("mine")).encode())[0] == 200
    proc = run_as_other(OTHER_CLIENT, str(c.port))
    assert proc.returncode == 0, proc.stderr
    answers = json.loads(proc.stdout)
    for what, (status, body) in answers.items():
        assert status == 403 and "belongs to another user" in body, (what, status, body)
        assert "train.py" not in body and "markup-run" not in body
    # The owner (here root, as the tests run) is served, the run still there.
    assert c.get("/api/v1/runs/mine")["run"]["name"] == "markup-run"
    assert call(c, "GET", "/runs/mine")[0] == 200


class _Squatter(BaseHTTPRequestHandler):
    """Whoever bound the port first, answering like a collector and keeping what it gets."""
    seen: list = []

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        type(self).seen.append((self.command, self.path, self.headers.get("Authorization"), len(body)))
        data = json.dumps({"service": "starvewatch", "proof": "0" * 64, "stored": True}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


def test_training_sends_nothing_to_a_squatter_on_its_port(isolated_starvewatch, monkeypatch):
    import starvewatch
    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), _Squatter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("STARVEWATCH_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("STARVEWATCH_TOKEN", "my-secret-token-0123456789")
    monkeypatch.setenv("STARVEWATCH_SIDECAR", "0")
    try:
        starvewatch.init("squatted")
        list(starvewatch.watch(range(50), name="train"))
        starvewatch.finish()
    finally:
        server.shutdown()
        server.server_close()
    seen = _Squatter.seen
    assert seen, "training never asked"
    assert all(auth is None for _, _, auth, _ in seen), seen  # never the token
    assert all(method == "GET" and path.startswith("/healthz?challenge=") for method, path, _, _ in seen), seen
    # What training recorded waits in the spool for the user's own collector.
    spooled = list((isolated_starvewatch / "spool").rglob("*.json*"))
    assert spooled, list(isolated_starvewatch.rglob("*"))


def test_training_reads_a_huge_answer_within_a_bound(isolated_starvewatch):
    from starvewatch.hooks.delivery.transport import MAX_ANSWER_BYTES, HttpTransport, TransportError
    port = free_port()
    listener = socket.create_server(("127.0.0.1", port))

    def answer():
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                     % (512 * 2**20))
        chunk = b" " * 2**20
        try:
            for _ in range(512):
                conn.sendall(chunk)
        except OSError:
            pass  # training hung up at the bound
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    import resource
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    transport = HttpTransport(f"http://127.0.0.1:{port}", None, timeout_s=30)
    try:
        transport.request("GET", "/healthz")
    except TransportError as exc:
        assert "answer over" in str(exc)
    else:
        raise AssertionError("a 512 MiB answer was read whole")
    finally:
        listener.close()
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 4 * MAX_ANSWER_BYTES // 1024, grown_kib


def test_the_cli_proves_the_collector_before_it_sends_a_token(collector, isolated_starvewatch):
    import subprocess
    import sys
    c = collector()  # the user's own: its key is in STARVEWATCH_DIR
    env = dict(os.environ, STARVEWATCH_TOKEN="cli-secret-token-0123456789")
    assert call(c, "POST", "/api/v1/ingest", JSON, json.dumps(full_batch("mine")).encode())[0] == 200
    ok = subprocess.run([sys.executable, "-m", "starvewatch", "runs", "--url", c.url], capture_output=True,
                        text=True, timeout=60, env=dict(os.environ))
    assert ok.returncode == 0 and "mine" in ok.stdout, ok.stderr
    port = free_port()
    _Squatter.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", port), _Squatter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out = subprocess.run([sys.executable, "-m", "starvewatch", "runs", "--url", f"http://127.0.0.1:{port}"],
                             capture_output=True, text=True, timeout=60, env=env)
    finally:
        server.shutdown()
        server.server_close()
    assert out.returncode != 0 and "cannot prove it is your collector" in out.stderr, (out.stdout, out.stderr)
    assert _Squatter.seen and all(auth is None for _, _, auth, _ in _Squatter.seen), _Squatter.seen
