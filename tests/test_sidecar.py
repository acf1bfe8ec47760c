"""The sidecar process samples the host, the workers and the GPUs for the training process."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

import starvewatch
from tests.conftest import wait_until


def _host_samples(session):
    return [e for s in session.samplers for k, e in s.history if k == "samples" and e["kind"] == "host"]


def _sidecar(session):
    assert session.sidecar is not None and session.sidecar.alive
    return session.sidecar


def test_the_sidecar_samples_the_training_process_not_itself(memory_run):
    session, transport = memory_run
    list(starvewatch.watch(range(3)))
    link = _sidecar(session)
    assert link.proc.pid != os.getpid() and psutil.Process(link.proc.pid).ppid() == os.getpid()
    wait_until(lambda: _host_samples(session), what="a host sample")
    before = _host_samples(session)[-1]["process_rss_bytes"]
    ballast = bytearray(300 * 2**20)  # touched: resident
    ballast[::4096] = b"x" * len(ballast[::4096])
    wait_until(lambda: _host_samples(session)[-1]["process_rss_bytes"] > before + 250 * 2**20,
               what="this process's RSS growth in the sidecar's samples")
    del ballast
    starvewatch.finish()
    assert link.proc.poll() is not None  # finish() let it exit and reaped it


def test_a_dead_sidecar_falls_back_to_sampling_in_process(memory_run):
    session, transport = memory_run
    list(starvewatch.watch(range(3)))
    link = _sidecar(session)
    wait_until(lambda: _host_samples(session), what="a first host sample")
    os.kill(link.proc.pid, signal.SIGKILL)
    wait_until(lambda: not session.sidecar.alive, what="the sampler to notice")
    count = len(_host_samples(session))
    wait_until(lambda: len(_host_samples(session)) >= count + 2, what="host samples taken in-process")
    assert any("sidecar exited" in e for e in session.shipper.errors)
    summary = starvewatch.finish()
    assert summary["system"]["host_samples"] >= count + 2


def test_sidecar_off_samples_in_process(monkeypatch):
    monkeypatch.setenv("STARVEWATCH_SIDECAR", "0")
    from starvewatch.hooks.delivery.transport import MemoryTransport
    session = starvewatch.init("no-sidecar", transport=MemoryTransport())
    children = psutil.Process().children()
    list(starvewatch.watch(range(3)))
    wait_until(lambda: _host_samples(session), what="a host sample")
    assert session.sidecar is None
    assert psutil.Process().children() == children


def test_the_sidecar_exits_when_the_training_process_is_killed(tmp_path):
    script = textwrap.dedent("""
        import sys, time, starvewatch
        from starvewatch.hooks.session import current_session
        for _ in starvewatch.watch(range(3)):
            pass
        session = current_session()
        print(session.sidecar.proc.pid, flush=True)
        time.sleep(60)
    """)
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as proc:
        try:
            sidecar = psutil.Process(int(proc.stdout.readline()))
            proc.kill()
            proc.wait(10)
            sidecar.wait(10)  # raises psutil.TimeoutExpired if it outlives its training process
            assert not sidecar.is_running()
        finally:
            proc.kill()


def _loop_until(condition, what="condition"):
    """Run a watched loop (real steps) until `condition()` holds; returns the step count."""
    import time
    steps, deadline = 0, time.monotonic() + 30
    for steps, _ in enumerate(starvewatch.watch(range(10**9), name="train"), start=1):
        time.sleep(0.0002)  # a step's work: a few thousand steps a second
        if steps % 50 == 0:
            if condition():
                return steps
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")


def test_batches_travel_through_the_sidecar_to_the_collector(collector, monkeypatch):
    from starvewatch.hooks.session import current_session
    from starvewatch.hooks.delivery.sidecar_link import SidecarPipeline
    c = collector()
    monkeypatch.setenv("STARVEWATCH_URL", c.url)
    starvewatch.init("via-sidecar")
    session = current_session()
    assert isinstance(session.shipper.pipeline, SidecarPipeline)
    steps = _loop_until(lambda: session.sidecar.acked_seq >= 2, what="two acknowledged batches")
    summary = starvewatch.finish()
    assert summary["loaders"][0]["steps"] == steps
    remote = c.get(f"/api/v1/runs/{summary['run']['id']}/summary")
    assert remote["run"]["status"] == "finished" and remote["loaders"][0]["steps"] == steps
    assert session.sidecar.proc.poll() is not None


def _watched_run_with_collector(collector, monkeypatch, name):
    """A run delivering to a real collector through its sidecar, after one acknowledged batch."""
    from starvewatch.hooks.session import current_session
    c = collector()
    monkeypatch.setenv("STARVEWATCH_URL", c.url)
    starvewatch.init(name)
    session = current_session()
    first = _loop_until(lambda: session.sidecar.acked_seq >= 1, what="a first acknowledged batch")
    return c, session, session.sidecar, first


def _assert_every_step_once(c, session, total):
    """In the summary (totals and statistics: the sidecar's book, then this process's) and
    at the collector: every step once."""
    summary = starvewatch.finish()
    assert summary["loaders"][0]["steps"] == total
    assert session.shipper.book().stats[0].wait.count == total
    # The account: what the sidecar settled before it went, and what this process did after.
    assert summary["delivery"] == {"acknowledged": total, "spooled": 0, "dropped": {}}
    run_id = summary["run"]["id"]
    assert c.get(f"/api/v1/runs/{run_id}/summary")["loaders"][0]["steps"] == total
    seen, after = [], 0
    while after is not None:
        page = c.get(f"/api/v1/runs/{run_id}/steps?limit=100000&after={after}")
        seen += [(r["epoch"], r["step"]) for r in page["steps"]]
        after = page["next_after"]
    assert len(seen) == len(set(seen)) == total


def test_a_sidecar_killed_mid_run_loses_and_doubles_nothing(collector, monkeypatch):
    c, session, link, first = _watched_run_with_collector(collector, monkeypatch, "sidecar-killed")
    os.kill(link.proc.pid, signal.SIGKILL)
    # Keep training while it dies: batches sent into the dead pipe are taken over in-process.
    second = _loop_until(lambda: not link.alive and session.shipper.shipped_records > first + 100,
                         what="the take-over")
    _assert_every_step_once(c, session, first + second)


def test_worker_records_are_counted_and_shipped_once_across_a_take_over(collector, monkeypatch):
    """DataLoader workers' per-batch records (issue 38): the sidecar read and counted the first
    epoch's; after it dies, this process reads the same rings from its book on. Each batch a
    worker handed over counts once in the summary and reaches the collector once."""
    from torch.utils.data import DataLoader
    from starvewatch.hooks.session import current_session
    c = collector()
    monkeypatch.setenv("STARVEWATCH_URL", c.url)
    starvewatch.init("take-over-workers")
    session = current_session()
    link = session.sidecar
    loader = starvewatch.watch(DataLoader(range(64), batch_size=2, num_workers=2), name="train")
    steps = sum(1 for _ in loader)

    def sidecar_counted():  # the sidecar's book (each acknowledgement carries it) has them all
        totals = session.shipper.book().totals.get(0)
        return totals is not None and sum(totals.worker_batches) == steps

    wait_until(sidecar_counted, what="the sidecar's book to count the first epoch's worker records")
    os.kill(link.proc.pid, signal.SIGKILL)
    wait_until(lambda: link.proc.poll() is not None, what="the sidecar to die")
    steps += sum(1 for _ in loader)
    summary = starvewatch.finish()
    assert not session.shipper.pipeline.remote  # taken over
    attribution = summary["loaders"][0]["attribution"]
    assert summary["loaders"][0]["steps"] == steps == 64
    assert sum(attribution["worker_batches"]) == steps, attribution["worker_batches"]
    trace = c.get(f"/api/v1/runs/{summary['run']['id']}/export?format=trace")
    fetches = [(e["args"]["worker"], e["args"]["batch"], e["ts"]) for e in trace["traceEvents"]
               if e.get("cat") == "starvewatch.fetch"]
    assert len(fetches) == len(set(fetches)) == steps


def test_a_frozen_sidecar_is_replaced_and_nothing_is_lost(collector, monkeypatch):
    from starvewatch.hooks.delivery.sidecar_link import SidecarLink
    monkeypatch.setattr(SidecarLink, "WRITE_TIMEOUT_S", 1.0)
    c, session, link, first = _watched_run_with_collector(collector, monkeypatch, "sidecar-frozen")
    os.kill(link.proc.pid, signal.SIGSTOP)  # alive but reading nothing: the pipe fills up
    try:
        second = _loop_until(lambda: not link.alive, what="the frozen sidecar to be given up")
    finally:
        if link.proc.poll() is None:
            os.kill(link.proc.pid, signal.SIGCONT)
    _assert_every_step_once(c, session, first + second)


def test_the_sidecar_builds_the_same_batches_and_book_as_the_training_process(tmp_path):
    """Raw records cross the pipe (marshal) and the sidecar builds the batches with numpy
    histograms: the steps, phases, totals and statistics equal the in-process path's."""
    from starvewatch.hooks.delivery.records import LocalPipeline
    from starvewatch.hooks.session import current_session
    from starvewatch.hooks.delivery.sidecar_link import SidecarPipeline
    from starvewatch.hooks.delivery.transport import Delivery, MemoryTransport, Spool
    from starvewatch.spool_format import read_spool_file
    starvewatch.watch([1], name="train")
    starvewatch.watch([2], name="val")
    session = current_session()  # STARVEWATCH_URL=off: delivered to the spool by the sidecar
    assert isinstance(session.shipper.pipeline, SidecarPipeline)
    # clock reads of the past (perf_counter_ns): the shipper holds back steps closed after its
    # cycle's horizon, for the next cycle
    t = time.perf_counter_ns() - 10**11
    records = [((0, 0), k, t + 3000 * k, t + 3000 * k + 100 + k, t + 3000 * (k + 1), 32) for k in range(5000)]
    records += [((1, 0), k, t + 7 * k, 50 + k * 37, 0 if k % 3 else 999, None, 5, None,
                 {"forward": 11 * k, "backward": 13} if k % 2 else None, t + 7 * k + 3, t + 7 * k + 6,
                 None if k % 5 else ((t + 7 * k + 4, t + 7 * k + 5),), t) for k in range(300)]
    records += [((0, 1), 0, t, t + 5, t + 2**35, 32), ((1, 1), 0, t, 10**9, 1, 7, 0, 4, None, t + 2, t + 9, None, t)]
    session.buffer.extend(records)
    starvewatch.finish()
    spooled = sorted((read_spool_file(p) for p in session.spool_dir.glob("*")), key=lambda p: p["seq"])
    assert sum(len(p["steps"]["step"]) for p in spooled) == len(records)

    local = LocalPipeline(Delivery(MemoryTransport(), Spool(tmp_path / "local", 2**30)), session.wall_offset_ns)
    for chunk in range(0, len(records), 1024):
        local.add(records[chunk:chunk + 1024], ["train", "val"])
    final = spooled[-1]
    header = {k: v for k, v in final.items() if k not in ("steps", "phases")}
    local.send(dict(header, loaders=[s.describe(s.totals) for s in session.loader_list]))
    expected = local.delivery.transport.payloads[0]
    for column, values in expected["steps"].items():
        assert [v for p in spooled for v in p["steps"][column]] == values, column
    assert [v for p in spooled for v in p["phases"]] == expected["phases"]
    assert final["loaders"] == expected["loaders"]
    # (The book's `seq` differs: the run's last batch, its final account, has no records.)
    assert session.shipper.book().to_dict()["loaders"] == local.book().to_dict()["loaders"]


