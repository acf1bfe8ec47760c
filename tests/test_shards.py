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
