"""The login cookie's value: an HMAC of the token under a secret only the collector holds.

A cookie that leaks (a browser sending it where it should not, a proxy log) is then not the
token: it opens this collector's pages in a browser and nothing else, and the hooks' and
CLI's token stays unknown. The secret lives in the data directory, owner-only, so logins
survive a restart; deleting the file logs every browser out.

A browser logged in with a project token (storage/access_tokens.py) gets a cookie that carries
the token's id, role, projects and expiry under the same HMAC: `p.<expiry>.<id>.<role>.<projects
as base64url JSON>.<HMAC>`. The guard takes the role and projects from it (no copy of the token
anywhere) and checks on each request that the token is not revoked since.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import time
from pathlib import Path

import orjson

SECRET_FILE = "session-secret"


def _secret(directory: Path) -> bytes:
    path = Path(directory) / SECRET_FILE
    try:
        data = path.read_bytes()
        if len(data) >= 32:
            return data
    except FileNotFoundError:
        pass
    Path(directory).mkdir(parents=True, exist_ok=True, mode=0o700)
    data = secrets.token_bytes(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another collector of this directory made it meanwhile
        return path.read_bytes()
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    return data


SESSION_S = 12 * 3600  # a login lasts this long; then the browser logs in again (?token=)


def _mac(key: bytes, token: str, expires_s: int) -> str:
    return hmac.new(key, f"starvewatch-session\0{token}\0{expires_s}".encode(), hashlib.sha256).hexdigest()


class Sessions:
    """Login cookies of one collector: `<expiry>.<HMAC of token and expiry>`. A cookie reads
    pages only (guard.py: never ingest, delete or store), and expires after SESSION_S."""

    def __init__(self, settings) -> None:
        self.key = _secret(settings.dir)
        self.token = settings.token or ""

    # ---- a project token's login ------------------------------------------------------------
    PROJECT_PREFIX = "p."

    def new_project_value(self, token_id: str, role: str, projects, now_s: float | None = None) -> str:
        expires_s = int(now_s if now_s is not None else time.time()) + SESSION_S
        packed = base64.urlsafe_b64encode(orjson.dumps(list(projects))).decode().rstrip("=")
        body = f"{expires_s}.{token_id}.{role}.{packed}"
        return f"{self.PROJECT_PREFIX}{body}.{_mac(self.key, 'project', body)}"

    def project_login(self, value: str, now_s: float | None = None) -> tuple[str, str, tuple] | None:
        """(token id, role, projects) of a valid, unexpired project cookie; None otherwise."""
        body, _, mac = value[len(self.PROJECT_PREFIX):].rpartition(".")
        if not (value.startswith(self.PROJECT_PREFIX) and body and hmac.compare_digest(
                mac.encode("utf-8", "surrogateescape"), _mac(self.key, "project", body).encode())):
            return None
        expiry, token_id, role, packed = body.split(".", 3)
        now_s = now_s if now_s is not None else time.time()
        if not (expiry.isdigit() and now_s < int(expiry) <= now_s + SESSION_S + 60):
            return None
        projects = orjson.loads(base64.urlsafe_b64decode(packed + "=" * (-len(packed) % 4)))
        return token_id, role, tuple(projects)

    def new_value(self, now_s: float | None = None) -> str:
        expires_s = int(now_s if now_s is not None else time.time()) + SESSION_S
        return f"{expires_s}.{_mac(self.key, self.token, expires_s)}"

    def valid(self, value: str, now_s: float | None = None) -> bool:
        expiry, _, mac = value.partition(".")
        if not (expiry.isdigit() and len(expiry) <= 12 and mac):
            return False
        expires_s = int(expiry)
        now_s = now_s if now_s is not None else time.time()
        if not now_s < expires_s <= now_s + SESSION_S + 60:
            return False
        return hmac.compare_digest(mac.encode("utf-8", "surrogateescape"), _mac(self.key, self.token, expires_s).encode())