def test_batches_let_go_past_the_bound_are_counted_when_the_sidecar_then_dies(collector, monkeypatch):
    """The training process keeps unacknowledged batches only up to a bound; if the sidecar
    then dies, the ones it let go are missing, and counted as such (never silently)."""
    from starvewatch.hooks.delivery.sidecar_link import SidecarLink, SidecarPipeline
    monkeypatch.setattr(SidecarLink, "WRITE_TIMEOUT_S", 1.0)
    monkeypatch.setattr(SidecarPipeline, "MAX_UNACKED_BYTES", 0)  # keep nothing for re-delivery
    c, session, link, first = _watched_run_with_collector(collector, monkeypatch, "sidecar-let-go")
    os.kill(link.proc.pid, signal.SIGSTOP)
    try:
        second = _loop_until(lambda: not link.alive, what="the frozen sidecar to be given up")
    finally:
        if link.proc.poll() is None:
            os.kill(link.proc.pid, signal.SIGCONT)
    summary = starvewatch.finish()
    lost = session.shipper.pipeline.lost_records
    assert lost > 0 and summary["loaders"][0]["steps"] + lost == first + second
    account = summary["delivery"]
    assert account["dropped"] == {"sidecar_died": lost} and account["spooled"] == 0
    assert account["acknowledged"] + lost == first + second
    assert c.get(f"/api/v1/runs/{summary['run']['id']}/summary")["loaders"][0]["steps"] == first + second - lost


