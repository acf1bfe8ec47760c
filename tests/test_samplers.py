"""System samplers: NVML through the real nvidia-ml-py API (patched values), psutil for real."""
import os
import signal
import time
from pathlib import Path

import pynvml
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

import starvewatch
from starvewatch.hooks import nvml
from starvewatch.hooks.session import current_session
from tests.conftest import wait_until
from tests.standins import fake_nvml


STANDINS = Path(__file__).parent / "standins"


@pytest.fixture
def fake_gpu(monkeypatch):
    """The NVML stand-in here and in the sidecar process that samples for this one."""
    nvml.shutdown()
    calls: dict = {}
    for name, fn in fake_nvml.patches(os.getpid(), calls).items():
        monkeypatch.setattr(pynvml, name, fn)
    monkeypatch.setenv("STARVEWATCH_TEST_FAKE_NVML", str(os.getpid()))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(STANDINS), os.environ.get("PYTHONPATH")])))
    yield calls
    nvml.shutdown()


def test_nvml_sample_has_every_field_in_the_right_units(fake_gpu):
    [gpu] = nvml.sample()
    assert gpu == {
        "index": 0, "name": "NVIDIA H100 80GB HBM3", "gpu_util_pct": 37, "mem_util_pct": 12,
        "mem_used_bytes": 21_474_836_480, "mem_total_bytes": 85_899_345_920, "power_w": 312.456,
        "sm_clock_mhz": 1980, "temperature_c": 54, "pcie_rx_bytes_per_s": 1_536_000_000,
        "pcie_tx_bytes_per_s": 20_480_000, "process_mem_bytes": 4_294_967_296,
    }


def test_unsupported_query_gives_null_and_one_log_line(fake_gpu, monkeypatch, caplog):
    def unsupported(h):
        raise pynvml.NVMLError_NotSupported()

    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", unsupported)
    nvml._logged.clear()
    first, second = nvml.sample(), nvml.sample()
    assert first[0]["power_w"] is None and second[0]["power_w"] is None
    assert first[0]["gpu_util_pct"] == 37
    assert len([r for r in caplog.records if "power" in r.getMessage()]) == 1


def test_missing_driver_gives_no_samples_and_no_exception(monkeypatch, caplog):
    caplog.set_level("INFO", logger="starvewatch.nvml")
    nvml.shutdown()
    nvml._logged.clear()

    def no_library():
        raise pynvml.NVMLError_LibraryNotFound()

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    assert nvml.sample() == [] and nvml.sample() == []
    assert len([r for r in caplog.records if "NVML unavailable" in r.getMessage()]) == 1
    nvml.shutdown()


def test_gpu_samples_reach_the_summary(fake_gpu, memory_run, monkeypatch):
    session, transport = memory_run
    list(starvewatch.watch(range(10)))
    wait_until(lambda: any(k == "samples" and e["kind"] == "gpu" for s in session.samplers for k, e in s.history),
               what="a GPU sample")
    summary = starvewatch.finish()
    assert summary["system"]["gpu_util_mean"] == 37
    assert summary["system"]["gpu_names"] == ["NVIDIA H100 80GB HBM3"]
    shipped = [s for p in transport.payloads for s in p.get("samples", []) if s["kind"] == "gpu"]
    assert shipped and shipped[0]["devices"][0]["power_w"] == 312.456


