"""The runs page with 1,000 runs, in a real headless Chromium against a real collector: groups,
filters, pages and links work, and the page paints and filters within a generous bound (the
figures against the 1 s / 300 ms targets come from benchmarks/dashboard.py)."""
import time

from starvewatch.monitor.storage.store import Store
from tests.browser import page_with_errors
from tests.many_runs import seed_runs

PAINT_BOUND_S = 10.0   # generous: the shared 2-core test machine; the target is 1 s
FILTER_BOUND_S = 5.0   # the target is 300 ms


def test_thousand_runs_grouped_filtered_paged_and_linked(collector, browser, isolated_starvewatch):
    store = Store(isolated_starvewatch / "starvewatch.db")
    plans = seed_runs(store, 1000, groups=20)
    store.close()
    c = collector(extra=["--lost-after", "3600"])  # the live runs stay live however slow the machine
    page, errors = page_with_errors(browser, height=1000)
    page.goto(c.url + "/compare")  # Dash's bundles in the browser's cache, as for a returning user
    page.wait_for_selector("#compare-result")

    started = time.perf_counter()
    page.goto(c.url + "/")
    page.wait_for_selector("#runs-table tr.sw-run")
    paint_s = time.perf_counter() - started
    assert paint_s < PAINT_BOUND_S, paint_s
    groups = page.locator("#runs-table tr.sw-group .sw-group-name").all_inner_texts()
    assert groups == [f"job-{i}" for i in range(19, 2, -1)]  # 50 runs a page: 16 groups of 3, then 2 of job-3
    assert page.locator("#runs-table tr.sw-run").count() == 50
    assert "page 1 of 2 · 1,000 runs in 20 groups" in page.inner_text("#runs-page-info")

    started = time.perf_counter()
    page.locator("#runs-status input[value='live']").check()
    page.wait_for_selector("#runs-table[data-view^='live|any|']")
    filter_s = time.perf_counter() - started
    assert filter_s < FILTER_BOUND_S, filter_s
    statuses = page.locator("#runs-table tr.sw-run td:nth-child(2)").all_inner_texts()
    assert statuses and set(statuses) == {"live"}
    assert page.locator("#runs-table tr.sw-group .sw-group-name").all_inner_texts() == \
        ["job-15", "job-10", "job-5", "job-0"]
    page.locator("#runs-verdict input[value='insufficient_data']").check()
    page.wait_for_selector("#runs-none")  # no run is both (every fifth vs every tenth, odd)
    page.locator("#runs-verdict input[value='']").check()
    page.wait_for_selector("#runs-table[data-view^='live|any|']")
    page.locator("#runs-status input[value='']").check()
    page.wait_for_selector("#runs-table[data-view^='any|any|started|0|']")

    # The pager: the second page starts with job-3 continued; back again.
    page.click("#runs-next")
    page.wait_for_selector("#runs-table[data-view='any|any|started|1|60']")
    assert "(continued)" in page.inner_text("#runs-table tr.sw-group >> nth=0")
    assert page.locator("#runs-table tr.sw-run").count() == 10 and page.is_disabled("#runs-next")
    page.click("#runs-prev")
    page.wait_for_selector("#runs-table[data-view='any|any|started|0|60']")

    # A group's page lists all its runs; its "compare the last two" opens their comparison.
    page.click("#runs-table tr.sw-group >> nth=0 >> .sw-group-all")
    page.wait_for_url(c.url + "/groups/job-19")
    page.wait_for_selector("#runs-table[data-view='any|any|started|0|50']")
    mine = [p["id"] for p in plans if p["name"] == "job-19"]
    assert page.locator("#runs-table .sw-run-id").all_inner_texts() == mine[::-1]
    page.click("#runs-table .sw-compare-last-two")
    page.wait_for_url(f"{c.url}/compare?a={mine[-2]}&b={mine[-1]}")
    page.wait_for_selector("#compare-table")
    assert errors == []
