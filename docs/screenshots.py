"""Regenerate the dashboard's screenshots in docs/ from a real demo: dashboard-run.png and
dashboard-compare.png (Reading the dashboard), and the tutorial's (Your first 10 minutes):
tutorial-runs.png, tutorial-answer.png, tutorial-compare.png.

Starts a collector on a free loopback port in a temporary directory, runs `starvewatch demo
--quick` against it, and opens the pages a new user would: the list of runs, the starved run's
page (the answer) and the compare link the demo prints. Needs Chromium at /usr/bin/chromium (or
CHROMIUM=...).

    python docs/screenshots.py
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

DOCS = Path(__file__).resolve().parent
SHOTS = ("dashboard-run.png", "dashboard-compare.png", "tutorial-runs.png", "tutorial-answer.png",
         "tutorial-compare.png")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the collector exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("the collector did not answer")


def main() -> int:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = dict(os.environ, STARVEWATCH_DIR=str(Path(tmp) / "sw"), STARVEWATCH_AUTOSTART="0",
                   STARVEWATCH_URL=url, STARVEWATCH_QUIET="1")
        collector = subprocess.Popen([sys.executable, "-m", "starvewatch", "serve", "--port", str(port),
                                      "--dir", str(Path(tmp) / "collector")], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_healthy(url, collector)
            demo = subprocess.run([sys.executable, "-m", "starvewatch", "demo", "--quick"], env=env,
                                  capture_output=True, text=True, timeout=600)
            if demo.returncode != 0:
                raise SystemExit(demo.stderr[-2000:])
            compare = re.search(r"compare before and after: (\S+/compare\?a=(\S+)&b=\S+)", demo.stdout)
            if compare is None:
                raise SystemExit("the demo printed no compare link:\n" + demo.stdout)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"),
                                            args=["--no-sandbox", "--disable-gpu"])
                page = browser.new_page(viewport={"width": 1300, "height": 900})
                page.goto(url + "/")
                page.wait_for_selector("#runs-table td", timeout=60_000)
                page.set_viewport_size({"width": 1300, "height": 420})
                page.screenshot(path=str(DOCS / "tutorial-runs.png"))
                page.set_viewport_size({"width": 1300, "height": 900})
                page.goto(f"{url}/runs/{compare.group(2)}")
                page.wait_for_selector("#top-change", timeout=60_000)
                page.wait_for_selector("#histogram-graph .js-plotly-plot .bars", timeout=60_000)
                page.locator("#answer").screenshot(path=str(DOCS / "tutorial-answer.png"))
                page.screenshot(path=str(DOCS / "dashboard-run.png"), full_page=True)
                page.set_viewport_size({"width": 1300, "height": 560})
                page.goto(compare.group(1))
                page.wait_for_selector("#verify-table", timeout=60_000)
                page.screenshot(path=str(DOCS / "dashboard-compare.png"), full_page=True)
                page.screenshot(path=str(DOCS / "tutorial-compare.png"))
                browser.close()
        finally:
            collector.terminate()
            collector.wait(20)
    print(f"wrote {', '.join(SHOTS)} in {DOCS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
