"""Findings no step timing shows, from the workers' telemetry: summary["findings"].

Pure functions of the "workers" events (the sampler's snapshots, each worker's latest USS/PSS
reading from the sidecar merged in), shared by `finish()` and the collector.

Worker memory growth: under the fork start method, a worker that reads Python objects the
parent built (a list of dicts, of strings) writes their reference counts, and the kernel
copies every page it touches: the worker's private memory (USS) grows with the samples it
served, until it holds a copy of the whole dataset. RSS misleads here (shared pages count in
every worker); USS does not. Warm-up (imports, the first batches' buffers) grows memory too,
then stops: only growth that goes on in the second half of a worker's life, in step with the
samples it served, is reported.
"""
from __future__ import annotations

from ..schema import MODERATE_FRACTION
from ..shards import compare_readers, duplicated
from .sample_rollups import worker_parts

MIN_POINTS = 4               # memory readings of one worker process before judging its growth
MIN_GROWTH_BYTES = 8 << 20   # over the judged window: below this, noise and allocator slack
MIN_CORRELATION = 0.9        # memory follows samples served, not a one-off jump

MEMORY_FIX = ("Keep the dataset's data in numpy arrays (or torch tensors, a pyarrow table, a "
              "memory-mapped file) instead of Python lists and dicts of objects: reading a Python "
              "object in a forked worker writes its reference count, and the page is copied. "
              "For example `self.labels = np.asarray(labels)`; strings as one bytes buffer plus an "
              "offsets array (`np.frombuffer`), dicts as columns.")


