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
import sys
import tempfile
import weakref
from pathlib import Path
from time import perf_counter_ns, thread_time_ns, time_ns

from ..logonce import RateLimitedLog
from .. import worker_batches
from ..private_files import open_private

_failures = RateLimitedLog(logging.getLogger("starvewatch.hooks"), interval_s=3600)

FIELDS = ("pid", "batches", "fetch_ns", "fetch_cpu_ns", "last_fetch_ns", "max_fetch_ns",
          "last_end_ns", "samples",
          # A StatefulDataLoader worker's state snapshots (snapshots.py): how many, their
          # cumulative time in the worker, the latest sampled unpickling time and size.
          "snapshots", "snapshot_ns", "snapshot_load_ns", "snapshot_bytes")
ROW = struct.Struct("<12q")
MAX_WORKERS = 512
# After the rows, one "current fetch" area per worker, for naming what a hung worker holds:
# when its fetch began (0: not fetching), its stack signal (stacks.py; 0: none), how many
# dataset indices follow (-1: not index-based), the bytes of its last sampled batch (what
# travels through /dev/shm), and the first MAX_INDICES indices.
MAX_INDICES = 64
CURRENT = struct.Struct(f"<4q{MAX_INDICES}q")
INDICES = struct.Struct(f"<{MAX_INDICES}q")
BATCH_BYTES_EVERY = 64  # batches: the first one and every 64th are measured
# Then, per worker of an IterableDataset, a hash of each of its first HASHED_BATCHES batches
# (hashed in the worker): workers that yield the same sequence read the same shard.
HASHED_BATCHES = 64
HASHES = struct.Struct(f"<{HASHED_BATCHES}q")
# Last, per worker, a ring of per-batch records (worker_batches.py): when the worker waited on
# its index queue, fetched, collated and handed the batch over, read by delivery to say where
# each of the loop's waits went (hooks/delivery/attribution.py).


def rings_base(num_workers: int) -> int:
    return (ROW.size + CURRENT.size + HASHES.size) * min(num_workers, MAX_WORKERS)


def _board_dir() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


