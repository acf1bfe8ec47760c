"""Diagnosis: the limiting factor and concrete DataLoader recommendations, with the evidence
and the predicted speedup. Pure functions over a summary, its loaders and the system overview.

The model behind every prediction: per batch the loop waits `wait` and computes `compute`.
Loading one batch costs `load` (ms, one worker). With N workers that overlap with compute, a
step takes about max(compute, load / N) -- and when loading is CPU-bound, the machine's cores
bound the work as well: max(..., cpu_work / cores). Speedup = step time now / step time after.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass

LIMITING_FACTORS = ("input_bound_cpu", "input_bound_io", "epoch_startup", "host_bound", "compute_bound")
DATALOADER_ARGS = ("batch_size", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
VALIDATION_NAMES = ("val", "valid", "validation", "eval", "test", "dev")


@dataclass(frozen=True)
class Thresholds:
    """Every number a rule compares against, in one place."""

    worker_headroom: float = 1.2          # workers = ceil(load / compute x this)
    cpu_busy_fraction: float = 0.5        # worker (or loading) CPU time / wall time: CPU-bound above
    iowait_high_pct: float = 20.0         # kernel iowait that marks storage-bound reads
    cpu_saturated_pct: float = 90.0       # machine CPU busy: more workers cannot help
    startup_share: float = 0.5            # epoch start-up share of all waiting: epoch_startup
    startup_min_ms: float = 20.0          # a first-batch wait this much over steady state is start-up
    spike_median_factor: float = 3.0      # a wait over 3x the median is a spike
    bursty_p99_factor: float = 4.0        # p99 over 4x p50: waits come in bursts
    max_prefetch_factor: int = 16
    shm_pressure_fraction: float = 0.8    # /dev/shm used over total
    ram_pressure_fraction: float = 0.1    # available RAM under this share of total
    swap_active_bytes_per_s: float = 1e6
    gpu_underused_pct: float = 70.0       # GPU utilization under this while not input-bound
    min_gain: float = 1.02                # predictions under 2% are not worth a recommendation
    worker_transfer_ms: float = 0.5       # handing a batch from a worker to the loop, when unmeasured
    worker_startup_ms: float = 60.0       # spawning the workers of one epoch, when unmeasured


DEFAULT = Thresholds()


def _rec(loader, parameter, current, suggested, reason, evidence, speedup) -> dict:
    return {"loader": loader, "parameter": parameter, "current": current, "suggested": suggested,
            "reason": reason, "evidence": evidence,
            "expected_speedup": round(max(1.0, speedup), 3) if speedup is not None else None}


def _usable_cores(system: dict | None, ranks: int) -> int:
    cores = (system or {}).get("cpu_count") or os.cpu_count() or 1
    return max(1, cores // max(1, ranks))


class LoaderFacts:
    """The measurements one loader's rules rely on, in ms per batch."""

    def __init__(self, part: dict, data, system: dict | None, t: Thresholds) -> None:
        self.name = part["name"]
        self.part = part
        self.config = part.get("config") or {}
        self.workers = self.config.get("num_workers")
        self.steps = part["steps"]
        totals = data.totals
        steps = max(1, totals.steps)
        self.compute = totals.compute_ns / steps / 1e6
        self.wait = (totals.wait_ns + totals.epoch_end_wait_ns) / steps / 1e6
        self.step = self.wait + self.compute
        self.epochs = max(1, totals.epochs)
        rec = data.records
        self.first_wait = rec.first_wait.total / rec.first_wait.count / 1e6 if rec and rec.first_wait.count else None
        steady = rec.steady_wait() if rec else None
        self.steady_wait = steady.total / steady.count / 1e6 if steady and steady.count else self.wait
        self.median_wait = (steady.quantile(0.5) or 0) / 1e6 if steady and steady.count else None
        self.p99_wait = (steady.quantile(0.99) or 0) / 1e6 if steady and steady.count else None
        self.epoch_end_wait = totals.epoch_end_wait_ns / self.epochs / 1e6
        # Sampled waits: the training thread's CPU time while it waited for a batch.
        self.probe_cpu_fraction = (totals.wait_probe_cpu_ns / totals.wait_probe_ns
                                   if totals.wait_probe_ns > 10_000_000 else None)
        self.cores = _usable_cores(system, len(part.get("ranks") or [0]))
        worker_info = ((system or {}).get("loaders") or {}).get(self.name) or {}
        self.worker_load = worker_info.get("worker_load_ms_mean")
        self.worker_cpu_fraction = worker_info.get("worker_cpu_fraction")
        self.system = system or {}
        # Per-batch load time on one worker.
        if self.workers == 0:
            self.load = self.steady_wait
        elif self.worker_load:
            self.load = self.worker_load
        else:  # saturated workers deliver one batch per (step time / workers)
            self.load = (self.workers or 1) * self.step
        self.cpu_busy = self._cpu_busy(t)
        # Handing over a ready batch (queue, pickling, shared memory): the wait that remains
        # when workers keep up. Measured when the queue was full, else a typical value.
        queue = worker_info.get("queue_depth_mean")
        # The workers deliver a batch at least as fast as the loop consumes one.
        self.workers_keep_up = bool(self.workers) and self.load / self.workers <= self.compute * 1.05
        if self.workers and queue and queue >= 1 and self.median_wait is not None:
            self.transfer = self.median_wait
        else:
            self.transfer = t.worker_transfer_ms
        measured_startup = (self.first_wait or 0) - self.steady_wait if self.workers else None
        self.startup = measured_startup if measured_startup and measured_startup > 0 else t.worker_startup_ms
        self.steps_per_epoch = max(1, self.steps / self.epochs)

    def _cpu_busy(self, t: Thresholds) -> bool | None:
        """Is loading CPU work (decoding, transforms) rather than waiting (reads, sleeps)?"""
        iowait = self.system.get("iowait_pct_mean")
        if iowait is not None and iowait >= t.iowait_high_pct:
            return False
        if self.workers and self.worker_cpu_fraction is not None:
            return self.worker_cpu_fraction >= t.cpu_busy_fraction
        if self.workers == 0 and self.probe_cpu_fraction is not None:
            return self.probe_cpu_fraction >= t.cpu_busy_fraction
        return None

    def step_after(self, workers: int, persistent: bool | None = None) -> float:
        """Predicted step time (ms) with `workers` workers, overlapping load and compute, plus
        the hand-over of each batch and the workers' start-up (once if persistent)."""
        step = max(self.compute, self.load / max(1, workers))
        if self.cpu_busy:
            # Loading and the loop share the cores (the loop's compute counts when it is CPU).
            step = max(step, (self.load + self.compute) / self.cores)
        persistent = self.config.get("persistent_workers") if persistent is None else persistent
        starts = 1 if persistent else self.epochs
        return step + self.transfer + self.startup * starts / max(1, self.steps)

    def epoch_overhead(self, workers: int) -> float:
        """Per-step share of worker start-up and join at epoch boundaries (ms). Persistent
        workers still start once: only the epochs after the first are saved."""
        if workers == 0 or self.config.get("persistent_workers"):
            return 0.0
        startup = max(0.0, (self.first_wait or 0) - self.steady_wait) if self.workers else 0.0
        per_epoch = startup + (self.epoch_end_wait if self.workers else 0.0)
        return per_epoch * (self.epochs - 1) / max(1, self.steps)

    def workers_needed(self, t: Thresholds) -> int:
        if self.compute <= 0:
            return max(1, self.cores - 1)
        return max(1, math.ceil(self.load / self.compute * t.worker_headroom))

    def evidence(self, **extra) -> dict:
        out = {"input_wait_fraction": self.part["input_wait_fraction"], "wait_ms_mean": round(self.wait, 3),
               "wait_cpu_fraction": round(self.probe_cpu_fraction, 3) if self.probe_cpu_fraction is not None else None,
               "worker_cpu_fraction": round(self.worker_cpu_fraction, 3) if self.worker_cpu_fraction is not None else None,
               "compute_ms_mean": round(self.compute, 3), "load_ms_per_batch": round(self.load, 3),
               "num_workers": self.workers, "usable_cores": self.cores}
        out.update(extra)
        return out


