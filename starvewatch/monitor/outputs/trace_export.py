"""A run as a Chrome trace-event / Perfetto timeline (`starvewatch export RUN -f trace`).

Per rank a process; per loader a track on the training thread with a wait and a compute slice
per step (named by loader, epoch and step); per DataLoader worker a track of fetch and collate
slices (from the workers' per-batch records, hooks/delivery/attribution.py); counters for GPU
utilisation and memory, host CPU and each loader's result-queue depth; stalls and epoch starts
as instant events. A step range or a time window bounds it, and so does MAX_EVENTS: a cut
trace says so (`starvewatch.truncated`, and the CLI prints it).

Clock: every time is wall-clock ns (the steps' start_ns: the training process's perf_counter
plus its offset to the wall clock, the clock Kineto converts to as well). `merge()` puts the
tracks into a torch.profiler trace: its `baseTimeNanoseconds` becomes ours, and the training
process's pid and native thread id (the run's metadata, else those of the profiler's
ProfilerStep events) replace ours, so a step's wait lies inside its ProfilerStep on the same
thread.
"""
from __future__ import annotations

MAX_EVENTS = 500_000  # ~60 MB of JSON: what Perfetto's UI opens without trouble
WORKER_TID_BASE = 1_000_000  # synthetic thread ids of the worker tracks (per loader, per worker)
SYNTHETIC_PID_BASE = 4_000_000  # a rank whose pid the run's metadata does not give


def _to_microseconds(events: list[dict], base: int) -> None:
    """ns -> µs since the base, as Kineto writes them."""
    for e in events:
        if "ts" in e:
            e["ts"] = (e["ts"] - base) / 1000
        if "dur" in e:
            e["dur"] = e["dur"] / 1000


def _parse_range(text: str | None, kind=int) -> tuple | None:
    """"A:B" (either side may be empty) into (A or None, B or None); None for None."""
    if text is None or text == "":
        return None
    lo, sep, hi = str(text).partition(":")
    if not sep:
        raise ValueError(f"expected START:END, got {text!r}")
    return (kind(lo) if lo.strip() else None, kind(hi) if hi.strip() else None)


class _Budget:
    def __init__(self, limit: int) -> None:
        self.limit, self.used, self.cut = limit, 0, None

    def take(self, n: int, what: str) -> bool:
        if self.used + n > self.limit:
            self.cut = self.cut or what
            return False
        self.used += n
        return True