def test_pipe_io_keeps_the_gil_and_behaves_like_os_read_and_write():
    import pytest
    from starvewatch.hooks.delivery.sidecar_link import PipeIO
    io = PipeIO()
    assert io._libc is not None  # glibc here: the GIL-keeping path is the one under test
    r, w = os.pipe()
    try:
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        with pytest.raises(BlockingIOError):
            io.read(r)
        data = bytes(range(256)) * 1024  # 256 KiB: more than a pipe holds
        written = io.write(w, data, 0)
        assert 0 < written < len(data)
        with pytest.raises(BlockingIOError):
            io.write(w, data, written)  # full
        got = b""
        while len(got) < written:
            got += io.read(r)
        assert got == data[:written]
        written += io.write(w, data, written)  # room again: continues from the offset
        rest = b""
        while len(got) + len(rest) < written:
            rest += io.read(r)
        assert got + rest == data[:written]
        os.close(w)
        w = None
        assert io.read(r) == b""  # EOF
    finally:
        os.close(r)
        if w is not None:
            os.close(w)


def test_an_idle_run_costs_its_process_almost_no_cpu():
    """The monitor's threads sleep between ticks: 1 s of an idle run (after a shipper wake-up,
    which once left the shipper spinning) costs the training process a few ms of CPU."""
    import time
    from starvewatch.hooks.session import current_session
    list(starvewatch.watch(range(1000)))
    session = current_session()
    session.shipper._wake.set()
    wait_until(lambda: session.shipper.shipped_records == 1000, what="the records shipped")
    cpu = time.process_time()
    time.sleep(1.0)  # the measurement window, not a synchronization
    assert time.process_time() - cpu < 0.2


