"""Training scenarios with a known ground truth, runnable on a CPU: one per engine rule.

The step "compute" sleeps, as a training loop does while it waits for its GPU kernels, so the
cores stay free for DataLoader workers as they would on a GPU machine. Loading mostly sleeps
(latency: reads, network), which keeps the figures steady on a busy host; the CPU-bound
scenarios spin (decoding, transforms). Each scenario states, before it runs, the verdict, the
limiting factor and the top recommendation (loader, parameter, value range) it must get, and
supplies the "fixed" dataset that advice which is not a DataLoader argument stands for.
"""
from __future__ import annotations

import atexit
import functools
import mmap
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, SequentialSampler


def spin(cpu_seconds: float) -> None:
    """CPU work: a fixed amount of this thread's CPU time (decoding, transforms), however busy
    the host is."""
    end = time.thread_time() + cpu_seconds
    while time.thread_time() < end:
        pass


def hog(stop, duty: float) -> None:
    """A CPU hog's process: keeps `duty` of one core busy (spinning `duty` of every 100 ms) until
    `stop` is set; the harness's --hog and the CPU-hog pair run it."""
    while not stop.is_set():
        end = time.perf_counter() + 0.1 * duty
        while time.perf_counter() < end:
            pass
        time.sleep(0.1 * (1 - duty))


class Items(Dataset):
    """`n` items; each costs `sleep_s` of waiting and `spin_s` of CPU; every `slow_every`-th
    item (when set) costs `slow_s` more; `size` floats per item. With `batch` set, every item
    is already a batch of that many samples (for batch_size=None)."""

    def __init__(self, n, sleep_s=0.0, spin_s=0.0, slow_every=0, slow_s=0.0, size=4, batch=0):
        self.n, self.sleep_s, self.spin_s = n, sleep_s, spin_s
        self.slow_every, self.slow_s, self.size, self.batch = slow_every, slow_s, size, batch

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        if self.spin_s:
            spin(self.spin_s)
        if self.slow_every and i % self.slow_every == 0:
            time.sleep(self.slow_s)
        return torch.zeros((self.batch, self.size) if self.batch else (self.size,))


class SkewedShard(Items):
    """Items whose worker `slow_worker` takes `factor` times longer each (its shard sits on a
    slow disk, or its samples are larger): with in_order=True the loop waits for that worker's
    batches while the others' are ready (issue 38: head-of-line blocking)."""

    def __init__(self, n, sleep_s, slow_worker=1, factor=10):
        super().__init__(n, sleep_s=sleep_s)
        self.slow_worker, self.factor = slow_worker, factor

    def __getitem__(self, i):
        from torch.utils.data import get_worker_info
        info = get_worker_info()
        if info is not None and info.id == self.slow_worker:
            time.sleep(self.sleep_s * (self.factor - 1))
        return super().__getitem__(i)


class ThreadLoader(DataLoader):
    """MONAI's ThreadDataLoader in its essentials (MONAI is not a dependency here): the
    DataLoader's batches are made on a background thread of the training process into a queue
    of `buffer_size`, and the loop takes them from the queue. With num_workers=0 the loading is
    that thread's CPU work; the training thread only waits on the queue."""

    def __init__(self, dataset, buffer_size: int = 1, **kwargs):
        super().__init__(dataset, **kwargs)
        self.buffer_size = buffer_size

    def __iter__(self):
        import queue
        import threading
        buffer, done = queue.Queue(self.buffer_size), object()
        source = super().__iter__()

        def fill():
            for batch in source:
                buffer.put(batch)
            buffer.put(done)
        threading.Thread(target=fill, daemon=True, name="thread-loader").start()
        while (batch := buffer.get()) is not done:
            yield batch


class Chunks(BatchSampler):
    """A custom batch sampler (as a bucketing sampler would be): fixed chunks of 8 indices."""

    def __init__(self, dataset):
        super().__init__(SequentialSampler(dataset), 8, False)


def _rebuilt(tensor, cpu_s):
    spin(cpu_s)
    return tensor


class RebuildOnArrival:
    """A collate_fn whose batches cost the receiving process CPU to rebuild (as decompressing
    or re-assembling many small objects does): the main process's share of every batch."""

    def __init__(self, cpu_s: float) -> None:
        self.cpu_s = cpu_s

    def __call__(self, items):
        return _Packed(torch.stack(items), self.cpu_s)


