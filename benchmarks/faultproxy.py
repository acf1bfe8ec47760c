"""An HTTP proxy in front of a real collector that misbehaves on demand (fault tests and
benchmarks/faults.py): answers slowly, answers 500, or passes requests through unchanged."""
from __future__ import annotations

import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FaultProxy:
    """`mode`: "pass", "slow" (sleep `delay_s`, then pass), "500" (answer 500 at once);
    `max_body`: a smaller body limit than the collector's (413 above it)."""

    def __init__(self, upstream_port: int, delay_s: float = 2.0) -> None:
        self.upstream_port = upstream_port
        self.delay_s = delay_s
        self.mode = "pass"
        self.requests = {"pass": 0, "slow": 0, "500": 0, "413": 0}
        self.max_body: int | None = None  # answer 413 to bodies over this many bytes (as sent)
        self.fail_after: int | None = None  # after this many passed requests, mode becomes "500"
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the hooks' transport uses it

            def log_message(self, *args):
                pass

            def _handle(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if proxy.fail_after is not None and proxy.requests["pass"] >= proxy.fail_after:
                    proxy.mode, proxy.fail_after = "500", None
                mode = proxy.mode
                if proxy.max_body is not None and len(body) > proxy.max_body:
                    proxy.requests["413"] += 1
                    return self._answer(413, b'{"detail": "body over the limit"}', "application/json")
                proxy.requests[mode] += 1
                if mode == "500":
                    return self._answer(500, b'{"detail": "injected fault"}', "application/json")
                if mode == "slow":
                    time.sleep(proxy.delay_s)
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    self._answer(resp.status, data, resp.getheader("Content-Type") or "application/json")
                except OSError:
                    self._answer(502, b'{"detail": "collector unreachable"}', "application/json")
                finally:
                    conn.close()

            def _answer(self, status, data, ctype):
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting
                    self.close_connection = True

            do_GET = do_POST = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="fault-proxy")
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
