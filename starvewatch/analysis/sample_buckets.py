"""A bucket of folded samples: host, GPU and DataLoader-worker samples merged into one event
that keeps the shape of a sample plus `bucket`, what the summary and the diagnosis read over many
samples, kept exactly and mergeable (a bucket of buckets is a bucket). Pure: the storage budget
(monitor/budget/sample_rollups.py) folds the stored rows with it, and the analysis
(system.overview, the findings) reads samples and buckets alike through it.

- `agg`: per numeric field, [weight, weighted sum, min, max]: means (a host rate weighs by its
  sample's `interval_s`, as system.overview does; anything else by 1), minima and maxima.
  GPU devices: `devices`, one `agg` per device position. Worker snapshots: `alive_workers`,
  `queue_depth` and, over every worker of every snapshot, `worker_cpu_pct`, `worker_mem_bytes`
  (USS only, one unit: RSS counts the pages shared with the training process) and `batch_bytes`.
- worker snapshots also keep each worker's first and last memory reading of the bucket
  (`mem_points`, the memory-growth finding's series), the pids that died of SIGBUS, the worst
  shard check and the latest shard hashes; the snapshot itself is the bucket's latest with
  workers (their counters are cumulative: the idle-worker and snapshot-cost findings read the
  latest).

A host or GPU bucket's own fields are the bucket's means (a field that did not vary keeps its
value as sent); a worker bucket's are its latest snapshot's.
"""
from __future__ import annotations


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _merge_agg(into: dict, key, part) -> None:
    have = into.get(key)
    if have is None:
        into[key] = list(part)
    else:
        have[0] += part[0]
        have[1] += part[1]
        have[2] = min(have[2], part[2])
        have[3] = max(have[3], part[3])


def _add(into: dict, key, value, weight: float = 1) -> None:
    if value is not None and _number(value):
        _merge_agg(into, key, (weight, value * weight, value, value))


# Fields kept as sent, never averaged: the time, the interval a rate covers (summed instead).
_NOT_AVERAGED = {"t_ns", "interval_s"}


def _field_aggs(event: dict, weight: float) -> dict:
    bucket = event.get("bucket")
    if bucket is not None:
        return bucket.get("agg") or {}
    out: dict = {}
    for key, value in event.items():
        if key not in _NOT_AVERAGED:
            _add(out, key, value, weight)
    return out


def host_weight(event: dict) -> float:
    """A host rate is a mean over its sample's interval (system._rate_mean weighs it so)."""
    return event.get("interval_s") or 1.0


def _with_means(base: dict, aggs: dict) -> dict:
    """The bucket's own fields: each numeric field's mean; one that never varied as it was sent."""
    out = dict(base)
    for key, (weight, total, lo, hi) in aggs.items():
        if key in out and lo != hi and weight:
            out[key] = total / weight
    return out


def _fold_host(members: list[dict], width_s: int) -> dict:
    aggs: dict = {}
    interval = 0.0
    for m in members:
        for key, part in _field_aggs(m, host_weight(m) if "bucket" not in m else 0).items():
            _merge_agg(aggs, key, part)
        interval += m.get("interval_s") or 1.0
    out = _with_means(members[-1], aggs)
    out["interval_s"] = interval
    return _finish(out, members, width_s, {"agg": aggs})


def _fold_gpu(members: list[dict], width_s: int) -> dict:
    aggs: dict = {}
    devices: list[dict] = []
    latest: list[dict] = []
    for m in members:
        for key, part in _field_aggs(m, 1).items():
            _merge_agg(aggs, key, part)
        parts = (m.get("bucket") or {}).get("devices")
        for i, device in enumerate(m.get("devices") or []):
            while len(devices) <= i:
                devices.append({})
                latest.append({})
            latest[i] = device
            if parts is not None:
                for key, part in (parts[i] if i < len(parts) else {}).items():
                    _merge_agg(devices[i], key, part)
            else:
                for key, value in device.items():
                    _add(devices[i], key, value)
    out = _with_means(members[-1], aggs)
    out["devices"] = [_with_means(d, a) for d, a in zip(latest, devices)]
    return _finish(out, members, width_s, {"agg": aggs, "devices": devices})


