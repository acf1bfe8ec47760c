"""torchdata's StatefulDataLoader: what its worker-state snapshots cost, and how often the
loop checkpoints. Never on the training thread's per-batch path.

With `snapshot_every_n_steps=n`, every n-th batch a worker also builds its state (the dataset's
`state_dict()`), diffs it against the previous one, and the diff travels with the batch through
the workers' queue (pickled there, unpickled in the training process). At torchdata's default,
n=1, that is every batch. In the worker, both torchdata functions that do it are timed (one
CPU-clock read each, per snapshot: CPU time, so that a worker descheduled on a busy host does
not count the wait as snapshot work); every SAMPLE_EVERY-th snapshot is also pickled and unpickled
here to measure what the queue's trip costs: the worker's pickling is added to each snapshot's
time, the unpickling is the training process's share (it happens in its next()).

In the training process, the watched loader's `state_dict()` calls are counted with the step
each was taken at (`_num_yielded`): their spacing is the checkpoint interval the finding
proposes for `snapshot_every_n_steps`.
"""
from __future__ import annotations

import pickle
import statistics
import sys
from collections import deque
from time import thread_time_ns

SAMPLE_EVERY = 16  # snapshots: the first and every 16th also pickled and unpickled once
_INTERVALS_KEPT = 64

_started_ns = 0   # when the worker began building the snapshot in progress (0: none)
_record = None    # record(snapshot_ns, load_ns, nbytes) into the worker's row (workers.py)
_count = 0
_pickle_ns = 0    # the latest sampled pickling time of one snapshot
_load_ns = 0
_bytes = 0


def is_stateful_dataloader(cls: type) -> bool:
    return any((c.__module__ or "").startswith("torchdata.stateful_dataloader") for c in cls.__mro__)


def time_worker_snapshots(record) -> bool:
    """In a StatefulDataLoader worker: time its snapshots into `record`. False elsewhere (a
    torch DataLoader's worker has no torchdata worker loop)."""
    global _record
    worker = sys.modules.get("torchdata.stateful_dataloader.worker")
    if worker is None:
        return False
    _record = record
    make = worker._make_state_dict
    if getattr(make, "_starvewatch", False):
        return True
    from torchdata.stateful_dataloader.incremental_state import _IncrementalWorkerState
    delta = _IncrementalWorkerState.generate_delta

    def make_state_dict(*args, _original=make, **kwargs):
        global _started_ns
        _started_ns = thread_time_ns()
        return _original(*args, **kwargs)

    def generate_delta(self, new_state_dict, _original=delta):
        out = _original(self, new_state_dict)
        _snapshot_done(out)
        return out

    make_state_dict._starvewatch = generate_delta._starvewatch = True
    worker._make_state_dict = make_state_dict  # the worker loop reads the module's global
    _IncrementalWorkerState.generate_delta = generate_delta  # this worker process's copy only
    return True


def _snapshot_done(delta) -> None:
    global _started_ns, _count, _pickle_ns, _load_ns, _bytes
    started, _started_ns = _started_ns, 0
    if not started or _record is None:
        return
    built_ns = thread_time_ns() - started
    try:
        if not _count % SAMPLE_EVERY:
            t0 = thread_time_ns()
            blob = pickle.dumps(delta, protocol=pickle.HIGHEST_PROTOCOL)
            t1 = thread_time_ns()
            pickle.loads(blob)
            _pickle_ns, _load_ns, _bytes = t1 - t0, thread_time_ns() - t1, len(blob)
        _count += 1
        _record(built_ns + _pickle_ns, _load_ns, _bytes)
    except Exception:  # a state that does not pickle here: the snapshot is still counted
        _count += 1
        _record(built_ns, 0, 0)


class CheckpointCounter:
    """The watched loader's `state_dict()` calls and the steps between them."""

    def __init__(self) -> None:
        self.calls = 0
        self._last_step: int | None = None
        self._intervals: deque = deque(maxlen=_INTERVALS_KEPT)

    def note(self, step) -> None:
        self.calls += 1
        if not isinstance(step, int):
            return
        if self._last_step is not None and step > self._last_step:
            self._intervals.append(step - self._last_step)
        self._last_step = step  # lower: a new epoch began; the spacing starts again

    def interval_steps(self) -> int | None:
        """The median spacing of the calls in steps; None before two calls in one epoch."""
        return int(statistics.median(self._intervals)) if self._intervals else None


def count_checkpoints(watched_cls: type, counter: CheckpointCounter) -> None:
    """Counts `state_dict()` calls on a watched StatefulDataLoader (its own per-loader class):
    a checkpoint is not a batch, so the per-batch path is untouched."""
    base = getattr(watched_cls, "state_dict", None)
    if base is None or not is_stateful_dataloader(watched_cls):
        return

    def state_dict(self, *args, **kwargs):
        counter.note(getattr(getattr(self, "_iterator", None), "_num_yielded", None))
        return base(self, *args, **kwargs)

    state_dict.__doc__ = base.__doc__
    watched_cls.state_dict = state_dict
