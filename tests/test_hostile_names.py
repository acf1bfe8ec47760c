"""Text stays text (issue 27, item 4): names that look like markup, formulas, fences or terminal
controls are shown as the text they are in the dashboard (real Chromium), the HTML report,
the Markdown (rendered by a CommonMark parser) and CSV exports, and the CLI."""
import csv
import io
import json
import subprocess
import sys
import time

import pytest
from markdown_it import MarkdownIt

import starvewatch
from starvewatch.ids import clean_name, safe_name
from starvewatch.monitor.outputs.export import csv_cell
from tests.test_security import JSON, call

EVIL = "https://evil.example"
MARKUP = (f'<a href="{EVIL}/t">click</a><span style="font-size:90px">BIG</span><b>b</b>'
          f'<img src=x onerror=alert(1)>[md]({EVIL}/m)|cell')
RUN_NAME = "run " + MARKUP + "\u202e\u2028"
LOADER = "ld " + MARKUP
WORKER = f'<a href="{EVIL}/w">w</a><span style="color:red">red</span>'
STACK = 'File "x.py", line 1\n```\nnot code any more\n````\n' + MARKUP


def hostile_batch(run_id: str) -> bytes:
    now = time.time_ns()
    n = 40
    return json.dumps({
        "schema": "starvewatch.events/1", "run_id": run_id, "stream": f"{run_id}-s", "seq": 1,
        "status": "live",
        "run": {"id": run_id, "name": RUN_NAME, "host": MARKUP, "started_at": now / 1e9},
        "loaders": [{"name": LOADER, "config": {"num_workers": 2, "batch_size": 4},
                     "totals": {"steps": n, "wait_ns": n * 8_000_000, "compute_ns": n * 2_000_000}}],
        "steps": {"loader": [LOADER] * n, "epoch": [0] * n, "step": list(range(n)),
                  "start_ns": [now - (n - i) * 10_000_000 for i in range(n)], "wait_ns": [8_000_000] * n,
                  "compute_ns": [2_000_000] * n, "other_ns": [0] * n, "batch_size": [4] * n,
                  "gpu_idle_ns": [None] * n},
        "workers": [{"t_ns": now - k * 1_000_000_000, "loader": LOADER, "configured_workers": 2, "alive_workers": 2,
                     "workers": [{"id": WORKER, "pid": 10, "state": "running", "load_ms_mean": 5.0 + k},
                                 {"id": 1, "pid": 11, "state": "running", "load_ms_mean": 6.0}]}
                    for k in range(3)],
        "stalls": [{"t_ns": now, "loader": LOADER, "started_ns": now - 10**9, "wait_s": 12.0, "step": 3,
                    "epoch": 0, "stack": STACK}],
    }).encode()


@pytest.mark.parametrize("raw,shown", [
    ("plain name", "plain name"),
    ("naïve 東京 Ω", "naïve 東京 Ω"),                      # letters of every script stay
    ("a\u202eb", "a b"),                                    # right-to-left override
    ("a\u200b\u200db", "a b"),                              # zero-width space and joiner
    ("a\u2028b\u2029c", "a b c"),                           # line and paragraph separators
    ("a\x85b\x9bc", "a b c"),                               # C1 controls (NEL, CSI)
    ("a\x1b[31mb", "a [31mb"),                              # a terminal escape loses its ESC
    ("a\ue000b", "a b"),                                    # private use
    ("\u202e\u2066", ""),                                   # nothing visible
])
def test_invisible_characters_are_replaced(raw, shown):
    assert clean_name(raw) == shown
    assert safe_name(raw) == (shown or "run")


@pytest.mark.parametrize("cell,written", [
    ("=HYPERLINK(\"x\")", "'=HYPERLINK(\"x\")"), ("+1", "'+1"), ("-2", "'-2"), ("@SUM(A1)", "'@SUM(A1)"),
    ("\tx", "'\tx"), ("\rx", "'\rx"), ("train", "train"), (-3.5, -3.5), (7, 7)])
def test_csv_cells_that_a_spreadsheet_would_run_are_neutralized(cell, written):
    assert csv_cell(cell) == written


def test_the_hooks_clean_names_before_sending(memory_run):
    session, transport = memory_run
    loader = starvewatch.watch(range(5), name="val\u202e\u2028loader")
    list(loader)
    session.name  # noqa: B018 (the session exists)
    starvewatch.finish()
    names = {n for p in transport.payloads for n in p["steps"]["loader"]}
    assert names == {"val loader"}


