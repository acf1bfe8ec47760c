"""A full disk (issue 36 item 6): ingest once answered 500, and a resent batch was then counted
twice in the statistics for good (a COMMIT that fails on a full disk has rolled back already,
so the store's ROLLBACK raised before the statistics cache was cleared). Now the answer is 507
and the resent batch counts once."""
import sqlite3

from fastapi.testclient import TestClient

from starvewatch.monitor.web.app import create_app
from starvewatch.monitor.web.collector_settings import CollectorSettings
from tests.test_collector_api import batch, post


class _FullAtCommit:
    """The store's writer connection, whose next COMMIT fails as on a full disk (SQLite rolls
    the transaction back itself, then reports SQLITE_FULL)."""

    def __init__(self, real) -> None:
        self.real, self.fail_next = real, True

    def execute(self, sql, *args):
        if sql == "COMMIT" and self.fail_next:
            self.fail_next = False
            self.real.execute("ROLLBACK")
            raise sqlite3.OperationalError("database or disk is full")
        return self.real.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_a_full_disk_is_507_and_the_resent_batch_counts_once(tmp_path):
    settings = CollectorSettings(dir=tmp_path, dashboard=False, spool_scan_s=60, lost_after_s=3600)
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        store = client.app.state.store
        assert post(client, batch(run_id="r", seq=1, n=100)).status_code == 200
        real = store._writer
        store._writer = _FullAtCommit(real)
        try:
            second = batch(run_id="r", seq=2, n=100, step0=100)
            answer = post(client, second)
            assert answer.status_code == 507 and "disk is full" in answer.text, answer.text
            assert post(client, second).status_code == 200  # resent once the disk has room
        finally:
            store._writer = real
        loader = client.get("/api/v1/runs/r/summary").json()["loaders"][0]
        assert loader["steps"] == 200
        # The statistics (histograms) hold each step once: as many waits as steps.
        dist = client.get("/api/v1/runs/r/distributions?loader=train").json()
        assert dist["wait"]["count"] == 200, dist["wait"]
