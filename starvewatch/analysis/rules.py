"""The diagnosis rules, one function each, listed in `RULES`: read one rule in one place.

A rule looks at one loader's facts (`model.LoaderFacts`) and proposes advice:
- `kind="speedup"`: a value that buys throughput. The engine predicts its gain with the one
  model (`model.step_ms`) over the changed configuration, or over `what_if` factors for advice
  that is not a DataLoader argument.
- `kind="protective"`: an upper bound that removes a risk (memory, thrashing) and buys no
  speed. When a speed-up and a bound name the same setting, the engine keeps one answer: the
  largest value within every bound.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from .throughput_model import LoaderFacts, Thresholds, speedup
from .sentences import plural


def proposal(f: LoaderFacts, parameter, suggested, reason: str, evidence: dict, *, kind="speedup",
             risk=None, what_if=None, also=None) -> dict:
    """`also`: DataLoader arguments that go with this change (workers with persistent_workers
    for a loader iterated often): predicted, shown and applied together with it."""
    out = {"loader": f.name, "parameter": parameter,
           "current": f.config.get(parameter) if parameter else None, "suggested": suggested,
           "reason": reason, "evidence": evidence, "kind": kind, "risk": risk, "what_if": what_if}
    if also:
        out["also"] = also
    return out


def worker_plan(f: LoaderFacts, t: Thresholds, most: int) -> tuple[int, dict, dict] | None:
    """(workers, `also`, what_if) that pays best for up to `most` workers, never more than
    `t.max_workers` (issue 35 item 3):
    each count predicted with its start-up (which grows with the count), paired with
    persistent_workers=True where the loader is iterated more than once (and, where it is
    rebuilt every epoch, built once); the fewest workers within 2% of the best gain, so a short
    epoch never gets more workers than it amortises. None when no count pays `min_gain`."""
    also, what_if = {}, {}
    if f.epochs >= 2 and not f.config.get("persistent_workers"):
        also["persistent_workers"] = True
    if f.rebuilt:
        what_if["built_once"] = True
        also["persistent_workers"] = True
    # Judged with the loading `worker_headroom` slower than measured (the margin the count's
    # rule keeps for a slow spell), so a count that only just keeps up does not win a tie, and
    # with the start-up `startup_margin` longer: starting workers on a busy host takes longer
    # than the cores alone say (7 workers for one 75-batch epoch under load promised 1.32x,
    # measured 0.93x).
    margin = {**what_if, "load_scale": t.worker_headroom, "startup_scale": t.startup_margin}
    # Each count is one prediction: bounded by `max_workers`, whatever the load over the compute.
    most = min(max(1, most), t.max_workers)
    gains = {n: speedup(f, {**f.config, "num_workers": n, **also}, margin) for n in range(1, most + 1)}
    best = max(gains.values())
    chosen = min(n for n, g in gains.items() if g >= best / 1.005)
    if speedup(f, {**f.config, "num_workers": chosen, **also}, what_if) < t.min_gain:
        return None
    return chosen, also, what_if


def _all_startup(f: LoaderFacts, t: Thresholds) -> bool:
    """The wait is (nearly) all the epoch's own start (a first batch that opens files): no
    steady-state loading for workers to take over."""
    total = f.wait * f.steps
    return total > 0 and f.own_startup * f.epochs >= (1 - 0.1) * total


def not_a_dataloader(f: LoaderFacts, t: Thresholds, ctx: dict) -> list[dict]:
    """Batches made on the training thread by a plain iterable: move loading into workers,
    each worker reading its own part (an iterable yields everything in every worker unless
    it shards by get_worker_info()). Not when the whole wait is the iterable's own start."""
    if f.workers is not None or _all_startup(f, t):
        return []
    plan = worker_plan(f, t, f.workers_needed(t))
    if plan is None:
        return []
    needed = plan[0]
    return [proposal(f, None, f"DataLoader(num_workers={needed})",
                     f"batches are produced on the training thread ({f.load:.1f} ms each against "
                     f"{f.compute:.1f} ms of compute); wrap the data in a DataLoader with {plural(needed, 'worker')}"
                     f"; an IterableDataset must give each worker its own part "
                     f"(torch.utils.data.get_worker_info(): shard by info.id of info.num_workers), "
                     f"or every worker yields every sample",
                     f.evidence(workers_needed=needed, first_batch_wait_ms=round(f.first_wait or 0, 1)),
                     what_if={"num_workers": needed})]


