"""The collector keeps each process's delivery account and says when a run was lost."""
import json
import os
import signal
import subprocess
import sys

from starvewatch.dashboard import views
from tests.conftest import free_port, wait_until

JSON = {"Content-Type": "application/json"}


def batch(stream: str, seq: int, delivery: dict | None, run_id: str = "acct") -> bytes:
    body = {"schema": "starvewatch.events/1", "run_id": run_id, "stream": stream, "seq": seq,
            "rank": int(stream[-1]),
            "loaders": [{"name": "train", "totals": {"steps": seq, "epochs": 1}}]}
    if delivery is not None:
        body["delivery"] = delivery
    return json.dumps(body).encode()


def test_the_latest_account_of_each_process_is_in_the_run_api(collector):
    c = collector()
    post = lambda *args: c.request("POST", "/api/v1/ingest", batch(*args), JSON)[0]  # noqa: E731
    assert post("p0", 1, {"acknowledged": 0, "spooled": 0, "dropped": {}}) == 200
    assert post("p0", 3, {"acknowledged": 90, "spooled": 5, "dropped": {"spool_full": 2}}) == 200
    # A replayed older batch arrives late: its older account does not replace the newer one.
    assert post("p0", 2, {"acknowledged": 40, "spooled": 50, "dropped": {}}) == 200
    assert post("p0", 4, None) == 200  # a batch without an account keeps the last one
    assert post("p1", 1, {"acknowledged": 10, "spooled": 0, "dropped": {"rejected": 3, "spool_full": 1}}) == 200

    detail = c.get("/api/v1/runs/acct")
    accounts = {r["stream"]: r["delivery"] for r in detail["ranks"]}
    assert accounts["p0"] == {"acknowledged": 90, "spooled": 5, "dropped": {"spool_full": 2}, "seq": 3}
    assert accounts["p1"] == {"acknowledged": 10, "spooled": 0, "dropped": {"rejected": 3, "spool_full": 1},
                              "seq": 1}
    total = {"acknowledged": 100, "spooled": 5, "dropped": {"spool_full": 3, "rejected": 3}, "processes": 2}
    assert detail["delivery"] == total
    assert c.get("/api/v1/runs/acct/summary")["delivery"] == total
    assert c.get("/api/v1/runs/acct/summary?rank=1")["delivery"]["dropped"] == {"rejected": 3, "spool_full": 1}
    # Bad accounts are refused like any bad field.
    status, body = c.request("POST", "/api/v1/ingest", batch("p0", 9, {"acknowledged": -1}), JSON)
    assert status == 422 and b"delivery.acknowledged" in body


def test_the_banner_names_what_was_dropped_and_only_then():
    banner = views.delivery_banner({"delivery": {"acknowledged": 1200, "spooled": 3,
                                                 "dropped": {"spool_full": 2, "rejected": 1}}})
    assert banner.id == "delivery-banner"
    assert banner.children == ("Incomplete: the training processes dropped 3 step records that never "
                               "reached the collector (rejected: 1, spool full: 2); 1,200 acknowledged, "
                               "3 in the spool.")
    assert views.delivery_banner({"delivery": {"acknowledged": 5, "spooled": 0, "dropped": {"x": 0}}}) is None
    assert views.delivery_banner({}) is None  # runs recorded before accounts existed


TRAINING = r"""
import sys, time, starvewatch
for i in starvewatch.watch(range(10**9)):
    time.sleep(0.002)
"""


def test_a_killed_training_process_makes_the_run_lost_not_live_forever(collector, isolated_starvewatch):
    c = collector(extra=["--lost-after", "2"])
    env = dict(os.environ, STARVEWATCH_URL=c.url, STARVEWATCH_RUN_NAME="killed",
               STARVEWATCH_SHIP_INTERVAL_S="0.2")
    proc = subprocess.Popen([sys.executable, "-c", TRAINING], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        runs = lambda: c.get("/api/v1/runs")["runs"]  # noqa: E731
        run = wait_until(lambda: next((r for r in runs() if r["name"] == "killed" and r["steps"] > 0), None),
                         timeout_s=60, what="the run at the collector")
        assert run["status"] == "live"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(20)
    # Silent for 2 s, plus at most 5 s of cached status: lost, and it stays lost.
    wait_until(lambda: c.get(f"/api/v1/runs/{run['id']}")["run"]["status"] == "lost", timeout_s=20,
               what="the killed run to become lost")
    assert [r["status"] for r in runs() if r["id"] == run["id"]] == ["lost"]
    assert c.get(f"/api/v1/runs?status=live")["runs"] == []


def test_lost_after_must_be_a_positive_number_of_seconds(isolated_starvewatch):
    for bad in ("0", "-3", "soon", "nan"):
        out = subprocess.run([sys.executable, "-m", "starvewatch", "serve", "--port", str(free_port()),
                              "--lost-after", bad], capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, (bad, out.stderr)
        assert "--lost-after" in out.stderr and "Traceback" not in out.stderr


# ---- the training process's side: every record in exactly one place -------------------------
def test_a_full_spool_drops_the_oldest_batches_and_counts_them(tmp_path):
    from starvewatch.hooks.delivery.transport import Delivery, Spool
    steps = lambda first, n: {"loader": ["train"] * n, "epoch": [0] * n, "step": list(range(first, first + n)),  # noqa: E731
                              "start_ns": [1] * n, "wait_ns": [5] * n, "compute_ns": [5] * n, "other_ns": [0] * n,
                              "batch_size": [None] * n, "gpu_idle_ns": [None] * n}
    delivery = Delivery(None, Spool(tmp_path / "spool" / "r" / "s", max_bytes=2_000))  # no collector
    for seq in range(1, 9):
        delivery.deliver({"schema": "starvewatch.events/1", "run_id": "r", "stream": "s", "seq": seq,
                          "steps": steps(100 * seq, 100)})
    account = delivery.account()
    files = sorted(p.name for p in (tmp_path / "spool" / "r" / "s").iterdir())
    assert account["acknowledged"] == 0 and account["spooled"] == 100 * len(files)
    assert account["dropped"] == {"spool_full": 800 - 100 * len(files)} and len(files) < 8
    assert files[-1] == "000000000008.json.gz"  # the newest kept, the oldest dropped


def test_records_a_full_buffer_never_recorded_are_in_the_account(memory_run):
    import starvewatch
    session, transport = memory_run
    session.settings.buffer_capacity = 50  # the shipper drains twice a second: most steps overflow
    for _ in starvewatch.watch(range(3000), name="train"):
        pass
    summary = starvewatch.finish()
    lost = summary["loaders"][0]["dropped_records"]
    assert lost > 0 and summary["loaders"][0]["steps"] == 3000
    assert summary["delivery"] == {"acknowledged": 3000 - lost, "spooled": 0, "dropped": {"buffer_full": lost}}
