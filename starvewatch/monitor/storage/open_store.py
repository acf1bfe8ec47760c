"""Which store a collector opens: a SQLite file (the embedded default, store.py) or a
PostgreSQL database (`--database-url postgresql://...` or STARVEWATCH_DATABASE_URL,
pg_store.py), behind one interface (the Store's methods; MLflow's tracking store is the model).

Its own module because the choice is made once, from a setting, by every opener (serve, import,
the offline readers): psycopg is imported only for a PostgreSQL URL, so the SQLite path needs
no driver."""
from __future__ import annotations

from pathlib import Path

from ..budget import retention


def is_database_url(target) -> bool:
    return isinstance(target, str) and target.split("://", 1)[0] in ("postgresql", "postgres")


def open_store(target: str | Path, max_db_bytes: int = retention.DEFAULT_MAX_DB_BYTES):
    """A Store for a file path (or sqlite:///path), or a PgStore for a postgresql:// URL."""
    if is_database_url(target):
        try:
            from .pg_store import PgStore
        except ModuleNotFoundError as exc:
            raise RuntimeError("a postgresql:// database needs the driver: pip install 'starvewatch[postgres]' "
                               f"({exc})") from None
        return PgStore(str(target), max_db_bytes=max_db_bytes)
    from .store import Store
    text = str(target)
    if text.startswith("sqlite:///"):
        text = text[len("sqlite://"):]
    elif "://" in text:
        raise ValueError(f"{text!r}: a database URL is postgresql://user@host:port/database, "
                         f"or a SQLite file path (sqlite:///path)")
    return Store(Path(text), max_db_bytes=max_db_bytes)


def database_errors() -> tuple[type[BaseException], ...]:
    """The exceptions a store raises when its database is busy, full or unreachable: SQLite's,
    and psycopg's once a PostgreSQL store has loaded it (never imported for a SQLite store)."""
    import sqlite3
    import sys
    psycopg = sys.modules.get("psycopg")
    return (sqlite3.Error,) if psycopg is None else (sqlite3.Error, psycopg.Error)


def storage_exhausted(exc: BaseException) -> bool:
    """The database ran out of space (the batch was rolled back; the sender keeps it and sends
    it again later: 507): SQLite's "database or disk is full", PostgreSQL's disk_full (53100)."""
    import sqlite3
    if isinstance(exc, sqlite3.OperationalError):
        return "full" in str(exc)
    return getattr(exc, "sqlstate", None) == "53100"
