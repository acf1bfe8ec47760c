"""Issue 16, item 2: DataLoader workers that grow with the samples they serve (copy-on-read of
Python objects after fork) are found from their USS; the same data as numpy stays flat.
Real fork workers, real sidecar readings (every 0.3 s here instead of 5 s)."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import starvewatch
from starvewatch.hooks.report import format_report
from starvewatch.hooks.session import current_session
from starvewatch.monitor.outputs.export import render_html, to_markdown
from tests.conftest import wait_until
from starvewatch.analysis.findings.worker_memory import (growth_of, memory_growth_findings,
    worker_memory_series)

ITEMS = 600_000      # ~55 MiB of Python lists and floats in the parent
CHUNK = 1500         # objects each sample reads: ITEMS / CHUNK = 400 samples (5 epochs)
#                      before a worker has copied them all
SAMPLES = 160        # per epoch (80 per worker); persistent workers go on reading fresh chunks
PER_SAMPLE_S = 0.01  # a slow decode: the loader's pace


class PythonObjects(Dataset):
    def __init__(self) -> None:
        self.rows = [[float(i)] for i in range(ITEMS)]  # a list of lists: refcounted objects
        self.calls = 0  # per worker process: which chunk its next sample reads

    def __len__(self) -> int:
        return SAMPLES

    def _chunk(self):
        start = (self.calls * CHUNK) % ITEMS
        self.calls += 1
        return self.rows[start:start + CHUNK]

    def __getitem__(self, i: int):
        total = sum(row[0] for row in self._chunk())  # reading writes each object's refcount
        time.sleep(PER_SAMPLE_S)
        return torch.tensor([total])


class NumpyArray(PythonObjects):
    def __init__(self) -> None:
        super().__init__()
        self.rows = np.arange(ITEMS, dtype=np.float64).reshape(-1, 1)  # one buffer, no refcounts

    def __getitem__(self, i: int):
        total = float(self._chunk()[:, 0].sum())
        time.sleep(PER_SAMPLE_S)
        return torch.tensor([total])


def _readings(session, loader: str) -> int:
    """Memory readings of the loader's workers so far (the fewest of any worker)."""
    seen: dict[int, set] = {}
    for sampler in session.samplers:
        for kind, event in list(sampler.history):
            if kind == "workers" and event["loader"] == loader:
                for w in event["workers"]:
                    if w.get("mem_t_ns"):
                        seen.setdefault(w["id"], set()).add(w["mem_t_ns"])
    return min((len(v) for v in seen.values()), default=0) if len(seen) == 2 else 0


def test_worker_memory_growth_is_found_for_python_lists_not_numpy(monkeypatch):
    monkeypatch.setenv("STARVEWATCH_WORKER_MEMORY_INTERVAL_S", "0.3")
    # Both loaders in one loop: the same epochs, the same (busy) machine, half the test time.
    objects = starvewatch.watch(DataLoader(PythonObjects(), batch_size=4, num_workers=2,
                                           persistent_workers=True, multiprocessing_context="fork"),
                                name="objects")
    arrays = starvewatch.watch(DataLoader(NumpyArray(), batch_size=4, num_workers=2,
                                          persistent_workers=True, multiprocessing_context="fork"),
                               name="arrays")
    session = current_session()
    # At least 3 epochs (240 samples per worker), and more until each worker has 6 memory
    # readings: a busy machine starves the sidecar (nice 10). At most 5, before the chunks wrap.
    for epoch in range(5):
        assert sum(1 for _ in zip(objects, arrays)) == SAMPLES // 4
        if epoch >= 2 and _readings(session, "objects") >= 6 and _readings(session, "arrays") >= 6:
            break
    summary = starvewatch.finish()
    findings = [f for f in summary["findings"] if f["kind"] == "worker_memory_growth"]
    assert [f["loader"] for f in findings] == ["objects"], findings
    [finding] = findings
    detail = finding["detail"]
    assert "numpy" in finding["fix"] and finding["severity"] in ("warning", "critical")
    # Each sample copies the pages of CHUNK lists and floats (~100 bytes each): about
    # 150 MB per 1,000 samples; well above zero, below a copy of everything per sample.
    assert 50 * 2**20 < detail["growth_bytes_per_1000_samples"] < 500 * 2**20, detail
    assert detail["workers_growing"] == 2 and detail["start_method"] == "fork"
    assert detail["projected_epoch_end_uss_bytes"] >= detail["uss_now_bytes"] > 0
    assert "per 1,000 samples" in finding["title"]
    assert "## Findings" in to_markdown(summary) and "numpy" in render_html(summary, {}, {}, [])
    assert any("objects: [" in line and "per 1,000 samples" in line
               for line in format_report(summary).splitlines())