def _limiting_factor(facts: LoaderFacts, t: Thresholds) -> str:
    total_wait = facts.wait * facts.steps
    startup = ((facts.first_wait or 0) - facts.steady_wait) * facts.epochs + facts.epoch_end_wait * facts.epochs
    if facts.workers and not facts.config.get("persistent_workers") and total_wait > 0 \
            and startup / total_wait >= t.startup_share and (facts.first_wait or 0) - facts.steady_wait >= t.startup_min_ms:
        return "epoch_startup"
    return "input_bound_cpu" if facts.cpu_busy else "input_bound_io"


def _input_rules(facts: LoaderFacts, t: Thresholds, cuda: bool) -> list[dict]:
    recs: list[dict] = []
    name, cfg = facts.name, facts.config
    now = facts.step
    if facts.workers is None:  # not a DataLoader: only generic advice
        return [_rec(name, None, None, "DataLoader(num_workers>0)",
                     "data is produced on the training thread; move loading into DataLoader workers",
                     facts.evidence(), None)]
    factor = _limiting_factor(facts, t)
    cpu_saturated = (facts.system.get("cpu_pct_mean") or 0) >= t.cpu_saturated_pct
    respawn_ms = (facts.first_wait or 0) - facts.steady_wait
    if facts.workers and not cfg.get("persistent_workers") and facts.epochs > 1 and (
            factor == "epoch_startup" or respawn_ms >= t.startup_min_ms):
        # Workers respawned at every epoch: the first batch of each epoch waits for them.
        saved = facts.epoch_overhead(facts.workers)
        recs.append(_rec(name, "persistent_workers", False, True,
                         f"workers are respawned every epoch: each epoch starts with a "
                         f"{facts.first_wait:.0f} ms wait for the first batch",
                         facts.evidence(first_batch_wait_ms=round(facts.first_wait or 0, 1),
                                        steady_wait_ms=round(facts.steady_wait, 3), epochs=facts.epochs),
                         now / max(1e-9, now - saved)))
    if facts.workers_keep_up:
        # The prefetch queue was full: more or lighter workers cannot help; what is left is the
        # hand-over of each batch to the loop (bursts are handled below).
        needed = facts.workers
    else:
        needed = facts.workers_needed(t)
    capped = needed
    if facts.cpu_busy:
        capped = min(needed, facts.cores)
    if facts.workers == 0 or capped > facts.workers:
        suggested = capped if facts.workers == 0 else max(capped, facts.workers + 1)
        after = facts.step_after(suggested, persistent=facts.epochs > 1 or cfg.get("persistent_workers"))
        kind = "CPU work (decoding, transforms)" if facts.cpu_busy else "waiting (reads, latency)"
        reason = (f"loading a batch takes {facts.load:.1f} ms of {kind} against {facts.compute:.1f} ms "
                  f"of compute; {suggested} workers keep up (ceil(load / compute x {t.worker_headroom}) = {needed}"
                  + (f", capped at {capped} by {facts.cores} usable cores" if capped < needed else "") + ")")
        if facts.workers == 0:
            reason = "num_workers=0 loads every batch on the training thread: " + reason
        if now / after >= t.min_gain:  # only the throughput rules can predict a negligible gain
            recs.append(_rec(name, "num_workers", facts.workers, suggested, reason,
                             facts.evidence(workers_needed=needed, cpu_bound_loading=facts.cpu_busy), now / after))
        if facts.workers == 0 and facts.epochs > 1:
            recs.append(_rec(name, "persistent_workers", False, True,
                             "with workers, keep them alive between epochs instead of respawning them",
                             facts.evidence(epochs=facts.epochs), 1.0))
        if cuda and not cfg.get("pin_memory"):
            recs.append(_rec(name, "pin_memory", False, True,
                             "page-locked batches let .to('cuda', non_blocking=True) overlap the copy",
                             facts.evidence(), None))
    elif facts.cpu_busy and not facts.workers_keep_up:
        # CPU-bound loading with no core left for another worker: only lighter work helps.
        if facts.workers > facts.cores and cpu_saturated:
            recs.append(_rec(name, "num_workers", facts.workers, facts.cores,
                             f"the CPU is saturated ({facts.system.get('cpu_pct_mean'):.0f}% busy) by "
                             f"{facts.workers} CPU-bound workers on {facts.cores} cores: more workers cannot "
                             f"help; fewer avoid thrashing and save RAM",
                             facts.evidence(cpu_pct_mean=facts.system.get("cpu_pct_mean")), 1.0))
        recs.append(_rec(name, None, None, "gpu_transforms",
                         "the transforms are the limit: make them lighter, precompute them, or run them on "
                         "the GPU (e.g. torchvision.transforms.v2 on CUDA tensors, NVIDIA DALI)",
                         facts.evidence(cpu_pct_mean=facts.system.get("cpu_pct_mean")), None))
    # Bursty waits although the workers keep up on average: a deeper prefetch queue absorbs them.
    if facts.workers and facts.median_wait is not None and facts.p99_wait is not None \
            and facts.p99_wait > t.bursty_p99_factor * max(facts.median_wait, 0.05) \
            and facts.load / facts.workers <= facts.compute * 1.05 and not any(r["parameter"] == "num_workers" for r in recs):
        prefetch = cfg.get("prefetch_factor") or 2
        excess = max(0.0, facts.steady_wait - facts.median_wait)
        suggested = min(t.max_prefetch_factor, max(prefetch * 2, math.ceil(prefetch * facts.p99_wait / max(facts.compute, 1e-3))))
        if suggested > prefetch and now / max(1e-9, now - excess) >= t.min_gain:
            recs.append(_rec(name, "prefetch_factor", prefetch, suggested,
                             f"waits come in bursts (p99 {facts.p99_wait:.1f} ms vs median {facts.median_wait:.2f} ms) "
                             f"while the workers keep up on average; a deeper queue absorbs them",
                             facts.evidence(wait_p50_ms=round(facts.median_wait, 3), wait_p99_ms=round(facts.p99_wait, 3)),
                             now / max(1e-9, now - excess)))
    if facts.system.get("iowait_pct_mean") is not None and facts.system["iowait_pct_mean"] >= t.iowait_high_pct:
        recs.append(_rec(name, None, None, "faster_storage",
                         f"reads are the limit (iowait {facts.system['iowait_pct_mean']:.0f}%): use a sequential "
                         f"shard format (WebDataset, LMDB, TFRecord) or copy the data to local NVMe",
                         facts.evidence(iowait_pct_mean=facts.system["iowait_pct_mean"]), None))
    return recs