def worker_memory_series(worker_events: list[dict]) -> list[dict]:
    """Per worker process: its USS/PSS over time and the samples it had served by then
    (`GET /api/v1/runs/{run_id}/workers/memory`). One point per memory reading."""
    series: dict[tuple, dict] = {}
    for event in worker_events:
        # A bucket of folded snapshots keeps every distinct reading (monitor/sample_rollups.py).
        for worker_id, pid, t_ns, uss, pss, samples in worker_parts(event)["mem_points"]:
            worker = {"id": worker_id, "uss_bytes": uss, "pss_bytes": pss, "samples": samples}
            key = (event.get("rank", 0), event.get("loader"), worker_id, pid)
            entry = series.get(key)
            if entry is None:
                entry = series[key] = {"loader": event.get("loader"), "rank": key[0],
                                       "worker": worker.get("id"), "pid": pid, "t": [],
                                       "uss_bytes": [], "pss_bytes": [], "samples": []}
            if entry["t"] and t_ns / 1e9 <= entry["t"][-1]:
                continue  # the same reading, merged into several snapshots
            entry["t"].append(t_ns / 1e9)
            entry["uss_bytes"].append(worker["uss_bytes"])
            entry["pss_bytes"].append(worker.get("pss_bytes"))
            entry["samples"].append(worker.get("samples"))
    return sorted(series.values(), key=lambda s: (s["rank"], str(s["loader"]), s["worker"], s["t"][0]))


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float] | None:
    """Least-squares slope and correlation of ys over xs; None when xs do not vary."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    if sxx <= 0:
        return None
    return sxy / sxx, (sxy / (sxx * syy) ** 0.5 if syy > 0 else 0.0)


def growth_of(entry: dict) -> dict | None:
    """The growth of one worker process after its warm-up: bytes per sample served, or None
    when it does not grow with samples (flat, a plateau, too few readings)."""
    points = [(s, u) for s, u in zip(entry["samples"], entry["uss_bytes"]) if s is not None]
    if len(points) < MIN_POINTS:
        return None
    judged = points[len(points) // 2:]  # the later half: past the warm-up
    judged = judged if len(judged) >= 3 else points[-3:]
    xs, ys = [float(s) for s, _ in judged], [float(u) for _, u in judged]
    fit = _fit(xs, ys)
    if fit is None:
        return None
    slope, correlation = fit
    grown = ys[-1] - ys[0]
    if slope <= 0 or grown < MIN_GROWTH_BYTES or correlation < MIN_CORRELATION:
        return None
    return {"bytes_per_sample": slope, "samples_served": points[-1][0] - points[0][0],
            "first_sample": points[0][0], "last_sample": points[-1][0],
            "uss_bytes": points[-1][1], "grown_bytes": grown}


def memory_growth_findings(series: list[dict], configs: dict[str, dict | None],
                           mem_total_bytes: int | None = None) -> list[dict]:
    """One finding per loader whose workers grow in step with the samples they serve."""
    findings = []
    by_loader: dict[str, list[tuple[dict, dict]]] = {}
    for entry in series:
        growth = growth_of(entry)
        if growth is not None:
            by_loader.setdefault(entry["loader"], []).append((entry, growth))
    for loader, growing in by_loader.items():
        config = configs.get(loader) or {}
        workers = config.get("num_workers") or len({e["worker"] for e, _ in growing})
        per_worker_epoch = (config["dataset_len"] / workers) if config.get("dataset_len") and workers else None
        rate = sum(g["bytes_per_sample"] for _, g in growing) / len(growing)
        now = sum(g["uss_bytes"] for _, g in growing)
        projected = None
        if per_worker_epoch is not None:
            projected = sum(g["uss_bytes"] + g["bytes_per_sample"] * max(
                0.0, per_worker_epoch - (g["last_sample"] - g["first_sample"])) for _, g in growing)
            projected = int(projected)
        critical = bool(projected and mem_total_bytes and projected > 0.5 * mem_total_bytes)
        per_1000_mib = rate * 1000 / 2 ** 20
        findings.append({
            "kind": "worker_memory_growth", "loader": loader,
            "severity": "critical" if critical else "warning",
            "title": (f"{len(growing)} of {workers} DataLoader workers of '{loader}' grow by "
                      f"{per_1000_mib:.1f} MiB per 1,000 samples served (copy-on-read of Python "
                      f"objects after fork)"
                      + (f"; about {projected / 2 ** 30:.2f} GiB private memory by the epoch's end"
                         if projected else "")),
            "detail": {
                "growth_bytes_per_1000_samples": int(rate * 1000),
                "workers_growing": len(growing), "workers": workers,
                "uss_now_bytes": int(now),
                "projected_epoch_end_uss_bytes": projected,
                "samples_per_worker_epoch": int(per_worker_epoch) if per_worker_epoch else None,
                "mem_total_bytes": mem_total_bytes,
                "start_method": config.get("multiprocessing_context"),
                "worker_pids": [e["pid"] for e, _ in growing],
            },
            "fix": MEMORY_FIX,
        })
    return findings


def shm_findings(worker_events: list[dict], configs: dict[str, dict | None],
                 system: dict | None) -> list[dict]:
    """/dev/shm foreseen: batches in flight from the workers (batch bytes x prefetch_factor x
    num_workers, the batch bytes sampled in the workers) against /dev/shm. Torch passes every
    worker's batch through shared memory; when it runs out, a worker dies of SIGBUS."""
    system = system or {}
    total, used = system.get("shm_total_bytes"), system.get("shm_used_max_bytes")
    if not total:
        return []
    batch_bytes: dict[str, int] = {}
    for event in worker_events:
        part = worker_parts(event)["agg"].get("batch_bytes")
        if part is not None:
            name = event.get("loader")
            batch_bytes[name] = max(batch_bytes.get(name, 0), int(part[3]))
    findings = []
    for loader, per_batch in batch_bytes.items():
        config = configs.get(loader) or {}
        workers = config.get("num_workers") or 0
        prefetch = config.get("prefetch_factor") or 2
        need = per_batch * prefetch * workers
        # Our own batches in flight are part of the peak use: what else holds /dev/shm is
        # the peak use minus them (at least nothing).
        others = max(0, (used or 0) - need)
        room = max(0, total - others)
        # A loader whose batches are a sliver of /dev/shm is not what fills it (others are).
        if workers <= 0 or need <= 0.5 * room or need < 0.01 * total:
            continue
        slots = int(0.8 * room // per_batch)
        if slots >= workers:
            settings = f"num_workers={workers}, prefetch_factor={slots // workers}"
        elif slots >= 1:
            settings = f"num_workers={slots}, prefetch_factor=1"
        else:
            settings = "smaller batches (no batch fits twice)"
        findings.append({
            "kind": "shm_risk", "loader": loader,
            "severity": "critical" if need > room else "warning",
            "title": (f"'{loader}' needs about {need / 2**20:.0f} MiB of /dev/shm for batches in flight "
                      f"({per_batch / 2**20:.1f} MiB x prefetch_factor {prefetch} x {workers} workers), "
                      f"{room / 2**20:.0f} MiB available: workers die with a Bus error (SIGBUS) when it fills"),
            "detail": {"batch_bytes": per_batch, "prefetch_factor": prefetch, "num_workers": workers,
                       "shm_needed_bytes": need, "shm_total_bytes": total, "shm_used_max_bytes": used,
                       "shm_available_bytes": room},
            "fix": (f"DataLoader(..., {settings}) fits in the /dev/shm there is; or give the "
                    f"container more shared memory (docker run --shm-size={int(need * 1.25 / 2**20) + 1}m, "
                    f"Kubernetes: an emptyDir with medium: Memory at /dev/shm)."),
        })
    return findings


def sigbus_findings(worker_events: list[dict], configs: dict[str, dict | None],
                    shm: list[dict], system: dict | None) -> list[dict]:
    """A worker killed by SIGBUS (read from the zombie's exit code by the sidecar): under
    torch, /dev/shm ran out. The fix: the settings that fit, from the shm estimate."""
    dead: dict[str, set] = {}
    for event in worker_events:
        for pid in worker_parts(event)["sigbus_pids"]:
            dead.setdefault(event.get("loader"), set()).add(pid)
    estimates = {f["loader"]: f for f in shm}
    out = []
    for loader, pids in dead.items():
        config = configs.get(loader) or {}
        estimate = estimates.get(loader)
        out.append({
            "kind": "sigbus", "loader": loader, "severity": "critical",
            "title": (f"{len(pids)} DataLoader worker(s) of '{loader}' died of SIGBUS (Bus error): "
                      f"shared memory (/dev/shm) ran out for the batches in flight"),
            "detail": {"worker_pids": sorted(p for p in pids if p is not None),
                       "num_workers": config.get("num_workers"),
                       "prefetch_factor": config.get("prefetch_factor"),
                       **({k: estimate["detail"][k] for k in ("batch_bytes", "shm_needed_bytes",
                                                               "shm_available_bytes")} if estimate else {}),
                       "shm_total_bytes": (system or {}).get("shm_total_bytes")},
            "fix": estimate["fix"] if estimate else (
                "Fewer batches in flight (a lower prefetch_factor or num_workers), smaller batches, "
                "or more shared memory (docker run --shm-size=...)."),
        })
    return out


SHARD_FIX = """class Shards(IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        shard, shards = rank * workers + worker, world * workers
        for i, sample in enumerate(self.samples()):
            if i % shards == shard:  # or split the files: files[shard::shards]
                yield sample"""


def _shard_cause(by_worker: bool, by_rank: bool) -> str:
    if by_worker and by_rank:
        return "sharded neither by worker nor by rank"
    return "not sharded by worker" if by_worker else "not sharded by rank"


def shard_findings(worker_events: list[dict], configs: dict[str, dict | None] | None = None) -> list[dict]:
    """Readers of an IterableDataset that yield the same batches: each sample read N times.
    Workers of one process are compared in that process ("shard_check"); the ranks of a job
    here, from the hashes each rank's workers sent ("shard_hashes"). Not for resampled shards
    (webdataset's `resampled=True` samples shards with replacement: repeats are its design)."""
    within: dict[str, dict] = {}
    hashes: dict[str, dict[int, list[list[int]]]] = {}
    for event in worker_events:
        loader = event.get("loader")
        if ((configs or {}).get(loader) or {}).get("shards_resampled"):
            continue
        if event.get("shard_check"):
            # The worst rank speaks for the loader (ranks run the same code).
            old = within.get(loader)
            if old is None or event["shard_check"]["reads_per_batch"] >= old["reads_per_batch"]:
                within[loader] = event["shard_check"]
        if event.get("shard_hashes"):
            hashes.setdefault(loader, {})[event.get("rank", 0)] = event["shard_hashes"]
    out = []
    for loader in sorted(set(within) | set(hashes), key=str):
        per_rank = hashes.get(loader, {})
        across = compare_readers([h for rank in sorted(per_rank) for h in per_rank[rank]]) \
            if len(per_rank) >= 2 else None
        by_worker, by_rank = duplicated(within.get(loader)), False
        check = within.get(loader) if by_worker else None
        if duplicated(across):
            # Each rank's own readers are one copy each unless they repeat among themselves too.
            per_rank_reads = check["reads_per_batch"] if by_worker else 1
            by_rank = across["reads_per_batch"] > per_rank_reads
            check = across if by_rank else check
        if check is None:
            continue
        reads, ranks = check["reads_per_batch"], len(per_rank) if by_rank else None
        readers = f"{check['workers']} workers" + (f" on {ranks} ranks" if ranks else "")
        out.append({
            "kind": "duplicated_shards", "loader": loader, "severity": "critical",
            "title": (f"The {readers} of '{loader}' yield the same batches: every sample is read {reads} "
                      f"times per epoch (the IterableDataset is {_shard_cause(by_worker, by_rank)})"),
            "detail": {"times_each_sample_read": reads, "workers": check["workers"],
                       "compared_batches": check["compared_batches"],
                       "repeated_batches": check["repeated_batches"],
                       "not_sharded_by_worker": by_worker, "not_sharded_by_rank": by_rank,
                       **({"ranks": ranks} if ranks else {})},
            "fix": ("Shard by worker and by rank with torch.utils.data.get_worker_info() and the rank:\n"
                    if by_rank else
                    "Shard by worker (and by rank under DDP) with torch.utils.data.get_worker_info():\n")
            + SHARD_FIX,
        })
    return out


IDLE_SHARE = 0.25       # of a worker's fair share of the batches: under it, the worker idles
MIN_IDLE_BATCHES = 8    # batches served by all workers before judging how they were shared


def _latest_workers(worker_events: list[dict]) -> dict[tuple, list[dict]]:
    """(loader, rank) -> the workers of its latest snapshot (their counters are cumulative)."""
    latest: dict[tuple, list[dict]] = {}
    for event in worker_events:
        if event.get("workers"):
            latest[(event.get("loader"), event.get("rank", 0))] = event["workers"]
    return latest


def _idle_cause(shards, count: int, world: int) -> tuple[bool, str, str]:
    """(too few shards?, the cause, the fix) for idle readers of a loader."""
    readers = count * world
    if isinstance(shards, int) and shards < readers:
        ranks = f" x {world} ranks" if world > 1 else ""
        usable = max(1, shards // world)
        return True, (f"the dataset has {shards} shard{'s' if shards != 1 else ''} for {count} workers{ranks} "
                      f"= {readers} readers: a reader without a shard has nothing to read, and more "
                      f"workers would find none either"), (
            f"Reshard into at least {readers} shards (a multiple of {readers} keeps them even): "
            f"webdataset, write more, smaller tar shards; Hugging Face datasets, "
            f"`dataset.reshard()` (Parquet) or `to_iterable_dataset(num_shards={readers})`. "
            f"Or DataLoader(..., num_workers={usable}): a worker without a shard costs "
            f"memory and start-up and loads nothing.")
    return False, ("their iterators ended early or yielded little: the IterableDataset splits its "
                   "data unevenly among the readers"), (
        "Split the data evenly among the workers and ranks (torch.utils.data.get_worker_info() and "
        "the rank: reader `id` of `readers` reads samples id, id + readers, ...), or use fewer workers.")


def idle_worker_findings(worker_events: list[dict], configs: dict[str, dict | None],
                         waits: dict[str, float | None], world_size: int = 1,
                         duplicated_loaders: frozenset = frozenset()) -> list[dict]:
    """Workers that served no batch, or under a quarter of their fair share, while the loop
    waited for data; across ranks (the collector sees them all), a rank whose workers served
    under a quarter of the busiest rank's batches (the others wait for it, or it deadlocks a
    collective). The cause where it can be read: an IterableDataset with fewer shards
    (webdataset's URL list, `datasets`' num_shards) than workers x ranks leaves readers without
    a shard. Not for resampled shards (no reader runs out), nor for a loader whose workers read
    the same shards (duplicated_shards: they all serve, each a copy)."""
    out = []
    world = max(1, int(world_size or 1))
    by_loader: dict[str, dict[int, list[dict]]] = {}
    for (loader, rank), workers in _latest_workers(worker_events).items():
        by_loader.setdefault(loader, {})[rank] = workers
    for loader in sorted(by_loader, key=str):
        ranks = by_loader[loader]
        config = configs.get(loader) or {}
        count = config.get("num_workers") or max(len(w) for w in ranks.values())
        if config.get("shards_resampled") or loader in duplicated_loaders:
            continue
        served = {rank: [int(w.get("batches") or 0) for w in workers[:count]] for rank, workers in ranks.items()}
        per_rank = {rank: sum(counts) for rank, counts in served.items()}
        busiest = max(per_rank.values())
        idle_ranks = sorted(r for r, total in per_rank.items()
                            if len(per_rank) >= 2 and busiest >= MIN_IDLE_BATCHES and total < IDLE_SHARE * busiest)
        wait = waits.get(loader)
        worst = None  # (rank, its idle workers) with the most idle workers, while the loop waited
        if count >= 2 and wait is not None and wait >= MODERATE_FRACTION:
            for rank in sorted(served):
                counts, total = served[rank], per_rank[rank]
                idle = [i for i, b in enumerate(counts) if b < IDLE_SHARE * total / count] \
                    if total >= MIN_IDLE_BATCHES else []
                if idle and (worst is None or len(idle) > len(worst[1])):
                    worst = (rank, idle)
        if worst is None and not idle_ranks:
            continue
        shards = config.get("dataset_shards")
        too_few, cause, fix = _idle_cause(shards, count, world)
        parts = []
        if worst is not None:
            rank, idle = worst
        else:  # a whole rank short of batches: its workers against the busiest rank's share
            rank = idle_ranks[0]
            idle = [i for i, b in enumerate(served[rank]) if b < IDLE_SHARE * busiest / count]
        if worst is not None:
            none_served = all(served[rank][i] == 0 for i in idle)
            what = "served no batches" if none_served else "served under a quarter of their share of the batches"
            where = f" on rank {rank}" if len(served) > 1 else ""
            parts.append(f"{len(idle)} of {count} DataLoader workers of '{loader}'{where} {what} while the "
                         f"loop waited for data {100 * wait:.0f}% of the time")
        if idle_ranks:
            named = ", ".join(str(r) for r in idle_ranks)
            parts.append(f"rank{'s' if len(idle_ranks) > 1 else ''} {named} of '{loader}' served "
                         f"{min(per_rank[r] for r in idle_ranks)} batches against {busiest} on the busiest rank")
        out.append({
            "kind": "idle_workers", "loader": loader, "severity": "warning",
            "title": "; ".join(parts) + f": {cause}",
            "detail": {"workers": count, "idle_workers": idle, "active_workers": count - len(idle),
                       "batches_per_worker": served[rank], "dataset_shards": shards, "world_size": world,
                       "readers": count * world, "cause": "too_few_shards" if too_few else "uneven_split",
                       "rank": rank, "idle_ranks": idle_ranks,
                       "batches_per_rank": {str(r): per_rank[r] for r in sorted(per_rank)}},
            "fix": fix,
        })
    return out


SNAPSHOT_COST_FRACTION = 0.02  # of the step: below, a StatefulDataLoader's snapshots are not worth a word


def _snapshot_cost(event: dict, step_ms: float) -> dict | None:
    """One rank's snapshot cost per step from its workers' telemetry (hooks/snapshots.py): the
    training process unpickles each snapshot in its next() (serial: all of it is on the step);
    the workers build and pickle them in parallel (their share of a step: divided by the
    workers serving). CPU time, so a lower bound: on a host short of cores the workers' share
    is not parallel and the step loses more (the tuner's trials measure that)."""
    workers = event.get("workers") or []
    batches = sum(int(w.get("batches") or 0) for w in workers)
    taking = [w for w in workers if w.get("snapshots")]
    if not taking or batches <= 0:
        return None
    snapshots = sum(int(w["snapshots"]) for w in taking)
    worker_ms = sum(w["snapshots"] * (w.get("snapshot_ms_mean") or 0.0) for w in taking) / batches
    load_ms = sum(w["snapshots"] * (w.get("snapshot_load_ms") or 0.0) for w in taking) / batches
    serving = max(1, sum(1 for w in workers if w.get("batches")))
    cost_ms = load_ms + worker_ms / serving
    return {"cost_ms": cost_ms, "fraction": cost_ms / step_ms, "snapshots": snapshots, "batches": batches,
            "worker_ms": worker_ms, "load_ms": load_ms, "serving": serving,
            "snapshot_ms": sum(w["snapshots"] * (w.get("snapshot_ms_mean") or 0.0) for w in taking) / snapshots,
            "snapshot_bytes": max(int(w.get("snapshot_bytes") or 0) for w in taking)}


def snapshot_findings(worker_events: list[dict], configs: dict[str, dict | None],
                      batches_per_s: dict[str, float | None]) -> list[dict]:
    """torchdata's StatefulDataLoader snapshots every worker's state each
    `snapshot_every_n_steps` batches (1 by default: every batch) and sends it with the batch.
    Reported when that costs more than 2% of the step, with the fix: snapshot only as often as
    the loop checkpoints (the spacing of the watched loader's state_dict() calls)."""
    latest: dict[tuple, dict] = {}
    for event in worker_events:
        if any(w.get("snapshots") for w in event.get("workers") or []):
            latest[(event.get("loader"), event.get("rank", 0))] = event
    worst: dict[str, tuple[dict, dict]] = {}
    for (loader, _rank), event in latest.items():
        rate = batches_per_s.get(loader)
        if not rate:
            continue
        cost = _snapshot_cost(event, 1000.0 / rate)
        if cost is not None and (loader not in worst or cost["fraction"] > worst[loader][0]["fraction"]):
            worst[loader] = (cost, event)
    out = []
    for loader in sorted(worst, key=str):
        cost, event = worst[loader]
        every = ((configs.get(loader) or {}).get("snapshot_every_n_steps")) or 1
        interval = event.get("checkpoint_interval_steps")
        if cost["fraction"] <= SNAPSHOT_COST_FRACTION or (interval and every >= interval):
            continue  # cheap, or already no more often than the loop checkpoints
        step_ms = 1000.0 / batches_per_s[loader]
        saving_ms = cost["cost_ms"] * (1.0 - every / interval) if interval else None
        if interval:
            fix = (f"StatefulDataLoader(..., snapshot_every_n_steps={interval}): the loop calls state_dict() "
                   f"every {interval} steps, and a snapshot taken between two checkpoints is never used "
                   f"(a state_dict() between snapshots replays the steps since the last one). Saves at least "
                   f"{saving_ms:.2f} ms per step.")
        else:
            fix = ("StatefulDataLoader(..., snapshot_every_n_steps=N) with N your checkpoint interval in steps "
                   "(state_dict() was not called twice in one epoch in this run, so starvewatch could not read "
                   "it): a snapshot taken between two checkpoints is never used. Or make the dataset's "
                   "state_dict() small (a position, a seed: not the data).")
        out.append({
            "kind": "snapshot_cost", "loader": loader,
            "severity": "critical" if cost["fraction"] > 0.25 else "warning",
            "title": (f"'{loader}' (StatefulDataLoader, snapshot_every_n_steps={every}) spends at least "
                      f"{cost['cost_ms']:.2f} ms of CPU time per step ({100 * cost['fraction']:.0f}% of the "
                      f"{step_ms:.1f} ms step) snapshotting its workers' state "
                      f"({cost['snapshot_bytes'] / 2**10:,.0f} KiB each) and sending it with the batches"),
            "detail": {"snapshot_every_n_steps": every, "snapshot_cost_ms_per_step": cost["cost_ms"],
                       "snapshot_cost_fraction": cost["fraction"], "step_ms": step_ms,
                       "snapshot_worker_ms": cost["snapshot_ms"], "snapshot_load_ms_per_step": cost["load_ms"],
                       "snapshot_bytes": cost["snapshot_bytes"], "snapshots": cost["snapshots"],
                       "batches": cost["batches"], "workers_serving": cost["serving"],
                       "state_dict_calls": event.get("state_dict_calls", 0),
                       "checkpoint_interval_steps": interval, "suggested_snapshot_every_n_steps": interval,
                       "saving_ms_per_step": saving_ms},
            "fix": fix,
        })
    return out


def findings_from(worker_events: list[dict], configs: dict[str, dict | None],
                  system: dict | None = None, *, waits: dict[str, float | None] | None = None,
                  world_size: int = 1, batches_per_s: dict[str, float | None] | None = None) -> list[dict]:
    """Every finding of a run, from its "workers" events (summary["findings"]); `waits`: each
    loader's input-wait fraction (idle workers matter while the loop waits)."""
    mem_total = (system or {}).get("mem_total_bytes")
    shm = shm_findings(worker_events, configs, system)
    shards = shard_findings(worker_events, configs)
    idle = idle_worker_findings(worker_events, configs, waits or {}, world_size,
                                frozenset(f["loader"] for f in shards))
    return (memory_growth_findings(worker_memory_series(worker_events), configs, mem_total)
            + shm + sigbus_findings(worker_events, configs, shm, system) + shards + idle
            + snapshot_findings(worker_events, configs, batches_per_s or {}))


def stack_frames(stack: str | None) -> list[str]:
    """The frames of the thread that loads data, innermost first, from a faulthandler dump:
    the thread whose frames include a DataLoader fetch (or `__getitem__`/`__iter__`), else
    the first thread written."""
    if not stack:
        return []
    threads = [block.strip().splitlines() for block in stack.split("\n\n") if block.strip()]
    threads = [[line.strip() for line in t[1:] if line.strip().startswith("File ")] for t in threads]
    threads = [t for t in threads if t]
    for marker in ("in fetch", "in __getitem__", "in __iter__", "in __next__"):
        for frames in threads:
            if any(line.endswith(marker) for line in frames):
                return frames
    return threads[0] if threads else []


def stall_where(stall: dict) -> str:
    """One line: who holds the stalled batch and where it is (console, CLI, exports)."""
    parts = []
    if stall.get("worker") is not None and stall.get("worker_pid"):
        parts.append(f"worker {stall['worker']} (pid {stall['worker_pid']}, {stall.get('worker_state')})")
    elif stall.get("worker") is not None:  # its process has not started (spawn is slow)
        parts.append(f"worker {stall['worker']} (not started yet)")
    elif stall.get("worker_state"):
        parts.append(stall["worker_state"])
    if stall.get("phase") == "iter":
        parts.append("inside iter() (start-up)")
    if stall.get("indices"):
        shown = stall["indices"][:8]
        parts.append("loading indices " + ", ".join(map(str, shown)) + (" ..." if len(stall["indices"]) > 8 else ""))
    frames = stack_frames(stall.get("stack"))
    if frames:
        parts.append("at " + frames[0])
    return "; ".join(parts)


def finding_line(finding: dict) -> str:
    return f"[{finding.get('severity')}] {finding.get('title')}"
