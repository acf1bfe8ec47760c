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


def session_value(settings) -> bytes:
    """The cookie value for `settings.token`, as ASCII bytes (hex)."""
    key = _secret(settings.dir)
    return hmac.new(key, f"starvewatch-session\0{settings.token}".encode(), hashlib.sha256).hexdigest().encode()