def build_trace(store, run_id: str, *, steps: str | None = None, window: str | None = None,
                rank: int | None = None, max_events: int = MAX_EVENTS) -> dict:
    """The trace of one run (a dict in the JSON Object Format). `steps` "A:B": the steps
    numbered A to B of every epoch; `window` "S:E": seconds since the run's first step."""
    step_range = _parse_range(steps)
    window_s = _parse_range(window, float)
    # SQLite's dialect: the PostgreSQL store's reader translates it (pg_dialect.py).
    reader = store.reader()
    row = reader.execute("SELECT meta FROM runs WHERE id = ?", (run_id,)).fetchone()
    if row is None:
        raise KeyError(run_id)
    import orjson
    meta = orjson.loads(row[0]) if row[0] else {}
    span = store.step_range(run_id)
    first_ns = None
    if span is not None:
        got = reader.execute("SELECT min(start_ns) FROM steps WHERE rowid BETWEEN ? AND ? AND run_id = ?",
                             (*span, run_id)).fetchone()
        first_ns = got[0] if got else None
    lo_ns = hi_ns = None
    if window_s is not None and first_ns is not None:
        lo_ns = first_ns + int(window_s[0] * 1e9) if window_s[0] is not None else None
        hi_ns = first_ns + int(window_s[1] * 1e9) if window_s[1] is not None else None
    budget = _Budget(max_events)
    events: list[dict] = []
    processes: dict[int, tuple[int, int]] = {}  # rank -> (pid, training thread tid)

    def ids(r: int) -> tuple[int, int]:
        if r not in processes:
            if int(meta.get("rank") or 0) == r and meta.get("pid"):
                processes[r] = (int(meta["pid"]), int(meta.get("tid") or meta["pid"]))
            else:
                processes[r] = (SYNTHETIC_PID_BASE + r, SYNTHETIC_PID_BASE + r)
        return processes[r]

    # Steps: wait and compute slices on the training thread, epoch starts as instants; ties of
    # start_ns (ranks in step) in one order on both stores, so a cut trace keeps the same events.
    where, args = _step_filter(span, run_id, rank, step_range, lo_ns, hi_ns)
    cursor = reader.execute(f"SELECT rank, loader, epoch, step, start_ns, wait_ns, compute_ns FROM steps "
                            f"WHERE {where} ORDER BY start_ns, rank, rowid", args)
    loaders: list[str] = []
    t_min = t_max = None
    for r, loader, epoch, step, start, wait, compute in cursor:
        if not budget.take(2 + (step == 0), "steps"):
            break
        pid, tid = ids(r)
        if loader not in loaders:
            loaders.append(loader)
        name = f"{loader} e{epoch} #{step}"
        events.append({"ph": "X", "name": f"wait {name}", "cat": "starvewatch.wait", "pid": pid, "tid": tid,
                       "ts": start, "dur": wait, "args": {"loader": loader, "epoch": epoch, "step": step}})
        events.append({"ph": "X", "name": f"compute {name}", "cat": "starvewatch.compute", "pid": pid,
                       "tid": tid, "ts": start + wait, "dur": compute,
                       "args": {"loader": loader, "epoch": epoch, "step": step}})
        if step == 0:
            events.append({"ph": "i", "s": "p", "name": f"epoch {epoch} of {loader}", "cat": "starvewatch.epoch",
                           "pid": pid, "tid": tid, "ts": start})
        t_min = start if t_min is None else min(t_min, start)
        t_max = max(t_max or 0, start + wait + compute)
    lo = lo_ns if lo_ns is not None else t_min
    hi = hi_ns if hi_ns is not None else t_max
    # The whole run: every worker batch, those done before the first step's clock began too
    # (workers forked inside iter() may finish batch 0 before the loop asks for it).
    whole = step_range is None and window_s is None
    if lo is not None and hi is not None:
        _worker_slices(store, run_id, rank, 0 if whole else lo, hi, ids, loaders, events, budget)
        _counters(store, run_id, rank, lo, hi, ids, events, budget)
        _stalls(store, run_id, rank, lo, hi, ids, events, budget)
    for r, (pid, tid) in sorted(processes.items()):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"rank {r}"}})
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                       "args": {"name": "training thread (starvewatch)"}})
    base = lo or 0
    if whole and events:  # no event before the base: it is the earliest one's time
        base = min([base] + [e["ts"] for e in events if "ts" in e])
    _to_microseconds(events, base)
    return {"traceEvents": events, "displayTimeUnit": "ms", "baseTimeNanoseconds": base,
            "starvewatch": {"run_id": run_id, "events": len(events), "truncated": budget.cut is not None,
                            "cut_at": budget.cut, "max_events": max_events,
                            "ranks": {str(r): {"pid": p, "tid": t} for r, (p, t) in processes.items()}}}


def _step_filter(span, run_id: str, rank, step_range, lo_ns, hi_ns) -> tuple[str, list]:
    """The WHERE clause (and its arguments) of the steps a trace shows: the run's rowid block,
    then the rank, the step numbers and the time window asked for."""
    where, args = "rowid BETWEEN ? AND ? AND run_id = ?", [*(span or (0, -1)), run_id]
    if rank is not None:
        where += " AND rank = ?"
        args.append(rank)
    if step_range is not None:
        if step_range[0] is not None:
            where += " AND step >= ?"
            args.append(step_range[0])
        if step_range[1] is not None:
            where += " AND step <= ?"
            args.append(step_range[1])
    if lo_ns is not None:
        where += " AND start_ns >= ?"
        args.append(lo_ns)
    if hi_ns is not None:
        where += " AND start_ns <= ?"
        args.append(hi_ns)
    return where, args


def _events(store, run_id: str, kind: str, rank, lo: int, hi: int, margin_ns: int = 0):
    import orjson
    where, args = "run_id = ? AND kind = ? AND t_ns BETWEEN ? AND ?", [run_id, kind, lo - margin_ns, hi + margin_ns]
    if rank is not None:
        where += " AND rank = ?"
        args.append(rank)
    # Ties (ranks' samples of one instant) in one order on both stores: a cut trace is the same.
    for r, data in store.reader().execute(f"SELECT rank, data FROM events WHERE {where} ORDER BY t_ns, rank, rowid",
                                          args):
        yield r, orjson.loads(data)