def test_exports_keep_hostile_names_as_text(collector):
    c = collector()
    assert call(c, "POST", "/api/v1/ingest", JSON, hostile_batch("=1+2@calc"))[0] == 200
    # The collector cleans too: no invisible character is stored.
    stored = c.get("/api/v1/runs/=1+2@calc")["run"]["name"]
    assert stored == "run " + MARKUP

    status, _, body = call(c, "GET", "/api/v1/runs/=1+2@calc/export?format=csv")
    rows = list(csv.reader(io.StringIO(body.decode())))
    assert status == 200 and len(rows) == 41
    assert {r[0] for r in rows[1:]} == {"'=1+2@calc"}  # a formula no more
    assert all(not cell.startswith(("=", "+", "-", "@")) for r in rows for cell in r)

    status, _, body = call(c, "GET", "/api/v1/runs/=1+2@calc/export?format=md")
    text = body.decode()
    rendered = MarkdownIt("commonmark").enable("table").render(text)
    assert status == 200 and "<a " not in rendered and "<span" not in rendered and "<b>" not in rendered
    assert "<img" not in rendered and "&lt;a href=" in rendered  # the name, shown as text
    # The stack is one code block, whole: its backticks did not end the fence.
    blocks = [t for t in MarkdownIt("commonmark").parse(text) if t.type == "fence"]
    assert any(b.content.rstrip("\n") == STACK for b in blocks), [b.content for b in blocks]
    # Every table keeps its columns: the name's `|` is not a cell boundary (each row has as
    # many cells as its table's header).
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    widths, cells = [], None
    for t in tokens:
        if t.type == "table_open":
            widths.append([])
        elif t.type == "tr_open":
            cells = 0
        elif t.type in ("th_open", "td_open"):
            cells += 1
        elif t.type == "tr_close":
            widths[-1].append(cells)
    assert widths and all(len(set(table)) == 1 for table in widths), widths


def test_the_cli_prints_names_safely(isolated_starvewatch):
    from starvewatch.monitor.storage.store import Store
    from starvewatch.monitor.web.wire_models import EventBatch
    db = isolated_starvewatch / "cli.db"
    store = Store(db)
    store.ingest(EventBatch.model_validate_json(hostile_batch("cli-run")))
    store.close()
    import sqlite3
    with sqlite3.connect(db) as conn:  # as an older collector could have stored it
        conn.execute("UPDATE runs SET name = ? WHERE id = 'cli-run'", ("a\x1b[2J\u202eb\x9b",))
    out = subprocess.run([sys.executable, "-m", "starvewatch", "runs", "--db", str(db)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "cli-run" in out.stdout
    assert not any(ch in out.stdout for ch in "\x1b\u202e\x9b"), repr(out.stdout)


HOSTILE_IN_DOM = """() => {
    const links = [...document.querySelectorAll('a')].filter(a =>
        (a.getAttribute('href') || a.getAttribute('xlink:href') || '').includes('evil.example'));
    const styled = [...document.querySelectorAll('[style]')].filter(e =>
        /90px|color: ?red/.test(e.getAttribute('style')));
    const images = [...document.querySelectorAll('img')].filter(i => i.getAttribute('src') === 'x');
    return {links: links.length, styled: styled.length, images: images.length,
            bold: [...document.querySelectorAll('b')].filter(b => b.textContent === 'b').length,
            shown: document.body.innerText.includes('<a href="https://evil.example/t">')
                || [...document.querySelectorAll('svg text')].some(t => t.textContent.includes('<a href='))};
}"""


def test_the_dashboard_and_html_report_draw_hostile_names_as_text(collector, browser, tmp_path):  # noqa: F811
    c = collector()
    assert call(c, "POST", "/api/v1/ingest", JSON, hostile_batch("hostile-run"))[0] == 200
    page = browser.new_page(viewport={"width": 1300, "height": 2400})
    alerts = []
    page.on("dialog", lambda d: (alerts.append(d.message), d.dismiss()))
    page.goto(f"{c.url}/runs/hostile-run")
    page.wait_for_selector("#timeline-graph .js-plotly-plot .gtitle", timeout=60_000)
    page.wait_for_selector("#workers-graph-0 .js-plotly-plot .legendtext", timeout=60_000)
    found = page.evaluate(HOSTILE_IN_DOM)
    assert found == {"links": 0, "styled": 0, "images": 0, "bold": 0, "shown": True}, found
    legend = page.locator("#workers-graph-0 .legendtext").all_text_contents()
    assert any(WORKER in t for t in legend), legend  # the worker's name, as text

    status, _, report = call(c, "GET", "/api/v1/runs/hostile-run/export?format=html")
    path = tmp_path / "report.html"
    path.write_bytes(report)
    page.goto(path.as_uri())
    page.wait_for_selector(".js-plotly-plot .gtitle", timeout=60_000)
    found = page.evaluate(HOSTILE_IN_DOM)
    assert found == {"links": 0, "styled": 0, "images": 0, "bold": 0, "shown": True}, found
    assert alerts == []