class _Packed:
    def __init__(self, tensor, cpu_s):
        self.tensor, self.cpu_s = tensor, cpu_s

    def __reduce__(self):
        return _rebuilt, (self.tensor, self.cpu_s)


class HangsOnce(Items):
    """`Items` whose item `hang_at` blocks for `hang_s` (a stuck read, a lock): a hung worker."""

    def __init__(self, n, hang_at, hang_s, **kwargs):
        super().__init__(n, **kwargs)
        self.hang_at, self.hang_s = hang_at, hang_s

    def __getitem__(self, i):
        if i == self.hang_at:
            stuck_on_a_read(self.hang_s)
        return super().__getitem__(i)


def stuck_on_a_read(seconds: float) -> None:
    time.sleep(seconds)  # the frame the stall's stack must name


class PythonRows(Items):
    """`Items` whose samples each read a fresh chunk of a big list of Python lists: under fork,
    every read copies the pages of those objects into the worker (copy-on-read)."""

    ROWS, CHUNK = 600_000, 1500

    def __init__(self, n, **kwargs):
        super().__init__(n, **kwargs)
        self.rows = [[float(i)] for i in range(self.ROWS)]
        self.calls = 0

    def __getitem__(self, i):
        start = (self.calls * self.CHUNK) % self.ROWS
        self.calls += 1
        total = sum(row[0] for row in self.rows[start:start + self.CHUNK])  # writes each refcount
        return super().__getitem__(i) + total


class NotSharded(IterableDataset):
    """An IterableDataset that forgets get_worker_info(): every worker yields every sample."""

    def __init__(self, n, size=4):
        self.n, self.size = n, size

    def __iter__(self):
        for i in range(self.n):
            yield torch.full((self.size,), float(i))


class FileShards(IterableDataset):
    """A pure-torch sharded IterableDataset: `shards` files of samples, split among the workers
    as most hand-written ones do (`files[worker::workers]`). With fewer shards than workers, a
    worker gets none and serves nothing."""

    def __init__(self, shards, per_shard, sleep_s=0.0, size=4):
        self.shards, self.per_shard, self.sleep_s, self.size = shards, per_shard, sleep_s, size

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        for shard in range(self.shards)[worker::workers]:
            for i in range(self.per_shard):
                if self.sleep_s:
                    time.sleep(self.sleep_s)
                yield torch.full((self.size,), float(shard * self.per_shard + i))


def _slow_sample(sample, sleep_s):
    time.sleep(sleep_s)  # a read of the sample from remote storage
    return torch.full((4,), float(sample["cls"]))


@functools.cache
def tar_shards(shards: int, samples: int) -> tuple[str, ...]:
    """`samples` samples written as `shards` webdataset tar shards (sample n in shard n % shards),
    once per harness run, removed at exit."""
    import webdataset as wds
    folder = tempfile.mkdtemp(prefix="starvewatch-shards-")
    atexit.register(shutil.rmtree, folder, True)
    urls = []
    for shard in range(shards):
        path = os.path.join(folder, f"shard-{shard:04d}.tar")
        with wds.TarWriter(path) as sink:
            for n in range(shard, samples, shards):
                sink.write({"__key__": f"{n:06d}", "cls": n})
        urls.append(path)
    return tuple(urls)


def tar_dataset(shards: int, samples: int, sleep_s: float):
    """A webdataset over `shards` tar shards split among the workers by webdataset itself;
    empty_check=False lets a worker without a shard start (and serve nothing)."""
    import webdataset as wds
    return wds.WebDataset(list(tar_shards(shards, samples)), shardshuffle=False, empty_check=False) \
        .decode().map(functools.partial(_slow_sample, sleep_s=sleep_s))


def _slow_row(row, sleep_s):
    time.sleep(sleep_s)  # a read of the row from remote storage
    return row


def stack_x(rows):
    return torch.stack([torch.as_tensor(row["x"], dtype=torch.float32) for row in rows])


