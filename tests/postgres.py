"""A throw-away PostgreSQL cluster for the tests: its own data directory, socket directory and
port, owned by a non-root user (PostgreSQL refuses to run as root), stopped by PID at the end.

Used by the `postgres_url` fixture (tests/conftest.py) and by benchmarks/postgres_fleet.py. The
binaries are Debian's (`apt-get install postgresql`, which .ci/run does where they are missing):
/usr/lib/postgresql/<version>/bin, or whatever `pg_config --bindir` says.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

RUN_AS = "swpg"  # the non-root user a root test run starts the cluster as (created when missing)


def bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    pg_config = shutil.which("pg_config")
    if pg_config:
        return Path(subprocess.check_output([pg_config, "--bindir"], text=True).strip())
    raise RuntimeError("PostgreSQL is not installed: apt-get install -y postgresql (.ci/run does it)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """initdb + postgres in a new directory; `url` is where to connect; stop() ends it by PID."""

    def __init__(self, root: Path | None = None, settings: dict[str, str] | None = None) -> None:
        self.root = Path(root or tempfile.mkdtemp(prefix="starvewatch-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.settings = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
                         "max_connections": "200", "shared_buffers": "128MB", **(settings or {})}
        self.pid: int | None = None
        self._proc: subprocess.Popen | None = None
        self.log = self.root / "postgres.log"

    def _as_owner(self, argv: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return argv
        return ["runuser", "-u", RUN_AS, "--", *argv]

    def _ensure_user(self) -> None:
        if os.geteuid() != 0:
            return
        try:
            pwd.getpwnam(RUN_AS)
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", RUN_AS],
                           check=True)
        user = pwd.getpwnam(RUN_AS)
        os.chown(self.root, user.pw_uid, user.pw_gid)
        # The user must reach its directory: every parent of a mkdtemp directory is searchable.
        os.chmod(self.root, 0o700)

    def start(self) -> "Cluster":
        bins = bin_dir()
        self._ensure_user()
        subprocess.run(self._as_owner([str(bins / "initdb"), "-D", str(self.data), "-U", "postgres",
                                       "--auth=trust", "--encoding=UTF8", "--no-sync"]),
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        options = [f"-c {k}={v}" for k, v in self.settings.items()]
        options += [f"-p {self.port}", "-c listen_addresses=127.0.0.1", f"-k {self.root}"]
        # postgres itself in the background (not pg_ctl, whose child would be reparented): the PID
        # stop() signals is the postmaster's own, read from its pid file.
        with open(self.log, "ab") as log:
            self._proc = subprocess.Popen(self._as_owner([str(bins / "postgres"), "-D", str(self.data), *" ".join(options).split()]),
                             stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready = subprocess.run([str(bins / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-q"])
            if ready.returncode == 0:
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"PostgreSQL did not start: {self.log.read_text()[-2000:]}")
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])
        return self

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def database(self, name: str) -> str:
        """A new, empty database in this cluster: its URL."""
        import psycopg
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        """Fast shutdown by the postmaster's PID, and the directory removed."""
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGINT)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    os.kill(self.pid, 0)
                    time.sleep(0.05)
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.pid = None
        if self._proc is not None:
            self._proc.wait(30)  # the runuser (or postgres) process, reaped
            self._proc = None
        shutil.rmtree(self.root, ignore_errors=True)
