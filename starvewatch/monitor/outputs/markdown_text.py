"""Names and free text inside the Markdown export (and the HTML report drawn from it): shown as
text, never as a link, emphasis, HTML, a table cell boundary or the end of a code block."""
from __future__ import annotations

import re

# What Markdown acts on anywhere in a line: emphasis, code, links and images, HTML, entities,
# table cells, strikethrough. `_` only at a word's edge (inside a word, as in read_shard, it is
# no emphasis), and the two ways GFM turns bare text into a link (`scheme://`, `www.`).
_ACTIVE = re.compile(r"[\\`*\[\]<>|~&#]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_AUTOLINK = re.compile(r"(?i)(://|www\.)")


def md_text(value) -> str:
    """A name or free text as Markdown text: the punctuation Markdown acts on backslash-escaped
    (no link, autolink, emphasis, HTML, entity or table cell boundary can come from it), line
    breaks as spaces. Plain names (read_shard, num_workers=2, /data.py) read as they are."""
    text = " ".join(str(value).splitlines())
    text = _ACTIVE.sub(lambda m: "\\" + m.group(0), text)
    return _AUTOLINK.sub(lambda m: ":\\/\\/" if m.group(0) == "://" else m.group(0)[:3] + "\\.", text)


def md_code(value) -> str:
    """Inline code that holds any text: fenced by more backticks than its longest run."""
    text = " ".join(str(value).splitlines())
    fence = "`" * (_longest_backtick_run(text) + 1)
    return f"{fence} {text} {fence}" if "`" in text else f"`{text}`"


def md_block(text: str, language: str = "text") -> list[str]:
    """A fenced code block that no line of `text` can end: its fence is longer than any run of
    backticks inside (and at least three)."""
    fence = "`" * max(3, _longest_backtick_run(text) + 1)
    return [f"{fence}{language}", text, fence]


def _longest_backtick_run(text: str) -> int:
    return max((len(run) for run in re.findall(r"`+", text)), default=0)


def readable_time(iso: str | None) -> str:
    """'2026-11-28T15:53:52.189307Z' as '2026-11-28 15:53:52 UTC': a reader's timestamp, to
    the second (the JSON export keeps the full one)."""
    if not iso:
        return "—"
    text = str(iso)
    utc = text.endswith("Z") or text.endswith("+00:00")
    core = text.removesuffix("Z").removesuffix("+00:00").replace("T", " ").split(".", 1)[0]
    return f"{core} UTC" if utc else core