def hf_dataset(shards: int, samples: int, sleep_s: float):
    """A Hugging Face `datasets` IterableDataset of `shards` shards (`to_iterable_dataset`'s
    default is 1): datasets itself gives each worker whole shards and stops the workers left
    without one."""
    import datasets
    table = datasets.Dataset.from_dict({"x": [[float(i)] * 4 for i in range(samples)]})
    return table.to_iterable_dataset(num_shards=shards).map(functools.partial(_slow_row, sleep_s=sleep_s))


class DiskReads(Dataset):
    """`n` items, each `chunks` random 1 MiB reads of a data file with O_DIRECT (past the page
    cache: every read goes to the device, as a dataset larger than RAM does); with `in_memory`,
    the same bytes copied from RAM instead (the data moved to faster storage)."""

    CHUNK = 1 << 20

    def __init__(self, n, chunks=4, in_memory=False):
        self.n, self.chunks, self.in_memory = n, chunks, in_memory
        self.path = data_file()
        self.blocks = os.path.getsize(self.path) // self.CHUNK
        self.fd = self.buffer = None
        if in_memory:  # 64 MiB of the file, read here: forked workers share it, none reads the disk
            with open(self.path, "rb") as f:
                self.ram = f.read(64 * self.CHUNK)
            self.blocks = 64

    def __len__(self):
        return self.n

    def _open(self):
        if self.in_memory:  # a read is one copy out of RAM (as from the page cache)
            self.buffer = bytearray(self.CHUNK)
        else:
            self.fd, self.buffer = open_direct(self.path)

    def __getitem__(self, i):
        if self.buffer is None:  # opened in the worker that reads
            self._open()
        rng = random.Random(i)
        for _ in range(self.chunks):
            block = rng.randrange(self.blocks)
            if self.in_memory:
                self.buffer[:] = memoryview(self.ram)[block * self.CHUNK:(block + 1) * self.CHUNK]
            else:
                os.preadv(self.fd, [self.buffer], block * self.CHUNK)
        return torch.frombuffer(self.buffer, dtype=torch.float32, count=4).clone()

    def __getstate__(self):  # workers open their own file
        return {**self.__dict__, "fd": None, "buffer": None}


def open_direct(path: str) -> tuple[int, mmap.mmap]:
    """A descriptor reading past the page cache, and a page-aligned 1 MiB buffer (O_DIRECT
    needs one)."""
    return os.open(path, os.O_RDONLY | os.O_DIRECT), mmap.mmap(-1, DiskReads.CHUNK)


