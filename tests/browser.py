"""Headless Chromium for the browser tests: the one system browser, launched one way, and a page
that collects what the browser reports as errors (every browser test asserts there are none)."""
from __future__ import annotations

from contextlib import contextmanager

CHROMIUM = "/usr/bin/chromium"
# No sandbox (containers), no GPU, and none of Chromium's own traffic to the network.
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-quic",
               "--no-first-run", "--disable-component-update", "--disable-sync"]


@contextmanager
def chromium():
    from playwright.sync_api import sync_playwright  # a test extra: imported only where a test runs it
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            yield browser
        finally:
            browser.close()


# Playwright's wait_for_function evaluates its predicate with eval(), which the pages' script
# policy forbids (no 'unsafe-eval', issue 36): a test that waits that way bypasses the policy
# for its page (POLLING_OPTIONS); every other browser test runs under it, and a violation is a
# console error that the test fails on.
POLLING_OPTIONS = {"bypass_csp": True}


def page_with_errors(browser, *, height: int = 1400, **options):
    """A new page and the list its console errors and uncaught exceptions go to."""
    page = browser.new_page(viewport={"width": 1300, "height": height}, **options)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return page, errors
