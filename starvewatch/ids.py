"""Identifiers that become paths, URLs and file names: one rule, shared by the hooks and the
collector (stdlib only; no import of either side).

A run id and a stream id become directory names (`spool/<run>/<stream>/`), URL path segments
(`/runs/<run>`) and part of an export's file name, so they are held to a small character set.
Names (run names, loader names) are free text shown to people: they only lose control
characters, and every place that shows them escapes them.
"""
from __future__ import annotations

import hashlib
import re
import unicodedata
from urllib.parse import quote

ID_MAX_CHARS = 128
NAME_MAX_CHARS = 200
# Letters, digits and . _ - : @ + = ~ ; never a path separator, a NUL, a space or `%`.
ID_PATTERN = r"^[A-Za-z0-9_.:@+=~-]{1,128}$"
_ID = re.compile(ID_PATTERN)
# Printable text: no C0 control characters (NUL, newline, escape...) and no DEL.
NAME_PATTERN = r"^[^\x00-\x1f\x7f]{1,200}$"


def id_problem(value: object) -> str | None:
    """Why `value` is not a valid run or stream id, or None when it is."""
    if not isinstance(value, str):
        return f"an id is a string, got {type(value).__name__}"
    if not _ID.fullmatch(value):
        return (f"an id is 1 to {ID_MAX_CHARS} characters from A-Z a-z 0-9 _ . - : @ + = ~, "
                f"got {value[:60]!r}")
    if set(value) == {"."}:
        return f"{value!r} is not an id (it names a directory)"
    return None


def _ascii_slug(value: str) -> str:
    """The id characters of `value`: accents folded to their base letter (NFKD: `î` -> `i`),
    every other run of characters outside the id set one `-`."""
    folded = unicodedata.normalize("NFKD", value).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[^A-Za-z0-9_.:@+=~-]+", "-", folded).strip(".-")


def safe_id(value: str, suffix: str | None = None, prefix_chars: int = ID_MAX_CHARS) -> str:
    """The one function that makes an id (ASCII, the collector's ID_PATTERN) from any text.

    Without `suffix`: `value` unchanged when already a valid id, else its ASCII slug plus a short
    hash of the original, so two different inputs stay different (`entraînement` and
    `entrainement` never share a directory). With `suffix` (already distinct per input, e.g. a
    hash of the job or a timestamp and random part): `<slug of value, at most prefix_chars>-<suffix>`,
    where the slug is `run` when nothing of `value` survives."""
    if suffix is not None:
        tail = _ascii_slug(suffix) or hashlib.sha1(suffix.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        room = max(1, min(prefix_chars, ID_MAX_CHARS - len(tail) - 1))
        head = _ascii_slug(value)[:room].strip(".-") or "run"
        return f"{head}-{tail}"[:ID_MAX_CHARS]
    if id_problem(value) is None:
        return value
    kept = _ascii_slug(value)[:ID_MAX_CHARS - 13].strip(".-") or "run"
    digest = hashlib.sha1(value.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{kept}-{digest}"


# Unicode categories that are not visible text: controls (C0 and C1), format characters
# (bidirectional overrides, zero-width joiners and spaces), line and paragraph separators,
# private use and lone surrogates. Any of them can make a name show as another one, reorder a
# terminal line, or break a table row.
HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Co", "Cs"})


def clean_name(value, default: str = ""):
    """A name as text: every run of invisible characters (HIDDEN_CATEGORIES) becomes one space,
    the ends are stripped; `default` when nothing is left. Letters of every script are kept.
    Anything but a string is returned as it is (for the validator that refuses it)."""
    if not isinstance(value, str):
        return value
    if value.isascii() and value.isprintable():
        return value.strip() or default  # the common case, at C speed
    out, gap = [], False
    for char in value:
        if unicodedata.category(char) in HIDDEN_CATEGORIES:
            gap = True
            continue
        if gap and out:
            out.append(" ")
        gap = False
        out.append(char)
    return "".join(out).strip() or default


def safe_name(value: str, default: str = "run") -> str:
    """A valid name made from any string: invisible characters become spaces (clean_name), at
    most 200 characters (a name the collector would refuse would cost the run its data)."""
    text = clean_name(str(value))[:NAME_MAX_CHARS].strip()
    return text or default


def url_segment(value: str) -> str:
    """One URL path segment: `/` and `?` inside a run id never change which route answers."""
    return quote(value, safe="")


def content_disposition(filename: str) -> str:
    """An `attachment` header whose file name cannot escape the quotes or name a directory:
    an ASCII fallback plus the exact name as RFC 5987 `filename*`."""
    plain = re.sub(r"[^A-Za-z0-9_.+=~-]+", "_", filename).strip("._") or "download"
    exact = re.sub(r"[\x00-\x1f\x7f/\\\\]+", "_", filename).strip(". ") or plain
    return f"attachment; filename=\"{plain}\"; filename*=UTF-8''{quote(exact, safe='')}"
