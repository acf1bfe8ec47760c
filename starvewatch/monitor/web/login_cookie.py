"""The login cookie's value: an HMAC of the token under a secret only the collector holds.

A cookie that leaks (a browser sending it where it should not, a proxy log) is then not the
token: it opens this collector's pages in a browser and nothing else, and the hooks' and
CLI's token stays unknown. The secret lives in the data directory, owner-only, so logins
survive a restart; deleting the file logs every browser out.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from pathlib import Path

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
        self.token = settings.token

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
