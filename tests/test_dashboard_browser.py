"""End to end in a real headless Chromium against a real collector fed by a real training loop."""
import json
import re
import os
import subprocess
import sys

from tests.browser import POLLING_OPTIONS, page_with_errors

TRAINING = r"""
import os, sys, time, torch, starvewatch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 10_000
    def __getitem__(self, i):
        time.sleep(0.003)
        return torch.zeros(4)

stop, deadline = sys.argv[1], time.monotonic() + 90
loader = starvewatch.watch(DataLoader(Slow(), batch_size=4, num_workers=0))
for _ in loader:
    time.sleep(0.004)
    if os.path.exists(stop) or time.monotonic() > deadline:
        break
starvewatch.finish()
"""


def test_live_run_page_updates_recommends_and_exports(collector, browser, tmp_path):
    c = collector()
    stop = tmp_path / "stop"
    env = dict(os.environ, STARVEWATCH_URL=c.url, STARVEWATCH_RUN_NAME="browser-live")
    proc = subprocess.Popen([sys.executable, "-c", TRAINING, str(stop)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        page, errors = page_with_errors(browser, height=1600, accept_downloads=True, **POLLING_OPTIONS)
        page.goto(c.url + "/")
        page.wait_for_selector("#runs-table >> text=browser-live", timeout=30_000)
        page.click("#runs-table >> text=browser-live")
        page.wait_for_selector("#kpi-steps .value", timeout=30_000)
        first = page.inner_text("#kpi-steps .value")
        # KPIs change while it trains: the page polls, the server answers with new data.
        page.wait_for_function(f"document.querySelector('#kpi-steps .value').innerText !== '{first}'",
                               timeout=30_000)  # a poll a second; the shared 2-core VM can take longer
        page.wait_for_selector("#recommendations >> text=num_workers=", timeout=30_000)
        # The band in the one vocabulary: "input-bound" is the high band's word.
        assert page.inner_text("#kpi-verdict").splitlines()[-1].strip() == "input-bound"
        assert page.locator("#timeline-graph .js-plotly-plot").count() == 1
        page.screenshot(path=str(tmp_path / "run-page.png"), full_page=True)
        with page.expect_download() as info:
            page.click("#export-json")
        summary = json.loads(info.value.path().read_text())
        assert summary["schema"] == "starvewatch.summary/2" and summary["run"]["name"] == "browser-live"
        assert summary["recommendations"][0]["parameter"] == "num_workers"
        with page.expect_download() as info:
            page.click("#export-csv")
        assert info.value.path().read_text().startswith("run,rank,loader,epoch,step")
        assert errors == []
    finally:
        stop.write_text("stop")
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr


def test_exported_html_report_opens_offline_with_its_charts(collector, browser, tmp_path, monkeypatch):
    import starvewatch
    c = collector()
    monkeypatch.setenv("STARVEWATCH_URL", c.url)
    for _ in starvewatch.watch(range(200)):
        pass
    run_id = starvewatch.finish()["run"]["id"]
    report = tmp_path / "report.html"
    out = subprocess.run([sys.executable, "-m", "starvewatch", "export", run_id, "-f", "html", "-o", str(report)],
                         capture_output=True, text=True, timeout=120, env=dict(os.environ, STARVEWATCH_URL=c.url))
    assert out.returncode == 0, out.stderr
    page, errors = page_with_errors(browser, height=1600, accept_downloads=True)
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(report.as_uri())
    page.wait_for_selector(".js-plotly-plot .main-svg", timeout=30_000)
    assert page.locator(".js-plotly-plot").count() >= 4
    assert "starvewatch report" in page.inner_text("h1")
    assert all(u.startswith(("file:", "data:", "blob:")) for u in requests), requests  # no CDN
    # It opens as the dashboard's run page does: the title, then the verdict box, then the rest.
    order = page.evaluate("['h1', '#answer', 'h2'].map(s => document.querySelector(s).getBoundingClientRect().top)")
    assert order == sorted(order), order
    from starvewatch.analysis.answer_text import verdict_sentence  # the dashboard's answer card says it too
    assert page.inner_text("#verdict-sentence") == verdict_sentence(c.get(f"/api/v1/runs/{run_id}/summary"))
    # Lists are lists (no literal "- " before a line), times are read to the second, in UTC.
    text = page.inner_text("body").split("\nCharts\n", 1)[0]  # the summary, not the charts' axes
    assert not [line for line in text.splitlines() if line.lstrip().startswith("- ")], text[:2000]
    assert page.locator("li").count() >= 3
    assert re.search(r"started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, ended \d{4}-", text), text[:1000]
    assert not re.search(r"\d\d:\d\d:\d\d\.\d+", text)  # no microseconds
    assert errors == []


def test_dashboard_is_behind_the_token(collector, browser):
    c = collector(token="tok-123")
    page, errors = page_with_errors(browser, height=1600, accept_downloads=True)
    response = page.goto(c.url + "/")
    assert response.status == 401
    page.goto(c.url + "/?token=tok-123")  # logs in once: a cookie from then on
    page.wait_for_selector("#runs-container", timeout=30_000)
    assert "token" not in page.url
    page.goto(c.url + "/compare")
    page.wait_for_selector("#compare-result", timeout=30_000)
    assert [e for e in errors if "401" not in e] == []


TWO_RUNS = r"""
import sys, time, torch, starvewatch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __init__(self, n):
        self.n = n
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        time.sleep(1.0 if i == 50 else 0.004)  # one batch takes far longer than the others
        return torch.zeros(4)

def train(items, workers):
    starvewatch.init(sys.argv[1])
    loader = DataLoader(Slow(items), batch_size=2, num_workers=workers, persistent_workers=workers > 0)
    for _ in starvewatch.watch(loader, name="train"):
        time.sleep(0.003)
    return starvewatch.finish()["run"]["id"]

before = train(120, 0)
after = train(400, 2)
print(before, after)
"""

# No JSON object or array anywhere in a page's text: `{"`, `{'`, `["`, `": `.
RAW_JSON = re.compile(r"""[{\[]\s*["']|["']\s*:\s""")


def _plotly(page, graph_id: str) -> dict:
    """The figure as plotly drew it (data and layout) from the page."""
    return page.evaluate(f"""() => {{
        const el = document.querySelector('#{graph_id} .js-plotly-plot');
        return {{data: el.data.map(t => ({{name: t.name, y: t.y}})), layout: el.layout,
                 range: el._fullLayout.xaxis.range}};
    }}""")


def test_run_page_answers_first_and_links_to_its_comparison(collector, browser, tmp_path):
    c = collector()
    env = dict(os.environ, STARVEWATCH_URL=c.url, STARVEWATCH_HOST_INTERVAL_S="0.1")
    out = subprocess.run([sys.executable, "-c", TWO_RUNS, "browser-compare"], env=env, capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    before, after = out.stdout.split()
    context = browser.new_context(viewport={"width": 1300, "height": 1600}, **POLLING_OPTIONS)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=c.url)
    page = context.new_page()
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))

    # Deep link to the starved run as the collector's first page: styled, and the answer first.
    page.goto(f"{c.url}/runs/{before}")
    page.wait_for_selector("#top-change", timeout=30_000)
    assert page.evaluate("getComputedStyle(document.querySelector('.sw-header')).display") == "flex"
    assert page.inner_text("#verdict-sentence").startswith(("Input-bound", "Partly input-bound"))
    assert "num_workers: 0 →" in page.inner_text("#top-change")
    assert re.fullmatch(r"expected \d+\.\d\dx faster", page.inner_text("#top-speedup"))
    # The evidence and the full configuration wait behind toggles; the change is always shown.
    assert not page.locator("#evidence-table").is_visible() and not page.locator("#config-train").is_visible()
    assert "num_workers" in page.locator("#config-changes-train tr.sw-changed").inner_text()
    assert page.locator("#config-changes-train").is_visible()
    page.click("#evidence summary")
    evidence = page.inner_text("#evidence-table")
    assert re.search(r"load per batch\s+[\d.]+ ms", evidence) and re.search(r"cores\s+\d+", evidence)
    page.click("#config-details-train summary")
    assert page.locator("#config-train").is_visible()
    assert "num_workers" in page.inner_text("#config-train tr.sw-changed") and "batch_size" in page.inner_text("#config-train")
    # At 1400 px the eight tiles are one row (STEPS used to wrap alone onto a second).
    page.set_viewport_size({"width": 1400, "height": 1600})
    tops = page.evaluate("Array.from(document.querySelectorAll('.sw-kpi')).map(k => k.getBoundingClientRect().top)")
    assert len(tops) == 8 and len(set(tops)) == 1, tops
    page.set_viewport_size({"width": 1300, "height": 1600})
    # Both positions in one read of the page, so no redraw can fall between them.
    answer_y, timeline_y = page.evaluate(
        "['#answer', '#timeline-graph'].map(s => document.querySelector(s).getBoundingClientRect().top)")
    assert answer_y < timeline_y  # the answer before the charts
    # The finished run is not redrawn by the next ticks: the same answer element stays in the page.
    page.evaluate("document.querySelector('#answer').dataset.mark = 'drawn once'")
    for _ in range(2):
        with page.expect_response(lambda r: "_dash-update-component" in r.url
                                  and "run-view-digest" in (r.request.post_data or ""), timeout=15_000):
            pass
    assert page.evaluate("document.querySelector('#answer').dataset.mark") == "drawn once"
    assert page.locator("#workers-panel").count() == 0  # num_workers=0: no worker panel

    # The copy button puts exactly the DataLoader line on the clipboard.
    line = page.inner_text("#snippet-train")
    assert line.startswith("DataLoader(dataset, ") and "num_workers=" in line
    page.click("#copy-snippet-train")
    page.wait_for_function("async () => (await navigator.clipboard.readText()).startsWith('DataLoader(')",
                           timeout=10_000)
    assert page.evaluate("navigator.clipboard.readText()") == line

    # The one 1 s batch does not squeeze the others into one bar: it is counted past the axis.
    page.wait_for_function("() => document.querySelector('#histogram-graph .js-plotly-plot')?.data?.length === 2",
                           timeout=30_000)
    hist = _plotly(page, "histogram-graph")
    meta = hist["layout"]["meta"]
    # The 1 s batch is past the axis; on a loaded machine a descheduled batch or two may join it.
    assert meta["overflow"] in (1, 2, 3), meta
    assert meta["max"] > 900, meta  # the 1 s batch, in ms
    assert meta["clip"] < hist["range"][1] < meta["max"]  # the axis ends past the clip, before the 1 s batch
    assert sum(hist["data"][0]["y"]) + hist["data"][1]["y"][0] == 60 and hist["data"][1]["y"] == [meta["overflow"]]
    assert f"{meta['overflow']} over" in page.text_content("#histogram-graph .annotation-text")

    text = page.inner_text("#page")
    assert not RAW_JSON.search(text), RAW_JSON.search(text)

    # The fixed run links to its comparison with the previous run of the same name.
    page.goto(f"{c.url}/runs/{after}")
    page.wait_for_selector("#workers-panel", timeout=30_000)
    page.wait_for_function("() => document.querySelector('#workers-graph-0 .js-plotly-plot')?.data?.length === 2",
                           timeout=30_000)
    assert sorted(t["name"] for t in _plotly(page, "workers-graph-0")["data"]) == ["worker 0", "worker 1"]
    # A finished run: what the workers did, not a "now" that would read "0/2 workers alive".
    workers_text = page.inner_text("#workers-panel")
    assert "now:" not in workers_text and "alive" not in workers_text and "2 workers, as last seen" in workers_text
    assert not RAW_JSON.search(page.inner_text("#page"))
    if os.environ.get("STARVEWATCH_SCREENSHOTS"):  # docs/dashboard-run.png
        page.screenshot(path=os.path.join(os.environ["STARVEWATCH_SCREENSHOTS"], "dashboard-run.png"), full_page=True)
    page.click("#compare-previous")
    page.wait_for_selector("#verify-table", timeout=30_000)
    assert page.url == f"{c.url}/compare?a={before}&b={after}"
    assert "num_workers=" in page.inner_text("#verify-table") and "batches/s" in page.inner_text("#compare-table")
    # Better and worse in colour: the throughput that rose is green.
    rate = page.locator("#compare-table tr", has_text="batches/s").locator("td").nth(4)
    assert rate.get_attribute("class") == "sw-better"
    assert page.evaluate("(e) => getComputedStyle(e).color", rate.element_handle()) == "rgb(46, 125, 70)"

    # A deep link to /compare shows both runs and their comparison on first load.
    fresh = context.new_page()
    fresh.set_viewport_size({"width": 1300, "height": 700})
    fresh.goto(f"{c.url}/compare?a={before}&b={after}")
    fresh.wait_for_selector("#compare-table", timeout=30_000)
    assert before in fresh.inner_text("#compare-a") and after in fresh.inner_text("#compare-b")
    assert "Pick a run" not in fresh.inner_text("#compare-result")
    if os.environ.get("STARVEWATCH_SCREENSHOTS"):
        fresh.screenshot(path=os.path.join(os.environ["STARVEWATCH_SCREENSHOTS"], "dashboard-compare.png"),
                         full_page=True)
    # Picking runs writes them into the address bar, without a reload: the page can be shared.
    fresh.click("#compare-b .dash-dropdown-clear")
    fresh.wait_for_url(f"{c.url}/compare?a={before}", timeout=15_000)
    fresh.wait_for_selector("#compare-result >> text=Pick a run", timeout=15_000)
    fresh.reload()
    fresh.wait_for_selector("#compare-result >> text=Pick a run", timeout=30_000)
    assert before in fresh.inner_text("#compare-a") and after not in fresh.inner_text("#compare-b")
    assert errors == []
    context.close()