def test_gpu_measurements_travel_through_the_sidecar(monkeypatch):
    """CUDA events are resolved in the training process, then the records cross to the sidecar."""
    import time
    from starvewatch.hooks import cuda
    from starvewatch.hooks.session import current_session
    from starvewatch.hooks.delivery.sidecar_link import SidecarPipeline
    from starvewatch.spool_format import read_spool_file
    from tests.test_measurement import FakeGpu
    gpu = FakeGpu()
    monkeypatch.setattr(cuda, "detect_event_factory", lambda: gpu.event)
    monkeypatch.setenv("STARVEWATCH_GPU_EVENT_EVERY", "1")  # every step measured: checked below

    def slow_source():
        for i in range(25):
            time.sleep(0.01)  # 10 ms data wait per step, with the GPU queue empty
            yield i

    for _ in starvewatch.watch(slow_source()):
        gpu.launch(0.001)
    session = current_session()
    assert isinstance(session.shipper.pipeline, SidecarPipeline) and session.shipper.pipeline.remote
    summary = starvewatch.finish()
    assert summary["verdict"]["gpu_idle_fraction"] > 0.6
    idle = [v for p in session.spool_dir.glob("*") for v in read_spool_file(p)["steps"]["gpu_idle_ns"]]
    assert len(idle) == 25 and None not in idle and sum(v > 5_000_000 for v in idle) >= 24