def worker_parts(event: dict) -> dict:
    """A worker snapshot's (or bucket's) part of what system.overview and the findings read over
    every snapshot: {agg, mem_points, sigbus_pids}."""
    bucket = event.get("bucket")
    if bucket is not None:
        return bucket
    aggs: dict = {}
    for key in ("alive_workers", "queue_depth"):
        _add(aggs, key, event.get(key))
    points, sigbus = [], []
    for w in event.get("workers") or []:
        _add(aggs, "worker_cpu_pct", w.get("cpu_pct"))
        # USS only: a forked worker's RSS (all a snapshot has before its first USS reading)
        # counts the pages it shares with the training process, a large in-memory dataset's
        # too; mixed in, one early snapshot would be every worker's maximum.
        _add(aggs, "worker_mem_bytes", w.get("uss_bytes"))
        if w.get("batch_bytes"):
            _add(aggs, "batch_bytes", int(w["batch_bytes"]))
        if w.get("mem_t_ns") is not None and w.get("pid") is not None and w.get("uss_bytes") is not None:
            points.append([w.get("id"), w["pid"], w["mem_t_ns"], w["uss_bytes"], w.get("pss_bytes"),
                           w.get("samples")])
        if w.get("exit_signal") == "SIGBUS":
            sigbus.append(w.get("pid"))
    return {"agg": aggs, "mem_points": points, "sigbus_pids": sigbus}


def _fold_workers(members: list[dict], width_s: int) -> dict:
    aggs: dict = {}
    readings: dict[tuple, list] = {}
    last_t: dict[tuple, int] = {}
    sigbus: list = []
    worst = hashes = None
    for m in members:
        parts = worker_parts(m)
        for key, part in parts["agg"].items():
            _merge_agg(aggs, key, part)
        for point in parts["mem_points"]:
            # One point per memory reading (worker_memory.worker_memory_series skips repeats the same way).
            key = (point[0], point[1])
            if point[2] > last_t.get(key, -1):
                last_t[key] = point[2]
                readings.setdefault(key, []).append(point)
        sigbus += [p for p in parts["sigbus_pids"] if p not in sigbus]
        check = m.get("shard_check")
        if check and (worst is None or check["reads_per_batch"] >= worst["reads_per_batch"]):
            worst = check  # the latest of the worst, as duplicate_shards.shard_findings keeps
        if m.get("shard_hashes"):
            hashes = m["shard_hashes"]
    # A worker's first and last reading of the bucket: a month of 5 s readings would outgrow any
    # budget; two a bucket keep the memory-growth fit's line (its span and slope), not its noise.
    points = sorted((p for kept in readings.values() for p in (kept[:1] + kept[-1:] if len(kept) > 1 else kept)),
                    key=lambda p: p[2])
    with_workers = [m for m in members if m.get("workers")]
    out = {k: v for k, v in (with_workers or members)[-1].items()
           if k not in ("bucket", "shard_check", "shard_hashes")}
    out["t_ns"] = members[-1].get("t_ns")
    if worst is not None:
        out["shard_check"] = worst
    if hashes is not None:
        out["shard_hashes"] = hashes
    return _finish(out, members, width_s, {"agg": aggs, "mem_points": points, "sigbus_pids": sigbus})


def _finish(out: dict, members: list[dict], width_s: int, parts: dict) -> dict:
    first = members[0].get("bucket", {}).get("first_ns", members[0].get("t_ns"))
    out["bucket"] = {"span_s": width_s, "first_ns": first, "last_ns": members[-1].get("t_ns"),
                     "events": sum(events_in(m) for m in members), **parts}
    return out


def events_in(event: dict) -> int:
    """How many samples an event stands for (a bucket: all it folded)."""
    bucket = event.get("bucket")
    return bucket["events"] if bucket is not None else 1


def fold_members(kind: str, members: list[dict], width_s: int) -> dict:
    """Samples of one run, rank, sample kind and bucket (oldest first) as one bucket event."""
    if kind == "workers":
        return _fold_workers(members, width_s)
    if members[-1].get("kind") == "gpu":
        return _fold_gpu(members, width_s)
    return _fold_host(members, width_s)