def more_workers(f: LoaderFacts, t: Thresholds, ctx: dict) -> list[dict]:
    """Workers do not keep up: size them as ceil(load / compute x headroom). Loading that is CPU
    work is capped by the cores of this rank's share of the host; loading that waits (reads,
    latency) is not, however busy the host (a sleeping worker takes no core): between the
    two, blended by how surely the loading is CPU work. Then the count that pays best with its
    start-up (worker_plan). Not when the wait is the main process's own share (see
    main_process_share), nor when storage is (see faster_storage)."""
    if f.workers is None or f.workers_keep_up or f.main_bound or f.storage_bound or _all_startup(f, t):
        return []
    needed = f.workers_needed(t)
    # Loading of unknown kind (no CPU measured) on a saturated CPU is capped as CPU work would be.
    w = f.cpu_weight if f.cpu_weight is not None else (1.0 if f.host_cpu_saturated else 0.0)
    capped = round(w * min(needed, f.cores) + (1 - w) * needed)
    plan = worker_plan(f, t, capped) if capped > (f.workers or 0) else None
    if plan is None or plan[0] <= f.workers:
        return []
    chosen, also, what_if = plan
    kind = "CPU work (decoding, transforms)" if f.cpu_busy else "waiting (reads, latency)"
    where = ""
    if f.loads_on_thread:
        where = (f"a thread of the training process loads (its CPU {f.thread_cpu_fraction:.0%} while the loop "
                 f"waits: a thread loader or prefetch thread); worker processes load beside it (a thread "
                 f"loader's own num_workers, or a DataLoader's): ")
    elif f.workers == 0:
        where = "num_workers=0 loads every batch on the training thread: "
    reason = (f"{where}loading a batch takes {f.load:.1f} ms of {kind} against {f.compute:.1f} ms of compute; "
              f"{plural(chosen, 'worker')} keep up (ceil(load / compute x {t.worker_headroom}) = {needed}"
              + (f", capped at {capped} by {f.cores} usable cores" if capped < needed else "")
              + (f"; {chosen} pay for their start-up best" if chosen < capped else "") + ")")
    if also.get("persistent_workers"):
        reason += ("; with persistent_workers=True, built once before the epoch loop: the loader is rebuilt "
                   "every epoch now" if f.rebuilt else
                   f"; with persistent_workers=True: the loader is iterated {f.epochs} times and would start its "
                   f"workers each time")
    return [proposal(f, "num_workers", chosen, reason,
                     f.evidence(workers_needed=needed, cpu_bound_loading=f.cpu_busy),
                     what_if=what_if or None, also=also or None)]


def main_process_share(f: LoaderFacts, t: Thresholds, ctx: dict) -> list[dict]:
    """With workers, the wait is the training process's own work (receiving and rebuilding
    batches from shared memory), not workers loading: more workers cannot help; lighter
    batches (fewer, larger tensors) do."""
    if not f.main_bound:
        return []
    return [proposal(f, None, "lighter_batches",
                     f"the training process spends {f.main_share:.1f} ms per batch receiving and rebuilding it "
                     f"from the workers ({f.main_share / max(f.steady_wait, 1e-9):.0%} of its wait); more workers "
                     f"would not help: return fewer, larger tensors (stack a sample's fields, no lists of "
                     f"small tensors), a lighter collate_fn, smaller dtypes",
                     f.evidence(main_share_ms=round(f.main_share, 3), worker_load_ms=round(f.load, 3)),
                     what_if={"handover_ms": t.worker_transfer_ms})]