@functools.cache
def data_file(size_bytes: int = 512 << 20) -> str:
    """A file of random bytes for DiskReads, written once per harness run, removed at exit."""
    folder = tempfile.mkdtemp(prefix="starvewatch-disk-", dir=os.environ.get("STARVEWATCH_DISK_DIR"))
    atexit.register(shutil.rmtree, folder, True)
    path = os.path.join(folder, "data.bin")
    with open(path, "wb") as f:
        for _ in range(size_bytes // DiskReads.CHUNK):
            f.write(os.urandom(DiskReads.CHUNK))
        os.fsync(f.fileno())
    # Read it all once past the page cache: a freshly written file is slower to read than
    # the runs after it find it (the VM's host caches it), and the diagnosed run comes first.
    fd, block = open_direct(path)
    try:
        while os.readv(fd, [block]) == DiskReads.CHUNK:
            pass
    finally:
        os.close(fd)
        block.close()
    return path


SLOW_DISK_BYTES_PER_S = 400 << 20
BLKIO = "/sys/fs/cgroup/blkio"


def slow_disk() -> Callable[[], None] | None:
    """The data file, and this process (the workers it forks inherit it) in a cgroup-v1 blkio
    group whose reads of that disk are throttled to SLOW_DISK_BYTES_PER_S: a steady slow
    device (this VM's disk swings 0.8-2.4 GB/s between runs). Returns the undo; None where
    the throttle is not available (no cgroup v1 blkio, not root): the real disk as it is."""
    path = data_file()
    group = os.path.join(BLKIO, "starvewatch-slow-disk")
    device = os.stat(path).st_dev
    try:
        os.makedirs(group, exist_ok=True)
        with open(os.path.join(group, "blkio.throttle.read_bps_device"), "w") as f:
            f.write(f"{os.major(device)}:{os.minor(device)} {SLOW_DISK_BYTES_PER_S}")
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    except OSError as exc:
        print(f"  slow disk not simulated ({exc}); reading the real disk", file=sys.stderr)
        return None

    def undo():
        with open(os.path.join(BLKIO, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        try:
            os.rmdir(group)
        except OSError:  # a worker still in it: the group goes with the next run's makedirs
            pass
    return undo


@functools.cache
def jpeg_folder(count: int = 512, side: int = 256) -> str:
    """`count` photo-like JPEGs (a gradient under noise, `side` pixels square), written once
    per harness run into a temporary folder removed at exit."""
    from PIL import Image
    folder = tempfile.mkdtemp(prefix="starvewatch-jpegs-")
    atexit.register(shutil.rmtree, folder, True)
    rng = random.Random(0)
    gradient = Image.merge("RGB", [Image.linear_gradient("L").resize((side, side)),
                                   Image.radial_gradient("L").resize((side, side)),
                                   Image.linear_gradient("L").rotate(90).resize((side, side))])
    for i in range(count):
        noise = Image.frombytes("RGB", (side, side), rng.randbytes(side * side * 3))
        Image.blend(gradient, noise, 0.25).rotate(rng.randrange(360)).save(
            os.path.join(folder, f"{i:05d}.jpg"), quality=90)
    return folder


class Photos(Dataset):
    """The tutorial image pipeline, CPU-bound: Pillow opens a JPEG, random crop, random
    horizontal flip, resize, to a float tensor (CHW, 0-1)."""

    def __init__(self, crop: int = 192, out: int = 128, paths: list[str] | None = None) -> None:
        if paths is None:
            folder = jpeg_folder()
            paths = sorted(os.path.join(folder, p) for p in os.listdir(folder))
        self.paths = paths
        self.crop, self.out = crop, out

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        from PIL import Image
        rng = random.Random(i)
        with Image.open(self.paths[i]) as image:
            image = image.convert("RGB")
            x, y = rng.randrange(image.width - self.crop + 1), rng.randrange(image.height - self.crop + 1)
            image = image.crop((x, y, x + self.crop, y + self.crop))
            if rng.random() < 0.5:
                image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            image = image.resize((self.out, self.out), Image.Resampling.BILINEAR)
            pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
        return pixels.view(self.out, self.out, 3).permute(2, 0, 1).float().div_(255)


def single_threaded_torch() -> Callable[[], None]:
    """torch single-threaded in the training process, as it is in DataLoader workers; the undo
    restores the thread count. With its intra-op threads, the collate (torch.stack) and
    to-tensor of num_workers=0 spin-wait on a loaded 2-core host until the baseline swings
    tenfold between runs: oversubscription, another problem than the one measured here."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    return lambda: torch.set_num_threads(threads)


def slow_worker_start(worker_id):
    time.sleep(0.25)  # opening a dataset file, connecting to storage...


def gpu_step(fixed_s: float, per_sample_s: float) -> Callable[[int], float]:
    """A GPU step: launch overhead that does not grow with the batch, plus per-sample work."""
    return lambda samples: fixed_s + per_sample_s * samples


@dataclass
class LoaderSpec:
    dataset: Callable[[], Dataset]
    kwargs: dict                                  # the DataLoader arguments of the scenario
    compute_s: float | Callable[[int], float]     # per step, or per step of n samples
    fixed: Callable[[], Dataset] | None = None    # the dataset once non-DataLoader advice is taken
    fixed_kwargs: dict | None = None              # ... and its DataLoader arguments, if they change
    batch_sampler: Callable[[Dataset], object] | None = None
    plain: bool = False                           # batches from a generator, not a DataLoader
    resharded: Callable[[int], Dataset] | None = None  # the same data in n shards (idle_workers' fix)
    compute_on_cpu: bool = False                  # the step is CPU work on the training thread, not a sleep
    loader_class: type | None = None              # a DataLoader subclass (ThreadLoader), else DataLoader
    rebuilt: bool = False                         # a new loader object every epoch (the same call site and dataset)


@dataclass
class Scenario:
    name: str
    rule: str                      # the engine rule (rules.RULES) this scenario exercises
    description: str
    loaders: dict[str, LoaderSpec]
    epochs: int
    expect_verdict: str
    expect_factor: str
    expect_top: tuple | None       # (loader, parameter, low, high) or (loader, None, "advice"); None: healthy
    expect_protective: tuple | None = None  # (loader, parameter, low, high): protective advice that must be there
    simulated: str | None = None   # what the scenario simulates (GPU, /dev/shm limit), if anything
    expect_finding: tuple | None = None  # (loader, kind): a finding that must be there ("stall": a named hang)
    env: Callable[[], dict] = field(default=lambda: {})
    prepare: Callable[[], Callable | None] | None = None  # set-up before the runs; returns its undo
    # DataLoader changes the advice did not pick, predicted by the same model and measured too:
    # (loader, {argument: value}).
    what_ifs: tuple = ()
    hog_cores: float = 0.0         # other processes keep this many cores busy throughout (a CPU hog)


def _shm_limit_env(extra_bytes: int) -> Callable[[], dict]:
    """A /dev/shm of (what is used now + extra) bytes, through the documented setting."""
    return lambda: {"STARVEWATCH_SHM_LIMIT_BYTES": str(shutil.disk_usage("/dev/shm").used + extra_bytes)}


SCENARIOS = [
    Scenario("workers0_slow_getitem", "more_workers", "num_workers=0 with a slow __getitem__ (4 ms reads)",
             {"train": LoaderSpec(lambda: Items(768, sleep_s=0.004), {"batch_size": 8, "num_workers": 0}, 0.016)},
             1, "high", "input_bound_io", ("train", "num_workers", 2, 4)),
    Scenario("latency_too_few_workers", "more_workers", "latency-bound reads (4 ms) with one worker",
             {"train": LoaderSpec(lambda: Items(512, sleep_s=0.004),
                                  {"batch_size": 8, "num_workers": 1, "persistent_workers": True}, 0.016)},
             1, "high", "input_bound_io", ("train", "num_workers", 2, 4)),
    Scenario("cpu_bound_workers0_capped", "more_workers", "CPU-bound items (2 ms of CPU each), num_workers=0",
             {"train": LoaderSpec(lambda: Items(1024, spin_s=0.002), {"batch_size": 8, "num_workers": 0}, 0.008)},
             1, "high", "input_bound_cpu", ("train", "num_workers", 2, 2)),
    Scenario("cpu_transform_workers_eq_cores", "lighter_transforms",
             "a CPU-heavy transform (16 ms a batch) with workers = cores: more workers would not help",
             {"train": LoaderSpec(lambda: Items(512, spin_s=0.002),
                                  {"batch_size": 8, "num_workers": 2, "persistent_workers": True}, 0.004,
                                  fixed=lambda: Items(512))},
             1, "high", "input_bound_cpu", ("train", None, "gpu_transforms")),
    Scenario("cpu_oversubscribed", "cpu_oversubscribed",
             "6 CPU-bound workers on 2 cores: lighter transforms, and fewer workers as protection",
             {"train": LoaderSpec(lambda: Items(1536, spin_s=0.002),
                                  {"batch_size": 8, "num_workers": 6, "persistent_workers": True}, 0.004,
                                  fixed=lambda: Items(1536))},
             1, "high", "input_bound_cpu", ("train", None, "gpu_transforms"),
             expect_protective=("train", "num_workers", 2, 2)),
    Scenario("main_process_rebuild", "main_process_share",
             "2 workers keep up, but each batch costs the training process 16 ms of CPU to rebuild",
             {"train": LoaderSpec(lambda: Items(512, sleep_s=0.001),
                                  {"batch_size": 8, "num_workers": 2, "persistent_workers": True,
                                   "collate_fn": RebuildOnArrival(0.016)}, 0.01,
                                  fixed=lambda: Items(512, sleep_s=0.001), fixed_kwargs={"collate_fn": None})},
             1, "high", "input_bound_main", ("train", None, "lighter_batches")),
    Scenario("persistent_off_slow_startup", "persistent_workers",
             "persistent_workers=False, short epochs, slow worker start-up",
             {"train": LoaderSpec(lambda: Items(64, sleep_s=0.0005),
                                  {"batch_size": 4, "num_workers": 2, "worker_init_fn": slow_worker_start}, 0.005)},
             6, "high", "epoch_startup", ("train", "persistent_workers", True, True)),
    Scenario("bursty_dataset", "deeper_prefetch", "every 128th item is 120 ms slow; workers keep up on average",
             {"train": LoaderSpec(lambda: Items(1024, sleep_s=0.0005, slow_every=128, slow_s=0.12),
                                  {"batch_size": 4, "num_workers": 2, "prefetch_factor": 2,
                                   "persistent_workers": True}, 0.02)},
             1, "moderate", "input_bound_io", ("train", "prefetch_factor", 4, 16)),
    Scenario("healthy_compute_bound", "(none)", "cheap in-memory data, 20 ms steps",
             {"train": LoaderSpec(lambda: Items(128), {"batch_size": 4, "num_workers": 0}, 0.04)},
             1, "not", "compute_bound", None),
    Scenario("slow_validation", "more_workers", "a slow validation loader (num_workers=0) beside a healthy one",
             {"train": LoaderSpec(lambda: Items(128), {"batch_size": 4, "num_workers": 0}, 0.008),
              "val": LoaderSpec(lambda: Items(192, sleep_s=0.003), {"batch_size": 8, "num_workers": 0}, 0.02)},
             2, "high", "input_bound_io", ("val", "num_workers", 2, 3)),
    Scenario("shm_pressure", "memory_budget", "1 MiB batches, prefetch 8: more than a 12 MiB /dev/shm holds",
             {"train": LoaderSpec(lambda: Items(64, sleep_s=0.0002, size=256 * 1024),
                                  {"batch_size": 1, "num_workers": 2, "prefetch_factor": 8,
                                   "persistent_workers": True}, 0.08)},
             1, "not", "compute_bound", None, expect_protective=("train", "prefetch_factor", 2, 6),
             simulated="/dev/shm limit (STARVEWATCH_SHM_LIMIT_BYTES)", env=_shm_limit_env(12 * 2**20)),
    Scenario("faster_storage", "faster_storage",
             "random 1 MiB reads past the page cache (O_DIRECT) from a 400 MB/s disk, 3 workers",
             {"train": LoaderSpec(lambda: DiskReads(768, chunks=2), {"batch_size": 4, "num_workers": 3,
                                                          "persistent_workers": True}, 0.008,
                                  fixed=lambda: DiskReads(768, chunks=2, in_memory=True))},
             1, "high", "input_bound_io", ("train", None, "faster_storage"), prepare=slow_disk,
             simulated="a 400 MB/s disk (the real one throttled: cgroup blkio)"),
    Scenario("plain_iterable", "not_a_dataloader", "batches made by a generator on the training thread",
             {"train": LoaderSpec(lambda: Items(384, sleep_s=0.004), {"batch_size": 8}, 0.016, plain=True)},
             1, "high", "input_bound_io", ("train", None, "DataLoader(num_workers=")),
    Scenario("batch_size_none", "more_workers", "the dataset yields whole batches (batch_size=None), 24 ms each",
             {"train": LoaderSpec(lambda: Items(48, sleep_s=0.024, batch=8),
                                  {"batch_size": None, "num_workers": 0}, 0.016)},
             2, "high", "input_bound_io", ("train", "num_workers", 2, 4)),
    Scenario("custom_batch_sampler", "more_workers", "a custom batch_sampler, num_workers=0, 4 ms reads",
             {"train": LoaderSpec(lambda: Items(384, sleep_s=0.004), {"num_workers": 0}, 0.016,
                                  batch_sampler=Chunks)},
             2, "high", "input_bound_io", ("train", "num_workers", 2, 4)),
    Scenario("gpu_underused_host_bound", "larger_batches",
             "an NVML stand-in reports 37% GPU use; steps are 63% launch overhead",
             {"train": LoaderSpec(lambda: Items(512), {"batch_size": 8, "num_workers": 1, "persistent_workers": True},
                                  gpu_step(0.0378, 0.0222 / 8))},
             1, "not", "host_bound", ("train", "batch_size", 16, 16),
             simulated="GPU (NVML stand-in, 37% busy)", env=lambda: {"STARVEWATCH_TEST_FAKE_NVML": "self"}),
    Scenario("starved_on_gpu_host", "pin_memory", "num_workers=0, 4 ms reads, on a (stand-in) GPU host",
             {"train": LoaderSpec(lambda: Items(512, sleep_s=0.004), {"batch_size": 8, "num_workers": 0}, 0.016)},
             1, "high", "input_bound_io", ("train", "num_workers", 2, 4),
             expect_protective=("train", "pin_memory", True, True),
             simulated="GPU (NVML stand-in)", env=lambda: {"STARVEWATCH_TEST_FAKE_NVML": "self"}),
    # Findings no step timing shows (issue 16): each must be named, with its evidence.
    # A one-off hang is a burst: a deeper queue absorbs part of it (the stall finding is the point).
    Scenario("hung_worker", "stall", "one item blocks for 2 s in a worker: the stall names it with its stack",
             {"train": LoaderSpec(lambda: HangsOnce(800, hang_at=404, hang_s=2.0, sleep_s=0.0005),
                                  {"batch_size": 8, "num_workers": 2, "persistent_workers": True}, 0.03)},
             1, "high", "input_bound_io", ("train", "prefetch_factor", 4, 16), expect_finding=("train", "stall"),
             env=lambda: {"STARVEWATCH_STALL_MIN_S": "0.5"}),
    Scenario("worker_memory_growth", "worker_memory_growth",
             "workers read a 600k-item Python list: copy-on-read after fork grows them per sample",
             {"train": LoaderSpec(lambda: PythonRows(160, sleep_s=0.01),
                                  {"batch_size": 4, "num_workers": 2, "persistent_workers": True,
                                   "multiprocessing_context": "fork"}, 0.08)},
             3, "not", "compute_bound", None, expect_finding=("train", "worker_memory_growth"),
             env=lambda: {"STARVEWATCH_WORKER_MEMORY_INTERVAL_S": "0.3"}),
    Scenario("duplicated_shards", "duplicated_shards", "an IterableDataset not sharded by worker, 2 workers",
             {"train": LoaderSpec(lambda: NotSharded(384), {"batch_size": 8, "num_workers": 2}, 0.06)},
             1, "not", "compute_bound", None, expect_finding=("train", "duplicated_shards")),
    Scenario("idle_workers_torch", "idle_workers",
             "a pure-torch IterableDataset of 1 shard (files[worker::workers]) for 2 workers, 4 ms reads",
             {"train": LoaderSpec(lambda: FileShards(1, 384, sleep_s=0.004), {"batch_size": 8, "num_workers": 2},
                                  0.008)},
             # The finding says what to do (reshard, or fewer workers); no advice adds workers.
             1, "high", "input_bound_io", None, expect_finding=("train", "idle_workers")),
    # The shard count read from webdataset's URL list: the finding predicts resharding into
    # num_workers shards, which the harness measures (the same samples in 4 shards).
    Scenario("idle_workers_webdataset", "idle_workers",
             "webdataset, 1 tar shard for 4 workers (empty_check=False), 4 ms reads: 3 workers get no shard",
             {"train": LoaderSpec(lambda: tar_dataset(1, 768, 0.004), {"batch_size": 8, "num_workers": 4}, 0.008,
                                  resharded=lambda n: tar_dataset(n, 768, 0.004))},
             1, "high", "input_bound_io", None, expect_finding=("train", "idle_workers")),
    Scenario("idle_workers_hf_datasets", "idle_workers",
             "Hugging Face datasets, to_iterable_dataset() (1 shard) for 2 workers, 4 ms reads: datasets stops one",
             {"train": LoaderSpec(lambda: hf_dataset(1, 768, 0.004),
                                  {"batch_size": 8, "num_workers": 2, "collate_fn": stack_x}, 0.008,
                                  resharded=lambda n: hf_dataset(n, 768, 0.004))},
             1, "high", "input_bound_io", None, expect_finding=("train", "idle_workers")),
    # Issue 38: one worker 10x slower on its shard. The workers keep up on average (more
    # workers are not the answer), but in order the slow one paces every round; in_order=False
    # lets the others' ready batches through. The prediction rests on the measured per-worker
    # batch times; in order=True and False are both measured.
    Scenario("skewed_shard_in_order", "out_of_order",
             "3 workers, one 10x slower on its shard (2 ms vs 20 ms an item), shuffled, 12 ms steps",
             {"train": LoaderSpec(lambda: SkewedShard(720, sleep_s=0.002),
                                  {"batch_size": 4, "num_workers": 3, "shuffle": True, "persistent_workers": True},
                                  0.012)},
             1, "high", "input_bound_io", ("train", "in_order", False, False),
             expect_finding=("train", "head_of_line")),
    # Issue 25 item 5: on few cores, CPU-bound workers share them with each other, with the
    # training process's own CPU work and with the host's other processes.
    Scenario("pillow_jpeg_workers0", "more_workers",
             "a Pillow JPEG pipeline (open, crop, flip, resize, to tensor; ~1 ms an image), num_workers=0, "
             "4 ms of CPU per step; 1, 2 and 4 workers measured whatever the advice",
             {"train": LoaderSpec(Photos, {"batch_size": 16, "num_workers": 0, "shuffle": True}, 0.004,
                                  compute_on_cpu=True)},
             2, "high", "input_bound_cpu", ("train", "num_workers", 2, 2),
             what_ifs=(("train", {"num_workers": 1}), ("train", {"num_workers": 2}), ("train", {"num_workers": 4})),
             prepare=single_threaded_torch),
    # Issue 35: the patterns people write, each measured on the whole loop.
    Scenario("thread_loader_cpu", "more_workers",
             "a thread loader (MONAI's ThreadDataLoader in essence), num_workers=0: 24 ms of CPU a batch on "
             "its thread, 12 ms steps",
             {"train": LoaderSpec(lambda: Items(480, spin_s=0.003), {"batch_size": 8, "num_workers": 0}, 0.012,
                                  loader_class=ThreadLoader)},
             2, "high", "input_bound_cpu", ("train", "num_workers", 1, 2), prepare=single_threaded_torch),
    Scenario("rebuilt_every_epoch", "build_once",
             "a DataLoader built anew every epoch (2 workers, 0.25 s worker start-up), 16 batches an epoch",
             {"train": LoaderSpec(lambda: Items(64, sleep_s=0.0005),
                                  {"batch_size": 4, "num_workers": 2, "worker_init_fn": slow_worker_start}, 0.005,
                                  rebuilt=True)},
             6, "high", "epoch_startup", ("train", None, "build_once")),
    Scenario("recurring_short_validation", "more_workers",
             "a validation loader of 10 batches (4 ms reads an item, num_workers=0) run after each of 6 epochs",
             {"train": LoaderSpec(lambda: Items(128), {"batch_size": 4, "num_workers": 0}, 0.008),
              "val": LoaderSpec(lambda: Items(40, sleep_s=0.004), {"batch_size": 4, "num_workers": 0}, 0.01)},
             6, "high", "input_bound_io", ("val", "num_workers", 1, 4)),
    Scenario("short_epoch_few_cores", "more_workers",
             "one epoch of 75 batches, 3 workers, 48 ms reads a batch against 8 ms steps, on 2 cores",
             {"train": LoaderSpec(lambda: Items(600, sleep_s=0.006), {"batch_size": 8, "num_workers": 3}, 0.008)},
             1, "high", "input_bound_io", ("train", "num_workers", 4, 7)),
    Scenario("latency_beside_cpu_hog", "more_workers",
             "latency-bound reads (4 ms an item), 1 worker, beside a CPU hog of 2 cores (host >= 90%)",
             {"train": LoaderSpec(lambda: Items(512, sleep_s=0.004),
                                  {"batch_size": 8, "num_workers": 1, "persistent_workers": True}, 0.016)},
             1, "high", "input_bound_io", ("train", "num_workers", 2, 8), hog_cores=2.0),
    Scenario("pillow_beside_cpu_hog", "more_workers",
             "the Pillow pipeline (num_workers=0) with a sleeping (GPU-like) step, beside a CPU hog of 1.6 cores",
             {"train": LoaderSpec(Photos, {"batch_size": 16, "num_workers": 0, "shuffle": True}, 0.02)},
             2, "high", "input_bound_cpu", ("train", "num_workers", 1, 2), hog_cores=1.6,
             what_ifs=(("train", {"num_workers": 2}),), prepare=single_threaded_torch),
]

# Changes a user would try anyway: where the advice is "no change", none of them may measure
# >= 1.2x (issue 35 item 7).
USUAL_CHANGES = ({"num_workers": 2, "persistent_workers": True}, {"num_workers": 4, "persistent_workers": True})
