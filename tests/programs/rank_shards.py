"""One rank of a two-rank job started as two plain processes (RANK, WORLD_SIZE and
STARVEWATCH_RUN_ID set as a launcher would; no collective, so a rank short of data cannot
deadlock the test): each rank reads its share of the shards with 2 DataLoader workers, and
rank 1 gets SW_RANK1_SHARE of rank 0's samples (0: none at all, as when ranks outnumber shards).
"""
import os
import time

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import starvewatch

RANK = int(os.environ["RANK"])
SAMPLES = 96 if RANK == 0 else int(96 * float(os.environ["SW_RANK1_SHARE"]))


class RankShard(IterableDataset):
    """This rank's samples, split among its workers by worker id."""

    def __iter__(self):
        info = get_worker_info()
        for i in range(info.id, SAMPLES, info.num_workers):
            time.sleep(0.001)  # a read
            yield torch.tensor([float(i)])


loader = starvewatch.watch(DataLoader(RankShard(), batch_size=4, num_workers=2), "train")
batches = 0
for batch in loader:
    time.sleep(0.001)  # the step
    batches += 1
starvewatch.finish()
print(f"rank {RANK} finished {batches} batches", flush=True)
