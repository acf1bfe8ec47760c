"""Issue 16, item 3: IterableDataset workers that yield the same samples (not sharded) are
found by hashing batches in the workers; sharded ones and legitimately repeating values
(samples drawn from a few prototypes) are not flagged. Real fork workers."""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import starvewatch

N = 64


class NotSharded(IterableDataset):
    def __iter__(self):
        for i in range(N):
            yield torch.tensor([float(i)])


class Sharded(IterableDataset):
    def __iter__(self):
        info = get_worker_info()
        for i in range(info.id, N, info.num_workers):
            yield torch.tensor([float(i)])


class FewPrototypes(IterableDataset):
    """Each worker draws its own samples at random from 3 prototypes: values repeat across
    workers by chance, the workers still read different samples."""

    def __iter__(self):
        generator = torch.Generator().manual_seed(1000 + get_worker_info().id)
        prototypes = torch.tensor([[0.0], [1.0], [2.0]])
        for _ in range(N // 2):
            yield prototypes[torch.randint(0, 3, (1,), generator=generator)].reshape(1)


def test_only_the_unsharded_iterable_dataset_is_flagged():
    loaders = {name: starvewatch.watch(DataLoader(ds, batch_size=4, num_workers=2,
                                                  multiprocessing_context="fork"), name=name)
               for name, ds in (("copies", NotSharded()), ("shards", Sharded()),
                                ("prototypes", FewPrototypes()))}
    counts = {name: sum(1 for _ in loader) for name, loader in loaders.items()}
    assert counts == {"copies": 2 * N // 4, "shards": N // 4, "prototypes": N // 4}
    summary = starvewatch.finish()
    found = [f for f in summary["findings"] if f["kind"] == "duplicated_shards"]
    assert [f["loader"] for f in found] == ["copies"], found
    [finding] = found
    assert finding["detail"]["times_each_sample_read"] == 2
    assert finding["detail"]["compared_batches"] == N // 4
    assert "read 2 times" in finding["title"] and "get_worker_info()" in finding["fix"]


def _rank_events(rank: int, hashes: list[list[int]]) -> dict:
    return {"rank": rank, "loader": "train", "workers": [], "shard_hashes": hashes}


def test_ranks_that_read_the_same_shards_are_found_from_their_hashes():
    from starvewatch.analysis.findings.duplicate_shards import shard_findings
    worker = [[i * 10 + w + 1 for i in range(16)] for w in range(2)]  # sharded by worker
    # Sharded by worker, not by rank: rank 1's workers repeat rank 0's.
    [found] = shard_findings([_rank_events(0, worker), _rank_events(1, worker)])
    assert found["detail"]["times_each_sample_read"] == 2 and found["detail"]["ranks"] == 2
    assert found["detail"]["not_sharded_by_rank"] and not found["detail"]["not_sharded_by_worker"]
    assert "not sharded by rank" in found["title"] and "on 2 ranks" in found["title"]
    # Sharded by both: nothing.
    other = [[h + 1000 for h in seq] for seq in worker]
    assert shard_findings([_rank_events(0, worker), _rank_events(1, other)]) == []
    # Sharded by neither: each rank's workers repeat each other too (4 copies in all).
    same = [worker[0], worker[0]]
    within = {"compared_batches": 16, "repeated_batches": 16, "reads_per_batch": 2, "workers": 2}
    events = [dict(_rank_events(r, same), shard_check=within) for r in (0, 1)]
    [both] = shard_findings(events)
    assert both["detail"]["times_each_sample_read"] == 4
    assert "neither by worker nor by rank" in both["title"]
    # Each rank's hashes may come in several events: the latest of each rank is compared.
    partial = [_rank_events(0, [seq[:2] for seq in worker]), _rank_events(1, worker), _rank_events(0, worker)]
    assert shard_findings(partial)[0]["detail"]["times_each_sample_read"] == 2
    # A single rank's hashes alone say nothing about ranks.
    assert shard_findings([_rank_events(0, worker)]) == []


RANK_PROGRAM = """
import os, sys, torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
import starvewatch

class ShardedByWorker(IterableDataset):
    def __iter__(self):
        info = get_worker_info()
        by_rank = sys.argv[1] == "both"
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        shard, shards = (rank * info.num_workers + info.id, world * info.num_workers) if by_rank \\
            else (info.id, info.num_workers)
        for i in range(shard, 128, shards):
            yield torch.tensor([float(i)])

loader = starvewatch.watch(DataLoader(ShardedByWorker(), batch_size=4, num_workers=2,
                                      multiprocessing_context="fork"), name="train")
print(sum(1 for _ in loader))
starvewatch.finish(quiet=True)
"""


def test_two_ranks_reading_the_same_shards_are_named_by_the_collector(collector, tmp_path):
    import os
    import subprocess
    import sys

    from .conftest import wait_until
    c = collector()
    for run_id, mode in (("ranks-copies", "worker"), ("ranks-sharded", "both")):
        procs = [subprocess.Popen([sys.executable, "-c", RANK_PROGRAM, mode], stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "STARVEWATCH_URL": c.url, "STARVEWATCH_RUN_ID": run_id,
                                       "RANK": str(rank), "WORLD_SIZE": "2", "STARVEWATCH_HOST_INTERVAL_S": "0.1"})
                 for rank in (0, 1)]
        batches = [int(p.communicate(timeout=120)[0].split()[-1]) for p in procs]
        assert [p.returncode for p in procs] == [0, 0]
        assert batches == ([128 // 4] * 2 if mode == "worker" else [128 // 8] * 2)
    wait_until(lambda: all(c.get(f"/api/v1/runs/{r}")["run"]["status"] == "finished"
                           for r in ("ranks-copies", "ranks-sharded")), what="both runs finished")
    found = [f for f in c.get("/api/v1/runs/ranks-copies/summary")["findings"] if f["kind"] == "duplicated_shards"]
    assert len(found) == 1, found
    assert found[0]["detail"]["times_each_sample_read"] == 2 and found[0]["detail"]["not_sharded_by_rank"]
    assert "not sharded by rank" in found[0]["title"]
    assert [f for f in c.get("/api/v1/runs/ranks-sharded/summary")["findings"]
            if f["kind"] == "duplicated_shards"] == []