def lighter_transforms(f: LoaderFacts, t: Thresholds, ctx: dict) -> list[dict]:
    """CPU-bound loading with every usable core already loading: more workers cannot help;
    only less CPU work per batch does. Predicted as if the CPU part of loading left the host."""
    if not f.workers or not f.cpu_busy or f.workers_keep_up or f.active_workers < f.cores:
        return []
    # The share of a fetch the transforms account for: its CPU time over its wall time; on a
    # saturated host the rest is waiting for a core, caused by the CPU work as well.
    cpu_share = 1.0 if f.cores_saturated or f.worker_cpu_fraction is None else f.worker_cpu_fraction
    return [proposal(f, None, "gpu_transforms",
                     f"the transforms are the limit ({plural(f.active_workers, 'CPU-bound worker')} on {plural(f.cores, 'core')}, "
                     f"{f.load:.1f} ms a batch): make them lighter, precompute them, or run them on the GPU "
                     f"(torchvision.transforms.v2 on CUDA tensors, NVIDIA DALI)",
                     f.evidence(cpu_pct=f.system.get("cpu_pct_mean")),
                     what_if={"load_scale": round(1 - cpu_share, 3)})]


def cpu_oversubscribed(f: LoaderFacts, t: Thresholds, ctx: dict) -> list[dict]:
    """More CPU-bound workers than cores on a saturated CPU (the host's, or the cores the
    workers fill themselves): they thrash and hold RAM."""
    if not f.workers or not f.cpu_busy or f.active_workers <= f.cores or not f.cores_saturated:
        return []
    host_pct = f.system.get("cpu_pct_mean")
    why = ([f"{host_pct:.0f}% busy"] if host_pct is not None else []) + \
        ([f"the workers' loading alone uses {f.worker_cpu_fraction * f.active_workers:.1f} cores"]
         if f.loading_saturates_cores else [])
    return [proposal(f, "num_workers", f.cores,
                     f"{plural(f.active_workers, 'CPU-bound worker')} share {plural(f.cores, 'core')} on a saturated CPU ({', '.join(why)})",
                     f.evidence(cpu_pct=f.system.get("cpu_pct_mean")), kind="protective",
                     risk="workers beyond the cores thrash the CPU caches and each holds its own copy of the dataset")]


def build_once(f: LoaderFacts, t: Thresholds, ctx: dict) -> list[dict]:
    """A DataLoader built anew every epoch (a new loader object at the same call site over the
    same dataset, hooks/session.py) starts its workers every epoch whatever persistent_workers
    says: build it once, before the epoch loop, with persistent_workers=True (issue 35 item 2)."""
    if not f.workers or not f.rebuilt or f.respawn < t.startup_min_ms:
        return []
    rebuilds = f.rebuilds
    return [proposal(f, None, "build_once",
                     f"the DataLoader is built anew every epoch ({rebuilds + 1} loader objects at one call site over "
                     f"one dataset): each epoch pays {f.respawn:.0f} ms of worker start-up (first batch "
                     f"{f.first_wait:.0f} ms against {f.steady_wait:.1f} ms steady); build it once, before the epoch "
                     f"loop, with persistent_workers=True",
                     f.evidence(startup_per_epoch_ms=round(f.respawn, 1), epochs=f.epochs,
                                first_batch_wait_ms=round(f.first_wait or 0, 1)),
                     what_if={"built_once": True, "persistent_workers": True})]


def persistent_workers(f: LoaderFacts, t: Thresholds, ctx: dict) -> list[dict]:
    """Workers respawned at every epoch, and the first batch of each epoch waits for them.
    Not for a loader rebuilt every epoch: persistent_workers alone keeps nothing (build_once)."""
    if not f.workers or f.config.get("persistent_workers") or f.epochs < 2 or f.respawn < t.startup_min_ms \
            or f.rebuilt:
        return []
    return [proposal(f, "persistent_workers", True,
                     f"workers are respawned every epoch: each epoch starts with a {f.first_wait:.0f} ms "
                     f"wait for the first batch",
                     f.evidence(first_batch_wait_ms=round(f.first_wait or 0, 1),
                                steady_wait_ms=round(f.steady_wait, 3), epochs=f.epochs))]


