"""Project tokens (issue 40 item 3): `starvewatch token create --project P --role R`, listed
without their secret, revocable, kept in the store's `tokens` table (SQLite or PostgreSQL,
through the store's migrations).

A token is `swt_<id>_<secret>` (secrets.token_urlsafe: 256 bits). The table keeps the id, the
role, the projects and the SHA-256 digest of the whole token, never the token: a copy of the
database opens nothing. A plain digest, not a slow password hash: the secret is random and
long, so nothing is gained by slowing its check, and the guard checks it on every request.

Roles (monitor/web/access_rules.py says which routes each may use): `write` sends records to
its project (a training job), `read` reads its projects (a viewer), `admin` does everything on
its projects, deleting runs included. `--project '*'` is every project.
"""
from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass

import orjson

from .write_transaction import immediate_transaction

ROLES = ("write", "read", "admin")
PREFIX = "swt_"
ALL_PROJECTS = "*"
MAX_PROJECT_CHARS = 200


@dataclass(frozen=True)
class AccessToken:
    id: str
    role: str
    projects: tuple[str, ...]  # ("*",): every project
    created_at: float
    revoked_at: float | None = None

    @property
    def visible(self) -> frozenset | None:
        """The projects it sees (None: every run)."""
        return None if ALL_PROJECTS in self.projects else frozenset(self.projects)

    def listed(self) -> dict:
        return {"id": self.id, "role": self.role, "projects": list(self.projects),
                "created_at": self.created_at, "revoked": self.revoked_at is not None,
                "revoked_at": self.revoked_at}


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def looks_like(token: str | None) -> bool:
    return token is not None and token.startswith(PREFIX)


def _check(role: str, projects) -> tuple[str, ...]:
    if role not in ROLES:
        raise ValueError(f"role {role!r}: one of {', '.join(ROLES)}")
    projects = tuple(dict.fromkeys(p.strip() for p in projects))
    if not projects or any(not p or len(p) > MAX_PROJECT_CHARS or not p.isprintable() for p in projects):
        raise ValueError(f"a token needs at least one project: printable, 1 to {MAX_PROJECT_CHARS} characters")
    if role == "write" and len(projects) != 1:
        raise ValueError("a write token sends to one project: give --project once")
    return projects


def create(store, role: str, projects) -> tuple[AccessToken, str]:
    """A new token: its record and the token itself (shown once, stored only as a digest)."""
    projects = _check(role, projects)
    token_id = secrets.token_hex(6)
    token = f"{PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
    record = AccessToken(token_id, role, projects, time.time())
    with store._write_lock:
        with immediate_transaction(store._writer):
            store._writer.execute("INSERT INTO tokens (id, digest, role, projects, created_at) VALUES (?, ?, ?, ?, ?)",
                                  (token_id, digest(token), role, orjson.dumps(list(projects)).decode(),
                                   record.created_at))
    return record, token


def _record(row) -> AccessToken:
    return AccessToken(row[0], row[1], tuple(orjson.loads(row[2])), row[3], row[4])


_COLUMNS = "id, role, projects, created_at, revoked_at"


def listed(store) -> list[AccessToken]:
    rows = store.reader().execute(f"SELECT {_COLUMNS} FROM tokens ORDER BY created_at, id").fetchall()
    return [_record(r) for r in rows]


def revoke(store, token_id: str) -> bool:
    """Revoke a token by id; False when no such token is live."""
    with store._write_lock:
        with immediate_transaction(store._writer):
            done = store._writer.execute("UPDATE tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
                                         (time.time(), token_id)).rowcount
    return done > 0


def find(store, token: str) -> AccessToken | None:
    """The live token this is, or None (unknown or revoked)."""
    if not looks_like(token):
        return None
    row = store.reader().execute(f"SELECT {_COLUMNS} FROM tokens WHERE digest = ? AND revoked_at IS NULL",
                                 (digest(token),)).fetchone()
    return _record(row) if row else None


def live(store, token_id: str) -> bool:
    """Whether the token of this id is still live (a login cookie names its token's id)."""
    row = store.reader().execute("SELECT 1 FROM tokens WHERE id = ? AND revoked_at IS NULL", (token_id,)).fetchone()
    return row is not None
