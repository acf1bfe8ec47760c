import os

import pytest

import starvewatch
from starvewatch.hooks.transport import MemoryTransport

_DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
              "TORCHELASTIC_RUN_ID", "STARVEWATCH_RUN_ID", "STARVEWATCH_RUN_NAME",
              "STARVEWATCH_TOKEN", "STARVEWATCH_DISABLED")


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
