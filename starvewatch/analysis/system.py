"""Host, GPU and DataLoader-worker samples summarised over a run: pure, shared by `finish()`
(over the sampler's history) and the collector (over the stored events), so both agree. A
stored event may be a bucket of folded samples (analysis/sample_buckets.py, the storage budget):
each read here takes its exact part of the means, minima and maxima from the bucket's `agg`."""
from __future__ import annotations

from .sample_buckets import events_in, host_weight, worker_parts


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _aggs(events: list[dict], key: str, weight=lambda e: 1):
    """Per event, [weight, weighted sum, min, max] of one field (a bucket: its own)."""
    for e in events:
        bucket = e.get("bucket")
        if bucket is not None:
            part = (bucket.get("agg") or {}).get(key)
            if part is not None:
                yield part
        elif e.get(key) is not None:
            value, w = e[key], weight(e)
            yield (w, value * w, value, value)


def _agg_mean(parts) -> float | None:
    parts = list(parts)
    weight = sum(p[0] for p in parts)
    return sum(p[1] for p in parts) / weight if parts and weight > 0 else None


def _rate_mean(host: list[dict], key: str) -> float | None:
    """A host rate (CPU %, iowait, bytes/s) over the run: each sample is a rate over its own
    interval, so each weighs by that interval's length (a short last sample taken at stop
    weighs little); samples without `interval_s` (older hooks) weigh one second."""
    return _agg_mean(_aggs(host, key, host_weight))


def _max(events: list[dict], key: str):
    values = [p[3] for p in _aggs(events, key)]
    return max(values) if values else None


def _min(events: list[dict], key: str):
    values = [p[2] for p in _aggs(events, key)]
    return min(values) if values else None


def _device_aggs(gpu: list[dict], key: str):
    """Every device reading's [weight, sum, min, max] of one field (a bucket: per device)."""
    for e in gpu:
        parts = (e.get("bucket") or {}).get("devices")
        if parts is not None:
            yield from (p[key] for p in parts if p.get(key) is not None)
        else:
            yield from ((1, d[key], d[key], d[key]) for d in e.get("devices", []) if d.get(key) is not None)


