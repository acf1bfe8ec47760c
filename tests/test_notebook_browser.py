"""The live run page shown inline by a notebook, in a real headless Chromium: the frame is
allowed for run pages (by a notebook on a loopback origin), reloads once a collector that was
still starting answers, and the rest of the collector still refuses to be framed."""
from __future__ import annotations

import http.server
import threading
import urllib.request

import pytest

from starvewatch.hooks.notebook import run_page_html
from tests.conftest import Collector, free_port, wait_until


@pytest.fixture
def notebook_page_server():
    """Serves one HTML page, as JupyterLab serves a notebook, on http://localhost:PORT/."""
    pages = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = pages.get(self.path, "").encode()
            self.send_response(200 if body else 404)
            self.send_header("content-type", "text/html; charset=utf-8")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], pages
    server.shutdown()
    server.server_close()


def _frame_title(page, frame_url: str) -> str | None:
    page.wait_for_timeout(50)  # Playwright's sync API takes in the browser's events while it waits
    for frame in page.frames:
        if frame.url == frame_url:
            try:
                return frame.evaluate("document.title")
            except Exception:  # the frame is navigating
                return None
    return None


def test_inline_frame_shows_the_run_page_once_the_collector_answers(notebook_page_server, isolated_starvewatch, browser):
    page_port, pages = notebook_page_server
    port = free_port()
    run_url = f"http://127.0.0.1:{port}/runs/nb-run-1"
    home_url = f"http://127.0.0.1:{port}/"
    # The output a cell shows, plus a frame of a page that is not a run page.
    pages["/nb"] = (f"<html><body>{run_page_html(run_url)}"
                    f'<iframe id="home" src="{home_url}"></iframe></body></html>')
    page = browser.new_page()
    page.goto(f"http://localhost:{page_port}/nb")
    # Nothing listens yet (an auto-started collector takes seconds): no run page.
    assert _frame_title(page, run_url) is None
    collector = Collector(isolated_starvewatch, port=port).start()
    try:
        wait_until(lambda: _frame_title(page, run_url) == "starvewatch", timeout_s=30,
                   what="the inline frame showing the run page")
        # Now with the collector up from the start; "load" waits for every frame's load.
        page.reload(wait_until="load")
        wait_until(lambda: _frame_title(page, run_url) == "starvewatch", timeout_s=30,
                   what="the run page framed")
        # Other pages still refuse to be framed: the browser shows its error page.
        assert [f.url for f in page.frames if f.url == home_url] == []
    finally:
        collector.stop()


def test_only_run_pages_may_be_framed_and_by_whom(collector, monkeypatch):
    monkeypatch.setenv("STARVEWATCH_FRAME_ANCESTORS", "https://colab.research.google.com "
                       "https://*.googleusercontent.com javascript: * https: http://a.example/path")
    c = collector()
    with urllib.request.urlopen(f"{c.url}/runs/some-run", timeout=30) as resp:
        status, headers = resp.status, {k.lower(): v for k, v in resp.headers.items()}
    assert status == 200 and "x-frame-options" not in headers
    # The framing rule is the policy's last directive (the script policy comes first, issue 36).
    assert headers["content-security-policy"].endswith(
        "; frame-ancestors 'self' http://localhost:* http://127.0.0.1:* vscode-webview: "
        "https://colab.research.google.com https://*.googleusercontent.com")
    for path in ("/", "/api/v1/runs", "/compare"):  # everything else: never framed
        with urllib.request.urlopen(f"{c.url}{path}", timeout=30) as resp:
            assert resp.headers["x-frame-options"] == "DENY", path
            assert resp.headers["content-security-policy"].endswith("; frame-ancestors 'none'"), path
