import os

import pytest

import starvewatch
from starvewatch.hooks.delivery.transport import MemoryTransport

_DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
              "TORCHELASTIC_RUN_ID", "STARVEWATCH_RUN_ID", "STARVEWATCH_RUN_NAME",
              "STARVEWATCH_TOKEN", "STARVEWATCH_DISABLED", "STARVEWATCH_DATABASE_URL")


@pytest.fixture(autouse=True)
def isolated_starvewatch(tmp_path, monkeypatch):
    """Each test: its own STARVEWATCH_DIR, no auto-started collector, no network."""
    monkeypatch.setenv("STARVEWATCH_DIR", str(tmp_path / "sw"))
    monkeypatch.setenv("STARVEWATCH_AUTOSTART", "0")
    monkeypatch.setenv("STARVEWATCH_URL", "off")
    monkeypatch.setenv("STARVEWATCH_QUIET", "1")
    for name in _DIST_VARS:
        monkeypatch.delenv(name, raising=False)
    yield tmp_path / "sw"
    starvewatch.finish()


@pytest.fixture
def memory_run():
    """A run whose batches are kept in memory, for asserting on what was shipped."""
    transport = MemoryTransport()
    session = starvewatch.init("test-run", transport=transport)
    return session, transport


def shipped_steps(transport) -> list[tuple]:
    """(loader, epoch, step) of every shipped record, in order."""
    out = []
    for payload in transport.payloads:
        s = payload["steps"]
        out.extend(zip(s["loader"], s["epoch"], s["step"]))
    return out


def shipped_column(transport, column: str, loader: str | None = None) -> list:
    out = []
    for payload in transport.payloads:
        s = payload["steps"]
        for name, value in zip(s["loader"], s[column]):
            if loader is None or name == loader:
                out.append(value)
    return out


os.environ.setdefault("PYTHONHASHSEED", "0")


# ---- a real collector on a free loopback port ---------------------------------------------
import json as _json
import signal as _signal
import socket as _socket
import subprocess as _subprocess
import sys as _sys
import time as _time
import urllib.request as _request


def free_port() -> int:
    with _socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout_s: float = 20.0, what: str = "condition"):
    """Poll a condition with a deadline (waiting for an event, never a blind sleep)."""
    deadline = _time.monotonic() + timeout_s
    while _time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        _time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class Collector:
    def __init__(self, directory, port=None, token=None, extra=()):
        self.directory = directory
        self.port = port or free_port()
        self.token = token
        self.extra = list(extra)
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None
        self.log = None

    def start(self):
        cmd = [_sys.executable, "-m", "starvewatch", "serve", "--port", str(self.port),
               "--dir", str(self.directory), *self.extra]
        if self.token:
            cmd += ["--token", self.token]
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.log is not None:
            self.log.close()
        self.log = open(self.directory / f"collector-{self.port}.log", "ab")
        self.proc = _subprocess.Popen(cmd, stdout=self.log, stderr=self.log)
        # A deadline for an event, not a measurement: at a load average of 12 on 2 cores the
        # import of uvicorn + FastAPI alone ran past 20 s.
        wait_until(self.healthy, timeout_s=60, what=f"collector on {self.url}")
        return self

    def healthy(self):
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"collector exited with {self.proc.returncode}: "
                                 f"{(self.directory / f'collector-{self.port}.log').read_text()[-2000:]}")
        try:
            return self.get("/healthz")["service"] == "starvewatch"
        except OSError:
            return False

    def request(self, method, path, body=None, headers=None):
        req = _request.Request(self.url + path, data=body, method=method, headers=dict(headers or {}))
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with _request.urlopen(req, timeout=30) as resp:
                return resp.status, resp.read()
        except _request.HTTPError as err:
            with err:
                return err.code, err.read()

    def get(self, path):
        status, body = self.request("GET", path)
        assert status == 200, (status, body[:500])
        return _json.loads(body)

    def kill(self, sig=_signal.SIGKILL):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(20)

    def stop(self):
        self.kill(_signal.SIGTERM)
        if self.log:
            self.log.close()


@pytest.fixture
def collector(isolated_starvewatch):
    """Start real collectors (uvicorn subprocesses); every one is stopped by PID at the end."""
    started = []

    def start(**kwargs):
        c = Collector(isolated_starvewatch, **kwargs)
        started.append(c)  # before start(): one that never answers is killed too, not left behind
        return c.start()

    yield start
    for c in started:
        c.kill()
        if c.log:
            c.log.close()


@pytest.fixture
def browser():
    """A real headless Chromium (tests/browser.py), closed when the test ends."""
    from tests.browser import chromium
    with chromium() as b:
        yield b


# ---- both hot-path cores (issue 29) ----------------------------------------------------------
# These files exercise the per-batch path (segments, rotation, step() switching, the CUDA
# stand-in): each of their tests runs once per core, the compiled one where it is built (a
# checkout without it runs the Python core only; test_core.py says whether it was built).
HOT_PATH_FILES = {"test_watch_semantics", "test_measurement", "test_hooks_input", "test_several_loaders",
                  "test_delivery_bugs"}


def pytest_generate_tests(metafunc):
    if "hot_path_core" in metafunc.fixturenames and metafunc.module.__name__.rsplit(".", 1)[-1] in HOT_PATH_FILES:
        from starvewatch.hooks import core
        metafunc.parametrize("hot_path_core", ["python", "c"] if core.c_available() else ["python"],
                             indirect=True)


@pytest.fixture(autouse=True)
def hot_path_core(request, monkeypatch):
    """The core a hot-path test runs on (also for the processes it starts: STARVEWATCH_CORE)."""
    from starvewatch.hooks import core
    wanted = getattr(request, "param", None)
    before = core.current()
    if wanted is not None:
        monkeypatch.setenv(core.ENV, wanted)
        core.use(wanted)
    try:
        yield core.current()
    finally:
        if core.current() != before:  # a test that switched cores leaves the next one as it found it
            core.use(before)


# ---- a real PostgreSQL (tests/postgres.py) -----------------------------------------------------
@pytest.fixture(scope="session")
def postgres_cluster():
    """One throw-away PostgreSQL cluster for the session (its own directory, port and non-root
    owner), stopped by PID at the end. Never skipped: CI installs PostgreSQL (.ci/run)."""
    from tests.postgres import Cluster
    cluster = Cluster().start()
    yield cluster
    cluster.stop()


@pytest.fixture
def postgres_url(postgres_cluster, request):
    """A new, empty database in the session's cluster: its postgresql:// URL."""
    import re as _re
    name = "t_" + _re.sub(r"\W", "_", request.node.name.lower())[:40] + f"_{os.getpid()}_{_time.monotonic_ns() % 10**6}"
    return postgres_cluster.database(name)
