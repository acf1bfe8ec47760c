"""The run page's Measured tuning panel in a real headless Chromium."""
from playwright.sync_api import sync_playwright

from tests.test_dashboard_browser import CHROMIUM
from tests.test_tune_collector import _document, _post, _train


def test_run_page_shows_the_measured_tuning_panel(collector):
    c = collector()
    run_id = _train(c, "panel-run")
    assert _post(c, run_id, _document(workers=3, rate=200.0))[0] == 200
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 1600})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(f"{c.url}/runs/{run_id}")
            page.wait_for_selector("#tuning-table", timeout=30_000)
            assert "would need 9 GiB of RAM" in page.inner_text("#tuning-table")
            assert page.inner_text("#tuning-snippet").startswith("DataLoader(dataset, batch_size=4, num_workers=3")
            # The recommendations list shows the measured advice.
            page.wait_for_selector("#recommendations >> text=measured by", timeout=30_000)
            assert errors == []
        finally:
            browser.close()