def _series(samples, uss):
    return {"loader": "train", "rank": 0, "worker": 0, "pid": 1, "t": list(range(len(samples))),
            "uss_bytes": uss, "pss_bytes": uss, "samples": samples}


def test_a_warm_up_plateau_is_not_growth_and_steady_growth_is():
    mib = 2**20
    samples = [0, 100, 200, 300, 400, 500, 600, 700]
    plateau = [10 * mib, 60 * mib, 80 * mib, 81 * mib, 81 * mib, 80 * mib, 81 * mib, 81 * mib]
    assert growth_of(_series(samples, plateau)) is None
    steady = [10 * mib + s * 100_000 for s in samples]  # 100 kB per sample
    growth = growth_of(_series(samples, steady))
    assert growth is not None and abs(growth["bytes_per_sample"] - 100_000) < 1
    [finding] = memory_growth_findings([_series(samples, steady)], {"train": {"num_workers": 1,
                                                                           "dataset_len": 1700}})
    # 1,000 more samples to go at 100 kB each, on top of the last reading.
    assert finding["detail"]["projected_epoch_end_uss_bytes"] == steady[-1] + 1000 * 100_000


def test_memory_series_keep_one_point_per_reading_and_split_by_process():
    events = [{"loader": "train", "workers": [
        {"id": 0, "pid": 11, "samples": n, "uss_bytes": u, "pss_bytes": u, "mem_t_ns": t}]}
        for n, u, t in ((4, 100, 1e9), (8, 100, 1e9), (12, 150, 2e9))]
    events.append({"loader": "train", "workers": [
        {"id": 0, "pid": 12, "samples": 16, "uss_bytes": 90, "pss_bytes": 95, "mem_t_ns": 3e9}]})
    series = worker_memory_series(events)
    assert [(s["pid"], s["samples"], s["uss_bytes"]) for s in series] == [
        (11, [4, 12], [100, 150]), (12, [16], [90])]


def test_the_collector_serves_memory_series_findings_and_stall_details(tmp_path):
    """The collector side: per-worker memory over time, the growth finding and a hung
    worker's fields through the API, the export and the dashboard's view."""
    from fastapi.testclient import TestClient

    from starvewatch.dashboard import answer_card
    from starvewatch.monitor.web.app import create_app
    from starvewatch.monitor.web.collector_settings import CollectorSettings
    from tests.test_collector_api import batch, post

    mib, t0 = 2**20, 1_700_000_000 * 10**9
    payload = batch(run_id="mem-run", n=10)
    payload["loaders"][0]["config"] = {"num_workers": 2, "dataset_len": 4000,
                                       "multiprocessing_context": "fork"}
    payload["workers"] = [{"loader": "train", "t_ns": t0 + k * 10**9, "workers": [
        {"id": 0, "pid": 100, "state": "sleeping", "samples": 200 * k,
         "uss_bytes": 50 * mib + 200 * k * 100_000, "pss_bytes": 60 * mib, "mem_t_ns": t0 + k * 10**9},
        {"id": 1, "pid": 101, "state": "sleeping", "samples": 200 * k,
         "uss_bytes": 50 * mib, "pss_bytes": 60 * mib, "mem_t_ns": t0 + k * 10**9}]} for k in range(8)]
    stack = ('Thread 0x00007f (most recent call first):\n  File "/data.py", line 9 in read_shard\n'
             '  File "/torch/fetch.py", line 52 in fetch\n')
    payload["stalls"] = [{"loader": "train", "rank": 0, "epoch": 0, "step": 7, "started_ns": t0,
                          "ended_ns": None, "wait_s": 31.0, "t_ns": t0, "workers": [], "phase": "next",
                          "worker": 1, "worker_pid": 101, "worker_state": "sleeping",
                          "indices": [28, 29, 30, 31], "stack": stack}]
    settings = CollectorSettings(dir=tmp_path, dashboard=False, spool_scan_s=60)
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        assert post(client, payload).status_code == 200
        series = client.get("/api/v1/runs/mem-run/workers/memory").json()["series"]
        assert [(s["worker"], s["pid"], len(s["t"])) for s in series] == [(0, 100, 8), (1, 101, 8)]
        assert series[0]["uss_bytes"][-1] == 50 * mib + 1400 * 100_000 and series[1]["pss_bytes"] == [60 * mib] * 8
        assert client.get("/api/v1/runs/nope/workers/memory").status_code == 404
        summary = client.get("/api/v1/runs/mem-run/summary").json()
        [finding] = summary["findings"]
        assert finding["kind"] == "worker_memory_growth" and finding["detail"]["worker_pids"] == [100]
        assert finding["detail"]["growth_bytes_per_1000_samples"] == 100_000_000
        # 2,000 samples per worker per epoch, 1,400 served: 600 more at 100 kB each.
        assert finding["detail"]["projected_epoch_end_uss_bytes"] == 50 * mib + 2000 * 100_000
        [stall] = summary["stalls"]
        assert (stall["worker"], stall["worker_pid"], stall["indices"]) == (1, 101, [28, 29, 30, 31])
        markdown = client.get("/api/v1/runs/mem-run/export?format=md").text
        assert "worker 1 (pid 101, sleeping); loading indices 28, 29, 30, 31; at File \"/data.py\", line 9 in read_shard" in markdown
        assert "## Findings" in markdown
    panel = str(answer_card.findings_card(summary))
    assert "read_shard" in panel and "100.0 MiB per 1,000 samples" not in panel  # 95.4 MiB: binary
    assert "95.4 MiB per 1,000 samples" in panel


