"""What the diagnosis knows about one loader, and the one model every prediction comes from.

Per batch the loop waits `wait` and computes `compute` (ms). Loading one batch costs `load`
(ms, on one worker). With N workers that overlap with compute, a step takes about
max(compute, load / N) -- and when loading is CPU work, the host's cores bound it as well:
load / cores; where the training process's CPU was measured, the workers share the cores
other processes leave with each other and with the training process (shared_cores_step),
and an uncertain prediction also gets a range (speedup_range). Add the hand-over of each
batch, the workers' start-up (once if persistent, else every epoch) and the bursts a prefetch
queue did not absorb.

`step_ms(facts, config, what_if)` predicts the step for any DataLoader configuration (and for
changes that are not DataLoader arguments, as `what_if` factors); a set of changes is
predicted by one call over the changed configuration, so gains are never double-counted.
Speed-ups are per sample: a change of batch size is judged by samples/s, not batches/s.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..cpus import usable_cores


@dataclass(frozen=True)
class Thresholds:
    """Every number a rule compares against, in one place."""

    worker_headroom: float = 1.2          # workers = ceil(load / compute x this)
    # The most workers ever planned (rules.worker_plan predicts each count up to it): a stored
    # loader whose load is a million times its compute (hostile or broken records) once made a
    # summary predict a million counts, a GET the collector never answered.
    max_workers: int = 256
    cpu_busy_fraction: float = 0.5        # worker (or loading) CPU time / wall time: CPU-bound above
    cpu_busy_fraction_saturated: float = 0.15  # the same on a saturated host (CPU time is rationed)
    # No hard switch on a noisy share (issue 35 item 5): the threshold slides from the quiet
    # one to the saturated one as the host's CPU goes from the first to the second figure, and
    # a share within `cpu_busy_band` of it (relative) blends the two models' predictions.
    busy_host_pct_from: float = 70.0
    busy_host_pct_to: float = 95.0
    cpu_busy_band: float = 0.25
    iowait_high_pct: float = 20.0         # kernel iowait that marks storage-bound reads
    cpu_saturated_pct: float = 90.0       # machine CPU busy: more workers cannot help
    cgroup_throttled_pct: float = 50.0    # a CPU quota throttled in this share of its periods: saturated
    startup_share: float = 0.5            # epoch start-up share of all waiting: epoch_startup
    startup_min_ms: float = 20.0          # a first-batch wait this much over steady state is start-up
    bursty_p99_factor: float = 4.0        # p99 over 4x p50: waits come in bursts
    max_prefetch_factor: int = 16
    memory_reserve_fraction: float = 0.2  # of free RAM and /dev/shm, never planned for workers
    gpu_underused_pct: float = 70.0       # GPU utilization under this while not input-bound
    min_gain: float = 1.02                # predictions under 2% are not worth a recommendation
    batch_memory_fraction: float = 0.9    # larger batches only while peak GPU memory x new/old stays under this
    worker_transfer_ms: float = 0.5       # handing a batch from a worker to the loop, when unmeasured
    # Starting one worker where no start-up was measured (its CPU, shared by the free cores):
    # fork copies the page tables; spawn and forkserver start an interpreter, import torch and
    # unpickle the dataset. Measured start-up is scaled from the workers it was measured with.
    worker_spawn_ms_fork: float = 25.0
    worker_spawn_ms_spawn: float = 400.0
    pickle_bytes_per_ms: float = 200_000.0  # the dataset's pickled bytes sent to each spawned worker
    range_min_spread: float = 0.2         # a speed-up range is given when high > low x (1 + this)
    startup_margin: float = 1.5           # a worker count must pay for this much of its start-up


DEFAULT = Thresholds()


def ranks_per_host(run: dict | None, ranks: list[int]) -> tuple[int, str]:
    """How many of `ranks` share one host's cores: LOCAL_WORLD_SIZE when the run reported it,
    else the ranks that reported the same hostname (the busiest host), else one."""
    run = run or {}
    local = run.get("local_world_size")
    if isinstance(local, int) and local > 0:
        return local, "LOCAL_WORLD_SIZE"
    hosts = run.get("rank_hosts") or {}
    if hosts:
        per_host: dict[str, int] = {}
        for rank in ranks:
            host = hosts.get(str(rank))
            if host is not None:
                per_host[host] = per_host.get(host, 0) + 1
        if per_host:
            return max(per_host.values()), "hostnames"
    return 1, "one rank assumed"


class LoaderFacts:
    """The measurements one loader's rules rely on, in ms per batch."""

    def __init__(self, part: dict, data, system: dict | None, run: dict | None, t: Thresholds,
                 active_workers: int | None = None) -> None:
        self.name = part["name"]
        self.part = part
        self.config = part.get("config") or {}
        self.workers = self.config.get("num_workers")
        # The workers that can work (findings.idle_workers: the others served nothing, or under a
        # quarter of their share: an IterableDataset with fewer shards than readers, or split
        # unevenly). Every throughput term counts these; `workers` stays the configured value
        # (each configured worker still starts and holds memory).
        self.active_workers = min(self.workers, active_workers) \
            if self.workers and active_workers is not None and active_workers >= 1 else self.workers
        self.idle_workers = (self.workers or 0) - (self.active_workers or 0)
        self.steps = part["steps"]
        self.t = t
        totals = data.totals
        steady = self._measure_waits(totals, data.records)
        self._place(system, run, part)
        self._measure_load(t)
        self._judge_saturation(t)
        self._measure_hand_over(t, steady)
        self._measure_bursts(t)
        measure_cpu_sharing(self, totals)

    def _measure_waits(self, totals, rec):
        """Per-batch compute and waits (mean, first, steady, median, p99); returns the steady
        waits' histogram."""
        steps = max(1, totals.steps)
        self.compute = totals.compute_ns / steps / 1e6
        self.wait = (totals.wait_ns + totals.epoch_end_wait_ns) / steps / 1e6
        # The rest of the loop's wall step: time outside step() blocks (logging, checkpoints, a
        # framework's own work between its hooks). No DataLoader setting shortens it; the
        # workers load during it as during compute. (Other loaders' waits are theirs.)
        self.other = totals.other_ns / steps / 1e6
        self.body = self.compute + self.other  # what the loop does per batch besides waiting
        self.step = self.wait + self.body      # the wall step: every prediction is relative to it
        self.epochs = max(1, totals.epochs)
        self.first_wait = rec.first_wait.total / rec.first_wait.count / 1e6 if rec and rec.first_wait.count else None
        steady = rec.steady_wait() if rec else None
        self.steady_wait = steady.total / steady.count / 1e6 if steady and steady.count else self.wait
        self.median_wait = (steady.quantile(0.5) or 0) / 1e6 if steady and steady.count else None
        self.p99_wait = (steady.quantile(0.99) or 0) / 1e6 if steady and steady.count else None
        self.epoch_end_wait = totals.epoch_end_wait_ns / self.epochs / 1e6
        # Sampled waits: the training thread's CPU time while it waited for a batch.
        self.probe_cpu_fraction = (totals.wait_probe_cpu_ns / totals.wait_probe_ns
                                   if totals.wait_probe_ns > 10_000_000 else None)
        # ... and the process's other threads' CPU in those waits (issue 35 item 1): loading on
        # a thread (MONAI's ThreadDataLoader, a prefetch thread) runs while the training thread
        # is blocked on its queue. Only without worker processes (else the pin-memory thread's).
        self.thread_cpu_fraction = None
        if not self.workers and self.probe_cpu_fraction is not None and totals.wait_probe_process_cpu_ns:
            self.thread_cpu_fraction = max(0.0, (totals.wait_probe_process_cpu_ns - totals.wait_probe_cpu_ns)
                                           / totals.wait_probe_ns)
        # A loader built anew at every epoch (the same call site and dataset: hooks/session.py)
        # starts its workers every epoch, persistent_workers or not (about every epoch: a
        # loader rebuilt once, as Lightning does at set-up, is not).
        self.rebuilds = getattr(totals, "rebuilds", 0)
        self.rebuilt = self.rebuilds >= 1 and self.epochs >= 2 and self.rebuilds >= (self.epochs - 1) / 2
        return steady

    def _place(self, system: dict | None, run: dict | None, part: dict) -> None:
        """The cores this loader's rank may use: its share of the host's usable cores."""
        self.system = system or {}
        # The CPUs the training process may use (affinity, cgroup quota: starvewatch/cpus.py), as
        # its samplers read them; the host's count from hooks that predate them.
        cores = self.system.get("usable_cores") or self.system.get("cpu_count") or usable_cores()
        self.ranks_per_host, self.ranks_per_host_source = ranks_per_host(run, part.get("ranks") or [0])
        self.cores = max(1, cores // self.ranks_per_host)

    def _measure_load(self, t: Thresholds) -> None:
        """One batch's loading cost on one worker (`load`), from the workers that served."""
        info = (self.system.get("loaders") or {}).get(self.name) or {}
        self.worker_info = info
        self.worker_load = info.get("worker_load_ms_mean")
        if self.idle_workers:
            # Each worker's mean weighed by its batches: a worker idle after a batch or two
            # (its shard's opening in it) would otherwise weigh as much as the one serving.
            served = [(w["batches"], w["load_ms_mean"]) for w in info.get("workers") or []
                      if w.get("batches") and w.get("load_ms_mean") is not None]
            if served:
                self.worker_load = sum(b * ms for b, ms in served) / sum(b for b, _ in served)
        self.worker_cpu_fraction = info.get("worker_cpu_fraction")
        # The epoch's own start that any configuration pays (a plain iterable opening its
        # files, a dataset's first read), measured where loading is on the training thread.
        self.own_startup = max(0.0, (self.first_wait or 0) - self.steady_wait) if not self.workers else 0.0
        host_pct = self._host_busy_pct()
        self.busy_threshold = self._busy_threshold(t, host_pct)
        # Loading on another thread of the process: that thread busy while the training one
        # waits idle (a thread loader; twice the training thread's share at least, so that
        # torch's collate threads and starvewatch's own beside a loading training thread are
        # not taken for one). It loads while the loop computes, as one worker does.
        self.loads_on_thread = self.thread_cpu_fraction is not None \
            and self.thread_cpu_fraction >= (1 - t.cpu_busy_band) * self.busy_threshold \
            and self.thread_cpu_fraction > 2 * (self.probe_cpu_fraction or 0)
        if self.loads_on_thread:  # one thread loads a batch per step, overlapped with the loop
            self.load = self.step
        elif not self.workers:  # loading on the training thread: the wait is the load
            self.load = self.steady_wait
        elif self.worker_load:
            self.load = self.worker_load
        else:  # saturated workers deliver one batch per (step time / workers serving)
            self.load = (self.active_workers or 1) * self.step

    def _judge_saturation(self, t: Thresholds) -> None:
        """Whether storage or the cores bound loading, and whether loading is CPU work."""
        # Machine-wide iowait this high means processes (the readers) are blocked on storage
        # with nothing else to run: the device is the limit, and more readers queue behind it.
        iowait = self.system.get("iowait_pct_mean")
        self.storage_bound = iowait is not None and iowait >= t.iowait_high_pct
        # The workers deliver a batch at least as fast as the loop consumes one.
        self.workers_keep_up = bool(self.workers) and self.load / self.active_workers <= self.body * 1.05
        # Workers that never catch up fetch all the time: together they use fraction x workers
        # cores. When that is every usable core, loading is CPU work that saturates them however
        # thinly each worker's share is spread (6 spinning workers on 2 cores: 0.35 each).
        self.loading_saturates_cores = bool(self.workers) and not self.workers_keep_up \
            and self.worker_cpu_fraction is not None \
            and self.worker_cpu_fraction * self.active_workers >= t.cpu_saturated_pct / 100 * self.cores
        # Inside a CPU quota the host's percentages say little (an idle 128-core host around a
        # throttled 8-CPU container): the cgroup's own use of its quota and its throttling do.
        quota_use, throttled = self.system.get("cgroup_cpu_pct_mean"), self.system.get("cgroup_throttled_pct_mean")
        if quota_use is not None or throttled is not None:
            self.host_cpu_saturated = (quota_use or 0) >= t.cpu_saturated_pct \
                or (throttled or 0) >= t.cgroup_throttled_pct
        else:
            self.host_cpu_saturated = (self.system.get("cpu_pct_mean") or 0) >= t.cpu_saturated_pct
        # Either way more CPU-bound workers cannot get more done.
        self.cores_saturated = self.host_cpu_saturated or self.loading_saturates_cores
        # How surely loading is CPU work, 0..1 (blended near the threshold), and the label.
        self.cpu_weight = self._cpu_weight(t)
        self.cpu_busy = None if self.cpu_weight is None else self.cpu_weight >= 0.5

    def _measure_hand_over(self, t: Thresholds, steady) -> None:
        """The cost of handing a ready batch to the loop, and the main process's share of a
        wait."""
        # Handing over a ready batch: the wait that remains when workers keep up, measured
        # when the queue had batches ready, else a typical value.
        queue = self.worker_info.get("queue_depth_mean")
        if self.workers and queue and queue >= 1 and self.median_wait is not None:
            # Workers that keep up leave a batch ready at most waits: the median is the
            # hand-over. Workers that do not: most waits are for a worker, and only the short
            # ones (a batch was ready) are the hand-over.
            low = (steady.quantile(0.1) or 0) / 1e6 if steady and steady.count else self.median_wait
            # With idle workers, the serving one's batches arrive out of turn and read as ready
            # while the loop still waits for that one worker: the hand-over is at most what the
            # wait leaves beside the wait for the serving workers (load / serving - compute).
            if self.idle_workers:
                low = min(low, max(0.0, self.steady_wait - (self.load / self.active_workers - self.body)))
            self.transfer = self.median_wait if self.workers_keep_up else max(t.worker_transfer_ms, low)
        else:
            self.transfer = t.worker_transfer_ms
        # The main process's share of a wait, apart from waiting for a worker to finish loading:
        # with workers, the training thread's CPU time while it waits (sampled, a few waits a
        # second) is receiving and rebuilding the batch from shared memory; blocked on the queue
        # it uses none. It does not shrink with more workers.
        # Per batch, so from the typical wait: bursts (a slow item now and then) are waits for
        # a worker, and the mean they inflate would read as the main process's own work.
        typical_wait = min(self.steady_wait, self.median_wait) if self.median_wait is not None else self.steady_wait
        self.main_share = typical_wait * self.probe_cpu_fraction \
            if self.workers and self.probe_cpu_fraction is not None else 0.0
        # Main-bound: that share is most of the wait (not a hand-over beside bursts or slow workers).
        self.main_bound = bool(self.workers) and self.probe_cpu_fraction is not None \
            and self.probe_cpu_fraction >= self.busy_threshold and self.main_share >= t.worker_transfer_ms \
            and self.main_share >= 0.5 * self.steady_wait
        self.transfer = max(self.transfer, self.main_share)

    def _measure_bursts(self, t: Thresholds) -> None:
        """The workers' start-up, and the waits in bursts a prefetch queue did not absorb."""
        self.respawn = max(0.0, (self.first_wait or 0) - self.steady_wait) if self.workers else 0.0
        # Waits in bursts the queue did not absorb (the mean over the median, when bursty).
        self.bursty = bool(self.workers and self.median_wait is not None and self.p99_wait is not None
                           and self.p99_wait > t.bursty_p99_factor * max(self.median_wait, 0.05))
        # Only while the workers keep up on average: otherwise the long waits are slow workers,
        # which the max(compute, load / workers) term already predicts.
        self.burst_excess = max(0.0, self.steady_wait - (self.median_wait or 0)) \
            if self.bursty and self.workers_keep_up else 0.0
        prefetch = self.config.get("prefetch_factor") or 2
        self.prefetch_needed = min(t.max_prefetch_factor, max(
            prefetch * 2, math.ceil(prefetch * (self.p99_wait or 0) / max(self.body, 1e-3)))) \
            if self.bursty else prefetch
        gpu = self.system.get("gpu_util_mean")
        self.gpu_busy_fraction = gpu / 100 if gpu is not None else None

    def _host_busy_pct(self) -> float:
        """The host's CPU use as this process sees it (inside a quota, the quota's use)."""
        quota_use = self.system.get("cgroup_cpu_pct_mean")
        return quota_use if quota_use is not None else (self.system.get("cpu_pct_mean") or 0.0)

    def _busy_threshold(self, t: Thresholds, host_pct: float) -> float:
        """The CPU share above which loading is CPU work: on a busy host a CPU-bound fetch is
        runnable but descheduled much of the time, so its share falls; the threshold slides
        with the host's use (no step at one percentage that a noisy mean falls either side of)."""
        span = max(1e-9, t.busy_host_pct_to - t.busy_host_pct_from)
        x = min(1.0, max(0.0, (host_pct - t.busy_host_pct_from) / span))
        if self.system.get("cgroup_throttled_pct_mean") is not None \
                and self.system["cgroup_throttled_pct_mean"] >= t.cgroup_throttled_pct:
            x = 1.0
        return t.cpu_busy_fraction + x * (t.cpu_busy_fraction_saturated - t.cpu_busy_fraction)

    def loading_cpu_fraction(self) -> float | None:
        """The CPU time over wall time of whatever does the loading: the workers, the training
        thread, or (a thread loader) the other threads while the training thread waits."""
        if self.workers:
            return self.worker_cpu_fraction
        if self.loads_on_thread:
            return self.thread_cpu_fraction + (self.probe_cpu_fraction or 0.0)
        return self.probe_cpu_fraction if self.workers == 0 else None

    def _cpu_weight(self, t: Thresholds) -> float | None:
        """How surely loading is CPU work (decoding, transforms) rather than waiting (reads,
        sleeps): 0 or 1 away from the threshold, a straight blend within `cpu_busy_band` of it,
        so two runs whose shares straddle it predict alike. None where nothing was measured."""
        if self.storage_bound:
            return 0.0
        if self.workers and self.worker_cpu_fraction is not None and self.loading_saturates_cores:
            return 1.0
        share = self.loading_cpu_fraction()
        if share is None:
            return None
        low, high = (1 - t.cpu_busy_band) * self.busy_threshold, (1 + t.cpu_busy_band) * self.busy_threshold
        return min(1.0, max(0.0, (share - low) / max(1e-9, high - low)))

    def workers_needed(self, t: Thresholds) -> int:
        if self.body <= 0:
            return max(1, self.cores - 1)
        return max(1, math.ceil(self.load / self.body * t.worker_headroom))

    def evidence(self, **extra) -> dict:
        out = {"input_wait_fraction": self.part["input_wait_fraction"], "wait_ms": round(self.wait, 3),
               "compute_ms": round(self.compute, 3), "load_ms": round(self.load, 3),
               "num_workers": self.workers, "cores": self.cores, "ranks_per_host": self.ranks_per_host}
        if self.idle_workers:
            out["active_workers"] = self.active_workers
        if self.probe_cpu_fraction is not None:
            out["wait_cpu_fraction"] = round(self.probe_cpu_fraction, 3)
        if self.worker_cpu_fraction is not None:
            out["worker_cpu_fraction"] = round(self.worker_cpu_fraction, 3)
        if self.loads_on_thread:  # loading on another thread of the process (a thread loader)
            out["loading_thread_cpu_fraction"] = round(self.thread_cpu_fraction, 3)
        if self.cpu_weight is not None and 0 < self.cpu_weight < 1:  # near the threshold: blended
            out.update(cpu_bound_weight=round(self.cpu_weight, 3), cpu_busy_threshold=round(self.busy_threshold, 3))
        if self.rebuilt:
            out["loader_rebuilds"] = self.rebuilds
        if self.main_cpu_ms is not None:  # what CPU-bound loading shares the cores with
            out.update(main_cpu_ms=round(self.main_cpu_ms, 3), others_cores=round(self.others_cores, 3))
        out.update(extra)
        return out


def measure_cpu_sharing(f: LoaderFacts, totals) -> None:
    """What CPU-bound loading shares the cores with, all measured (docs/diagnosis.md):
    - `process_cpu_cores`: the training process's CPU time (all its threads) per second of
      its loop, read by the sampler thread over the intervals the loop ran through (else the
      run's mean process CPU); `main_cpu_ms` is its part per step that is not loading (with
      num_workers=0 the loading's process CPU during the sampled waits is taken out): the
      work that stays in the training process and competes with the workers for cores;
    - `thread_share`: the CPU time over wall time of loading that is CPU work (the training
      thread's while it loaded, or the workers'): 1 when a core was always there for it;
    - `others_cores` (`others_cores_max`): the host's busy cores that were not this process
      or its workers (mean and peak; the workers' from the CPU time of their fetches). They are taken as kept by the other processes, more
      workers or not: Linux shares a busy CPU between process groups (autogroups, cgroups),
      not between threads. Inside a CPU quota, or with several ranks on a host (their cores
      are split already), none are counted."""
    f.process_cpu_cores = f.process_cpu_source = None
    if totals.loop_wall_ns >= 200_000_000:
        f.process_cpu_cores, f.process_cpu_source = totals.loop_process_cpu_ns / totals.loop_wall_ns, "loop"
    elif f.system.get("process_cpu_pct_mean") is not None:
        f.process_cpu_cores, f.process_cpu_source = f.system["process_cpu_pct_mean"] / 100, "run"
    f.main_cpu_ms = None
    if f.process_cpu_cores is not None:
        process_ms = f.process_cpu_cores * f.step
        if f.workers:
            f.main_cpu_ms = process_ms
        elif f.workers == 0 and f.probe_cpu_fraction is not None:
            waits = (totals.wait_probe_process_cpu_ns / totals.wait_probe_ns
                     if totals.wait_probe_process_cpu_ns else f.probe_cpu_fraction)
            if f.loads_on_thread:  # the loading thread works all step long, not only in the waits
                f.main_cpu_ms = max(0.0, process_ms - f.wait * f.probe_cpu_fraction
                                    - f.step * f.thread_cpu_fraction)
            else:
                f.main_cpu_ms = max(0.0, process_ms - f.wait * waits)
    loading = f.loading_cpu_fraction()
    f.thread_share = min(1.0, loading) if loading else None
    f.others_cores = f.others_cores_max = 0.0
    quota = f.system.get("cpu_quota_cores")
    count = f.system.get("cpu_count")
    if quota is None and f.ranks_per_host == 1 and count and f.process_cpu_cores is not None:
        # This process's cores, and its workers': each batch is loaded once, with the workers'
        # measured CPU fraction (their sampled CPU percentages start at 0 and miss short runs).
        ours = f.process_cpu_cores
        if f.workers and f.worker_cpu_fraction is not None:
            ours += f.load * f.worker_cpu_fraction / max(f.step, 1e-9)
        # Held to fewer CPUs than the host has (affinity), only the others' use of those counts:
        # the host's mean busy share, taken as even across its CPUs (a pinned run beside a hog:
        # "other processes used 1.6 of its 1 core").
        span = min(count, f.cores)
        for key, attr in (("cpu_pct_mean", "others_cores"), ("cpu_pct_max", "others_cores_max")):
            if f.system.get(key) is not None:
                setattr(f, attr, max(0.0, f.system[key] / 100 * span - ours))
        f.others_cores_max = max(f.others_cores, f.others_cores_max)
    f.others_threads = others_threads(f)


def others_threads(f: LoaderFacts) -> float:
    """The other processes' runnable threads, from the host as measured (issue 35 item 4): the
    scheduler gives each runnable thread an equal share of the cores (the processes of one
    session or cgroup are not grouped apart), so where the loading got under a core on a busy
    host (`thread_share` < 0.9), cores / that share is how many threads were runnable, less
    this process's own. None where the loading got (nearly) a whole core: then no contention
    was seen, and the others are taken to keep the cores they used (a CPU-heavy step beside a
    hog: 2 workers measured 0.71x, as that predicts)."""
    share = f.thread_share
    busy = f.others_cores
    if not share or share >= 0.9 or busy <= 0 or f.main_cpu_ms is None:
        return None  # no contention seen: the others keep the cores they used
    step = max(f.step, 1e-9)
    loading = f.load if (f.workers or f.loads_on_thread) else f.wait  # wall time runnable, per step
    ours = loading / step + f.main_cpu_ms / share / step
    return max(busy, f.cores / share - ours)


def shared_cores_step(f: LoaderFacts, workers: int, load: float, compute: float, handover: float,
                      others_cores: float, others_as_threads: bool = False) -> tuple[float, float]:
    """(loading-or-compute time per batch, the share of a core each runnable thread gets) for
    CPU-bound loading in `workers` workers that share the cores with each other and the
    training process (its CPU per step over the step): each busy one gets an equal share,
    min(1, free / runnable). The host's other processes keep the cores they were measured
    using (`others_cores`): Linux splits a busy CPU between scheduling groups first (an
    autogroup per session, a cgroup per service or container), and the workers are forked
    into the training process's group, so more of them do not take cores from another job.
    `others_as_threads`: the other case, the others' runnable threads (`others_threads`,
    from the share measured) in the training process's own group, each added worker getting
    a share like theirs (a CPU hog started from the training script): the range's high end
    (issue 35 item 4). Solved as a fixed point (a step's length sets how busy each is, which
    sets the share)."""
    share_now = f.thread_share or 1.0
    # the others' runnable threads where contention was measured and they are taken to share
    # the group, as many more or fewer as their busy cores say; else the cores they leave
    contended = others_as_threads and f.others_threads is not None
    others = f.others_threads * others_cores / f.others_cores if contended and f.others_cores > 0 else 0.0
    # Kept by the others, the cores they were measured using leave this process at least what
    # one of its threads got while it loaded, where contention was seen (`others_threads`: the
    # loading got under 0.9 of a core): the others used the rest of the time too, while the
    # training thread slept in its step, and a group's share does not shrink as it gets more
    # threads to run. (Where the loading got a whole core, no contention was seen.)
    floor = min(share_now, f.cores) if f.others_threads is not None else 0.0
    free = f.cores if contended else max(1e-3, f.cores - others_cores, floor)
    load_cpu = load * share_now                     # CPU time of one batch's loading
    main_cpu = (f.main_cpu_ms or 0.0) + (0.0 if f.workers else handover)
    # The part of compute that was CPU work ran at the share measured; the rest (GPU, sleeps) waits.
    compute_cpu_wall = min(compute, (f.main_cpu_ms or 0.0) / share_now)
    compute_idle = compute - compute_cpu_wall

    def step_at(share: float) -> float:
        return max(compute_idle + compute_cpu_wall * share_now / share, load_cpu / (workers * share))

    def given(share: float) -> float:
        """The share the scheduler gives when each thread runs at `share`: the fewer it gets,
        the longer each stays runnable."""
        busy = share * step_at(share)
        runnable = others + min(float(workers), load_cpu / busy) + main_cpu / busy
        return min(1.0, free / max(1e-9, runnable))

    # The largest share the scheduler can give (a thread takes what it gets): bisection, since
    # a damped iteration can settle on neither side where the cores, not the threads, bound
    # the step (2 workers in 0.4 of a free core).
    if given(1.0) >= 1.0:
        return step_at(1.0), 1.0
    low, high = 1e-6, 1.0
    for _ in range(60):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if given(mid) >= mid else (low, mid)
    return step_at(low), low


def startup_ms(f: LoaderFacts, workers: int, free_cores: float | None = None) -> float:
    """One epoch's worker start-up with `workers` workers (issue 35 item 3). Starting workers
    is CPU work the free cores share, so it grows with the count past them: measured (the
    first batch's wait over the steady one) with the run's workers and scaled from them;
    else modelled from the start method (fork, or spawn/forkserver: an interpreter, torch's
    import and the dataset's pickled bytes per worker) -- never a flat default."""
    free = max(1.0, free_cores if free_cores is not None else f.cores - f.others_cores)
    if f.workers and f.respawn > 0:
        return f.respawn * max(1.0, workers / free) / max(1.0, f.workers / free)
    t = f.t
    # (without workers the start method is not recorded; the dataset's pickled size is, where
    # the platform's default spawns: hooks/introspect.py)
    method = f.config.get("multiprocessing_context") or ("spawn" if f.config.get("dataset_pickled_bytes") else "fork")
    per_worker = t.worker_spawn_ms_fork if method == "fork" else t.worker_spawn_ms_spawn \
        + (f.config.get("dataset_pickled_bytes") or 0) / t.pickle_bytes_per_ms
    return per_worker * max(1.0, workers / free)


def _starts(f: LoaderFacts, config: dict, what_if: dict) -> int:
    """How many times the workers start: once when persistent (and the loader is built once),
    else every epoch."""
    built_once = not f.rebuilt or what_if.get("built_once")
    persistent = config.get("persistent_workers") or what_if.get("persistent_workers")
    return 1 if persistent and built_once else f.epochs


def _branch_step(f: LoaderFacts, config: dict, what_if: dict, cpu: bool) -> float:
    """The step under `config` with loading taken as CPU work (`cpu`) or as waiting."""
    scale = what_if.get("batch_scale", 1.0)
    before, after = f.config.get("batch_size"), config.get("batch_size")
    if isinstance(before, int) and isinstance(after, int) and before > 0:
        scale *= after / before
    load = f.load * what_if.get("load_scale", 1.0) * scale
    # On a GPU only the busy part of a step grows with the batch; launches and Python do not.
    busy = f.gpu_busy_fraction if f.gpu_busy_fraction is not None else 1.0
    # The time outside step() blocks is per step, whatever the batch (logging, checkpoints).
    compute = f.compute * (busy * scale + (1 - busy)) + f.other
    workers = config.get("num_workers") or 0
    # Workers idle for lack of shards (or of data) stay idle under any num_workers: only the
    # ones that served load.
    serving = workers if not f.idle_workers or what_if.get("resharded") else min(workers, f.active_workers)
    own_start = f.own_startup * f.epochs / max(1, f.steps)  # paid in any configuration
    if workers == 0:
        if f.loads_on_thread:  # the loading thread overlaps the loop, as one worker does
            return max(compute, load) + own_start
        return compute + load + own_start
    # `input_ms`: the workers' time per batch as measured per worker and handed over out of
    # order (rules.out_of_order), in place of the mean load spread over the workers.
    step = max(compute, what_if["input_ms"] if "input_ms" in what_if else load / serving)
    unmeasured = what_if.get("unmeasured_scale", 1.0)
    handover = what_if.get("handover_ms", f.transfer) * (1.0 if f.workers else unmeasured)
    others = what_if.get("others_cores", f.others_cores)
    # An epoch's start is the workers' start-up plus their first batch's load, which lighter
    # loading shortens too.
    if f.respawn:
        startup = max(0.0, startup_ms(f, workers) - f.load * (1 - what_if.get("load_scale", 1.0)))
    else:
        startup = startup_ms(f, workers) * unmeasured + load
    refill = load  # a persistent worker's first batch of an epoch
    if cpu and f.main_cpu_ms is not None:
        # The workers share the cores with each other, the training process and the
        # host's other processes (measured: measure_cpu_sharing).
        step, share = shared_cores_step(f, serving, load, compute, handover, others,
                                        what_if.get("others_as_threads", False))
        if not f.respawn:  # unmeasured: the start-up, then every worker's first batch at once,
            # both CPU work at the share of a core each thread gets
            startup = (startup_ms(f, workers, f.cores - others) * unmeasured + load * (f.thread_share or 1)) / share
        # CPU work at the share each thread gets, not at the share measured: each epoch's first
        # batch (all workers at once) and, where no run had workers, the hand-over (the
        # training process receiving a batch, unmeasured: a whole core's figure).
        refill = load * (f.thread_share or 1.0) / share
        if not f.workers:
            handover /= share
    elif cpu:
        step = max(step, load / f.cores)  # the workers share the host's cores
    prefetch = config.get("prefetch_factor") or 2
    current = f.config.get("prefetch_factor") or 2
    unabsorbed = 1.0 if prefetch <= current else max(
        0.0, 1 - (prefetch - current) / max(1, f.prefetch_needed - current))
    startup *= what_if.get("startup_scale", 1.0)  # a margin on start-up (worker_plan)
    starts = _starts(f, config, what_if)
    # An epoch whose workers did not start again still begins with an empty queue: its first
    # batch waits one load (persistent workers prefetch only once iter() is called).
    refills = refill * (f.epochs - starts) / max(1, f.steps)
    # `burst_scale`: the part of the bursts that stays (out of order, the head-of-line part goes).
    return step + handover + startup * starts / max(1, f.steps) + refills \
        + f.burst_excess * unabsorbed * what_if.get("burst_scale", 1.0) + own_start


def step_ms(f: LoaderFacts, config: dict, what_if: dict | None = None) -> float:
    """Predicted loop time per sample-equivalent batch (ms) under `config` (DataLoader
    arguments) and `what_if` (`load_scale`: loading cost kept; `batch_scale`: samples per
    step; `handover_ms`: the main process's share of each batch; `resharded`: every configured
    worker serves, as after resharding into enough shards, else no more than the workers that
    served do; `others_cores`: other processes' busy cores; `unmeasured_scale`: the unmeasured
    costs scaled; `input_ms`: the workers' time per batch, measured per worker; `burst_scale`:
    the part of the waits in bursts that remains; `startup_scale`: the workers' start-up
    scaled; `built_once`: a loader rebuilt every epoch built once instead). Divided by
    batch_scale, so ratios are per-sample speed-ups. Loading near the CPU-bound threshold gets
    the two models' steps blended by `cpu_weight` (issue 35 item 5)."""
    what_if = what_if or {}
    scale = what_if.get("batch_scale", 1.0)
    before, after = f.config.get("batch_size"), config.get("batch_size")
    if isinstance(before, int) and isinstance(after, int) and before > 0:
        scale *= after / before
    w = f.cpu_weight or 0.0
    if w >= 1.0:
        step = _branch_step(f, config, what_if, True)
    elif w <= 0.0:
        step = _branch_step(f, config, what_if, False)
    else:
        step = w * _branch_step(f, config, what_if, True) + (1 - w) * _branch_step(f, config, what_if, False)
    return step / scale


def speedup(f: LoaderFacts, config: dict, what_if: dict | None = None) -> float:
    """Measured step now over the predicted step after (both per sample). Where workers already
    load CPU-bound and the cores' sharing is modelled, the prediction after is taken relative to
    the same model's prediction of the configuration as it ran: the training process's measured
    CPU already holds part of each hand-over, and what the model gets wrong on both cancels
    instead of passing for a slow-down."""
    after = max(1e-9, step_ms(f, config, what_if))
    w = f.cpu_weight or 0.0
    if f.workers and w > 0 and f.main_cpu_ms is not None:
        present = {k: v for k, v in (what_if or {}).items() if k in ("others_cores", "unmeasured_scale")}
        # blended as the step is: the modelled present where the model is the shared cores'
        gain = (w * step_ms(f, f.config, present) + (1 - w) * f.step) / after
    else:
        gain = f.step / after
    return min(gain, ceiling(f, config, what_if))


def ceiling(f: LoaderFacts, config: dict, what_if: dict | None = None) -> float:
    """The most any change of loading can give, per sample: the wall step with no wait at all,
    wall / (wall - wait) (with a batch-size change, per sample of the larger batch)."""
    scale = (what_if or {}).get("batch_scale", 1.0)
    before, after = f.config.get("batch_size"), config.get("batch_size")
    if isinstance(before, int) and isinstance(after, int) and before > 0:
        scale *= after / before
    busy = f.gpu_busy_fraction if f.gpu_busy_fraction is not None else 1.0
    body_after = f.compute * (busy * scale + (1 - busy)) + f.other
    return f.step * scale / max(1e-9, body_after)


def speedup_range(f: LoaderFacts, config: dict, what_if: dict | None = None,
                  t: Thresholds = DEFAULT) -> tuple[float, float] | None:
    """(low, high) speed-up where the prediction rests on what one run cannot pin down, else
    None: for CPU-bound loading in workers, the host's other processes (low: their peak load
    all along; high: none) and the costs no run measured (the hand-over of a batch and the
    workers' start-up when the run had no workers: low twice, high half the default). Only
    when the ends are more than `range_min_spread` apart: a narrow range says nothing more
    than its point."""
    what_if = what_if or {}
    if not (config.get("num_workers") and f.cpu_busy and f.main_cpu_ms is not None):
        return None
    low = speedup(f, config, {**what_if, "others_cores": f.others_cores_max, "unmeasured_scale": 2.0})
    high = speedup(f, config, {**what_if, "others_cores": 0.0, "unmeasured_scale": 0.5})
    if f.others_threads is not None:  # the others' threads in this process's group, as measured
        high = max(high, speedup(f, config, {**what_if, "others_as_threads": True}))
    point = speedup(f, config, what_if)
    low, high = min(low, point), max(high, point)
    return (low, high) if high > low * (1 + t.range_min_spread) else None
