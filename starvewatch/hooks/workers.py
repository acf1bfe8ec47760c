"""Per-worker DataLoader telemetry, which step timings alone cannot give.

Each worker process times its own batch fetches (items + collate) and writes cumulative
counters into its row of a small shared file (mmap, one writer per row, no locks). The sampler
thread in the training process reads the rows. What the loop receives does not change: the
worker's fetcher is wrapped inside the worker only, and everything handed to the workers
(a path and the user's own worker_init_fn) pickles under spawn and forkserver.
"""
from __future__ import annotations

import logging
import mmap
import os
import secrets
import struct
import tempfile
import weakref
from pathlib import Path
from time import perf_counter_ns, thread_time_ns, time_ns

from ..logonce import RateLimitedLog

_failures = RateLimitedLog(logging.getLogger("starvewatch.hooks"), interval_s=3600)

FIELDS = ("pid", "batches", "fetch_ns", "fetch_cpu_ns", "last_fetch_ns", "max_fetch_ns",
          "last_end_ns", "samples")
ROW = struct.Struct("<8q")
MAX_WORKERS = 512


def _board_dir() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


class WorkerBoard:
    """The training process's side: creates the shared file and reads the rows."""

    def __init__(self, num_workers: int) -> None:
        self.num_workers = min(num_workers, MAX_WORKERS)
        self.path = _board_dir() / f"starvewatch-{os.getpid()}-{secrets.token_hex(4)}.workers"
        with open(self.path, "wb") as f:
            f.write(b"\0" * ROW.size * self.num_workers)
        self._file = open(self.path, "rb")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        self._finalizer = weakref.finalize(self, _cleanup, self._map, self._file, self.path)

    def read(self) -> list[dict]:
        return [dict(zip(FIELDS, ROW.unpack_from(self._map, i * ROW.size))) for i in range(self.num_workers)]

    def close(self) -> None:
        self._finalizer()


def _cleanup(mapping, file, path) -> None:
    for action in (mapping.close, file.close, lambda: os.unlink(path)):
        try:
            action()
        except (OSError, ValueError, BufferError):
            pass


class WorkerInit:
    """Replaces a DataLoader's worker_init_fn: installs the timing, then calls the user's."""

    def __init__(self, path: str, num_workers: int, user_fn=None) -> None:
        self.path = path
        self.num_workers = num_workers
        self.user_fn = user_fn

    def __call__(self, worker_id: int) -> None:
        try:
            _install(self.path, worker_id, self.num_workers)
        except Exception as exc:  # telemetry is optional; the worker's real work is not
            _failures.error("install", "starvewatch: DataLoader worker %d runs without per-worker telemetry: %s: %s",
                            worker_id, type(exc).__name__, exc)
        if self.user_fn is not None:
            self.user_fn(worker_id)


_ROW_VIEW = None


def _install(path: str, worker_id: int, num_workers: int) -> None:
    global _ROW_VIEW
    if worker_id >= num_workers or worker_id >= MAX_WORKERS:
        return
    f = open(path, "r+b")
    mapping = mmap.mmap(f.fileno(), 0)
    offset = worker_id * ROW.size
    row = list(ROW.unpack_from(mapping, offset))  # a respawned worker goes on counting
    row[0] = os.getpid()
    ROW.pack_into(mapping, offset, *row)
    _ROW_VIEW = (mapping, offset, row, f)

    from torch.utils.data._utils import fetch as fetch_module

    for cls in (fetch_module._MapDatasetFetcher, fetch_module._IterableDatasetFetcher):
        original = cls.fetch
        if getattr(original, "_starvewatch", False):
            continue

        def fetch(self, possibly_batched_index, _original=original):
            t0, c0 = perf_counter_ns(), thread_time_ns()
            data = _original(self, possibly_batched_index)
            _record(perf_counter_ns() - t0, thread_time_ns() - c0,
                    len(possibly_batched_index) if self.auto_collation else 1)
            return data

        fetch._starvewatch = True
        cls.fetch = fetch


def _record(fetch_ns: int, cpu_ns: int, samples: int) -> None:
    mapping, offset, row, _ = _ROW_VIEW
    row[1] += 1
    row[2] += fetch_ns
    row[3] += cpu_ns
    row[4] = fetch_ns
    if fetch_ns > row[5]:
        row[5] = fetch_ns
    row[6] = time_ns()
    row[7] += samples
    ROW.pack_into(mapping, offset, *row)


def attach(loader) -> WorkerBoard | None:
    """Give a multi-process DataLoader its board; None for num_workers=0 or on any problem."""
    if getattr(loader, "num_workers", 0) <= 0:
        return None
    try:
        board = WorkerBoard(loader.num_workers)
        user_fn = loader.worker_init_fn
        if isinstance(user_fn, WorkerInit):
            user_fn = user_fn.user_fn
        loader.worker_init_fn = WorkerInit(str(board.path), board.num_workers, user_fn)
        return board
    except OSError:
        return None
