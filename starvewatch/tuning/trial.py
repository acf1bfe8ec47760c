"""One trial: build the loader for a configuration, consume it with no training step, and
measure its throughput after a warm-up, its CPU use, one worker's memory and the batch size.

The loader is consumed on a thread so that the trial ends at its deadline even when a
`__getitem__` blocks (num_workers=0) or every worker is slow; the workers' own wait for a
batch is bounded through the iterator's timeout. After the trial no worker process is left:
they are shut down, then (past a short grace) killed, and checked gone.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field

from .config import FactoryError, LoaderConfig, build

MONITOR_TICK_S = 0.1
MEMORY_SAMPLE_S = 1.0  # a couple of workers' USS per second: smaps reads are not free
STABLE_SPREAD = 0.03
MIN_WINDOW_BATCHES = 3    # fewer batches than this after the warm-up give no figure
SEGMENTS, MIN_SEGMENT_BATCHES = 3, 20  # throughput: the best third of the window  # the window's two halves agree within 3%: the figure is stable


@dataclass
class TrialResult:
    config: LoaderConfig
    status: str = "measured"          # measured | cut_short | skipped | failed
    reason: str | None = None         # why skipped, failed or cut short
    batches_per_s: float | None = None       # the best third of the window (see _best_segment_rate)
    mean_batches_per_s: float | None = None  # the whole window
    samples_per_s: float | None = None
    window_batches: int = 0
    window_s: float = 0.0
    warmup_batches: int = 0
    startup_s: float | None = None    # iter() to the first batch, workers spawned
    restart_s: float | None = None    # a new epoch's iter() to its first batch (persistent workers)
    epoch_batches: int | None = None
    spread: float | None = None       # the window's two halves disagree by this share
    cpu_pct: float | None = None      # main process + workers, 100 = one core
    worker_uss_bytes: int | None = None  # one worker's private memory (the largest seen)
    batch_bytes: int | None = None
    samples_per_batch: int | None = None
    predicted_ram_bytes: int | None = None
    predicted_shm_bytes: int | None = None
    worker_pids: list[int] = field(default_factory=list)
    workers_killed: int = 0           # workers that had to be killed after the grace period
    duration_s: float = 0.0
    runs: int = 1                     # measurements averaged in the figures (see merge)

    def merge(self, again: "TrialResult") -> None:
        """Fold a repeat of this configuration in: throughputs are the mean over the runs (one
        high draw among many trials no longer decides), memory and start-up the worst seen."""
        if not again.usable or not self.usable:
            return
        n = self.runs

        def mean(a, b):
            return b if a is None else a if b is None else (a * n + b) / (n + 1)
        self.batches_per_s = mean(self.batches_per_s, again.batches_per_s)
        self.mean_batches_per_s = mean(self.mean_batches_per_s, again.mean_batches_per_s)
        self.samples_per_s = mean(self.samples_per_s, again.samples_per_s)
        self.cpu_pct = mean(self.cpu_pct, again.cpu_pct)
        self.spread = max(self.spread or 0.0, again.spread or 0.0)
        self.window_batches += again.window_batches
        self.window_s += again.window_s
        self.duration_s += again.duration_s
        self.workers_killed += again.workers_killed
        self.worker_pids += again.worker_pids
        for name in ("startup_s", "worker_uss_bytes", "batch_bytes"):
            values = [v for v in (getattr(self, name), getattr(again, name)) if v is not None]
            setattr(self, name, max(values) if values else None)
        self.runs += 1

    @property
    def usable(self) -> bool:
        return self.batches_per_s is not None and self.status in ("measured", "cut_short") \
            and self.window_batches >= MIN_WINDOW_BATCHES

    def epoch_batches_per_s(self) -> float | None:
        """Throughput over a whole epoch: what restarting the workers at every epoch costs."""
        if self.batches_per_s is None:
            return None
        restart = self.restart_s if self.config.persistent_workers else (self.startup_s or 0.0)
        if not self.epoch_batches or restart is None or not self.config.num_workers:
            return self.batches_per_s
        # An epoch of E batches: E at the steady rate, plus the epoch's start.
        return self.epoch_batches / (self.epoch_batches / self.batches_per_s + restart)

    def to_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "config"}
        out["config"] = self.config.to_dict()
        out["label"] = self.config.label()
        out["epoch_batches_per_s"] = self.epoch_batches_per_s()
        return out


def batch_nbytes(batch) -> int:
    """Bytes of the tensors and arrays in a batch (nested lists, tuples, dicts)."""
    nbytes = getattr(batch, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if hasattr(batch, "element_size") and hasattr(batch, "nelement"):
        return batch.element_size() * batch.nelement()
    if isinstance(batch, dict):
        return sum(batch_nbytes(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_nbytes(v) for v in batch)
    if isinstance(batch, (bytes, bytearray, str)):
        return len(batch)
    return 0


def batch_samples(batch) -> int | None:
    """The leading dimension of the first tensor in the batch."""
    shape = getattr(batch, "shape", None)
    if shape is not None and len(shape):
        return int(shape[0])
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            n = batch_samples(item)
            if n is not None:
                return n
    return None


class _Processes:
    """psutil views of this process and the workers a trial started."""

    def __init__(self) -> None:
        import psutil
        self.psutil = psutil
        self.me = psutil.Process()
        self.before = {p.pid for p in self.me.children()}
        self.seen: dict[int, object] = {}
        self.lock = threading.Lock()  # the consumer thread adds workers, the monitor reads them

    def track(self, iterator) -> None:
        """The workers' pids as the iterator knows them: no scan of every process."""
        pids = [getattr(w, "pid", None) for w in getattr(iterator, "_workers", None) or ()]
        for pid in pids:
            if isinstance(pid, int) and pid not in self.seen:
                try:
                    proc = self.psutil.Process(pid)
                except self.psutil.Error:
                    continue
                with self.lock:
                    self.seen[pid] = proc

    def scan(self) -> None:
        """Find new children by scanning (reads every process's stat: not in the hot loop)."""
        for child in self.me.children():
            if child.pid not in self.before and child.pid not in self.seen:
                with self.lock:
                    self.seen[child.pid] = child

    def workers(self) -> list:
        if not self.seen:
            self.scan()
        with self.lock:
            return list(self.seen.values())

    def cpu_s(self) -> float:
        total = 0.0
        for proc in [self.me, *self.workers()]:
            try:
                t = proc.cpu_times()
                total += t.user + t.system
            except self.psutil.Error:
                pass
        return total

    def max_uss(self, limit: int = 2) -> int | None:
        """The largest USS of a few workers (reading smaps costs; the workers are alike)."""
        best = None
        workers = self.workers()
        if workers:
            self._rotation = (getattr(self, "_rotation", -1) + 1) % len(workers)
            workers = (workers[self._rotation:] + workers[:self._rotation])[:limit]
        for proc in workers:
            try:
                uss = proc.memory_full_info().uss
            except self.psutil.Error:
                continue
            best = uss if best is None else max(best, uss)
        return best

    def alive(self) -> list:
        self.scan()  # also any worker the iterator did not list
        out = []
        for proc in self.workers():
            try:
                if proc.is_running() and proc.status() != self.psutil.STATUS_ZOMBIE:
                    out.append(proc)
            except self.psutil.Error:
                pass
        return out


