"""Who may show a run page in a frame: a notebook shows the live run page inline (an IFrame,
as TensorBoard's `%tensorboard` does), so `/runs/...` pages may be framed by pages of this
machine's loopback origins (JupyterLab, Notebook), by VS Code's notebook webviews, by the
collector's own origin (JupyterHub's jupyter-server-proxy serves both under one origin) and by
the origins in STARVEWATCH_FRAME_ANCESTORS (Colab sets its own). Every other response keeps
forbidding framing. A page of another site can still never frame the collector."""
from __future__ import annotations

import functools
import logging
import os
import re

log = logging.getLogger("starvewatch.collector")

EMBEDDABLE_PREFIX = "/runs/"
# No `http://[::1]:*`: CSP source expressions take no IPv6 literal (Chromium reports the whole
# directive's source as invalid on every run page); a notebook at [::1] can use localhost.
DEFAULT_ANCESTORS = ("'self'", "http://localhost:*", "http://127.0.0.1:*",
                     "vscode-webview:")
# An origin a user may add: http(s)://host[:port|:*], with at most a leading `*.` label.
_SOURCE = re.compile(r"^https?://(?:\*\.)?[a-z0-9-]+(?:\.[a-z0-9-]+)*(?::(?:\d{1,5}|\*))?$")
_FRAMING = (b"x-frame-options", b"content-security-policy")


@functools.lru_cache(maxsize=4)
def _ancestors(extra: str) -> bytes:
    sources = list(DEFAULT_ANCESTORS)
    for source in extra.split():
        if _SOURCE.fullmatch(source.lower()):
            sources.append(source.lower())
        else:
            log.warning("starvewatch: STARVEWATCH_FRAME_ANCESTORS: %r is not an origin; ignored", source[:80])
    return ("frame-ancestors " + " ".join(sources)).encode("latin-1")


def response_headers(scope: dict, security_headers: tuple) -> tuple:
    """`security_headers`, with the framing rule of a run page when `scope` asks for one."""
    if scope.get("method") not in ("GET", "HEAD") or not scope.get("path", "").startswith(EMBEDDABLE_PREFIX):
        return security_headers
    kept = tuple(h for h in security_headers if h[0] not in _FRAMING)
    return (*kept, (b"content-security-policy", _ancestors(os.environ.get("STARVEWATCH_FRAME_ANCESTORS", ""))))