def _worker_slices(store, run_id, rank, lo, hi, ids, loaders, events, budget) -> None:
    named: set = set()
    # A batch of records is stored at its earliest hand-over; a fetch may have begun earlier.
    for r, cols in _events(store, run_id, "worker_batches", rank, lo, hi, margin_ns=60_000_000_000):
        pid, _ = ids(r)
        for i, loader in enumerate(cols.get("loader") or ()):
            got, c0, c1, done = (cols["got_ns"][i], cols["collate_start_ns"][i], cols["collate_end_ns"][i],
                                 cols["done_ns"][i])
            if done < lo or got > hi:
                continue
            if loader not in loaders:
                loaders.append(loader)
            worker = cols["worker"][i]
            tid = WORKER_TID_BASE + loaders.index(loader) * 1000 + worker
            if (pid, tid) not in named:
                named.add((pid, tid))
                events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                               "args": {"name": f"{loader} worker {worker}"}})
            if not budget.take(2, "worker batches"):
                return
            idx = cols["idx"][i]
            fetch_end = c0 or done
            events.append({"ph": "X", "name": f"fetch #{idx}", "cat": "starvewatch.fetch", "pid": pid, "tid": tid,
                           "ts": cols["fetch_start_ns"][i], "dur": max(0, fetch_end - cols["fetch_start_ns"][i]),
                           "args": {"loader": loader, "worker": worker, "batch": idx}})
            if c0:
                events.append({"ph": "X", "name": f"collate #{idx}", "cat": "starvewatch.collate", "pid": pid,
                               "tid": tid, "ts": c0, "dur": max(0, c1 - c0),
                               "args": {"loader": loader, "worker": worker, "batch": idx}})


def _counters(store, run_id, rank, lo, hi, ids, events, budget) -> None:
    for r, sample in _events(store, run_id, "samples", rank, lo, hi):
        pid, _ = ids(r)
        t = sample.get("t_ns")
        if t is None or not budget.take(2, "counters"):
            return
        if sample.get("cpu_pct") is not None:
            events.append({"ph": "C", "name": "host CPU %", "pid": pid, "ts": t, "args": {"cpu": sample["cpu_pct"]}})
        for n, device in enumerate(sample.get("devices") or ()):
            values = {k: device[k] for k in ("gpu_util_pct", "mem_used_bytes") if device.get(k) is not None}
            if values:
                events.append({"ph": "C", "name": f"GPU {n}", "pid": pid, "ts": t, "args": values})
    for r, snapshot in _events(store, run_id, "workers", rank, lo, hi):
        pid, _ = ids(r)
        if snapshot.get("queue_depth") is None or snapshot.get("t_ns") is None:
            continue
        if not budget.take(1, "counters"):
            return
        events.append({"ph": "C", "name": f"{snapshot.get('loader')} result queue", "pid": pid,
                       "ts": snapshot["t_ns"], "args": {"ready batches": snapshot["queue_depth"]}})


def _stalls(store, run_id, rank, lo, hi, ids, events, budget) -> None:
    for r, stall in _events(store, run_id, "stalls", rank, lo, hi):
        pid, tid = ids(r)
        start = stall.get("started_ns") or stall.get("t_ns")
        if start is None or not budget.take(1, "stalls"):
            return
        events.append({"ph": "i", "s": "p", "name": f"stall: {stall.get('loader')}", "cat": "starvewatch.stall",
                       "pid": pid, "tid": tid, "ts": start,
                       "args": {k: stall.get(k) for k in ("loader", "epoch", "step", "wait_s") if k in stall}})


def merge(profiler: dict, ours: dict, rank: int = 0) -> dict:
    """`ours` (build_trace) inside a torch.profiler trace: same clock base, and the rank's
    training process and thread take the profiler's pid and native thread id."""
    events = profiler.get("traceEvents")
    if not isinstance(events, list):
        raise ValueError("not a Chrome trace: no traceEvents list")
    base = int(profiler.get("baseTimeNanoseconds") or 0)
    ids = (ours.get("starvewatch") or {}).get("ranks", {}).get(str(rank))
    step = next((e for e in events if isinstance(e, dict) and str(e.get("name", "")).startswith("ProfilerStep#")),
                None)
    target = None
    if step is not None:
        target = (step.get("pid"), step.get("tid"))
    shift_us = (int(ours.get("baseTimeNanoseconds") or 0) - base) / 1000
    for e in ours["traceEvents"]:
        e = dict(e)
        if "ts" in e:
            e["ts"] = e["ts"] + shift_us
        if ids is not None and target is not None and e.get("pid") == ids["pid"]:
            e["pid"] = target[0]
            if e.get("tid") == ids["tid"]:
                e["tid"] = target[1]
        events.append(e)
    profiler.setdefault("starvewatch", ours.get("starvewatch"))
    return profiler
