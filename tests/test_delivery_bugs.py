"""Regression tests for four paths where step records vanished without a count (issue 13).
Each failed before its fix."""
import gzip
import json
import subprocess
import time

import pytest

import starvewatch
from starvewatch.hooks import cuda
from tests.conftest import shipped_steps
from tests.test_measurement import FakeGpu


@pytest.fixture(scope="module")
def shared_collector(tmp_path_factory):
    """One real collector for this module's tests (each uses its own run id): starting one
    per test would cost seconds of CI each."""
    from tests.conftest import Collector
    c = Collector(tmp_path_factory.mktemp("collector")).start()
    yield c
    c.stop()


def _payload(seq: int, n: int, run_id: str = "bugs", **steps_override) -> dict:
    steps = {"loader": ["train"] * n, "epoch": [0] * n, "step": list(range(n)), "start_ns": [1] * n,
             "wait_ns": [5] * n, "compute_ns": [5] * n, "other_ns": [0] * n, "batch_size": [None] * n,
             "gpu_idle_ns": [None] * n}
    steps.update(steps_override)
    return {"schema": "starvewatch.events/1", "run_id": run_id, "stream": f"{run_id}-s", "seq": seq, "steps": steps}


def test_a_batch_the_collector_rejects_goes_to_rejected_and_is_counted(shared_collector, tmp_path):
    """Before: a 4xx answer discarded the batch (and its spooled copy), counted only in an
    internal `rejected` counter that nothing reported."""
    from starvewatch.hooks.delivery.transport import Delivery, HttpTransport, Spool
    spool_dir = tmp_path / "sw" / "spool" / "bugs" / "s"
    delivery = Delivery(HttpTransport(shared_collector.url), Spool(spool_dir, 2**20))
    delivery.deliver(_payload(1, 3, "rejected"))
    delivery.deliver(_payload(2, 4, "rejected", wait_ns=[-1] * 4))  # invalid: the collector answers 422
    delivery.deliver(_payload(3, 5, "rejected"))
    delivery.transport.close()
    account = delivery.account()
    assert account == {"acknowledged": 8, "spooled": 0, "dropped": {"rejected": 4}}
    rejected = sorted((tmp_path / "sw" / "rejected" / "bugs" / "s").iterdir())
    assert [p.name for p in rejected] == ["000000000002.json.gz"]
    kept = json.loads(gzip.decompress(rejected[0].read_bytes()))
    assert kept["steps"]["wait_ns"] == [-1] * 4  # the batch as sent, for a bug report


def test_a_spooled_batch_rejected_on_replay_is_moved_not_deleted(shared_collector, tmp_path):
    from starvewatch.hooks.delivery.transport import Delivery, HttpTransport, Spool
    spool_dir = tmp_path / "sw" / "spool" / "bugs" / "s"
    offline = Delivery(None, Spool(spool_dir, 2**20))
    offline.deliver(_payload(1, 2, "replayed", wait_ns=[-1, -1]))
    offline.deliver(_payload(2, 3, "replayed"))
    assert offline.account() == {"acknowledged": 0, "spooled": 5, "dropped": {}}
    online = Delivery(HttpTransport(shared_collector.url), Spool(spool_dir, 2**20))
    assert online.replay() is True
    online.transport.close()
    assert online.account() == {"acknowledged": 3, "spooled": 0, "dropped": {"rejected": 2}}
    assert [p.name for p in (tmp_path / "sw" / "rejected" / "bugs" / "s").iterdir()] == ["000000000001.json.gz"]
    assert list(spool_dir.iterdir()) == []


def test_the_spool_forgets_files_the_collector_swept_and_keeps_new_ones(tmp_path):
    """Before: the spool's byte count never went down when the collector's sweep deleted
    files, so after enough sweeps making room deleted every pending file."""
    from starvewatch.hooks.delivery.transport import Spool
    body = json.dumps(_payload(1, 200)).encode()
    size = len(gzip.compress(body, compresslevel=1))
    spool = Spool(tmp_path / "spool", max_bytes=int(3.5 * size))
    for seq in range(1, 4):
        spool.write(seq, body, 200)
    for path in spool.pending():  # the collector's sweep ingests and deletes them
        path.unlink()
    for seq in range(4, 7):
        spool.write(seq, body, 200)
    assert [p.name for p in spool.pending()] == [f"{seq:012d}.json.gz" for seq in range(4, 7)]
    assert spool.dropped_records == 0