def deeper_prefetch(f: LoaderFacts, t: Thresholds, ctx: dict) -> list[dict]:
    """Bursty waits while the workers keep up on average: a deeper queue absorbs them."""
    prefetch = f.config.get("prefetch_factor") or 2
    if not f.bursty or not f.workers_keep_up or f.prefetch_needed <= prefetch:
        return []
    from .findings.head_of_line import MIN_SHARE, skew
    attribution = f.part.get("attribution")
    if attribution and attribution["head_of_line_share"] >= MIN_SHARE:
        # In order, the slowest worker paces every round (its batch time over the workers).
        # Where that pace is slower than the loop's body, the "bursts" are one slow worker's
        # pace: a deeper queue waits for it too. Where the slowest worker still keeps up on
        # average (one hang, a few slow items on one worker), the waits are bursts a deeper
        # queue absorbs (a one-off 2 s hang: 16 deep measured 1.22x).
        paced = skew(attribution)
        if paced is None or paced["in_order_ms"] > f.body * 1.05:
            return []
    # Workers started every epoch: the waits after each start are the start-up's (the workers
    # come up one after another), which no deeper queue absorbs (seen on a loader rebuilt
    # every epoch: 16 deep promised 1.34x, measured 1.05x).
    restarts = f.rebuilt or not f.config.get("persistent_workers")
    if restarts and f.epochs >= 2 and f.respawn >= t.startup_min_ms \
            and f.respawn * f.epochs >= t.startup_share * f.wait * f.steps:
        return []
    return [proposal(f, "prefetch_factor", f.prefetch_needed,
                     f"waits come in bursts (p99 {f.p99_wait:.1f} ms vs median {f.median_wait:.2f} ms) while "
                     f"the workers keep up on average; a deeper queue absorbs them",
                     f.evidence(wait_p50_ms=round(f.median_wait, 3), wait_p99_ms=round(f.p99_wait, 3)))]


def pin_memory(f: LoaderFacts, t: Thresholds, ctx: dict) -> list[dict]:
    """With CUDA, page-locked batches let the host-to-device copy overlap compute."""
    if not ctx["cuda"] or f.config.get("pin_memory") or f.workers is None:
        return []
    return [proposal(f, "pin_memory", True,
                     "page-locked batches let .to('cuda', non_blocking=True) overlap the copy with compute",
                     f.evidence(), kind="protective",
                     risk="pageable host memory makes every host-to-device copy synchronous (its gain is "
                          "not measured here, so none is claimed)")]


def faster_storage(f: LoaderFacts, t: Thresholds, ctx: dict) -> list[dict]:
    """High iowait: the reads themselves are the limit, and more workers only queue more reads
    behind them. Predicted as if reads cost nothing: the CPU part of loading stays."""
    if not f.storage_bound:
        return []
    iowait = f.system["iowait_pct_mean"]
    cpu_share = f.worker_cpu_fraction if f.workers else f.probe_cpu_fraction
    read_rate = f.system.get("disk_read_bytes_per_s_mean")
    return [proposal(f, None, "faster_storage",
                     f"reads are the limit (iowait {iowait:.0f}%: the readers are blocked on storage"
                     + (f" reading {read_rate / 2**20:.0f} MiB/s" if read_rate else "")
                     + "); more workers would queue more reads behind them: use a sequential shard format "
                     "(WebDataset, LMDB, TFRecord), copy the data to local NVMe, or cache it in RAM "
                     "(`starvewatch tune` measures whether more workers help anyway)",
                     f.evidence(iowait_pct=round(iowait, 1), disk_read_bytes_per_s=read_rate),
                     what_if={"load_scale": round(cpu_share or 0.0, 3)})]


