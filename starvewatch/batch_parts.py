"""Splitting an event batch into parts within the collector's limits (starvewatch/limits.py),
and the record ranges that make every part idempotent (stdlib only; shared by the training
process, which splits before sending or spooling, and the collector, which splits an older
oversized spool file and stores each record of a batch once).

A batch's records are numbered in one sequence: its step records, then its samples, worker
snapshots and stalls (`RANGE_LISTS`, in that order). A part carries `"part": [first, end]`, the
records [first, end) of that sequence, in the same lists; phases travel with the step record
they belong to; everything else in the batch (run, loaders and their cumulative totals, drops,
the delivery account, the status) is repeated in every part, as the collector stores those
idempotently (the run's metadata only in the first part). The collector keeps, per (stream, seq), the ranges it stored: a part split
differently on a replay (a smaller learned limit, the collector's own split) stores only the
records not stored yet, so nothing is stored twice or lost.
"""
from __future__ import annotations

RANGE_LISTS = ("steps", "samples", "workers", "stalls")


def list_len(payload: dict, kind: str) -> int:
    if kind == "steps":
        return len((payload.get("steps") or {}).get("step") or ())
    return len(payload.get(kind) or ())


def record_count(payload: dict) -> int:
    """Records in the batch's range sequence (steps, samples, workers, stalls)."""
    return sum(list_len(payload, kind) for kind in RANGE_LISTS)


def payload_range(payload: dict) -> tuple[int, int]:
    """The records [first, end) a payload carries: its `part`, or the whole batch."""
    part = payload.get("part")
    if part is not None:
        return int(part[0]), int(part[1])
    return 0, record_count(payload)


def _phase_keys(steps: dict) -> list[tuple]:
    return list(zip(steps.get("loader") or (), steps.get("epoch") or (), steps.get("step") or ()))


def _slice(payload: dict, lo: int, hi: int) -> dict:
    """The part of `payload` holding its records [lo, hi) (indexes within the payload)."""
    out = {key: value for key, value in payload.items() if key not in RANGE_LISTS and key != "phases"}
    offset = 0
    for kind in RANGE_LISTS:
        n = list_len(payload, kind)
        a, b = max(lo - offset, 0), min(hi - offset, n)
        if kind == "steps":
            steps = payload.get("steps") or {}
            if b <= a:
                out["steps"] = {name: [] for name in steps}
                out["phases"] = []
            else:
                out["steps"] = {name: values[a:b] for name, values in steps.items()}
                kept = set(_phase_keys(out["steps"]))
                out["phases"] = [p for p in payload.get("phases") or () if tuple(p[:3]) in kept] \
                    if a > 0 or b < n else list(payload.get("phases") or ())
        elif kind in payload or b > a:
            out[kind] = list((payload.get(kind) or [])[max(a, 0):max(b, 0)]) if b > a else []
        offset += n
    first, _ = payload_range(payload)
    out["part"] = [first + lo, first + hi]
    if first + lo > 0:
        out.pop("run", None)  # the run's metadata once, with the first part
    return out


def within(payload: dict, limits: dict[str, int]) -> bool:
    return all(list_len(payload, kind) <= limits[kind] for kind in RANGE_LISTS) \
        and len(payload.get("phases") or ()) <= limits["phases"]


def split(payload: dict, limits: dict[str, int], max_steps: int | None = None) -> list[dict]:
    """`payload` as parts within `limits` (records per list) and at most `max_steps` step
    records each; [payload] itself when it fits. Cut greedily in record order, so the
    same limits always give the same ranges."""
    step_limit = limits["steps"] if max_steps is None else max(1, min(max_steps, limits["steps"]))
    if within(payload, limits) and list_len(payload, "steps") <= step_limit:
        return [payload]
    caps = dict(limits, steps=step_limit)
    keys = _phase_keys(payload.get("steps") or {})
    phases_per_key: dict[tuple, int] = {}
    for p in payload.get("phases") or ():
        key = tuple(p[:3])
        phases_per_key[key] = phases_per_key.get(key, 0) + 1
    parts: list[dict] = []
    start = pos = 0
    counts = dict.fromkeys(caps, 0)
    for kind in RANGE_LISTS:
        n, i = list_len(payload, kind), 0
        while i < n:
            take = min(caps[kind] - counts[kind], n - i)
            if kind == "steps" and phases_per_key and take > 0:
                # A step's phases go with it: fewer steps when their phases would pass the limit.
                j = i
                while j < i + take:
                    extra = phases_per_key.get(keys[j], 0)
                    if counts["phases"] + extra > caps["phases"] and pos + (j - i) > start:
                        break
                    counts["phases"] += extra
                    j += 1
                take = j - i
            if take <= 0:  # this part is full: the next one begins here
                parts.append(_slice(payload, start, pos))
                start, counts = pos, dict.fromkeys(caps, 0)
                continue
            counts[kind] += take
            pos += take
            i += take
    if pos > start or not parts:
        parts.append(_slice(payload, start, pos))
    return parts


def uncovered(first: int, end: int, stored: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The sub-ranges of [first, end) that no stored range covers."""
    out, at = [], first
    for a, b in sorted(stored):
        if b <= at or a >= end:
            continue
        if a > at:
            out.append((at, a))
        at = max(at, b)
        if at >= end:
            break
    if at < end:
        out.append((at, end))
    return out
