"""What is measured: wait vs compute against ground truth timed by the test's own loop."""
import os
import subprocess
import sys
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import starvewatch
from starvewatch.hooks import cuda
from tests.datasets import SleepyDataset
from tests.conftest import shipped_column, shipped_steps


@pytest.mark.parametrize("load_ms,compute_ms,workers", [
    (8, 2, 0), (2, 8, 0), (5, 5, 0), (12, 4, 2), (4, 12, 2),
])
def test_input_wait_fraction_matches_ground_truth(load_ms, compute_ms, workers):
    loader = DataLoader(SleepyDataset(40, load_ms / 1000 / 2), batch_size=2, num_workers=workers)
    watched = starvewatch.watch(loader)
    wait_ns = compute_ns = 0
    for _ in range(2):
        t = time.perf_counter_ns()
        it = iter(watched)
        while True:
            try:
                next(it)
            except StopIteration:
                wait_ns += time.perf_counter_ns() - t
                break
            t1 = time.perf_counter_ns()
            wait_ns += t1 - t
            time.sleep(compute_ms / 1000)
            t = time.perf_counter_ns()
            compute_ns += t - t1
        del it
    truth = wait_ns / (wait_ns + compute_ns)
    summary = starvewatch.finish()
    measured = summary["loaders"][0]["input_wait_fraction"]
    assert summary["loaders"][0]["steps"] == 40
    assert measured == pytest.approx(truth, abs=0.03)


def test_step_block_is_compute_and_the_rest_is_other(memory_run):
    """Truth from the loop's own clock, not the nominal sleeps (a loaded machine oversleeps them):
    each step's compute lies between the block's inside and its outside as the loop timed them,
    and its other between the loop body less the block and the whole gap between two bodies."""
    session, transport = memory_run
    now = time.perf_counter_ns
    body_starts, body_ends, block_inner, block_outer = [], [], [], []
    body_ends.append(now())  # the first step's batch was asked for after this
    for _ in starvewatch.watch(range(25)):
        body_starts.append(now())
        with starvewatch.step():
            inner_start = now()
            time.sleep(0.004)
            inner_end = now()
        block_end = now()
        time.sleep(0.002)  # logging, checkpointing: outside the step block
        block_inner.append(inner_end - inner_start)
        block_outer.append(block_end - body_starts[-1])
        body_ends.append(now())
    body_starts.append(now())  # the last step closed before this
    summary = starvewatch.finish()
    computes, others = shipped_column(transport, "compute_ns"), shipped_column(transport, "other_ns")
    assert len(computes) == len(others) == 25
    for i in range(25):
        body_ns = body_ends[i + 1] - body_starts[i]
        gap_ns = body_starts[i + 1] - body_ends[i]  # the most the step's loop time can be
        assert block_inner[i] <= computes[i] <= block_outer[i], (i, computes[i], block_inner[i], block_outer[i])
        assert body_ns - block_outer[i] <= others[i] <= gap_ns - block_inner[i], (i, others[i])
        assert others[i] >= 2_000_000  # the 2 ms outside the block are never compute
    loader = summary["loaders"][0]
    assert loader["compute_ms"]["mean"] == pytest.approx(sum(computes) / 25 / 1e6, rel=1e-3)
    assert loader["other_ms_total"] == pytest.approx(sum(others) / 1e6, rel=1e-3)


def test_step_decorator_and_nesting_count_the_outermost_block(memory_run):
    session, transport = memory_run
    now = time.perf_counter_ns
    inner, outer = [], []

    @starvewatch.step
    def train_step():
        with starvewatch.step():  # nested: not counted twice
            start = now()
            time.sleep(0.003)
            inner.append(now() - start)

    for _ in starvewatch.watch(range(20)):
        start = now()
        train_step()
        outer.append(now() - start)
    loader = starvewatch.finish()["loaders"][0]
    # Against the loop's own clock (a loaded machine oversleeps 3 ms): counted twice, a step's
    # compute would pass its whole call; unmarked, it would be the whole loop body and more.
    computes = shipped_column(transport, "compute_ns")
    assert len(computes) == 20
    assert all(inner[i] <= computes[i] <= outer[i] for i in range(20)), (computes, inner, outer)
    assert loader["compute_ms"]["mean"] == pytest.approx(sum(computes) / 20 / 1e6, rel=1e-3)


def test_step_by_loader_name_marks_that_loaders_compute(memory_run):
    """`step("train")` inside a validation loop run within a training step: the block is the
    training step's compute (found by name in the current run), not the validation loader's."""
    train = starvewatch.watch(range(20), name="train")
    val = starvewatch.watch(range(1), name="val")
    for _ in train:
        for _ in val:
            with starvewatch.step("train"):
                time.sleep(0.01)
        with starvewatch.step("no-such-loader"):  # no loader of that name: nothing to mark
            pass
    loaders = {entry["name"]: entry for entry in starvewatch.finish()["loaders"]}
    # Without the name, the validation epoch would be cut out of the training step: ~0 ms.
    assert loaders["train"]["compute_ms"]["mean"] >= 9.5
    assert loaders["val"]["steps"] == 20


