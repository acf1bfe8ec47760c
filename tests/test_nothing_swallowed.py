"""Errors a loop survives are said once, where the user sees them: never swallowed, never a flood."""
import gzip
import logging
import threading
from pathlib import Path

from starvewatch.logonce import RateLimitedLog
from starvewatch.monitor.web.app import _background
from starvewatch.monitor.web.collector_settings import CollectorSettings
from starvewatch.monitor.storage.spool_import import SpoolImporter
from starvewatch.monitor.storage.store import Store
from tests.conftest import wait_until


def test_rate_limited_log_says_the_first_then_one_line_per_interval_with_a_count(caplog):
    now = [0.0]
    log = RateLimitedLog(logging.getLogger("starvewatch.test"), interval_s=60, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="starvewatch.test"):
        assert log.error("disk", "disk full: %s", "/x") is True
        assert [log.error("disk", "disk full: %s", "/x") for _ in range(5)] == [False] * 5
        assert log.error("other", "another kind") is True  # kinds are limited separately
        now[0] = 61.0
        assert log.error("disk", "disk full: %s", "/x") is True
    assert [r.getMessage() for r in caplog.records] == [
        "disk full: /x", "another kind", "disk full: /x (5 more like this since the last report)"]


def test_a_failing_spool_sweep_is_logged_once_and_the_sweeps_go_on(tmp_path, caplog):
    calls = []

    class FailingImporter:
        def scan(self):
            calls.append(1)
            raise OSError(28, "No space left on device")

    stop = threading.Event()
    store = Store(tmp_path / "db.sqlite")  # sweeps run under the store's once() (one sweeper per spool)
    state = {"importer": FailingImporter(), "stop": stop, "store": store}
    settings = CollectorSettings(dir=tmp_path, spool_scan_s=0.01)
    with caplog.at_level(logging.WARNING, logger="starvewatch.collector"):
        worker = threading.Thread(target=_background, args=(state, settings), daemon=True)
        worker.start()
        try:  # stopped even when the wait fails: a sweeping thread left behind would hang pytest's exit
            wait_until(lambda: len(calls) >= 5, what="five failing sweeps")
        finally:
            stop.set()
            worker.join(10)
    store.close()
    assert not worker.is_alive()
    lines = [r.getMessage() for r in caplog.records if "spool sweep" in r.getMessage()]
    assert len(lines) == 1 and "No space left on device" in lines[0], lines


def test_an_unreadable_spool_file_that_cannot_be_set_aside_is_said_once(tmp_path, caplog, monkeypatch):
    spool = tmp_path / "spool" / "run-a" / "stream-1"
    spool.mkdir(parents=True)
    (spool / "1.json.gz").write_bytes(gzip.compress(b'{"schema": "wrong"}'))
    store = Store(tmp_path / "db.sqlite")
    importer = SpoolImporter(store, tmp_path / "spool")

    def read_only(self, target):
        raise PermissionError(13, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "rename", read_only)
    with caplog.at_level(logging.WARNING, logger="starvewatch.collector"):
        assert importer.scan() == 0
        assert importer.scan() == 0  # skipped, not retried and said again every sweep
    store.close()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "cannot be set aside" in lines[0] and "Read-only" in lines[0], lines
    assert (spool / "1.json.gz").exists()  # nothing lost
