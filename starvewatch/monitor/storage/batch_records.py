"""The part of a batch not stored yet: a batch replayed after a split differently made (a
spool file cut by record range, batch_parts.py) keeps only the records the store lacks.

Its own module because it is a pure function of the wire model (an EventBatch), apart from
the store's SQL; the store's ingest calls it with the ranges `seen` does not cover.
"""
from __future__ import annotations


def only_records(batch, first: int, ranges: list[tuple[int, int]]):
    """The batch (a part [first, ...) of its sequence, batch_parts.py) keeping only the records
    in `ranges`, and the phases of the step records kept."""
    keep = lambda i: any(a <= i < b for a, b in ranges)  # noqa: E731 - few ranges
    update = {}
    offset = first
    for kind in ("steps", "samples", "workers", "stalls"):
        if kind == "steps":
            n = len(batch.steps)
            mask = [keep(offset + i) for i in range(n)]
            columns = {name: [v for v, m in zip(getattr(batch.steps, name), mask) if m]
                       for name in type(batch.steps).model_fields}
            update["steps"] = batch.steps.model_copy(update=columns)
            kept = set(zip(columns["loader"], columns["epoch"], columns["step"]))
            update["phases"] = [p for p in batch.phases if tuple(p[:3]) in kept]
        else:
            items = getattr(batch, kind)
            n = len(items)
            update[kind] = [item for i, item in enumerate(items) if keep(offset + i)]
        offset += n
    return batch.model_copy(update=update)


def event_rows(batch, first: int, stored) -> list[tuple[str, dict]]:
    """(kind, event) of every event row the batch adds, as both stores write them: its samples,
    worker snapshots and stalls, live tuning's records, and its DataLoader workers' per-batch
    records (`worker_batches`, for the trace export) as one event at their earliest hand-over.
    The last two are repeated in every part of a split batch: kept once, from the first part
    (`first` 0), when no part of the batch was stored before (`stored`: the parts `seen` holds)."""
    events = [(kind, e.model_dump(exclude_unset=True)) for kind in ("samples", "workers", "stalls")
              for e in getattr(batch, kind)]
    once = not stored and first == 0
    if batch.tuning and once:
        events += [("tuning", t.model_dump(exclude_unset=True, by_alias=True)) for t in batch.tuning]
    if batch.worker_batches is not None and once:
        records = batch.worker_batches.model_dump()
        events.append(("worker_batches", {"t_ns": min(records["done_ns"] or [0]), **records}))
    return events
