"""Ids and names from the API stay in their place: refused where they would become a path,
escaped where they become HTML, a URL or a file name."""
import json
import re
from urllib.parse import unquote

import pytest

from starvewatch.ids import NAME_PATTERN, content_disposition, id_problem, safe_id, safe_name, url_segment
from tests.browser import POLLING_OPTIONS

HOSTILE_IDS = ["../../x", "..", ".", "/etc/passwd", "a/b", "a\\b", "a\x00b", "x" * 129, "", "run id",
               "ünïcode", "a?b", "a#b", "%2e%2e", "line\nbreak"]
HTML_NAME = "<img src=x onerror=window.pwned=1><script>window.pwned=2</script>"


@pytest.mark.parametrize("value", HOSTILE_IDS)
def test_hostile_ids_are_refused_and_made_safe_distinctly(value):
    assert id_problem(value) is not None
    made = safe_id(value)
    assert id_problem(made) is None and "/" not in made and made not in (".", "..")
    assert safe_id(value + "!") != made  # two different inputs never share a directory


def test_valid_ids_pass_unchanged():
    for value in ("run-a", "train-20261123-120000-a1b2c3", "job:42@host+1=x~y", "x" * 128, "a.b"):
        assert id_problem(value) is None and safe_id(value) == value


def is_name(value: object) -> bool:
    """What the collector's wire model takes as a name (after cleaning): NAME_PATTERN."""
    return isinstance(value, str) and re.fullmatch(NAME_PATTERN, value) is not None


def test_names_are_printable_text():
    assert is_name(HTML_NAME)  # allowed: shown as text wherever it appears
    for bad in ("", "a\x00b", "tab\there", "x" * 201, 5):
        assert not is_name(bad)
    for raw in ("a\x00b", "tab\there", "x" * 300, "\x00", "", "\ud800x", HTML_NAME):
        made = safe_name(raw, "loader")
        assert is_name(made), raw
    assert safe_name("line\n\x1bbreak") == "line break" and safe_name("\x00", "loader") == "loader"


def test_content_disposition_and_url_segments_cannot_escape():
    for name in ("starvewatch-../../etc/passwd.csv", 'a"; filename="evil.sh', "a\r\nSet-Cookie: x=1",
                 "ünï/\\code.html"):
        header = content_disposition(name)
        plain = re.search(r'filename="([^"]*)"', header).group(1)
        exact = unquote(re.search(r"filename\*=UTF-8''(\S+)", header).group(1))
        for part in (plain, exact):
            assert "/" not in part and "\\" not in part and "\n" not in part and "\r" not in part, header
        assert header.count('"') == 2 and "\r" not in header and "\n" not in header
    assert content_disposition("starvewatch-run-a.csv") == (
        "attachment; filename=\"starvewatch-run-a.csv\"; filename*=UTF-8''starvewatch-run-a.csv")
    assert url_segment("a/b?c#d") == "a%2Fb%3Fc%23d"


def batch(run_id, name="ids-run", loader="train", stream=None):
    return json.dumps({
        "schema": "starvewatch.events/1", "run_id": run_id, "stream": "s-1" if stream is None else stream, "seq": 1,
        "run": {"id": run_id, "name": name},
        "loaders": [{"name": loader, "config": {"num_workers": 2}, "totals": {"steps": 1, "wait_ns": 9, "compute_ns": 1}}],
        "steps": {"loader": [loader], "epoch": [0], "step": [0], "start_ns": [1], "wait_ns": [9],
                  "compute_ns": [1], "other_ns": [0], "batch_size": [None], "gpu_idle_ns": [None]}}).encode()


def test_the_api_refuses_hostile_ids_and_names_and_escapes_html(collector):
    c = collector()
    headers = {"Content-Type": "application/json"}
    for value in HOSTILE_IDS:
        status, text = c.request("POST", "/api/v1/ingest", batch(value), headers)
        assert status == 422, (value, status, text[:200])
        status, text = c.request("POST", "/api/v1/ingest", batch("fine", stream=value), headers)
        assert status == 422, (value, status, text[:200])
    name = "x" * 201
    assert c.request("POST", "/api/v1/ingest", batch("fine", name=name), headers)[0] == 422
    assert c.request("POST", "/api/v1/ingest", batch("fine", loader=name), headers)[0] == 422
    assert c.get("/api/v1/runs")["runs"] == []
    assert not (c.directory / "spool").exists() or not any((c.directory / "spool").iterdir())
    # Control characters are replaced, not refused (ids.clean_name, on both sides): a name never
    # costs a run its data.
    for i, (name, stored) in enumerate((("a\x00b", "a b"), ("new\nline", "new line"))):
        assert c.request("POST", "/api/v1/ingest", batch(f"cleaned{i}", name=name, loader=name, stream=f"s-c{i}"),
                         headers)[0] == 200
        assert c.get(f"/api/v1/runs/cleaned{i}")["run"]["name"] == stored

    run_id = "html:run@1"
    assert c.request("POST", "/api/v1/ingest", batch(run_id, name=HTML_NAME, loader=HTML_NAME), headers)[0] == 200
    quoted = url_segment(run_id)
    assert c.get(f"/api/v1/runs/{quoted}")["run"]["name"] == HTML_NAME
    status, report = c.request("GET", f"/api/v1/runs/{quoted}/export?format=html")
    assert status == 200
    text = report.decode()
    assert "<img src=x" not in text and "<script>window.pwned" not in text
    assert "&lt;img src=x onerror=window.pwned=1&gt;" in text  # shown, as text
    import urllib.request
    with urllib.request.urlopen(f"{c.url}/api/v1/runs/{quoted}/export?format=csv", timeout=30) as resp:
        disposition = resp.headers["Content-Disposition"]
        rows = resp.read().decode().splitlines()
    assert disposition.startswith('attachment; filename="starvewatch-html_run_1.csv"')
    assert rows[1].startswith(f"{run_id},0,{HTML_NAME},0,0,1,")  # csv quotes only , " and newlines


def test_the_dashboard_shows_hostile_names_as_text(collector, browser):
    c = collector()
    run_id = "html-run"
    status, _ = c.request("POST", "/api/v1/ingest", batch(run_id, name=HTML_NAME, loader=HTML_NAME),
                          {"Content-Type": "application/json"})
    assert status == 200
    page = browser.new_page(**POLLING_OPTIONS)
    page.goto(f"{c.url}/")
    page.wait_for_selector("#runs-table", timeout=30_000)
    assert page.inner_text("#runs-table").count(HTML_NAME) == 1
    page.goto(f"{c.url}/runs/{run_id}")
    page.wait_for_function("document.querySelector('#run-title h2') !== null", timeout=30_000)
    assert page.inner_text("#run-title h2").startswith(HTML_NAME)
    assert HTML_NAME in page.inner_text("#config-table")
    assert page.evaluate("window.pwned") is None
    assert page.evaluate("document.querySelectorAll('#page img, #page script').length") == 0
