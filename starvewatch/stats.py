"""Mergeable statistics shared by the training process and the collector.

Both sides feed the same records into the same structures, so `finish()` and the collector's
summary agree exactly (same bucket boundaries, same percentile rule), and a multi-million-step
run is summarised from a few hundred buckets instead of a scan of every row.
"""
from __future__ import annotations

import math
import sys
import threading
from bisect import bisect_left
from dataclasses import dataclass, field

_NUMPY = None  # numpy once imported; False when it is not installed
_numpy_import: threading.Thread | None = None


def _numpy():
    """numpy for the vectorized paths, once imported. Imported here first, it is imported on a
    thread and this answers None until then: its ~0.1 s of CPU at a sidecar's start held up
    the run's first batch (issue 41), whose values now go the C-level way meanwhile, into
    the same buckets."""
    global _numpy_import
    if _NUMPY is None and _numpy_import is None:
        if "numpy" in sys.modules:  # imported by the process already (the collector): at once
            _import_numpy()
        else:
            _numpy_import = threading.Thread(target=_import_numpy, name="starvewatch-numpy-import", daemon=True)
            _numpy_import.start()
    return _NUMPY or None


def _import_numpy() -> None:
    global _NUMPY
    try:
        import numpy
        _NUMPY = numpy
    except ImportError:  # pragma: no cover - numpy is optional
        _NUMPY = False

# Log-linear buckets: 32 per power of two (bucket width at most 1/32 of its value, so a
# quantile is within 1.6%). Computed with frexp, exact for integers below 2**53, so the
# training process and the collector put every value in the same bucket.
SUB_BUCKETS = 32
# Below this many values the C-level sort is as fast as numpy, and a process that only ever
# sees small batches (the sidecar of a slow loop) never pays numpy's import.
VECTORIZE_MIN = 4096


def bucket_of(value_ns: int) -> int:
    if value_ns <= 0:
        return -1
    m, e = math.frexp(value_ns)
    return e * SUB_BUCKETS + int((m - 0.5) * 2 * SUB_BUCKETS)


def bucket_value(index: int) -> float:
    """Representative value (geometric middle) of a bucket, in ns."""
    if index < 0:
        return 0.0
    e, sub = divmod(index, SUB_BUCKETS)
    lower = (0.5 + sub / (2 * SUB_BUCKETS)) * 2.0 ** e
    upper = (0.5 + (sub + 1) / (2 * SUB_BUCKETS)) * 2.0 ** e
    return math.sqrt(lower * upper)