@pytest.fixture
def read_only_dir(tmp_path):
    path = tmp_path / "ro"
    path.mkdir()
    # mode=0700: a STARVEWATCH_DIR others may write to is refused (issue 36), tmpfs's default is 1777.
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro,mode=0700", "tmpfs", str(path)], check=True)
    yield path
    subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_batch_the_sidecar_could_not_spool_is_counted_not_forgotten(read_only_dir, monkeypatch):
    """Before: the sidecar acknowledged a batch whose delivery raised OSError (a full or
    read-only disk), so the training process forgot it and nothing counted it."""
    from starvewatch.hooks.session import current_session
    from starvewatch.hooks.delivery.sidecar_link import SidecarPipeline
    monkeypatch.setenv("STARVEWATCH_DIR", str(read_only_dir))  # URL off: everything goes to the spool
    for _ in starvewatch.watch(range(300)):
        time.sleep(0.0005)
    assert isinstance(current_session().shipper.pipeline, SidecarPipeline)
    summary = starvewatch.finish()
    assert summary["loaders"][0]["steps"] == 300
    assert summary["delivery"] == {"acknowledged": 0, "spooled": 0, "dropped": {"spool_unwritable": 300}}


def test_records_held_for_a_pending_cuda_event_keep_their_order(monkeypatch, memory_run):
    """Before: records whose CUDA events were still pending were shipped after later records
    (of the same loader) that had no event: the order of steps was lost."""
    session, transport = memory_run
    gpu = FakeGpu()
    monkeypatch.setattr(cuda, "detect_event_factory", lambda: gpu.event)
    session._gpu_timer = cuda.CudaEventTimer(gpu.event, pool_size=4)  # steps past 4 get no event
    gpu.launch(0.7)  # the first steps' events stay pending across shipping cycles (0.5 s)
    for _ in starvewatch.watch(range(240), name="train"):
        time.sleep(0.005)
    starvewatch.finish()
    assert len(transport.payloads) >= 2
    assert shipped_steps(transport) == [("train", 0, i) for i in range(240)]  # as shipped, not sorted


def test_a_batch_over_the_body_limit_is_split_and_the_limit_remembered(shared_collector, tmp_path):
    from benchmarks.faultproxy import FaultProxy
    from starvewatch.hooks.delivery.transport import Delivery, HttpTransport, Spool
    c = shared_collector
    proxy = FaultProxy(c.port)
    proxy.max_body = 6_000  # bytes as sent (gzip): about 1,000 of these records
    try:
        delivery = Delivery(HttpTransport(proxy.url), Spool(tmp_path / "spool" / "bugs" / "s", 2**20))
        n = 5_000
        big = _payload(1, n, "split", start_ns=list(range(n)), wait_ns=[(i * 7919) % 10**6 for i in range(n)])
        big["loaders"] = [{"name": "train", "totals": {"steps": n, "epochs": 1}}]
        delivery.deliver(big)
        first_413s = proxy.requests["413"]
        assert first_413s >= 1 and delivery.max_records is not None
        second = dict(big, seq=2, steps=dict(big["steps"], step=list(range(n, 2 * n))),
                      loaders=[{"name": "train", "totals": {"steps": 2 * n, "epochs": 1}}])
        delivery.deliver(second)
        assert proxy.requests["413"] == first_413s  # knowing the limit, it never sent over it again
        assert delivery.account() == {"acknowledged": 2 * n, "spooled": 0, "dropped": {}}
        delivery.transport.close()
    finally:
        proxy.close()
    summary = c.get("/api/v1/runs/split/summary")
    assert summary["loaders"][0]["steps"] == 2 * n  # the totals, once
    seen, after = [], 0
    while after is not None:
        page = c.get(f"/api/v1/runs/split/steps?limit=100000&after={after}")
        seen += [r["step"] for r in page["steps"]]
        after = page["next_after"]
    assert sorted(seen) == list(range(2 * n))
    assert c.get("/api/v1/runs/split")["run"]["status"] != "lost"