def _deepest(fits, low: int, high: int) -> int | None:
    """The largest depth in [low, high] that `fits` (which holds up to some depth and not past
    it), by bisection: a stored prefetch_factor can be any 64-bit number, and trying each depth
    below it once kept a summary from ever finishing."""
    if high < low or not fits(low):
        return None
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


def memory_budget(f: LoaderFacts, t: Thresholds, ctx: dict) -> list[dict]:
    """Workers must fit in free RAM and free /dev/shm less a reserve: each holds its own memory
    and prefetch_factor batches in shared memory. Bounds num_workers (or prefetch_factor)."""
    if not f.workers:
        return []
    s, keep = f.system, 1 - t.memory_reserve_fraction
    prefetch = f.config.get("prefetch_factor") or 2
    per_worker = f.worker_info.get("worker_mem_bytes_max")
    shm_max, shm_min, shm_total = s.get("shm_used_max_bytes"), s.get("shm_used_min_bytes"), s.get("shm_total_bytes")
    # Only the workers that serve fill /dev/shm with their prefetched batches; the plan below
    # counts every configured worker (each would, once resharding gives it data).
    batch_bytes = (shm_max - shm_min) / (f.active_workers * prefetch) \
        if shm_max is not None and shm_min is not None and shm_max > shm_min else None
    ram_budget = keep * (s["mem_available_min_bytes"] + f.workers * per_worker) \
        if per_worker and s.get("mem_available_min_bytes") is not None else None
    shm_budget = keep * (shm_total - shm_min) if batch_bytes and shm_total else None

    def fit(depth: int) -> int | None:
        limits = ([math.floor(ram_budget / per_worker)] if ram_budget is not None else []) + \
                 ([math.floor(shm_budget / (depth * batch_bytes))] if shm_budget is not None else [])
        return min(limits) if limits else None

    evidence = f.evidence(worker_mem_bytes=per_worker, batch_bytes=round(batch_bytes) if batch_bytes else None,
                          mem_available_min_bytes=s.get("mem_available_min_bytes"), shm_total_bytes=shm_total,
                          shm_used_max_bytes=shm_max, memory_reserve_fraction=t.memory_reserve_fraction)
    risk = "workers beyond the memory budget get killed (OOM) or crash with 'Bus error' when /dev/shm fills"
    fits = fit(prefetch)
    if fits is None:
        return []
    if fits >= f.workers:  # an upper bound for the speed-up rules, shown only if it binds
        return [proposal(f, "num_workers", fits, f"memory allows at most {plural(fits, 'worker')}", evidence,
                         kind="protective", risk=risk)]
    depth = _deepest(lambda d: (fit(d) or 0) >= f.workers, 2, prefetch - 1)
    if depth is not None:
        return [proposal(f, "prefetch_factor", depth,
                         f"{plural(f.workers, 'worker')} x {prefetch} prefetched batches of {batch_bytes / 2**20:.1f} MiB "
                         f"exceed the /dev/shm budget ({shm_budget / 2**20:.0f} MiB: free less "
                         f"{t.memory_reserve_fraction:.0%}); {depth} deep fits and keeps the workers",
                         evidence, kind="protective", risk=risk)]
    return [proposal(f, "num_workers", max(1, fits),
                     f"{plural(f.workers, 'worker')} do not fit the memory budget (free RAM and /dev/shm less "
                     f"{t.memory_reserve_fraction:.0%}); {max(1, fits)} do", evidence, kind="protective", risk=risk)]


