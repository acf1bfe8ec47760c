"""Delivery details of issue 26, each found by reading the code; every test here failed before
its fix. Counts are what the collector stored (its CSV export) where a collector is involved."""
import csv
import errno
import gzip
import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from starvewatch.hooks.delivery import transport as transport_module
from starvewatch.hooks.delivery.account import Warnings
from starvewatch.hooks.delivery.transport import Delivery, HttpTransport, MemoryTransport, Spool


@pytest.fixture(scope="module")
def shared_collector(tmp_path_factory):
    from tests.conftest import Collector
    c = Collector(tmp_path_factory.mktemp("collector")).start()
    yield c
    c.stop()


def payload(seq: int, n: int, run_id: str = "details", first_step: int = 0) -> dict:
    steps = {"loader": ["train"] * n, "epoch": [0] * n, "step": list(range(first_step, first_step + n)),
             "start_ns": [10**18 + i for i in range(first_step, first_step + n)],
             "wait_ns": [(i * 7919) % 10**6 for i in range(n)], "compute_ns": [5] * n, "other_ns": [0] * n,
             "batch_size": [None] * n, "gpu_idle_ns": [None] * n}
    return {"schema": "starvewatch.events/1", "run_id": run_id, "stream": f"{run_id}-s", "seq": seq,
            "loaders": [{"name": "train", "totals": {"steps": first_step + n, "epochs": 1}}], "steps": steps}


def stored_steps(c, run_id: str) -> list[tuple[int, int]]:
    """(epoch, step) of every row the collector stored, from its CSV export."""
    status, body = c.request("GET", f"/api/v1/runs/{run_id}/export?format=csv")
    assert status == 200, body[:300]
    rows = list(csv.DictReader(io.StringIO(body.decode())))
    return [(int(r["epoch"]), int(r["step"])) for r in rows]


def offline_spool(tmp_path, batches: int, n: int) -> Path:
    directory = tmp_path / "sw" / "spool" / "details" / "s"
    offline = Delivery(None, Spool(directory, 2**24))
    for seq in range(1, batches + 1):
        offline.deliver(payload(seq, n, first_step=(seq - 1) * n))
    return directory


def test_a_spool_that_cannot_be_listed_for_a_moment_is_not_counted_twice(tmp_path, monkeypatch):
    """Before: an OSError while listing read as an empty spool, so every indexed file counted
    as acknowledged (taken by the collector); the next listing found them again: counted twice."""
    directory = offline_spool(tmp_path, 3, 10)
    delivery = Delivery(None, Spool(directory, 2**24))
    assert delivery.account() == {"acknowledged": 0, "spooled": 30, "dropped": {}}
    real_iterdir = Path.iterdir

    def failing(self):
        if self == directory:
            raise OSError(errno.EIO, "Input/output error")
        return real_iterdir(self)

    monkeypatch.setattr(Path, "iterdir", failing)
    assert delivery.spool.pending() == []  # nothing to replay now
    assert delivery.account() == {"acknowledged": 0, "spooled": 30, "dropped": {}}
    monkeypatch.setattr(Path, "iterdir", real_iterdir)
    assert len(delivery.spool.pending()) == 3
    assert delivery.account() == {"acknowledged": 0, "spooled": 30, "dropped": {}}


def test_delivered_files_that_cannot_be_removed_are_not_replayed_again(tmp_path, monkeypatch):
    """Before: a failing unlink left delivered files in the spool; the next replay sent them
    again and counted them acknowledged again."""
    directory = offline_spool(tmp_path, 2, 10)
    transport = MemoryTransport()
    delivery = Delivery(transport, Spool(directory, 2**24))
    real_unlink = Path.unlink

    def read_only(self, missing_ok=False):
        if self.parent == directory:
            raise OSError(errno.EROFS, "Read-only file system")
        return real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", read_only)
    assert delivery.replay() is True
    assert delivery.replay() is True
    assert [p["seq"] for p in transport.payloads] == [1, 2]  # each sent once
    assert delivery.account() == {"acknowledged": 20, "spooled": 0, "dropped": {}}
    assert len(list(directory.iterdir())) == 2  # still there: the directory is read-only
    monkeypatch.setattr(Path, "unlink", real_unlink)
    assert delivery.spool.pending() == []  # removed at the next listing, not sent again
    assert delivery.replay() is True
    assert list(directory.iterdir()) == [] and len(transport.payloads) == 2