def _shutdown(loader, iterator) -> None:
    if iterator is None:
        return
    stop = getattr(iterator, "_shutdown_workers", None)
    if stop is not None:
        stop()
    if getattr(loader, "_iterator", None) is iterator:
        loader._iterator = None


def _forget_worker_pids(iterator) -> None:
    """Before killing a trial's workers: torch's SIGCHLD handler would otherwise raise 'worker
    exited unexpectedly' in this process."""
    try:
        from torch.utils.data._utils import signal_handling
        if getattr(iterator, "_worker_pids_set", False):
            signal_handling._remove_worker_pids(id(iterator))
            iterator._worker_pids_set = False
    except Exception:  # a torch that changed this: the kill below still happens
        pass


class _Consumer(threading.Thread):
    def __init__(self, loader, result: TrialResult, deadline: float, measure_s: float, min_window_s: float,
                 procs: _Processes, device=None) -> None:
        super().__init__(daemon=True, name="starvewatch-tune-consumer")
        self.loader, self.result, self.deadline, self.min_window_s = loader, result, deadline, min_window_s
        self.measure_s = measure_s
        self.hard_deadline = deadline
        self.procs = procs
        self.stop = threading.Event()
        self.iterator = None
        self.error: BaseException | None = None
        self.batches = 0
        self.done = threading.Event()
        self.device = device

    def _next(self):
        remaining = self.deadline - time.perf_counter()
        if remaining <= 0 or self.stop.is_set():
            raise _Deadline()
        if hasattr(self.iterator, "_timeout") and self.loader.num_workers:
            self.iterator._timeout = max(0.01, remaining)  # a blocked get ends at the deadline
        try:
            batch = next(self.iterator)
            if self.device is not None:  # with CUDA, the copy is part of delivering a batch
                batch = _to_device(batch, self.device, self.loader.pin_memory)
            return batch
        except RuntimeError as exc:
            if "timed out" in str(exc):
                raise _Deadline() from None
            raise

    def run(self) -> None:
        r = self.result
        try:
            self._measure(r)
        except _Deadline:
            r.status, r.reason = "cut_short", r.reason or "the trial's time ran out"
        except BaseException as exc:  # the dataset raised: report it, keep tuning
            self.error = exc
            r.status, r.reason = "failed", f"{type(exc).__name__}: {exc}"
        finally:
            try:
                _shutdown(self.loader, self.iterator)
            except Exception:
                pass
            self.iterator = None
            self.done.set()

    def _measure(self, r: TrialResult) -> None:
        cfg = r.config
        t0 = time.perf_counter()
        self.iterator = iter(self.loader)
        first = self._next()
        r.startup_s = time.perf_counter() - t0
        self.procs.track(self.iterator)
        # Warm-up and measurement each get their time after the workers have started (the
        # main thread reads the new deadline).
        self.deadline = min(self.deadline, time.perf_counter() + self.measure_s)
        r.batch_bytes = batch_nbytes(first)
        r.samples_per_batch = self.loader.batch_size or batch_samples(first)
        try:
            r.epoch_batches = len(self.loader)
        except TypeError:
            r.epoch_batches = None
        del first
        # Warm-up: past the burst of batches the workers prepared while starting, and long
        # enough for the pipeline to settle.
        warm_batches = 2 + (cfg.num_workers * (cfg.prefetch_factor or 0))
        warm_until = time.perf_counter() + min(1.0, max(0.05, 0.15 * self.min_window_s))
        while r.warmup_batches < warm_batches or time.perf_counter() < warm_until:
            self._step()
            r.warmup_batches += 1
        self.deadline = min(self.hard_deadline, time.perf_counter() + self.measure_s)
        cpu_start, start = self.procs.cpu_s(), time.perf_counter()
        stamps: list[float] = []
        excluded = 0.0
        try:
            while True:
                excluded += self._step()
                now = time.perf_counter()
                stamps.append(now - excluded)
                self.batches += 1
                if now - start - excluded >= self.min_window_s and _stable(stamps, start):
                    break
        except _Deadline:
            if not stamps:
                raise
            if stamps[-1] - start < self.min_window_s:
                r.status, r.reason = "cut_short", "the trial's time ran out before the figure was stable"
        if self.device is not None:
            import torch
            torch.cuda.synchronize(self.device)
            stamps[-1] = time.perf_counter() - excluded
        end = stamps[-1]
        r.spread = _spread(stamps, start)
        r.window_batches, r.window_s = len(stamps), end - start
        if r.window_s > 0:
            r.mean_batches_per_s = len(stamps) / r.window_s
            r.batches_per_s = _best_segment_rate(stamps, start) or r.mean_batches_per_s
            if r.samples_per_batch:
                r.samples_per_s = r.batches_per_s * r.samples_per_batch
            r.cpu_pct = 100.0 * (self.procs.cpu_s() - cpu_start) / (time.perf_counter() - start)
        if cfg.persistent_workers and r.status == "measured" and time.perf_counter() < self.deadline:
            # What persistent workers save: a new epoch's start without spawning.
            t1 = time.perf_counter()
            self.iterator = iter(self.loader)
            self._next()
            r.restart_s = time.perf_counter() - t1

    def _step(self) -> float:
        """Take one batch; a new epoch's start is returned as time to leave out of the window."""
        try:
            self._next()
            return 0.0
        except StopIteration:
            t = time.perf_counter()
            if not self.loader.persistent_workers:
                _shutdown(self.loader, self.iterator)
            self.iterator = iter(self.loader)
            self._next()
            self.procs.track(self.iterator)
            return time.perf_counter() - t