def larger_batches(f: LoaderFacts, t: Thresholds, ctx: dict) -> list[dict]:
    """The GPU is underused while the loop hardly waits: larger batches amortise the launch
    overhead. Loaders that do their own batching keep it: the advice names their batcher."""
    util = f.system.get("gpu_util_mean")
    batch = f.config.get("batch_size")
    # Only with measured memory headroom (issue 35 item 6): the GPU's peak use, doubled, within
    # 90% of its memory; and the learning rate goes with the batch.
    used, total = f.system.get("gpu_mem_used_max_bytes"), f.system.get("gpu_mem_total_bytes")
    if not used or not total or used * 2 > t.batch_memory_fraction * total:
        return []
    reason = (f"the GPU is {util:.0f}% busy while the loop hardly waits for data: larger batches (or CUDA "
              f"graphs, torch.compile, fewer small kernels) cut launch overhead; its memory allows twice the "
              f"batch ({used / 2**30:.1f} of {total / 2**30:.1f} GiB used at peak, x2 within "
              f"{t.batch_memory_fraction:.0%}); twice the batch changes the optimisation: scale the learning rate "
              f"with it (x2, linear scaling, with warm-up) or re-tune it, and expect half the optimizer steps per epoch")
    evidence = f.evidence(gpu_util_pct=util, gpu_mem_used_max_bytes=used, gpu_mem_total_bytes=total)
    if batch:
        return [proposal(f, "batch_size", batch * 2, reason, evidence)]
    batcher = f.config.get("batch_sampler")
    where = f"your batch_sampler ({batcher})" if batcher else "your dataset (batch_size=None: it yields batches)"
    return [proposal(f, None, "larger_batches", f"{reason}; make {where} yield twice the samples per batch",
                     evidence, what_if={"batch_scale": 2})]


@dataclass(frozen=True)
class Rule:
    name: str
    when: str          # "starved": the loader waits; "any": every loader; "host_bound": the run
    propose: Callable[[LoaderFacts, Thresholds, dict], list[dict]]


def out_of_order(f: LoaderFacts, t: Thresholds, ctx: dict) -> list[dict]:
    """Head-of-line blocking (findings/head_of_line.py) where torch has in_order (2.6+) and the
    sampling makes the order free: hand batches over as they are ready. Predicted from the
    measured per-worker batch times: the input time per batch becomes 1 / (sum of the
    workers' rates) instead of the slowest worker's pace."""
    from .findings.head_of_line import MIN_SHARE, order_free, skew
    a = f.part.get("attribution")
    if not a or f.config.get("in_order") is not True or a["head_of_line_share"] < MIN_SHARE \
            or not order_free(f.config):
        return []
    s = skew(a)
    if s is None:
        return []
    worker = max(a["workers"], key=lambda w: w["head_of_line_ms"])["worker"]
    reason = (f"the loop waited for worker {worker} ({s['slowest_ms']:.1f} ms a batch against "
              f"{s['fastest_ms']:.1f} ms for the fastest) while later batches were ready, "
              f"{100 * a['head_of_line_share']:.0f}% of the wait; in_order=False hands over whichever batch is "
              f"ready. Batches then arrive out of sampler order (torch warns this can skew the data "
              f"distribution with imbalanced data) and are no longer assigned to workers in turn")
    return [proposal(f, "in_order", False, reason,
                     f.evidence(head_of_line_share=round(a["head_of_line_share"], 4),
                                worker_batch_ms=[round(ms, 3) if ms else None for ms in a["worker_batch_ms"]]),
                     # The bursts a slow worker's pace makes in order go with it.
                     what_if={"input_ms": s["out_of_order_ms"], "burst_scale": 1.0 - a["head_of_line_share"]})]


RULES = (
    Rule("not_a_dataloader", "starved", not_a_dataloader),
    Rule("more_workers", "starved", more_workers),
    Rule("main_process_share", "starved", main_process_share),
    Rule("lighter_transforms", "starved", lighter_transforms),
    Rule("build_once", "starved", build_once),
    Rule("persistent_workers", "starved", persistent_workers),
    Rule("deeper_prefetch", "starved", deeper_prefetch),
    Rule("faster_storage", "starved", faster_storage),
    Rule("pin_memory", "starved", pin_memory),
    Rule("out_of_order", "starved", out_of_order),
    Rule("cpu_oversubscribed", "any", cpu_oversubscribed),
    Rule("memory_budget", "any", memory_budget),
    Rule("larger_batches", "host_bound", larger_batches),
)
