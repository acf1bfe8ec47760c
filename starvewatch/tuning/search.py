"""The search: a doubling search on num_workers (from 4 workers it also tries a deeper queue,
prefetch_factor=4, and doubles at that depth from then on when it pays), then refinement
between the two workers counts that bracket the target, then prefetch_factor at the candidate
answer (and, when a deeper queue helps, a bisection of the workers count at that depth),
persistent_workers and (with CUDA) pin_memory; last, with budget left, the best and the answer
measured again and averaged. Every trial fits in the budget; a trial whose workers
would not fit in free RAM or /dev/shm is skipped with the reason.
"""
from __future__ import annotations

import shutil
import time

from ..envvars import limit_bytes
from .answer import CONSUMPTION_MARGIN, WITHIN_BEST, choose, rate
from .config import FactoryError, LoaderConfig, build
from .trial import TrialResult, run_trial

PLANNED_TRIALS = 15        # a budget is split into about this many trial slots
MIN_SLOT_S, MAX_SLOT_S = 0.5, 8.0
MAX_WORKERS = 64
DOUBLING_GAIN = 1.05       # a doubling must buy 5% more throughput to go on doubling
PREFETCH_GAIN = 1.03
# Bursty loading needs a deeper queue more than more workers, and at 2 deep the doubling would
# climb to the workers count that brute-forces the bursts. A deeper queue shows from a few
# workers on (fewer cannot overlap a burst): probed at 4 and 8 workers, taken if it buys 10%.
DEPTH_PROBES = (4, 8)
DEEPER_GAIN = 1.10
# The best of many noisy trials is likely a high draw, and it sets the target: with budget
# left, the best and the answer are measured again (a few times at most) and averaged.
CONFIRMATIONS = 3
MEMORY_HEADROOM = 0.9      # use at most 90% of free RAM and of free /dev/shm
OVERRUN = 1.05             # never past the budget by more than 5%


def free_memory() -> tuple[int, int | None]:
    """(available RAM, free /dev/shm) in bytes; /dev/shm honours STARVEWATCH_SHM_LIMIT_BYTES
    (a container's limit smaller than what the tmpfs reports)."""
    import psutil
    ram = psutil.virtual_memory().available
    try:
        shm = shutil.disk_usage("/dev/shm")
    except OSError:
        return ram, None
    free = shm.free
    limit = limit_bytes("STARVEWATCH_SHM_LIMIT_BYTES")
    if limit:
        free = min(free, max(0, limit - shm.used))
    return ram, free


def human_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:,.1f} {unit}" if n < 10 * size else f"{n / size:,.0f} {unit}"
    return f"{n:.0f} bytes"


class MemoryModel:
    """Predicts what a configuration holds from one worker's measured memory and the batch size."""

    def __init__(self) -> None:
        self.worker_uss_bytes: int | None = None
        self.batch_bytes: int | None = None

    def learn(self, trial: TrialResult) -> None:
        if trial.batch_bytes:
            self.batch_bytes = max(trial.batch_bytes, self.batch_bytes or 0)
        if trial.worker_uss_bytes:
            self.worker_uss_bytes = max(trial.worker_uss_bytes, self.worker_uss_bytes or 0)

    def predict(self, cfg: LoaderConfig) -> tuple[int, int]:
        """(RAM, /dev/shm) bytes: each worker's own memory, and the batches in flight (one per
        queue slot, plus the one the loop holds), which live in shared memory."""
        in_flight = (cfg.num_workers * (cfg.prefetch_factor or 0) + 1) * (self.batch_bytes or 0)
        pinned = in_flight if cfg.pin_memory else 0
        return cfg.num_workers * (self.worker_uss_bytes or 0) + in_flight + pinned, in_flight

    def check(self, cfg: LoaderConfig) -> tuple[str | None, int, int]:
        """(reason to skip or None, predicted RAM, predicted shm)."""
        ram, shm = self.predict(cfg)
        if not cfg.num_workers:
            return None, ram, shm
        free_ram, free_shm = free_memory()
        mib = human_bytes
        per_worker = (f"{cfg.num_workers} workers x {mib(self.worker_uss_bytes)}"
                      if self.worker_uss_bytes else "worker memory not measured yet")
        if free_shm is not None and shm > MEMORY_HEADROOM * free_shm:
            return (f"would need {mib(shm)} of /dev/shm ({cfg.num_workers * cfg.prefetch_factor + 1} batches "
                    f"in flight x {mib(self.batch_bytes or 0)}) but {mib(free_shm)} is free"), ram, shm
        if ram > MEMORY_HEADROOM * free_ram:
            return (f"would need {mib(ram)} of RAM ({per_worker}, plus batches in flight) but "
                    f"{mib(free_ram)} is available"), ram, shm
        return None, ram, shm