# Headless Chromium reports every page as visible (minimising its window or bringing another
# tab to the front changes nothing), so the test sets what `document.hidden` and
# `visibilityState` report, and fires `visibilitychange`, as a browser does when the tab hides.
VISIBILITY_SWITCH = """
window.__swHidden = false;
Object.defineProperty(Document.prototype, 'hidden', {configurable: true, get() { return window.__swHidden; }});
Object.defineProperty(Document.prototype, 'visibilityState', {configurable: true,
    get() { return window.__swHidden ? 'hidden' : 'visible'; }});
window.__swSetHidden = (hidden) => { window.__swHidden = hidden;
    document.dispatchEvent(new Event('visibilitychange')); };
"""


def test_run_page_polls_only_while_visible_and_shows_dropped_records(collector, browser):
    import time
    from tests.conftest import wait_until
    c = collector()
    body = {"schema": "starvewatch.events/1", "run_id": "dropped-run", "stream": "p0", "seq": 1,
            "run": {"id": "dropped-run", "name": "dropped-run"},
            "loaders": [{"name": "train", "totals": {"steps": 1, "epochs": 1, "wait_ns": 5, "compute_ns": 5}}],
            "steps": {"loader": ["train"], "epoch": [0], "step": [0], "start_ns": [1], "wait_ns": [5],
                      "compute_ns": [5], "other_ns": [0], "batch_size": [None], "gpu_idle_ns": [None]},
            "delivery": {"acknowledged": 1, "spooled": 0, "dropped": {"spool_full": 7}}}
    assert c.request("POST", "/api/v1/ingest", json.dumps(body).encode(),
                     {"Content-Type": "application/json"})[0] == 200
    page, errors = page_with_errors(browser, height=1600, accept_downloads=True)
    page.add_init_script(VISIBILITY_SWITCH)
    updates = []
    page.on("request", lambda r: updates.append(time.monotonic()) if "_dash-update-component" in r.url else None)
    page.goto(c.url + "/runs/dropped-run")
    banner = page.wait_for_selector("#delivery-banner", timeout=30_000)
    assert "dropped 7 step records" in banner.inner_text() and "spool full: 7" in banner.inner_text()

    def polls_during(seconds: float) -> int:
        start = time.monotonic()
        page.wait_for_timeout(seconds * 1000)  # a window of browser time in which to count polls
        return sum(1 for t in updates if t >= start)

    wait_until(lambda: len(updates) >= 3, timeout_s=30, what="the page to poll")
    assert polls_during(2.2) >= 2  # visible: about one poll a second
    page.evaluate("window.__swSetHidden(true)")
    page.wait_for_timeout(300)  # a poll already in flight may still land
    assert polls_during(2.5) == 0
    page.evaluate("window.__swSetHidden(false)")
    assert polls_during(2.2) >= 2
    assert errors == []