def test_phases_are_recorded_per_step(memory_run):
    session, transport = memory_run
    for _ in starvewatch.watch(range(3)):
        with starvewatch.phase("forward"):
            time.sleep(0.002)
        with starvewatch.phase("backward"):
            with starvewatch.phase("allreduce"):
                time.sleep(0.001)
    starvewatch.finish()
    phases = [p for payload in transport.payloads for p in payload["phases"]]
    names = sorted({p[3] for p in phases})
    assert names == ["allreduce", "backward", "forward"]
    forward = [p for p in phases if p[3] == "forward"]
    assert [(p[0], p[1], p[2]) for p in forward] == [("train", 0, 0), ("train", 0, 1), ("train", 0, 2)]
    assert all(p[4] >= 2_000_000 for p in forward)


def test_validation_inside_a_training_step_is_attributed_to_validation(memory_run):
    """The truth is the loop's own clock: each validation body, and the whole validation inside
    training step 10 (a sleep oversleeps under load; the test judges against what it measured)."""
    session, transport = memory_run
    train = starvewatch.watch(range(21), name="train")
    val = starvewatch.watch(range(5), name="val")
    val_bodies, validation_ns = [], 0
    for i in train:
        time.sleep(0.001)
        if i == 10:
            v_start = time.perf_counter_ns()
            for _ in val:
                b0 = time.perf_counter_ns()
                time.sleep(0.02)  # 100 ms of validation inside train step 10
                val_bodies.append(time.perf_counter_ns() - b0)
            validation_ns = time.perf_counter_ns() - v_start
    summary = starvewatch.finish()
    computes = shipped_column(transport, "compute_ns", loader="train")
    assert len(computes) == 21 and validation_ns >= 100_000_000
    # leaked, step 10's compute would hold the whole validation (>= 100 ms)
    assert max(computes) < validation_ns / 2, "validation time leaked into the training step"
    by_name = {l["name"]: l for l in summary["loaders"]}
    assert by_name["val"]["steps"] == 5
    measured_ms = sum(val_bodies) / len(val_bodies) / 1e6
    assert by_name["val"]["compute_ms"]["mean"] == pytest.approx(measured_ms, rel=0.1, abs=1.0)


def test_epoch_startup_counts_as_wait_of_the_first_step(memory_run):
    session, transport = memory_run

    class SlowStart:
        def __iter__(self):
            time.sleep(0.05)  # like spawning workers
            return iter(range(3))

    list(starvewatch.watch(SlowStart()))
    starvewatch.finish()
    waits = shipped_column(transport, "wait_ns")
    assert waits[0] >= 50_000_000 and max(waits[1:]) < 10_000_000


def test_records_are_unique_and_ordered(memory_run):
    session, transport = memory_run
    loader = starvewatch.watch(range(1000))
    for _ in range(3):
        for _ in loader:
            pass
    starvewatch.finish()
    steps = shipped_steps(transport)
    assert len(steps) == len(set(steps)) == 3000
    assert sorted(steps) == [("train", e, s) for e in range(3) for s in range(1000)]


class FakeGpu:
    """A GPU queue: kernels run one after another; an event completes when the work queued
    before it is done. Models torch.cuda.Event's record/query/elapsed_time."""

    def __init__(self):
        self.busy_until = time.perf_counter()

    def launch(self, seconds):
        self.busy_until = max(self.busy_until, time.perf_counter()) + seconds

    def event(self):
        gpu = self

        class Event:
            def __init__(self):
                self.at = None

            def record(self):
                self.at = max(gpu.busy_until, time.perf_counter())

            def query(self):
                return self.at is not None and time.perf_counter() >= self.at

            def elapsed_time(self, end):
                return (end.at - self.at) * 1000.0

        return Event()


@pytest.mark.parametrize("gpu_work_s,expect_idle", [(0.001, True), (0.03, False)])
def test_cuda_events_measure_what_the_gpu_saw(monkeypatch, memory_run, gpu_work_s, expect_idle):
    session, transport = memory_run
    session.settings.gpu_event_every = 1  # every step measured: each one is checked below
    gpu = FakeGpu()
    monkeypatch.setattr(cuda, "detect_event_factory", lambda: gpu.event)

    def slow_source():
        for i in range(25):
            time.sleep(0.01)  # 10 ms data wait per step
            yield i

    for _ in starvewatch.watch(slow_source()):
        gpu.launch(gpu_work_s)  # asynchronous: the CPU goes on at once
        time.sleep(0.001)
    summary = starvewatch.finish()
    idle = shipped_column(transport, "gpu_idle_ns")
    assert len(idle) == 25 and all(v is not None for v in idle)
    fraction = summary["verdict"]["gpu_idle_fraction"]
    if expect_idle:  # the queue was empty while the loop waited: the GPU starved
        assert fraction > 0.6
    else:  # a 30 ms backlog per step hid the 10 ms wait from the GPU
        # only the very first step found the GPU idle
        assert fraction < 0.08 and sorted(idle)[12] == 0
        assert summary["loaders"][0]["input_wait_fraction"] > 0.6