class Tuner:
    def __init__(self, factory, budget_s: float, consumption_batches_per_s: float | None = None, *,
                 cores: int, device=None, current: LoaderConfig | None = None, log=None,
                 tick=None, on_trial=None, checkpoint_every: int | None = None) -> None:
        if budget_s <= 0:
            raise ValueError(f"budget_s must be > 0, got {budget_s}")
        if consumption_batches_per_s is not None and consumption_batches_per_s <= 0:
            raise ValueError(f"consumption_batches_per_s must be > 0, got {consumption_batches_per_s}")
        self.factory, self.budget_s, self.consumption = factory, budget_s, consumption_batches_per_s
        self.cores, self.device, self.current = cores, device, current
        self.log, self.tick, self.on_trial = log or (lambda s: None), tick, on_trial
        self.trials: list[TrialResult] = []
        self.memory = MemoryModel()
        self.slot_s = min(MAX_SLOT_S, max(MIN_SLOT_S, budget_s / PLANNED_TRIALS))
        self.start = self.end = self.hard_end = 0.0
        self.out_of_budget = False
        self.depth = 2  # the prefetch_factor the doubling and the refinement measure at
        self.checkpoint_every = checkpoint_every  # steps between the loop's state_dict() calls
        self.snapshot_every: int | None = None     # a StatefulDataLoader's own snapshot interval
        self.notes: list[str] = []

    # ---- bookkeeping ---------------------------------------------------------------------------
    def _find(self, cfg: LoaderConfig) -> TrialResult | None:
        return next((t for t in self.trials if t.config == cfg), None)

    def _per_batch_s(self) -> float:
        """How long one worker takes for one batch (the last multi-worker trial), bounding
        how long shutting workers down can take."""
        for t in reversed(self.trials):
            if t.config.num_workers and t.batches_per_s:
                return min(2.0, t.config.num_workers / t.batches_per_s)
        return 0.1

    def _spawn_s(self, workers: int) -> float:
        for t in reversed(self.trials):
            if t.config.num_workers and t.startup_s:
                return t.startup_s / t.config.num_workers * workers
        return 0.05 * workers

    def _available_s(self, cfg: LoaderConfig) -> float | None:
        """Seconds a new trial of `cfg` may take, or None (and out of budget) when too few."""
        reserve = self._per_batch_s() + 0.05 if cfg.num_workers else 0.02
        available = self.end - time.perf_counter() - reserve
        if available < self._spawn_s(cfg.num_workers) + 0.5 * self.slot_s:
            self.out_of_budget = True
            self.log(f"  budget spent: {cfg.label()} and any later trial not measured")
            return None
        return available

    def _run(self, cfg: LoaderConfig, available: float) -> TrialResult:
        # The slot is for the measurement; start-up and warm-up come on top, within the budget.
        deadline = time.perf_counter() + min(available, 2 * self.slot_s + 2 * self._spawn_s(cfg.num_workers))
        return run_trial(self.factory, cfg, deadline, measure_s=self.slot_s,
                         grace_s=max(0.3, 2 * self._per_batch_s()), hard_end=self.hard_end - 0.05,
                         on_tick=self.tick, device=self.device)

    def measure(self, cfg: LoaderConfig) -> TrialResult | None:
        done = self._find(cfg)
        if done is not None or self.out_of_budget:
            return done
        available = self._available_s(cfg)
        if available is None:
            return None
        reason, ram, shm = self.memory.check(cfg)
        if reason:
            trial = TrialResult(cfg, status="skipped", reason=reason, predicted_ram_bytes=ram,
                                predicted_shm_bytes=shm)
        else:
            trial = self._run(cfg, available)
            trial.predicted_ram_bytes, trial.predicted_shm_bytes = ram, shm
            self.memory.learn(trial)
        self.trials.append(trial)
        self._report(trial)
        if self.on_trial:
            self.on_trial(trial)
        if trial.status == "failed" and not self.trials[:-1]:
            raise TrialFailed(trial.reason)
        return trial

    def _report(self, t: TrialResult) -> None:
        if t.status in ("skipped", "failed"):
            self.log(f"  {t.config.label()}: {t.status}: {t.reason}")
        else:
            extra = "" if t.status == "measured" else f" ({t.status}: {t.reason})"
            self.log(f"  {t.config.label()}: {t.batches_per_s or 0:.1f} batches/s{extra}")

    # ---- the search ----------------------------------------------------------------------------
    def run(self) -> list[TrialResult]:
        self.start = time.perf_counter()
        self.end = self.start + self.budget_s
        self.hard_end = self.start + self.budget_s * OVERRUN
        probe = build(self.factory, LoaderConfig(1, 2))  # a factory that ignores its arguments fails now
        every = getattr(probe, "snapshot_every_n_steps", None)
        self.snapshot_every = every if isinstance(every, int) else None
        self._workers()
        self._snapshots()  # before the finer settings: at 1, snapshots can cost more than they buy
        self._refine()
        self._prefetch()
        self._persistent_and_pinning()
        self._confirm()
        return self.trials

    def _confirm(self) -> None:
        """Measure the best and the answer again, while the budget lasts: each repeat folds
        into its trial (the mean of the runs), which may change the best, the target and the
        answer; a configuration is repeated once."""
        repeated: set = set()
        for _ in range(CONFIRMATIONS):
            usable = [t for t in self.trials if t.usable]
            if not usable or self.out_of_budget:
                return
            best, answer = max(usable, key=rate), self._candidate()
            todo = next((t for t in (best, answer) if t is not None and t.config not in repeated), None)
            if todo is None:
                return
            repeated.add(todo.config)
            available = self._available_s(todo.config)
            if available is None:
                return
            again = self._run(todo.config, available)
            if self.on_trial:
                self.on_trial(again)
            before = todo.batches_per_s
            todo.merge(again)
            self.log(f"  {todo.config.label()} again: {again.batches_per_s or 0:.1f} batches/s "
                     f"(mean of {todo.runs}: {todo.batches_per_s or 0:.1f}, was {before or 0:.1f})")

    def _target(self) -> float | None:
        usable = [t for t in self.trials if t.usable]
        if not usable:
            return None
        best = max(rate(t) for t in usable)
        if self.consumption and best >= self.consumption * CONSUMPTION_MARGIN:
            return self.consumption * CONSUMPTION_MARGIN
        return (1 - WITHIN_BEST) * best

    def _workers(self) -> None:
        zero = self.measure(LoaderConfig(0))
        needed = self.consumption * CONSUMPTION_MARGIN if self.consumption else None
        if needed and zero is not None and zero.usable and rate(zero) >= needed:
            return  # the training thread alone keeps up: no worker needed
        best = rate(zero) if zero is not None and zero.usable else 0.0
        workers, misses = 1, 0
        while workers <= MAX_WORKERS and not self.out_of_budget:
            trial = self.measure(LoaderConfig(workers, self.depth))
            if trial is None or trial.status == "skipped":
                return  # more workers need more memory still
            if not trial.usable:
                return  # no figure within its time: more workers would take longer still
            if self.depth == 2 and workers in DEPTH_PROBES:
                deeper = self.measure(LoaderConfig(workers, 4))
                if deeper is not None and deeper.usable and rate(deeper) >= rate(trial) * DEEPER_GAIN:
                    self.depth, trial = 4, deeper
            if needed and rate(trial) >= needed:
                return
            if workers >= 2:
                # Two doublings in a row that did not pay: refinement looks between. (One
                # could be noise, or a hand-over cost that more workers then amortize.)
                misses = misses + 1 if rate(trial) < best * DOUBLING_GAIN else 0
                if misses >= 2:
                    return
            best = max(best, rate(trial))
            workers *= 2

    def _refine(self) -> None:
        while not self.out_of_budget:
            target = self._target()
            if target is None:
                return
            counts = {t.config.num_workers: rate(t) for t in self.trials if t.usable
                      and t.config.prefetch_factor in (None, self.depth) and not t.config.persistent_workers}
            meeting = [w for w, r in counts.items() if r >= target]
            if not meeting:
                return
            high = min(meeting)
            below = [w for w in counts if w < high]
            if not below:
                return
            low = max(below)
            if high - low <= 1:
                return
            before = len(self.trials)
            self.measure(LoaderConfig((low + high) // 2, self.depth))
            if len(self.trials) == before:
                return  # measured already (or out of budget): nothing new to bracket with

    def _candidate(self) -> TrialResult | None:
        return choose(self.trials, self.consumption)[0]

    def _prefetch(self) -> None:
        cand = self._candidate()
        if cand is None:
            return
        if not cand.config.num_workers:
            # The training thread alone came out ahead of the workers measured: a deeper queue
            # at the best of them may still pass it (loading that comes in bursts).
            workers = [t for t in self.trials if t.usable and t.config.num_workers]
            if not workers:
                return
            cand = max(workers, key=rate)
        base = cand.config
        deeper = self.measure(base.replace(prefetch_factor=4))
        if deeper is None or not deeper.usable or rate(deeper) < rate(cand) * PREFETCH_GAIN:
            return
        # A deeper queue helped (bursty loading): fewer workers may reach the target with it.
        # Bisect the workers count at prefetch_factor=4, below the candidate's.
        low, high = 0, base.num_workers
        while high - low > 1 and not self.out_of_budget:
            target = self._target()
            mid = (low + high) // 2
            trial = self.measure(base.replace(num_workers=mid, prefetch_factor=4))
            if trial is None or not trial.usable:
                return
            if target is not None and rate(trial) >= target:
                high = mid
            else:
                low = mid

    def _persistent_and_pinning(self) -> None:
        cand = self._candidate()
        if cand is None or not cand.config.num_workers:
            return
        if cand.epoch_batches:  # persistent workers matter at epoch starts
            self.measure(cand.config.replace(persistent_workers=True))
        if self.device is not None:
            cand = self._candidate()
            if cand is not None and not cand.config.pin_memory:
                self.measure(cand.config.replace(pin_memory=True))


    def _snapshots(self) -> None:
        """A StatefulDataLoader snapshots its workers' state every `snapshot_every_n_steps`
        batches (1 by default) and sends it with the batch: the best with workers measured again
        snapshotting at the checkpoint interval instead (a snapshot between checkpoints is
        never used), so the answer may take it."""
        every, interval = self.snapshot_every, self.checkpoint_every
        if every is None:
            return
        if not interval:
            self.notes.append("StatefulDataLoader: give the checkpoint interval (--checkpoint-every, or a run "
                              "whose loop called state_dict()) to try snapshot_every_n_steps at it")
            return
        # Snapshots travel only from workers: compared at the best configuration with workers.
        with_workers = [t for t in self.trials if t.usable and t.config.num_workers]
        if interval <= every or not with_workers:
            return  # snapshots no more often than checkpoints, or no worker measured
        cand = max(with_workers, key=rate)
        cfg = cand.config.replace(snapshot_every_n_steps=interval)
        try:
            build(self.factory, cfg)  # no workers start: a factory that does not pass it on is told here
        except FactoryError as exc:
            self.notes.append(f"snapshot_every_n_steps={interval} not tried: {exc}")
            return
        trial = self.measure(cfg)
        if trial is not None and trial.usable and cand.usable:
            self.notes.append(
                f"snapshot_every_n_steps={interval} (the checkpoint interval): {trial.batches_per_s or 0:.1f} "
                f"batches/s against {cand.batches_per_s or 0:.1f} at {every}, {cand.config.label()} "
                f"({(trial.batches_per_s or 0) / max(cand.batches_per_s or 0, 1e-9):.2f}x)")


class TrialFailed(RuntimeError):
    """The very first trial failed: the factory or the dataset is broken, not a configuration."""