class BigBatches(Dataset):
    """6 MiB per sample: a batch of 4 is 24 MiB in /dev/shm while in flight."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int):
        time.sleep(0.02)  # an epoch lasts long enough for the sampler to read the workers' rows
        return torch.zeros(6 * 2**18, dtype=torch.float32)


class SmallBatches(BigBatches):
    def __getitem__(self, i: int):
        time.sleep(0.02)
        return torch.zeros(256)  # 1 KiB


def test_dev_shm_too_small_for_the_batches_in_flight_is_foreseen(monkeypatch):
    """Item 4: batch bytes sampled in the workers x prefetch_factor x num_workers against a
    (simulated, container-sized) /dev/shm with 64 MiB left: 24 MiB x 2 x 2 = 96 MiB cannot
    fit; 4 KiB batches do."""
    import shutil
    monkeypatch.setenv("STARVEWATCH_SHM_LIMIT_BYTES", str(shutil.disk_usage("/dev/shm").used + 64 * 2**20))
    monkeypatch.setenv("STARVEWATCH_HOST_INTERVAL_S", "0.1")
    big = starvewatch.watch(DataLoader(BigBatches(), batch_size=4, num_workers=2,
                                       multiprocessing_context="fork"), name="big")
    small = starvewatch.watch(DataLoader(SmallBatches(), batch_size=4, num_workers=2,
                                         multiprocessing_context="fork"), name="small")
    for _ in range(2):  # two epochs: the sampler reads the workers' rows while they live
        assert sum(1 for _ in big) == 4 and sum(1 for _ in small) == 4
    summary = starvewatch.finish()
    shm = [f for f in summary["findings"] if f["kind"] == "shm_risk"]
    assert [f["loader"] for f in shm] == ["big"], shm
    [finding] = shm
    assert finding["detail"]["batch_bytes"] == 24 * 2**20
    # Critical on its own; other processes on this shared machine use /dev/shm too, and
    # freeing theirs meanwhile may leave it a warning.
    assert finding["detail"]["shm_needed_bytes"] == 96 * 2**20 and finding["severity"] in ("critical", "warning")
    assert "Bus error" in finding["title"] and "--shm-size=121m" in finding["fix"]


class DiesOfSigbus(Dataset):
    def __init__(self, gate: str) -> None:
        self.gate = gate

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int):
        if i == 21:  # mid-epoch, once the test saw the workers sampled (bounded wait)
            deadline = time.monotonic() + 30
            while not os.path.exists(self.gate) and time.monotonic() < deadline:
                time.sleep(0.005)
            import signal
            os.kill(os.getpid(), signal.SIGBUS)  # what touching a full /dev/shm does
        return torch.zeros(4)


def test_a_worker_killed_by_sigbus_is_named_with_the_fix(tmp_path):
    import signal
    gate = tmp_path / "gate"
    loader = starvewatch.watch(DataLoader(DiesOfSigbus(str(gate)), batch_size=2, num_workers=2,
                                          multiprocessing_context="fork"), name="bus")
    session = current_session()
    iterator = iter(loader)  # kept, as a crashing script's traceback keeps it: not reaped yet
    # Deterministic: torch's SIGCHLD handler raises "worker killed" asynchronously in the main
    # thread wherever it is (inside pytest.raises' own exit once, after the pipe's error had
    # been caught). Without it, the dead worker is reported only by next() itself: torch's
    # iterator checks its workers when a read fails or times out. The worker stays unreaped
    # (nothing waits for it), as a crashing script leaves it.
    torch_handler = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        # Every way torch's iterator reports a dead worker: "killed by signal: Bus error" or
        # "exited unexpectedly" (RuntimeError), or the worker's pipe breaking while a result is
        # read (EOFError, ConnectionResetError, BrokenPipeError). Whichever it is, the exit code
        # says SIGBUS.
        with pytest.raises((RuntimeError, EOFError, ConnectionError)):
            next(iterator)
            # The sidecar knows the workers' pids (their states are read) before one dies.
            wait_until(lambda: any(w.get("state") in ("sleeping", "running") for s in session.samplers
                                   for k, e in list(s.history) if k == "workers" for w in e["workers"]),
                       timeout_s=30, what="the workers sampled")
            gate.touch()
            for _ in iterator:
                pass
        summary = starvewatch.finish()  # its last reading sees the dead worker
    finally:
        _shut_down(iterator._it)
        signal.signal(signal.SIGCHLD, torch_handler)
    [finding] = [f for f in summary["findings"] if f["kind"] == "sigbus"]
    assert finding["loader"] == "bus" and finding["severity"] == "critical"
    assert "SIGBUS" in finding["title"] and "shm-size" in finding["fix"]
    assert len(finding["detail"]["worker_pids"]) == 1


def _shut_down(inner) -> None:
    """torch's SIGCHLD handler raises for a failed worker at every child's exit until its
    pids are removed: removed first, so no later test gets this one's error."""
    if inner is None:
        return
    from torch.utils.data._utils.signal_handling import _remove_worker_pids
    if getattr(inner, "_worker_pids_set", False):
        _remove_worker_pids(id(inner))
        inner._worker_pids_set = False
    inner._shutdown_workers()


