"""The run page's Measured tuning panel in a real headless Chromium."""
from tests.browser import page_with_errors
from tests.test_tune_collector import _document, _post, _train


def test_run_page_shows_the_measured_tuning_panel(collector, browser):
    c = collector()
    run_id = _train(c, "panel-run")
    assert _post(c, run_id, _document(workers=3, rate=200.0))[0] == 200
    page, errors = page_with_errors(browser, height=1600)
    page.goto(f"{c.url}/runs/{run_id}")
    page.wait_for_selector("#tuning-table", timeout=30_000)
    assert "would need 9 GiB of RAM" in page.inner_text("#tuning-table")
    assert page.inner_text("#tuning-snippet").startswith("DataLoader(dataset, batch_size=4, num_workers=3")
    # The recommendations list shows the measured advice.
    page.wait_for_selector("#recommendations >> text=measured by", timeout=30_000)
    assert errors == []
