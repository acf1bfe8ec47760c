"""The idle-workers finding (kind "idle_workers"): DataLoader workers that served no batch, or
under a quarter of their fair share, while the loop waited for data; and ranks whose workers
served far fewer batches than the busiest rank's.

Its own module because it reads the workers' cumulative batch counters (their latest snapshot)
and names the cause where it can (fewer shards than readers); diagnosis.py and model.py read
what it names. findings.py gathers it with the others.
"""
from __future__ import annotations

from ...schema import MODERATE_FRACTION


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
