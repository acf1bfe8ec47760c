"""Collector settings: one dataclass, from the CLI or the environment."""
from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path

from ...defaults import DEFAULT_PORT, default_dir
from ...limits import MAX_BODY_BYTES, MAX_DECOMPRESSED_BYTES


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


MIN_NETWORK_TOKEN_CHARS = 16  # a token guessable from the network would guard nothing


@dataclass
class CollectorSettings:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    dir: Path = field(default_factory=default_dir)
    db: Path | None = None
    # A PostgreSQL database shared by any number of collectors (monitor/storage/pg_store.py)
    database_url: str | None = field(default_factory=lambda: os.environ.get("STARVEWATCH_DATABASE_URL") or None)
    token: str | None = field(default_factory=lambda: os.environ.get("STARVEWATCH_TOKEN") or None)
    lost_after_s: float = 60.0          # a process silent this long without finishing is lost
    idle_exit_s: float = 0.0            # exit after this long with no live run (0: never)
    spool_scan_s: float = 5.0           # how often the spool directory is swept
    max_body_bytes: int = MAX_BODY_BYTES          # compressed, as sent (starvewatch/limits.py)
    max_decompressed_bytes: int = MAX_DECOMPRESSED_BYTES
    body_timeout_s: float = 30.0        # a request body silent this long is answered 408
    metrics_max_runs: int = 50
    metrics_finished_keep_s: float = 300.0
    dashboard: bool = True
    otlp_endpoint: str | None = None    # OTLP/HTTP metrics endpoint: export there (monitor/outputs/otel.py)
    otlp_interval_s: float = 15.0
    tensorboard_dir: Path | None = None  # write per-run scalars there (monitor/outputs/tensorboard.py)
    tensorboard_interval_s: float = 5.0
    max_db_bytes: int = 4 * 2**30       # storage budget, -wal and -shm included (monitor/budget/retention.py)
    pid_file_autostarted: bool | None = None  # set by `serve`: write the pid file for `stop`
    # Before the token is checked (monitor/web/connections.py, guard.py): what one connection may cost.
    min_body_bytes_per_s: float = 1024.0  # a body slower than this (after body_timeout_s) is cut
    header_timeout_s: float = 10.0      # request line and headers must arrive within this
    keep_alive_timeout_s: float = 5.0   # an idle kept-alive connection is closed after this
    max_header_bytes: int = 64 * 1024   # request line and headers together
    max_connections: int = 100          # open connections at once; more are closed at once
    ssl_certfile: Path | None = None    # TLS (uvicorn's): both files, or neither
    ssl_keyfile: Path | None = None
    # The user's own (local_secrets.py), loaded by `serve`: the collector key answers training's
    # challenge on /healthz; the per-user token opens a loopback collector to its user.
    collector_key: str | None = None
    local_token: str | None = None

    @property
    def db_path(self) -> Path:
        return Path(self.db) if self.db else Path(self.dir) / "starvewatch.db"

    @property
    def store_target(self) -> str | Path:
        """What the collector opens: the database URL when one is set, else the SQLite file."""
        return self.database_url or self.db_path

    @property
    def store_label(self) -> str:
        """The store for a banner: the URL without its password, or the file."""
        if not self.database_url:
            return f"db {self.db_path}"
        from urllib.parse import urlsplit
        parts = urlsplit(self.database_url)
        return "database " + (self.database_url.replace(f":{parts.password}@", ":***@") if parts.password
                              else self.database_url)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "https" if self.ssl_certfile else "http"
        return f"{scheme}://{host}:{self.port}"

    def check(self) -> None:
        """Refuse settings that would expose training data to the network."""
        if not self.body_timeout_s > 0:
            raise ValueError(f"the body timeout must be a positive number of seconds, got {self.body_timeout_s}")
        if self.token is not None and not (self.token.isascii() and self.token.isprintable()
                                           and " " not in self.token and ";" not in self.token):
            raise ValueError("the token must be printable ASCII without spaces or ';' "
                             "(for example: python -c 'import secrets; print(secrets.token_urlsafe())')")
        if not is_loopback(self.host) and not self.token:
            raise ValueError(f"binding {self.host} (not loopback) requires a token: "
                             f"set STARVEWATCH_TOKEN or pass --token-file")
        if not is_loopback(self.host) and len(self.token) < MIN_NETWORK_TOKEN_CHARS:
            raise ValueError(f"binding {self.host} (not loopback) needs a token of at least "
                             f"{MIN_NETWORK_TOKEN_CHARS} characters, got {len(self.token)} "
                             f"(python -c 'import secrets; print(secrets.token_urlsafe())' makes one)")
        for name in ("min_body_bytes_per_s", "header_timeout_s", "keep_alive_timeout_s"):
            value = getattr(self, name)
            if not (value > 0 and value != float("inf")):
                raise ValueError(f"{name} must be a positive number, got {value}")
        for name in ("max_header_bytes", "max_connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise ValueError("TLS needs both --ssl-certfile and --ssl-keyfile")
