"""Host, GPU and DataLoader-worker samples folded into per-bucket aggregates (the storage budget).

The `events` table holds one row per sample (`samples`: host and GPU; `workers`: one loader's
worker snapshot). Past the budget, the oldest of them are merged, per run, rank, sample kind
(host / GPU / loader) and tier bucket (retention.TIERS_S, in the steps' order), into one bucket
event each (`events.span_s` = the tier width; 0 for a raw sample). A bucket event keeps the shape
of a sample, so charts and the API read it as one, plus `bucket`: what the summary and the
diagnosis read over many samples, kept exactly and mergeable (a bucket of buckets is a bucket):

- `agg`: per numeric field, [weight, weighted sum, min, max]: means (a host rate weighs by its
  sample's `interval_s`, as system.overview does; anything else by 1), minima and maxima.
  GPU devices: `devices`, one `agg` per device position. Worker snapshots: `alive_workers`,
  `queue_depth` and, over every worker of every snapshot, `worker_cpu_pct`, `worker_mem_bytes`
  (USS, else RSS) and `batch_bytes`.
- worker snapshots also keep each worker's first and last memory reading of the bucket
  (`mem_points`, the memory-growth finding's series: thinned, so a month of 5 s readings stays
  bounded; the fit's line is kept, its figures may move by its noise), the pids that died of
  SIGBUS, the worst shard check and the latest shard hashes; the snapshot itself is the bucket's latest with workers (their counters are
  cumulative: the idle-worker and snapshot-cost findings read the latest).

A host or GPU bucket's own fields are the bucket's means (a field that did not vary keeps its
value as sent); a worker bucket's are its latest snapshot's. Stalls are never folded (few, and
the exemplar rule reads them). `rolled_samples` counts, per rank, the samples folded and until
when (the summary's `samples_rolled_up`).
"""
from __future__ import annotations

import orjson

KINDS = ("samples", "workers")
MAX_EVENTS_PER_PASS = 20_000  # one transaction's worth: its pages pass through the WAL

DDL = """
CREATE TABLE IF NOT EXISTS rolled_samples (
    run_id TEXT NOT NULL, rank INTEGER NOT NULL, until_s INTEGER NOT NULL, events INTEGER NOT NULL,
    PRIMARY KEY (run_id, rank)) WITHOUT ROWID;
"""


def migrate(w) -> None:
    """`events.span_s` (schema 4) and `rolled_samples`, for a database from before them."""
    if "span_s" not in {row[1] for row in w.execute("PRAGMA table_info(events)")}:
        w.execute("ALTER TABLE events ADD COLUMN span_s INTEGER NOT NULL DEFAULT 0")
    w.executescript(DDL)


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
        _add(aggs, "worker_mem_bytes", w.get("uss_bytes") or w.get("rss_bytes"))
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


def _group(kind: str, data: dict):
    return data.get("loader") if kind == "workers" else data.get("kind")


def span(w, run_id: str) -> tuple[int, int] | None:
    """The run's first and last sample second (index lookups, one per kind and end)."""
    ends = []
    for kind in KINDS:
        first = w.execute("SELECT t_ns, span_s FROM events WHERE run_id = ? AND kind = ? ORDER BY t_ns LIMIT 1",
                          (run_id, kind)).fetchone()
        if first is None:
            continue
        hi = w.execute("SELECT max(t_ns) FROM events WHERE run_id = ? AND kind = ?", (run_id, kind)).fetchone()[0]
        # A bucket is stored at its last sample's time: the run began no later than its bucket's start.
        lo = first[0] - first[0] % (first[1] * 1_000_000_000) if first[1] else first[0]
        ends.append((lo, hi))
    if not ends:
        return None
    return min(e[0] for e in ends) // 1_000_000_000, max(e[1] for e in ends) // 1_000_000_000


def fold(w, run_id: str, width_s: int, cut_s: int, limit: int = MAX_EVENTS_PER_PASS) -> int:
    """One pass, inside the caller's transaction: the run's oldest samples finer than width_s
    and before cut_s (a multiple of width_s) merged into width_s buckets, at most `limit` rows
    read. Returns how many rows were folded (0: none left)."""
    cut_ns = cut_s * 1_000_000_000
    for kind in KINDS:
        # One kind at a time: the index (run_id, kind, t_ns) gives the oldest rows in order, no sort.
        rows = w.execute(
            "SELECT rowid, rank, kind, t_ns, span_s, data FROM events WHERE run_id = ? AND kind = ? "
            "AND t_ns < ? AND span_s < ? ORDER BY t_ns, rowid LIMIT ?", (run_id, kind, cut_ns, width_s, limit)).fetchall()
        if rows:
            return _fold_rows(w, run_id, width_s, rows, limit)
    return 0


def _fold_rows(w, run_id: str, width_s: int, rows: list, limit: int) -> int:
    width_ns = width_s * 1_000_000_000
    if len(rows) == limit:
        # The last bucket may go on past the rows read: leave it to the next pass, unless it is all there is.
        last_bucket = rows[-1][3] // width_ns
        whole = [r for r in rows if r[3] // width_ns < last_bucket]
        rows = whole or rows
    groups: dict[tuple, list] = {}
    for rowid, rank, kind, t_ns, span_s, data in rows:
        event = orjson.loads(data)
        groups.setdefault((rank, kind, _group(kind, event), t_ns // width_ns), []).append((rowid, t_ns, span_s, event))
    raw_per_rank: dict[int, int] = {}
    until_per_rank: dict[int, int] = {}
    lone, inserts, removed = [], [], []
    for (rank, kind, _, bucket), members in groups.items():
        raw_per_rank[rank] = raw_per_rank.get(rank, 0) + sum(1 for m in members if m[2] == 0)
        until_per_rank[rank] = max(until_per_rank.get(rank, 0), (bucket + 1) * width_s)
        if len(members) == 1:
            lone.append((width_s, members[0][0]))  # alone in its bucket: kept as it is, marked
            continue
        merged = fold_members(kind, [m[3] for m in members], width_s)
        removed += [(m[0],) for m in members]
        inserts.append((run_id, rank, kind, members[-1][1], orjson.dumps(merged).decode(), width_s))
    w.executemany("UPDATE events SET span_s = ? WHERE rowid = ?", lone)
    w.executemany("DELETE FROM events WHERE rowid = ?", removed)
    w.executemany("INSERT INTO events (run_id, rank, kind, t_ns, data, span_s) VALUES (?, ?, ?, ?, ?, ?)", inserts)
    w.executemany("INSERT INTO rolled_samples VALUES (?, ?, ?, ?) ON CONFLICT(run_id, rank) DO UPDATE SET "
                  "until_s = max(until_s, excluded.until_s), events = events + excluded.events",
                  [(run_id, rank, until_per_rank[rank], n) for rank, n in raw_per_rank.items()])
    return len(rows)