def test_a_transient_read_error_during_replay_keeps_the_file(tmp_path, monkeypatch):
    """Before: any OSError while reading a spooled batch deleted it as a torn file."""
    directory = offline_spool(tmp_path, 2, 10)
    transport = MemoryTransport()
    delivery = Delivery(transport, Spool(directory, 2**24))
    real_read = transport_module.read_spool_file
    calls = []

    def flaky(path):
        calls.append(path)
        if len(calls) == 1:
            raise OSError(errno.EIO, "Input/output error")
        return real_read(path)

    monkeypatch.setattr(transport_module, "read_spool_file", flaky)
    assert delivery.replay() is False  # tried again later
    assert len(list(directory.iterdir())) == 2 and transport.payloads == []
    assert delivery.replay() is True
    assert [p["seq"] for p in transport.payloads] == [1, 2]
    assert delivery.account() == {"acknowledged": 20, "spooled": 0, "dropped": {}}


def test_a_spool_file_that_is_not_a_batch_is_kept_aside_and_counted(tmp_path):
    directory = offline_spool(tmp_path, 2, 10)
    first = sorted(directory.iterdir())[0]
    first.write_bytes(gzip.compress(b'{"schema": ')[:-4])  # torn
    delivery = Delivery(MemoryTransport(), Spool(directory, 2**24))
    delivery.account()  # indexes both files: one of 10 records unreadable, counted 0 (unknown)
    assert delivery.replay() is True
    kept = tmp_path / "sw" / "rejected" / "details" / "s" / first.name
    assert kept.exists() and not first.exists()
    assert delivery.account()["acknowledged"] == 10


def test_a_batch_split_on_413_and_replayed_smaller_is_stored_once(shared_collector, tmp_path):
    """Before: the parts of a split batch were keyed by part number, so a replay split into
    smaller parts stored the records of some parts twice."""
    from benchmarks.faultproxy import FaultProxy
    c = shared_collector
    proxy = FaultProxy(c.port)
    n = 4000
    try:
        one = len(gzip.compress(json.dumps(payload(1, n, "resplit")).encode(), 1))
        proxy.max_body = int(one * 0.7)  # the whole batch is too large, its halves pass
        proxy.fail_after = 1  # the first half is stored, then the collector fails
        directory = tmp_path / "sw" / "spool" / "resplit" / "s"
        delivery = Delivery(HttpTransport(proxy.url), Spool(directory, 2**24), min_backoff_s=0.0)
        delivery.deliver(payload(1, n, "resplit"))
        assert delivery.max_records == n // 2 and len(list(directory.iterdir())) == 1  # spooled whole
        assert len(stored_steps(c, "resplit")) == n // 2
        proxy.mode = "pass"
        proxy.max_body = int(one * 0.3)  # smaller now: quarters
        delivery.reset_backoff()
        assert delivery.replay() is True
        assert delivery.max_records < n // 2
        delivery.transport.close()
    finally:
        proxy.close()
    stored = stored_steps(c, "resplit")
    assert len(stored) == len(set(stored)) == n
    assert delivery.account() == {"acknowledged": n, "spooled": 0, "dropped": {}}


def test_retries_back_off_with_jitter():
    """Before: every process retried after exactly 0.5, 1, 2, ... s: ranks that lost the
    collector together came back together."""
    delays = []
    for seed in range(20):
        delivery = Delivery(MemoryTransport(), Spool(Path("/nonexistent"), 1), min_backoff_s=1.0,
                            max_backoff_s=8.0)
        delivery.random.seed(seed)
        mine = []
        for _ in range(5):
            before = transport_module.time.monotonic()
            delivery._failed(OSError("down"))
            mine.append(delivery._retry_at - before)
        delays.append(mine)
    for attempt, nominal in enumerate([1.0, 2.0, 4.0, 8.0, 8.0]):
        values = [d[attempt] for d in delays]
        assert all(0.5 * nominal - 0.01 <= v <= nominal + 0.01 for v in values), values
        assert max(values) - min(values) > 0.2 * nominal  # spread, not lockstep


def test_a_collector_that_recovers_and_fails_again_is_said_again(collector, tmp_path):
    """Before: each kind of warning was printed once per process lifetime: an outage an hour
    after the first one went unsaid, and recovery was never said."""
    c = collector()
    console = io.StringIO()
    delivery = Delivery(HttpTransport(c.url, timeout_s=5), Spool(tmp_path / "spool" / "r" / "s", 2**24),
                        min_backoff_s=0.0, warnings=Warnings(stream=console))
    seq = iter(range(1, 100))
    delivery.deliver(payload(next(seq), 5, "outages"))
    for outage in range(2):
        c.kill()
        delivery.deliver(payload(next(seq), 5, "outages"))
        c.start()
        delivery.reset_backoff()
        assert delivery.replay() is True
        delivery.deliver(payload(next(seq), 5, "outages"))
    delivery.transport.close()
    lines = console.getvalue().splitlines()
    assert [line.split(":")[1].strip() for line in lines] == ["warning", "delivery recovered"] * 2, lines
    assert all("does not answer" in line for line in lines[0::2]), lines
    assert len(stored_steps(c, "outages")) == 5 * 5