def test_the_sidecar_runs_below_the_training_process_from_its_start(memory_run):
    """Niced at spawn (its interpreter start-up and imports included), not only once its main()
    runs: a sidecar still importing must never take a core the training waits for."""
    session, transport = memory_run
    link = _sidecar(session)
    # Read at once, while the sidecar is still starting (its own fallback nice comes later).
    assert psutil.Process(link.proc.pid).nice() == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)
    list(starvewatch.watch(range(3)))
    wait_until(lambda: _host_samples(session), what="a host sample")
    # Its fallback did not lower it a second time.
    assert psutil.Process(link.proc.pid).nice() == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)
    starvewatch.finish()


def test_the_sidecar_builds_the_next_batch_while_one_is_in_flight(tmp_path):
    """Two stages (issue 41): while the collector takes its time over batch 1, the sidecar
    builds batch 2 (its records in the book); batches still leave in order, and each
    acknowledgement carries the book as of its own batch (a take-over re-sends only the
    batches after it, so a book one batch ahead would count that batch twice)."""
    import io
    import marshal
    import threading
    from starvewatch.hooks.delivery.sidecar import Sidecar
    from starvewatch.schema import EVENTS_SCHEMA
    sent, release = [], threading.Event()

    class HeldTransport:  # the collector holding its answer to batch 1
        def send(self, payload, body=None):
            sent.append((payload["seq"], len(payload["steps"]["step"])))
            if payload["seq"] == 1:
                assert release.wait(60), "batch 1 was never released"

        def close(self):
            pass

    out = io.StringIO()
    sidecar = Sidecar({"pid": os.getpid(), "wall_offset_ns": 0,
                       "delivery": {"url": None, "spool_dir": str(tmp_path), "spool_max_bytes": 2**30}}, out)
    sidecar.delivery.transport = HeldTransport()
    t = time.perf_counter_ns()

    def packed(seq: int, first: int, n: int):
        records = [((0, 0), k, t + 3000 * k, t + 3000 * k + 100, t + 3000 * (k + 1), 32)
                   for k in range(first, first + n)]
        header = {"schema": EVENTS_SCHEMA, "run_id": "two-stages", "rank": 0, "stream": "two-stages-s",
                  "seq": seq, "status": "live", "loaders": [{"name": "train", "totals": {}}], "drops": {}}
        return "batch", (header, [marshal.dumps(records)])

    worker = threading.Thread(target=sidecar.deliver_forever, daemon=True)
    worker.start()
    sidecar.batches.put(packed(1, 0, 100))
    sidecar.batches.put(packed(2, 100, 50))
    wait_until(lambda: sidecar.pipeline.book().seq == 2, what="batch 2 built while batch 1 is in flight")
    assert sent == [(1, 100)]
    release.set()
    sidecar.batches.put(("eof", None))
    worker.join(60)
    assert not worker.is_alive()
    assert sent == [(1, 100), (2, 50)]
    messages = [json.loads(line) for line in out.getvalue().splitlines()]
    books = [m["book"] for m in messages if m["kind"] == "book"]
    assert [(b["seq"], b["loaders"]["0"]["totals"]["steps"]) for b in books] == [(1, 100), (2, 150)]
    acked = [m for m in messages if m["kind"] == "acked"]
    assert [(m["seq"], m["account"]["acknowledged"]) for m in acked] == [(1, 100), (2, 150)]
