"""The snapshot-cost finding (kind "snapshot_cost"): a torchdata StatefulDataLoader that
snapshots its workers' state more often than the loop checkpoints, at a cost over 2% of the step.

Its own module because it reads the snapshot telemetry (hooks/snapshots.py) and the loader's
rate, not memory or shards; findings.py gathers it with the others.
"""
from __future__ import annotations


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