class OneSlowWorker(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if get_worker_info().id == 1:
            time.sleep(0.01)
        return torch.tensor([float(i)])


def _worker_events(session, loader="train"):
    return [e for s in session.samplers for k, e in s.history if k == "workers" and e["loader"] == loader]


def test_per_worker_load_time_shows_the_slow_worker(memory_run):
    session, transport = memory_run
    loader = starvewatch.watch(DataLoader(OneSlowWorker(), batch_size=4, num_workers=2,
                                          multiprocessing_context="spawn"))
    for _ in range(2):
        values = sorted(int(v) for b in loader for v in b.flatten().tolist())
        assert values == list(range(64))  # what the loop receives is unchanged
    wait_until(lambda: any(w["batches"] == 16 and w["id"] == 1 for e in _worker_events(session) for w in e["workers"]),
               what="worker counters")
    last = _worker_events(session)[-1]
    fast, slow = last["workers"]
    assert slow["load_ms_mean"] > 30 and fast["load_ms_mean"] < 10
    assert slow["cpu_fraction"] < 0.5  # sleeping, not computing: latency-bound
    assert last["configured_workers"] == 2 and last["queue_capacity"] == 4
    summary = starvewatch.finish()
    workers = summary["system"]["loaders"]["train"]["workers"]
    assert [w["batches"] for w in workers] == [16, 16]


class Endless(Dataset):
    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.tensor([float(i)])


def test_a_killed_worker_is_reported(memory_run):
    session, transport = memory_run
    loader = starvewatch.watch(DataLoader(Endless(), batch_size=2, num_workers=2, persistent_workers=True))
    it = iter(loader)
    next(it)
    board = session.loaders["train"].board
    pids = wait_until(lambda: [r["pid"] for r in board.read()] if all(r["pid"] for r in board.read()) else None,
                      what="both workers started")
    # torch's SIGCHLD handler raises in the training thread as soon as the worker dies.
    with pytest.raises(RuntimeError, match="killed by signal"):
        os.kill(pids[0], signal.SIGKILL)
        wait_until(lambda: False, timeout_s=10, what="torch to notice the dead worker")
    wait_until(lambda: any(w["pid"] == pids[0] and w["state"] in ("gone", "zombie")
                           for e in _worker_events(session) for w in e["workers"]), what="the dead worker reported")
    event = _worker_events(session)[-1]
    assert event["alive_workers"] <= 1 and event["configured_workers"] == 2
    del it
    summary = starvewatch.finish()  # every step the run made is accounted for, none lost
    steps = summary["loaders"][0]["steps"]
    assert steps >= 1 and summary["delivery"] == {"acknowledged": steps, "spooled": 0, "dropped": {}}
    assert sum(len(p["steps"]["step"]) for p in transport.payloads) == steps


def test_shm_use_from_a_real_file_is_seen(memory_run):
    session, transport = memory_run
    list(starvewatch.watch(range(3)))

    def host_samples():
        return [e for s in session.samplers for k, e in s.history if k == "samples" and e["kind"] == "host"]

    wait_until(host_samples, what="a host sample")
    before = host_samples()[-1]["shm_used_bytes"]
    path = "/dev/shm/starvewatch-test-%d" % os.getpid()
    try:
        with open(path, "wb") as f:
            f.write(os.urandom(1024) * 64 * 1024)  # 64 MiB
        wait_until(lambda: host_samples()[-1]["shm_used_bytes"] >= before + 60 * 2**20, what="shm growth")
    finally:
        os.unlink(path)
    sample = host_samples()[-1]
    assert sample["cpu_count"] == os.cpu_count() and len(sample["cpu_per_core_pct"]) == os.cpu_count()
    assert sample["process_rss_bytes"] > 10 * 2**20 and sample["mem_available_bytes"] > 0


def test_a_stall_is_reported_once_with_worker_states(monkeypatch, memory_run):
    monkeypatch.setattr(current_session().settings, "stall_min_s", 0.3)

    def source():
        for i in range(30):
            yield i
        # A hang: wait until the stall has been reported (bounded), then go on.
        wait_until(lambda: current_session().stalls, timeout_s=20, what="the stall event")
        wait_until(lambda: current_session().stalls[0]["wait_s"] > 0.8, timeout_s=20, what="a long wait")
        yield 30

    session, transport = memory_run
    assert list(starvewatch.watch(source())) == list(range(31))
    wait_until(lambda: session.stalls and session.stalls[0]["ended_ns"], what="the stall to end")
    summary = starvewatch.finish()
    assert len(summary["stalls"]) == 1
    stall = summary["stalls"][0]
    assert stall["loader"] == "train" and stall["step"] == 30 and stall["wait_s"] > 0.3
    events = [e for p in transport.payloads for e in p.get("stalls", [])]
    assert len(events) == 2 and events[0]["ended_ns"] is None and events[1]["ended_ns"]  # begun, ended


def _spin_forever():
    while True:
        pass


def test_a_core_kept_busy_reads_busy_over_a_short_interval():
    """psutil.cpu_times_percent(percpu=True) scales by max(1 s, a core's delta): at the
    sidecar's 0.5 s it read a saturated core as 50% busy and an idle one as 50% idle. The
    sampler's shares come from the raw counters, so a pinned spinner reads near 100%."""
    import multiprocessing

    import psutil

    from starvewatch.hooks.samplers import HostSampler
    core = sorted(os.sched_getaffinity(0))[0]
    spinner = multiprocessing.get_context("fork").Process(target=_spin_forever, daemon=True)
    spinner.start()
    try:
        proc = psutil.Process(spinner.pid)
        proc.cpu_affinity([core])
        wait_until(lambda: proc.cpu_affinity() == [core] and sum(proc.cpu_times()[:2]) > 0.05, what="spinning")
        sampler = HostSampler(psutil)
        start = sum(proc.cpu_times()[:2])
        wait_until(lambda: sum(proc.cpu_times()[:2]) - start >= 0.4, what="0.4 s of spinning")
        sample = sampler.sample()
    finally:
        spinner.kill()
        spinner.join(5)
    assert sample["cpu_per_core_pct"][core] >= 80, sample["cpu_per_core_pct"]
    assert 0 <= sample["iowait_pct"] <= 100


def test_cpu_shares_sum_per_core_and_a_counter_running_backwards_counts_zero():
    from collections import namedtuple

    from starvewatch.hooks.samplers import HostSampler
    Times = namedtuple("Times", "user nice system idle iowait irq softirq steal guest guest_nice")
    readings = iter([[Times(10, 0, 5, 100, 8, 0, 0, 0, 0, 0), Times(10, 0, 5, 100, 3.0, 0, 0, 0, 0, 0)],
                     [Times(10.3, 0, 5.1, 100.4, 8.2, 0, 0, 0, 0, 0),   # 0.4 busy, 0.2 iowait of 1.0
                      # idle, and its iowait counter ran backwards by 0.1 s (kernels do this):
                      # counted as none, neither a negative iowait nor a shorter interval
                      Times(10.0, 0, 5.0, 100.5, 2.9, 0, 0, 0, 0, 0)]])

    class FakePsutil:
        def cpu_times(self, percpu):
            assert percpu
            return next(readings)

    sampler = HostSampler.__new__(HostSampler)
    sampler.ps = FakePsutil()
    sampler._cpu_last = sampler._cpu_times()
    busy, iowait = sampler._cpu_shares()
    assert busy == pytest.approx([40.0, 0.0]) and iowait == pytest.approx((20.0 + 0.0) / 2)
