"""The worker-memory finding (kind "worker_memory_growth") and the per-worker memory series it reads.

Pure functions of the "workers" events (the sampler's snapshots, each worker's latest USS/PSS
reading from the sidecar merged in), shared by `finish()` and the collector.

Its own module because judging growth is its own statistics (a fit of memory against samples
served, over the second half of a worker's life); findings.py gathers it with the others.

Worker memory growth: under the fork start method, a worker that reads Python objects the
parent built (a list of dicts, of strings) writes their reference counts, and the kernel
copies every page it touches: the worker's private memory (USS) grows with the samples it
served, until it holds a copy of the whole dataset. RSS misleads here (shared pages count in
every worker); USS does not. Warm-up (imports, the first batches' buffers) grows memory too,
then stops: only growth that goes on in the second half of a worker's life, in step with the
samples it served, is reported.
"""
from __future__ import annotations

from ..sample_buckets import worker_parts


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
        # A bucket of folded snapshots keeps every distinct reading (analysis/sample_buckets.py).
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