def test_a_single_record_over_the_limit_is_dropped_and_counted(shared_collector, tmp_path):
    from benchmarks.faultproxy import FaultProxy
    from starvewatch.hooks.delivery.transport import Delivery, HttpTransport, Spool
    proxy = FaultProxy(shared_collector.port)
    proxy.max_body = 420  # the batch's header fits; one record with a 200-character loader name does not
    try:
        delivery = Delivery(HttpTransport(proxy.url), Spool(tmp_path / "spool" / "bugs" / "s", 2**20))
        delivery.deliver(_payload(1, 3, "huge", loader=["x" * 200] * 3))
        assert delivery.account() == {"acknowledged": 0, "spooled": 0, "dropped": {"too_large": 3}}
        delivery.transport.close()
    finally:
        proxy.close()


@pytest.mark.parametrize("refusals", ["once", "always"])
def test_a_chunk_the_pipeline_refuses_is_shipped_later_or_counted(memory_run, monkeypatch, refusals):
    """Issue 33 item 3: the shipper advanced its position in the backlog before handing the
    chunk to the pipeline; when `add()` raised, that chunk was neither delivered, spooled nor
    counted (500 of 5,000 steps vanished). Refused once, the chunk goes first into the next
    cycle; refused every time, it is dropped after a few tries under `shipper_error`, its
    steps counted in the summary: steps run = summary steps = acknowledged + spooled + dropped."""
    from starvewatch.record_layout import READS_RECORD_LEN, STEP_RECORD_LENS, reads_steps
    session, transport = memory_run
    pipeline = session.shipper.pipeline
    original, refused = pipeline.add, []

    def add(records, names):
        steps = [s for r in records if len(r) == READS_RECORD_LEN for s in range(r[1], r[1] + reads_steps(r))]
        steps += [r[1] for r in records if len(r) in STEP_RECORD_LENS]
        if 2500 in steps and (refusals == "always" or not refused):
            refused.append(len(steps))
            raise RuntimeError("planted: the pipeline refuses this chunk")
        return original(records, names)

    monkeypatch.setattr(pipeline, "add", add)
    from starvewatch.hooks.delivery import shipper
    monkeypatch.setattr(shipper, "SEGMENT_TAKE_STEPS", 500)  # chunks of one record of 500 steps:
    monkeypatch.setattr(pipeline, "chunk", 1)                # one of ten refused, as in the issue
    n = 0
    for _ in starvewatch.watch(range(5000), name="train"):
        n += 1
    summary = starvewatch.finish()
    account = summary["delivery"]
    shipped = [s for _, _, s in shipped_steps(transport)]
    assert refused and n == 5000 and summary["loaders"][0]["steps"] == n
    assert account["acknowledged"] + account["spooled"] + sum(account["dropped"].values()) == n, account
    assert account["acknowledged"] == len(shipped) == len(set(shipped))
    if refusals == "once":
        assert len(refused) == 1 and account["dropped"] == {} and sorted(shipped) == list(range(n))
    else:
        from starvewatch.hooks.delivery.shipper import CHUNK_TRIES
        assert len(refused) == CHUNK_TRIES and account["dropped"] == {"shipper_error": refused[0]}
        assert refused[0] <= 500 and 2500 not in shipped and len(shipped) == n - refused[0]
        missing = sorted(set(range(n)) - set(shipped))  # the refused chunk's steps, and only those
        assert 2500 in missing and missing == list(range(missing[0], missing[0] + refused[0]))
    assert any("planted" in error for error in session.shipper.errors)  # said, not swallowed


def test_a_cuda_event_that_fails_to_resolve_loses_no_step(monkeypatch, memory_run):
    """Issue 33 item 3, the GPU side: the events are resolved between the chunk's taking and
    `add()`; a resolution that raised lost the chunk (and the records held for their events).
    Now that step has no GPU measurement, as a failed event has, and every step arrives."""
    session, transport = memory_run
    gpu = FakeGpu()
    monkeypatch.setattr(cuda, "detect_event_factory", lambda: gpu.event)
    timer = session._gpu_timer = cuda.CudaEventTimer(gpu.event, pool_size=64)
    original, failures = timer.resolve, []

    def resolve(pair):
        if not failures:
            failures.append(pair)
            raise RuntimeError("planted: the event's query failed")
        return original(pair)

    monkeypatch.setattr(timer, "resolve", resolve)
    for _ in starvewatch.watch(range(500), name="train"):
        pass
    summary = starvewatch.finish()
    assert failures and summary["loaders"][0]["steps"] == 500
    assert summary["delivery"] == {"acknowledged": 500, "spooled": 0, "dropped": {}}
    assert shipped_steps(transport) == [("train", 0, i) for i in range(500)]