class _Deadline(Exception):
    pass


def _stable(stamps: list[float], start: float) -> bool:
    spread = _spread(stamps, start)
    return spread is not None and spread <= STABLE_SPREAD


def _best_segment_rate(stamps: list[float], start: float) -> float | None:
    """The best of the window's thirds, as timeit keeps the best of its repeats: on a shared
    machine other processes only ever slow a loader down, so the best stretch is the most
    reproducible figure of what this configuration can do. Each third must hold enough
    batches (and with them the bursts of a bursty dataset) to mean something."""
    span = stamps[-1] - start
    if len(stamps) < SEGMENTS * MIN_SEGMENT_BATCHES or span <= 0:
        return None
    counts = [0] * SEGMENTS
    for t in stamps:
        counts[min(SEGMENTS - 1, int((t - start) / span * SEGMENTS))] += 1
    if min(counts) < MIN_SEGMENT_BATCHES:
        return None
    return max(counts) / (span / SEGMENTS)


def _spread(stamps: list[float], start: float) -> float | None:
    """How much the window's two halves disagree (0.05 = 5%)."""
    if len(stamps) < 8:
        return None
    middle = start + (stamps[-1] - start) / 2
    half = next(i for i, t in enumerate(stamps) if t >= middle)
    a = half / max(1e-9, middle - start)
    b = (len(stamps) - half) / max(1e-9, stamps[-1] - middle)
    return abs(a - b) / max(1e-9, (a + b) / 2)


