"""Host, GPU and DataLoader-worker samples summarised over a run: pure, shared by `finish()`
(over the sampler's history) and the collector (over the stored events), so both agree."""
from __future__ import annotations


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _rate_mean(host: list[dict], key: str) -> float | None:
    """A host rate (CPU %, iowait, bytes/s) over the run: each sample is a rate over its own
    interval, so each weighs by that interval's length (a short last sample taken at stop
    weighs little); samples without `interval_s` (older hooks) weigh one second."""
    pairs = [(e[key], e.get("interval_s") or 1.0) for e in host if e.get(key) is not None]
    seconds = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / seconds if seconds > 0 else None


def _max(values):
    values = [v for v in values if v is not None]
    return max(values) if values else None


def _min(values):
    values = [v for v in values if v is not None]
    return min(values) if values else None


def overview(events: list[tuple[str, dict]]) -> dict | None:
    host = [e for kind, e in events if kind == "samples" and e.get("kind") == "host"]
    gpu = [e for kind, e in events if kind == "samples" and e.get("kind") == "gpu"]
    workers = [e for kind, e in events if kind == "workers"]
    if not (host or gpu or workers):
        return None
    devices = [d for e in gpu for d in e.get("devices", [])]
    out = {
        "host_samples": len(host),
        "cpu_pct_mean": _rate_mean(host, "cpu_pct"),
        "cpu_pct_max": _max(e.get("cpu_pct") for e in host),
        "process_cpu_pct_mean": _rate_mean(host, "process_cpu_pct"),
        "iowait_pct_mean": _rate_mean(host, "iowait_pct"),
        "mem_available_min_bytes": _min(e.get("mem_available_bytes") for e in host),
        "mem_total_bytes": _max(e.get("mem_total_bytes") for e in host),
        "swap_in_bytes_per_s_mean": _rate_mean(host, "swap_in_bytes_per_s"),
        "swap_out_bytes_per_s_mean": _rate_mean(host, "swap_out_bytes_per_s"),
        "disk_read_bytes_per_s_mean": _rate_mean(host, "disk_read_bytes_per_s"),
        "shm_used_max_bytes": _max(e.get("shm_used_bytes") for e in host),
        "shm_used_min_bytes": _min(e.get("shm_used_bytes") for e in host),
        "shm_total_bytes": _max(e.get("shm_total_bytes") for e in host),
        "cpu_count": _max(e.get("cpu_count") for e in host),
        # The CPUs the training process may use (starvewatch/cpus.py), and inside a CPU quota
        # how much of it the cgroup used and in what share of periods it was throttled.
        "usable_cores": _min(e.get("usable_cores") for e in host),
        "cpu_quota_cores": _min(e.get("cpu_quota_cores") for e in host),
        "cgroup_cpu_pct_mean": _rate_mean(host, "cgroup_cpu_pct"),
        "cgroup_throttled_pct_mean": _rate_mean(host, "cgroup_throttled_pct"),
        "gpu_samples": len(gpu),
        "gpu_util_mean": _mean(d.get("gpu_util_pct") for d in devices),
        "gpu_mem_used_max_bytes": _max(d.get("mem_used_bytes") for d in devices),
        "gpu_mem_total_bytes": _max(d.get("mem_total_bytes") for d in devices),
        "gpu_names": sorted({d.get("name") for d in devices if d.get("name")}),
        "loaders": {},
    }
    by_loader: dict[str, list[dict]] = {}
    for e in workers:
        by_loader.setdefault(e.get("loader"), []).append(e)
    for name, snaps in by_loader.items():
        last = snaps[-1]
        per_worker = last.get("workers", [])
        out["loaders"][name] = {
            "configured_workers": last.get("configured_workers"),
            "alive_workers_min": _min(s.get("alive_workers") for s in snaps),
            "queue_depth_mean": _mean(s.get("queue_depth") for s in snaps),
            "queue_capacity": last.get("queue_capacity"),
            "worker_load_ms_mean": _mean(w.get("load_ms_mean") for w in per_worker),
            "worker_cpu_fraction": _mean(w.get("cpu_fraction") for w in per_worker),
            "worker_cpu_pct_mean": _mean(w.get("cpu_pct") for s in snaps for w in s.get("workers", [])),
            # Memory one worker holds of its own: USS where known (issue 16), else RSS (an upper
            # bound: a forked worker shares most of its pages with the training process).
            "worker_mem_bytes_max": _max(w.get("uss_bytes") or w.get("rss_bytes")
                                         for s in snaps for w in s.get("workers", [])),
            "workers": [{"id": w.get("id"), "pid": w.get("pid"), "state": w.get("state"),
                         "batches": w.get("batches"), "load_ms_mean": w.get("load_ms_mean"),
                         "cpu_fraction": w.get("cpu_fraction"),
                         # a StatefulDataLoader's worker-state snapshots (findings.snapshot_findings)
                         **({"snapshots": w["snapshots"], "snapshot_ms_mean": w.get("snapshot_ms_mean")}
                            if w.get("snapshots") else {})} for w in per_worker],
        }
        if last.get("state_dict_calls"):  # the watched StatefulDataLoader's checkpoints
            out["loaders"][name].update(state_dict_calls=last["state_dict_calls"],
                                        checkpoint_interval_steps=last.get("checkpoint_interval_steps"))
    return out
