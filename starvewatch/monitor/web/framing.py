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


# The pages' script policy (issue 36 item 1), set once the dashboard is mounted: scripts from
# this origin only, plus the inline scripts Dash itself writes into its page, each allowed by
# its hash (`Dash.csp_hashes()`: the renderer's start-up line `var renderer = new DashRenderer();`
# and the clientside callbacks' functions). Plotly and Dash inject <style> elements (hence
# 'unsafe-inline' for styles, never for scripts); figures export images as data: URLs; the
# callbacks' WebSocket and requests go to this origin ('self' covers ws: there). An iframe's
# srcdoc inherits the policy, so even a component injected by a stored record runs no script.
_page_policy = {"value": b"default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                         b"img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; "
                         b"object-src 'none'; base-uri 'none'; form-action 'self'"}


def set_script_hashes(hashes: list[str]) -> None:
    """Allow Dash's own inline scripts (their CSP hashes) on every page of this collector."""
    _page_policy["value"] = (
        "default-src 'self'; script-src 'self' " + " ".join(hashes) + "; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; object-src 'none'; "
        "base-uri 'none'; form-action 'self'").encode("latin-1")


def page_policy(ancestors: bytes) -> bytes:
    return _page_policy["value"] + b"; " + ancestors


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
    """`security_headers` with the pages' script policy, and the framing rule of a run page
    when `scope` asks for one."""
    kept = tuple(h for h in security_headers if h[0] != b"content-security-policy")
    if scope.get("method") not in ("GET", "HEAD") or not scope.get("path", "").startswith(EMBEDDABLE_PREFIX):
        return (*kept, (b"content-security-policy", page_policy(b"frame-ancestors 'none'")))
    kept = tuple(h for h in kept if h[0] not in _FRAMING)
    return (*kept, (b"content-security-policy",
                    page_policy(_ancestors(os.environ.get("STARVEWATCH_FRAME_ANCESTORS", "")))))