def _pressure_rules(facts: LoaderFacts, t: Thresholds) -> list[dict]:
    s, cfg = facts.system, facts.config
    if not facts.workers:
        return []
    shm_used, shm_total = s.get("shm_used_max_bytes"), s.get("shm_total_bytes")
    mem_min, mem_total = s.get("mem_available_min_bytes"), s.get("mem_total_bytes")
    swapping = (s.get("swap_in_bytes_per_s_mean") or 0) + (s.get("swap_out_bytes_per_s_mean") or 0) \
        >= t.swap_active_bytes_per_s
    shm_pressure = bool(shm_used and shm_total and shm_used / shm_total >= t.shm_pressure_fraction)
    ram_pressure = bool(mem_min is not None and mem_total and mem_min / mem_total <= t.ram_pressure_fraction)
    if not (shm_pressure or ram_pressure or swapping):
        return []
    what = ("/dev/shm is {:.0f}% full (the classic 'Bus error')".format(100 * shm_used / shm_total)
            if shm_pressure else "RAM is nearly exhausted" if ram_pressure else "the machine is swapping")
    evidence = facts.evidence(shm_used_max_bytes=shm_used, shm_total_bytes=shm_total,
                              mem_available_min_bytes=mem_min, swapping=swapping)
    prefetch = cfg.get("prefetch_factor") or 2
    if prefetch > 2:
        return [_rec(facts.name, "prefetch_factor", prefetch, 2,
                     f"{what}: every prefetched batch lives in shared memory; a shallower queue "
                     f"({facts.workers} x 2 batches) keeps the throughput the workers already have",
                     evidence, 1.0)]
    return [_rec(facts.name, "num_workers", facts.workers, max(1, facts.workers // 2),
                 f"{what}: each worker holds batches in shared memory and its own copy of the dataset",
                 evidence, 1.0)]


def diagnose(summary: dict, loaders, *, system=None, previous=None, thresholds: Thresholds = DEFAULT) -> None:
    """Fill `verdict.limiting_factor`, `recommendations` and `verification` of a summary."""
    t = thresholds
    by_name = {d.name: d for d in loaders}
    cuda = summary["verdict"].get("gpu_idle_fraction") is not None or bool((system or {}).get("gpu_samples"))
    facts = [LoaderFacts(part, by_name[part["name"]], system, t) for part in summary["loaders"]
             if part["name"] in by_name and part["steps"] > 0]
    recs: list[dict] = []
    starved = [f for f in facts if f.part["verdict"] in ("moderate", "high")]
    for f in facts:
        if f in starved:
            recs.extend(_input_rules(f, t, cuda))
        recs.extend(_pressure_rules(f, t))
    for f in facts:
        if f.name.lower() in VALIDATION_NAMES or (len(facts) > 1 and f is not facts[0] and f in starved):
            for r in recs:
                if r["loader"] == f.name and r["parameter"] == "num_workers":
                    r["reason"] += ("; validation loaders can use their own settings, apart from "
                                    "the training loader's")
    gpu_util = (system or {}).get("gpu_util_mean")
    if starved:
        worst = max(starved, key=lambda f: f.part["input_wait_fraction"] or 0)
        summary["verdict"]["limiting_factor"] = _limiting_factor(worst, t) if worst.workers is not None \
            else "input_bound_io"
    elif facts and summary["verdict"]["input_bound"] != "insufficient_data":
        host_bound = gpu_util is not None and gpu_util < t.gpu_underused_pct
        summary["verdict"]["limiting_factor"] = "host_bound" if host_bound else "compute_bound"
        if host_bound:
            main = facts[0]
            recs.append(_rec(main.name, "batch_size", main.config.get("batch_size"),
                             (main.config.get("batch_size") or 1) * 2 if main.config.get("batch_size") else None,
                             f"the GPU is {gpu_util:.0f}% busy while the loop hardly waits for data: larger "
                             f"batches (or CUDA graphs, torch.compile, fewer small kernels) cut launch overhead",
                             main.evidence(gpu_util_mean=gpu_util), None))
    recs.sort(key=lambda r: -(r["expected_speedup"] or 0))
    summary["recommendations"] = _valid_together(recs)
    summary["verification"] = verify(previous, summary) if previous else None


def _valid_together(recs: list[dict]) -> list[dict]:
    """prefetch_factor and persistent_workers need num_workers > 0: never suggest them alone for
    a loader whose workers stay at 0."""
    out = []
    for r in recs:
        if r["parameter"] in ("prefetch_factor", "persistent_workers"):
            workers = next((x for x in recs if x["loader"] == r["loader"] and x["parameter"] == "num_workers"), None)
            current = r["evidence"].get("num_workers")
            if not current and (workers is None or not workers["suggested"]):
                continue
        out.append(r)
    return out


def applied_config(config: dict | None, recs: list[dict], loader: str) -> dict:
    """The DataLoader keyword arguments after applying a loader's recommendations."""
    out = {k: v for k, v in (config or {}).items() if k in DATALOADER_ARGS}
    for r in recs:
        if r["loader"] == loader and r["parameter"] in DATALOADER_ARGS:
            out[r["parameter"]] = r["suggested"]
    if not out.get("num_workers"):
        out.pop("prefetch_factor", None)
        out["persistent_workers"] = False
    elif out.get("prefetch_factor") is None:
        out.pop("prefetch_factor", None)
    return out


def verify(previous: dict, current: dict) -> dict | None:
    """Verify after change: was each earlier recommendation applied, and did it pay off?"""
    prev_loaders = {l["name"]: l for l in previous.get("loaders", [])}
    results, changed = [], {}
    for loader in current.get("loaders", []):
        old = prev_loaders.get(loader["name"])
        if old is None:
            continue
        for key in sorted(set(old.get("config") or {}) | set(loader.get("config") or {})):
            a, b = (old.get("config") or {}).get(key), (loader.get("config") or {}).get(key)
            if a != b:
                changed.setdefault(loader["name"], {})[key] = [a, b]
    if not changed:
        return None
    for rec in previous.get("recommendations", []):
        now = next((l for l in current["loaders"] if l["name"] == rec["loader"]), None)
        old = prev_loaders.get(rec["loader"])
        applied = now is not None and rec["parameter"] is not None and \
            (now.get("config") or {}).get(rec["parameter"]) == rec["suggested"]
        measured = None
        if now is not None and old is not None and now.get("batches_per_s") and old.get("batches_per_s"):
            measured = now["batches_per_s"] / old["batches_per_s"]
        if not applied:
            status = "not_applied"
        elif rec.get("expected_speedup") and measured is not None:
            gain_needed = 1 + 0.5 * (rec["expected_speedup"] - 1)
            status = "confirmed" if measured >= gain_needed else "refuted"
        else:
            status = "confirmed" if measured is not None and measured >= 0.95 else "refuted"
        results.append({"loader": rec["loader"], "parameter": rec["parameter"], "suggested": rec["suggested"],
                        "applied": applied, "expected_speedup": rec.get("expected_speedup"),
                        "measured_speedup": round(measured, 3) if measured is not None else None,
                        "wait_fraction_before": old.get("input_wait_fraction") if old else None,
                        "wait_fraction_after": now.get("input_wait_fraction") if now else None,
                        "status": status})
    # Changes applied to one loader in the same run share one measured speed-up: say so.
    for r in results:
        r["applied_together"] = [f"{o['parameter']}={o['suggested']!r}" for o in results
                                 if o is not r and o["applied"] and r["applied"] and o["loader"] == r["loader"]]
    return {"previous_run": previous["run"]["id"], "changed": changed, "results": results}


def joint_changes_note(verification: dict | None) -> list[str]:
    """One sentence per loader whose applied changes share one measured speed-up."""
    groups: dict[str, list[str]] = {}
    for r in (verification or {}).get("results", []):
        if r["applied"] and r.get("applied_together"):
            groups.setdefault(r["loader"], []).append(f"{r['parameter']}={r['suggested']!r}")
    return [f"{loader}: {', '.join(changes)} were applied together; the measured speed-up is theirs "
            f"jointly, each judged against its own expectation." for loader, changes in groups.items()]


def thresholds_dict(t: Thresholds = DEFAULT) -> dict:
    return asdict(t)
