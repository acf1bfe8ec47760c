"""The compare page and the compare report in a real headless Chromium: two runs whose only
loaders are named differently (one with markup in its name) are compared, their charts drawn,
the configuration change highlighted, the verdict's interval drawn with the prediction."""
import os
import re
import subprocess
import sys

import pytest

from starvewatch.monitor.storage.query import Query
from starvewatch.monitor.storage.store import Store
from tests.browser import POLLING_OPTIONS, page_with_errors
from tests.test_compare import HOSTILE, _batch

RAW_JSON = re.compile(r"""[{\[]\s*["']|["']\s*:\s""")


@pytest.fixture
def stored_pair(isolated_starvewatch):
    store = Store(isolated_starvewatch / "starvewatch.db")
    store.ingest(_batch("before", "first", {"num_workers": 0, "batch_size": 32}, wait_ms=30))
    rec = next(r for r in Query(store).summary("before")["recommendations"] if r["parameter"] == "num_workers")
    store.ingest(_batch("after", HOSTILE, {"num_workers": rec["suggested"], "batch_size": 32}, wait_ms=0.5,
                        start_s=1_700_000_100))
    store.close()
    return rec


def _traces(page, graph_id: str) -> list[dict]:
    return page.evaluate(f"""() => document.querySelector('#{graph_id} .js-plotly-plot').data
        .map(t => ({{name: t.name, x: Array.from(t.x || []), y: Array.from(t.y || []), symbol: t.marker?.symbol}}))""")


def test_compare_page_draws_both_runs_and_the_verdict(collector, browser, stored_pair):
    rec = stored_pair
    c = collector()
    page, errors = page_with_errors(browser, height=1400, **POLLING_OPTIONS)
    page.goto(f"{c.url}/compare?a=before&b=after")
    page.wait_for_selector("#compare-table")
    assert "(each run's only loader)" in page.inner_text("#compare-result")
    p95 = page.locator("#compare-table tr", has_text="wait p95").inner_text()
    assert re.search(r"-9\d\.\d% \(0\.0\d+x\)", p95), p95  # readable, not "0.00x"
    changed = page.locator("#config-diff tr.sw-changed").all_inner_texts()
    assert len(changed) == 1 and "num_workers" in changed[0] and str(rec["suggested"]) in changed[0]
    # The unchanged settings wait behind a toggle, listed and not marked.
    assert "batch_size" not in page.inner_text("#config-diff")
    assert not page.locator("#config-unchanged").is_visible()
    page.click("#config-unchanged-details summary")
    assert "batch_size" in page.inner_text("#config-unchanged")
    assert page.locator("#config-unchanged tr.sw-changed").count() == 0
    # Better in green, worse in red: the waits fell a hundredfold.
    wait_row = page.locator("#compare-table tr", has_text="wait p95").locator("td").nth(4)
    assert wait_row.get_attribute("class") == "sw-better"

    # The verdict: the measured interval with the prediction as a diamond.
    page.wait_for_function("() => document.querySelector('#verify-graph .js-plotly-plot')?.data?.length === 2")
    measured, predicted = _traces(page, "verify-graph")
    assert predicted["symbol"] == "diamond" and predicted["x"] == [pytest.approx(rec["expected_speedup"])]
    assert measured["y"] == predicted["y"]
    # ...and the change's label, markup in the loader's name shown as text.
    assert page.locator("#verify-graph .ytick text").all_text_contents() == \
        [f"{HOSTILE}: num_workers={rec['suggested']}"]
    assert page.locator("#verify-graph .errorbar").count() == 1
    assert "confirmed" in page.inner_text("#verify-table")

    # Distributions overlaid (two runs, one log axis) and the series side by side on one axis.
    for graph in ("compare-wait-0", "compare-compute-0", "compare-throughput-0", "compare-input-wait-0"):
        page.wait_for_function(f"() => document.querySelector('#{graph} .js-plotly-plot')?.data?.length === 2")
    wait = _traces(page, "compare-wait-0")
    assert [t["name"] for t in wait] == ["before: before (300 batches)", "after: after (300 batches)"]
    assert page.evaluate("document.querySelector('#compare-wait-0 .js-plotly-plot')._fullLayout.xaxis.type") == "log"
    # The log axis reads as numbers in order (1, 2, 5, 10, 20...), not plotly's "2 5 10 2 5 100".
    ticks = [float(t.replace(",", "")) for t in page.locator("#compare-wait-0 .xtick text").all_text_contents()]
    assert len(ticks) >= 3 and ticks == sorted(set(ticks)), ticks
    throughput = _traces(page, "compare-throughput-0")
    assert all(min(t["x"]) >= 0 for t in throughput)  # seconds from each run's start
    assert all(t["name"].endswith("(5 s window)") for t in throughput)  # a rate, not 1 s integer buckets
    # The loader's name is shown as text in the charts' titles and legends too.
    titles = page.locator("#compare-result .gtitle").all_text_contents()
    assert f"first → {HOSTILE}: wait per batch" in titles
    assert page.locator("#compare-result .js-plotly-plot text b, #compare-result .js-plotly-plot tspan[style*='bold']").count() == 0
    assert page.evaluate("window.pwned") is None
    text = page.inner_text("#compare-result")
    assert HOSTILE in text and not RAW_JSON.search(text)
    assert errors == []


def test_compare_report_opens_offline_with_its_charts(collector, browser, stored_pair, tmp_path):
    c = collector()
    # The collector serves the distributions the report overlays (the CLI reads them from it).
    served = c.get("/api/v1/runs/before/distributions?loader=first")
    assert served["wait"]["count"] == served["compute"]["count"] == 300
    assert c.get("/api/v1/runs/before/distributions?loader=other")["wait"] == {"buckets": [], "count": 0,
                                                                                 "max_ms": None}
    assert c.request("GET", "/api/v1/runs/nope/distributions")[0] == 404
    report = tmp_path / "compare.html"
    out = subprocess.run([sys.executable, "-m", "starvewatch", "compare", "before", "after", "--format", "html",
                          "-o", str(report)], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, STARVEWATCH_URL=c.url))
    assert out.returncode == 0, out.stderr
    page, errors = page_with_errors(browser, height=1400, **POLLING_OPTIONS)
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(report.as_uri())
    page.wait_for_selector(".js-plotly-plot .main-svg", timeout=30_000)
    assert page.locator(".js-plotly-plot").count() == 5
    # Both runs drawn in every chart: the distributions, the series, the interval and prediction.
    assert page.evaluate("Array.from(document.querySelectorAll('.js-plotly-plot')).map(p => p.data.length)") == \
        [2, 2, 2, 2, 2]
    assert all(u.startswith(("file:", "data:", "blob:")) for u in requests), requests  # no CDN
    assert "num_workers" in page.inner_text("#config-diff tr.changed")
    assert HOSTILE in page.inner_text("#compare-table") and page.locator("#compare-table b").count() == 0
    assert errors == []
