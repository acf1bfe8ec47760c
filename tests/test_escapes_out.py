"""Stored text reaches Markdown and the terminal as text (issue 36 item 6): tuning fields once
reached the Markdown export as live links, remote images and raw HTML, and `export --format md`
wrote stored terminal escape sequences to the terminal."""
import json
import subprocess
import sys

from markdown_it import MarkdownIt

from tests.test_security import JSON, TUNING, call
from tests.test_stored_markup_browser import full_batch

LINK = "[click](https://evil.example/x) ![img](https://evil.example/i.png) <img src=x onerror=alert(1)>"
ESCAPE = "\x1b]0;pwned\x07\x1b[2J"


def test_tuning_fields_and_stacks_stay_text_in_markdown_and_on_the_terminal(collector):
    c = collector()
    batch = full_batch("esc")
    batch["stalls"][0]["stack"] = "File x.py, line 1" + ESCAPE
    assert call(c, "POST", "/api/v1/ingest", JSON, json.dumps(batch).encode())[0] == 200
    trial = dict(TUNING["trials"][0], label="lbl " + LINK, reason="r " + LINK, status="failed")
    tuning = dict(TUNING, host="h " + LINK, created_at="2026 " + LINK, trials=[trial],
                  answer=dict(TUNING["answer"], rule="rule " + LINK))
    assert call(c, "POST", "/api/v1/runs/esc/tuning", JSON, json.dumps(tuning).encode())[0] == 200
    status, _, body = call(c, "GET", "/api/v1/runs/esc/export?format=md")
    text = body.decode()
    assert status == 200 and "Measured tuning" in text
    html = MarkdownIt("commonmark").enable("table").render(text)
    assert "<a " not in html and "<img" not in html, [line for line in html.splitlines() if "evil" in line]
    assert html.count("https://evil.example/x") >= 4  # each field still shown, as text

    out = subprocess.run([sys.executable, "-m", "starvewatch", "export", "esc", "--format", "md",
                          "--url", c.url], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "File x.py, line 1" in out.stdout and "\x1b" not in out.stdout and "\x07" not in out.stdout
