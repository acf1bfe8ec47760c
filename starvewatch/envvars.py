"""STARVEWATCH_* variables read safely (stdlib only; a leaf shared by the hooks, the tuner and
the collector's CLI): a malformed value never raises into training. It gets one console line
(a WARNING of the `starvewatch.settings` logger, once per variable and value in a process)
and a safe meaning:

- a number that does not parse, is not finite or is out of range: the default;
- a boolean other than 1/0, true/false, yes/no, on/off (any case): the default (an unknown
  word never reads as "true");
- a URL written `host:port`: `http://host:port`; any other malformed URL: no collector at all
  (records stay in the spool, nothing is auto-started: the user meant some remote one).
"""
from __future__ import annotations

import logging
import math
import os
import re
import threading
import urllib.parse

log = logging.getLogger("starvewatch.settings")

TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"0", "false", "no", "off", ""}
# `host:port` without a scheme (a name, an IPv4 address or a bracketed IPv6 one).
_HOST_PORT = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]):\d{1,5}/?$")

_said: set[tuple[str, str]] = set()
_said_lock = threading.Lock()


def warn_once(name: str, value: str, meaning: str, quiet: bool = False) -> None:
    """One console line for a malformed `name=value`: what it is read as instead."""
    if quiet:
        return
    with _said_lock:
        if (name, value) in _said:
            return
        _said.add((name, value))
    log.warning("starvewatch: %s=%r is malformed; %s", name, value[:80], meaning)


def number(name: str, default: float, *, minimum: float = 0.0, above_minimum: bool = True,
           integer: bool = False, quiet: bool = False):
    """A number from the environment: the default when unset, or with a line when malformed
    (not a number, not finite, `<= minimum` (or `< minimum` with above_minimum=False))."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip()) if integer else float(raw.strip())
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value < minimum or (above_minimum and value == minimum):
        bound = f"> {minimum:g}" if above_minimum else f">= {minimum:g}"
        kind = "an integer" if integer else "a number"
        warn_once(name, raw, f"it must be {kind} {bound}; using the default {default!r}", quiet)
        return default
    return value


def flag(name: str, default: bool) -> bool:
    """A boolean from the environment: 1/0, true/false, yes/no, on/off; else the default."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    warn_once(name, raw, f"use 1 or 0 (true/false, yes/no, on/off); using the default "
                         f"({'1' if default else '0'})")
    return default


def url_problem(url: str) -> str | None:
    """Why `url` cannot be a collector's URL, or None."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # raises ValueError for a port that is not a number in 0..65535
    except ValueError as exc:
        return str(exc)
    if parts.scheme not in ("http", "https"):
        return "not an http(s) URL"
    if not parts.hostname:
        return "no host"
    return None


def collector_url(raw: str, name: str = "STARVEWATCH_URL") -> str | None:
    """The collector URL a user wrote: `host:port` as http://host:port, a valid http(s) URL
    as it is (without a trailing `/`), anything else None (spool only) with a line."""
    text = raw.strip()
    if url_problem(text) is None:
        return text.rstrip("/")
    if _HOST_PORT.fullmatch(text) and url_problem("http://" + text) is None:
        fixed = ("http://" + text).rstrip("/")
        warn_once(name, raw, f"read as {fixed}")
        return fixed
    warn_once(name, raw, f"{url_problem(text)}: records stay in the spool and no collector is started "
                         f"(write http://HOST:PORT, or off)")
    return None


def token(name: str) -> str | None:
    """A bearer token: surrounding whitespace dropped; one with control characters or non-ASCII
    (it could not be sent in a header) is no token, with a line (the collector then says 401
    and the records stay in the spool)."""
    raw = os.environ.get(name)
    value = (raw or "").strip()
    if not value:
        return None
    if not value.isascii() or not value.isprintable():
        warn_once(name, "<hidden>", "a token is printable ASCII; sending none")
        return None
    return value


def limit_bytes(name: str, quiet: bool = False) -> int:
    """A byte count where 0 (or unset) means "no limit given". `quiet`: where another reading
    of the same variable says the line (the sidecar process reads it too)."""
    return int(number(name, 0, minimum=0, above_minimum=False, integer=True, quiet=quiet))
