"""Training scenarios with a known ground truth, runnable on a CPU.

The step "compute" sleeps, as a training loop does while it waits for its GPU kernels, so the
cores stay free for DataLoader workers as they would on a GPU machine. Loading either sleeps
(latency: reads, network) or spins (CPU: decoding, transforms). Each scenario states, before
it runs, the verdict, the limiting factor and the top recommendation it must get.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch.utils.data import DataLoader, Dataset


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class Items(Dataset):
    """`n` items; each costs `sleep_s` of waiting and `spin_s` of CPU; every `slow_every`-th
    item (when set) costs `slow_s` more; `size` floats per item."""

    def __init__(self, n, sleep_s=0.0, spin_s=0.0, slow_every=0, slow_s=0.0, size=4):
        self.n, self.sleep_s, self.spin_s = n, sleep_s, spin_s
        self.slow_every, self.slow_s, self.size = slow_every, slow_s, size

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        if self.spin_s:
            spin(self.spin_s)
        if self.slow_every and i % self.slow_every == 0:
            time.sleep(self.slow_s)
        return torch.zeros(self.size)


def slow_worker_start(worker_id):
    time.sleep(0.25)  # opening a dataset file, connecting to storage...


@dataclass
class Scenario:
    name: str
    description: str
    loaders: dict                  # loader name -> (dataset factory, DataLoader kwargs)
    compute_s: dict                # loader name -> seconds of "GPU" time per step
    epochs: int
    expect_verdict: str
    expect_factor: str
    expect_top: tuple | None       # (loader, parameter) of the top recommendation, or None
    env: dict = field(default_factory=dict)

    def run(self, configs: dict) -> dict:
        """Train with the given DataLoader kwargs; wall seconds spent per loader."""
        import starvewatch
        loaders = {}
        for name, (make, _) in self.loaders.items():
            loaders[name] = starvewatch.watch(DataLoader(make(), **configs[name]), name=name)
        spent = dict.fromkeys(loaders, 0.0)
        for _ in range(self.epochs):
            for name, loader in loaders.items():
                t0 = time.perf_counter()
                for _ in loader:
                    time.sleep(self.compute_s[name])
                spent[name] += time.perf_counter() - t0
        del loaders
        return spent


SCENARIOS = [
    Scenario("workers0_slow_getitem", "num_workers=0 with a slow __getitem__ (4 ms reads)",
             {"train": (lambda: Items(512, sleep_s=0.004), {"batch_size": 8, "num_workers": 0})},
             {"train": 0.016}, 2, "high", "input_bound_io", ("train", "num_workers")),
    Scenario("latency_too_few_workers", "latency-bound reads (4 ms) with one worker",
             {"train": (lambda: Items(768, sleep_s=0.004), {"batch_size": 8, "num_workers": 1})},
             {"train": 0.016}, 1, "high", "input_bound_io", ("train", "num_workers")),
    Scenario("cpu_transform_workers_eq_cores", "a CPU-heavy transform (16 ms a batch) with workers = cores",
             {"train": (lambda: Items(768, spin_s=0.002), {"batch_size": 8, "num_workers": 2,
                                                          "persistent_workers": True})},
             {"train": 0.004}, 2, "high", "input_bound_cpu", ("train", None)),
    Scenario("persistent_off_slow_startup", "persistent_workers=False, short epochs, slow worker start-up",
             {"train": (lambda: Items(64, sleep_s=0.0005), {"batch_size": 4, "num_workers": 2,
                                                           "worker_init_fn": slow_worker_start})},
             {"train": 0.005}, 6, "high", "epoch_startup", ("train", "persistent_workers")),
    Scenario("bursty_dataset", "every 32nd batch is 120 ms slow; workers keep up on average",
             {"train": (lambda: Items(1024, sleep_s=0.0005, slow_every=128, slow_s=0.12),
                        {"batch_size": 4, "num_workers": 2, "prefetch_factor": 2, "persistent_workers": True})},
             {"train": 0.02}, 1, "moderate", "input_bound_io", ("train", "prefetch_factor")),
    Scenario("healthy_compute_bound", "cheap in-memory data, 20 ms steps",
             {"train": (lambda: Items(512), {"batch_size": 4, "num_workers": 0})},
             {"train": 0.02}, 1, "not", "compute_bound", None),
    Scenario("slow_validation", "a slow validation loader (num_workers=0) beside a healthy training loader",
             {"train": (lambda: Items(256), {"batch_size": 4, "num_workers": 0}),
              "val": (lambda: Items(256, sleep_s=0.003), {"batch_size": 8, "num_workers": 0})},
             {"train": 0.008, "val": 0.02}, 3, "high", "input_bound_io", ("val", "num_workers")),
    Scenario("shm_pressure", "large batches, deep prefetch, /dev/shm limited to 12 MiB (simulated)",
             {"train": (lambda: Items(192, sleep_s=0.0002, size=128 * 1024),
                        {"batch_size": 2, "num_workers": 2, "prefetch_factor": 8, "persistent_workers": True})},
             {"train": 0.06}, 1, "not", "compute_bound", ("train", "prefetch_factor"),
             env={"shm_limit_extra_bytes": 12 * 2**20}),
]