def _bucket_start(index: int) -> int:
    """The smallest integer in bucket `index` (its values v have (v << 6) >> e == 32 + sub)."""
    e, sub = divmod(index, SUB_BUCKETS)
    return -(-((SUB_BUCKETS + sub) << e) // (2 * SUB_BUCKETS))  # ceil((32 + sub) * 2**e / 64)


def _bucket_counts(positive: list[int]) -> dict[int, int]:
    """bucket_of() for a list of positive ints, without a Python call per value: sort (C), then
    one bisect per bucket touched (a few dozen), so the training process's shipper spends
    about 0.1 us per value and never releases the GIL (numpy would)."""
    ordered = sorted(positive)
    out: dict[int, int] = {}
    i, n = 0, len(ordered)
    while i < n:
        index = bucket_of(ordered[i])
        j = bisect_left(ordered, _bucket_start(index + 1), i)
        out[index] = j - i
        i = j
    return out


class LogHistogram:
    """A sparse log-bucketed histogram of non-negative durations in ns (like DDSketch)."""

    __slots__ = ("counts", "count", "total", "maximum")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.count = 0
        self.total = 0
        self.maximum = 0

    def add(self, value_ns: int) -> None:
        index = bucket_of(value_ns)
        self.counts[index] = self.counts.get(index, 0) + 1
        self.count += 1
        self.total += value_ns
        if value_ns > self.maximum:
            self.maximum = value_ns

    def add_many(self, values, *, vectorized: bool = False) -> None:
        """Add a list of values. `vectorized` uses numpy (the collector: hundreds of thousands
        of records a second); the default uses C-level maps and never releases the GIL, which
        the training process needs (every GIL release inside a monitor thread costs the
        training thread a switch, see benchmarks/overhead.py)."""
        if not len(values):
            return
        np = _numpy() if vectorized and len(values) >= VECTORIZE_MIN else None
        table = self.counts
        if np is not None:
            arr = np.asarray(values, dtype=np.int64)
            positive = arr[arr > 0]
            m, e = np.frexp(positive.astype(np.float64))
            idx = e.astype(np.int64) * SUB_BUCKETS + ((m - 0.5) * (2 * SUB_BUCKETS)).astype(np.int64)
            keys, counts = np.unique(idx, return_counts=True)
            pairs = zip(keys.tolist(), counts.tolist())
            zeros = len(arr) - len(positive)
            total, top = int(arr.sum()), int(arr.max())
        else:
            zeros = 0
            if min(values) <= 0:
                positive = [v for v in values if v > 0]
                zeros = len(values) - len(positive)
            else:
                positive = values
            pairs = _bucket_counts(positive).items()
            total, top = sum(values), max(values)
        for k, n in pairs:
            table[k] = table.get(k, 0) + n
        if zeros:
            table[-1] = table.get(-1, 0) + zeros
        self.count += len(values)
        self.total += total
        if top > self.maximum:
            self.maximum = top

    def subtract(self, other: "LogHistogram") -> "LogHistogram":
        """A histogram of the values in self but not in other (other must be a subset)."""
        out = LogHistogram()
        for index, n in self.counts.items():
            left = n - other.counts.get(index, 0)
            if left > 0:
                out.counts[index] = left
        out.count = self.count - other.count
        out.total = self.total - other.total
        out.maximum = self.maximum  # an upper bound: the subset's maximum may be the same value
        return out

    def merge(self, other: "LogHistogram") -> None:
        for index, n in other.counts.items():
            self.counts[index] = self.counts.get(index, 0) + n
        self.count += other.count
        self.total += other.total
        self.maximum = max(self.maximum, other.maximum)

    def quantile(self, q: float) -> float | None:
        """Nearest-rank quantile (within 1%), in ns; None when empty."""
        if self.count == 0:
            return None
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for index in sorted(self.counts):
            seen += self.counts[index]
            if seen >= rank:
                return min(bucket_value(index), float(self.maximum))
        return float(self.maximum)

    def variance(self) -> float | None:
        """Variance of the values (ns^2), from the buckets' representative values around the
        exact mean: within a few percent, and the same on both sides of the wire."""
        if self.count < 2:
            return None
        mean = self.total / self.count
        spread = sum(n * (bucket_value(i) - mean) ** 2 for i, n in self.counts.items())
        return spread / (self.count - 1)

    def to_dict(self) -> dict:
        return {"counts": {str(k): v for k, v in self.counts.items()}, "count": self.count,
                "total": self.total, "max": self.maximum}

    @classmethod
    def from_dict(cls, data: dict) -> "LogHistogram":
        h = cls()
        h.counts = {int(k): int(v) for k, v in data.get("counts", {}).items()}
        h.count, h.total, h.maximum = int(data["count"]), int(data["total"]), int(data["max"])
        return h


@dataclass(slots=True)  # slots: the hot path updates these attributes on every batch
class LoaderTotals:
    """Exact running totals kept on the training thread (never approximate, even on drops)."""

    steps: int = 0
    epochs: int = 0
    wait_ns: int = 0
    compute_ns: int = 0
    other_ns: int = 0
    epoch_end_wait_ns: int = 0
    samples: int = 0
    samples_known: bool = True
    dropped_records: int = 0
    wait_probe_ns: int = 0        # sampled waits (a few a second) ...
    wait_probe_cpu_ns: int = 0    # ... and the training thread's CPU time during them
    wait_probe_process_cpu_ns: int = 0  # ... and the training process's (all its threads)
    # The training process's CPU time (all its threads) over the sampler intervals this
    # loader's loop ran through, and their wall time: its CPU share, read off the hot path.
    loop_process_cpu_ns: int = 0
    loop_wall_ns: int = 0
    # Several loaders on one thread (hooks/delivery/overlap.py): the other loaders' waits
    # inside this loader's steps (taken out of its compute and other), and the part of its
    # compute that another loader of the thread counts too (the run counts it once).
    other_loaders_wait_ns: int = 0
    shared_compute_ns: int = 0
    # Where the waits went (hooks/delivery/attribution.py, from the workers' per-batch records):
    # the steps whose batch was found and their wait, split by stage (WAIT_STAGES) as the
    # intersection of each wait with what the batch's worker was doing; the part of it while
    # a later batch was already ready (head-of-line blocking); per worker id, the wait owed to
    # it (handover excluded), its head-of-line part, and all its batches and their time.
    attributed_steps: int = 0
    attributed_wait_ns: int = 0
    wait_startup_ns: int = 0
    wait_idle_ns: int = 0
    wait_not_scheduled_ns: int = 0
    wait_fetch_ns: int = 0
    wait_collate_ns: int = 0
    wait_handover_ns: int = 0
    wait_unknown_ns: int = 0
    # Of wait_handover_ns, the part before the batch's bytes entered the result queue: its
    # worker's feeder thread pickling it (tensors into shared memory) and waiting for the
    # queue's write lock. The rest is the main process's (receiving, unpickling, the
    # pin-memory thread, reordering), which nothing times apart yet.
    wait_handover_send_ns: int = 0
    hol_wait_ns: int = 0
    worker_wait_ns: list = field(default_factory=list)
    worker_hol_ns: list = field(default_factory=list)
    worker_batches: list = field(default_factory=list)
    worker_batch_ns: list = field(default_factory=list)
    # New loader objects watched as this loader after its first (the same call site and
    # dataset, or the same name and settings: a DataLoader built anew every epoch).
    rebuilds: int = 0

    def to_dict(self) -> dict:
        return {name: (list(value) if isinstance(value := getattr(self, name), list) else value)
                for name in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: dict) -> "LoaderTotals":
        return cls(**{k: (list(data[k]) if isinstance(data[k], list) else data[k])
                      for k in cls.__dataclass_fields__ if k in data})

    def merge(self, other: "LoaderTotals") -> None:
        """Add `other` (another rank, another chunk) into these totals: every count adds up,
        every flag (a bool field: `samples_known`) holds only where it holds for both, every
        per-worker list adds up by worker id. Derived from the fields above, so a new field is
        merged without being listed here."""
        for name, spec in self.__dataclass_fields__.items():
            mine, theirs = getattr(self, name), getattr(other, name)
            if isinstance(mine, list):
                add_per_worker(mine, theirs)
            else:
                setattr(self, name, (mine and theirs) if isinstance(spec.default, bool) else mine + theirs)


# The stages a wait is split into (docs/what-it-measures.md defines each), in the order of a
# batch's life: the worker process starting, idle on its index queue, busy with its earlier
# batches, fetching the samples, collating, then the main process's hand-over.
WAIT_STAGES = ("startup", "idle", "not_scheduled", "fetch", "collate", "handover", "unknown")


def add_per_worker(into: list, values: list) -> None:
    """Per-worker-id sums: `values` added into `into` (grown to the longer of the two)."""
    if len(into) < len(values):
        into.extend([0] * (len(values) - len(into)))
    for i, v in enumerate(values):
        into[i] += v


@dataclass
class RecordStats:
    """What is built from the step records (percentiles, epoch start-up, GPU idle)."""

    wait: LogHistogram = field(default_factory=LogHistogram)
    compute: LogHistogram = field(default_factory=LogHistogram)
    first_wait: LogHistogram = field(default_factory=LogHistogram)  # step 0 of each epoch
    gpu_idle_ns: int = 0
    gpu_measured_steps: int = 0
    gpu_loop_ns: int = 0  # wait + compute of the steps that have a GPU measurement

    def add_columns(self, steps, waits, computes, gpu_idles, *, vectorized: bool = False) -> None:
        self.wait.add_many(waits, vectorized=vectorized)
        self.compute.add_many(computes, vectorized=vectorized)
        if 0 in steps:
            self.first_wait.add_many([w for s, w in zip(steps, waits) if s == 0])
        if gpu_idles.count(None) != len(gpu_idles):
            for w, c, g in zip(waits, computes, gpu_idles):
                if g is not None:
                    self.gpu_idle_ns += g
                    self.gpu_measured_steps += 1
                    self.gpu_loop_ns += w + c

    def steady_wait(self) -> LogHistogram:
        """Waits of every step but the first of each epoch."""
        return self.wait.subtract(self.first_wait)

    def merge(self, other: "RecordStats") -> None:
        for name in ("wait", "compute", "first_wait"):
            getattr(self, name).merge(getattr(other, name))
        self.gpu_idle_ns += other.gpu_idle_ns
        self.gpu_measured_steps += other.gpu_measured_steps
        self.gpu_loop_ns += other.gpu_loop_ns

    def to_dict(self) -> dict:
        return {"wait": self.wait.to_dict(), "compute": self.compute.to_dict(),
                "first_wait": self.first_wait.to_dict(), "gpu_idle_ns": self.gpu_idle_ns,
                "gpu_measured_steps": self.gpu_measured_steps, "gpu_loop_ns": self.gpu_loop_ns}

    @classmethod
    def from_dict(cls, data: dict) -> "RecordStats":
        return cls(**{k: LogHistogram.from_dict(data[k]) for k in ("wait", "compute", "first_wait")},
                   gpu_idle_ns=data["gpu_idle_ns"], gpu_measured_steps=data["gpu_measured_steps"],
                   gpu_loop_ns=data["gpu_loop_ns"])