def overview(events: list[tuple[str, dict]], rank: int | None = None) -> dict | None:
    """`events`: (kind, event) in time order; a stored event carries its `rank` (Query), and
    `rank` is that of events without one (finish(): its own process's), so both sides agree."""
    host = [e for kind, e in events if kind == "samples" and e.get("kind") == "host"]
    gpu = [e for kind, e in events if kind == "samples" and e.get("kind") == "gpu"]
    workers = [e for kind, e in events if kind == "workers"]
    if not (host or gpu or workers):
        return None
    devices = [d for e in gpu for d in e.get("devices", [])]
    out = {
        "host_samples": sum(events_in(e) for e in host),
        "cpu_pct_mean": _rate_mean(host, "cpu_pct"),
        "cpu_pct_max": _max(host, "cpu_pct"),
        "process_cpu_pct_mean": _rate_mean(host, "process_cpu_pct"),
        "iowait_pct_mean": _rate_mean(host, "iowait_pct"),
        "mem_available_min_bytes": _min(host, "mem_available_bytes"),
        "mem_total_bytes": _max(host, "mem_total_bytes"),
        "swap_in_bytes_per_s_mean": _rate_mean(host, "swap_in_bytes_per_s"),
        "swap_out_bytes_per_s_mean": _rate_mean(host, "swap_out_bytes_per_s"),
        "disk_read_bytes_per_s_mean": _rate_mean(host, "disk_read_bytes_per_s"),
        "shm_used_max_bytes": _max(host, "shm_used_bytes"),
        "shm_used_min_bytes": _min(host, "shm_used_bytes"),
        "shm_total_bytes": _max(host, "shm_total_bytes"),
        "cpu_count": _max(host, "cpu_count"),
        # The CPUs the training process may use (starvewatch/cpus.py), and inside a CPU quota
        # how much of it the cgroup used and in what share of periods it was throttled.
        "usable_cores": _min(host, "usable_cores"),
        "cpu_quota_cores": _min(host, "cpu_quota_cores"),
        "cgroup_cpu_pct_mean": _rate_mean(host, "cgroup_cpu_pct"),
        "cgroup_throttled_pct_mean": _rate_mean(host, "cgroup_throttled_pct"),
        "gpu_samples": sum(events_in(e) for e in gpu),
        "gpu_util_mean": _agg_mean(_device_aggs(gpu, "gpu_util_pct")),
        "gpu_mem_used_max_bytes": max((p[3] for p in _device_aggs(gpu, "mem_used_bytes")), default=None),
        "gpu_mem_total_bytes": max((p[3] for p in _device_aggs(gpu, "mem_total_bytes")), default=None),
        "gpu_names": sorted({d.get("name") for d in devices if d.get("name")}),
        "loaders": {},
    }
    by_loader: dict[str, dict] = {}
    for e in workers:
        by_loader.setdefault(e.get("loader"), {}).setdefault(e.get("rank", rank), []).append(e)
    for name, by_rank in by_loader.items():
        # Workers are per process: one rank's snapshots, never the latest of any rank (a 2-rank
        # run's answer would flip between the ranks' workers). Rank 0's where it has any, else
        # the lowest rank's; named in `rank`, with every rank that sent snapshots in `ranks`.
        # Snapshots without a rank (finish() over its own process's history) are one process.
        shown = worker_rank(by_rank)
        snaps = by_rank[shown]
        last = snaps[-1]
        per_worker = last.get("workers", [])
        parts = [worker_parts(s) for s in snaps]
        out["loaders"][name] = {
            "configured_workers": last.get("configured_workers"),
            "alive_workers_min": _min_part(parts, "alive_workers"),
            "queue_depth_mean": _agg_mean(p["agg"]["queue_depth"] for p in parts if "queue_depth" in p["agg"]),
            "queue_capacity": last.get("queue_capacity"),
            "worker_load_ms_mean": _mean(w.get("load_ms_mean") for w in per_worker),
            "worker_cpu_fraction": _mean(w.get("cpu_fraction") for w in per_worker),
            "worker_cpu_pct_mean": _agg_mean(p["agg"]["worker_cpu_pct"] for p in parts
                                             if "worker_cpu_pct" in p["agg"]),
            # Memory one worker holds of its own: USS (issue 16), in one unit: never RSS, which
            # counts the pages a forked worker shares with the training process (a parent holding
            # an 8 GiB dataset would read as 8 GiB a worker). None until a USS reading.
            "worker_mem_bytes_max": max((p["agg"]["worker_mem_bytes"][3] for p in parts
                                         if "worker_mem_bytes" in p["agg"]), default=None),
            "workers": [{"id": w.get("id"), "pid": w.get("pid"), "state": w.get("state"),
                         "batches": w.get("batches"), "load_ms_mean": w.get("load_ms_mean"),
                         "cpu_fraction": w.get("cpu_fraction"),
                         # a StatefulDataLoader's worker-state snapshots (findings.snapshot_findings)
                         **({"snapshots": w["snapshots"], "snapshot_ms_mean": w.get("snapshot_ms_mean")}
                            if w.get("snapshots") else {})} for w in per_worker],
        }
        if shown is not None:
            out["loaders"][name].update(rank=shown, ranks=sorted(r for r in by_rank if r is not None))
        if last.get("state_dict_calls"):  # the watched StatefulDataLoader's checkpoints
            out["loaders"][name].update(state_dict_calls=last["state_dict_calls"],
                                        checkpoint_interval_steps=last.get("checkpoint_interval_steps"))
    return out


def worker_rank(by_rank: dict):
    """Whose workers a run-wide answer shows: rank 0, else the lowest rank that sent any."""
    known = [r for r in by_rank if r is not None]
    return min(known) if known else None


def _min_part(parts: list[dict], key: str):
    values = [p["agg"][key][2] for p in parts if key in p["agg"]]
    return min(values) if values else None