def _to_device(batch, device, non_blocking: bool):
    if hasattr(batch, "to") and hasattr(batch, "is_pinned"):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: _to_device(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [_to_device(v, device, non_blocking) for v in batch]
    return batch


def run_trial(factory, config: LoaderConfig, deadline: float, measure_s: float, grace_s: float,
              hard_end: float, on_tick=None, device=None) -> TrialResult:
    """Measure one configuration for `measure_s` after its first batch, never past `deadline`
    (perf_counter). Workers still busy `grace_s` after the trial's end (and never later than
    `hard_end`) are killed. `on_tick()` is called about every 0.1 s (the progress bar)."""
    min_window_s = min(3.0, max(0.1, 0.5 * measure_s))
    started = time.perf_counter()
    result = TrialResult(config)
    procs = _Processes()
    try:
        loader = build(factory, config)
    except FactoryError:
        raise  # the factory is wrong for every configuration: the user must fix it
    except Exception as exc:
        result.status, result.reason = "failed", f"{type(exc).__name__}: {exc}"
        result.duration_s = time.perf_counter() - started
        return result
    consumer = _Consumer(loader, result, deadline, measure_s, min_window_s, procs, device)
    consumer.start()
    next_memory = time.perf_counter() + 0.15
    while not consumer.done.wait(MONITOR_TICK_S):
        now = time.perf_counter()
        if on_tick:
            on_tick()
        if now >= consumer.deadline:
            consumer.stop.set()
        if now >= min(consumer.deadline + grace_s, hard_end):
            break
        if config.num_workers and now >= next_memory:
            uss = procs.max_uss()
            if uss is not None:
                result.worker_uss_bytes = max(uss, result.worker_uss_bytes or 0)
            next_memory = now + MEMORY_SAMPLE_S
    if not consumer.done.is_set():
        # A batch is still being loaded past the deadline: cut the trial short here.
        consumer.stop.set()
        if result.status == "measured":
            result.status = "cut_short"
            result.reason = "a batch was still loading at the trial's deadline"
        if consumer.iterator is not None:
            _forget_worker_pids(consumer.iterator)
    result.worker_pids = sorted(procs.seen)
    result.workers_killed = _reap(procs, grace_s=1.0 if consumer.done.is_set() else 0.05)
    if not consumer.done.is_set():
        consumer.done.wait(0.5)  # the kill unblocks its shutdown
    result.duration_s = time.perf_counter() - started
    return result


def _reap(procs: _Processes, grace_s: float = 1.0) -> int:
    """Make sure every worker of the trial is gone; kill (and reap) the ones that are not."""
    deadline = time.perf_counter() + grace_s
    while procs.alive() and time.perf_counter() < deadline:
        time.sleep(0.02)
    ours = []
    for proc in procs.alive():
        try:
            if proc.ppid() == os.getpid():  # only our own children
                ours.append(proc.pid)
        except procs.psutil.Error:
            pass
    killed = _kill_and_reap(ours) if ours else 0
    for pid in procs.seen:
        try:
            os.waitpid(pid, os.WNOHANG)
        except OSError:
            pass
    return killed


def _kill_and_reap(pids: list[int], reap_s: float = 2.0) -> int:
    """SIGKILL `pids` and reap them before torch's SIGCHLD handler can look. That handler checks
    every worker pid a live iterator registered (with WNOWAIT) and raises "DataLoader worker ...
    is killed by signal: Killed" in the main thread: a worker whose iterator was still being
    built when the trial ended is registered under an iterator the trial never saw, so its pids
    cannot be forgotten first. A reaped child is no longer waitable, so the check finds nothing;
    in the main thread the handler is also held off (a no-op in its place) until the reaping is
    done, since it could otherwise run between the kill and the reap."""
    held = threading.current_thread() is threading.main_thread()
    previous = None
    if held:
        try:
            previous = signal.signal(signal.SIGCHLD, _ignore_signal)
        except (ValueError, OSError):
            held = False
    killed = 0
    try:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        deadline = time.perf_counter() + reap_s
        pending = set(pids)
        while pending and time.perf_counter() < deadline:
            for pid in list(pending):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:  # reaped already (multiprocessing, or never ours)
                    done = pid
                if done:
                    pending.discard(pid)
            if pending:
                time.sleep(0.005)
    finally:
        if held:
            signal.signal(signal.SIGCHLD, previous if previous is not None else signal.SIG_DFL)
    return killed


def _ignore_signal(signum, frame) -> None:
    pass