def test_shm_estimate_blames_only_loaders_whose_batches_matter():
    from starvewatch.analysis.findings.shm_exhaustion import shm_findings
    mib = 2**20
    events = [{"loader": name, "workers": [{"id": 0, "batch_bytes": size}]}
              for name, size in (("tiny", 4096), ("big", 20 * mib))]
    configs = {"tiny": {"num_workers": 2, "prefetch_factor": 2}, "big": {"num_workers": 2, "prefetch_factor": 2}}
    # /dev/shm full of other processes' files (150 MiB used at peak, 80 of them this loader's):
    full = shm_findings(events, configs, {"shm_total_bytes": 64 * mib, "shm_used_max_bytes": 150 * mib})
    assert [(f["loader"], f["severity"], f["detail"]["shm_available_bytes"]) for f in full] == [("big", "critical", 0)]
    assert "smaller batches" in full[0]["fix"]
    # Plenty of room: nothing; 80 MiB of 128 MiB: a warning with settings that fit (0.8 x 128 / 20 = 5 slots).
    assert shm_findings(events, configs, {"shm_total_bytes": 1024 * mib, "shm_used_max_bytes": 0}) == []
    [warn] = shm_findings(events, configs, {"shm_total_bytes": 128 * mib, "shm_used_max_bytes": 0})
    assert warn["severity"] == "warning" and "num_workers=2, prefetch_factor=2" in warn["fix"]


def test_worker_memory_is_uss_only_never_an_early_rss_reading():
    """A worker's memory, in one unit: its first snapshot (before the first USS reading) has
    only RSS, 8 GiB because the parent holds a large dataset the fork shares; its USS readings
    are 100 MiB. The maximum is ~100 MiB, and the memory budget plans the workers the loading
    wants instead of capping them at what 8 GiB a worker would allow."""
    from starvewatch.analysis.system import overview
    from tests.test_diagnosis import GIB, loader, run, system
    mib = 2**20

    def snapshot(t_s, uss):
        return ("workers", {"t_ns": t_s * 10**9, "loader": "train", "configured_workers": 2, "alive_workers": 2,
                            "workers": [{"id": k, "pid": 100 + k, "rss_bytes": 8 * GIB, "uss_bytes": uss,
                                         "mem_t_ns": t_s * 10**9 if uss else None} for k in range(2)]})
    events = [snapshot(0, None)] + [snapshot(t, 100 * mib + t * 1000) for t in (5, 10, 15)]
    memory = overview(events)["loaders"]["train"]["worker_mem_bytes_max"]
    assert memory == pytest.approx(100 * mib, rel=0.01)
    s = run(loader(wait_ms=30, compute_ms=5, workers=2, persistent=True),
            system_info=system(cpu_fraction=0.05, load_ms=35, mem_available_min_bytes=2 * GIB,
                               loaders={"train": {"worker_load_ms_mean": 35, "worker_cpu_fraction": 0.05,
                                                  "worker_mem_bytes_max": memory}}))
    workers = [r for r in s["recommendations"] if r["parameter"] == "num_workers"]
    # 9 workers wanted; (2 GiB free + 2 x 100 MiB) x 0.8 holds 18 of 100 MiB (of 8 GiB: 1)
    assert [(r["suggested"], r["kind"]) for r in workers] == [(9, "speedup")]
    assert "memory" not in workers[0]["reason"]
