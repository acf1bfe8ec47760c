"""Collector settings: one dataclass, from the CLI or the environment."""
from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..defaults import DEFAULT_PORT, default_dir


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class CollectorSettings:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    dir: Path = field(default_factory=default_dir)
    db: Path | None = None
    token: str | None = field(default_factory=lambda: os.environ.get("STARVEWATCH_TOKEN") or None)
    lost_after_s: float = 60.0          # a process silent this long without finishing is lost
    idle_exit_s: float = 0.0            # exit after this long with no live run (0: never)
    spool_scan_s: float = 5.0           # how often the spool directory is swept
    max_body_bytes: int = 4 * 1024 * 1024          # compressed, as sent
    max_decompressed_bytes: int = 32 * 1024 * 1024
    body_timeout_s: float = 30.0        # a request body silent this long is answered 408
    metrics_max_runs: int = 50
    metrics_finished_keep_s: float = 300.0
    dashboard: bool = True
    otlp_endpoint: str | None = None    # OTLP/HTTP metrics endpoint: export there (monitor/otel.py)
    otlp_interval_s: float = 15.0
    tensorboard_dir: Path | None = None  # write per-run scalars there (monitor/tensorboard.py)
    tensorboard_interval_s: float = 5.0
    max_db_bytes: int = 4 * 2**30       # storage budget, -wal and -shm included (monitor/retention.py)
    pid_file_autostarted: bool | None = None  # set by `serve`: write the pid file for `stop`

    @property
    def db_path(self) -> Path:
        return Path(self.db) if self.db else Path(self.dir) / "starvewatch.db"

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

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
                             f"pass --token or set STARVEWATCH_TOKEN")