def test_exhausted_event_pool_skips_rather_than_blocks(monkeypatch, memory_run):
    session, transport = memory_run
    gpu = FakeGpu()
    monkeypatch.setattr(cuda, "detect_event_factory", lambda: gpu.event)
    session._gpu_timer = cuda.CudaEventTimer(gpu.event, pool_size=2)
    gpu.launch(3600)  # nothing completes: every pair stays pending
    for _ in starvewatch.watch(range(10)):
        pass
    assert session._gpu_timer.skipped >= 8
    summary = starvewatch.finish()
    assert summary["loaders"][0]["steps"] == 10
    assert shipped_column(transport, "gpu_idle_ns").count(None) == 10


def test_cuda_events_on_a_random_fraction_of_steps():
    """One step in `every` on average is measured, with random gaps (no step period of the
    loop can line up with them); the first step always is; skipped steps record no event."""
    from tests.standins.fake_cuda import StandInCuda
    gpu = StandInCuda()
    timer = cuda.CudaEventTimer(gpu.event, pool_size=4, every=8, seed=1)
    measured = []
    for step in range(8000):
        token = timer.begin()
        if token is not None:
            timer.end(token)
            assert timer.resolve(token) is not None
            measured.append(step)
    assert measured[0] == 0
    assert 850 <= len(measured) <= 1150  # ~1,000 (1 in 8)
    assert gpu.calls["record"] == 2 * len(measured)
    gaps = {b - a for a, b in zip(measured, measured[1:])}
    assert gaps == set(range(1, 16))  # every gap from 1 to 15: no fixed period
    every_step = cuda.CudaEventTimer(gpu.event, pool_size=4, every=1)
    for _ in range(10):
        token = every_step.begin()
        assert token is not None
        every_step.release(token)


def test_sampled_cuda_events_keep_every_step_and_an_unbiased_idle_fraction(monkeypatch, memory_run):
    """With one step in 4 measured, the steps between take the fast path: every step is still
    recorded with its wait and compute, and the GPU-idle fraction comes from the measured ones."""
    from starvewatch.hooks.loader import FastGpuWatchedIterator
    session, transport = memory_run
    session.settings.gpu_event_every = 4
    gpu = FakeGpu()
    monkeypatch.setattr(cuda, "detect_event_factory", lambda: gpu.event)
    classes = set()

    def source():
        for i in range(200):
            time.sleep(0.002)  # a data wait with the GPU queue empty: the GPU starves
            yield i

    iterator = iter(starvewatch.watch(source()))
    for _ in iterator:
        classes.add(type(iterator))
        gpu.launch(0.0002)
    summary = starvewatch.finish()
    idle = shipped_column(transport, "gpu_idle_ns")
    measured = [v for v in idle if v is not None]
    assert len(idle) == 200 and summary["loaders"][0]["steps"] == 200
    assert 25 <= len(measured) <= 80  # ~50
    assert FastGpuWatchedIterator in classes
    assert summary["verdict"]["gpu_idle_fraction"] > 0.6
    assert sorted(shipped_steps(transport)) == [("train", 0, s) for s in range(200)]


_DIST_SCRIPT = """
import starvewatch, json
from starvewatch.hooks.delivery.transport import MemoryTransport
s = starvewatch.init('ddp', transport=MemoryTransport())
print(json.dumps([s.run_id, s.rank, s.world_size]))
"""


def test_ranks_of_one_job_share_a_run_id(tmp_path):
    ids = []
    for rank in (0, 1):
        env = dict(os.environ, TORCHELASTIC_RUN_ID="job42", RANK=str(rank), WORLD_SIZE="2",
                   LOCAL_RANK=str(rank), STARVEWATCH_URL="off")
        out = subprocess.run([sys.executable, "-c", _DIST_SCRIPT], env=env, capture_output=True,
                             text=True, check=True, cwd=tmp_path)
        ids.append(tuple(__import__("json").loads(out.stdout.splitlines()[0])))
    assert ids[0][0] == ids[1][0] and ids[0][1:] == (0, 2) and ids[1][1:] == (1, 2)


class SquareDataset(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.tensor([float(i * i)])


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_worker_processes_under_every_start_method(memory_run, method):
    session, transport = memory_run
    loader = starvewatch.watch(DataLoader(SquareDataset(), batch_size=4, num_workers=2,
                                          multiprocessing_context=method,
                                          persistent_workers=True))
    for _ in range(20):
        values = [b.flatten().tolist() for b in loader]
        assert sum(values, []) == [float(i * i) for i in range(16)]
    summary = starvewatch.finish()
    assert summary["loaders"][0]["steps"] == 80
    assert summary["loaders"][0]["config"]["multiprocessing_context"] == method
    steps = shipped_steps(transport)
    assert len(steps) == len(set(steps)) == 80
