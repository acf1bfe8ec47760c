"""The duplicated-shards finding (kind "duplicated_shards"): readers of an IterableDataset that
yield the same batches, so each sample is read N times, with the cause (not sharded by worker,
by rank) and the fix (SHARD_FIX).

Its own module because it compares readers by their shard checks (starvewatch/shards.py),
within a process and across ranks; findings.py gathers it with the others, and the idle-worker
finding is told which loaders it named.
"""
from __future__ import annotations

from ...shards import compare_readers, duplicated
from ..sentences import plural


SHARD_FIX = """class Shards(IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        shard, shards = rank * workers + worker, world * workers
        for i, sample in enumerate(self.samples()):
            if i % shards == shard:  # or split the files: files[shard::shards]
                yield sample"""


def _shard_cause(by_worker: bool, by_rank: bool) -> str:
    if by_worker and by_rank:
        return "sharded neither by worker nor by rank"
    return "not sharded by worker" if by_worker else "not sharded by rank"


def shard_findings(worker_events: list[dict], configs: dict[str, dict | None] | None = None) -> list[dict]:
    """Readers of an IterableDataset that yield the same batches: each sample read N times.
    Workers of one process are compared in that process ("shard_check"); the ranks of a job
    here, from the hashes each rank's workers sent ("shard_hashes"). Not for resampled shards
    (webdataset's `resampled=True` samples shards with replacement: repeats are its design)."""
    within: dict[str, dict] = {}
    hashes: dict[str, dict[int, list[list[int]]]] = {}
    for event in worker_events:
        loader = event.get("loader")
        if ((configs or {}).get(loader) or {}).get("shards_resampled"):
            continue
        if event.get("shard_check"):
            # The worst rank speaks for the loader (ranks run the same code).
            old = within.get(loader)
            if old is None or event["shard_check"]["reads_per_batch"] >= old["reads_per_batch"]:
                within[loader] = event["shard_check"]
        if event.get("shard_hashes"):
            hashes.setdefault(loader, {})[event.get("rank", 0)] = event["shard_hashes"]
    out = []
    for loader in sorted(set(within) | set(hashes), key=str):
        per_rank = hashes.get(loader, {})
        across = compare_readers([h for rank in sorted(per_rank) for h in per_rank[rank]]) \
            if len(per_rank) >= 2 else None
        by_worker, by_rank = duplicated(within.get(loader)), False
        check = within.get(loader) if by_worker else None
        if duplicated(across):
            # Each rank's own readers are one copy each unless they repeat among themselves too.
            per_rank_reads = check["reads_per_batch"] if by_worker else 1
            by_rank = across["reads_per_batch"] > per_rank_reads
            check = across if by_rank else check
        if check is None:
            continue
        reads, ranks = check["reads_per_batch"], len(per_rank) if by_rank else None
        readers = plural(check['workers'], 'worker') + (f" on {ranks} ranks" if ranks else "")
        out.append({
            "kind": "duplicated_shards", "loader": loader, "severity": "critical",
            "title": (f"The {readers} of '{loader}' yield the same batches: every sample is read {reads} "
                      f"times per epoch (the IterableDataset is {_shard_cause(by_worker, by_rank)})"),
            "detail": {"times_each_sample_read": reads, "workers": check["workers"],
                       "compared_batches": check["compared_batches"],
                       "repeated_batches": check["repeated_batches"],
                       "not_sharded_by_worker": by_worker, "not_sharded_by_rank": by_rank,
                       **({"ranks": ranks} if ranks else {})},
            "fix": ("Shard by worker and by rank with torch.utils.data.get_worker_info() and the rank:\n"
                    if by_rank else
                    "Shard by worker (and by rank under DDP) with torch.utils.data.get_worker_info():\n")
            + SHARD_FIX,
        })
    return out