class WorkerBoard:
    """The training process's side: creates the shared file and reads the rows."""

    def __init__(self, num_workers: int, stack_dir: str | None = None) -> None:
        self.num_workers = min(num_workers, MAX_WORKERS)
        self.stack_dir = stack_dir  # where the workers' faulthandler files go
        self.path = _board_dir() / f"starvewatch-{os.getpid()}-{secrets.token_hex(4)}.workers"
        # Owner-only and made anew (O_EXCL, no symlink followed): the board says which dataset
        # indices each worker loads, and /dev/shm is shared by every user of the machine.
        fd = open_private(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with os.fdopen(fd, "wb") as f:
            f.write(b"\0" * (rings_base(self.num_workers) + worker_batches.RING_BYTES * self.num_workers))
        self._file = open(self.path, "rb")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        self._finalizer = weakref.finalize(self, _cleanup, self._map, self._file, self.path)
        from .snapshots import CheckpointCounter
        self.checkpoints = CheckpointCounter()  # a StatefulDataLoader's state_dict() calls

    def read(self) -> list[dict]:
        return [dict(zip(FIELDS, ROW.unpack_from(self._map, i * ROW.size))) for i in range(self.num_workers)]

    def current(self, worker_id: int) -> dict | None:
        """What worker `worker_id` is fetching now (read at a stall, never per batch)."""
        if not 0 <= worker_id < self.num_workers:
            return None
        started_ns, signum, count, batch_bytes, *indices = CURRENT.unpack_from(
            self._map, ROW.size * self.num_workers + worker_id * CURRENT.size)
        return {"fetch_started_ns": started_ns or None, "stack_signal": signum,
                "batch_bytes": batch_bytes or None,
                "indices": None if count < 0 else indices[:min(count, MAX_INDICES)],
                "indices_total": None if count < 0 else count}

    def hashes(self) -> list[list[int]]:
        """Per worker: the content hashes of its first batches, in order (0: not hashed)."""
        base = (ROW.size + CURRENT.size) * self.num_workers
        return [list(HASHES.unpack_from(self._map, base + w * HASHES.size)) for w in range(self.num_workers)]

    def describe(self) -> list:
        """[path, workers, where the rings begin]: what delivery opens the rings by."""
        return [str(self.path), self.num_workers, rings_base(self.num_workers)]

    def stack_path(self, worker_id: int) -> str | None:
        return stack_file(self.stack_dir, worker_id) if self.stack_dir else None

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

    def __init__(self, path: str, num_workers: int, user_fn=None, stack_dir: str | None = None) -> None:
        self.path = path
        self.num_workers = num_workers
        self.user_fn = user_fn
        self.stack_dir = stack_dir

    def __call__(self, worker_id: int) -> None:
        try:
            # torch calls worker_init_fn from its worker loop, whose queues the batch records
            # are timed on (_queues); any other caller gets the rest of the telemetry.
            _install(self.path, worker_id, self.num_workers, getattr(self, "stack_dir", None),
                     sys._getframe(1))
        except Exception as exc:  # telemetry is optional; the worker's real work is not
            _failures.error("install", "starvewatch: DataLoader worker %d runs without per-worker telemetry: %s: %s",
                            worker_id, type(exc).__name__, exc)
        if self.user_fn is not None:
            self.user_fn(worker_id)


_ROW_VIEW = None


def _install(path: str, worker_id: int, num_workers: int, stack_dir: str | None = None,
             caller=None) -> None:
    global _ROW_VIEW, _CURRENT_AT, _HASHES_AT, _RING_AT
    if worker_id >= num_workers or worker_id >= MAX_WORKERS:
        return
    f = open(path, "r+b")
    mapping = mmap.mmap(f.fileno(), 0)
    offset = worker_id * ROW.size
    row = list(ROW.unpack_from(mapping, offset))  # a respawned worker goes on counting
    row[0] = os.getpid()
    _CURRENT_AT = ROW.size * min(num_workers, MAX_WORKERS) + worker_id * CURRENT.size
    _HASHES_AT = (ROW.size + CURRENT.size) * min(num_workers, MAX_WORKERS) + worker_id * HASHES.size
    _RING_AT = worker_batches.ring_offset(rings_base(num_workers), worker_id)
    signum = 0
    if stack_dir:
        from .stacks import register
        signum = register(stack_file(stack_dir, worker_id))
    CURRENT.pack_into(mapping, _CURRENT_AT, 0, signum, -1, 0, *_NO_INDICES)
    ROW.pack_into(mapping, offset, *row)  # the pid last: a reader sees the signal with it
    _ROW_VIEW = (mapping, offset, row, f)

    from torch.utils.data._utils import fetch as fetch_module

    for cls in (fetch_module._MapDatasetFetcher, fetch_module._IterableDatasetFetcher):
        original = cls.fetch
        if getattr(original, "_starvewatch", False):
            continue

        def fetch(self, possibly_batched_index, _original=original):
            t0, c0 = perf_counter_ns(), thread_time_ns()
            _BATCH[2] = t0
            _BATCH[3] = _BATCH[4] = 0
            if "collate_fn" in self.__dict__ and not getattr(self.collate_fn, "_starvewatch", False):
                self.collate_fn = _TimedCollate(self.collate_fn)  # once per fetcher
            _fetching(t0, possibly_batched_index if self.auto_collation else (possibly_batched_index,))
            data = _original(self, possibly_batched_index)
            position = _ROW_VIEW[2][1]
            if not position % BATCH_BYTES_EVERY:
                _batch_bytes(data)
            if position < HASHED_BATCHES and hasattr(self, "dataset_iter"):  # IterableDataset
                _hash_batch(data, position)
            _record(perf_counter_ns() - t0, thread_time_ns() - c0,
                    _count(possibly_batched_index) if self.auto_collation else 1)
            return data

        fetch._starvewatch = True
        cls.fetch = fetch

    from .snapshots import time_worker_snapshots
    time_worker_snapshots(_record_snapshot)
    _time_queues(caller, mapping)


# The batch in progress in this worker: [wait_start_ns, got_ns, fetch_start_ns,
# collate_start_ns, collate_end_ns, flags]. One worker loop per process, one thread.
_BATCH = [0, 0, 0, 0, 0, worker_batches.FIRST]
_RING_AT = 0


class _TimedCollate:
    """The fetcher's collate_fn, timed: its call is the "collate" part of a batch."""

    _starvewatch = True

    def __init__(self, fn) -> None:
        self.fn = fn

    def __call__(self, data):
        _BATCH[3] = perf_counter_ns()
        try:
            return self.fn(data)
        finally:
            _BATCH[4] = perf_counter_ns()


# What a worker hands over instead of a batch (an exhausted IterableDataset, an exception).
_NOT_BATCHES = frozenset({"_IterableDatasetStopIteration", "ExceptionWrapper"})


def _time_queues(frame, mapping) -> None:
    """Time the worker loop's index queue (when a batch's indices arrived, and since when the
    worker waited for them) and its result queue (when the batch was handed over, under which
    number, and when its bytes went into the queue's pipe): the instances' own get/put and the
    result queue's feeder, so nothing else in the process changes."""
    index_queue = frame.f_locals.get("index_queue") if frame is not None else None
    data_queue = frame.f_locals.get("data_queue") if frame is not None else None
    if not (hasattr(index_queue, "get") and hasattr(data_queue, "put")):
        return
    _BATCH[0] = perf_counter_ns()  # started: the first batch's wait for indices begins
    _BATCH[5] = worker_batches.FIRST
    get, put = index_queue.get, data_queue.put
    # The records put and not yet written into the pipe, in the feeder's order (None for what
    # is not a batch); None when the feeder cannot be timed: then put writes the record.
    pending = _time_sends(data_queue, mapping)

    def timed_get(*args, **kwargs):
        r = get(*args, **kwargs)  # queue.Empty every few seconds: the wait goes on
        _BATCH[1] = perf_counter_ns()
        return r

    def timed_put(obj, *args, **kwargs):
        batch = _BATCH
        idx = obj[0] if type(obj) is tuple and len(obj) == 2 else None
        record = None
        if type(idx) is int and batch[2] and type(obj[1]).__name__ not in _NOT_BATCHES:
            record = (idx, batch[0], batch[1], batch[2], batch[3], batch[4], perf_counter_ns(), batch[5], 0)
            batch[2] = batch[3] = batch[4] = batch[5] = 0
            if pending is None:  # the record before the put: there before the loop has the batch
                _write_record(mapping, record)
        try:
            if pending is None:
                return put(obj, *args, **kwargs)
            pending.append(record)
            try:
                return put(obj, *args, **kwargs)
            except BaseException:  # not queued: the feeder will never send it
                pending.pop()
                raise
        finally:
            batch[0] = perf_counter_ns()

    index_queue.get = timed_get
    data_queue.put = timed_put


def _write_record(mapping, record: tuple) -> None:
    try:
        worker_batches.write(mapping, _RING_AT, record)
    except Exception:  # a record lost, never a batch
        pass


def _time_sends(data_queue, mapping):
    """Wrap a multiprocessing.Queue's send (what its feeder thread calls, under the queue's
    write lock, for each object in put order) to time each batch's write into the pipe and
    write its record then: the loop receives the batches in the order of these times, which
    in_order=False's attribution needs (worker_batches.py). Returns the deque of pending
    records, or None where the queue is not one whose feeder can be wrapped (not yet started:
    it binds the send when it starts, at the first put)."""
    from collections import deque

    send = getattr(data_queue, "_send_bytes", None)
    on_error = getattr(data_queue, "_on_queue_feeder_error", None)
    if not callable(send) or not callable(on_error) or getattr(data_queue, "_thread", None) is not None:
        return None
    pending: deque = deque()

    def timed_send(buf):
        # Under the lock and before the write: in the pipe's order, and the record is there
        # before the loop can have the batch (a failed write, at shutdown, leaves a record).
        record = pending.popleft() if pending else None
        if record is not None:
            _write_record(mapping, record[:8] + (perf_counter_ns(),))
        return send(buf)

    def timed_on_error(e, obj):  # the object did not pickle: never sent
        if pending:
            pending.popleft()
        return on_error(e, obj)

    data_queue._send_bytes = timed_send
    data_queue._on_queue_feeder_error = timed_on_error
    return pending


def stack_file(stack_dir: str, worker_id: int) -> str:
    # One file per worker slot: a worker of the next epoch appends to it (no file per pid).
    return os.path.join(stack_dir, f"worker-{worker_id}.stack")


_CURRENT_AT = 0
_HASHES_AT = 0


def _feed(hasher, obj, depth: int = 0) -> bool:
    """The batch's content into `hasher`; False for something it cannot read as data."""
    if hasattr(obj, "numpy") and hasattr(obj, "detach"):
        obj = obj.detach().cpu().numpy()
    if hasattr(obj, "tobytes") and hasattr(obj, "dtype"):
        hasher.update(str(obj.dtype).encode() + str(getattr(obj, "shape", "")).encode())
        hasher.update(obj.tobytes())
        return True
    if isinstance(obj, (bytes, str, int, float, bool)) or obj is None:
        hasher.update(repr(obj).encode())
        return True
    if depth < 4 and isinstance(obj, (list, tuple)):
        return all(_feed(hasher, x, depth + 1) for x in obj)
    if depth < 4 and isinstance(obj, dict):
        return all(_feed(hasher, k, depth + 1) and _feed(hasher, v, depth + 1) for k, v in obj.items())
    return False


def _hash_batch(data, position: int) -> None:
    import hashlib
    try:
        hasher = hashlib.blake2b(digest_size=8)
        if _feed(hasher, data):
            value = int.from_bytes(hasher.digest(), "little", signed=True) or 1
            struct.pack_into("<q", _ROW_VIEW[0], _HASHES_AT + 8 * position, value)
    except Exception:  # never a failed fetch for a hash
        pass
_NO_INDICES = (0,) * MAX_INDICES


def _count(indices) -> int:
    """Samples in a batch's indices; 0 when they have no length (a generator from a custom
    batch sampler): the sample count is then a measurement lost, never a failed fetch."""
    try:
        return len(indices)
    except TypeError:
        return 0


def _fetching(t0_ns: int, indices) -> None:
    """In the worker, per batch: which dataset indices it is loading, for a stall's report.
    Any index container a batch sampler yields (a list, a set, a range, a tensor...): what
    cannot be read as integers is recorded as "not index-based", never raised."""
    mapping = _ROW_VIEW[0]
    try:
        head = indices[:MAX_INDICES]
    except Exception:  # a set or another unsliceable container
        head = _first_indices(indices)
    if head is not None and all(type(i) is int for i in head):  # an IterableDataset's fetcher gets None per sample
        count = _count(indices)
        head = tuple(head) + _NO_INDICES[len(head):]
    else:
        count, head = -1, _NO_INDICES
    struct.pack_into("<q", mapping, _CURRENT_AT + 16, count)
    INDICES.pack_into(mapping, _CURRENT_AT + 32, *head)
    struct.pack_into("<q", mapping, _CURRENT_AT, t0_ns or 1)


def _first_indices(indices) -> tuple | None:
    """The first MAX_INDICES of a sized container that cannot be sliced (a set); None for
    anything else (iterating a generator here would take its items from the fetch)."""
    if not hasattr(indices, "__len__"):
        return None
    try:
        import itertools
        return tuple(itertools.islice(iter(indices), MAX_INDICES))
    except Exception:
        return None


def _nbytes(obj, depth: int = 0) -> int:
    """Bytes of the tensors and arrays in a batch (what torch moves through shared memory)."""
    nbytes = getattr(obj, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if hasattr(obj, "element_size") and hasattr(obj, "numel"):
        return obj.element_size() * obj.numel()
    if depth < 4 and isinstance(obj, (list, tuple)):
        return sum(_nbytes(x, depth + 1) for x in obj[:1000])
    if depth < 4 and isinstance(obj, dict):
        return sum(_nbytes(x, depth + 1) for x in list(obj.values())[:1000])
    return 0


def _batch_bytes(data) -> None:
    try:
        struct.pack_into("<q", _ROW_VIEW[0], _CURRENT_AT + 24, _nbytes(data))
    except Exception:  # an odd batch type: no measurement, never a failed fetch
        pass


def _record(fetch_ns: int, cpu_ns: int, samples: int) -> None:
    mapping, offset, row, _ = _ROW_VIEW
    struct.pack_into("<q", mapping, _CURRENT_AT, 0)  # not fetching any more
    row[1] += 1
    row[2] += fetch_ns
    row[3] += cpu_ns
    row[4] = fetch_ns
    if fetch_ns > row[5]:
        row[5] = fetch_ns
    row[6] = time_ns()
    row[7] += samples
    ROW.pack_into(mapping, offset, *row)


def _record_snapshot(snapshot_ns: int, load_ns: int, nbytes: int) -> None:
    mapping, offset, row, _ = _ROW_VIEW
    row[8] += 1
    row[9] += snapshot_ns
    row[10] = load_ns
    row[11] = nbytes
    ROW.pack_into(mapping, offset, *row)


def attach(loader, stack_dir: str | None = None) -> WorkerBoard | None:
    """Give a multi-process DataLoader its board; None for num_workers=0 or on any problem.
    `stack_dir`: the directory for the workers' stack files (created here)."""
    if getattr(loader, "num_workers", 0) <= 0:
        return None
    try:
        if stack_dir:
            try:
                os.makedirs(stack_dir, exist_ok=True)
            except OSError:
                stack_dir = None  # no stacks, the rest of the telemetry still
        board = WorkerBoard(loader.num_workers, stack_dir)
        user_fn = loader.worker_init_fn
        if isinstance(user_fn, WorkerInit):
            user_fn = user_fn.user_fn
        loader.worker_init_fn = WorkerInit(str(board.path), board.num_workers, user_fn, stack_dir)
        return board
    except OSError:
        return None