QUIET = r"""
import json, logging, sys, starvewatch
mine = []
class Mine(logging.Handler):
    def emit(self, record):
        mine.append(record.getMessage())
logging.getLogger("my.app").addHandler(Mine())
logging.getLogger("my.app").propagate = False
for _ in starvewatch.watch(range(10)):
    pass
logging.getLogger("starvewatch.delivery").warning("starvewatch: a spool problem")
logging.getLogger("starvewatch.hooks").error("starvewatch: shipping records failed")
logging.getLogger().addHandler(Mine())  # the user's own root handler still gets ours
logging.getLogger("starvewatch.hooks").warning("starvewatch: seen by the user's handler")
starvewatch.finish()
print(json.dumps(mine))
"""


@pytest.mark.parametrize("quiet", ["1", "0"])
def test_quiet_silences_the_console_lines_and_keeps_the_users_handlers(quiet, tmp_path):
    env = dict(os.environ, STARVEWATCH_QUIET=quiet, STARVEWATCH_URL="off", STARVEWATCH_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", QUIET], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == ["starvewatch: seen by the user's handler"]
    if quiet == "1":
        assert out.stderr == ""
    else:
        assert "a spool problem" in out.stderr and "shipping records failed" in out.stderr


def test_the_tensorboard_writer_says_why_it_cannot_write(tmp_path, caplog):
    from starvewatch.monitor.web.collector_settings import CollectorSettings
    from starvewatch.monitor.outputs.tensorboard import TensorBoardWriter

    def broken_query():
        raise OSError(errno.ENOSPC, "No space left on device")

    writer = TensorBoardWriter(broken_query, CollectorSettings(dir=tmp_path), tmp_path / "tb", interval_s=60)
    with caplog.at_level(logging.WARNING, logger="starvewatch.collector"):
        writer._write_logged()
        writer._write_logged()  # the same failure again: held back, not a flood
        writer.close()
    lines = [r.getMessage() for r in caplog.records if "TensorBoard" in r.getMessage()]
    assert len(lines) == 1 and "No space left on device" in lines[0], lines


def test_the_reliability_page_names_every_drop_reason():
    readme = (Path(__file__).resolve().parents[1] / "docs" / "reliability.md").read_text()
    from starvewatch.hooks.delivery import account
    reasons = ["spool_full", "disk_full", "spool_unwritable", "spool_error", "rejected", "too_large",
               "sidecar_died", "sidecar_error", "buffer_full", "unreadable_spool"]
    for reason in reasons:
        assert f"`{reason}`" in readme, reason
        assert f"`{reason}`" in account.__doc__, reason


def test_a_batch_over_the_inflated_size_limit_is_split_before_it_is_sent(monkeypatch):
    """Records per list are not the only limit: 32 MiB inflated (long loader names, many
    phases). Lowered here so that a few thousand records pass it."""
    monkeypatch.setattr(transport_module, "MAX_DECOMPRESSED_BYTES", 50_000)
    transport = MemoryTransport()
    delivery = Delivery(transport, Spool(Path("/nonexistent"), 1))
    big = payload(1, 3000, "bytes")
    big["steps"]["loader"] = ["l" * 150] * 3000
    delivery.deliver(big)
    sizes = [len(transport_module.dumps(p)) for p in transport.payloads]
    assert len(sizes) > 1 and max(sizes) <= 50_000, sizes
    steps = [s for p in transport.payloads for s in p["steps"]["step"]]
    assert steps == list(range(3000))
    assert [p["part"][0] for p in transport.payloads] == sorted(p["part"][0] for p in transport.payloads)
    assert delivery.account() == {"acknowledged": 3000, "spooled": 0, "dropped": {}}


def test_a_collector_with_lower_limits_answers_413_and_the_sender_splits(collector, tmp_path, monkeypatch):
    """A collector started with lower limits than the training process's: a list over its limit
    is a 413 (split and resend), not a 422 (set aside as invalid and dropped)."""
    monkeypatch.setenv("STARVEWATCH_MAX_BATCH_RECORDS", "300")  # the collector's only: this process keeps 50,000
    c = collector()
    delivery = Delivery(HttpTransport(c.url), Spool(tmp_path / "spool" / "low" / "s", 2**24))
    delivery.deliver(payload(1, 1000, "lower-limits"))
    delivery.transport.close()
    assert delivery.max_records is not None and delivery.max_records <= 300
    assert delivery.account() == {"acknowledged": 1000, "spooled": 0, "dropped": {}}
    stored = stored_steps(c, "lower-limits")
    assert len(stored) == len(set(stored)) == 1000
